"""batchpilot inside vLLM: a V1 scheduler that asks a controller for the limits of each step.

vLLM loads it with ``--scheduler-cls batchpilot.serving.scheduler.BatchpilotScheduler``
(or ``EngineArgs(scheduler_cls=...)``); the controller spec, SLOs and decision budget come
from the environment (`batchpilot.serving.config`).

Before a ``schedule()`` the controller, when due, sees the telemetry since its last decision
and its limits are written to ``max_num_active_reqs`` / ``max_num_scheduled_tokens``. A
controller with a ``control_interval`` (a learned policy: the interval its sidecar says it
was trained at), or a combination with such a part (``policy:PATH+alg1``: every part then
decides at it), is due once that many seconds or steps have passed since its last decision,
as in simulation (`batchpilot.envs.run.run`); any other, before every step. If it cannot
start (its ``reset`` refuses the engine or the SLO, or the SLO or budget setting is bad),
raises, returns something that is not valid limits, sees NaN telemetry, or is too slow (over
its budget on `SLOW_CALLS` decisions in a row), the scheduler logs the reason once and falls
back for good to static batching at the engine's configured ``max_num_seqs`` and token
budget: serving never stops for it.

Decisions run on one worker thread (`DecisionThread`: a round trip costs some tens of
microseconds, more when the host's cores are oversubscribed; the budget counts the
controller's own time on it), so that the engine waits for one at most its deadline
(``BATCHPILOT_DECISION_DEADLINE_MS``, default 10 budgets: 50 ms). A decision not back by
then counts as a slow one and leaves the engine on the static limits, with no new decision
started while it runs (``batchpilot:late_decisions`` counts them; the log names one every
`LATE_LOG_S` at most, with the count since); when it returns (its stale limits unused), the
controller is consulted again at once, and if it is still out after `STUCK_S` (30 s) the
controller has failed.
Decisions, and the limits in force after a fallback, are exported as Prometheus metrics
``batchpilot:*`` beside vLLM's own.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import suppress
from functools import partial
from typing import Any, TypeVar

from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.vllm_scheduler import TrackingScheduler
from batchpilot.serving.config import (
    CONTROLLER_ENV,
    DEFAULT_SLO,
    STUCK_S,
    engine_settings,
    serving_controller,
)
from batchpilot.serving.metrics import DecisionMetrics

logger = logging.getLogger("batchpilot.serving")
T = TypeVar("T")


def log_through_vllm() -> None:
    """Give batchpilot's loggers vLLM's handlers, once, where vLLM configured its own and
    nothing else would print them: vLLM configures only the ``vllm`` loggers, so inside its
    engine process (where the root logger has no handler) batchpilot's INFO lines, the
    controller taking charge with the caps among them, were dropped. They now go where vLLM's
    go (its format, its stream: ``VLLM_LOGGING_STREAM``, stdout by default), at its level
    (``VLLM_LOGGING_LEVEL``). Where vLLM configures no logging (``VLLM_CONFIGURE_LOGGING=0``),
    or the root logger prints (an application or a test holding the engine), nothing
    changes."""
    ours, theirs = logging.getLogger("batchpilot"), logging.getLogger("vllm")
    if ours.handlers or not theirs.handlers or logging.getLogger().handlers:
        return
    for handler in theirs.handlers:
        ours.addHandler(handler)
    ours.setLevel(theirs.level)


SLOW_CALLS = 3
"""Consecutive over-budget decisions that count as a failure."""
LATE_LOG_S = 60.0
"""Late decisions are logged once per this many seconds at most (a controller late on
every other decision is never 3 in a row, and would log two lines per decision for good)."""


MAX_REASON = 500
"""Characters of a failure's reason kept (logged, `fallback_reason`): a controller's
exception may carry megabytes."""


class ControllerFailure(RuntimeError):
    """A controller decision that cannot be used."""


def describe(exc: BaseException) -> str:
    """``Type: message`` of a controller's exception, cut to `MAX_REASON` characters; the
    type alone where the message itself raises (a controller's fault must not be the
    engine's)."""
    try:
        text = f"{type(exc).__name__}: {exc}"
    except Exception:
        text = f"{type(exc).__name__} (its message raised in turn)"
    return text if len(text) <= MAX_REASON else text[: MAX_REASON - 3] + "..."


Timed = Future[tuple[Limits, float]]
"""A decision and the seconds it took on the decision thread."""


class DecisionThread:
    """One daemon thread that makes decisions, one at a time, for a caller that waits a
    bounded time for each (`call`); `close` lets it end once its call in hand returns."""

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Callable[[], Limits], Timed] | None]
        self._calls = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="batchpilot-decide", daemon=True).start()

    def _serve(self) -> None:
        while (item := self._calls.get()) is not None:
            call, future = item
            try:
                start = time.perf_counter()
                future.set_result((call(), time.perf_counter() - start))
            except Exception as exc:  # the caller's to judge
                future.set_exception(exc)
            except BaseException as exc:  # SystemExit and the like: a fault of the controller's
                future.set_exception(ControllerFailure(f"raised {describe(exc)}"))

    def call(self, call: Callable[[], Limits], timeout_s: float) -> Timed:
        """`call` run on the thread, waited for up to `timeout_s`: done, unless it is late."""
        future: Timed = Future()
        self._calls.put((call, future))
        with suppress(TimeoutError):  # raised only while the call is out
            future.exception(timeout_s)
        return future

    def close(self) -> None:
        self._calls.put(None)


