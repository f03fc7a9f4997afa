"""Static batching: vLLM's default behaviour with a fixed ``max_num_seqs``."""

from __future__ import annotations

from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import Limits, Telemetry


class StaticController:
    """Always the same limit (and optionally a fixed token budget)."""

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int | None = None) -> None:
        self.limits = Limits(max_num_seqs, max_num_batched_tokens)
        self.name = f"static:{max_num_seqs}" + (
            f":{max_num_batched_tokens}" if max_num_batched_tokens else ""
        )

    def reset(self, engine: Engine) -> None:
        """Nothing to reset: a static limit has no state."""

    def decide(self, telemetry: Telemetry) -> Limits:
        return self.limits
