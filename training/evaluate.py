"""Evaluation harness: controllers x scenarios x seeds in parallel processes.

Each (scenario, controller, seed) is one run of the control loop. Every controller of a
scenario runs on the same workload draw per seed (`scenario_workload`), so controllers can
be compared seed by seed (`batchpilot.training.paired`). What a seed varies: the lengths
drawn from an embedded table (or, for a trace file cut to `num_requests`, which window of
the trace), the arrival draw, and the scenario's randomised ranges (`rate_scale`, `cv`,
`prompt_scale`, `output_scale`, each drawn uniformly per seed). A scenario with nothing a
seed can vary (a whole trace replayed, fixed lengths all at once) runs once, and its
results say so (`seed_note`) instead of showing a spread of zero.

Two pseudo-controllers are resolved per scenario before the runs:

- ``default``: vLLM's own defaults for the profile's GPU (`vllm_default_limits`).
- ``best-static``: the static (max_num_seqs, max_num_batched_tokens) pair with the best
  score on separate *tuning* seeds (never the evaluation seeds), found over a grid as vLLM's
  ``benchmarks/auto_tune`` does (`StaticGrid`, `tune_static`).

Capacity is the highest Poisson arrival rate at which a controller still meets a
`CapacityTarget` (by default p90 ITL <= 50 ms and p90 TTFT <= 2 s, every request finished),
found per seed by doubling the rate until the target fails and then bisecting.
"""

from __future__ import annotations

import math
import os
import re
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.agents.specs import make_controller, spec_key
from batchpilot.baselines.specs import BEST_STATIC, given_twice, simulator_only
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID
from batchpilot.envs.arrivals import CV_RANGE, DEFAULT_ARRIVAL, Arrival
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.engines import check_engine, make_engine
from batchpilot.envs.metrics import DEFAULT_SLO, SLO, RunMetrics, key_values
from batchpilot.envs.plain_numbers import plain_float
from batchpilot.envs.profiles import DEFAULT_PROFILE
from batchpilot.envs.run import check_interval, run
from batchpilot.envs.sim_engine import DEFAULT_SCHEDULER
from batchpilot.envs.traces import DEFAULT_BAD_ROWS, load_trace
from batchpilot.envs.workload import DEFAULT_OVERLONG, SCALE_BOUNDS, Workload, scale_range
from batchpilot.envs.workloads import (
    FIXED_PREFIX,
    is_trace_file,
    make_workload,
    short_trace_note,
    trace_window,
)
from batchpilot.training.limits import MAX_SEEDS

DEFAULT = "default"
"""Pseudo-controller: vLLM's default limits for the scenario's profile."""
PSEUDO = (BEST_STATIC, DEFAULT)
ITL_QUANTILES = np.linspace(0.0, 100.0, 201)
"""Percentiles of the inter-token latency kept per run for distribution plots."""
TIMELINE_POINTS = 400
"""Timeline rows kept per run (evenly spaced) for plots."""
TUNING_SEED_BASE = MAX_SEEDS
"""Tuning seeds are TUNING_SEED_BASE, +1, ...: disjoint from the evaluation seeds 0, 1, ..."""
DEFAULT_SEEDS = 3
"""Evaluation seeds where neither the command nor the suite gives a number (and those of the
report `batchpilot train` ends with, whatever its suites say: training's time)."""
DEFAULT_TUNING_SEEDS = 2
"""best-static's tuning seeds where neither the command nor the suite gives a number."""
TIE = 5e-3
"""Scores within this fraction of the best count as ties, broken by output throughput."""
SEPARATION = 0.01
"""Goodput cannot separate candidates when the best is below this fraction of the best
output throughput (every candidate misses the SLOs): rank by throughput instead."""
RANGES = ("rate_scale", "cv", "prompt_scale", "output_scale")
"""Scenario fields drawn uniformly per seed from a (low, high) range."""

# vLLM 0.32 `EngineArgs.get_batch_defaults`, usage context OPENAI_API_SERVER (`vllm serve`):
# >= 160 GiB per GPU: 1024 / 16384; >= 70 GiB and not an A100: 1024 / 8192; otherwise
# (A100, and GPUs under 70 GiB: A40, L40, 24 GB cards): 256 / 2048; CPU: 128 / 2048 per rank.
GPU_MEMORY_GIB = {
    "b300": 288, "b200": 180, "h200": 141, "h100": 80, "a100-40gb": 40, "a100-sxm-40gb": 40,
    "a100": 80, "a40": 48, "l40s": 48, "l40": 48, "a10": 24, "l4": 24, "24gb": 24,
}  # fmt: skip


