"""Prometheus metrics of the controller's decisions, served beside vLLM's ``vllm:*``.

With ``PROMETHEUS_MULTIPROC_DIR`` set (``batchpilot serve`` sets it), the values written in
vLLM's engine-core process reach the API server's ``/metrics``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import ClassVar

from prometheus_client import Counter, Gauge, Histogram

logger = logging.getLogger("batchpilot.serving")

_LIMIT = Gauge(
    "batchpilot:max_num_seqs",
    "Batch-size limit (max running requests) in force for the next step: the controller's, "
    "or the static one after a fallback.",
    ["controller"],
    multiprocess_mode="mostrecent",
)
_BUDGET = Gauge(
    "batchpilot:max_num_batched_tokens",
    "Per-step token budget in force for the next step: the controller's, or the static one "
    "after a fallback.",
    ["controller"],
    multiprocess_mode="mostrecent",
)
_DECISION = Histogram(
    "batchpilot:decision_time_seconds",
    "Time the controller took to decide one step's limits.",
    ["controller"],
    buckets=(1e-6, 5e-6, 1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 5e-3, 1e-2),
)
_LATE = Counter(
    "batchpilot:late_decisions",
    "Decisions not back by their deadline (the static limits held the engine until they were).",
    ["controller"],
)
_FALLBACKS = Counter(
    "batchpilot:controller_fallbacks",
    "Times the controller failed and static batching took over.",
    ["controller"],
)


class DecisionMetrics:
    """The metrics' children for one controller name (one per name per process)."""

    _cache: ClassVar[dict[str, DecisionMetrics]] = {}
    stopped: ClassVar[str | None] = None
    """Why no metric is written any more: opening or writing one raised (in multiprocess mode
    each is a file under ``PROMETHEUS_MULTIPROC_DIR``, which may be gone), logged once."""

    def __init__(self, name: str) -> None:
        self.decisions = 0
        """Decisions recorded in this process (the histogram's count, readable here)."""
        self.write(lambda: self._children(name))

    def _children(self, name: str) -> None:
        """The metrics' children for `name` (in multiprocess mode, files opened)."""
        self.limit = _LIMIT.labels(name)
        self.budget = _BUDGET.labels(name)
        self.decision = _DECISION.labels(name)
        self.fallbacks = _FALLBACKS.labels(name)
        self.late = _LATE.labels(name)

    @classmethod
    def get(cls, name: str) -> DecisionMetrics:
        if name not in cls._cache:
            cls._cache[name] = cls(name)
        return cls._cache[name]

    @classmethod
    def write(cls, *writes: Callable[[], object]) -> None:
        """Each of `writes`, unless metrics have `stopped`; a failure stops them (the engine
        serves on without)."""
        if cls.stopped is not None:
            return
        try:
            for write in writes:
                write()
        except Exception as exc:
            cls.stopped = f"{type(exc).__name__}: {exc}"
            logger.error(
                "batchpilot metrics stopped: opening or writing one failed (%s)", cls.stopped
            )

    def record(self, max_num_seqs: int, max_num_batched_tokens: int, seconds: float) -> None:
        """A decision that took `seconds` set these limits."""
        self.decisions += 1
        self.write(
            lambda: self.limit.set(max_num_seqs),
            lambda: self.budget.set(max_num_batched_tokens),
            lambda: self.decision.observe(seconds),
        )

    def fell_back(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """The controller failed; the static limits now in force are these."""
        self.held(max_num_seqs, max_num_batched_tokens)
        self.write(self.fallbacks.inc)

    def held(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        """A decision is late; the static limits hold the engine meanwhile."""
        self.write(
            lambda: self.limit.set(max_num_seqs), lambda: self.budget.set(max_num_batched_tokens)
        )

    def was_late(self) -> None:
        """A decision missed its deadline."""
        self.write(self.late.inc)
