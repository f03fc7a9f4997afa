"""Comparison report from `evaluate()` results: report.md, self-contained report.html, PNGs.

The first lines say, per scenario, which controller wins on the scenario's score (goodput
unless no controller meets the SLOs) and by how much: the mean paired difference over
seeds with its 95% interval vs the runner-up, "no significant difference" when the
interval spans 0, or a tie when it is significant but under `paired.MIN_EFFECT`; then each
oracle / learned controller against the best reference (tuned static, vLLM's default, the
rules). Per scenario: what the seeds varied, how ``default`` and ``best-static`` were set,
a metrics table (mean ± std across seeds), the paired differences of every controller
against every other, and plots of both limits / running requests / KV usage over time, the
ITL distribution, and throughput and goodput against the Poisson arrival rate.
"""

from __future__ import annotations

import base64
import html
import re
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchpilot.baselines.specs import BEST_STATIC, spec_parts
from batchpilot.envs.metrics import SLO
from batchpilot.envs.sim_engine import DEFAULT_SCHEDULER
from batchpilot.training.evaluate import ITL_QUANTILES, SEPARATION
from batchpilot.training.paired import (
    MIN_EFFECT,
    PairedDifference,
    describe,
    paired_difference,
)

TABLE_METRICS = (
    ("output_throughput", "out tok/s", "{:,.0f}"),
    ("output_goodput", "goodput tok/s", "{:,.0f}"),
    ("median_ttft_ms", "TTFT p50 ms", "{:,.0f}"),
    ("p99_ttft_ms", "TTFT p99 ms", "{:,.0f}"),
    ("median_tpot_ms", "TPOT p50 ms", "{:,.1f}"),
    ("p99_tpot_ms", "TPOT p99 ms", "{:,.1f}"),
    ("p90_itl_ms", "ITL p90 ms", "{:,.1f}"),
    ("slo_attainment", "SLO att.", "{:.1%}"),
    ("num_preemptions", "preempt.", "{:,.0f}"),
    ("recomputed_tokens", "recomp. tok", "{:,.0f}"),
    ("mean_kv_usage", "KV use", "{:.1%}"),
)
METRIC_NAMES = {"output_goodput": "goodput", "output_throughput": "output throughput"}
CHALLENGERS = ("oracle", "mpc", "policy")
"""Controllers that are not references: clairvoyant or learned."""


def command_line() -> str:
    """The ``batchpilot ...`` command this process runs, quoted as a shell would take it:
    what a report says made it."""
    return "batchpilot " + shlex.join(sys.argv[1:])


def is_reference(label: str) -> bool:
    """Tuned static, vLLM's default and the rules (every part of an A+B is one)."""
    return not any(p.split(":")[0] in CHALLENGERS for p in spec_parts(label))


def _cell(entry: dict[str, Any], key: str, fmt: str) -> str:
    mean, std = entry["mean"][key], entry["std"][key]
    text = fmt.format(mean)
    return text if std == 0 else f"{text} ± {fmt.format(std).rstrip('%')}"


def _capacity_cell(entry: dict[str, Any]) -> str:
    cap = entry["capacity"]
    if cap is None:
        return "—"
    mark = "" if cap["bracketed"] else " (≥)"
    return f"{cap['mean']:.2f} ± {cap['std']:.2f}{mark}"


def _capacity_throughput_cell(entry: dict[str, Any]) -> str:
    cap = entry["capacity"]
    mean, std = cap["output_throughput_at_capacity"], cap["output_throughput_at_capacity_std"]
    return f"{mean:,.0f} ± {std:,.0f}"


Table = tuple[list[str], list[list[str]]]


def ranking_metric(sc: dict[str, Any]) -> tuple[str, str | None]:
    """(metric controllers are ranked by, note): the scenario's score, unless it is goodput
    and every controller's is under `SEPARATION` of the best throughput (all miss the SLOs)."""
    score = sc["scenario"]["score"]
    res = sc["results"].values()
    top = max(e["mean"][score] for e in res)
    top_thr = max(e["mean"]["output_throughput"] for e in res)
    if score != "output_throughput" and top < SEPARATION * top_thr:
        return "output_throughput", (
            f"every controller's {score} is under {SEPARATION:.0%} of the best output "
            f"throughput (best {top:,.1f} vs {top_thr:,.0f} tok/s): ranked by throughput"
        )
    return score, None


