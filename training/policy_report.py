"""Reports on a learned policy: a `compare` run headed by whether the policy beat the best
reference (`learned_verdict`), and one report over several scenario suites, opening with the
verdict per suite (`write_suites_report`)."""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from batchpilot.agents.specs import policy_spec
from batchpilot.baselines.specs import BEST_STATIC, RULES
from batchpilot.envs.metrics import geometric_mean
from batchpilot.training.evaluate import DEFAULT_SEEDS, check_seed_range
from batchpilot.training.paired import MIN_EFFECT, describe, geomean_interval
from batchpilot.training.report import (
    ONE_EXACT_RUN,
    ONE_RUN,
    best_reference,
    is_reference,
    latency_vs,
    md_table,
    paired_vs,
    ranking_metric,
    seed_values,
)

if TYPE_CHECKING:
    from batchpilot.training.suite import Suite

Pairs = list[tuple[list[float], list[float]]]
"""Per scenario, the policy's goodput per seed and a reference's, the same seeds."""

REFERENCES = ",".join(("default", BEST_STATIC, *RULES, "mpc"))
"""The controllers a policy is compared with by default: vLLM's default limits, the tuned
static pair, the rules (`RULES`) and the lookahead oracle."""
TITLE = "The learned controller against the references"


@dataclass(frozen=True)
class Tally:
    """The policy against the best reference over a suite's scenarios (paired over seeds)."""

    lines: list[str]
    """One line per scenario: outcome and paired difference."""
    wins: int
    losses: int
    ratios: list[float]
    """Per scenario, the policy's mean goodput over the best reference's."""
    static_ratios: list[float]
    """Per scenario, the policy's mean goodput over the tuned static pair's (best-static;
    empty when it did not run): the figure a ship rule compares candidates by."""
    pairs: Pairs
    """The per-seed goodputs behind `ratios`."""
    static_pairs: Pairs
    """The per-seed goodputs behind `static_ratios`."""
    untested: int = 0
    """Scenarios run on one seed: neither won, lost nor tied (no interval to test)."""
    skipped: tuple[str, ...] = ()
    """One line per scenario goodput cannot rank (`ranking_metric`): left out of the counts
    and ratios, with the reason."""

    @property
    def geomean(self) -> float:
        """Geometric mean of `ratios`."""
        return geometric_mean(self.ratios)


def tally(results: dict[str, Any], label: str) -> Tally:
    """Each scenario's outcome for the controller `label` against the best reference."""
    lines, wins, losses, untested, ratios, static = [], 0, 0, 0, [], []
    pairs: Pairs = []
    static_pairs: Pairs = []
    skipped = []
    for sc in results["scenarios"]:
        ref = best_reference(sc, results["controllers"], "output_goodput")
        if ref is None:
            continue
        key, note = ranking_metric(sc)
        if key != "output_goodput":  # the scenario's own verdict ranks by another metric
            why = note or f"the scenario is scored on {key}"
            skipped.append(f"- {sc['name']}: not judged on goodput ({why})")
            continue
        res = sc["results"]
        mean = {c: e["mean"]["output_goodput"] for c, e in res.items()}
        own = seed_values(res[label], "output_goodput")
        if mean[ref] > 0:
            ratios.append(mean[label] / mean[ref])
            pairs.append((own, seed_values(res[ref], "output_goodput")))
        if mean.get(BEST_STATIC, 0) > 0:
            static.append(mean[label] / mean[BEST_STATIC])
            static_pairs.append((own, seed_values(res[BEST_STATIC], "output_goodput")))
        p = paired_vs(sc, label, ref, "output_goodput")
        outcome = "no significant difference"
        if p.significant and not p.decisive:
            outcome = f"tie (significant but under {MIN_EFFECT:.0%})"
        small = p.rel is not None and abs(p.rel) < MIN_EFFECT
        if p.n < 2 and not sc.get("seed_note"):
            untested += 1
            lead = "ahead" if p.diff > 0 else "behind"
            lead = f"within {MIN_EFFECT:.0%}" if small or not p.diff else lead
            outcome = f"{lead} ({ONE_RUN}, so no test)"
        elif p.n < 2:  # nothing depends on the seed: the one run is exact
            outcome = f"tie (under {MIN_EFFECT:.0%}; {ONE_EXACT_RUN})"
            if not small and p.diff:
                won = p.diff > 0
                wins, losses = wins + won, losses + (not won)
                outcome = f"{'won' if won else 'lost'} ({ONE_EXACT_RUN})"
        elif p.decisive:
            won = p.diff > 0
            wins, losses = wins + won, losses + (not won)
            outcome = "won" if won else "lost"
        n = f"{p.n} seed{'s' * (p.n > 1)}"
        latency = latency_vs(sc, label, ref)
        line = f"- {sc['name']}: {outcome}, goodput {describe(p)} vs {ref} ({n}; {latency})"
        lines.append(line)
    return Tally(
        lines, wins, losses, ratios, static, pairs, static_pairs, untested, tuple(skipped)
    )


