"""The simulated engine's scheduling semantics on small hand-checked cases.

`unit_profile` makes every step last 1 s, so engine times count steps. Each case runs
with the closed-form decode fast path on and off: both must give the same answers.
"""

from __future__ import annotations

import pytest
from helpers import unit_profile

from batchpilot.envs.metrics import SLO
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import Request, Workload, WorkloadError

FAST = pytest.mark.parametrize("fast", [True, False], ids=["fast-forward", "per-step"])


def workload(*specs: tuple[float, int, int]) -> Workload:
    """Requests named r0, r1, ... from (arrival_s, prompt, output)."""
    return Workload.from_requests("t", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(specs)])


def records(engine: SimEngine) -> dict:
    return {r.request_id: r for r in engine.result().records}


@FAST
def test_admission_respects_the_cap(fast: bool) -> None:
    engine = SimEngine(unit_profile(), keep_records=True, fast_forward=fast)
    engine.reset(workload(*[(0.0, 4, 3)] * 5), Limits(2))
    t = engine.advance(max_iterations=1)
    assert (t.num_requests_running, t.num_requests_waiting) == (2, 3)
    assert t.step_prefill_tokens == 8
    engine.advance()
    recs = records(engine)
    # two at a time, three steps each (prefill + 2 decodes): finishes at 3, 3, 6, 6, 9
    assert sorted(r.finish_s for r in recs.values()) == [3, 3, 6, 6, 9]


@FAST
def test_token_budget_chunks_prefill(fast: bool) -> None:
    engine = SimEngine(unit_profile(budget=10), keep_records=True, fast_forward=fast)
    engine.reset(workload((0, 8, 2), (0, 8, 2), (0, 8, 2)), Limits(8))
    t = engine.advance(max_iterations=1)
    # r0 takes 8 tokens, r1 the 2 left (a chunk), r2 waits: no budget
    assert (t.step_prefill_tokens, t.num_requests_running, t.num_requests_waiting) == (10, 2, 1)
    t = engine.advance(max_iterations=1)
    # step 2: r0 decodes its last token (1), r1 finishes its prompt (6), r2 gets the 3 left
    assert (t.step_decode_tokens, t.step_prefill_tokens) == (1, 9)
    assert (t.num_requests_running, t.interval_finished) == (2, 1)
    engine.advance()
    recs = records(engine)
    assert recs["r0"].first_token_s == 1 and recs["r1"].first_token_s == 2
    assert recs["r2"].first_token_s == 3  # 3 tokens at step 2, the other 5 at step 3


@FAST
def test_blocks_are_allocated_on_demand(fast: bool) -> None:
    engine = SimEngine(unit_profile(num_gpu_blocks=11), keep_records=True, fast_forward=fast)  # 10 usable
    engine.reset(workload((0, 5, 6)), Limits(4))
    free = []
    while not engine.done:
        free.append(engine.advance(max_iterations=1).num_free_blocks)
    # tokens with KV after step k: 5, 6, 7, 8, 9, 10 -> blocks 2, 2, 2, 2, 3, 3; freed at the end
    assert free == [8, 8, 8, 8, 7, 10]


@FAST
def test_preemption_evicts_the_latest_admitted_and_recomputes(fast: bool) -> None:
    engine = SimEngine(unit_profile(num_gpu_blocks=5), keep_records=True, fast_forward=fast)  # 4 usable blocks
    engine.reset(workload((0, 4, 10), (0, 4, 10)), Limits(8))
    t = engine.advance(max_iterations=5)
    assert (t.num_free_blocks, t.interval_preemptions) == (0, 0)
    t = engine.advance(max_iterations=1)  # r0 needs a 3rd block: r1 (admitted last) goes
    assert t.interval_preemptions == 1
    assert (t.num_requests_running, t.num_requests_waiting) == (1, 1)
    t = engine.advance(max_iterations=4)  # r1 needs 9 tokens = 3 blocks; only 1 free
    assert (t.num_requests_running, t.num_requests_waiting) == (0, 1)
    t = engine.advance(max_iterations=1)
    assert t.step_prefill_tokens == 9  # prompt 4 + 5 generated tokens, recomputed
    engine.advance()
    recs = records(engine)
    assert recs["r0"].finish_s == 10 and recs["r0"].num_preemptions == 0
    assert recs["r1"].num_preemptions == 1 and recs["r1"].recomputed_tokens == 8
    assert recs["r1"].finish_s == 15
    assert recs["r1"].max_itl_s == 6  # last token before eviction at 5, next at 11
    result = engine.result()
    assert result.metrics()["num_preemptions"] == 1
    assert result.metrics()["recomputed_tokens"] == 8


