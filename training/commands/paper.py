"""Reproduce the paper's Tables I and II (Pang et al., memory-aware and SLA-constrained
dynamic batching) in the simulator and write DIR/report.md with plots (and report.html,
results.json).

Table I: every request at t=0, no SLA, output throughput. LLaMA-65B on 8 x A100 with the
GSM8K trace's lengths (1,319 requests; the trace's outputs are shorter than the paper's, so
the paper's mean lengths 68/345 run too) and a 7B model on one A100 with 128/128 tokens
(1,000 requests). Table II: 50 ms TBT SLA, LLaMA3-70B on 8 x A100 with 257/62 and 257/448
tokens: capacity (highest Poisson rate meeting the SLA, by bisection) and the throughput
there, on the shipped roofline profile and on one whose step time is fitted to the paper's
Fig. 3 (50 ms at batch 100, 80 ms at batch 230).

examples:
  batchpilot paper --out training/reports/paper
  batchpilot paper --gsm8k ../shared/traces/gsm8k/gsm8k_test_token_lengths.csv --out out/paper
"""

from __future__ import annotations

import argparse
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from batchpilot.training.commands.common import COUNT

TABLE1_CONTROLLERS = "static:256,alg1,alg1:bound=exact,alg2,alg1+alg2,oracle,best-static"
TABLE2_CONTROLLERS = "static:256,alg1,alg2,alg1+alg2,alg1+alg2:chunk=1,oracle,best-static"
FIG3_STEP = {"base_s": 0.0269, "decode_seq_s": 0.000231}
"""Step time read off the paper's Fig. 3: 50 ms at batch 100, 80 ms at batch 230."""

# (setting, paper static, paper dynamic) from the paper's tables
PAPER_TABLE1 = {
    "65b-gsm8k": ("LLaMA-65B, GSM8K 68/345, 1,319", 1983, 2146),
    "65b-paper-lengths": ("LLaMA-65B, GSM8K 68/345, 1,319", 1983, 2146),
    "7b-128": ("PanGu-7B, 128/128, 1,000", 2305, 2956),
}
PAPER_TABLE2 = {  # (setting, capacity static, dynamic, throughput static, dynamic)
    "257/62": ("LLaMA3-70B, 257/62, 50 ms", 5.4, 6.6, 331, 405),
    "257/448": ("LLaMA3-70B, 257/448, 50 ms", 3.0, 3.8, 1322, 1665),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--gsm8k",
        default="embedded:gsm8k",
        help="GSM8K lengths: the trace CSV or embedded:gsm8k. Default: %(default)s",
    )
    parser.add_argument(
        "--seeds", type=COUNT, default=3, help="seeds for Table II (Table I is deterministic)"
    )
    parser.add_argument(
        "--capacity-slo",
        default="p90_itl_ms:50,p90_ttft_ms:2000",
        help="Table II capacity criterion (METRIC:MAX list). Default: %(default)s",
    )
    parser.add_argument("--workers", type=COUNT, help="worker processes (default: CPU count)")
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def fig3_profile(out_dir: Path) -> Path:
    """The LLaMA3-70B profile with the paper's Fig. 3 step time, written as a profile JSON.

    Per-token prefill cost is scaled by the same factor as the per-request decode cost.
    """
    from batchpilot.envs.profiles import PROFILES, StepTimeModel

    base = PROFILES["llama3-70b-8xa100"]
    scale = FIG3_STEP["decode_seq_s"] / base.step.decode_seq_s
    step = StepTimeModel(
        base_s=FIG3_STEP["base_s"],
        prefill_token_s=base.step.prefill_token_s * scale,
        decode_seq_s=FIG3_STEP["decode_seq_s"],
        kv_token_s=base.step.kv_token_s,
    )
    profile = replace(
        base,
        name="llama3-70b-fig3",
        description=base.description + "; step time fitted to the paper's Fig. 3",
        step=step,
    )
    path = out_dir / "llama3-70b-fig3.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(profile.to_json() + "\n")
    return path


