"""Controller decision latency: microseconds per `decide()` call for static, Algorithms 1
and 2, their combination and an exported policy (`policy:PATH`, onnxruntime), on the
telemetry of a real simulated run (embedded Azure conversation, 7B profile), side by side.

    python tests/benchmarks/decision_latency.py --policy out/quickstart/policy.onnx
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from batchpilot.agents.specs import make_controller
from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workloads import make_workload


class Recorder:
    """Wraps a controller and keeps every telemetry it is shown."""

    def __init__(self, inner: Controller) -> None:
        self.inner, self.name, self.seen = inner, "recorder", []

    def reset(self, engine: Engine) -> None:
        self.inner.reset(engine)

    def decide(self, telemetry: Telemetry) -> Limits:
        self.seen.append(telemetry)
        return self.inner.decide(telemetry)


def per_call_us(controller: Controller, engine: Engine, seen: list[Telemetry], repeat: int) -> list[float]:
    """Mean microseconds per call over the recorded telemetry, `repeat` times."""
    out = []
    for _ in range(repeat):
        controller.reset(engine)
        start = time.perf_counter()
        for t in seen:
            controller.decide(t)
        out.append((time.perf_counter() - start) / len(seen) * 1e6)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--policy", type=Path, required=True, help="exported policy (.onnx)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()

    profile = get_profile("llama-7b-a100")
    workload = make_workload("embedded:azure-conv", "replay:0.7", num_requests=args.requests, seed=0)
    engine = SimEngine(profile, slo=SLO.parse("ttft:2000,tpot:50"))
    recorder = Recorder(make_controller("alg1+alg2"))
    run(workload, engine, recorder, ControlInterval.parse("1it"))
    step_ms = engine.result().duration_s / len(recorder.seen) * 1e3
    print(f"{len(recorder.seen):,} recorded decisions; simulated mean step {step_ms:.1f} ms")
    print(f"{'controller':<22}{'median us/call':>16}{'min':>8}{'max':>8}")
    specs = ["static:256", "alg1", "alg2", "alg1+alg2", f"policy:{args.policy}"]
    for spec in specs:
        us = per_call_us(make_controller(spec), engine, recorder.seen, args.repeat)
        name = "policy (onnxruntime)" if spec.startswith("policy:") else spec
        print(f"{name:<22}{statistics.median(us):>16.2f}{min(us):>8.2f}{max(us):>8.2f}")
    policy = make_controller(f"policy:{args.policy}")
    policy.reset(engine)
    policy.decide(recorder.seen[-1])
    obs = policy.observer(recorder.seen[-1])
    start = time.perf_counter()
    n = 20_000
    for _ in range(n):
        policy.act(obs)
    print(f"{'  network alone':<22}{(time.perf_counter() - start) / n * 1e6:>16.2f}  (of the policy's call)")


if __name__ == "__main__":
    main()
