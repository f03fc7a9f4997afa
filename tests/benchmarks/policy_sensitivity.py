"""What an exported policy's choices respond to: run it once on a simulated workload, keep
every observation it decided on, then ask it again with one group of observation entries
scaled (the SLO headroom, TTFT pressure, the prefill backlog, ...) and print how far each
knob moves, in grid steps (mean, and the share of decisions moved up and down).

A policy that uses its telemetry raises the token budget when TPOT headroom is large and
TTFT pressure high, and on a faster engine; one whose budget barely moves under any scaling has learned a constant.

    python tests/benchmarks/policy_sensitivity.py --policy training/reports/learned/policy.onnx \
        --profile llama-2-7b-h100 \
        --workload ../shared/traces/azure2023/AzureLLMInferenceTrace_code.csv@replay:2
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable

import numpy as np

from batchpilot.agents.policy import load_policy
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID
from batchpilot.envs.observation import SCALES
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload
from batchpilot.training.commands.common import parse_workload

TBT = ("tbt_mean_over_tpot", "tbt_p90_over_tpot")
SPEED = ("step_base_over_tpot", "log2_tokens_per_tpot")


def times(factor: float) -> Callable[[np.ndarray], np.ndarray]:
    return lambda v: v * factor


def faster(factor: float) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """The engine `factor` times as fast: every step time / factor (TBT entries, the speed
    line's base), `factor` times the tokens per TPOT (log2 entry, over log2_budget)."""
    shift = math.log2(factor) / SCALES["log2_budget"]
    return {name: times(1 / factor) for name in (*TBT, SPEED[0])} | {SPEED[1]: lambda v: v + shift}


PROBES: tuple[tuple[str, dict[str, Callable[[np.ndarray], np.ndarray]]], ...] = (
    (f"{' + '.join(TBT)} x0.5", dict.fromkeys(TBT, times(0.5))),
    (f"{' + '.join(TBT)} x2", dict.fromkeys(TBT, times(2.0))),
    ("ttft_over_target + oldest_waiting_over_ttft x2",
     dict.fromkeys(("ttft_over_target", "oldest_waiting_over_ttft"), times(2.0))),
    ("waiting + waiting_prefill_tokens x2",
     dict.fromkeys(("waiting", "waiting_prefill_tokens"), times(2.0))),
    ("log_arrival_rate_short + log_arrival_rate_long x2",
     dict.fromkeys(("log_arrival_rate_short", "log_arrival_rate_long"), times(2.0))),
    ("kv_cache_usage x2", {"kv_cache_usage": times(2.0)}),
    ("engine 2x faster (step times x0.5, tokens per TPOT x2)", faster(2.0)),
    ("engine 2x slower (step times x2, tokens per TPOT x0.5)", faster(0.5)),
)
"""(label, {observation entry: transform}): each probe transforms those entries; a probe
naming an entry the policy was not trained on is skipped."""


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
    column = {name: i for i, name in enumerate(controller.observer.fields)}
    print(f"  {'entries changed':58s} {'max_num_seqs moves':>22s} {'budget moves':>22s}")
    for label, transforms in PROBES:
        unseen = [name for name in transforms if name not in column]
        if unseen:
            print(f"  {label:58s} (skipped: the policy does not see {', '.join(unseen)})")
            continue
        scaled = obs.copy()
        for name, transform in transforms.items():
            scaled[:, column[name]] = transform(scaled[:, column[name]])
        moved = np.array([act(o) for o in scaled]).astype(int) - base
        cells = [
            f"{m.mean():+.2f} (up {np.mean(m > 0):.0%}, down {np.mean(m < 0):.0%})"
            for m in moved.T
        ]
        print(f"  {label:58s} {cells[0]:>22s} {cells[1]:>22s}")


if __name__ == "__main__":
    main()