def seed_values(entry: dict[str, Any], key: str) -> list[float]:
    """A controller's metric `key` per seed, from its results `entry`."""
    return [float(m[key]) for m in entry["per_seed"]]


def paired_vs(sc: dict[str, Any], a: str, b: str, key: str) -> PairedDifference:
    """Paired difference of controllers `a` and `b` on metric `key` over the scenario's seeds."""
    res = sc["results"]
    return paired_difference(seed_values(res[a], key), seed_values(res[b], key))


def best_reference(sc: dict[str, Any], labels: list[str], key: str) -> str | None:
    """The reference (tuned static, default, the rules) with the highest mean `key`."""
    refs = [c for c in labels if is_reference(c)]
    return max(refs, key=lambda c: sc["results"][c]["mean"][key]) if refs else None


ONE_RUN = "one run: no interval"
ONE_EXACT_RUN = "one exact run"
"""How a verdict of one run says so: a sample of one seed, or exact (nothing in the scenario
depends on the seed: ``seed_note``)."""


def verdict(sc: dict[str, Any], labels: list[str]) -> str:
    """One line: who wins the scenario on its ranking metric, and by how much (computed)."""
    key, note = ranking_metric(sc)
    what = METRIC_NAMES.get(key, key)
    ranked = sorted(labels, key=lambda c: sc["results"][c]["mean"][key], reverse=True)
    head = f"**{sc['name']}**: "
    if len(ranked) < 2:
        return head + f"only {ranked[0]} ran"
    win, second = ranked[0], ranked[1]
    p = paired_vs(sc, win, second, key)
    exact = p.n == 1 and bool(sc.get("seed_note"))  # nothing depends on the seed
    if p.diff == 0 and p.low == p.high:  # equal on every seed (or the one run)
        runs = f"{p.n} paired seed{'s' * (p.n > 1)}"
        line = f"{win} and {second} tie on {what}: equal ({ONE_EXACT_RUN if exact else runs})"
    elif p.n == 1 and p.rel is not None and abs(p.rel) < MIN_EFFECT:
        line = (
            f"{win} and {second} tie on {what} (under {MIN_EFFECT:.0%}): {describe(p)} "
            f"({ONE_EXACT_RUN if exact else ONE_RUN})"
        )
    elif exact:
        line = f"{win} wins on {what}, {describe(p)} vs {second} ({ONE_EXACT_RUN})"
    elif p.n == 1:
        line = f"{win} leads on {what}, {describe(p)} vs {second} ({ONE_RUN})"
    elif p.decisive:
        line = f"{win} wins on {what}, {describe(p)} vs {second} ({p.n} paired seeds)"
    elif p.significant:
        line = (
            f"{win} and {second} tie on {what} (significant but under "
            f"{MIN_EFFECT:.0%}): {describe(p)} ({p.n} paired seeds)"
        )
    else:
        line = (
            f"no significant difference on {what} between {win} and {second}: "
            f"{describe(p)} ({p.n} paired seeds)"
        )
    ref = best_reference(sc, labels, key)
    others = [c for c in labels if not is_reference(c)]
    if ref is not None and others:
        vs = "; ".join(
            f"{c} {describe(paired_vs(sc, c, ref, key))}, {latency_vs(sc, c, ref)}"
            for c in others
        )
        line += f". Against the best reference {ref}: {vs}"
    return head + line + (f" ({note})" if note else "")


def latency_vs(sc: dict[str, Any], a: str, b: str) -> str:
    """``p99 TTFT 550 vs 182 ms, p99 TPOT 21 vs 20 ms, preemptions 3 vs 0``: `a`'s mean tail
    latencies and preemptions a run beside `b`'s (a goodput win can hide a latency or
    recompute cost)."""
    ma, mb = sc["results"][a]["mean"], sc["results"][b]["mean"]
    parts = [
        f"p99 {name} {ma[key]:,.0f} vs {mb[key]:,.0f} ms"
        for name, key in (("TTFT", "p99_ttft_ms"), ("TPOT", "p99_tpot_ms"))
    ]
    if "num_preemptions" in ma and "num_preemptions" in mb:
        parts.append(f"preemptions {ma['num_preemptions']:,.0f} vs {mb['num_preemptions']:,.0f}")
    return ", ".join(parts)


