"""Controller decision latency: CPU microseconds per `decide()` call for static, Algorithms 1
and 2, their combination and an exported policy (`policy:PATH`), on the telemetry of a real
simulated run (embedded Azure conversation, 7B profile), side by side; then the policy's
call taken apart (`Observer`, the network, `ActionGrid.apply`), with the network run as it
is deployed (numpy, `batchpilot.agents.onnx_numpy`) and, where onnxruntime is installed,
by onnxruntime (how policies ran before) in the same controller.

Each figure is the mean over the recorded decisions, taken `--repeat` times: the median
and the minimum of those means, in process CPU time (so other processes on a loaded
machine inflate it less than wall time).

    python tests/benchmarks/decision_latency.py --policy training/reports/learned/policy.onnx
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.agents.policy import PolicyController, load_policy
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


def per_call_us(
    fn: Callable[[Any], Any], items: Sequence[Any], repeat: int, before: Callable[[], Any]
) -> list[float]:
    """CPU microseconds per ``fn(item)``, the mean over `items`, `repeat` times (`before`
    runs ahead of each pass, untimed)."""
    out = []
    for _ in range(repeat):
        before()
        start = time.process_time()
        for item in items:
            fn(item)
        out.append((time.process_time() - start) / len(items) * 1e6)
    return out


def onnxruntime_act(path: Path) -> Callable[[np.ndarray], np.ndarray] | None:
    """The network run by onnxruntime as policies ran before (one thread), if installed."""
    try:
        import onnxruntime as ort
    except ImportError:
        return None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    session = ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])
    name, run_session = session.get_inputs()[0].name, session.run
    return lambda obs: run_session(None, {name: obs.reshape(1, -1)})[0][0]


def row(name: str, us: list[float]) -> None:
    print(f"{name:<30}{statistics.median(us):>10.2f}{min(us):>8.2f}{max(us):>8.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--policy", type=Path, required=True, help="exported policy (.onnx)")
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=9)
    args = parser.parse_args()

    profile = get_profile("llama-7b-a100")
    workload = make_workload(
        "embedded:azure-conv", "replay:0.7", num_requests=args.requests, seed=0
    )
    engine = SimEngine(profile, slo=SLO.parse("ttft:2000,tpot:50"))
    recorder = Recorder(make_controller("alg1+alg2"))
    run(workload, engine, recorder, ControlInterval.parse("1it"))
    seen = recorder.seen
    step_ms = engine.result().duration_s / len(seen) * 1e3
    print(f"{len(seen):,} recorded decisions; simulated mean step {step_ms:.1f} ms")
    print(f"{'CPU us per call':<30}{'median':>10}{'min':>8}{'max':>8}")
    for spec in ["static:256", "alg1", "alg2", "alg1+alg2", f"policy:{args.policy}"]:
        controller = make_controller(spec)
        us = per_call_us(controller.decide, seen, args.repeat, lambda c=controller: c.reset(engine))
        row("policy (numpy)" if spec.startswith("policy:") else spec, us)

    policy = load_policy(args.policy)
    ort_act = onnxruntime_act(args.policy)
    policy.reset(engine)
    observations = [policy.observer(t) for t in seen]
    actions = [policy.act(obs) for obs in observations]
    print("the policy's call, taken apart:")
    row("  Observer", per_call_us(policy.observer, seen, args.repeat, policy.observer.reset))
    row("  network (numpy)", per_call_us(policy.act, observations, args.repeat, lambda: None))
    if ort_act is not None:
        row(
            "  network (onnxruntime)", per_call_us(ort_act, observations, args.repeat, lambda: None)
        )
        same = sum(np.array_equal(policy.act(o), ort_act(o)) for o in observations)
        print(
            f"  numpy and onnxruntime actions equal at {same:,} of {len(observations):,} decisions"
        )
    row("  ActionGrid.apply", per_call_us(policy.grid.apply, actions, args.repeat, lambda: None))
    if ort_act is not None:
        before = PolicyController(
            ort_act,
            policy.grid.mode,
            policy.slo,
            policy.control_interval,
            name="onnxruntime",
            fields=policy.observer.fields,
            slo_scale=policy.slo_scale,
        )
        us = per_call_us(before.decide, seen, args.repeat, lambda: before.reset(engine))
        row("policy (onnxruntime network)", us)


if __name__ == "__main__":
    main()