def main(args: argparse.Namespace) -> int:
    from batchpilot.training.commands.common import write_json
    from batchpilot.training.evaluate import CapacityTarget, Scenario, evaluate
    from batchpilot.training.report import write_report

    t1 = [
        Scenario(
            "Table I: LLaMA-65B, GSM8K lengths, 1,319 at t=0",
            args.gsm8k, "all-at-once", 1319, profile="llama-65b-8xa100",
            score="output_throughput",
        ),
        Scenario(
            "Table I: LLaMA-65B, 68/345 tokens (the paper's means), 1,319 at t=0",
            "fixed:68:345", "all-at-once", 1319, profile="llama-65b-8xa100",
            score="output_throughput",
        ),
        Scenario(
            "Table I: 7B, 128/128 tokens, 1,000 at t=0",
            "fixed:128:128", "all-at-once", 1000, profile="llama-7b-a100",
            score="output_throughput",
        ),
    ]  # fmt: skip
    fig3 = str(fig3_profile(args.out))
    t2 = [
        Scenario(
            f"Table II: LLaMA3-70B ({label}), {src.removeprefix('fixed:').replace(':', '/')} "
            f"tokens, 50 ms TBT",
            src, f"poisson:{rate}", 1000, profile=profile, slo="tpot:50",
        )
        for label, profile in (("roofline", "llama3-70b-8xa100"), ("Fig. 3 step time", fig3))
        for src, rate in (("fixed:257:62", 5.4), ("fixed:257:448", 3.0))
    ]  # fmt: skip
    common = {"workers": args.workers, "progress": not args.no_progress}
    r1 = evaluate(t1, TABLE1_CONTROLLERS.split(","), [0], **common)
    r2 = evaluate(
        t2,
        TABLE2_CONTROLLERS.split(","),
        list(range(args.seeds)),
        capacity=CapacityTarget.parse(args.capacity_slo),
        **common,
    )
    command = "batchpilot " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    preamble = summary(r1, r2)
    results = {
        "command": command,
        "table1": without_plot_data(r1),
        "table2": without_plot_data(r2),
        "wall_s": r1["wall_s"] + r2["wall_s"],
    }
    write_json(args.out / "results.json", results)
    merged = {
        "controllers": r1["controllers"],
        "seeds": r2["seeds"],
        "workers": r2["workers"],
        "wall_s": results["wall_s"],
        "scenarios": [],
    }
    report = write_report(
        merged, args.out, title="The paper's Tables I and II in simulation", command=command,
        preamble=preamble,
    )  # fmt: skip
    t1_report = write_report(r1, args.out / "table1", title="Table I settings", command=command)
    t2_report = write_report(r2, args.out / "table2", title="Table II settings", command=command)
    report.write_text(
        report.read_text() + f"\nDetails: [Table I settings]({t1_report.relative_to(args.out)}), "
        f"[Table II settings]({t2_report.relative_to(args.out)}).\n"
    )
    print("\n".join(preamble[:40]))
    print(f"wrote {report}, {t1_report}, {t2_report}; wall time {results['wall_s']:.0f} s")
    return 0


def without_plot_data(results: dict[str, Any]) -> dict[str, Any]:
    """`results` without the per-step timelines and ITL quantiles (they are in the plots)."""
    drop = ("timelines", "itl_ms_quantiles")
    return results | {
        "scenarios": [{k: v for k, v in sc.items() if k not in drop} for sc in results["scenarios"]]
    }


def _pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.1f}%" if b else "—"


