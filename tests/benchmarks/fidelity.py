"""Simulator fidelity: the same workloads and controllers on the real vLLM engine and in the
simulator with a calibrated profile (`batchpilot calibrate`), errors side by side.

    OMP_NUM_THREADS=1 python tests/benchmarks/fidelity.py --profile profiles/cpu-tiny.json

Per run: output throughput, median TTFT and TPOT, preemptions and mean KV usage (sim vs
real, relative error), and for all-at-once runs the share of iterations whose scheduling
(running, waiting, prefill tokens, decode requests) is identical.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

from batchpilot.baselines.specs import make_controller
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.vllm_engine import make_vllm_engine
from batchpilot.envs.vllm_models import tiny_llama
from batchpilot.envs.workloads import make_workload

METRICS = ("output_throughput", "median_ttft_ms", "median_tpot_ms", "num_preemptions", "mean_kv_usage")
SLO_SPEC = SLO.parse("ttft:2000,tpot:50")
CASES = [  # (source, arrival, requests, controller)
    ("fixed:128:64", "all-at-once", 48, "static:16"),
    ("fixed:300:200", "all-at-once", 32, "static:32"),
    ("embedded:sharegpt", "poisson:6", 80, "static:32"),
    ("embedded:sharegpt", "poisson:6", 80, "alg1"),
    ("embedded:azure-conv", "poisson:3", 60, "alg1+alg2:sla_ms=20"),
]


def step_trace(engine: Engine, workload, limit: int) -> list[tuple[int, int, int, int]]:
    """(running, waiting, prefill tokens, decode requests) after each iteration."""
    engine.reset(workload, Limits(limit))
    out = []
    while not engine.done:
        t = engine.advance(max_iterations=1)
        out.append((t.num_requests_running, t.num_requests_waiting, t.step_prefill_tokens, t.step_decode_tokens))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profile", required=True, help="calibrated profile JSON (or name)")
    parser.add_argument("--model", help="model directory (default: a tiny random Llama)")
    parser.add_argument("--blocks", type=int, default=40, help="KV blocks on both sides (KV pressure)")
    args = parser.parse_args()
    model = args.model or str(tiny_llama(Path(tempfile.mkdtemp()) / "tiny"))
    profile = replace(get_profile(args.profile), num_gpu_blocks=args.blocks)
    real = make_vllm_engine(
        model, slo=SLO_SPEC, max_num_seqs=profile.max_num_seqs, max_model_len=profile.max_model_len,
        max_num_batched_tokens=profile.max_num_batched_tokens, num_gpu_blocks=args.blocks,
    )  # fmt: skip
    sim = SimEngine(profile, slo=SLO_SPEC, fast_forward=False)
    header = f"{'workload':<36}{'controller':<22}" + "".join(f"{m:>24}" for m in METRICS)
    print(header)
    for source, arrival, n, spec in CASES:
        w = make_workload(source, arrival, num_requests=n, seed=0, max_model_len=profile.max_model_len, overlong="truncate")
        row = {}
        for name, engine in (("real", real), ("sim", sim)):
            row[name] = run(w, engine, make_controller(spec), ControlInterval.parse("1it")).metrics()
        cells = []
        for m in METRICS:
            r, s = row["real"][m], row["sim"][m]
            err = f"{(s / r - 1) * 100:+.1f}%" if r else "n/a"
            cells.append(f"{s:>8.1f}/{r:<8.1f}{err:>8}")
        print(f"{source + '@' + arrival:<36}{spec:<22}" + "".join(f"{c:>24}" for c in cells))
        if arrival == "all-at-once":  # static controllers only
            limit = int(spec.removeprefix("static:"))
            a, b = step_trace(real, w, limit), step_trace(sim, w, limit)
            same = sum(x == y for x, y in zip(a, b, strict=False)) / max(len(a), len(b))
            print(f"{'':<58}iterations real {len(a)}, sim {len(b)}; identical scheduling {same:.1%}")
    print("cells: sim/real and the simulator's relative error")


if __name__ == "__main__":
    main()
