"""Memory grows with the work in flight, not with a run's length: a workload holds its
requests as columns and the simulated engine makes each request's objects when it arrives."""

from __future__ import annotations

import tracemalloc

from batchpilot.agents.specs import make_controller
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload


def _traced_bytes(num_requests: int) -> tuple[int, int]:
    """(bytes the workload holds, bytes the engine and the run's output hold beyond it) for
    a light load of `num_requests` short requests, a few in flight at a time."""
    profile = get_profile("llama-7b-a100")
    tracemalloc.start()
    try:
        workload = make_workload(
            "fixed:16:4",
            "poisson:200",
            num_requests=num_requests,
            max_model_len=profile.max_model_len,
        )
        held = tracemalloc.get_traced_memory()[0]
        engine = SimEngine(profile)
        out = run(workload, engine, make_controller("static:64"), ControlInterval.parse("5s"))
        kept = tracemalloc.get_traced_memory()[0] - held
    finally:
        tracemalloc.stop()
    assert out.result.unfinished == 0 and engine.done
    return held, kept


def test_a_longer_run_costs_its_workloads_columns_and_nothing_more() -> None:
    _traced_bytes(100)  # imports and caches first
    (held_short, kept_short), (held_long, kept_long) = _traced_bytes(20_000), _traced_bytes(40_000)
    extra = 20_000
    # a request as four 8-byte columns (arrival, prompt, output, id); as Python objects
    # it took about 150 bytes
    assert (held_long - held_short) / extra <= 40
    # the engine keeps no per-request state for requests not in flight (a tuple of the
    # workload's requests alone was 8 bytes a request)
    assert (kept_long - kept_short) / extra < 2
