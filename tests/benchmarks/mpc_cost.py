"""Cost of the lookahead oracle `mpc` and of the simulator fork it is built on.

Runs `mpc` (and static:256 for the plain simulator speed) on one scenario and prints, per
simulated second: wall and CPU seconds, re-plans, rollouts and the candidates scored by
a rollout they would repeat (`reused`, not rolled out); then the cost of one
`SimEngine.fork(history=False)` in the middle of the run, and with 1k and 1M arrivals
still to come (it should not grow with them). CPU time is the honest figure on a shared
machine (wall time counts other processes' turns).

    python tests/benchmarks/mpc_cost.py [--profile llama-2-7b-a100]
        [--workload embedded:azure-conv@gamma:6:3] [--num-requests 300] [--spec mpc]
"""

from __future__ import annotations

import argparse
import time

from batchpilot.baselines.specs import make_controller
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import Request, Workload
from batchpilot.envs.workloads import make_workload
from batchpilot.training.commands.common import parse_workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--profile", default="llama-2-7b-a100")
    parser.add_argument("--workload", default="embedded:azure-conv@gamma:6:3")
    parser.add_argument("--num-requests", type=int, default=300)
    parser.add_argument("--spec", default="mpc")
    parser.add_argument("--slo", default="ttft:2000,tpot:50")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    profile = get_profile(args.profile)
    source, arrival = parse_workload(args.workload)
    workload = make_workload(
        source,
        arrival,
        num_requests=args.num_requests,
        seed=args.seed,
        max_model_len=profile.max_model_len,
        overlong="truncate",
    )
    slo = SLO.parse(args.slo)
    print(f"{workload.name} on {profile.name}, {len(workload)} requests, SLO {slo}")
    print(f"{'controller':<24}{'sim s':>8}{'wall s':>9}{'CPU s':>8}{'CPU/sim s':>11}"
          f"{'plans':>7}{'rollouts':>10}{'reused':>8}{'goodput':>9}")
    for spec in ("static:256", args.spec):
        controller = make_controller(spec)
        cpu = time.process_time()
        out = run(workload, SimEngine(profile, slo=slo), controller, ControlInterval.parse("1it"))
        cpu = time.process_time() - cpu
        m = out.metrics()
        cost = getattr(controller, "cost", dict)()
        print(
            f"{spec:<24}{m['simulated_seconds']:>8.1f}{out.wall_seconds:>9.2f}{cpu:>8.2f}"
            f"{cpu / m['simulated_seconds']:>11.4f}{cost.get('plans', 0):>7}"
            f"{cost.get('rollouts', 0):>10}{cost.get('reused', 0):>8}{m['output_goodput']:>9.1f}"
        )
    engine = SimEngine(profile, slo=slo)
    telemetry = engine.reset(workload, Limits(256))
    while telemetry.time_s < m["simulated_seconds"] / 2 and not engine.done:
        telemetry = engine.advance(until_s=telemetry.time_s + 1.0)
    print(
        f"fork(history=False) at t={telemetry.time_s:.0f}s with "
        f"{telemetry.num_requests_running} running, {telemetry.num_requests_waiting} waiting: "
        f"{fork_cost(engine) * 1e6:.0f} us CPU"
    )
    for size in (1_000, 1_000_000):
        engine = SimEngine(profile, slo=slo)
        requests = [Request(f"r{i}", 10.0 + i, 128, 128) for i in range(size)]
        engine.reset(Workload.from_requests("spaced", requests), Limits(256))
        print(f"fork(history=False) with {size:,} arrivals to come: "
              f"{fork_cost(engine) * 1e6:.0f} us CPU")


def fork_cost(engine: SimEngine, n: int = 2000) -> float:
    """CPU seconds of one `fork(history=False)` of `engine`, the mean of `n`."""
    start = time.process_time()
    for _ in range(n):
        engine.fork(history=False)
    return (time.process_time() - start) / n


if __name__ == "__main__":
    main()