class BatchpilotScheduler(TrackingScheduler):
    """vLLM's V1 scheduler with per-step tracking and an optional batchpilot controller."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        log_through_vllm()
        super().__init__(*args, **kwargs)
        self.controller: Controller | None = None
        self.controller_name = ""
        """The controller's name, read once as it takes charge (for the log and metrics)."""
        self.fallback_reason: str | None = None
        self.tracking_fault: str | None = None
        """Why the step tracker stopped (a fault in its side of vLLM's hooks): with no
        telemetry no controller can take charge again."""
        _, self.budget_s, self.deadline_s = engine_settings({})  # the defaults, until read
        self._slow = 0
        self._thread: DecisionThread | None = None
        self.late: Timed | None = None
        """A decision past its deadline, not yet returned: static limits until it does."""
        self._late_since = 0.0  # time.monotonic() when `late` missed its deadline
        self._late_logged = False  # whether the log named `late`
        self._late_log_s = -LATE_LOG_S  # time.monotonic() when the log last named one
        self._late_unlogged = 0  # late decisions since then
        self.metrics: DecisionMetrics | None = None
        self.interval = ControlInterval()
        self._last: tuple[float, int] | None = None  # (engine s, step) of the last decision
        spec = os.environ.get(CONTROLLER_ENV)
        try:
            slo, self.budget_s, self.deadline_s = engine_settings(os.environ)
        except ValueError as exc:  # no controller can start on them; the engine serves on
            self.set_slo(SLO.parse(DEFAULT_SLO))
            if spec:
                self.metrics = DecisionMetrics.get(spec)
                self._fall_back(str(exc), spec)
            else:
                logger.error("batchpilot: %s (ignored: no controller)", exc)
            return
        self.set_slo(slo)
        if spec:
            self.start_controller(spec)

    # ------------------------------------------------------------------ control
    def set_controller(self, controller: Controller | str) -> None:
        """Use `controller` (or a spec) from the next step on; a bad spec raises here."""
        if self.tracking_fault is not None:
            raise ControllerFailure(f"the step tracker stopped ({self.tracking_fault})")
        controller = serving_controller(controller)
        name = str(controller.name)
        interval = getattr(controller, "control_interval", None) or ControlInterval()
        controller.reset(self.view)
        if self.late is not None and not self.late.done() and self._thread is not None:
            self._thread.close()  # busy with the last controller's decision: a fresh one
            self._thread = None
        self.late = None
        self._late_log_s, self._late_unlogged = -LATE_LOG_S, 0
        self.controller, self.controller_name = controller, name
        self.fallback_reason = None
        self._slow = 0
        self.interval = interval
        self._last = None
        self.metrics = DecisionMetrics.get(name)
        logger.info(
            "batchpilot controller %s in charge of vLLM's batch limits (every %s), up to the "
            "server's caps of %d requests and %d tokens a step (--max-num-seqs, "
            "--max-num-batched-tokens: it can only lower them; a fallback keeps them)",
            name,
            self.interval,
            self.cap_seqs,
            self.cap_tokens,
        )

    def start_controller(self, spec: str) -> None:
        """`set_controller` inside the engine: a controller that cannot start is a
        controller failure (logged; static limits), not an engine that cannot start."""
        try:
            self.set_controller(spec)
        except Exception as exc:  # keep serving
            self.metrics = DecisionMetrics.get(spec)
            self._fall_back(describe(exc), spec)

    def _due(self) -> bool:
        """Whether the controller's interval has passed since its last decision."""
        if self._last is None:
            return True
        seconds, step = self._last
        if self.interval.seconds is not None:
            return self.tracker.now() - seconds >= self.interval.seconds
        return self.tracker.iterations - step >= self.interval.iterations  # type: ignore[operator]

    def _decide(self) -> None:
        if self.late is not None:
            if not self.late.done():  # still out: the static limits stay, no second decision
                if time.monotonic() - self._late_since > STUCK_S:
                    self.late = None
                    self._fall_back(f"no decision returned in {STUCK_S:g} s")
                return
            late, self.late = self.late, None
            try:  # too late to apply, but a fault in it is the controller's as any other
                check_limits(late.result()[0])
            except Exception as exc:
                self._fall_back(f"its late decision: {describe(exc)}")
                return
            if self._late_logged:
                logger.warning(
                    "batchpilot controller %s: the late decision returned; back in charge",
                    self.controller_name,
                )
        try:  # any fault from here to the limits, the thread and telemetry included: fall back
            if self._thread is None:
                self._thread = DecisionThread()
            telemetry = self.telemetry().validate()
            decide = partial(self.controller.decide, telemetry)  # type: ignore[union-attr]
            decision = self._thread.call(decide, self.deadline_s)
            if late := not decision.done():
                self.late, elapsed = decision, self.deadline_s
                self._late_since = time.monotonic()
            else:
                limits, elapsed = decision.result()
            self._slow = self._slow + 1 if late or elapsed > self.budget_s else 0
            if self._slow >= SLOW_CALLS:
                raise ControllerFailure(
                    f"{SLOW_CALLS} decisions in a row over the {self.budget_s * 1e3:g} ms budget "
                    f"(last {elapsed * 1e3:.2f} ms{'+, not back' if late else ''})"
                )
            if late:
                self._wait()
                return
            check_limits(limits)
        except Exception as exc:  # keep serving
            self._fall_back(describe(exc))
            return
        self._last = (telemetry.time_s, telemetry.iteration)
        self.set_limits(limits)
        if self.metrics is not None:
            self.metrics.record(self.max_num_active_reqs, self.max_num_scheduled_tokens, elapsed)

    def _wait(self) -> None:
        """Static limits until the late decision returns; logged once per `LATE_LOG_S`."""
        now = time.monotonic()
        self._late_logged = now - self._late_log_s >= LATE_LOG_S
        if self._late_logged:
            logger.error(
                "batchpilot controller %s: no decision in its %g ms deadline; static "
                "max_num_seqs=%d until it returns%s",
                self.controller_name,
                self.deadline_s * 1e3,
                self.cap_seqs,
                f" ({self._late_unlogged} more late since the last logged)"
                if self._late_unlogged
                else "",
            )
            self._late_log_s, self._late_unlogged = now, 0
        else:
            self._late_unlogged += 1
        self.set_limits(Limits(self.cap_seqs, self.cap_tokens))
        if self.metrics is not None:
            self.metrics.held(self.max_num_active_reqs, self.max_num_scheduled_tokens)
            self.metrics.was_late()

    def _fall_back(self, reason: str, name: str | None = None) -> None:
        name = name or self.controller_name or "?"
        logger.error(
            "batchpilot controller %s failed (%s); falling back to static max_num_seqs=%d",
            name,
            reason,
            self.cap_seqs,
        )
        self.fallback_reason = reason
        self.controller = None
        if self._thread is not None:  # no more decisions: the thread ends (once free)
            self._thread.close()
            self._thread = None
        self.set_limits(Limits(self.cap_seqs, self.cap_tokens))
        if self.metrics is not None:
            self.metrics.fell_back(self.max_num_active_reqs, self.max_num_scheduled_tokens)

    # ------------------------------------------------------------------ vLLM hooks
    def track(self, hook: Callable[..., T], *args: Any) -> T | None:
        """The tracker's side of a vLLM hook, guarded: a fault there stops the tracker and
        is the controller's failure (logged, static caps); vLLM's side runs on."""
        if self.tracking_fault is not None:
            return None
        try:
            return hook(*args)
        except Exception as exc:  # keep serving
            self.tracking_fault = describe(exc)
            reason = f"the step tracker failed: {self.tracking_fault}"
            if self.controller is not None:
                self._fall_back(reason)
            else:
                logger.error("batchpilot: %s (no controller was in charge; serving on)", reason)
            return None

    def shutdown(self) -> None:
        """vLLM's, and the decision thread let go (it ends once its call in hand returns)."""
        if self._thread is not None:
            self._thread.close()
            self._thread = None
        super().shutdown()

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.controller is not None and self._due():
            self._decide()
        return super().schedule(*args, **kwargs)


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
