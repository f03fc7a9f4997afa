"""How close one engine profile comes to another when only its speed is scaled, and when its
decode knee is moved too (`EngineProfile.scaled(step_time, 1, knee)`): the factors that fit
best on a log grid and the rms log error of the step time over a few decode and prefill steps.
What `knee_scale` and `step_time_scale` ranges in a training config should cover.

    python tests/benchmarks/profile_shape_fit.py llama-2-7b-a100:llama-2-7b-h100 \
        llama-2-70b-a100x4:llama-2-70b-h100x4 llama-2-7b-a100:llama-2-7b-a40
"""

from __future__ import annotations

import argparse

import numpy as np

from batchpilot.envs.profiles import EngineProfile, get_profile

STEPS = [(0, d, 0, 0, d, d * 600) for d in (1, 8, 32, 128, 256)] + [
    (1, p, p, p * p // 2, 0, 0) for p in (256, 512, 1024, 2048, 4096)
]
"""`StepModel.time` arguments: decode steps of 1-256 requests at 600 tokens of context, and
single prefill chunks of 256-4,096 tokens."""

GRID = np.exp(np.linspace(np.log(0.2), np.log(6.0), 80))


def rms_error(model: EngineProfile, target: EngineProfile) -> float:
    """Root mean square of log(step time / target's step time) over `STEPS`."""
    ratios = [model.step.time(*s) / target.step.time(*s) for s in STEPS]
    return float(np.sqrt(np.mean(np.log(ratios) ** 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pairs", nargs="+", help="FROM:TO profile names")
    args = parser.parse_args()
    print("| target | from | step time | knee | rms error | step time alone | rms error |")
    print("|---|---|---|---|---|---|---|")
    for pair in args.pairs:
        source, target = (get_profile(name) for name in pair.split(":"))
        both = min(
            (rms_error(source.scaled(s, 1.0, k), target), s, k) for s in GRID for k in GRID
        )
        alone = min((rms_error(source.scaled(s), target), s) for s in GRID)
        print(
            f"| {target.name} | {source.name} | {both[1]:.2f}x | {both[2]:.2f}x | "
            f"{both[0]:.1%} | {alone[1]:.2f}x | {alone[0]:.1%} |"
        )


if __name__ == "__main__":
    main()
