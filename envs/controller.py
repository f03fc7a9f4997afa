"""The one controller interface: telemetry in, limits out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from batchpilot.envs.engine import Engine
from batchpilot.envs.plain_numbers import is_number, is_whole
from batchpilot.envs.telemetry import Limits, Telemetry


@runtime_checkable
class Controller(Protocol):
    """Sets the engine's batching limits from its telemetry.

    `reset` is called once per run, before the first `decide`, with the engine the run
    uses (its caps: `max_num_seqs`, `num_total_blocks`, `block_size`, ...).
    """

    name: str

    def reset(self, engine: Engine) -> None: ...

    def decide(self, telemetry: Telemetry) -> Limits: ...


INTERVAL_RANGE_S = (1e-3, 3600.0)
"""The shortest and longest control interval in seconds: 1 ms (shorter only multiplies
controller calls over idle time; a step of vLLM takes longer) to an hour."""
MAX_INTERVAL_ITERS = 1_000_000
"""The most engine iterations between two decisions."""


def check_interval_s(seconds: object, what: str) -> float:
    """`seconds` as a float, if a number of seconds within `INTERVAL_RANGE_S`."""
    lo, hi = INTERVAL_RANGE_S
    if not is_number(seconds) or not lo <= seconds <= hi:
        raise ValueError(f"{what} must be a number of seconds in [{lo:g}, {hi:g}], got {seconds!r}")
    return float(seconds)


def check_interval_iters(iterations: object, what: str) -> int:
    """`iterations` as an int, if a whole number in [1, `MAX_INTERVAL_ITERS`]."""
    if not is_whole(iterations) or not 1 <= iterations <= MAX_INTERVAL_ITERS:
        raise ValueError(
            f"{what} must be a whole number in [1, {MAX_INTERVAL_ITERS:,}], got {iterations!r}"
        )
    return int(iterations)


@dataclass(frozen=True)
class ControlInterval:
    """How often the controller is consulted: every N engine iterations or every S seconds."""

    iterations: int | None = 1
    seconds: float | None = None

    @classmethod
    def parse(cls, spec: str) -> ControlInterval:
        """``1it``, ``8it``, ``50ms``, ``0.5s``."""
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*(it|ms|s)\s*", spec)
        if not m:
            raise ValueError(f"control interval {spec!r}: use e.g. 1it, 16it, 50ms or 1s")
        value, unit = float(m.group(1)), m.group(2)
        what = f"control interval {spec!r}"
        if unit == "it":
            iterations = int(value) if value.is_integer() else value
            return cls(iterations=check_interval_iters(iterations, what))
        seconds = check_interval_s(value / 1e3 if unit == "ms" else value, what)
        return cls(iterations=None, seconds=seconds)

    def __str__(self) -> str:
        """The spec `parse` reads back to this interval (milliseconds without an exponent, up to
        an hour, and to 12 significant digits)."""
        if self.iterations is not None:
            return f"{self.iterations}it"
        return f"{self.seconds * 1e3:.12g}ms"
