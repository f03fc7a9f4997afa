"""Evaluation harness: controllers x scenarios x seeds in parallel processes.

Each (scenario, controller, seed) is one run of the control loop. Capacity is the highest
Poisson arrival rate at which a controller still meets a `CapacityTarget` (by default p90
ITL <= 50 ms and p90 TTFT <= 2 s, every request finished), found per seed by doubling the
rate until the target fails and then bisecting. ``best-static`` is expanded before the
runs: every static:N of a grid runs on the scenario's workload for every seed, and the N
with the best mean score (in hindsight, on the very runs it is judged on; ties within
0.1% go to the largest N) replaces it, for the capacity search too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future, ProcessPoolExecutor
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from batchpilot.agents.specs import make_controller
from batchpilot.baselines.specs import BEST_STATIC
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import SLO
from batchpilot.envs.run import run
from batchpilot.envs.workloads import make_workload
from batchpilot.training.engines import make_engine

ITL_QUANTILES = np.linspace(0.0, 100.0, 201)
"""Percentiles of the inter-token latency kept per run for distribution plots."""
TIMELINE_POINTS = 400
"""Timeline rows kept per run (evenly spaced) for plots."""
BEST_STATIC_GRID = (8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
TIE = 1e-3
"""best-static: scores within this fraction of the best count as ties, won by the largest N."""


@dataclass(frozen=True)
class Scenario:
    """An engine and a workload to compare controllers on."""

    name: str
    source: str
    arrival: str = "replay"
    num_requests: int | None = None
    profile: str = "llama-7b-a100"
    engine: str = "sim"
    model: str | None = None
    engine_args: tuple[tuple[str, Any], ...] = ()
    """Keyword arguments of the real engine (`VLLMEngine`), e.g. num_gpu_blocks."""
    slo: str = "ttft:2000,tpot:50"
    scheduler: str = "v1"
    """The simulator's scheduling: vLLM ``v1`` (chunked prefill) or ``v0`` (prefill first)."""
    """Goodput SLOs (``vllm bench serve --goodput``)."""
    interval: str = "1it"
    overlong: str = "truncate"
    score: str = "output_goodput"
    """Metric that best-static maximises."""


@dataclass(frozen=True)
class CapacityTarget:
    """What meeting the SLO means for capacity: each metric at or below its bound."""

    bounds: tuple[tuple[str, float], ...] = (("p90_itl_ms", 50.0), ("p90_ttft_ms", 2000.0))
    num_requests: int = 500
    """Requests per probe run."""
    start_rate: float = 1.0
    rel_tol: float = 0.03
    """Bisection stops when the failing rate is within this fraction of the passing one."""
    max_probes: int = 16

    @classmethod
    def parse(cls, spec: str, **kw: Any) -> CapacityTarget:
        """``p90_itl_ms:50,p90_ttft_ms:2000`` (metric names as in the results)."""
        bounds = []
        for part in spec.replace(",", " ").split():
            key, _, value = part.partition(":")
            try:
                bounds.append((key, float(value)))
            except ValueError:
                raise ValueError(
                    f"capacity SLO {spec!r}: {part!r} is not METRIC:MAX (e.g. p90_itl_ms:50)"
                ) from None
        if not bounds:
            raise ValueError(f"capacity SLO {spec!r}: name at least one METRIC:MAX")
        return cls(bounds=tuple(bounds), **kw)

    def met(self, metrics: dict[str, float]) -> bool:
        """Every request finished and every bound holds."""
        if metrics.get("unfinished", 0):
            return False
        for key, bound in self.bounds:
            if key not in metrics:
                raise ValueError(f"capacity SLO names {key!r}, which is not a run metric")
            if metrics[key] > bound:
                return False
        return True

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