def vllm_default_limits(profile: str) -> tuple[int, int, str]:
    """(max_num_seqs, max_num_batched_tokens, why) that ``vllm serve`` 0.32 picks on the
    profile's hardware: read from its GPU field first (what the deployment stands for: a
    24 GB card with an A100's step times is a 24 GB card), then its name, then its
    description unless the timings are carried (it names the GPU they were measured on)."""
    from batchpilot.envs.profiles import get_profile

    p = get_profile(profile)
    places = (p.gpu, p.name, "" if p.carried_from else p.description)
    hardware = next((h for h in map(_hardware, places) if h is not None), None)
    if hardware is None:
        raise ValueError(
            f"default: cannot tell the GPU of profile {profile!r} (no {', '.join(GPU_MEMORY_GIB)} "
            "or cpu in its GPU, name or description), so not vLLM's defaults for it; use "
            "static:N:T"
        )
    gpu, gib = hardware
    if gpu == "cpu":
        return 128, 2048, "vLLM 0.32 CPU defaults for `vllm serve` (per rank)"
    if gib >= 160:
        seqs, tokens = 1024, 16384
    elif gib >= 70 and not gpu.startswith("a100"):
        seqs, tokens = 1024, 8192
    else:
        seqs, tokens = 256, 2048
    return seqs, tokens, f"vLLM 0.32 `vllm serve` defaults on {gpu.upper()} ({gib:g} GiB)"


def _hardware(text: str) -> tuple[str, float] | None:
    """("cpu", 0) for a text naming a CPU; else the known GPU it names first (the longest of
    those at that place: ``l40s``, not ``l4``) and its memory in GiB (a figure the text gives,
    such as ``80GB``, else the GPU's); None if it names neither."""
    text = re.sub(r"(\d)\s+gb\b", r"\1gb", text.lower())  # "24 GB GPU": 24gb
    if "cpu" in text:
        return "cpu", 0.0
    found = [(text.find(g), -len(g), g) for g in GPU_MEMORY_GIB if g in text]
    if not found:
        return None
    gpu = min(found)[2]
    memory = re.search(r"(\d+(?:\.\d+)?)\s*gi?b\b", text)
    return gpu, float(memory.group(1)) if memory else float(GPU_MEMORY_GIB[gpu])


@dataclass(frozen=True)
class Scenario:
    """An engine and a workload to compare controllers on."""

    name: str
    source: str
    arrival: str = DEFAULT_ARRIVAL
    num_requests: int | None = None
    profile: str = DEFAULT_PROFILE
    engine: str = "sim"
    model: str | None = None
    engine_args: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the real engine (`VLLMEngine`), e.g. num_gpu_blocks."""
    scheduler: str = DEFAULT_SCHEDULER
    """The simulator's scheduling: vLLM ``v1`` (chunked prefill) or ``v0`` (prefill first)."""
    slo: str = str(DEFAULT_SLO)
    """Goodput SLOs (``vllm bench serve --goodput``)."""
    interval: str = "1it"
    overlong: str = DEFAULT_OVERLONG.value
    bad_rows: str = DEFAULT_BAD_ROWS
    """A trace file's bad rows: stop with their error, or ``skip`` (left out, counted)."""
    score: str = "output_goodput"
    """Metric that best-static maximises and the report ranks controllers by."""
    family: str = ""
    """The suite family the scenario belongs to (empty outside a suite)."""
    rate_scale: tuple[float, float] | None = None
    """Every rate of the arrival process times a factor drawn per seed from this range."""
    cv: tuple[float, float] | None = None
    """A gamma arrival's CV drawn per seed from this range."""
    prompt_scale: tuple[float, float] | None = None
    """Prompt lengths times a factor drawn per seed from this range."""
    output_scale: tuple[float, float] | None = None
    """Output lengths times a factor drawn per seed from this range."""

    def __post_init__(self) -> None:
        arrival = Arrival.parse(self.arrival)
        for key in RANGES:
            value = getattr(self, key)
            if value is None:
                continue
            bounds = CV_RANGE if key == "cv" else SCALE_BOUNDS  # gamma arrivals' own
            scale_range(value, f"scenario {self.name!r}: {key}", bounds)
        if self.bad_rows != DEFAULT_BAD_ROWS and not is_trace_file(self.source):
            raise ValueError(
                f"scenario {self.name!r}: bad_rows {self.bad_rows!r} says what a trace file's "
                f"bad rows do; {self.source} is no trace file: drop it"
            )
        if self.cv is not None and arrival.kind != "gamma":
            raise ValueError(
                f"scenario {self.name!r}: cv is drawn for gamma arrivals only; drop it from "
                "this scenario (or from the suite's defaults)"
            )
        if self.rate_scale is not None and arrival.kind == "all-at-once":
            raise ValueError(
                f"scenario {self.name!r}: rate_scale has no rate to scale in all-at-once "
                "arrivals; drop it from this scenario (or from the suite's defaults)"
            )
        for factor in self.rate_scale or ():  # each end's rates in range, as a draw's must be
            try:
                arrival.scaled(factor)
            except ValueError as exc:
                raise ValueError(
                    f"scenario {self.name!r}: at rate_scale {factor:g}, {exc}"
                ) from None

    def draw(self, seed: int) -> dict[str, float]:
        """The randomised values of this seed (one stream per seed, shared by all runs)."""
        rng = np.random.default_rng([seed, 0x5CE2])
        out = {}
        for key in RANGES:
            u = rng.uniform()  # drawn for every key so each keeps its stream when others change
            value = getattr(self, key)
            if value is not None:
                out[key] = float(value[0] + u * (value[1] - value[0]))
        return out

    @property
    def is_trace_file(self) -> bool:
        return is_trace_file(self.source)

    def seed_free(self) -> bool:
        """Whether every seed gives the same workload (nothing a seed can vary)."""
        if any(getattr(self, k) is not None for k in RANGES):
            return False
        kind = Arrival.parse(self.arrival).kind
        if self.source.startswith(FIXED_PREFIX):
            return kind == "all-at-once"
        if not self.is_trace_file:
            return False
        if kind not in ("replay", "all-at-once"):
            return False
        trace = load_trace(self.source, bad_rows=self.bad_rows)
        return self.num_requests is None or self.num_requests >= len(trace)