@FAST
def test_lowering_the_cap_drains_without_preempting(fast: bool) -> None:
    engine = SimEngine(unit_profile(), keep_records=True, fast_forward=fast)
    engine.reset(workload(*[(0, 4, 5)] * 4, (0.5, 4, 2)), Limits(4))
    t = engine.advance(max_iterations=1)
    assert t.num_requests_running == 4 and t.num_requests_waiting == 0
    engine.set_limits(Limits(1))
    t = engine.advance(max_iterations=2)
    assert (t.num_requests_running, t.num_requests_waiting, t.interval_preemptions) == (4, 1, 0)
    engine.advance()
    recs = records(engine)
    assert [recs[f"r{i}"].finish_s for i in range(4)] == [5, 5, 5, 5]
    assert recs["r4"].first_token_s == 6  # admitted only once the batch has drained
    assert engine.result().metrics()["num_preemptions"] == 0


@FAST
def test_latency_definitions(fast: bool) -> None:
    engine = SimEngine(unit_profile(), keep_records=True, slo=SLO(ttft_ms=1500, tpot_ms=1000), fast_forward=fast)
    engine.reset(workload((0, 4, 3), (0.5, 4, 1)), Limits(1))
    engine.advance()
    recs = records(engine)
    r0, r1 = recs["r0"], recs["r1"]
    assert (r0.ttft_s, r0.tpot_s, r0.e2el_s) == (1, 1, 3)
    assert (r1.ttft_s, r1.e2el_s, r1.tpot_s) == (3.5, 3.5, 0)
    m = engine.result().metrics()
    assert m["completed"] == 2 and m["duration"] == 4
    assert m["output_throughput"] == pytest.approx(4 / 4)
    assert m["request_goodput"] == pytest.approx(1 / 4)  # r1 misses the TTFT SLO
    assert m["median_itl_ms"] == pytest.approx(1000)
    assert m["mean_ttft_ms"] == pytest.approx((1 + 3.5) / 2 * 1e3)


def test_request_larger_than_the_cache_is_rejected() -> None:
    engine = SimEngine(unit_profile(num_gpu_blocks=3), keep_records=True)  # 2 usable blocks = 8 tokens
    with pytest.raises(WorkloadError, match="r0 needs 9 tokens of KV cache"):
        engine.reset(workload((0, 5, 4)), Limits(1))


def test_idle_engine_jumps_to_the_next_arrival() -> None:
    engine = SimEngine(unit_profile(), keep_records=True)
    engine.reset(workload((10.0, 4, 2)), Limits(1))
    t = engine.advance(until_s=5.0)
    assert (t.time_s, t.iteration) == (5.0, 0)
    engine.advance()
    assert records(engine)["r0"].first_token_s == 11


@FAST
def test_a_waiting_request_is_admitted_when_its_whole_sequence_fits(fast: bool) -> None:
    """vLLM 0.32's scheduler_reserve_full_isl (on by default): the simulator admitted r1 when
    its first chunk's 2 blocks were free, then preempted it a step later for want of the rest;
    vLLM waits until all 4 of its blocks are free, and preempts nothing."""
    engine = SimEngine(
        unit_profile(num_gpu_blocks=11, block_size=16, budget=64), keep_records=True,
        fast_forward=fast,
    )  # fmt: skip
    engine.reset(workload((0, 100, 20), (0, 60, 5)), Limits(8))
    assert engine.advance(max_iterations=1).step_prefill_tokens == 64  # r0's first chunk
    t = engine.advance(max_iterations=1)  # r0's last 36; 3 blocks free, r1 needs 4
    assert (t.step_prefill_tokens, t.num_requests_running, t.num_requests_waiting) == (36, 1, 1)
    engine.advance()
    assert engine.result().metrics()["num_preemptions"] == 0
    recs = records(engine)
    assert recs["r0"].finish_s == 21  # its first token at 2, 19 decodes
    assert recs["r1"].first_token_s == 22  # its whole prompt in the step after
