"""Reports on a learned policy: a `compare` run headed by whether the policy beat the best
reference (`learned_verdict`), and one report over several scenario suites, opening with the
verdict per suite (`write_suites_report`)."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchpilot.training.paired import MIN_EFFECT, describe
from batchpilot.training.report import best_reference, paired_vs


@dataclass(frozen=True)
class Tally:
    """The policy against the best reference over a suite's scenarios (paired over seeds)."""

    lines: list[str]
    """One line per scenario: outcome and paired difference."""
    wins: int
    losses: int
    ratios: list[float]
    """Per scenario, the policy's mean goodput over the best reference's."""

    @property
    def geomean(self) -> float:
        """Geometric mean of `ratios` (0 if a run had no goodput: it is not averaged away)."""
        if not self.ratios or min(self.ratios) <= 0:
            return 0.0
        return math.exp(sum(map(math.log, self.ratios)) / len(self.ratios))


def tally(results: dict[str, Any], label: str) -> Tally:
    """Each scenario's outcome for the controller `label` against the best reference."""
    lines, wins, losses, ratios = [], 0, 0, []
    for sc in results["scenarios"]:
        ref = best_reference(sc, results["controllers"], "output_goodput")
        if ref is None:
            continue
        means = [sc["results"][c]["mean"]["output_goodput"] for c in (label, ref)]
        if means[1] > 0:
            ratios.append(means[0] / means[1])
        p = paired_vs(sc, label, ref, "output_goodput")
        outcome = "tie (no significant difference)"
        if p.significant and not p.decisive:
            outcome = f"tie (significant but under {MIN_EFFECT:.0%})"
        if p.decisive:
            won = p.diff > 0
            wins, losses = wins + won, losses + (not won)
            outcome = "won" if won else "lost"
        lines.append(f"- {sc['name']}: {outcome}, goodput {describe(p)} vs {ref} ({p.n} seeds)")
    return Tally(lines, wins, losses, ratios)


def _outcome(wins: int, losses: int, n: int) -> str:
    if wins and not losses:
        return f"**The learned policy won** on {wins} of {n} scenarios"
    if losses and not wins:
        return f"**The learned policy lost** on {losses} of {n} scenarios"
    if wins or losses:
        return f"**The learned policy won on {wins} and lost on {losses} of {n} scenarios**"
    return f"**The learned policy tied** on all {n} scenarios"


def learned_verdict(results: dict[str, Any], label: str) -> str:
    """The report's first lines: did the learned policy beat the best reference (tuned
    static, vLLM's default, the rules) on goodput, per scenario, paired over seeds."""
    t = tally(results, label)
    head = _outcome(t.wins, t.losses, len(t.lines))
    head += " against the best reference (paired 95% intervals over seeds):"
    if len(t.ratios) > 1:
        above = sum(r > 1 for r in t.ratios)
        head += (
            f"\nacross the {len(t.ratios)} scenarios its mean goodput is {t.geomean:.3f}x the "
            f"best reference's (geometric mean of the ratios; above it on {above} of "
            f"{len(t.ratios)}):"
        )
    return "\n".join([head, *t.lines])


def compare_policy(argv: list[str], label: str) -> dict[str, Any]:
    """Run ``batchpilot compare`` with `argv` (its ``--out`` and, among the controllers,
    `label`) and write its report headed by `learned_verdict`; returns the results."""
    from batchpilot.training.commands import compare

    parser = argparse.ArgumentParser(prog="batchpilot compare")
    compare.add_arguments(parser)
    args = parser.parse_args(argv)
    results = compare.run(args)
    compare.write(args.out, results, headline=learned_verdict(results, label).split("\n"))
    return results


@dataclass(frozen=True)
class SuiteSection:
    """One suite's part of the combined report: its name, description, results and the
    directory holding its own `compare` report."""

    name: str
    description: str
    results: dict[str, Any]
    report_dir: Path


def write_suites_report(
    sections: Sequence[SuiteSection], label: str, out: Path, *, title: str, command: str
) -> Path:
    """OUT/report.md over the suites: first the verdict over all of them and a table per
    suite (wins, losses, geometric mean against the best reference), then each suite's own
    report, headings one level down and plots linked in its directory."""
    tallies = [tally(s.results, label) for s in sections]
    wins, losses = sum(t.wins for t in tallies), sum(t.losses for t in tallies)
    ratios = [r for t in tallies for r in t.ratios]
    overall = Tally([], wins, losses, ratios)
    md = [
        f"# {title}",
        "",
        _outcome(wins, losses, len(ratios))
        + f" over {len(sections)} suite{'s' * (len(sections) > 1)} against the best "
        "reference (tuned static pair, vLLM's default, the rules; paired 95% intervals over "
        f"seeds); its mean goodput is {overall.geomean:.3f}x the best reference's (geometric "
        f"mean over every scenario; above it on {sum(r > 1 for r in ratios)} of {len(ratios)}).",
        "",
        "| suite | scenarios | won | lost | goodput vs best reference (geometric mean) "
        "| above it on |",
        "|---|---|---|---|---|---|",
    ]
    for s, t in zip(sections, tallies, strict=True):
        md.append(
            f"| [{s.name}](#{s.name}) | {len(t.ratios)} | {t.wins} | {t.losses} | "
            f"{t.geomean:.3f}x | {sum(r > 1 for r in t.ratios)} |"
        )
    md += ["", f"Command: `{command}`", ""]
    for s in sections:
        link = s.report_dir.relative_to(out).as_posix()
        body = (s.report_dir / "report.md").read_text().split("\n", 1)[1]  # its title goes
        md += [f"## {s.name}", "", s.description, ""]
        md += [_nested(line, link) for line in body.lstrip("\n").split("\n")]
    path = out / "report.md"
    path.write_text("\n".join(md).rstrip("\n") + "\n")
    return path


def _nested(line: str, link: str) -> str:
    """A line of a suite's report as part of the combined one: headings one level down,
    image links into the suite's directory."""
    if line.startswith("#"):
        return "#" + line
    return re.sub(r"^!\[([^\]]*)\]\(([^)/]+)\)$", rf"![\1]({link}/\2)", line)