def summary_table(results: dict[str, Any]) -> Table:
    """One row per scenario: each controller's mean of the ranking metric, and each oracle /
    learned controller's paired difference vs the scenario's best reference."""
    labels = results["controllers"]
    others = [c for c in labels if not is_reference(c)]
    head = ["scenario", "metric", *labels, "best reference"]
    head += [f"{c} vs best reference" for c in others]
    rows = []
    for sc in results["scenarios"]:
        key, _ = ranking_metric(sc)
        ref = best_reference(sc, labels, key)
        row = [sc["name"], METRIC_NAMES.get(key, key)]
        row += [f"{sc['results'][c]['mean'][key]:,.0f}" for c in labels]
        row.append(ref or "—")
        row += [_pair_cell(paired_vs(sc, c, ref, key)) if ref else "—" for c in others]
        rows.append(row)
    return head, rows


def scenario_tables(sc: dict[str, Any], labels: list[str]) -> tuple[Table, Table]:
    """(header, rows) of the metrics table and of the paired-difference table (each row's
    mean paired difference vs each column, % of the column's mean, 95% t-interval)."""
    res = sc["results"]
    has_cap = any(e["capacity"] for e in res.values())
    head = ["controller", *(t for _, t, _ in TABLE_METRICS)]
    head += ["capacity req/s", "out tok/s at capacity"] if has_cap else []
    rows = []
    for c in labels:
        e = res[c]
        name = c if e["spec"] == c else f"{c} ({e['spec']})"
        row = [name, *(_cell(e, k, f) for k, _, f in TABLE_METRICS)]
        cap_cells = [_capacity_cell(e), _capacity_throughput_cell(e)] if has_cap else []
        rows.append(row + cap_cells)
    key, _ = ranking_metric(sc)
    ref = best_reference(sc, labels, key)
    cols = ([ref] if ref else []) + [c for c in labels if c != ref]
    phead = ["controller"] + [f"vs {c}" + (" (best reference)" if c == ref else "") for c in cols]
    prows = [
        [a] + ["—" if a == b else _pair_cell(paired_vs(sc, a, b, key)) for b in cols]
        for a in labels
    ]
    return (head, rows), (phead, prows)


def _pair_cell(p: PairedDifference) -> str:
    text = describe(p).replace("95% CI ", "").replace(" to ", " … ")
    return text + (" *" if p.significant else "")


def md_table(head: list[str], rows: list[list[str]]) -> str:
    """A Markdown table; a ``|`` or a line break inside a cell (a name a user chose) is
    escaped or joined, not a broken row."""
    lines = ["| " + " | ".join(map(_md_cell, head)) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(map(_md_cell, r)) + " |" for r in rows]
    return "\n".join(lines)


def _md_cell(text: str) -> str:
    return " ".join(text.split("\n")).replace("|", "\\|")


def _html_table(head: list[str], rows: list[list[str]]) -> str:
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows
    )
    return f"<table><tr>{th}</tr>{body}</table>"


def _md_block_html(lines: Sequence[str]) -> str:
    """HTML for simple markdown: ``#`` headings, pipe tables, ``- `` list items and
    paragraphs, with ``**bold**`` spans."""
    out, table, items = [], [], []
    for line in [*lines, ""]:
        if line.startswith("|"):
            if not set(line) <= set("|-: "):
                table.append([c.strip() for c in line.strip("|").split("|")])
            continue
        if table:
            out.append(_html_table(table[0], table[1:]))
            table = []
        if line.startswith("- "):
            items.append(f"<li>{_inline_html(line[2:])}</li>")
            continue
        if items:
            out.append("<ul>" + "".join(items) + "</ul>")
            items = []
        if line.startswith("#"):
            level = len(line) - len(line.lstrip("#"))
            out.append(f"<h{level}>{html.escape(line.lstrip('# '))}</h{level}>")
        elif line.strip():
            out.append(f"<p>{_inline_html(line)}</p>")
    return "".join(out)


