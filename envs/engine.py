"""The engine interface shared by the simulator and the real vLLM engine."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from batchpilot.envs.metrics import SLO, RequestRecord, RunMetrics
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workload import Workload


@dataclass
class RunResult:
    """What a finished (or stopped) run leaves behind: its request metrics accumulated as
    it went (`RunMetrics`, bounded memory) and, if the engine was asked to keep them, every
    finished request's record."""

    stats: RunMetrics
    duration_s: float
    iterations: int
    mean_kv_usage: float
    slo: SLO
    unfinished: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    """Empty unless the engine keeps records (``keep_records``: tests, short runs)."""

    def metrics(self) -> dict[str, float]:
        """Aggregate metrics (``vllm bench serve`` names) plus engine counters."""
        out = self.stats.metrics(self.duration_s)
        out |= {
            "mean_kv_usage": self.mean_kv_usage,
            "engine_iterations": self.iterations,
            "unfinished": self.unfinished,
        }
        return out


class Engine(Protocol):
    """An engine driven one control interval at a time."""

    block_size: int
    num_total_blocks: int
    max_model_len: int
    max_num_seqs: int
    """Largest `Limits.max_num_seqs` the engine accepts (its creation-time cap)."""
    max_num_batched_tokens: int
    slo: SLO
    """The run's goodput SLO: what the engine scores requests on, and the TTFT and TPOT
    targets a controller reads (`alg2`'s D_SLA, a learned policy's observation)."""

    def reset(self, workload: Workload, limits: Limits) -> Telemetry:
        """Load a workload (arrival times relative to now) and return the first telemetry."""
        ...

    def set_limits(self, limits: Limits) -> None:
        """Limits for the next iterations (clamped to the engine's caps)."""
        ...

    def advance(self, max_iterations: int | None = None, until_s: float | None = None) -> Telemetry:
        """Run iterations until either bound is reached or the workload is done."""
        ...

    @property
    def done(self) -> bool:
        """Every request of the workload has finished."""
        ...

    def result(self) -> RunResult:
        """Per-request records and run totals so far."""
        ...
