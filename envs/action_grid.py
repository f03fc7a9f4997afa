"""The learned controller's action: both knobs on log grids.

`max_num_seqs` is chosen from `SEQ_GRID` and the per-step token budget from
`BUDGET_GRID` (each clamped to the engine's caps). Two modes:

- ``grid``: absolute choices, action = (seq index, budget index);
- ``step``: bounded changes, action = (seq move, budget move), each 0, 1, 2 for one grid
  step down, stay, one grid step up.

Nothing caps the choice below the engine's own limits: memory overflow and latency
misses are priced by the environment's reward instead.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from batchpilot.envs.telemetry import Limits

SEQ_GRID: tuple[int, ...] = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 1024)
BUDGET_GRID: tuple[int, ...] = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)
MODES = ("grid", "step")


def nearest(grid: tuple[int, ...], value: float) -> int:
    """Index of the grid point nearest to `value` on a log scale."""
    x = math.log(max(1.0, value))
    return min(range(len(grid)), key=lambda i: abs(math.log(grid[i]) - x))


def at_least(grid: tuple[int, ...], value: float) -> int:
    """Index of the first grid point at or above `value` (the last if none is): a cap between
    grid points is reached by the point above it."""
    return next((i for i, g in enumerate(grid) if g >= value), len(grid) - 1)


@dataclass
class ActionGrid:
    """Maps actions to `Limits` for an engine with caps (`max_seqs`, `max_budget`)."""

    mode: str = "grid"
    max_seqs: int = 1 << 30
    max_budget: int = 1 << 30

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"action_mode must be one of {MODES}, got {self.mode!r}")
        self.index = self.top = (len(SEQ_GRID) - 1, len(BUDGET_GRID) - 1)
        self._limits: dict[tuple[int, int], Limits] = {}  # a decision is hot: made once
        self.nvec: tuple[int, int] = (
            (len(SEQ_GRID), len(BUDGET_GRID)) if self.mode == "grid" else (3, 3)
        )
        """The `MultiDiscrete` sizes of the action (each decision checks against them)."""

    def reset(self, max_seqs: int, max_budget: int) -> Limits:
        """Start at the engine's caps (the first grid points at or above them, which act as
        the caps); returns those limits."""
        self.max_seqs, self.max_budget = max_seqs, max_budget
        self._limits.clear()
        self.index = self.top = (at_least(SEQ_GRID, max_seqs), at_least(BUDGET_GRID, max_budget))
        return self.limits_at(self.index)

    def limits_at(self, index: tuple[int, int]) -> Limits:
        limits = self._limits.get(index)
        if limits is None:
            seqs = min(SEQ_GRID[index[0]], self.max_seqs)
            budget = min(BUDGET_GRID[index[1]], self.max_budget)
            limits = self._limits[index] = Limits(int(seqs), int(budget))
        return limits

    def apply(self, action: np.ndarray) -> Limits:
        """The limits for `action`; in ``step`` mode relative to the previous ones."""
        array = np.asarray(action)
        a = array.reshape(-1).tolist()  # plain floats: a decision is hot
        try:
            finite = array.shape == (2,) and math.isfinite(a[0]) and math.isfinite(a[1])
        except TypeError:  # complex, str or object entries
            finite = False
        if not finite:
            raise ValueError(f"action must be 2 finite entries, got {action!r}")
        i, j = int(a[0]), int(a[1])
        n, m = self.nvec
        if i != a[0] or j != a[1] or not (0 <= i < n and 0 <= j < m):
            raise ValueError(
                f"action {a} is outside the action space, MultiDiscrete([{n}, {m}]) (whole "
                "numbers from 0): an agent meant for another space?"
            )
        if self.mode == "step":
            i, j = self.index[0] + i - 1, self.index[1] + j - 1
        i = min(self.top[0], max(0, i))  # grid points past the engine's caps act as the
        j = min(self.top[1], max(0, j))  # caps (and a step can not leave the grid)
        self.index = (i, j)
        return self.limits_at(self.index)

    def action_for(self, limits: Limits) -> np.ndarray:
        """The action that moves towards `limits` (a teacher's label): the nearest grid
        points in ``grid`` mode, one step in their direction in ``step`` mode."""
        seqs, budget = limits.max_num_seqs, limits.max_num_batched_tokens or self.max_budget
        target = (  # a limit at an engine's cap is the grid point acting as it (`reset`)
            self.top[0] if seqs == self.max_seqs else nearest(SEQ_GRID, seqs),
            self.top[1] if budget == self.max_budget else nearest(BUDGET_GRID, budget),
        )
        if self.mode == "grid":
            return np.array(target, np.int64)
        return np.array([int(np.sign(t - c)) + 1 for t, c in zip(target, self.index, strict=True)])
