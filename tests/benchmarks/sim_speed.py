"""Simulator speed: the Azure conversation trace (19,366 requests, 1 hour) replayed with
static:256 on each --profile (default: the measured Llama-3-8B on A100 and the linear
roofline 7B profile). Requests longer than a profile's context are dropped (counted).
Prints iterations per second and simulated seconds per wall second and per CPU second of
this process (the per-core figure; on a shared machine, wall time also counts other
processes), with the closed-form decode runs on and off side by side (same results).

    python tests/benchmarks/sim_speed.py [--traces ../shared/traces] [--profile NAME ...]
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from batchpilot.baselines.static import StaticController
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload


def main() -> None:
    default = Path(__file__).resolve().parents[2] / ".." / "shared" / "traces"
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--traces", type=Path, default=Path(os.environ.get("BATCHPILOT_TRACES", default)))
    parser.add_argument("--interval", default="1s", help="control interval (static: any gives the same result)")
    parser.add_argument(
        "--profile", nargs="+", default=["llama-3-8b-a100", "llama-7b-a100"], help="profiles"
    )
    args = parser.parse_args()
    trace = args.traces / "azure2023" / "AzureLLMInferenceTrace_conv.csv"
    source, count = str(trace), None
    if not trace.is_file():  # a fresh clone has no ../shared: the trace's embedded table
        source, count = "embedded:azure-conv", 19_366
        print(f"{trace}: not found (--traces DIR); replaying {source} instead, {count} requests")
    t0 = time.perf_counter()
    workload = make_workload(source, "replay", num_requests=count)
    print(f"loaded {len(workload)} requests in {time.perf_counter() - t0:.2f} s")
    for name in args.profile:
        profile = get_profile(name)
        fitted = workload.fit_context(profile.max_model_len, "drop")
        print(
            f"\n{name} ({profile.step_model} step model): {len(fitted)} requests "
            f"({len(workload) - len(fitted)} over its {profile.max_model_len}-token context dropped)"
        )
        print(
            f"{'mode':<14}{'iterations':>12}{'sim s':>10}{'wall s':>9}{'it/s':>10}{'sim/wall':>10}"
            f"{'cpu s':>8}{'sim/cpu':>10}  outputs"
        )
        for fast in (True, False):
            engine = SimEngine(profile, slo=SLO(ttft_ms=2000, tpot_ms=100), fast_forward=fast)
            cpu = time.process_time()
            out = run(fitted, engine, StaticController(256), ControlInterval.parse(args.interval))
            cpu = time.process_time() - cpu
            m = out.metrics()
            label = "fast-forward" if fast else "per-step"
            print(
                f"{label:<14}{m['engine_iterations']:>12,}{m['simulated_seconds']:>10.0f}"
                f"{out.wall_seconds:>9.2f}{m['engine_iterations'] / out.wall_seconds:>10,.0f}"
                f"{m['simulated_seconds'] / out.wall_seconds:>9,.0f}x"
                f"{cpu:>8.2f}{m['simulated_seconds'] / cpu:>9,.0f}x"
                f"  completed={m['completed']} preemptions={m['num_preemptions']} "
                f"output_throughput={m['output_throughput']:.1f}"
            )

if __name__ == "__main__":
    main()