def slug(name: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def unique_slug(name: str, taken: set[str]) -> str:
    """`slug(name)`, or with -2, -3, ... if `taken` holds it already; added to `taken`."""
    base = out = slug(name)
    i = 2
    while out in taken:
        out, i = f"{base}-{i}", i + 1
    taken.add(out)
    return out


def plot_scenario(
    sc: dict[str, Any], labels: list[str], out_dir: Path, capacity_slo: dict | None, base: str
) -> list[Path]:
    """Write this scenario's PNGs as ``{base}-{kind}.png`` (one colour per controller in
    `labels`); returns their paths."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    paths = []
    colors = {c: plt.cm.tab10(i % 10) for i, c in enumerate(labels)}

    fig, axes = plt.subplots(4, 1, figsize=(9, 9.5), sharex=True)
    for c in labels:
        tl = sc["timelines"][c]
        t = np.asarray(tl["time_s"])
        axes[0].step(t, tl["max_num_seqs"], where="post", color=colors[c], label=c, lw=1.3)
        axes[1].step(t, tl["max_num_batched_tokens"], where="post", color=colors[c], lw=1.3)
        axes[2].plot(t, tl["num_requests_running"], color=colors[c], lw=1.3)
        axes[3].plot(t, np.asarray(tl["kv_cache_usage"]) * 100, color=colors[c], lw=1.3)
    axes[0].set_ylabel("max_num_seqs")
    axes[1].set_ylabel("max_num_batched_tokens")
    for ax in axes[:2]:
        ax.set_yscale("log", base=2)
    axes[2].set_ylabel("running requests")
    axes[3].set_ylabel("KV cache used (%)")
    axes[3].set_ylim(0, 105)
    axes[3].set_xlabel("engine time (s), first seed")
    axes[0].legend(fontsize=8, ncol=3, loc="best")
    for ax in axes:
        ax.grid(alpha=0.3)
    fig.suptitle(f"{sc['name']}: both limits, running requests and KV usage over time", fontsize=10)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / f"{base}-timeline.png"))

    fig, ax = plt.subplots(figsize=(8, 4.5))
    q = ITL_QUANTILES / 100
    for c in labels:
        values = sc["itl_ms_quantiles"][c]
        if values:
            ax.plot(values, q, color=colors[c], label=c, lw=1.5)
    tpot = SLO.parse(sc["scenario"]["slo"]).tpot_ms
    if tpot:
        ax.axvline(tpot, color="k", ls="--", lw=1, label=f"TPOT SLO {tpot:g} ms")
    ax.set_xscale("log")
    ax.set_xlabel("inter-token latency (ms, log)")
    ax.set_ylabel("fraction of tokens ≤ x")
    ax.set_title(f"{sc['name']}: ITL / TBT distribution (first seed)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    paths.append(_save(fig, out_dir / f"{base}-itl.png"))

    if capacity_slo and any(e["capacity"] for e in sc["results"].values()):
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
        for c in labels:
            cap = sc["results"][c]["capacity"]
            by_rate: dict[float, list[dict]] = {}
            for p in cap["probes"]:  # seeds share the probe rates until their searches part
                by_rate.setdefault(round(p["rate"], 6), []).append(p)
            rates = sorted(by_rate)
            for ax, key in zip(axes, ("output_throughput", "output_goodput"), strict=True):
                vals = [[p[key] for p in by_rate[r]] for r in rates]
                ax.errorbar(
                    rates,
                    [np.mean(v) for v in vals],
                    yerr=[np.std(v, ddof=1) if len(v) > 1 else 0.0 for v in vals],
                    fmt="-o",
                    ms=3,
                    capsize=2,
                    color=colors[c],
                    label=c,
                )
                ax.axvline(cap["mean"], color=colors[c], ls=":", lw=1)
        for ax, title in zip(axes, ("output throughput", "output goodput"), strict=True):
            ax.set_xlabel("Poisson arrival rate (req/s)")
            ax.set_ylabel(f"{title} (tok/s)")
            ax.grid(alpha=0.3, which="both")
        axes[0].legend(fontsize=8)
        bounds = ", ".join(f"{k} ≤ {v:g}" for k, v in capacity_slo["bounds"])
        fig.suptitle(
            f"{sc['name']}: vs arrival rate (capacity probes, mean ± std over seeds)\n"
            f"dotted: each controller's capacity ({bounds})"
        )
        fig.tight_layout()
        paths.append(_save(fig, out_dir / f"{base}-rate.png"))
    return paths


def _save(fig: Any, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def overlong_note(sc: dict[str, Any]) -> str | None:
    """The line on requests longer than the context (dropped or truncated), None if none."""
    fit = sc.get("overlong")
    if not fit or fit["policy"] not in ("drop", "truncate"):
        return None
    fate = "dropped" if fit["policy"] == "drop" else "truncated"
    counts, totals = fit[f"{fate}_requests"], fit["requests"]
    if not any(counts):
        return None
    if len(set(counts)) == 1 and len(set(totals)) == 1:
        share = f"{counts[0]:,} of {totals[0]:,} requests"
    else:
        pairs = ", ".join(f"{n:,} of {t:,}" for n, t in zip(counts, totals, strict=True))
        share = f"{pairs} requests (seeds {', '.join(map(str, sc['seeds']))})"
    option = "the suite's overlong:" if sc["scenario"].get("family") else "--overlong"
    return (
        f"{share} were longer than the {fit['max_model_len']:,}-token context and {fate} "
        f"({option} {fit['policy']})."
    )


def bad_rows_note(sc: dict[str, Any]) -> str | None:
    """The line on a trace file's bad rows left out, None if none."""
    bad = sc.get("bad_rows")
    if not bad or not bad["skipped_rows"]:
        return None
    option = "the suite's bad_rows:" if sc["scenario"].get("family") else "--bad-rows"
    return (
        f"Bad rows of the trace left out ({option} skip): {bad['skipped_rows']:,}; the "
        f"first: {bad['first']}."
    )


def scenario_notes(sc: dict[str, Any]) -> list[str]:
    """Lines on bad trace rows left out, requests longer than the context, the seeds (what
    they varied), vLLM's default and the best-static search."""
    out = [note for note in (bad_rows_note(sc), overlong_note(sc)) if note]
    if sc.get("seed_note"):
        out.append(f"Seeds: {sc['seed_note']}.")
    draws = [d for d in sc.get("draws") or [] if d]
    if draws:
        keys = sorted({k for d in draws for k in d})
        spans = ", ".join(
            f"{k} {min(d[k] for d in draws):.3g} to {max(d[k] for d in draws):.3g}" for k in keys
        )
        out.append(f"Drawn per seed (besides lengths and arrival times): {spans}.")
    if sc.get("default"):
        d = sc["default"]
        out.append(f"default = {d['spec']}: {d['why']}.")
    bs = sc.get("best_static")
    if bs:
        text = (
            f"best-static = {bs['best']}: best mean {bs['ranked_by']} over "
            f"{len(bs['candidates'])} (max_num_seqs, max_num_batched_tokens) candidates on "
            f"tuning seeds {', '.join(map(str, bs['tuning_seeds']))}"
        )
        out.append(text + (f"; {bs['note']}." if bs["note"] else "."))
    open_ended = {  # the highest rate probed, where some seed met the SLO at every rate
        c: max(p["rate"] for p in e["capacity"]["probes"])
        for c, e in sc["results"].items()
        if e["capacity"] and not e["capacity"]["bracketed"]
    }
    if open_ended:
        out.append(
            f"Capacity (≥) of {', '.join(open_ended)}: on some seed the SLO held at every rate "
            f"probed, up to {max(open_ended.values()):,.2f} req/s; "
            f"{sc['capacity_target']['num_requests']:,} requests a probe may be too few to load "
            "the engine (--capacity-requests)."
        )
    return out


def _inline_html(text: str) -> str:
    """HTML for a line with ``**bold**`` spans."""
    parts = html.escape(text).split("**")
    return "".join(f"<b>{x}</b>" if i % 2 else x for i, x in enumerate(parts))


def engine_label(scenario: dict[str, Any]) -> str:
    """``profile NAME (sim engine)`` or ``model DIR (vllm engine, num_gpu_blocks=40)``."""
    if scenario["engine"] == "sim":
        scheduler = scenario.get("scheduler", DEFAULT_SCHEDULER)
        return f"profile {scenario['profile']} (sim engine, vLLM {scheduler.upper()} scheduling)"
    args = ", ".join(f"{k}={v}" for k, v in scenario.get("engine_args") or ())
    return f"model {scenario['model']} (vllm engine{', ' + args if args else ''})"


PLOT_KINDS = ("timeline", "itl", "rate")
"""The plots `plot_scenario` writes, as ``{scenario}-{kind}.png``."""
_PLOT_LINK = re.compile(
    rf"^!\[[^\]]*\]\(([^/()]+-(?:{'|'.join(PLOT_KINDS)})\.png)\)$", re.MULTILINE
)


def remove_old_plots(out_dir: Path) -> None:
    """Delete the plots an earlier report.md in `out_dir` links to (its own lines, as
    ``![name](name-timeline.png)``, and the names `plot_scenario` gives), so a directory given
    again holds no plots of scenarios no longer run; no other file is touched."""
    old = out_dir / "report.md"
    if old.is_file():
        for name in _PLOT_LINK.findall(old.read_text(errors="replace")):
            (out_dir / name).unlink(missing_ok=True)


def write_report(
    results: dict[str, Any],
    out_dir: Path,
    *,
    title: str,
    command: str,
    headline: Sequence[str] = (),
    preamble: Sequence[str] = (),
) -> Path:
    """Write report.md and report.html (plots embedded) under `out_dir`; returns report.md.

    `headline`: markdown lines (``**bold**`` spans, ``- `` list items) placed first, under
    the title; `preamble`: markdown lines (paragraphs and pipe tables) placed before the
    scenarios.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_old_plots(out_dir)
    labels = results["controllers"]
    verdicts = [verdict(sc, labels) for sc in results["scenarios"]]
    intro = [
        f"Command: `{command}`",
        f"Evaluation seeds: {', '.join(map(str, results['seeds']))}; values are mean ± sample "
        "std across seeds (std omitted when 0). Every controller runs the same workload draw "
        "per seed; differences are paired by seed, with 95% Student-t intervals (* where the "
        "interval excludes 0). Harness wall time: "
        f"{results['wall_s']:.1f} s on {results['workers']} worker process(es).",
    ]
    if results.get("tuning_seeds") and BEST_STATIC in labels:
        intro.append(
            f"best-static is chosen on tuning seeds {', '.join(map(str, results['tuning_seeds']))} "
            "and reported on the evaluation seeds (no hindsight)."
        )
    md = [f"# {title}", "", *([*headline, ""] if headline else []), *(f"- {v}" for v in verdicts)]
    md.append("")
    body = [f"<h1>{html.escape(title)}</h1>", _md_block_html(headline)]
    if verdicts:
        body.append("<ul>" + "".join(f"<li>{_inline_html(v)}</li>" for v in verdicts) + "</ul>")
    if len(results["scenarios"]) > 1:
        shead, srows = summary_table(results)
        md += ["Mean per scenario, and paired differences vs the best reference:", ""]
        md += [md_table(shead, srows), ""]
        body.append(_html_table(shead, srows))
    md += [*(f"{line}  " for line in intro), "", *preamble]
    body += [f"<p>{html.escape(x)}</p>" for x in intro]
    body += [_md_block_html(preamble)]
    bases: set[str] = set()  # the plots' file names: two names may slug alike
    for sc in results["scenarios"]:
        s = sc["scenario"]
        cap = sc["capacity_target"]
        base = unique_slug(sc["name"], bases)
        desc = (
            f"Workload {sc['workload']} (first seed), {engine_label(s)}, "
            f"goodput SLO {s['slo']}, control interval {s['interval']} for every controller."
        )
        if cap:
            bounds = ", ".join(f"{k} ≤ {v:g}" for k, v in cap["bounds"])
            desc += (
                f" Capacity: highest Poisson rate (req/s) with {bounds} and every request "
                f"finished, {cap['num_requests']} requests per probe, bisection to "
                f"{cap['rel_tol']:.0%}; (≥): never bracketed from above."
            )
        (head, rows), (phead, prows) = scenario_tables(sc, labels)
        notes = scenario_notes(sc)
        md += [f"## {sc['name']}", "", desc, "", *notes, "", md_table(head, rows), ""]
        body += [f"<h2>{html.escape(sc['name'])}</h2>", f"<p>{html.escape(desc)}</p>"]
        body += [f"<p>{html.escape(n)}</p>" for n in notes]
        body.append(_html_table(head, rows))
        if len(labels) > 1:
            key, _ = ranking_metric(sc)
            line = (
                f"Paired differences in {METRIC_NAMES.get(key, key)} (row minus column, % of the "
                "column's mean, 95% interval; * excludes 0):"
            )
            md += [line, "", md_table(phead, prows), ""]
            body += [f"<p>{html.escape(line)}</p>", _html_table(phead, prows)]
        for path in plot_scenario(sc, labels, out_dir, cap, base):
            md += [f"![{path.stem}]({path.name})", ""]
            data = base64.b64encode(path.read_bytes()).decode()
            body.append(f'<img alt="{path.stem}" src="data:image/png;base64,{data}">')
    (out_dir / "report.md").write_text("\n".join(md) + "\n")
    style = (
        "body{font-family:sans-serif;max-width:1200px;margin:auto;padding:1em}"
        "table{border-collapse:collapse;margin:1em 0;font-size:13px}"
        "td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}"
        "td:first-child,th:first-child{text-align:left}img{max-width:100%;display:block}"
    )
    page = (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body>{''.join(body)}</body></html>\n"
    )
    (out_dir / "report.html").write_text(page)
    return out_dir / "report.md"
