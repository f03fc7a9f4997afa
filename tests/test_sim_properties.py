"""Property tests: KV blocks never over-allocated; every request finishes once, in full."""

from __future__ import annotations

import pytest
from helpers import unit_profile
from hypothesis import given, settings
from hypothesis import strategies as st

from batchpilot.envs.profiles import NULL_BLOCKS, EngineProfile, LinearStepModel
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import Request, Workload

requests = st.lists(
    st.tuples(
        st.floats(0, 20, allow_nan=False), st.integers(1, 40), st.integers(1, 30)
    ),
    min_size=1,
    max_size=25,
)
limits = st.lists(st.tuples(st.integers(1, 12), st.integers(1, 64)), min_size=1, max_size=30)


BLOCK = 4


def _timed_profile(blocks: int, budget: int) -> EngineProfile:
    """A profile with a non-trivial step-time model (so the fast path's sums matter)."""
    return EngineProfile(
        name="prop",
        description="property-test profile",
        block_size=BLOCK,
        num_gpu_blocks=blocks,
        max_model_len=4096,
        max_num_seqs=64,
        max_num_batched_tokens=budget,
        step=LinearStepModel(base_s=0.01, prefill_token_s=1e-3, decode_seq_s=2e-3, kv_token_s=1e-4),
    )


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
@settings(max_examples=60, deadline=None)
@given(requests, limits, st.integers(20, 60), st.sampled_from([1, 3]))
def test_blocks_bounded_and_every_request_finishes_once(
    scheduler, reqs, lims, blocks, per
) -> None:
    work = Workload.from_requests("p", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(reqs)])
    results = []
    for fast in (True, False):
        engine = SimEngine(_timed_profile(blocks, budget=32), fast_forward=fast, scheduler=scheduler, keep_records=True)
        t = engine.reset(work, Limits(8))
        i = 0
        while not engine.done:
            n, budget = lims[i % len(lims)]
            engine.set_limits(Limits(n, budget))
            before = t.num_requests_running
            t = engine.advance(max_iterations=per)
            i += 1
            assert (t.max_num_seqs, t.max_num_batched_tokens) == (n, min(budget, 32))
            # admission never passes the limit; a batch above a lowered limit only drains
            assert t.num_requests_running <= max(n, before)
            # blocks in use are held by running requests, none beyond the tokens each holds
            used = t.num_total_blocks - NULL_BLOCKS - t.num_free_blocks
            held = sum(-(-tokens // BLOCK) for tokens, _ in engine.remaining_output_tokens())
            assert 0 <= used <= held
        result = engine.result()
        ids = [r.request_id for r in result.records]
        assert sorted(ids) == sorted(r.request_id for r in work.requests)  # each exactly once
        want = {r.request_id: r.output_tokens for r in work.requests}
        assert all(r.output_tokens == want[r.request_id] for r in result.records)
        assert all(r.finish_s >= r.first_token_s >= r.arrival_s for r in result.records)
        assert t.num_free_blocks == t.num_total_blocks - NULL_BLOCKS  # all freed at the end
        # one inter-token latency per token after the first
        assert result.stats.itl.n == sum(o - 1 for o in want.values())
        results.append(result.metrics())
    fast, slow = results
    assert fast == pytest.approx(slow, rel=1e-9)  # closed-form decode runs change nothing


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
@settings(max_examples=40, deadline=None)
@given(requests, st.integers(1, 6))
def test_running_never_exceeds_a_fixed_cap(scheduler, reqs, cap) -> None:
    work = Workload.from_requests("p", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(reqs)])
    engine = SimEngine(unit_profile(num_gpu_blocks=200), scheduler=scheduler)
    engine.reset(work, Limits(cap))
    while not engine.done:
        assert engine.advance(max_iterations=1).num_requests_running <= cap


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
@settings(max_examples=40, deadline=None)
@given(requests, st.integers(20, 60), st.sampled_from([0.05, 0.3]))
def test_fast_path_reports_what_stepping_reports_at_time_boundaries(
    scheduler, reqs, blocks, interval
) -> None:
    """A controller that reads the queue sees the same telemetry either way: arrivals during a
    closed-form decode run are queued as stepping queues them (before each iteration)."""
    work = Workload.from_requests("p", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(reqs)])
    seen, results = [], []
    for fast in (True, False):
        engine = SimEngine(_timed_profile(blocks, budget=32), fast_forward=fast, scheduler=scheduler)
        t = engine.reset(work, Limits(8))
        trace = []
        while not engine.done:
            engine.set_limits(Limits(1 + t.num_requests_waiting % 7))  # depends on the queue
            t = engine.advance(until_s=engine.clock_s + interval)
            trace.append((t.num_requests_waiting, t.num_requests_running, t.num_free_blocks))
        seen.append(trace)
        results.append(engine.result().metrics())
    assert seen[0] == seen[1]
    assert results[0] == pytest.approx(results[1], rel=1e-9)
