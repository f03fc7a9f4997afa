"""Arrival processes: when requests reach the engine.

Specs (as on the CLI): ``all-at-once`` (every request at t=0, the paper's Table I),
``poisson:RATE`` (req/s), ``gamma:RATE:CV`` (bursty when CV > 1), ``replay`` or
``replay:SCALE`` (the trace's own timestamps, SCALE times the rate), and two Poisson
processes whose rate shifts within a run: ``steps:R0@0,R1@T1,...`` (rate R0 req/s from
t=0, R1 from T1 seconds, ...) and ``ramp:R0:R1[:SECONDS]`` (linear from R0 to R1 over
SECONDS, by default over the whole run's expected span, then R1).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np

from batchpilot.envs.plain_numbers import plain_float
from batchpilot.envs.traces import MAX_SPAN_S

CV_RANGE = (0.01, 100.0)
"""Gamma arrivals' coefficients of variation that can be drawn (gap shape 1/CV^2)."""
RATE_RANGE = (1e-6, 1e6)
"""Arrival rates (req/s) and replay scales a process may have: past any deployment either
way (a request in 12 days; a million a second), and no gap, span or ramp under- or
overflows a float."""
MIN_RAMP_S = 1e-3
"""The shortest ramp a spec may give (s): a shorter one is a step, and its slope overflows."""


class ArrivalSpecError(ValueError):
    """An arrival spec that cannot be parsed or does not fit the trace."""


ARRIVAL_KINDS = ("all-at-once", "poisson", "gamma", "steps", "ramp", "replay")
"""The arrival processes' names (`Arrival.kind`), as ``SOURCE@ARRIVAL`` is split
(`batchpilot.envs.workloads.split_arrival`)."""
DEFAULT_ARRIVAL = "replay"
"""Where a workload names no arrival process: a trace's own times (a length table's: the
fitted process, `batchpilot.envs.workloads.make_workload`)."""