def scenario_workload(
    sc: Scenario, seed: int, max_model_len: int | None, arrival: str | None = None
) -> tuple[Workload, dict[str, float]]:
    """The workload of `sc` for `seed` (the same for every controller) and what was drawn.

    `arrival` overrides the scenario's process (capacity probes), without its rate scale.
    """
    draw = sc.draw(seed)
    process = Arrival.parse(arrival or sc.arrival)
    if arrival is None and "rate_scale" in draw:
        process = process.scaled(draw["rate_scale"])
    if "cv" in draw:
        process = replace(process, cv=draw["cv"])
    num_requests, start = trace_window(sc.source, sc.num_requests, seed, sc.bad_rows)
    if start is not None:
        draw["window_start"] = start
    workload = make_workload(
        sc.source,
        process,
        num_requests=num_requests,
        seed=seed,
        bad_rows=sc.bad_rows,
        window_start=start,
    )
    workload = workload.scaled(draw.get("prompt_scale", 1.0), draw.get("output_scale", 1.0))
    if max_model_len is not None:
        workload = workload.fit_context(max_model_len, sc.overlong)
    return workload, draw


LONG_RUN_REQUESTS = 100_000
"""Requests per run above which `evaluate` says a whole trace is run (`long_runs`)."""


def long_runs(scenarios: Sequence[Scenario]) -> list[str]:
    """A note for each scenario that runs a whole trace file of over `LONG_RUN_REQUESTS`
    requests in every run (no ``num_requests``), naming the option that takes a window."""
    notes = []
    for sc in scenarios:
        if sc.is_trace_file and sc.num_requests is None:
            total = len(load_trace(sc.source, bad_rows=sc.bad_rows))
            if total > LONG_RUN_REQUESTS:
                notes.append(
                    f"note: {sc.name}: every run simulates all {total:,} requests of the trace; "
                    "--num-requests N (a suite's num_requests) runs a window of N requests "
                    "from a random request per seed instead"
                )
    return notes


def short_traces(scenarios: Sequence[Scenario]) -> list[str]:
    """A note for each scenario asking more requests of a trace file than it holds: every run
    takes the whole trace (`trace_window`)."""
    notes = []
    for sc in scenarios:
        if sc.is_trace_file and sc.num_requests is not None:
            total = len(load_trace(sc.source, bad_rows=sc.bad_rows))
            if note := short_trace_note(sc.name, total, sc.num_requests):
                notes.append(note)
    return notes


def check_seed_range(first_seed: int, seeds: int) -> None:
    """Evaluation seeds `first_seed`.. `first_seed` + `seeds` - 1 stay below the tuning seeds
    (`TUNING_SEED_BASE`): a ValueError naming the seed that reaches them."""
    if first_seed + seeds > TUNING_SEED_BASE:
        raise ValueError(
            f"--first-seed {first_seed} with {seeds} seeds reaches seed {first_seed + seeds - 1}; "
            f"evaluation seeds stay below {TUNING_SEED_BASE}, where the tuning seeds start"
        )


def suite_stems(suites: Sequence[str | Path]) -> list[str]:
    """Each suite's file stem (its section and directory in a report): a ValueError where two
    share one."""
    stems = [Path(suite).stem for suite in suites]
    if len(set(stems)) < len(stems):
        raise ValueError(f"two suites share a name ({', '.join(stems)})")
    return stems


def unreachable_slos(scenarios: Sequence[Scenario]) -> list[str]:
    """A note for each simulated scenario ranked by goodput whose TPOT target no request can
    meet on its profile (`unreachable_tpot`); one ranked by throughput (the paper's Table I)
    has no use for the target."""
    from batchpilot.envs.profiles import get_profile, unreachable_tpot

    problems = {
        sc.name: unreachable_tpot(get_profile(sc.profile), SLO.parse(sc.slo).tpot_ms)
        for sc in scenarios
        if sc.engine == "sim" and sc.score != "output_throughput"
    }
    return [f"note: {name}: {problem}" for name, problem in problems.items() if problem]


BOUNDED_METRICS = frozenset(
    k
    for k in RunMetrics().metrics(1.0)
    if k.endswith("_ms") or k in ("num_preemptions", "recomputed_tokens")
)
"""The run metrics a capacity SLO may bound from above: the latencies (ms), preemptions and
recomputed tokens (lower is better in each)."""