def run_task(task: Task) -> dict[str, Any]:
    """Run one task (in a worker process); metrics, plus plot data when `detail`."""
    sc = task.scenario
    engine = make_engine(
        sc.engine,
        profile=sc.profile,
        model=sc.model,
        slo=SLO.parse(sc.slo),
        engine_args=sc.engine_args,
    )
        scheduler=sc.scheduler,
    workload = make_workload(
        sc.source,
        task.arrival or sc.arrival,
        num_requests=task.num_requests or sc.num_requests,
        seed=task.seed,
        max_model_len=engine.max_model_len,
        overlong=sc.overlong,
    )
    controller = make_controller(task.controller)
    out = run(workload, engine, controller, ControlInterval.parse(sc.interval))
    result: dict[str, Any] = {"metrics": out.metrics(), "workload": workload.name}
    if task.detail:
        tl = out.timeline.array()
        step = max(1, math.ceil(len(tl["time_s"]) / TIMELINE_POINTS))
        result["timeline"] = {k: v[::step].tolist() for k, v in tl.items()}
        itl = out.result.itl_s
        result["itl_ms_quantiles"] = (
            (np.percentile(itl, ITL_QUANTILES) * 1e3).tolist() if len(itl) else []
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
    """Mean and (population) standard deviation of each metric across seeds."""
    keys = [k for k, v in values[0].items() if isinstance(v, int | float)]
    arr = {k: np.array([float(m[k]) for m in values]) for k in keys}
    return {k: float(a.mean()) for k, a in arr.items()}, {k: float(a.std()) for k, a in arr.items()}


class Pool:
    """Runs functions in worker processes (inline with one worker), reporting completions."""

    def __init__(self, workers: int, on_done: Callable[[], None]) -> None:
        self.workers = workers
        self.on_done = on_done
        self.executor = ProcessPoolExecutor(workers) if workers > 1 else None

    def map(self, calls: Iterable[tuple[Callable[..., Any], tuple]]) -> list[Any]:
        """Results of ``fn(*args)`` for each ``(fn, args)``, in order."""
        if self.executor is None:
            out = []
            for fn, args in calls:
                out.append(fn(*args))
                self.on_done()
            return out
        futures: list[Future] = [self.executor.submit(fn, *args) for fn, args in calls]
        for f in futures:
            f.add_done_callback(lambda _f: self.on_done())
        return [f.result() for f in futures]

    def close(self) -> None:
        if self.executor is not None:
            self.executor.shutdown()


def default_workers() -> int:
    return os.cpu_count() or 1


def evaluate(
    scenarios: list[Scenario],
    controllers: list[str],
    seeds: list[int],
    *,
    capacity: CapacityTarget | None = None,
    workers: int | None = None,
    progress: bool = True,
    best_static_grid: tuple[int, ...] = BEST_STATIC_GRID,
) -> dict[str, Any]:
    """Run every controller on every scenario and seed; results as a JSON-ready dict."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    for spec in controllers:  # fail on a bad spec before starting any run
        if spec.split(":")[0] != BEST_STATIC:
            make_controller(spec)
    if any(sc.engine != "sim" for sc in scenarios):
        workers = 1  # one real engine at a time
    workers = workers or default_workers()
    start = time.perf_counter()
    bar = Progress(
        "[bold]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        disable=not progress,
    )
    with bar:
        ticker = bar.add_task("runs", total=0)
        pool = Pool(workers, lambda: bar.advance(ticker))
        try:
            resolved, grids = _resolve_best_static(
                pool, bar, ticker, scenarios, controllers, seeds, best_static_grid
            )
            runs = [
                (run_task, (Task(sc, resolved[sc.name][c], s, detail=(i == 0)),))
                for sc in scenarios
                for c in controllers
                for i, s in enumerate(seeds)
            ]
            caps = []
            if capacity is not None:
                caps = [
                    (capacity_search, (Task(sc, resolved[sc.name][c], s), capacity))
                    for sc in scenarios
                    for c in controllers
                    for s in seeds
                ]
            bar.update(ticker, total=len(runs) + len(caps), completed=0, description="runs")
            done = pool.map(runs + caps)
            run_out, cap_out = iter(done[: len(runs)]), iter(done[len(runs) :])
        finally:
            pool.close()
    scenario_results = []
    for sc in scenarios:
        results: dict[str, Any] = {}
        timelines, itls = {}, {}
        for c in controllers:
            per_seed = [next(run_out) for _ in seeds]
            mean, std = summarise([r["metrics"] for r in per_seed])
            entry: dict[str, Any] = {
                "spec": resolved[sc.name][c],
                "per_seed": [r["metrics"] for r in per_seed],
                "mean": mean,
                "std": std,
                "capacity": None,
            }
            if capacity is not None:
                found = [next(cap_out) for _ in seeds]
                rates = np.array([f["capacity"] for f in found])
                thr = np.array([f["output_throughput_at_capacity"] for f in found])
                entry["capacity"] = {
                    "per_seed": rates.tolist(),
                    "mean": float(rates.mean()),
                    "std": float(rates.std()),
                    "output_throughput_at_capacity": float(thr.mean()),
                    "output_throughput_at_capacity_std": float(thr.std()),
                    "bracketed": all(f["bracketed"] for f in found),
                    "probes": [
                        {"seed": s, **p}
                        for s, f in zip(seeds, found, strict=True)
                        for p in f["probes"]
                    ],
                }
            results[c] = entry
            timelines[c] = per_seed[0]["timeline"]
            itls[c] = per_seed[0]["itl_ms_quantiles"]
        scenario_results.append(
            {
                "name": sc.name,
                "scenario": asdict(sc),
                "workload": per_seed[0]["workload"],
                "results": results,
                "timelines": timelines,
                "itl_ms_quantiles": itls,
                "best_static": grids.get(sc.name),
                "capacity_target": None if capacity is None else asdict(capacity),
            }
        )
    return {
        "controllers": controllers,
        "seeds": seeds,
        "capacity_target": None if capacity is None else asdict(capacity),
        "scenarios": scenario_results,
        "workers": workers,
        "wall_s": time.perf_counter() - start,
    }


def _resolve_best_static(
    pool: Pool,
    bar: Any,
    ticker: Any,
    scenarios: list[Scenario],
    controllers: list[str],
    seeds: list[int],
    grid: tuple[int, ...],
) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, Any]]]:
    """Spec per scenario and controller with ``best-static`` replaced by the best static:N,
    and per scenario the grid's mean scores."""
    resolved = {sc.name: {c: c for c in controllers} for sc in scenarios}
    grids: dict[str, dict[str, Any]] = {}
    if BEST_STATIC not in controllers:
        return resolved, grids
    sizes = {}
    for sc in scenarios:
        cap = make_engine(
            sc.engine,
            profile=sc.profile,
            model=sc.model,
            slo=SLO(),
            engine_args=sc.engine_args,
            scheduler=sc.scheduler,
        ).max_num_seqs
        sizes[sc.name] = [g for g in grid if g <= cap]
    calls = [
        (run_task, (Task(sc, f"static:{n}", s),))
        for sc in scenarios
        for n in sizes[sc.name]
        for s in seeds
    ]
    bar.update(ticker, total=len(calls), description="best-static grid")
    results = iter(pool.map(calls))
    for sc in scenarios:
        scores = {
            n: float(np.mean([next(results)["metrics"][sc.score] for _ in seeds]))
            for n in sizes[sc.name]
        }
        top = max(scores.values())
        best = max(n for n, v in scores.items() if v >= top * (1 - TIE))
        resolved[sc.name][BEST_STATIC] = f"static:{best}"
        grids[sc.name] = {"score": sc.score, "best": best, "scores": scores}
    return resolved, grids
