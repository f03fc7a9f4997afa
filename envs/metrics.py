"""Per-request latency records and aggregate metrics named as in ``vllm bench serve``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SLO:
    """Service-level objectives for goodput (``--goodput ttft:<ms> tpot:<ms> e2el:<ms>``).

    A request is good when it meets every objective that is set.
    """

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @classmethod
    def parse(cls, spec: str) -> SLO:
        """Parse ``ttft:2000,tpot:50`` (comma or space separated, values in ms).

        Each value must be a finite number > 0 and each objective given at most once.
        """
        values: dict[str, float] = {}
        for part in spec.replace(",", " ").split():
            key, _, value = part.partition(":")
            if key not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"SLO {spec!r}: unknown objective {key!r}; use ttft, tpot, e2el")
            if f"{key}_ms" in values:
                raise ValueError(f"SLO {spec!r}: {key} given twice")
            try:
                ms = float(value)
            except ValueError:
                raise ValueError(f"SLO {spec!r}: {key} value {value!r} is not a number") from None
            if not (math.isfinite(ms) and ms > 0):
                raise ValueError(
                    f"SLO {spec!r}: {key} value {value!r} must be a finite number > 0 (ms)"
                )
            values[f"{key}_ms"] = ms
        return cls(**values)

    def met(self, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        """Whether a request with these latencies meets every set objective."""
        return not (
            (self.ttft_ms is not None and ttft_s * 1e3 > self.ttft_ms)
            or (self.tpot_ms is not None and tpot_s * 1e3 > self.tpot_ms)
            or (self.e2el_ms is not None and e2el_s * 1e3 > self.e2el_ms)
        )

    def __str__(self) -> str:
        parts = [
            f"{k}:{v:g}"
            for k, v in (("ttft", self.ttft_ms), ("tpot", self.tpot_ms), ("e2el", self.e2el_ms))
            if v is not None
        ]
        return ",".join(parts) or "none"


DEFAULT_SLO = SLO(ttft_ms=2000.0, tpot_ms=50.0)
"""The one default goodput SLO (``ttft:2000,tpot:50``) of every command, environment and
server: a 2 s first token and the paper's 50 ms per output token. Algorithm 2 takes its
D_SLA from the run's TPOT target, so by default it aims at the same 50 ms."""


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """Latencies of one finished request (times in s on the engine clock)."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    first_token_s: float
    finish_s: float
    num_preemptions: int
    recomputed_tokens: int
    max_itl_s: float

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def e2el_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> float:
        """Mean time per output token after the first (0 for a one-token output)."""
        if self.output_tokens <= 1:
            return 0.0
        return (self.finish_s - self.first_token_s) / (self.output_tokens - 1)


def _ms_stats(prefix: str, values_s: np.ndarray, percentiles: tuple[int, ...]) -> dict:
    if len(values_s) == 0:
        values_s = np.zeros(1)
    ms = values_s * 1e3
    out = {
        f"mean_{prefix}_ms": float(ms.mean()),
        f"median_{prefix}_ms": float(np.median(ms)),
        f"std_{prefix}_ms": float(ms.std()),
    }
    for p in percentiles:
        out[f"p{p}_{prefix}_ms"] = float(np.percentile(ms, p))
    return out


def aggregate(
    records: list[RequestRecord],
    itl_s: np.ndarray,
    duration_s: float,
    slo: SLO,
    percentiles: tuple[int, ...] = (50, 90, 99),
) -> dict[str, float]:
    """Aggregate metrics with ``vllm bench serve``'s names.

    `itl_s` holds every inter-token latency of every request (all tokens after the first);
    `duration_s` is the run's length on the engine clock.
    """
    duration = max(duration_s, 1e-12)
    ttft = np.array([r.ttft_s for r in records])
    tpot = np.array([r.tpot_s for r in records if r.output_tokens > 1])
    e2el = np.array([r.e2el_s for r in records])
    output = sum(r.output_tokens for r in records)
    prompt = sum(r.prompt_tokens for r in records)
    good = [r for r in records if slo.met(r.ttft_s, r.tpot_s, r.e2el_s)]
    metrics: dict[str, float] = {
        "completed": len(records),
        "duration": duration_s,
        "total_input_tokens": prompt,
        "total_output_tokens": output,
        "request_throughput": len(records) / duration,
        "request_goodput": len(good) / duration,
        "output_throughput": output / duration,
        "output_goodput": sum(r.output_tokens for r in good) / duration,
        "total_token_throughput": (prompt + output) / duration,
        "slo_attainment": len(good) / len(records) if records else 0.0,
        "num_preemptions": sum(r.num_preemptions for r in records),
        "recomputed_tokens": sum(r.recomputed_tokens for r in records),
    }
    metrics |= _ms_stats("ttft", ttft, percentiles)
    metrics |= _ms_stats("tpot", tpot, percentiles)
    metrics |= _ms_stats("itl", np.asarray(itl_s, dtype=np.float64), percentiles)
    metrics |= _ms_stats("e2el", e2el, percentiles)
    return metrics