@dataclass(frozen=True)
class CapacityTarget:
    """What meeting the SLO means for capacity: each metric (`BOUNDED_METRICS`) at or below
    its bound."""

    bounds: tuple[tuple[str, float], ...] = (("p90_itl_ms", 50.0), ("p90_ttft_ms", 2000.0))
    num_requests: int = 500
    """Requests per probe run."""
    start_rate: float = 1.0
    rel_tol: float = 0.03
    """Bisection stops when the failing rate is within this fraction of the passing one."""
    max_probes: int = 16

    @property
    def slo(self) -> str:
        """The bounds as `parse` reads them: ``p90_itl_ms:50,p90_ttft_ms:2000``."""
        return ",".join(f"{metric}:{bound:g}" for metric, bound in self.bounds)

    @classmethod
    def parse(cls, spec: str, **kw: Any) -> CapacityTarget:
        """``p90_itl_ms:50,p90_ttft_ms:2000`` (metric names as in the results)."""
        bounds = []
        for key, value in key_values(spec, "capacity SLO"):
            if key not in BOUNDED_METRICS and value:
                raise ValueError(
                    f"capacity SLO {spec!r}: {key!r} is no metric a run reports that lower is "
                    f"better in (one of {', '.join(sorted(BOUNDED_METRICS))})"
                )
            try:
                bound = plain_float(value)
            except ValueError:
                part = f"{key}:{value}" if value else key
                raise ValueError(
                    f"capacity SLO {spec!r}: {part!r} is not METRIC:MAX (e.g. p90_itl_ms:50)"
                ) from None
            count = key in ("num_preemptions", "recomputed_tokens")  # none at all: a bound
            if not (math.isfinite(bound) and (bound >= 0 if count else bound > 0)):
                raise ValueError(
                    f"capacity SLO {spec!r}: {key} bound must be a finite number "
                    f"{'>=' if count else '>'} 0, got {value}"
                )
            bounds.append((key, bound))
        if not bounds:
            raise ValueError(f"capacity SLO {spec!r}: name at least one METRIC:MAX")
        return cls(bounds=tuple(bounds), **kw)

    def met(self, metrics: dict[str, float]) -> bool:
        """Every request finished and every bound holds."""
        if metrics.get("unfinished", 0):
            return False
        return all(metrics[key] <= bound for key, bound in self.bounds)

    def __str__(self) -> str:
        return ", ".join(f"{k} <= {v:g}" for k, v in self.bounds)


@dataclass(frozen=True)
class Task:
    """One run: a controller spec on a scenario with a seed (arrival overridable)."""

    scenario: Scenario
    controller: str
    seed: int
    arrival: str | None = None
    num_requests: int | None = None
    detail: bool = False
    """Keep the timeline and ITL percentiles (for plots)."""


def _engine(sc: Scenario, slo: SLO | None = None) -> Any:
    return make_engine(
        sc.engine,
        profile=sc.profile,
        model=sc.model,
        slo=slo or SLO.parse(sc.slo),
        engine_args=sc.engine_args,
        scheduler=sc.scheduler,
    )


def run_task(task: Task) -> dict[str, Any]:
    """Run one task (in a worker process); metrics, plus plot data when `detail`."""
    sc = task.scenario
    if task.num_requests is not None:
        sc = replace(sc, num_requests=task.num_requests)
    engine = _engine(sc)
    workload, draw = scenario_workload(sc, task.seed, engine.max_model_len, task.arrival)
    controller = make_controller(task.controller)
    out = run(workload, engine, controller, ControlInterval.parse(sc.interval))
    result: dict[str, Any] = {
        "metrics": out.metrics(),
        "workload": workload.name,
        "draw": draw,
        "fit": {
            "requests": len(workload) + workload.dropped,
            "dropped": workload.dropped,
            "truncated": workload.truncated,
            "max_model_len": engine.max_model_len,
        },
        "bad_rows": {"skipped_rows": workload.skipped_rows, "first": workload.first_skipped},
    }
    if task.detail:
        tl = out.timeline.array()
        step = max(1, math.ceil(len(tl["time_s"]) / TIMELINE_POINTS))
        result["timeline"] = {k: v[::step].tolist() for k, v in tl.items()}
        itl = out.result.stats.itl
        result["itl_ms_quantiles"] = (
            [q * 1e3 for q in itl.percentiles(ITL_QUANTILES)] if itl.n else []
        )
    return result


