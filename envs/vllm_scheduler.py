"""vLLM's V1 scheduler with per-step tracking and limits settable between steps.

`TrackingScheduler` is what `VLLMEngine` asks vLLM to load (``scheduler_cls``): it feeds a
`StepTracker` from vLLM's own scheduler state (arrivals, each ``schedule()`` output, each
``update_from_output()``) and lets the caller write the next step's limits. Serving's
`BatchpilotScheduler` adds a controller on top. Importing this module imports vLLM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.request import RequestStatus

from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.vllm_tracker import StepTracker


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

    # ------------------------------------------------------------------ vLLM hooks
    def add_request(self, request: Any) -> None:
        if request.request_id not in self.requests:
            self.tracker.on_arrival(
                request.request_id, request.num_prompt_tokens, request.max_tokens
            )
        super().add_request(request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        self.tracker.on_abort(
            None if request_ids is None else list(request_ids),
            served=finished_status == RequestStatus.FINISHED_ABORTED,
        )
        return finished

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = super().schedule(*args, **kwargs)
        self.tracker.on_schedule(out, self.requests, float(self.kv_cache_manager.usage))
        return out

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        scheduled = {
            rid: self.requests[rid]
            for rid in scheduler_output.num_scheduled_tokens
            if rid in self.requests
        }
        before = {rid: r.num_output_tokens for rid, r in scheduled.items()}
        result = super().update_from_output(scheduler_output, model_runner_output)
        new = {rid: r.num_output_tokens - before[rid] for rid, r in scheduled.items()}
        finished = {rid for rid, r in scheduled.items() if r.is_finished()}
        self.tracker.on_update(new, finished, float(self.kv_cache_manager.usage))
        return result