def summary(r1: dict[str, Any], r2: dict[str, Any]) -> list[str]:
    """Markdown lines: the paper's figures beside the simulated ones, and notes."""
    lines = [
        "## Paper vs simulation",
        "",
        "Table I (all requests at t=0; output tokens/s). Sim 'dynamic' is alg1 (Algorithm 1, "
        "the rule the paper runs without an SLA); best-static and the oracle bound what any "
        "limit rule could gain. alg1+alg2 adds Algorithm 2's default 50 ms TBT target, "
        "which caps the batch even though these runs have no SLA.",
        "",
        "| setting (sim) | paper static → dynamic | paper gain | sim static:256 | sim alg1 "
        "| sim gain | alg1+alg2 gain | best-static gain (N) | oracle gain | alg1 preempt. |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    keys = ("65b-gsm8k", "65b-paper-lengths", "7b-128")
    for key, sc in zip(keys, r1["scenarios"], strict=True):
        _, ps, pd = PAPER_TABLE1[key]
        res = sc["results"]

        def thr(c: str, res: dict = res) -> float:
            return res[c]["mean"]["output_throughput"]

        s, a = thr("static:256"), thr("alg1")
        lines.append(
            f"| {sc['name'].removeprefix('Table I: ')} | {ps:,} → {pd:,} | {_pct(pd, ps)} "
            f"| {s:,.0f} | {a:,.0f} | {_pct(a, s)} | {_pct(thr('alg1+alg2'), s)} "
            f"| {_pct(thr('best-static'), s)} ({res['best-static']['spec']}) "
            f"| {_pct(thr('oracle'), s)} | {res['alg1']['mean']['num_preemptions']:.0f} |"
        )
    lines += [
        "",
        "Table II (Poisson arrivals; capacity = highest rate meeting "
        + ", ".join(f"{k} ≤ {v:g}" for k, v in r2["scenarios"][0]["capacity_target"]["bounds"])
        + f"; mean over {len(r2['seeds'])} seeds). Sim 'dynamic' is alg1+alg2, "
        "b* = min(b_mem, b_SLA) as in the paper. best-static is the static:N with the best "
        "goodput at the setting's Poisson rate, not the best capacity, so its capacity can be "
        "below static:256's.",
        "",
        "| setting (sim) | paper capacity static → dynamic | paper tok/s gain "
        "| sim capacity static:256 → alg1+alg2 | sim tok/s at capacity gain "
        "| alg1+alg2:chunk=1 capacity | best-static capacity (N) | oracle capacity |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for sc in r2["scenarios"]:
        key = "257/62" if "257/62 " in sc["name"] else "257/448"
        _, cs, cd, ts, td = PAPER_TABLE2[key]
        res = sc["results"]

        def cap(c: str, res: dict = res) -> dict:
            return res[c]["capacity"]

        s, d = cap("static:256"), cap("alg1+alg2")
        lines.append(
            f"| {sc['name'].removeprefix('Table II: ')} | {cs} → {cd} ({_pct(cd, cs)}) "
            f"| {_pct(td, ts)} | {s['mean']:.2f} → {d['mean']:.2f} ({_pct(d['mean'], s['mean'])}) "
            f"| {_pct(d['output_throughput_at_capacity'], s['output_throughput_at_capacity'])} "
            f"| {cap('alg1+alg2:chunk=1')['mean']:.2f} "
            f"| {cap('best-static')['mean']:.2f} ({res['best-static']['spec']}) "
            f"| {cap('oracle')['mean']:.2f} |"
        )
    chunk = [
        r["results"]["alg1+alg2:chunk=1"]["capacity"]["mean"]
        / r["results"]["alg1+alg2"]["capacity"]["mean"]
        - 1
        for r in r2["scenarios"]
    ]
    lines += [
        "",
        f"The chunk-size search (alg1+alg2:chunk=1) changed capacity by {min(chunk):+.1%} to "
        f"{max(chunk):+.1%} against alg1+alg2 across these settings.",
        "",
        *NOTES,
    ]
    return lines


NOTES = [
    "### Why the simulated gains differ from the paper's",
    "",
    "- Table I gains in the simulator come only from letting more than 256 requests run "
    "once the KV cache has room: with all requests at t=0 a larger batch amortises the fixed "
    "per-step cost (weights streamed once per step). The shipped profiles are rooflines "
    "(see `batchpilot.envs.profiles`), whose step time grows linearly with the batch; the "
    "paper measured real engines (PanGu models on its own hardware, vLLM's V0 scheduler), "
    "where the step time grows more slowly at large batches, so a bigger batch pays more. "
    "The 7B row shows this most: per-request costs (weights-free compute and KV reads) "
    "dominate a 7B step at batch 256 on an A100, so a larger batch adds little.",
    "- The GSM8K trace's outputs (Llama-2 tokenizer, reference answers) are far shorter "
    "than the 345-token outputs LLaMA-65B generated in the paper; with short requests "
    "memory never binds at 256, so the row with the paper's mean lengths is the closer one.",
    "- Table II: in the simulator the SLA is missed at capacity because prefill chunks "
    "share steps with decodes (vLLM V1 chunked prefill: a 257-token prefill adds its "
    "compute to every decode in that step), not because the decode batch is too large. "
    "Where fewer requests run than the controllers' limits, static:256, Algorithm 1 and "
    "Algorithm 2 behave alike; where Algorithm 2's limit binds, it cannot remove the "
    "prefill interference that breaks the SLA, so capacity does not rise (compare the rows "
    "above). Algorithm 2 only helps when a large decode batch is what breaks the SLA. The "
    "chunk-size search (`chunk=1`) shrinks the token budget, spreading a prefill over more "
    "steps (its effect on capacity in this run is stated below the Table II rows). The "
    "paper's static baseline (V0 scheduler, prefills run as separate steps that stall every "
    "decode) loses more to large batches than V1's scheduler does.",
    "- Seeds: Table I's workloads are deterministic (fixed lengths or the whole trace, all at "
    "t=0), so one seed; Table II's Poisson arrivals use several, and capacity is mean ± std.",
]
