"""The one controller interface: telemetry in, limits out."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from batchpilot.envs.engine import Engine
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
        if value <= 0:
            raise ValueError(f"control interval {spec!r} must be > 0")
        if unit == "it":
            if value != int(value):
                raise ValueError(f"control interval {spec!r}: iterations must be whole")
            return cls(iterations=int(value))
        return cls(iterations=None, seconds=value / 1e3 if unit == "ms" else value)

    def __str__(self) -> str:
        if self.iterations is not None:
            return f"{self.iterations}it"
        return f"{self.seconds * 1e3:g}ms"
