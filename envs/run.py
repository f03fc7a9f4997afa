"""`run(workload, engine, controller)`: one whole run of the control loop."""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.engine import Engine, RunResult
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workload import Workload

TIMELINE_FIELDS = (
    "time_s",
    "max_num_seqs",
    "max_num_batched_tokens",
    "num_requests_running",
    "num_requests_waiting",
    "kv_cache_usage",
    "recent_tbt_s",
    "interval_preemptions",
)


@dataclass
class Timeline:
    """The controller's limits (capped at the engine's) and the engine's state at control
    decisions: every one up to `max_rows`, then every `stride`-th (halved as needed), so
    memory stays bounded on runs of any length."""

    rows: list[tuple[float, ...]] = field(default_factory=list)
    max_rows: int = 50_000
    stride: int = 1
    decisions: int = 0

    def add(self, t: Telemetry, limits: Limits, caps: tuple[int, int]) -> None:
        """Record a decision, each limit at most the engine's cap (`caps`: max_num_seqs,
        max_num_batched_tokens; a budget of None is that cap), as the engine holds them (a
        real engine may also raise a budget to its floor, which is not recorded)."""
        self.decisions += 1
        if (self.decisions - 1) % self.stride:
            return
        if len(self.rows) >= self.max_rows:
            self.rows = self.rows[::2]
            self.stride *= 2
            if (self.decisions - 1) % self.stride:
                return
        self.rows.append(
            (
                t.time_s,
                min(limits.max_num_seqs, caps[0]),
                min(limits.max_num_batched_tokens or caps[1], caps[1]),
                t.num_requests_running,
                t.num_requests_waiting,
                t.kv_cache_usage,
                t.recent_tbt_s,
                t.interval_preemptions,
            )
        )

    def limits_chosen(self) -> dict[str, dict[int, int]]:
        """How many recorded decisions set each max_num_seqs and each token budget (every
        `stride`-th decision past `max_rows`)."""
        return {
            name: dict(Counter(int(row[i]) for row in self.rows))
            for i, name in ((1, "max_num_seqs"), (2, "max_num_batched_tokens"))
        }

    def array(self) -> dict[str, np.ndarray]:
        """Columns by name (see `TIMELINE_FIELDS`)."""
        data = np.asarray(self.rows, dtype=np.float64).reshape(-1, len(TIMELINE_FIELDS))
        return {name: data[:, i] for i, name in enumerate(TIMELINE_FIELDS)}


@dataclass
class RunOutput:
    """A run's result, its metrics, and the timeline of decisions."""

    controller: str
    workload: str
    result: RunResult
    timeline: Timeline
    wall_seconds: float

    def metrics(self) -> dict[str, float]:
        m = self.result.metrics()
        m["simulated_seconds"] = self.result.duration_s
        m["wall_seconds"] = self.wall_seconds
        return m


def check_interval(controller: Controller, interval: ControlInterval) -> None:
    """Raise ValueError if `controller` (one with a ``control_interval``: a learned policy)
    was trained to decide at another interval than `interval`."""
    trained = getattr(controller, "control_interval", None)
    if trained is not None and trained != interval:
        raise ValueError(
            f"{controller.name} was trained to decide every {trained}; run it at that control "
            f"interval (--interval {trained}, or a suite's interval: {trained}), not {interval}"
        )


def run(
    workload: Workload,
    engine: Engine,
    controller: Controller,
    interval: ControlInterval | None = None,
    *,
    progress: bool = False,
    max_engine_s: float | None = None,
) -> RunOutput:
    """Serve `workload` on `engine`, consulting `controller` every `interval` (a controller
    with a ``control_interval`` attribute, a learned policy, only at that interval).

    Stops when every request has finished, or at `max_engine_s` on the engine clock.
    """
    interval = interval or ControlInterval()
    check_interval(controller, interval)
    start = time.perf_counter()
    controller.reset(engine)
    telemetry = engine.reset(workload, Limits(engine.max_num_seqs))
    timeline = Timeline()
    bar = Progress(
        TextColumn(f"[bold]{controller.name}[/] on {workload.name}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("requests  engine {task.fields[clock]:.0f}s"),
        TimeElapsedColumn(),
        disable=not progress,
        transient=False,
    )
    with bar:
        task = bar.add_task("run", total=len(workload), clock=0.0)
        finished = 0
        last_draw = start
        while not engine.done:
            limits = controller.decide(telemetry)
            engine.set_limits(limits)
            timeline.add(telemetry, limits, (engine.max_num_seqs, engine.max_num_batched_tokens))
            until = None
            if interval.seconds is not None:
                until = telemetry.time_s + interval.seconds
            if max_engine_s is not None:
                until = max_engine_s if until is None else min(until, max_engine_s)
            telemetry = engine.advance(max_iterations=interval.iterations, until_s=until)
            finished += telemetry.interval_finished
            if progress and time.perf_counter() - last_draw > 0.2:
                bar.update(task, completed=finished, clock=telemetry.time_s)
                last_draw = time.perf_counter()
            if max_engine_s is not None and telemetry.time_s >= max_engine_s:
                break
        bar.update(task, completed=finished, clock=telemetry.time_s)
    return RunOutput(
        controller=controller.name,
        workload=workload.name,
        result=engine.result(),
        timeline=timeline,
        wall_seconds=time.perf_counter() - start,
    )