def capacity_search(task: Task, target: CapacityTarget) -> dict[str, Any]:
    """Highest Poisson rate meeting `target` for one controller and seed, and every probe."""
    probes: list[dict[str, float]] = []

    def meets(rate: float) -> bool:
        probe = replace(task, arrival=f"poisson:{rate:.6g}", num_requests=target.num_requests)
        m = run_task(probe)["metrics"]
        ok = target.met(m)
        probes.append(
            {
                "rate": rate,
                "met": ok,
                "output_throughput": m["output_throughput"],
                "output_goodput": m["output_goodput"],
                "request_throughput": m["request_throughput"],
            }
        )
        return ok

    rate = target.start_rate
    if meets(rate):
        lo, hi = rate, None
        while hi is None and len(probes) < target.max_probes:
            rate *= 2
            lo, hi = (rate, None) if meets(rate) else (lo, rate)
    else:
        lo, hi = 0.0, rate
        while lo == 0.0 and len(probes) < target.max_probes // 2:
            rate /= 2
            lo, hi = (rate, hi) if meets(rate) else (0.0, rate)
    while hi is not None and lo > 0 and hi / lo - 1 > target.rel_tol:
        if len(probes) >= target.max_probes:
            break
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if meets(mid) else (lo, mid)
    at = [p for p in probes if p["met"] and p["rate"] == lo]
    throughput = at[0]["output_throughput"] if at else 0.0
    return {
        "capacity": lo,
        "output_throughput_at_capacity": throughput,
        "probes": probes,
        "bracketed": hi is not None,
    }


def summarise(values: list[dict[str, float]]) -> tuple[dict[str, float], dict[str, float]]:
    """Mean and sample standard deviation (0 for one seed) of each metric across seeds."""
    keys = [k for k, v in values[0].items() if isinstance(v, int | float)]
    arr = {k: np.array([float(m[k]) for m in values]) for k in keys}
    ddof = 1 if len(values) > 1 else 0
    return (
        {k: float(a.mean()) for k, a in arr.items()},
        {k: float(a.std(ddof=ddof)) for k, a in arr.items()},
    )


class Ticker:
    """Progress over runs: a bar on a terminal, a log line every `every_s` otherwise."""

    def __init__(self, enabled: bool, every_s: float = 15.0) -> None:
        self.enabled, self.every_s = enabled, every_s
        self.total = self.done = 0
        self.phase = "runs"
        self.start = self.last_log = time.perf_counter()
        self.bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

            self.bar = Progress(
                "[bold]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn()
            )
            self.task = self.bar.add_task("runs", total=0)
            self.bar.start()

    def add(self, n: int, phase: str) -> None:
        self.total += n
        self.phase = phase
        if self.bar is not None:
            self.bar.update(self.task, total=self.total, description=phase)

    def tick(self) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.advance(self.task)
        elif self.enabled:
            now = time.perf_counter()
            if now - self.last_log >= self.every_s or self.done == self.total:
                self.last_log = now
                print(
                    f"[compare] {self.done}/{self.total} runs ({self.phase}), "
                    f"{now - self.start:.0f} s",
                    file=sys.stderr,
                    flush=True,
                )

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


class Pool:
    """Runs functions in worker processes (inline with one worker), reporting completions."""

    def __init__(self, workers: int, on_done: Callable[[], None]) -> None:
        self.workers = workers
        self.on_done = on_done
        self.executor = ProcessPoolExecutor(workers) if workers > 1 else None

    def submit(self, calls: Iterable[tuple[Callable[..., Any], tuple]]) -> list[Future]:
        """Start ``fn(*args)`` for each ``(fn, args)`` (inline: run now); their futures."""
        futures: list[Future] = []
        for fn, args in calls:
            if self.executor is None:
                f: Future = Future()
                f.set_result(fn(*args))
                self.on_done()
            else:
                f = self.executor.submit(fn, *args)
                f.add_done_callback(lambda _f: self.on_done())
            futures.append(f)
        return futures

    def map(self, calls: Iterable[tuple[Callable[..., Any], tuple]]) -> list[Any]:
        """Results of ``fn(*args)`` for each ``(fn, args)``, in order."""
        return [f.result() for f in self.submit(calls)]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()


def default_workers() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True)
class StaticGrid:
    """Candidates of the best-static search, as vLLM's ``benchmarks/auto_tune`` grid
    (NUM_SEQS_LIST x NUM_BATCHED_TOKENS_LIST; steps of about 1.5x in max_num_seqs, since
    goodput can fall off a cliff between powers of two), run in three passes:

    1. every max_num_seqs in `seqs` from `first_seqs` up (to the engine's cap) x every
       token budget in `tokens` (to the engine's cap);
    2. while the best so far has the smallest max_num_seqs tried, the next smaller value of
       `seqs`, down to 1 (small limits make slow runs, so they run only when they may win);
    3. the geometric midpoints between the best pair and its neighbours in each knob.

    The token budgets span the learned policy's (every other value of the action grid's
    `BUDGET_GRID`, the rest reached by pass 3), so the static pair is denied no budget a
    controller may set. Only pairs vLLM accepts as a static config run: a budget of at least
    max_num_seqs (`SchedulerConfig`: max_num_batched_tokens >= max_num_seqs).
    """

    seqs: tuple[int, ...] = tuple(sorted({*SEQ_GRID, 768}))  # the policy's grid, and 768
    tokens: tuple[int, ...] = BUDGET_GRID[::2]
    first_seqs: int = 8