def ratio_text(ratio: float, pairs: Pairs) -> str:
    """``1.121x (1.098-1.145)``: a geometric mean of ratios and its paired 95% interval
    (`geomean_interval`); with one seed, none; where a scenario's mean goodput is 0, none and
    the reason; ``—`` where no scenario gave a ratio."""
    if not pairs:
        return "—"
    interval = geomean_interval(pairs)
    if interval:
        return f"{ratio:.3f}x ({interval[0]:.3f}-{interval[1]:.3f})"
    if any(len(a) > 1 for a, _ in pairs):
        return f"{ratio:.3f}x (no interval: a mean goodput of 0)"
    return f"{ratio:.3f}x"


def _outcome(wins: int, losses: int, n: int, untested: int = 0) -> str:
    if not n:
        return "**The learned policy was not judged** (goodput ranks none of the scenarios)"
    if untested and untested >= n:
        of = "the scenario" if n == 1 else f"each of the {n} scenarios"
        return f"**The learned policy was not tested** (one seed of {of}: no interval)"
    if untested:
        tested = _outcome(wins, losses, n - untested)
        return f"{tested}, and not tested on {untested} (one seed: no interval)"
    if wins and not losses:
        return f"**The learned policy won** on {wins} of {n} scenarios"
    if losses and not wins:
        return f"**The learned policy lost** on {losses} of {n} scenarios"
    if wins or losses:
        return f"**The learned policy won on {wins} and lost on {losses} of {n} scenarios**"
    of = "the scenario" if n == 1 else f"any of the {n} scenarios"
    return f"**The learned policy neither won nor lost** on {of}"


def learned_verdict(results: dict[str, Any], label: str) -> str:
    """The report's first lines: did the learned policy beat the best reference (tuned
    static, vLLM's default, the rules) on goodput, per scenario, paired over seeds."""
    t = tally(results, label)
    head = _outcome(t.wins, t.losses, len(t.lines), t.untested)
    head += " against the best reference (paired 95% intervals over seeds):"
    if len(t.ratios) > 1:
        above = sum(r > 1 for r in t.ratios)
        head += (
            f"\nacross the {len(t.ratios)} scenarios its mean goodput is {t.geomean:.3f}x the "
            f"best reference's (geometric mean of the ratios; above it on {above} of "
            f"{len(t.ratios)}):"
        )
    return "\n".join([head, *t.lines, *t.skipped])


def checked_suite(suite: str, interval: str, seeds: int | None, first_seed: int = 0) -> Suite:
    """The suite, parsed whole, as `run_suite` will run it: refused (ValueError naming it)
    where a scenario sets another control interval than the policies' (every controller runs
    at theirs), or its seeds (`seeds`, else the suite's) from `first_seed` reach the tuning
    seeds. Commands call it for every suite before the first runs."""
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.training.suite import load_suite

    loaded = load_suite(suite)
    for sc in loaded.scenarios:
        if sc.name in loaded.timed and ControlInterval.parse(sc.interval) != ControlInterval.parse(
            interval
        ):
            raise ValueError(
                f"{suite}: scenario {sc.name!r} sets interval {sc.interval}; the policy "
                f"decides every {interval}, and every controller runs at that interval here: "
                "leave the scenario's interval out"
            )
    try:
        check_seed_range(first_seed, seeds or loaded.seeds or DEFAULT_SEEDS)
    except ValueError as exc:
        raise ValueError(f"{suite}: {exc}") from None
    return loaded


