"""batchpilot inside vLLM: a V1 scheduler that asks a controller for the limits of each step.

vLLM loads it with ``--scheduler-cls batchpilot.serving.scheduler.BatchpilotScheduler``
(or ``EngineArgs(scheduler_cls=...)``). The controller spec comes from the environment:

- ``BATCHPILOT_CONTROLLER``: a spec (``alg1+alg2``, ``alg2:sla_ms=50``, ``policy:PATH``,
  ...); unset: no controller, vLLM's own static limits (the scheduler still tracks).
- ``BATCHPILOT_SLO``: goodput SLOs for the telemetry (default ``ttft:2000,tpot:50``).
- ``BATCHPILOT_DECISION_BUDGET_MS``: a decision slower than this on 3 calls in a row counts
  as a failure (default 5).

Before every ``schedule()`` the controller sees the telemetry since its last decision and
its limits are written to ``max_num_active_reqs`` / ``max_num_scheduled_tokens``. If it
raises, returns something that is not valid limits, sees NaN telemetry, or is too slow,
the scheduler logs the reason once and falls back for good to static batching at the
engine's configured ``max_num_seqs`` and token budget: serving never stops for it.
Decisions are exported as Prometheus metrics ``batchpilot:*`` beside vLLM's own.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Any

from vllm.v1.core.sched.scheduler import Scheduler

from batchpilot.envs.controller import Controller
from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits
from batchpilot.serving.metrics import DecisionMetrics
from batchpilot.serving.tracker import StepTracker

logger = logging.getLogger("batchpilot.serving")

CONTROLLER_ENV = "BATCHPILOT_CONTROLLER"
SLO_ENV = "BATCHPILOT_SLO"
BUDGET_ENV = "BATCHPILOT_DECISION_BUDGET_MS"
SLOW_CALLS = 3
"""Consecutive over-budget decisions that count as a failure."""


@dataclass(frozen=True)
class EngineView:
    """The engine facts a controller's ``reset(engine)`` reads."""

    block_size: int
    num_total_blocks: int
    max_model_len: int
    max_num_seqs: int
    max_num_batched_tokens: int


class ControllerFailure(RuntimeError):
    """A controller decision that cannot be used."""


class BatchpilotScheduler(Scheduler):
    """vLLM's V1 scheduler with per-step tracking and an optional batchpilot controller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cap_seqs = self.max_num_active_reqs
        self.cap_tokens = self.max_num_scheduled_tokens
        self.tracker = StepTracker(SLO.parse(os.environ.get(SLO_ENV, "ttft:2000,tpot:50")))
        self.view = EngineView(
            self.block_size,
            self.kv_cache_manager.block_pool.num_gpu_blocks,
            self.max_model_len,
            self.cap_seqs,
            self.cap_tokens,
        )
        self.controller: Controller | None = None
        self.fallback_reason: str | None = None
        self.budget_s = float(os.environ.get(BUDGET_ENV, "5")) / 1e3
        self._slow = 0
        self.metrics: DecisionMetrics | None = None
        spec = os.environ.get(CONTROLLER_ENV)
        if spec:
            self.set_controller(spec)

    # ------------------------------------------------------------------ control
    def set_controller(self, controller: Controller | str) -> None:
        """Use `controller` (or a spec) from the next step on; a bad spec raises here."""
        if isinstance(controller, str):
            from batchpilot.baselines.specs import make_controller

            controller = make_controller(controller)
        if controller.name == "oracle":
            raise ValueError("the oracle reads the simulator's future; it cannot serve")
        controller.reset(self.view)
        self.controller = controller
        self.fallback_reason = None
        self.metrics = DecisionMetrics.get(controller.name)
        logger.info("batchpilot controller %s in charge of vLLM's batch limits", controller.name)

    def set_limits(self, limits: Limits) -> None:
        """Write limits for the next step, clamped to the engine's configured caps."""
        self.max_num_active_reqs = max(1, min(limits.max_num_seqs, self.cap_seqs))
        budget = limits.max_num_batched_tokens or self.cap_tokens
        self.max_num_scheduled_tokens = max(1, min(budget, self.cap_tokens))

    def _decide(self) -> None:
        try:  # any fault from here to the limits, the telemetry included: fall back
            telemetry = self.tracker.telemetry(
                self, self.max_num_active_reqs, self.max_num_scheduled_tokens
            ).validate()
            start = time.perf_counter()
            limits = self.controller.decide(telemetry)  # type: ignore[union-attr]
            elapsed = time.perf_counter() - start
            check_limits(limits)
            self._slow = self._slow + 1 if elapsed > self.budget_s else 0
            if self._slow >= SLOW_CALLS:
                raise ControllerFailure(
                    f"{SLOW_CALLS} decisions in a row over the {self.budget_s * 1e3:g} ms budget "
                    f"(last {elapsed * 1e3:.2f} ms)"
                )
        except Exception as exc:  # keep serving
            self._fall_back(f"{type(exc).__name__}: {exc}")
            return
        self.set_limits(limits)
        if self.metrics is not None:
            self.metrics.record(self.max_num_active_reqs, self.max_num_scheduled_tokens, elapsed)

    def _fall_back(self, reason: str) -> None:
        name = self.controller.name if self.controller else "?"
        logger.error(
            "batchpilot controller %s failed (%s); falling back to static max_num_seqs=%d",
            name,
            reason,
            self.cap_seqs,
        )
        self.fallback_reason = reason
        self.controller = None
        self.set_limits(Limits(self.cap_seqs, self.cap_tokens))
        if self.metrics is not None:
            self.metrics.fell_back()

    # ------------------------------------------------------------------ vLLM hooks
    def add_request(self, request: Any) -> None:
        if request.request_id not in self.requests:
            self.tracker.on_arrival(request.request_id, request.num_prompt_tokens)
        super().add_request(request)

    def finish_requests(self, request_ids: Any, finished_status: Any) -> Any:
        finished = super().finish_requests(request_ids, finished_status)
        if isinstance(request_ids, str):
            request_ids = [request_ids]
        self.tracker.on_abort(None if request_ids is None else list(request_ids))
        return finished

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.controller is not None:
            self._decide()
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


def check_limits(limits: Any) -> None:
    """Raise `ControllerFailure` unless `limits` are `Limits` with integer values >= 1."""
    if not isinstance(limits, Limits):
        raise ControllerFailure(f"returned {type(limits).__name__}, not Limits")
    for name in ("max_num_seqs", "max_num_batched_tokens"):
        v = getattr(limits, name)
        if v is None and name == "max_num_batched_tokens":
            continue
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ControllerFailure(f"returned {name}={v!r}")