def rank_candidates(
    scores: dict[Any, tuple[float, float]], score: str
) -> tuple[Any, str, str | None]:
    """(best key, metric ranked by, note) from key -> (mean score, mean output throughput).

    Ties within `TIE` of the best score go to the highest throughput. When the score is
    goodput and the best is under `SEPARATION` of the best throughput, goodput cannot
    separate the candidates: they are ranked by throughput, and the note says so.
    """
    top_score = max(s for s, _ in scores.values())
    top_thr = max(t for _, t in scores.values())
    if score != "output_throughput" and top_score < SEPARATION * top_thr:
        best = max(scores, key=lambda k: scores[k][1])
        note = (
            f"{score} cannot separate the candidates (best {top_score:,.1f} tok/s, under "
            f"{SEPARATION:.0%} of the best output throughput {top_thr:,.0f} tok/s): ranked by "
            "output throughput instead"
        )
        return best, "output_throughput", note
    ties = [k for k, (s, _) in scores.items() if s >= top_score * (1 - TIE)]
    return max(ties, key=lambda k: scores[k][1]), score, None


def _static_spec(seqs: int, tokens: int) -> str:
    return f"static:{seqs}:{tokens}"


def _midpoints(values: list[int], best: int) -> list[int]:
    """Geometric midpoints between `best` and its neighbours in sorted `values`."""
    i = values.index(best)
    out = []
    for j in (i - 1, i + 1):
        if 0 <= j < len(values):
            m = round(math.sqrt(values[j] * best))
            if m not in values:
                out.append(m)
    return out


@dataclass
class _Search:
    """One scenario's best-static search state."""

    sc: Scenario
    seeds: list[int]
    seqs: list[int]
    tokens: list[int]
    results: dict[tuple[int, int], tuple[float, float]] = field(default_factory=dict)

    def calls(self, pairs: Iterable[tuple[int, int]]) -> tuple[list, list]:
        pairs = [(n, t) for n, t in dict.fromkeys(pairs) if t >= n and (n, t) not in self.results]
        calls = [
            (run_task, (Task(self.sc, _static_spec(n, t), s),))
            for n, t in pairs
            for s in self.seeds
        ]
        return pairs, calls

    def record(self, pairs: list[tuple[int, int]], out: list[dict[str, Any]]) -> None:
        it = iter(out)
        for pair in pairs:
            ms = [next(it)["metrics"] for _ in self.seeds]
            self.results[pair] = (
                float(np.mean([m[self.sc.score] for m in ms])),
                float(np.mean([m["output_throughput"] for m in ms])),
            )

    def best(self) -> tuple[tuple[int, int], str, str | None]:
        return rank_candidates(self.results, self.sc.score)

    def summary(self) -> dict[str, Any]:
        (n, t), ranked_by, note = self.best()
        return {
            "score": self.sc.score,
            "ranked_by": ranked_by,
            "note": note,
            "tuning_seeds": self.seeds,
            "best": _static_spec(n, t),
            "seqs": n,
            "tokens": t,
            "candidates": [
                {"seqs": a, "tokens": b, "score": s, "output_throughput": thr}
                for (a, b), (s, thr) in sorted(self.results.items())
            ],
        }


def tune_static(
    pool: Pool,
    ticker: Ticker,
    scenarios: list[Scenario],
    tuning_seeds: dict[str, list[int]],
    grid: StaticGrid,
) -> dict[str, dict[str, Any]]:
    """Per scenario name, the best-static search's summary (choice, ranking, candidates)."""
    searches = []
    for sc in scenarios:
        engine = _engine(sc, SLO())
        seqs = sorted({n for n in grid.seqs if n <= engine.max_num_seqs} | {engine.max_num_seqs})
        cap_tokens = engine.max_num_batched_tokens
        tokens = sorted({t for t in grid.tokens if t <= cap_tokens} | {cap_tokens})
        searches.append(_Search(sc, tuning_seeds[sc.name], seqs, tokens))

    def run_pass(phase: str, wanted: dict[int, list[tuple[int, int]]]) -> None:
        batch = {i: searches[i].calls(pairs) for i, pairs in wanted.items()}
        calls = [c for _, cs in batch.values() for c in cs]
        ticker.add(len(calls), phase)
        it = iter(pool.map(calls))
        for i, (pairs, cs) in batch.items():
            searches[i].record(pairs, [next(it) for _ in cs])

    first = {
        i: [(n, t) for n in s.seqs if n >= min(grid.first_seqs, max(s.seqs)) for t in s.tokens]
        for i, s in enumerate(searches)
    }
    run_pass("best-static grid", first)
    while True:  # pass 2: extend downward while the smallest limit tried is the best
        wanted = {}
        for i, s in enumerate(searches):
            tried = sorted({n for n, _ in s.results})
            (n, _), _, _ = s.best()
            smaller = [m for m in s.seqs if m < tried[0]]
            if n == tried[0] and smaller:
                wanted[i] = [(smaller[-1], t) for t in s.tokens]
        if not wanted:
            break
        run_pass("best-static grid (smaller limits)", wanted)
    refine = {}
    for i, s in enumerate(searches):
        (n, t), _, _ = s.best()
        tried_n = sorted({a for a, b in s.results if b == t})
        tried_t = sorted({b for a, b in s.results if a == n})
        refine[i] = [(m, t) for m in _midpoints(tried_n, n)] + [
            (n, m) for m in _midpoints(tried_t, t)
        ]
    run_pass("best-static refinement", refine)
    return {s.sc.name: s.summary() for s in searches}


