"""The simulator's vLLM V0 scheduling (`scheduler="v0"`) on small hand-checked cases.

`unit_profile` makes every step last 1 s, so engine times count steps. Each case runs
with the closed-form decode fast path on and off: both must give the same answers.
"""

from __future__ import annotations

import pytest
from helpers import unit_profile

from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import Request, Workload

FAST = pytest.mark.parametrize("fast", [True, False], ids=["fast-forward", "per-step"])


def workload(*specs: tuple[float, int, int]) -> Workload:
    """Requests named r0, r1, ... from (arrival_s, prompt, output)."""
    return Workload.from_requests("t", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(specs)])


def steps(engine: SimEngine) -> list[tuple[int, int, int, int]]:
    """(prefill tokens, decode requests, running, waiting) after each iteration to the end."""
    out = []
    while not engine.done:
        t = engine.advance(max_iterations=1)
        out.append(
            (
                t.step_prefill_tokens,
                t.step_decode_tokens,
                t.num_requests_running,
                t.num_requests_waiting,
            )
        )
    return out


def test_unknown_scheduler_is_refused() -> None:
    with pytest.raises(ValueError, match="scheduler must be one of v1, v0"):
        SimEngine(unit_profile(), keep_records=True, scheduler="v2")


@FAST
def test_a_new_arrival_stalls_the_decodes(fast: bool) -> None:
    w = workload((0, 4, 5), (2.5, 4, 2))
    v0 = SimEngine(unit_profile(), keep_records=True, fast_forward=fast, scheduler="v0")
    v0.reset(w, Limits(8))
    # r0: prefill at step 1, decodes at 2 and 3; r1 arrives at 2.5 and is prefilled
    # alone in step 4 (r0 waits), then both decode
    assert steps(v0) == [(4, 0, 1, 0), (0, 1, 1, 0), (0, 1, 1, 0), (4, 0, 2, 0), (0, 2, 1, 0),
                         (0, 1, 0, 0)]  # fmt: skip
    v1 = SimEngine(unit_profile(), keep_records=True, fast_forward=fast)
    v1.reset(w, Limits(8))
    assert (4, 1, 2, 0) in steps(v1)  # V1 runs the prefill beside r0's decode


@FAST
def test_whole_prompts_within_the_budget_first_come_first_served(fast: bool) -> None:
    engine = SimEngine(unit_profile(budget=10), keep_records=True, fast_forward=fast, scheduler="v0")
    engine.reset(workload((0, 6, 2), (0, 3, 2), (0, 8, 2), (0, 1, 2)), Limits(8))
    trace = steps(engine)
    # step 1: r0 and r1 (9 tokens); r2's 8 do not fit what is left and r3 waits behind it
    assert trace[0] == (9, 0, 2, 2)
    assert trace[1] == (9, 0, 4, 0)  # no decode while r2 and r3 can be prefilled
    assert trace[2][:2] == (0, 4)


@FAST
def test_a_prompt_longer_than_the_budget_runs_alone_unchunked(fast: bool) -> None:
    engine = SimEngine(unit_profile(budget=10), keep_records=True, fast_forward=fast, scheduler="v0")
    engine.reset(workload((0, 25, 2), (0, 3, 2)), Limits(8))
    trace = steps(engine)
    assert trace[:2] == [(25, 0, 1, 1), (3, 0, 2, 0)]


@FAST
def test_running_cap_counts_running_requests(fast: bool) -> None:
    engine = SimEngine(unit_profile(), keep_records=True, fast_forward=fast, scheduler="v0")
    engine.reset(workload(*[(0.0, 4, 3)] * 5), Limits(2))
    trace = steps(engine)
    assert trace[0] == (8, 0, 2, 3)
    assert max(running for *_, running, _ in trace) == 2
    # two at a time, three steps each (prefill + 2 decodes): finishes at 3, 3, 6, 6, 9
    assert sorted(r.finish_s for r in engine.result().records) == [3, 3, 6, 6, 9]


@FAST
def test_preemption_evicts_the_latest_arrival_and_recomputes_whole(fast: bool) -> None:
    engine = SimEngine(unit_profile(num_gpu_blocks=5), keep_records=True, fast_forward=fast, scheduler="v0")
    engine.reset(workload((0, 4, 10), (0.5, 4, 10)), Limits(8))
    trace = steps(engine)
    # r0 prefills (1 block), r1 arrives and prefills (1 block), both decode until the 4
    # usable blocks run out; then r1, the later arrival, is preempted and r0 decodes on
    assert trace[:2] == [(4, 0, 1, 0), (4, 0, 2, 0)]
    recs = {r.request_id: r for r in engine.result().records}
    assert recs["r1"].num_preemptions >= 1 and recs["r0"].num_preemptions == 0
    # r1 comes back as one prefill of its prompt and the outputs it had: no chunks
    recompute = [p for p, *_ in trace[2:] if p]
    assert recompute and all(p > 4 for p in recompute)


def test_watermark_keeps_one_percent_of_blocks_free_at_admission() -> None:
    profile = unit_profile(num_gpu_blocks=301, budget=2000)  # 300 usable, watermark 3
    engine = SimEngine(profile, scheduler="v0")
    engine.reset(workload((0, 4 * 297 - 1, 1), (0, 4, 1)), Limits(8))
    t = engine.advance(max_iterations=1)
    # r0 takes 297 blocks and leaves the 3 of the watermark; r1's 1 block would cut into it
    assert (t.step_prefill_tokens, t.num_requests_waiting) == (4 * 297 - 1, 1)
    with pytest.raises(ValueError):  # 298 blocks can never be admitted above the watermark
        SimEngine(profile, scheduler="v0").reset(workload((0, 4 * 298 - 1, 1)), Limits(8))
    SimEngine(profile).reset(workload((0, 4 * 298 - 1, 1)), Limits(8))  # V1 has no watermark


def test_engines_and_the_simulate_command_take_the_scheduler(tmp_path) -> None:
    import json

    from batchpilot.envs.engines import make_engine
    from batchpilot.envs.metrics import SLO
    from batchpilot.training.cli import main

    assert make_engine("sim", profile="llama-7b-a100", slo=SLO(), scheduler="v0").scheduler == "v0"
    with pytest.raises(ValueError, match="simulated only"):
        make_engine("vllm", profile="", model="m", slo=SLO(), scheduler="v0")
    medians = {}
    for scheduler in ("v1", "v0"):
        out = tmp_path / f"{scheduler}.json"
        argv = ["simulate", "--workload", "fixed:1024:64@poisson:20",
                "--num-requests", "60", "--scheduler", scheduler, "--json", str(out),
                "--no-progress"]  # fmt: skip
        assert main(argv) == 0
        medians[scheduler] = json.loads(out.read_text())["metrics"]["median_ttft_ms"]
    # V0 prefills new arrivals at once (decodes stall); V1 shares steps with decodes
    assert medians["v0"] < medians["v1"]


def test_the_gymnasium_env_passes_the_scheduler_to_the_simulator() -> None:
    from batchpilot.envs.batching_env import BatchingEnv

    env = BatchingEnv(engine_kwargs={"scheduler": "v0"})
    env.reset(seed=0)
    assert env._engine.scheduler == "v0"