@dataclass(frozen=True)
class Arrival:
    """A parsed arrival process."""

    kind: str  # one of ARRIVAL_KINDS
    rate: float = 0.0
    cv: float = 1.0
    scale: float = 1.0
    steps: tuple[tuple[float, float], ...] = ()
    """steps: (start s, rate) pairs, the first starting at 0."""
    rate_end: float = 0.0
    """ramp: the final rate (`rate` is the first)."""
    ramp_s: float | None = None
    """ramp: its duration (None: the run's expected span)."""

    def __post_init__(self) -> None:
        if self.kind == "gamma" and not CV_RANGE[0] <= self.cv <= CV_RANGE[1]:
            raise ArrivalSpecError(
                f"gamma arrivals: CV must be in [{CV_RANGE[0]:g}, {CV_RANGE[1]:g}] "
                f"(1: Poisson; measured traces are bursty at 2-5), got {self.cv:g}"
            )
        rates = {
            "poisson": (self.rate,),
            "gamma": (self.rate,),
            "ramp": (self.rate, self.rate_end),
            "steps": tuple(r for _, r in self.steps),
            "replay": (self.scale,),
        }.get(self.kind, ())
        lo, hi = RATE_RANGE
        for rate in rates:
            if not lo <= rate <= hi:
                what = "scale" if self.kind == "replay" else "rate (req/s)"
                raise ArrivalSpecError(
                    f"{self.kind} arrivals: {what} must be in [{lo:g}, {hi:g}], got {rate:.6g}"
                )
        if self.ramp_s is not None and self.ramp_s < MIN_RAMP_S:
            raise ArrivalSpecError(
                f"ramp arrivals: a ramp over {self.ramp_s:.3g} s is shorter than {MIN_RAMP_S:g} s"
            )
        times = [t for t, _ in self.steps] + ([self.ramp_s] if self.ramp_s is not None else [])
        if any(t > MAX_SPAN_S for t in times):
            raise ArrivalSpecError(
                f"{self.kind} arrivals: a time of {max(times):.3g} s is past {MAX_SPAN_S:.0e} s "
                "(3 years)"
            )

    @classmethod
    def parse(cls, spec: str) -> Arrival:
        """Parse a spec string such as ``poisson:4`` or ``gamma:2:3``."""
        name, *args = spec.strip().split(":")

        def number(text: str, what: str) -> float:
            try:
                value = plain_float(text)
            except ValueError:
                raise ArrivalSpecError(
                    f"arrival {spec!r}: {what} {text!r} is not a number"
                ) from None
            if not np.isfinite(value) or value <= 0:
                raise ArrivalSpecError(f"arrival {spec!r}: {what} must be > 0, got {text}")
            return value

        expected = {"all-at-once": 0, "poisson": 1, "gamma": 2, "steps": 1}
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
        if name == "steps":
            return cls("steps", steps=_parse_steps(spec, args[0], number))
        if name == "ramp":
            if len(args) not in (2, 3):
                raise ArrivalSpecError(f"arrival {spec!r}: use ramp:R0:R1 or ramp:R0:R1:SECONDS")
            return cls(
                "ramp",
                rate=number(args[0], "rate"),
                rate_end=number(args[1], "rate"),
                ramp_s=number(args[2], "duration") if len(args) == 3 else None,
            )
        if name == "replay":
            if len(args) > 1:
                raise ArrivalSpecError(f"arrival {spec!r}: replay takes at most one SCALE")
            return cls("replay", scale=number(args[0], "scale") if args else 1.0)
        raise ArrivalSpecError(
            f"arrival {spec!r}: unknown process {name!r}; use all-at-once, poisson:RATE, "
            "gamma:RATE:CV, steps:R0@0,R1@T1,..., ramp:R0:R1[:SECONDS] or replay[:SCALE]"
        )

    def scaled(self, factor: float) -> Arrival:
        """The same process with every rate multiplied by `factor`."""
        return replace(
            self,
            rate=self.rate * factor,
            rate_end=self.rate_end * factor,
            scale=self.scale * factor,
            steps=tuple((t, r * factor) for t, r in self.steps),
        )

    def times(
        self, n: int, rng: np.random.Generator, trace_times: np.ndarray | None = None
    ) -> np.ndarray:
        """`n` arrival times in seconds, starting at 0 and non-decreasing; an
        `ArrivalSpecError` if they span more than `MAX_SPAN_S` (a rate near 0)."""
        times = self._times(n, rng, trace_times)
        if n and not (np.isfinite(times).all() and times[-1] <= MAX_SPAN_S):
            raise ArrivalSpecError(
                f"{self.kind} arrivals: {n} requests arrive over {times[-1]:.3g} s, more than "
                f"{MAX_SPAN_S:.0e} s (3 years); is a rate (or a replay's scale) near 0?"
            )
        return times

    def _times(
        self, n: int, rng: np.random.Generator, trace_times: np.ndarray | None
    ) -> np.ndarray:
        if self.kind == "all-at-once":
            return np.zeros(n)
        if self.kind == "replay":
            if trace_times is None:
                raise ArrivalSpecError(
                    "arrival 'replay' needs a trace with timestamps (Azure, BurstGPT, Vidur, "
                    "Mooncake, Bailian); this one has lengths only: use poisson:RATE or "
                    "gamma:RATE:CV"
                )
            t = np.asarray(trace_times[:n], dtype=np.float64)
            return (t - t[0]) / self.scale
        if self.kind in ("steps", "ramp"):  # time-rescaled unit-rate Poisson process
            work = np.concatenate(([0.0], np.cumsum(rng.exponential(1.0, size=max(0, n - 1)))))
            return self._invert_intensity(work[:n], n)
        if self.kind == "poisson":
            gaps = rng.exponential(1.0 / self.rate, size=n)
        else:  # gamma: shape k = 1/CV^2, mean gap 1/rate
            shape = 1.0 / self.cv**2
            gaps = rng.gamma(shape, 1.0 / (self.rate * shape), size=n)
        t = np.cumsum(gaps)
        return t - t[0]

    def _invert_intensity(self, work: np.ndarray, n: int) -> np.ndarray:
        """Times t with cumulative intensity Lambda(t) = `work` (steps and ramp)."""
        if self.kind == "steps":
            starts = np.array([t for t, _ in self.steps])
            rates = np.array([r for _, r in self.steps])
            cum = np.concatenate(([0.0], np.cumsum(np.diff(starts) * rates[:-1])))
            k = np.searchsorted(cum, work, side="right") - 1
            return starts[k] + (work - cum[k]) / rates[k]
        r0, r1 = self.rate, self.rate_end
        span = self.ramp_s if self.ramp_s is not None else 2.0 * n / (r0 + r1)
        a = (r1 - r0) / (2.0 * span)  # Lambda(t) = r0 t + a t^2 up to `span`
        total = (r0 + r1) / 2.0 * span
        root = np.sqrt(np.maximum(r0 * r0 + 4.0 * a * np.minimum(work, total), 0.0))  # r1^2 at most
        inside = 2.0 * work / (r0 + root)
        return np.where(work <= total, inside, span + (work - total) / r1)


def _parse_steps(
    spec: str, text: str, number: Callable[[str, str], float]
) -> tuple[tuple[float, float], ...]:
    """``R0@0,R1@T1,...`` -> ((0, R0), (T1, R1), ...), starts increasing from 0."""
    out: list[tuple[float, float]] = []
    for part in text.split(","):
        rate, sep, start = part.partition("@")
        if not sep:
            raise ArrivalSpecError(f"arrival {spec!r}: {part!r} is not RATE@START_S")
        t = 0.0 if _is_zero(start) else number(start, "start")
        if out and t <= out[-1][0]:
            raise ArrivalSpecError(f"arrival {spec!r}: step starts must increase, got {part!r}")
        out.append((t, number(rate, "rate")))
    if out[0][0] != 0.0:
        raise ArrivalSpecError(f"arrival {spec!r}: the first step must start at 0")
    return tuple(out)


def _is_zero(text: str) -> bool:
    """Whether `text` is a plain number equal to 0 ('0', '0.00', '0e3')."""
    try:
        return plain_float(text.strip()) == 0
    except ValueError:
        return False