def check_controllers(specs: Sequence[str], scenarios: Sequence[Scenario] = ()) -> None:
    """Raise ValueError on a controller spec that cannot be built (`PSEUDO` ones pass), that
    is given twice (its rows would be one), that needs the simulator where a scenario runs a
    real engine (`simulator_only`), or that cannot run at a scenario's control interval
    (`check_interval`)."""
    twice = given_twice(specs, key=spec_key)
    if twice:
        raise ValueError(f"controller {twice} given twice in {','.join(specs)}")
    for spec in specs:
        if spec not in PSEUDO:
            controller = make_controller(spec)
            for sc in scenarios:
                if sc.engine != "sim" and simulator_only(controller):
                    raise ValueError(
                        f"scenario {sc.name!r} runs on the {sc.engine} engine; controller "
                        f"{spec!r} needs the simulator (oracle reads its true lengths, mpc "
                        "forks it to look ahead) and runs only on --engine sim"
                    )
                try:
                    check_interval(controller, ControlInterval.parse(sc.interval))
                except ValueError as exc:
                    raise ValueError(f"scenario {sc.name!r}: {exc}") from None


def trained_interval(specs: Sequence[str]) -> str | None:
    """The control interval the learned policies among `specs` were trained at (None: no
    policy); policies trained at different intervals are a ValueError naming them: one run
    consults every controller at one interval."""
    intervals = {}
    for spec in specs:
        if spec not in PSEUDO:
            interval = getattr(make_controller(spec), "control_interval", None)
            if interval is not None:
                intervals[spec] = str(interval)
    if len(set(intervals.values())) > 1:
        given = ", ".join(f"{spec} ({i})" for spec, i in intervals.items())
        raise ValueError(
            f"the policies were trained at different control intervals ({given}); a run "
            "consults every controller at one: compare them in separate runs"
        )
    return next(iter(intervals.values()), None)


def tuning_seed_list(count: int = DEFAULT_TUNING_SEEDS) -> list[int]:
    """best-static's `count` tuning seeds: `TUNING_SEED_BASE`, +1, ..."""
    return [TUNING_SEED_BASE + i for i in range(count)]


