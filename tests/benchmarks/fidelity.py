"""Simulator fidelity: the same workloads and controllers on the real vLLM engine, repeated,
and in the simulator with one or more calibrated profiles (`batchpilot calibrate`).

    OMP_NUM_THREADS=1 python tests/benchmarks/fidelity.py --profile cpu-tiny-llama \\
        --profile profiles/cpu-tiny-table.json --repeats 5

Every case runs --repeats times on the real engine (its timings vary run to run); the
simulator is deterministic and runs once per profile. Per case and profile: output
throughput and median TTFT and TPOT, the real engine's median over repeats with its
spread (min-max), and the simulator's relative error against each real repeat as a median
with its spread, judged against the targets (5% throughput, 10% TTFT and TPOT) on the
median. For all-at-once runs, the share of iterations whose scheduling (running, waiting,
prefill tokens, decode requests) is identical on both engines. Per case and profile, the real
engine's step times (the first repeat's) against the profile's prediction for the very same
steps: the ratio of their sums, the median ratio by decode batch size, and how the log ratio
spreads (sd) and persists from step to step (lag-1 autocorrelation: slow spells on a shared
machine, not a model error, persist).
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np

from batchpilot.baselines.specs import make_controller
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import EngineProfile, get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.vllm_tracker import CLOCKS
from batchpilot.envs.workload import Workload
from batchpilot.envs.workloads import make_workload

TARGETS = {"output_throughput": 0.05, "median_ttft_ms": 0.10, "median_tpot_ms": 0.10}
"""Largest acceptable |median relative error| of the simulator per metric."""
SLO_SPEC = SLO.parse("ttft:2000,tpot:50")
STEPS_KEPT = 200_000
"""Real steps the engine keeps for the step-by-step comparison (a case's first repeat)."""
CASES = [  # (source, arrival, requests, controller)
    ("fixed:128:64", "all-at-once", 48, "static:16"),
    ("fixed:300:200", "all-at-once", 32, "static:32"),
    ("embedded:sharegpt", "poisson:6", 80, "static:32"),
    ("embedded:sharegpt", "poisson:6", 80, "alg1"),
    ("embedded:azure-conv", "poisson:3", 60, "alg1+alg2:sla_ms=20"),
]


def step_trace(engine: Engine, workload: Workload, limit: int) -> list[tuple[int, int, int, int]]:
    """(running, waiting, prefill tokens, decode requests) after each iteration."""
    engine.reset(workload, Limits(limit))
    out = []
    while not engine.done:
        t = engine.advance(max_iterations=1)
        out.append(
            (
                t.num_requests_running,
                t.num_requests_waiting,
                t.step_prefill_tokens,
                t.step_decode_tokens,
            )
        )
    return out


DECODE_BATCHES = ((1, 2), (2, 4), (4, 8), (8, 16), (16, 64), (64, 1 << 30))
"""Decode batch sizes [lo, hi) the step-time ratio is given for."""


def step_residuals(steps: list[list[float]], profile: EngineProfile) -> dict[str, object]:
    """The real `steps` (the tracker's step log: six counts and the seconds) against
    `profile`'s step time for the same counts."""
    counts = [tuple(int(v) for v in s[:6]) for s in steps]
    real = np.array([s[6] for s in steps], dtype=np.float64)
    pred = np.array([profile.step.time(*c) for c in counts])
    keep = (real > 0) & (pred > 0)
    log_ratio = np.log(real[keep] / pred[keep])
    by_batch = {}
    for lo, hi in DECODE_BATCHES:
        pick = [i for i, c in enumerate(counts) if c[1] == 0 and lo <= c[4] < hi and keep[i]]
        if pick:
            label = str(lo) if hi == lo + 1 else f"{lo}-{hi - 1}" if hi < 1 << 30 else f"{lo}+"
            by_batch[label] = float(np.median(real[pick] / pred[pick]))
    lag1 = 0.0  # none to speak of: too few steps, or no spread
    if len(log_ratio) > 2 and log_ratio[:-1].std() > 0 and log_ratio[1:].std() > 0:
        lag1 = float(np.corrcoef(log_ratio[:-1], log_ratio[1:])[0, 1])
    return {
        "steps": len(steps),
        "sum_ratio": float(real.sum() / pred.sum()) if pred.sum() > 0 else float("nan"),
        "decode_ratio_by_batch": by_batch,
        "log_ratio_sd": float(log_ratio.std()) if len(log_ratio) else 0.0,
        "log_ratio_lag1": lag1,
    }


def metrics(workload: Workload, engine: Engine, spec: str) -> dict[str, float]:
    m = run(workload, engine, make_controller(spec), ControlInterval.parse("1it")).metrics()
    return {k: float(m[k]) for k in TARGETS}


def compare(real: list[dict[str, float]], sim: dict[str, float]) -> dict[str, dict]:
    """Per metric: real median and spread, sim value, sim error vs each repeat (median,
    spread) and whether the median error meets the target."""
    out = {}
    for key, target in TARGETS.items():
        values = np.array([r[key] for r in real])
        errors = sim[key] / values - 1
        med = float(np.median(errors))
        out[key] = {
            "real_median": float(np.median(values)),
            "real_min": float(values.min()),
            "real_max": float(values.max()),
            "sim": sim[key],
            "error_median": med,
            "error_min": float(errors.min()),
            "error_max": float(errors.max()),
            "target": target,
            "within_target": abs(med) <= target,
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--profile",
        action="append",
        required=True,
        help="calibrated profile JSON or name (repeatable: every profile against the same "
        "real runs)",
    )
    parser.add_argument("--model", help="model directory (default: a tiny random Llama)")
    parser.add_argument(
        "--blocks", type=int, default=40, help="KV blocks on both sides (KV pressure)"
    )
    parser.add_argument(
        "--repeats", type=int, default=5, help="real runs per case. Default: %(default)s"
    )
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="the real engine's clock: wall, or its CPU time with idle gaps skipped (for a "
        "loaded machine; compare with a profile calibrated on the same clock)",
    )
    parser.add_argument("--cases", help="comma-separated case numbers (default: all)")
    parser.add_argument(
        "--json", type=Path, help="also write the results, with every real run, here"
    )
    parser.add_argument(
        "--real",
        type=Path,
        help="score the profiles against the real runs saved by an earlier --json instead "
        "of running the engine again",
    )
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    profiles: list[EngineProfile] = [
        replace(get_profile(p), num_gpu_blocks=args.blocks) for p in args.profile
    ]
    first = profiles[0]
    if any(
        (p.max_num_seqs, p.max_model_len, p.max_num_batched_tokens, p.block_size)
        != (first.max_num_seqs, first.max_model_len, first.max_num_batched_tokens, first.block_size)
        for p in profiles
    ):
        parser.error("profiles must share caps and block size (one real engine serves all)")
    saved = {}
    if args.real:
        saved = {
            (c["case"], c["controller"]): c for c in json.loads(args.real.read_text())["cases"]
        }
    else:
        from batchpilot.envs.vllm_engine import VLLMEngine
        from batchpilot.envs.vllm_models import tiny_llama

        model = args.model or str(tiny_llama(Path(tempfile.mkdtemp()) / "tiny"))
        real_engine = VLLMEngine(
            model, slo=SLO_SPEC, max_num_seqs=first.max_num_seqs,
            max_model_len=first.max_model_len,
            max_num_batched_tokens=first.max_num_batched_tokens, num_gpu_blocks=args.blocks,
            clock=args.clock, step_log=STEPS_KEPT,
        )  # fmt: skip
    chosen = [int(c) for c in args.cases.split(",")] if args.cases else list(range(len(CASES)))
    results = []
    for index in chosen:
        source, arrival, n, spec = CASES[index]
        w = make_workload(
            source, arrival, num_requests=n, seed=0, max_model_len=first.max_model_len,
            overlong="truncate",
        )  # fmt: skip
        name = f"{source}@{arrival}"
        trace = None
        if args.real:
            real, trace = saved[name, spec]["real_runs"], saved[name, spec].get("real_trace")
            steps = saved[name, spec].get("real_steps")
        else:
            real, steps = [], None
            for _ in range(args.repeats):
                real.append(metrics(w, real_engine, spec))
                if steps is None:  # the first repeat's
                    steps = [list(s) for s in real_engine.scheduler.tracker.step_log]
        case = {"case": name, "controller": spec, "profiles": {}, "real_runs": real}
        if steps:
            case["real_steps"] = steps
        for p in profiles:
            sim = metrics(w, SimEngine(p, slo=SLO_SPEC), spec)
            case["profiles"][p.name] = compare(real, sim)
            if steps:
                case["profiles"][p.name]["step_time"] = step_residuals(steps, p)
        if arrival == "all-at-once":  # static controllers only
            limit = int(spec.removeprefix("static:"))
            a = [tuple(x) for x in trace] if trace else step_trace(real_engine, w, limit)
            case["real_trace"] = a
            for p in profiles:
                b = step_trace(SimEngine(p, slo=SLO_SPEC, fast_forward=False), w, limit)
                same = sum(x == y for x, y in zip(a, b, strict=False)) / max(len(a), len(b))
                case["profiles"][p.name]["identical_scheduling"] = same
        results.append(case)
        print_case(case, len(real))
        if args.json:  # after every case: a long run's finished cases are kept
            data = {"repeats": args.repeats, "clock": args.clock, "cases": results}
            args.json.write_text(json.dumps(data, indent=2))
    print_summary(results)
    if args.json:
        print(f"wrote {args.json}")


