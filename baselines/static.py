"""Static batching: vLLM's default behaviour with a fixed ``max_num_seqs``."""

from __future__ import annotations

import logging

from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import Limits, Telemetry

logger = logging.getLogger("batchpilot.static")
_WARNED: set[tuple[str, int, int]] = set()


class StaticController:
    """Always the same limit (and optionally a fixed token budget)."""

    def __init__(self, max_num_seqs: int = 256, max_num_batched_tokens: int | None = None) -> None:
        self.limits = Limits(max_num_seqs, max_num_batched_tokens)
        self.name = f"static:{max_num_seqs}" + (
            f":{max_num_batched_tokens}" if max_num_batched_tokens else ""
        )

    def reset(self, engine: Engine) -> None:
        """Warn (once per process and engine caps) of a limit above the engine's cap, which
        the engine holds instead; a static limit has no state to reset."""
        caps = (engine.max_num_seqs, engine.max_num_batched_tokens)
        asked = (self.limits.max_num_seqs, self.limits.max_num_batched_tokens or 0)
        knobs = ("max_num_seqs", "max_num_batched_tokens")
        over = [
            f"{knob} {want:,} is over the engine's cap of {cap:,}"
            for knob, want, cap in zip(knobs, asked, caps, strict=True)
            if want > cap
        ]
        if over and (self.name, *caps) not in _WARNED:
            _WARNED.add((self.name, *caps))
            logger.warning("%s: %s; it runs at the cap", self.name, "; ".join(over))

    def decide(self, telemetry: Telemetry) -> Limits:
        return self.limits
