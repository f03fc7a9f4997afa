"""Per-request latency records and streaming aggregate metrics named as in ``vllm bench
serve`` (``output_goodput``, good requests' output tokens per second, and ``slo_attainment``,
the share of finished requests meeting the SLO, are batchpilot's own), in memory bounded by
the requests in flight (`RunMetrics`, `LatencySketch`)."""

from __future__ import annotations

import math
from array import array
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchpilot.envs.plain_numbers import plain_float
from batchpilot.envs.workload import scale_range

SLO_BOUNDS_MS = (1e-3, 1e9)
"""The least and most an SLO target may be, in ms (a microsecond to about 12 days): past
them a target is a slip of units or digits."""


def geometric_mean(values: Sequence[float] | np.ndarray, floor: float = 0.0) -> float:
    """exp(mean(log(values))), each value taken as at least `floor`: with the default 0, a run
    without goodput makes the mean 0 (a report: it is not averaged away); a small positive
    floor keeps such a run comparable (ranking checkpoints). 0 for no values."""
    if not len(values):
        return 0.0
    clipped = np.maximum(np.asarray(values, dtype=np.float64), floor)
    if clipped.min() <= 0:
        return 0.0
    return float(np.exp(np.mean(np.log(clipped))))


def key_values(spec: str, what: str) -> list[tuple[str, str]]:
    """``a:1,b:2`` (comma or space separated) as [(key, value), ...] in order: an empty item
    between commas or a key given twice is a ValueError naming `what` and `spec`."""
    if "," in spec and any(not item.strip() for item in spec.split(",")):
        raise ValueError(f"{what} {spec!r}: an empty item between commas")
    items = [part.partition(":")[::2] for part in spec.replace(",", " ").split()]
    keys = [key for key, _ in items]
    twice = next((key for key in keys if keys.count(key) > 1), None)
    if twice is not None:
        raise ValueError(f"{what} {spec!r}: {twice} given twice")
    return items


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

        Each value must be a plain number within `SLO_BOUNDS_MS` and each objective given at
        most once.
        """
        values: dict[str, float] = {}
        for key, value in key_values(spec, "SLO"):
            if key not in ("ttft", "tpot", "e2el"):
                raise ValueError(f"SLO {spec!r}: unknown objective {key!r}; use ttft, tpot, e2el")
            try:
                ms = plain_float(value)
            except ValueError:
                hint = f" (write {key}:MS, no space around ':')" if not value else ""
                raise ValueError(
                    f"SLO {spec!r}: {key} value {value!r} is not a number{hint}"
                ) from None
            if not SLO_BOUNDS_MS[0] <= ms <= SLO_BOUNDS_MS[1]:
                raise ValueError(
                    f"SLO {spec!r}: {key} value {value!r} must lie within "
                    f"[{SLO_BOUNDS_MS[0]:g}, {SLO_BOUNDS_MS[1]:g}] ms"
                )
            values[f"{key}_ms"] = ms
        return cls(**values)

    def met(self, ttft_s: float, tpot_s: float, e2el_s: float) -> bool:
        """Whether a request with these latencies meets every set objective (``vllm bench
        serve``'s test to the bit: the target in seconds >= the latency)."""
        return not (
            (self.ttft_ms is not None and ttft_s > self.ttft_ms / 1e3)
            or (self.tpot_ms is not None and tpot_s > self.tpot_ms / 1e3)
            or (self.e2el_ms is not None and e2el_s > self.e2el_ms / 1e3)
        )

    def scaled(self, ttft: float = 1.0, tpot: float = 1.0) -> SLO:
        """This SLO with its TTFT and TPOT targets times `ttft` and `tpot` (unset stay unset)."""
        return SLO(
            None if self.ttft_ms is None else self.ttft_ms * ttft,
            None if self.tpot_ms is None else self.tpot_ms * tpot,
            self.e2el_ms,
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


def slo_ranges(value: object, slo: SLO) -> dict[str, tuple[float, float]]:
    """`slo_scale` as objective -> (lo, hi) for ``ttft`` and ``tpot``, each a target `slo`
    sets; objectives left at (1, 1) are left out."""
    if not isinstance(value, dict):
        raise ValueError(f"slo_scale must map ttft and/or tpot to [lo, hi], got {value!r}")
    unknown = sorted(set(value) - {"ttft", "tpot"}, key=str)
    if unknown:
        raise ValueError(f"slo_scale: unknown objective {unknown[0]!r}; scale ttft or tpot")
    ranges = {}
    for key in ("ttft", "tpot"):  # one order, whatever the mapping's
        if key not in value:
            continue
        target = getattr(slo, f"{key}_ms")
        if target is None:
            raise ValueError(f"slo_scale scales {key}, which the SLO {slo} does not set")
        ranges[key] = scale_range(value[key], f"slo_scale {key}")
        if not math.isfinite(target * (hi := ranges[key][1])):
            raise ValueError(f"slo_scale {key}: {target:g} ms times {hi:g} is not finite")
    return {k: r for k, r in ranges.items() if r != (1.0, 1.0)}


def goodput_slo(slo: SLO, what: str) -> SLO:
    """`slo`, refused if it names no objective (goodput needs one); `what` names it in that
    error."""
    if slo == SLO():
        raise ValueError(f"{what} names no objective; give at least one, e.g. {DEFAULT_SLO}")
    return slo


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


class LatencySketch:
    """Streaming quantiles of latencies, in bounded memory.

    Values are kept exactly, as (value, count) entries (one per value added, or per value
    of a counted batch: equal values are not merged), until there are over `EXACT_LIMIT`
    entries, then folded into log-spaced buckets (DDSketch): every
    percentile is then within `ALPHA` (0.5%) relative error of the exact one, and memory
    stays `NUM_BUCKETS` counts however long the run. Count, mean and standard deviation
    are exact either way. Values <= `TINY` s count as 0.
    """

    ALPHA = 0.005
    GAMMA = (1 + ALPHA) / (1 - ALPHA)
    TINY = 1e-9
    HUGE = 1e9
    EXACT_LIMIT = 8192
    _LOG_GAMMA = math.log(GAMMA)
    _OFFSET = math.ceil(math.log(TINY) / _LOG_GAMMA)
    NUM_BUCKETS = math.ceil(math.log(HUGE) / _LOG_GAMMA) - _OFFSET + 2
    """Bucket 0 holds values <= TINY; bucket i > 0 holds (GAMMA^(i-1+offset), GAMMA^(i+offset)]."""

    __slots__ = ("_buckets", "_counts", "_m2", "_mean", "_n", "_pending", "_values")

    def __init__(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._m2 = 0.0
        self._pending = array("d")
        """Single values not yet folded in (a cheap append per token)."""
        self._values = np.zeros(0)
        self._counts = np.zeros(0, np.int64)
        self._buckets: np.ndarray | None = None

    def add(self, value: float) -> None:
        self._pending.append(value)
        if len(self._pending) >= 4096:
            self._flush()

    @property
    def buffer(self) -> array:
        """Where a hot loop may append single values (as fast as a plain array); call
        `settle()` after each batch of appends to keep the buffer bounded."""
        return self._pending

    def settle(self) -> None:
        """Fold buffered values in once there are a few thousand."""
        if len(self._pending) >= 4096:
            self._flush()

    def add_many(
        self, values: np.ndarray | list[float], counts: np.ndarray | list[int] | None = None
    ) -> None:
        """Add `values`, each `counts` times (once without `counts`)."""
        values = np.asarray(values, dtype=np.float64)
        counts = np.ones(len(values), np.int64) if counts is None else np.asarray(counts, np.int64)
        keep = counts > 0
        values, counts = values[keep], counts[keep]
        if not len(values):
            return
        total = int(counts.sum())
        mean = float(np.dot(values, counts)) / total
        m2 = float(np.dot((values - mean) ** 2, counts))
        delta = mean - self._mean
        n = self._n + total
        self._mean += delta * total / n
        self._m2 += m2 + delta * delta * self._n * total / n
        self._n = n
        if self._buckets is None:
            self._values = np.concatenate([self._values, values])
            self._counts = np.concatenate([self._counts, counts])
            if len(self._values) > self.EXACT_LIMIT:
                self._to_buckets()
        else:
            self._buckets += np.bincount(self._index(values), counts, self.NUM_BUCKETS).astype(
                np.int64
            )

    def _flush(self) -> None:
        if self._pending:
            pending, self._pending = self._pending, array("d")
            self.add_many(np.frombuffer(pending, dtype=np.float64))

    def _index(self, values: np.ndarray) -> np.ndarray:
        # np.minimum/np.maximum: np.clip's result at a fraction of its per-call cost
        safe = np.minimum(np.maximum(values, self.TINY), self.HUGE)
        idx = np.ceil(np.log(safe) / self._LOG_GAMMA).astype(np.int64) - self._OFFSET + 1
        idx = np.minimum(np.maximum(idx, 1), self.NUM_BUCKETS - 1)
        return np.where(values <= self.TINY, 0, idx)

    def _to_buckets(self) -> None:
        self._buckets = np.bincount(
            self._index(self._values), self._counts, self.NUM_BUCKETS
        ).astype(np.int64)
        self._values, self._counts = np.zeros(0), np.zeros(0, np.int64)

    @property
    def n(self) -> int:
        """Values added."""
        self._flush()
        return self._n

    @property
    def mean(self) -> float:
        self._flush()
        return self._mean

    @property
    def exact(self) -> bool:
        """Whether percentiles are still exact (at most `EXACT_LIMIT` entries so far)."""
        return self._buckets is None

    def std(self) -> float:
        """Population standard deviation (numpy's default)."""
        self._flush()
        return math.sqrt(max(self._m2, 0.0) / self._n) if self._n else 0.0

    def _order_statistics(self, ranks: np.ndarray) -> np.ndarray:
        """The values at 0-based `ranks` of the sorted data (bucket representatives once
        bucketed)."""
        if self._buckets is None:
            order = np.argsort(self._values, kind="stable")
            values, cum = self._values[order], np.cumsum(self._counts[order])
        else:
            nonzero = np.flatnonzero(self._buckets)
            cum = np.cumsum(self._buckets[nonzero])
            upper = self.GAMMA ** (nonzero - 1 + self._OFFSET)
            values = np.where(nonzero == 0, 0.0, 2.0 * upper / (self.GAMMA + 1.0))
        return values[np.searchsorted(cum, ranks, side="right")]

    def percentiles(self, qs: tuple[float, ...] | list[float]) -> list[float]:
        """Percentiles `qs` (0-100) as ``np.percentile``'s default (linear) method gives
        them (exact while `exact`, else within ALPHA); zeros when empty."""
        n = self.n
        if not n:
            return [0.0] * len(qs)
        h = (n - 1) * np.asarray(qs, dtype=np.float64) / 100.0
        lo = np.floor(h)
        a = self._order_statistics(lo.astype(np.int64))
        b = self._order_statistics(np.minimum(lo + 1, n - 1).astype(np.int64))
        return (a + (b - a) * (h - lo)).tolist()

    def copy(self) -> LatencySketch:
        other = LatencySketch.__new__(LatencySketch)
        other._n, other._mean, other._m2 = self._n, self._mean, self._m2
        other._pending = array("d", self._pending)
        other._values, other._counts = self._values, self._counts  # replaced, never mutated
        other._buckets = None if self._buckets is None else self._buckets.copy()
        return other

    def ms_stats(self, prefix: str, percentiles: tuple[int, ...]) -> dict[str, float]:
        """``mean_/median_/std_/p<N>_<prefix>_ms`` as ``vllm bench serve`` names them."""
        median, *ps = self.percentiles([50, *percentiles])
        out = {
            f"mean_{prefix}_ms": self.mean * 1e3 if self.n else 0.0,
            f"median_{prefix}_ms": median * 1e3,
            f"std_{prefix}_ms": self.std() * 1e3,
        }
        out |= {f"p{p}_{prefix}_ms": v * 1e3 for p, v in zip(percentiles, ps, strict=True)}
        return out

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LatencySketch):
            return NotImplemented
        if self.n != other.n or self.exact != other.exact:
            return False
        if self.exact:
            mine, theirs = np.argsort(self._values), np.argsort(other._values)
            return np.array_equal(self._values[mine], other._values[theirs]) and np.array_equal(
                self._counts[mine], other._counts[theirs]
            )
        return np.array_equal(self._buckets, other._buckets)

    __hash__ = None  # type: ignore[assignment]


class RunMetrics:
    """A run's request metrics, accumulated as requests finish (memory independent of the
    run's length): totals, goodput, and `LatencySketch`es of TTFT, TPOT, E2EL and every
    inter-token latency (fed by the engine through `itl`). `copy()` is cheap (for
    `SimEngine.fork`)."""

    COUNTERS = (
        "completed",
        "total_input_tokens",
        "total_output_tokens",
        "good_requests",
        "good_output_tokens",
        "num_preemptions",
        "recomputed_tokens",
    )

    def __init__(self) -> None:
        self.counts = dict.fromkeys(self.COUNTERS, 0)
        self.ttft, self.tpot, self.e2el, self.itl = (LatencySketch() for _ in range(4))

    def add_request(self, r: RequestRecord, good: bool) -> None:
        """Account for one finished request (`good`: it met the run's SLO)."""
        c = self.counts
        c["completed"] += 1
        c["total_input_tokens"] += r.prompt_tokens
        c["total_output_tokens"] += r.output_tokens
        c["num_preemptions"] += r.num_preemptions
        c["recomputed_tokens"] += r.recomputed_tokens
        ttft, tpot, e2el = r.ttft_s, r.tpot_s, r.e2el_s
        if good:
            c["good_requests"] += 1
            c["good_output_tokens"] += r.output_tokens
        self.ttft.add(ttft)
        self.e2el.add(e2el)
        if r.output_tokens > 1:
            self.tpot.add(tpot)

    def copy(self) -> RunMetrics:
        other = RunMetrics.__new__(RunMetrics)
        other.counts = dict(self.counts)
        other.ttft, other.tpot = self.ttft.copy(), self.tpot.copy()
        other.e2el, other.itl = self.e2el.copy(), self.itl.copy()
        return other

    def metrics(
        self, duration_s: float, percentiles: tuple[int, ...] = (50, 90, 99)
    ) -> dict[str, float]:
        """Aggregate metrics with ``vllm bench serve``'s names; `duration_s` is the run's
        length on the engine clock."""
        c = self.counts
        duration = max(duration_s, 1e-12)
        prompt, output, done = c["total_input_tokens"], c["total_output_tokens"], c["completed"]
        metrics: dict[str, float] = {
            "completed": done,
            "duration": duration_s,
            "total_input_tokens": prompt,
            "total_output_tokens": output,
            "request_throughput": done / duration,
            "request_goodput": c["good_requests"] / duration,
            "output_throughput": output / duration,
            "output_goodput": c["good_output_tokens"] / duration,
            "total_token_throughput": (prompt + output) / duration,
            "slo_attainment": c["good_requests"] / done if done else 0.0,
            "num_preemptions": c["num_preemptions"],
            "recomputed_tokens": c["recomputed_tokens"],
        }
        for name in ("ttft", "tpot", "itl", "e2el"):
            metrics |= getattr(self, name).ms_stats(name, percentiles)
        return metrics

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RunMetrics):
            return NotImplemented
        return self.counts == other.counts and all(
            getattr(self, k) == getattr(other, k) for k in ("ttft", "tpot", "e2el", "itl")
        )

    __hash__ = None  # type: ignore[assignment]