def run_suite(
    policies: list[Path],
    suite: str,
    dest: Path,
    *,
    references: str,
    interval: str,
    seeds: int | None,
    first_seed: int = 0,
    progress: bool,
) -> dict[str, Any]:
    """`batchpilot compare` of `policies` with `references` on `suite` into `dest`, its
    report headed by whether each policy won; returns the results."""
    labels = [policy_spec(p) for p in policies]
    argv = [
        f"--suite={suite}",  # a value beginning with '-' is no option
        "--controllers", ",".join([references, *labels]),
        "--interval", interval,
        *(["--seeds", str(seeds)] if seeds else []),
        "--first-seed", str(first_seed),
        "--no-capacity",
        f"--out={dest}",
        *([] if progress else ["--no-progress"]),
    ]  # fmt: skip
    return compare_policy(argv, labels)


def compare_policy(argv: list[str], labels: Sequence[str]) -> dict[str, Any]:
    """Run ``batchpilot compare`` with `argv` (its ``--out`` and, among the controllers,
    the policies `labels`) and write its report headed by each one's `learned_verdict`;
    returns the results."""
    from batchpilot.training.commands import compare

    parser = argparse.ArgumentParser(prog="batchpilot compare")
    compare.add_arguments(parser)
    args = parser.parse_args(argv)
    results = compare.run(args)
    verdicts = [_named(learned_verdict(results, label), label, labels) for label in labels]
    compare.write(args.out, results, headline="\n\n".join(verdicts).split("\n"))
    return results


def _named(text: str, label: str, labels: Sequence[str]) -> str:
    """`text` led by the policy's name where several are compared."""
    return f"`{label}`: {text}" if len(labels) > 1 else text


@dataclass(frozen=True)
class SuiteSection:
    """One suite's part of the combined report: its name, description, results and the
    directory holding its own `compare` report."""

    name: str
    description: str
    results: dict[str, Any]
    report_dir: Path


def write_suites_report(
    sections: Sequence[SuiteSection],
    labels: Sequence[str],
    out: Path,
    *,
    title: str,
    command: str,
) -> Path:
    """OUT/report.md over the suites: first each policy's verdict over all of them and a
    table per suite and policy (wins, losses, geometric means against the best reference and
    the tuned static pair), then each suite's own report, headings one level down and plots
    linked in its directory."""
    md = [f"# {title}", ""]
    rows = []
    n = len(sections)
    refs = sorted({c for s in sections for c in s.results["controllers"] if is_reference(c)})
    of_refs = ", ".join(refs)
    for label in labels:
        tallies = [tally(s.results, label) for s in sections]
        wins, losses = sum(t.wins for t in tallies), sum(t.losses for t in tallies)
        untested = sum(t.untested for t in tallies)
        scenarios = sum(len(t.lines) for t in tallies)
        ratios = [r for t in tallies for r in t.ratios]
        every = ratio_text(geometric_mean(ratios), [p for t in tallies for p in t.pairs])
        line = (
            _outcome(wins, losses, scenarios, untested)
            + f" over {n} suite{'s' * (n > 1)} against the best reference (the best of "
            f"{of_refs} per scenario; paired 95% intervals over seeds); its mean goodput is "
            f"{every} the best reference's (geometric mean over every scenario, with its "
            f"paired 95% interval; above it on {sum(r > 1 for r in ratios)} of {len(ratios)})."
        )
        md += [_named(line, label, labels), ""]
        for s, t in zip(sections, tallies, strict=True):
            static = "—"
            if t.static_ratios:
                static = ratio_text(geometric_mean(t.static_ratios), t.static_pairs)
            name = [f"`{label}`"] if len(labels) > 1 else []
            once = f" ({t.untested} not tested)" if t.untested else ""
            once += f" ({len(t.skipped)} not judged on goodput)" if t.skipped else ""
            counts = [f"{len(t.lines)}{once}", str(t.wins), str(t.losses)]
            above = str(sum(r > 1 for r in t.ratios))
            ratio = ratio_text(t.geomean, t.pairs)
            rows.append([f"[{s.name}](#{s.name})", *name, *counts, ratio, static, above])
    head = ["suite", *(["policy"] if len(labels) > 1 else []), "scenarios", "won", "lost"]
    head += ["goodput vs best reference", "vs tuned static pair", "above best reference on"]
    md += [
        md_table(head, rows),
        "",
        "Goodput ratios are geometric means over the suite's scenarios of the policy's mean "
        "goodput over the best reference's and over the tuned static pair's (best-static), "
        "with paired 95% intervals (the delta method over the seeds, the same seeds for "
        "both, summed seed by seed over scenarios that share their seeds, and Student's t).",
        "",
        f"Command: `{command}`",
        "",
    ]
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
