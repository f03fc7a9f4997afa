"""What an exported policy's choices respond to: run it once on a simulated workload, keep
every observation it decided on, then ask it again with one group of observation entries
scaled (the SLO headroom, TTFT pressure, the prefill backlog, ...) and print how far each
knob moves, in grid steps (mean, and the share of decisions moved up and down).

A policy that uses its telemetry raises the token budget when TPOT headroom is large and
TTFT pressure high; one whose budget barely moves under any scaling has learned a constant.

    python tests/benchmarks/policy_sensitivity.py --policy training/reports/learned/policy.onnx \
        --profile llama-2-7b-h100 \
        --workload ../shared/traces/azure2023/AzureLLMInferenceTrace_code.csv@replay:2
"""

from __future__ import annotations

import argparse
from collections import Counter

import numpy as np

from batchpilot.agents.policy import load_policy
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID
from batchpilot.envs.observation import OBSERVATION_FIELDS
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload
from batchpilot.training.commands.compare import parse_workload

PROBES: tuple[tuple[tuple[str, ...], float], ...] = (
    (("tbt_mean_over_tpot", "tbt_p90_over_tpot"), 0.5),
    (("tbt_mean_over_tpot", "tbt_p90_over_tpot"), 2.0),
    (("ttft_over_target", "oldest_waiting_over_ttft"), 2.0),
    (("waiting", "waiting_prefill_tokens"), 2.0),
    (("log_arrival_rate_short", "log_arrival_rate_long"), 2.0),
    (("kv_cache_usage",), 2.0),
)
"""(observation entries, factor): each probe multiplies those entries by the factor."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", required=True, help="exported policy (.onnx, sidecar beside)")
    parser.add_argument("--profile", default="llama-2-7b-h100", help="engine profile")
    parser.add_argument(
        "--workload",
        default="embedded:azure-code@replay:2",
        help="SOURCE@ARRIVAL, as `batchpilot compare --workload` takes it",
    )
    parser.add_argument("--num-requests", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    controller = load_policy(args.policy)
    act = controller.act
    seen: list[np.ndarray] = []

    def recording_act(obs: np.ndarray) -> np.ndarray:
        seen.append(obs.copy())
        return act(obs)

    controller.act = recording_act
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
    run(workload, SimEngine(profile, slo=controller.slo), controller, controller.control_interval)

    obs = np.array(seen)
    base = np.array([act(o) for o in obs]).astype(int)
    print(f"{args.policy} on {args.profile}, {args.workload}: {len(obs)} decisions")
    for knob, grid in ((0, SEQ_GRID), (1, BUDGET_GRID)):
        name = ("max_num_seqs", "token budget")[knob]
        print(f"  {name} chosen: " + ", ".join(
            f"{grid[i]} x{n}" for i, n in sorted(Counter(base[:, knob]).items())
        ))
    column = {name: i for i, name in enumerate(OBSERVATION_FIELDS)}
    print(f"  {'entries scaled':58s} {'max_num_seqs moves':>22s} {'budget moves':>22s}")
    for names, factor in PROBES:
        scaled = obs.copy()
        for name in names:
            scaled[:, column[name]] *= factor
        moved = np.array([act(o) for o in scaled]).astype(int) - base
        cells = [
            f"{m.mean():+.2f} (up {np.mean(m > 0):.0%}, down {np.mean(m < 0):.0%})"
            for m in moved.T
        ]
        print(f"  {' + '.join(names) + f' x{factor:g}':58s} {cells[0]:>22s} {cells[1]:>22s}")


if __name__ == "__main__":
    main()