def evaluate(
    scenarios: list[Scenario],
    controllers: list[str],
    seeds: list[int],
    *,
    tuning_seeds: list[int] | None = None,
    capacity: CapacityTarget | None = None,
    workers: int | None = None,
    progress: bool = True,
    static_grid: StaticGrid | None = None,
) -> dict[str, Any]:
    """Run every controller on every scenario and seed; results as a JSON-ready dict.

    `tuning_seeds` (default: `tuning_seed_list()`) are where ``best-static`` is chosen;
    they must not overlap `seeds`.
    """
    grid = static_grid or StaticGrid()
    tuning_seeds = tuning_seeds or tuning_seed_list()
    if set(tuning_seeds) & set(seeds):
        raise ValueError(f"tuning seeds {tuning_seeds} overlap the evaluation seeds {seeds}")
    check_controllers(controllers, scenarios)  # fail on a bad spec before starting any run
    for sc in scenarios:
        check_engine(sc.engine, model=sc.model, engine_args=sc.engine_args, scheduler=sc.scheduler)
    if any(sc.engine != "sim" for sc in scenarios):
        workers = 1  # one real engine at a time
    workers = workers or default_workers()
    names = [sc.name for sc in scenarios]
    if len(set(names)) != len(names):
        raise ValueError(f"scenario names must be unique: {names}")
    for note in [*long_runs(scenarios), *short_traces(scenarios), *unreachable_slos(scenarios)]:
        print(note, file=sys.stderr)
    start = time.perf_counter()
    run_seeds, tune_seeds, seed_notes = {}, {}, {}
    for sc in scenarios:
        if sc.seed_free():
            run_seeds[sc.name] = tune_seeds[sc.name] = seeds[:1]
            seed_notes[sc.name] = (
                "nothing in this workload depends on the seed (fixed lengths and arrivals), "
                f"so it ran once (seed {seeds[0]}): no spread or interval over seeds"
                + (", and best-static was chosen on that same run" * (BEST_STATIC in controllers))
            )
        else:
            run_seeds[sc.name], tune_seeds[sc.name] = seeds, tuning_seeds
    resolved = {sc.name: {c: c for c in controllers} for sc in scenarios}
    defaults = {}
    if DEFAULT in controllers:
        for sc in scenarios:
            if sc.engine == "sim":
                seqs, tokens, why = vllm_default_limits(sc.profile)
            else:
                engine = _engine(sc, SLO())
                seqs, tokens = engine.max_num_seqs, engine.max_num_batched_tokens
                why = "the real engine's configured limits"
            engine = _engine(sc, SLO())
            seqs = min(seqs, engine.max_num_seqs)
            tokens = min(tokens, engine.max_num_batched_tokens)
            resolved[sc.name][DEFAULT] = _static_spec(seqs, tokens)
            defaults[sc.name] = {"spec": _static_spec(seqs, tokens), "why": why}

    ticker = Ticker(progress)
    pool = Pool(workers, ticker.tick)
    try:

        def eval_calls(cs: list[str]) -> list:
            return [
                (run_task, (Task(sc, resolved[sc.name][c], s, detail=(i == 0)),))
                for sc in scenarios
                for c in cs
                for i, s in enumerate(run_seeds[sc.name])
            ]

        ready = [c for c in controllers if c != BEST_STATIC]
        first = eval_calls(ready)
        ticker.add(len(first), "runs")
        early = pool.submit(first)  # while best-static is being searched
        tuned = {}
        if BEST_STATIC in controllers:
            tuned = tune_static(pool, ticker, scenarios, tune_seeds, grid)
            for sc in scenarios:
                resolved[sc.name][BEST_STATIC] = tuned[sc.name]["best"]
        late_calls = eval_calls([BEST_STATIC]) if BEST_STATIC in controllers else []
        caps = []
        if capacity is not None:
            caps = [
                (capacity_search, (Task(sc, resolved[sc.name][c], s), capacity))
                for sc in scenarios
                for c in controllers
                for s in run_seeds[sc.name]
            ]
        ticker.add(len(late_calls) + len(caps), "runs" if not caps else "runs and capacity")
        late = pool.submit(late_calls + caps)
        done_early = [f.result() for f in early]
        done_late = [f.result() for f in late]
    finally:
        pool.close()
        ticker.close()
    by_key: dict[tuple[str, str, int], dict[str, Any]] = {}
    it_early = iter(done_early)
    for sc in scenarios:
        for c in ready:
            for s in run_seeds[sc.name]:
                by_key[sc.name, c, s] = next(it_early)
    it_late = iter(done_late)
    if BEST_STATIC in controllers:
        for sc in scenarios:
            for s in run_seeds[sc.name]:
                by_key[sc.name, BEST_STATIC, s] = next(it_late)
    cap_by_key = {}
    if capacity is not None:
        for sc in scenarios:
            for c in controllers:
                for s in run_seeds[sc.name]:
                    cap_by_key[sc.name, c, s] = next(it_late)
    scenario_results = []
    for sc in scenarios:
        sseeds = run_seeds[sc.name]
        results: dict[str, Any] = {}
        timelines, itls = {}, {}
        for c in controllers:
            per_seed = [by_key[sc.name, c, s] for s in sseeds]
            mean, std = summarise([r["metrics"] for r in per_seed])
            entry: dict[str, Any] = {
                "spec": resolved[sc.name][c],
                "per_seed": [r["metrics"] for r in per_seed],
                "mean": mean,
                "std": std,
                "capacity": None,
            }
            if capacity is not None:
                found = [cap_by_key[sc.name, c, s] for s in sseeds]
                keys = ("capacity", "output_throughput_at_capacity")
                cap_mean, cap_std = summarise([{k: f[k] for k in keys} for f in found])
                entry["capacity"] = {
                    "per_seed": [float(f["capacity"]) for f in found],
                    "mean": cap_mean["capacity"],
                    "std": cap_std["capacity"],  # the sample std, as the metrics' (`summarise`)
                    "output_throughput_at_capacity": cap_mean["output_throughput_at_capacity"],
                    "output_throughput_at_capacity_std": cap_std["output_throughput_at_capacity"],
                    "bracketed": all(f["bracketed"] for f in found),
                    "probes": [
                        {"seed": s, **p}
                        for s, f in zip(sseeds, found, strict=True)
                        for p in f["probes"]
                    ],
                }
            results[c] = entry
            timelines[c] = per_seed[0]["timeline"]
            itls[c] = per_seed[0]["itl_ms_quantiles"]
        first_run = by_key[sc.name, controllers[0], sseeds[0]]
        fits = [by_key[sc.name, controllers[0], s]["fit"] for s in sseeds]
        scenario_results.append(
            {
                "name": sc.name,
                "scenario": asdict(sc),
                "workload": first_run["workload"],
                "seeds": sseeds,
                "seed_note": seed_notes.get(sc.name),
                "draws": [by_key[sc.name, controllers[0], s]["draw"] for s in sseeds],
                "overlong": {
                    "policy": sc.overlong,
                    "max_model_len": fits[0]["max_model_len"],
                    "requests": [f["requests"] for f in fits],
                    "dropped_requests": [f["dropped"] for f in fits],
                    "truncated_requests": [f["truncated"] for f in fits],
                },
                "bad_rows": {"policy": sc.bad_rows, **first_run["bad_rows"]},
                "results": results,
                "timelines": timelines,
                "itl_ms_quantiles": itls,
                "best_static": tuned.get(sc.name),
                "default": defaults.get(sc.name),
                "capacity_target": None if capacity is None else asdict(capacity),
            }
        )
    return {
        "controllers": controllers,
        "seeds": seeds,
        "tuning_seeds": tuning_seeds,
        "capacity_target": None if capacity is None else asdict(capacity),
        "scenarios": scenario_results,
        "workers": workers,
        "wall_s": time.perf_counter() - start,
    }
