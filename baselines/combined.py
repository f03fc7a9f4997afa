"""Several controllers at once: each limit is the minimum of theirs (b* = min(b_mem, b_SLA))."""

from __future__ import annotations

from collections.abc import Sequence

from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import Limits, Telemetry


class MinController:
    """The smallest `max_num_seqs` and the smallest token budget any part sets.

    Its ``control_interval`` is its parts' (a learned policy's: the interval it was trained
    at), so a combination with a policy decides at that interval wherever it runs; parts
    trained at different intervals are refused."""

    def __init__(self, parts: Sequence[Controller]) -> None:
        if len(parts) < 2:
            raise ValueError("a combination needs at least two controllers")
        self.parts = list(parts)
        self.name = "+".join(p.name for p in self.parts)
        intervals = {getattr(p, "control_interval", None) for p in self.parts} - {None}
        if len(intervals) > 1:
            raise ValueError(
                f"{self.name}: parts trained at different control intervals "
                f"({', '.join(sorted(map(str, intervals)))})"
            )
        self.control_interval: ControlInterval | None = intervals.pop() if intervals else None

    def reset(self, engine: Engine) -> None:
        for p in self.parts:
            p.reset(engine)

    def decide(self, telemetry: Telemetry) -> Limits:
        decisions = [p.decide(telemetry) for p in self.parts]
        budgets = [d.max_num_batched_tokens for d in decisions if d.max_num_batched_tokens]
        return Limits(min(d.max_num_seqs for d in decisions), min(budgets) if budgets else None)
