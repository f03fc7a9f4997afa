"""A clairvoyant controller for the simulator: the upper reference for memory packing."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from batchpilot.baselines.checks import MAX_LIMIT, require
from batchpilot.envs.engine import Engine
from batchpilot.envs.profiles import NULL_BLOCKS
from batchpilot.envs.telemetry import Limits, Telemetry


def peak_blocks(held: np.ndarray, remaining: np.ndarray, block_size: int) -> int:
    """Most KV blocks the requests will hold at once if each gains one token per step.

    A request holding h tokens with r tokens still to generate holds h + k tokens k steps
    from now while k < r, and frees its blocks when it finishes. The total only drops when
    a request finishes, so its peak lies just before one of those finishes.
    """
    if len(held) == 0:
        return 0
    steps = np.unique(remaining - 1)  # candidate peaks: k = r_j - 1
    alive = remaining[None, :] > steps[:, None]
    blocks = -(-(held[None, :] + steps[:, None]) // block_size)
    return int((blocks * alive).sum(axis=1).max())


def largest_fitting(fits: Callable[[int], bool], lo: int, hi: int) -> int:
    """The largest k in [lo, hi] with ``fits(k)``, by bisection; `fits` must hold at `lo` and
    be monotone (true up to some k, false after)."""
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


class OracleController:
    """Admits the longest prefix of the waiting queue that never needs a preemption.

    Reads the true remaining output lengths of running and waiting requests from
    `SimEngine.remaining_output_tokens()` and `waiting_output_tokens()`: simulator only.
    `slack_blocks` keeps that many KV blocks spare for steps where prefill chunks delay
    some requests relative to others (default 0).
    """

    simulator_only = True
    """Reads the simulator's true request lengths: refused by `batchpilot serve`."""

    def __init__(self, slack_blocks: int = 0) -> None:
        require(
            0 <= slack_blocks <= MAX_LIMIT, "slack_blocks", slack_blocks, f"in [0, {MAX_LIMIT:,}]"
        )
        self.slack_blocks = slack_blocks
        self.name = "oracle"
        self._engine: Engine | None = None

    def reset(self, engine: Engine) -> None:
        """Keep the engine: the oracle reads its true request lengths at each decision."""
        missing = [
            m
            for m in ("remaining_output_tokens", "waiting_output_tokens")
            if not callable(getattr(engine, m, None))
        ]
        if missing:
            raise TypeError(
                f"the oracle controller needs a simulated engine that reveals true output "
                f"lengths; {type(engine).__name__} lacks {', '.join(missing)}"
            )
        self._engine = engine

    def decide(self, telemetry: Telemetry) -> Limits:
        if self._engine is None:
            raise RuntimeError("call reset(engine) before decide()")
        running = self._engine.remaining_output_tokens()  # type: ignore[attr-defined]
        waiting = self._engine.waiting_output_tokens()  # type: ignore[attr-defined]
        cap = self._engine.max_num_seqs
        capacity = telemetry.num_total_blocks - NULL_BLOCKS - self.slack_blocks
        pairs = np.array(running + waiting, dtype=np.int64).reshape(-1, 2)
        bs = telemetry.block_size

        def fits(k: int) -> bool:
            rows = pairs[: len(running) + k]
            return peak_blocks(rows[:, 0], rows[:, 1], bs) <= capacity

        if not fits(0):
            return Limits(max(len(running), 1))
        admit = largest_fitting(fits, 0, min(len(waiting), max(cap - len(running), 0)))
        return Limits(min(max(len(running) + admit, 1), cap))
