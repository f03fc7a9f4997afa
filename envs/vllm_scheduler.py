"""vLLM's V1 scheduler with per-step tracking and limits settable between steps.

`TrackingScheduler` is what `VLLMEngine` asks vLLM to load (``scheduler_cls``): it feeds a
`StepTracker` from vLLM's own scheduler state (arrivals, each ``schedule()`` output, each
``update_from_output()``) and lets the caller write the next step's limits. Serving's
`BatchpilotScheduler` adds a controller on top. Importing this module imports vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.vllm_tracker import StepTracker

T = TypeVar("T")


@dataclass(frozen=True)
class EngineView:
    """The engine facts a controller's ``reset(engine)`` reads."""

    block_size: int
    num_total_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int
    slo: SLO
    """The SLO the run is scored on (Algorithm 2 takes its TPOT target as D_SLA)."""


class TrackingScheduler(Scheduler):
    """vLLM's V1 scheduler that tracks every step and takes limits for the next one.

    `cap_seqs` / `cap_tokens` are the engine's configured ``max_num_seqs`` and
    ``max_num_batched_tokens``; limits are clamped to them. Without chunked prefill a
    prompt cannot be split, and vLLM stops admitting at a prompt over the step's budget, so
    the budget is never set below ``max_model_len`` there (vLLM's own rule for the cap).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cap_seqs = self.max_num_active_reqs
        self.cap_tokens = self.max_num_scheduled_tokens
        chunked = self.scheduler_config.enable_chunked_prefill
        self.min_tokens = 1 if chunked else min(self.max_model_len, self.cap_tokens)
        self.tracker = StepTracker()
        self.view = EngineView(
            self.block_size,
            self.kv_cache_manager.block_pool.num_gpu_blocks,
            self.max_model_len,
            self.cap_seqs,
            self.cap_tokens,
            self.tracker.slo,
        )

    def set_slo(self, slo: SLO) -> None:
        """Count goodput against `slo` from now on (and show it to controllers reset
        after this)."""
        self.tracker.slo = slo
        self.view = replace(self.view, slo=slo)

    def set_limits(self, limits: Limits) -> None:
        """Write limits for the next step, clamped to the engine's configured caps."""
        self.max_num_active_reqs = max(1, min(limits.max_num_seqs, self.cap_seqs))
        budget = limits.max_num_batched_tokens or self.cap_tokens
        self.max_num_scheduled_tokens = max(self.min_tokens, min(budget, self.cap_tokens))

    def telemetry(self) -> Telemetry:
        """The interval's telemetry under the limits now in force; starts a new interval."""
        return self.tracker.telemetry(self, self.max_num_active_reqs, self.max_num_scheduled_tokens)

    def track(self, hook: Callable[..., T], *args: Any) -> T | None:
        """`hook(*args)`: the tracker's side of a vLLM hook (the serving scheduler guards it,
        so that a fault there is a controller's, not the engine's)."""
        return hook(*args)

    # ------------------------------------------------------------------ vLLM hooks
    def add_request(self, request: Any) -> None:
        if request.request_id not in self.requests:
            self.track(
                self.tracker.on_arrival,
                request.request_id, request.num_prompt_tokens, request.max_tokens,
            )  # fmt: skip
        super().add_request(request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        ids = [request_ids] if isinstance(request_ids, str) else request_ids
        self.track(self._on_finish, ids, finished_status)
        return finished

    def _on_finish(self, request_ids: Any, finished_status: Any) -> None:
        self.tracker.on_abort(
            None if request_ids is None else list(request_ids),
            served=finished_status == RequestStatus.FINISHED_ABORTED,
        )

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        self.track(self._on_schedule, out)
        return out

    def _on_schedule(self, out: Any) -> None:
        self.tracker.on_schedule(out, self.requests, float(self.kv_cache_manager.usage))

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        before = self.track(self._outputs_before, scheduler_output)
        result = super().update_from_output(scheduler_output, model_runner_output)
        if before is not None:
            self.track(self._on_update, before)
        return result

    def _outputs_before(self, scheduler_output: Any) -> dict[str, tuple[Any, int]]:
        """The step's scheduled requests, with the output tokens each had before it."""
        return {
            rid: (self.requests[rid], self.requests[rid].num_output_tokens)
            for rid in scheduler_output.num_scheduled_tokens
            if rid in self.requests
        }

    def _on_update(self, before: dict[str, tuple[Any, int]]) -> None:
        new = {rid: r.num_output_tokens - n for rid, (r, n) in before.items()}
        finished = {rid for rid, (r, _) in before.items() if r.is_finished()}
        self.tracker.on_update(new, finished, float(self.kv_cache_manager.usage))
