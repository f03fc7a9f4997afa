"""Arrival processes: when requests reach the engine.

Specs (as on the CLI): ``all-at-once`` (every request at t=0, the paper's Table I),
``poisson:RATE`` (req/s), ``gamma:RATE:CV`` (bursty when CV > 1), ``replay`` or
``replay:SCALE`` (the trace's own timestamps, SCALE times the rate).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


class ArrivalSpecError(ValueError):
    """An arrival spec that cannot be parsed or does not fit the trace."""


@dataclass(frozen=True)
class Arrival:
    """A parsed arrival process."""

    kind: str  # "all-at-once" | "poisson" | "gamma" | "replay"
    rate: float = 0.0
    cv: float = 1.0
    scale: float = 1.0

    @classmethod
    def parse(cls, spec: str) -> Arrival:
        """Parse a spec string such as ``poisson:4`` or ``gamma:2:3``."""
        name, *args = spec.strip().split(":")

        def number(text: str, what: str) -> float:
            try:
                value = float(text)
            except ValueError:
                raise ArrivalSpecError(
                    f"arrival {spec!r}: {what} {text!r} is not a number"
                ) from None
            if not np.isfinite(value) or value <= 0:
                raise ArrivalSpecError(f"arrival {spec!r}: {what} must be > 0, got {text}")
            return value

        expected = {"all-at-once": 0, "poisson": 1, "gamma": 2}
        if name in expected and len(args) != expected[name]:
            raise ArrivalSpecError(
                f"arrival {spec!r}: {name} takes {expected[name]} argument(s), got {len(args)}"
            )
        if name == "all-at-once":
            return cls("all-at-once")
        if name == "poisson":
            return cls("poisson", rate=number(args[0], "rate"))
        if name == "gamma":
            return cls("gamma", rate=number(args[0], "rate"), cv=number(args[1], "CV"))
        if name == "replay":
            if len(args) > 1:
                raise ArrivalSpecError(f"arrival {spec!r}: replay takes at most one SCALE")
            return cls("replay", scale=number(args[0], "scale") if args else 1.0)
        raise ArrivalSpecError(
            f"arrival {spec!r}: unknown process {name!r}; use all-at-once, poisson:RATE, "
            "gamma:RATE:CV or replay[:SCALE]"
        )

    def times(
        self, n: int, rng: np.random.Generator, trace_times: np.ndarray | None = None
    ) -> np.ndarray:
        """`n` arrival times in seconds, starting at 0 and non-decreasing."""
        if self.kind == "all-at-once":
            return np.zeros(n)
        if self.kind == "replay":
            if trace_times is None:
                raise ArrivalSpecError(
                    "arrival 'replay' needs a trace with timestamps (Azure, Mooncake, "
                    "BurstGPT); this one has lengths only: use poisson:RATE or gamma:RATE:CV"
                )
            t = np.asarray(trace_times[:n], dtype=np.float64)
            return (t - t[0]) / self.scale
        if self.kind == "poisson":
            gaps = rng.exponential(1.0 / self.rate, size=n)
        else:  # gamma: shape k = 1/CV^2, mean gap 1/rate
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, 1.0 / (self.rate * shape), size=n)
        t = np.cumsum(gaps)
        return t - t[0]