def print_case(case: dict, repeats: int) -> None:
    print(f"\n{case['case']}  {case['controller']}  ({repeats} real runs)")
    for name, res in case["profiles"].items():
        cells = []
        for key in TARGETS:
            r = res[key]
            mark = "ok" if r["within_target"] else "MISS"
            cells.append(
                f"{key} real {r['real_median']:.1f} [{r['real_min']:.1f}-{r['real_max']:.1f}] "
                f"sim {r['sim']:.1f} err {r['error_median']:+.1%} "
                f"[{r['error_min']:+.1%}..{r['error_max']:+.1%}] {mark}"
            )
        same = res.get("identical_scheduling")
        extra = f"; identical scheduling {same:.0%}" if same is not None else ""
        print(f"  {name}: " + "; ".join(cells) + extra)
        st = res.get("step_time")
        if st:
            batches = ", ".join(f"{k}: {v:.2f}" for k, v in st["decode_ratio_by_batch"].items())
            print(
                f"    step time real/predicted over {st['steps']} steps: {st['sum_ratio']:.3f}; "
                f"decode steps by batch size (median) {batches}; log ratio sd "
                f"{st['log_ratio_sd']:.2f}, lag-1 autocorrelation {st['log_ratio_lag1']:.2f}"
            )


def print_summary(results: list[dict]) -> None:
    names = list(results[0]["profiles"]) if results else []
    print("\nmedian |error| over cases (targets: " + ", ".join(
        f"{k} {v:.0%}" for k, v in TARGETS.items()) + ")")  # fmt: skip
    for name in names:
        parts = []
        for key in TARGETS:
            errs = [abs(c["profiles"][name][key]["error_median"]) for c in results]
            hits = sum(c["profiles"][name][key]["within_target"] for c in results)
            parts.append(f"{key} {np.median(errs):.1%} ({hits}/{len(results)} within)")
        print(f"  {name}: " + "; ".join(parts))


if __name__ == "__main__":
    main()
