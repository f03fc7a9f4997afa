"""The Gymnasium environment: checkers, determinism, both knobs, the goodput credit,
observation parity with the deployed controller, bad arguments."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import batchpilot.envs
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID
from batchpilot.envs.batching_env import OBSERVATION_FIELDS
from batchpilot.envs.telemetry import Limits

SMALL = {"source": "embedded:azure-conv", "num_requests": 60}


def make(**kwargs) -> gym.Env:
    return gym.make(batchpilot.envs.ENV_ID, **({"workload": SMALL} | kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"action_mode": "step"}, {"control_interval_iters": 8, "control_interval_s": None}],
)
def test_passes_gymnasium_and_sb3_checkers(kwargs: dict) -> None:
    env = make(**kwargs)
    check_env(env.unwrapped)
    sb3_check_env(env.unwrapped)


def rollout(seed: int, **kwargs) -> tuple[list[float], np.ndarray]:
    env = make(**kwargs)
    obs, _ = env.reset(seed=seed)
    env.action_space.seed(seed)
    rewards = []
    done = False
    while not done:
        obs, reward, terminated, truncated, _ = env.step(env.action_space.sample())
        rewards.append(reward)
        done = terminated or truncated
    return rewards, obs


def test_deterministic_for_a_seed() -> None:
    a, obs_a = rollout(3)
    b, obs_b = rollout(3)
    c, _ = rollout(4)
    assert a == b and np.array_equal(obs_a, obs_b)
    assert a != c


def test_episode_runs_the_workload_to_the_end() -> None:
    env = make()
    obs, info = env.reset(seed=0)
    assert obs.shape == (len(OBSERVATION_FIELDS),)
    assert info["profile"] == "llama-7b-a100"
    finished = 0
    terminated = False
    while not terminated:
        _, _, terminated, truncated, info = env.step(np.array([9, 5]))
        finished += info["interval_finished"]
        assert not truncated
    assert finished == 60
    assert env.unwrapped.engine.result().metrics()["completed"] == 60


def test_actions_set_both_knobs_on_log_grids() -> None:
    env = make()
    env.reset(seed=0)
    engine = env.unwrapped.engine
    _, _, _, _, info = env.step(np.array([3, 2]))
    assert (info["max_num_seqs"], info["max_num_batched_tokens"]) == (SEQ_GRID[3], BUDGET_GRID[2])
    _, _, _, _, info = env.step(np.array([len(SEQ_GRID) - 1, len(BUDGET_GRID) - 1]))
    assert info["max_num_seqs"] == min(SEQ_GRID[-1], engine.max_num_seqs)  # no rule's cap
    assert info["max_num_batched_tokens"] == min(BUDGET_GRID[-1], engine.max_num_batched_tokens)
    step = make(action_mode="step")
    step.reset(seed=0)
    _, _, _, _, a = step.step(np.array([0, 1]))  # one grid step down, budget kept
    _, _, _, _, b = step.step(np.array([0, 0]))  # down again, budget one step down
    assert b["max_num_seqs"] < a["max_num_seqs"]
    assert b["max_num_batched_tokens"] < a["max_num_batched_tokens"]
    assert SEQ_GRID.index(a["max_num_seqs"]) - SEQ_GRID.index(b["max_num_seqs"]) == 1


@pytest.mark.parametrize(
    ("mode", "action"),
    [("grid", [100, 100]), ("grid", [-1, 0]), ("grid", [3.9, 2.2]), ("step", [3, 1]), ("grid", [np.nan, 0]),
     ("grid", [1j, 0]), ("step", ["a", 0])],  # a bare TypeError
)
def test_an_action_outside_the_space_is_refused(mode: str, action: list) -> None:
    """Out of range or fractional: an agent meant for another space (they were clamped and
    truncated, silently)."""
    env = make(action_mode=mode)
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"outside the action space|2 finite entries"):
        env.step(np.array(action))


def test_render_mode_and_reset_options_are_gymnasiums() -> None:
    """No render mode (a TypeError, on which SB3's make_vec_env, passing "rgb_array", drops
    it: a ValueError stopped it); no reset options, unknown ones named; no step cap from the
    registration: an episode ends with its workload."""
    from stable_baselines3.common.env_util import make_vec_env

    vec = make_vec_env("batchpilot/Batching-v0", n_envs=2)
    assert vec.reset().shape == (2, len(OBSERVATION_FIELDS))
    vec.close()
    env = gym.make("batchpilot/Batching-v0", render_mode=None)
    assert env.unwrapped.render() is None
    assert env.spec.max_episode_steps is None
    env.reset(seed=0, options={})
    with pytest.raises(ValueError, match=r"reset options \['profile'\]: this env takes none"):
        env.reset(options={"profile": "llama-7b-a100"})
    with pytest.raises(TypeError, match="render_mode 'human': this env renders nothing"):
        gym.make("batchpilot/Batching-v0", render_mode="human")
    with pytest.raises(ValueError, match="reset options must be a dict or None, got 5"):
        env.reset(options=5)  # was a TypeError from sorted()


def test_a_step_after_the_episode_ended_is_refused() -> None:
    """It returned reward 0 and terminated again, for ever: made-up transitions."""
    env = gym.make(
        "batchpilot/Batching-v0",
        workload={"source": "embedded:gsm8k", "num_requests": 5, "arrival": "poisson:2"},
        disable_env_checker=True,
    )
    env.reset(seed=0)
    while not env.step(env.action_space.sample())[2]:
        pass
    with pytest.raises(RuntimeError, match=r"the episode has ended \(terminated\): call reset"):
        env.step(env.action_space.sample())
    env.reset(seed=1)
    env.step(env.action_space.sample())


def test_reward_credit_sums_to_goodput_and_recompute_is_priced() -> None:
    """The dense credit telescopes: over an episode it is the good tokens exactly."""
    env = make(
        workload={"source": "embedded:sharegpt", "arrival": "all-at-once", "num_requests": 300},
        slo="tpot:100",
        max_episode_steps=100_000,
    )
    _, start = env.reset(seed=1)
    unit = start["offered_output_tps"]
    assert unit > 0
    credit = recompute = 0.0
    recomputed = 0
    terminated = False
    while not terminated:  # the largest limits: the KV cache overflows
        _, _, terminated, truncated, info = env.step(np.array([len(SEQ_GRID) - 1, 5]))
        credit += info["reward_credit"]
        recompute += info["reward_recompute"]
        recomputed += info["interval_recomputed_tokens"]
        assert not truncated
    m = info["episode_metrics"]
    good = m["output_goodput"] * m["duration"]
    assert 0 < good < m["total_output_tokens"]
    assert credit * unit == pytest.approx(good)
    assert recomputed > 0
    assert recompute == pytest.approx(-0.5 * recomputed / unit)


def test_lost_debit_sums_to_the_output_lost_and_charges_a_starved_queue_early() -> None:
    """With `w_lost`, each request missing the SLO is debited its whole output once over
    the episode, and a queued request is charged as soon as its TTFT deadline (2 s) passes,
    long before it finishes."""
    env = make(
        workload={"source": "embedded:sharegpt", "arrival": "poisson:20", "num_requests": 200},
        w_lost=0.5,
        max_episode_steps=100_000,
    )
    _, start = env.reset(seed=2)
    unit = start["offered_output_tps"]
    requests = env.unwrapped.workload.requests
    arrival = np.array([r.arrival_s for r in requests])
    output = np.array([r.output_tokens for r in requests])
    lost, finished_bad = 0.0, 0
    terminated = False
    while not terminated:  # max_num_seqs 1: the queue grows past its TTFT deadline
        _, _, terminated, _, info = env.step(np.array([0, len(BUDGET_GRID) - 1]))
        lost += info["reward_lost"] * unit
        finished_bad += info["interval_bad_output_tokens"]
        if info["time_s"] <= 5:  # nothing lost has finished; all past the deadline is charged
            late = output[arrival < info["time_s"] - 2].sum()  # less the one being served
            assert finished_bad == 0 and -0.5 * late <= lost <= -0.5 * (late - output.max())
    m = info["episode_metrics"]
    bad = m["total_output_tokens"] - m["output_goodput"] * m["duration"]
    assert finished_bad == pytest.approx(bad) and bad > 0.5 * output.sum()
    assert lost == pytest.approx(-0.5 * bad)
    env = make(workload={"source": "embedded:sharegpt", "arrival": "poisson:20", "num_requests": 200})
    env.reset(seed=2)
    for _ in range(8):
        _, _, _, _, info = env.step(np.array([0, len(BUDGET_GRID) - 1]))
    assert info["inflight_off_track_output_tokens"] > 0 and info["reward_lost"] == 0.0


def test_workload_and_profile_mixes_are_sampled_per_episode() -> None:
    env = make(
        profile=["llama-7b-a100", "llama3-70b-8xa100"],
        workload=[SMALL, {"source": "embedded:gsm8k", "arrival": "poisson:5", "num_requests": 30, "rate_scale": [0.5, 2.0]}],
    )
    seen = {(info["profile"], info["workload"].split(" ")[0]) for info in (env.reset(seed=s)[1] for s in range(12))}
    assert len(seen) >= 3


def test_workload_weights_set_how_often_each_is_drawn() -> None:
    heavy = {"source": "embedded:gsm8k", "arrival": "poisson:5", "num_requests": 30, "weight": 9}
    env = make(workload=[SMALL, heavy])
    names = [env.reset(seed=s)[1]["workload"] for s in range(200)]
    share = sum(name.startswith("gsm8k") for name in names) / len(names)
    assert 0.8 < share < 0.97  # 0.9 expected; equal weights would give 0.5


def test_profile_weights_set_how_often_each_is_drawn() -> None:
    env = make(profile={"llama-7b-a100": 1, "llama3-70b-8xa100": 9})
    names = [env.reset(seed=s)[1]["profile"] for s in range(200)]
    share = names.count("llama3-70b-8xa100") / len(names)
    assert 0.8 < share < 0.97  # 0.9 expected; equal weights would give 0.5


def test_rate_scale_applies_to_every_arrival_process_and_follows_the_step_time() -> None:
    def span(**kwargs) -> float:
        env = make(profile="llama-2-7b-a100", **kwargs)
        env.reset(seed=0)
        return env.unwrapped.workload.requests[-1].arrival_s

    spec = SMALL | {"arrival": "poisson:4"}
    base = span(workload=spec)
    assert span(workload=spec | {"rate_scale": [2, 2]}) == pytest.approx(base / 2)
    assert span(workload=spec, step_time_scale=[2, 2]) == pytest.approx(base * 2)  # same load
    for arrival in ("steps:4@0,8@5", "ramp:2:6"):  # rates that change at fixed times
        spec = SMALL | {"arrival": arrival}
        base = span(workload=spec)
        assert span(workload=spec | {"rate_scale": [2, 2]}) < 0.8 * base
        assert span(workload=spec, step_time_scale=[2, 2]) > 1.25 * base


def test_profile_and_prompt_randomisation_is_drawn_per_episode() -> None:
    from batchpilot.envs.batching_env import WorkloadSpec
    from batchpilot.envs.profiles import get_profile

    base = get_profile("llama-2-7b-a100")
    env = make(profile=base.name, step_time_scale=[0.8, 1.25], kv_scale=[0.2, 0.5])
    scales = set()
    for seed in range(5):
        _, info = env.reset(seed=seed)
        engine = env.unwrapped.engine
        assert 0.8 <= info["step_time_scale"] <= 1.25 and 0.2 <= info["kv_scale"] <= 0.5
        assert engine.profile.num_gpu_blocks == round(base.num_gpu_blocks * info["kv_scale"])
        decode = (0, 0, 0, 0, 16, 16000)
        assert engine.profile.step.time(*decode) == pytest.approx(
            info["step_time_scale"] * base.step.time(*decode)
        )
        scales.add(info["kv_scale"])
    assert len(scales) == 5
    _, info = make(profile=base.name).reset(seed=0)
    assert info["step_time_scale"] == info["kv_scale"] == 1.0
    env = make(profile=[base.name, "llama-7b-a100"], kv_scale={base.name: [0.2, 0.5]})
    infos = [env.reset(seed=s)[1] for s in range(12)]
    assert {i["profile"] for i in infos} == {base.name, "llama-7b-a100"}
    assert all((0.2 <= i["kv_scale"] <= 0.5) == (i["profile"] == base.name) for i in infos)

    mml = base.max_model_len
    plain = WorkloadSpec.coerce(SMALL).draw(np.random.default_rng(3), mml)
    longer = WorkloadSpec.coerce(SMALL | {"prompt_scale": [2.0, 3.0]}).draw(np.random.default_rng(3), mml)
    pairs = [(a.prompt_tokens, b.prompt_tokens) for a, b in zip(plain.requests, longer.requests, strict=True)]
    a, b = max(p for p in pairs if p[1] < mml - 1)  # one factor per episode, drawn in range
    f = b / a
    assert 2.0 - 1e-3 <= f <= 3.0 + 1e-3
    assert all(abs(b - min(a * f, mml - 1)) <= 1 for a, b in pairs)
    assert any(b == mml - 1 for _, b in pairs)  # cut to fit the context
    assert all(r.prompt_tokens + r.output_tokens <= mml for r in longer.requests)


def test_knee_scale_moves_the_decode_knee_only() -> None:
    """The linear layers' cost curve read at counts / factor: a step of 2N tokens on the
    stretched profile costs what N cost before, plus the unstretched attention."""
    from batchpilot.envs.profiles import get_profile

    base = get_profile("llama-2-7b-a100")
    env = make(profile=base.name, knee_scale=[1.5, 3.0])
    knees = set()
    for seed in range(4):
        _, info = env.reset(seed=seed)
        k, step = info["knee_scale"], env.unwrapped.engine.profile.step
        assert 1.5 <= k <= 3.0 and info["step_time_scale"] == info["kv_scale"] == 1.0
        for n in (1, 64, 512, 2048):
            stretched, plain = step.time(1, n, 0, 0, 0, 0), base.step.time(1, n / k, 0, 0, 0, 0)
            attention = base.step.attn_prefill_token_s * (n - n / k)
            assert stretched == pytest.approx(plain + attention, rel=1e-6)
        assert step.time(0, 0, 0, 0, 1, 100) == pytest.approx(base.step.time(0, 0, 0, 0, 1, 100), rel=0.01)
        knees.add(k)
    assert len(knees) == 4
    h100, a100 = get_profile("llama-2-7b-h100").step, base.scaled(0.67, 1.0, 2.54).step
    for counts in ((0, 8, 0, 0, 8, 4800), (1, 2048, 2048, 2048**2 // 2, 0, 0)):
        assert a100.time(*counts) == pytest.approx(h100.time(*counts), rel=0.1)  # an H100, near enough
    linear = get_profile("llama-7b-a100").step
    assert linear.stretched(2).time(1, 200, 0, 0, 0, 0) < linear.time(1, 200, 0, 0, 0, 0)


def test_two_profiles_of_one_name_are_refused(tmp_path) -> None:
    """Two profile files of one name: the first's workloads and scales applied to both,
    unsaid."""
    from dataclasses import replace

    from batchpilot.envs.profiles import get_profile, write_profile

    tiny = get_profile("cpu-tiny-llama")
    write_profile(replace(tiny, name="mine"), tmp_path / "a.json")
    write_profile(replace(tiny, name="mine", num_gpu_blocks=tiny.num_gpu_blocks + 1), tmp_path / "b.json")
    paths = [str(tmp_path / "a.json"), str(tmp_path / "b.json")]
    with pytest.raises(ValueError, match=r"profiles \['.*a.json', '.*b.json'\] are all named 'mine'"):
        gym.make("batchpilot/Batching-v0", profile=paths, workload=SMALL)


def test_a_profile_file_may_not_take_a_shipped_profiles_name(tmp_path) -> None:
    """A file named as a shipped profile but describing another deployment ran, and its
    results were labelled as the shipped one's; it is refused on writing and on reading. A
    shipped profile written out as it is loads back."""
    import json
    from dataclasses import replace

    from batchpilot.envs.profiles import get_profile, write_profile

    other = replace(get_profile("cpu-tiny-llama"), name="llama-2-7b-a100")
    message = "name 'llama-2-7b-a100' is a shipped profile's, but this profile is another deployment"
    with pytest.raises(ValueError, match=f"{message}.*; nothing written"):
        write_profile(other, tmp_path / "mine.json")
    assert not (tmp_path / "mine.json").exists()
    (tmp_path / "mine.json").write_text(other.to_json())  # made by hand
    with pytest.raises(ValueError, match=f"mine.json: {message}"):
        get_profile(str(tmp_path / "mine.json"))
    write_profile(get_profile("llama-2-7b-a100"), tmp_path / "same.json")
    assert get_profile(str(tmp_path / "same.json")) == get_profile("llama-2-7b-a100")
    # rebuilt from the same tables, a profile differs by rounding (1e-13): it still loads
    data = json.loads(get_profile("llama-2-7b-a100").to_json())
    times = data["step"]["attn_base_s"]
    for factor, loads in ((1 + 1e-12, True), (1 + 1e-6, False)):
        data["step"]["attn_base_s"] = times * factor
        (tmp_path / "near.json").write_text(json.dumps(data))
        if loads:
            assert get_profile(str(tmp_path / "near.json")).name == "llama-2-7b-a100"
        else:
            with pytest.raises(ValueError, match=message):
                get_profile(str(tmp_path / "near.json"))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"knee_scale": [0, 2]}, r"knee_scale must be 0 < lo <= hi"),
        ({"engine": "vllm", "model": "m", "knee_scale": [1, 2]}, "vary the simulator's episodes only"),
        ({"kv_scale": [0.5, 0.2]}, r"kv_scale must be 0 < lo <= hi < inf, got \[0.5, 0.2\]"),
        ({"step_time_scale": "fast"}, "step_time_scale must be \\[lo, hi\\] \\(two numbers\\), got 'fast'"),
        ({"kv_scale": {"llama-2-7b-a40": [0.5, 1]}}, "kv_scale: 'llama-2-7b-a40' is not one of the env's profiles"),
        ({"kv_scale": {"llama-7b-a100": [2, 1]}}, "kv_scale 'llama-7b-a100' must be 0 < lo <= hi"),
        ({"workload": SMALL | {"prompt_scale": [0, 2]}}, "workload spec: prompt_scale must be 0 < lo"),
        ({"engine": "vllm", "model": "m", "kv_scale": [0.5, 1]}, "vary the simulator's episodes only"),
        ({"engine": "tpu"}, "engine must be 'sim' or 'vllm'"),
        ({"engine": "vllm"}, "needs model=DIR"),
        ({"model": "/models/llama"}, "model='/models/llama' is read with engine='vllm' only"),  # was ignored
        ({"engine": "vllm", "model": "no/such/dir"}, "no/such/dir: not a model directory"),
        ({"action_mode": "jump"}, "action_mode must be"),
        ({"w_recompute": -1}, "w_recompute must be"),
        ({"w_lost": -1}, r"w_lost must be a number in \[0, 1000\], got -1"),
        ({"w_lost": 1e308}, r"w_lost must be a number in \[0, 1000\], got 1e\+308"),  # rewards -inf
        ({"control_interval_s": 0.5, "control_interval_iters": 4}, r"set one of control_interval_s \(0.5\) and control_interval_iters \(4\), not both"),
        ({"control_interval_s": 0}, "control_interval_s must be a number of seconds in \\[0.001, 3600\\], got 0"),
        ({"control_interval_s": -1}, "control_interval_s must be a number of seconds in \\[0.001, 3600\\], got -1"),
        ({"control_interval_s": float("nan")}, "control_interval_s must be .*, got nan"),
        ({"control_interval_s": float("inf")}, "control_interval_s must be .*, got inf"),
        ({"control_interval_s": None, "control_interval_iters": 0}, "control_interval_iters must be a whole number in \\[1, 1,000,000\\], got 0"),
        ({"control_interval_s": None, "control_interval_iters": 2.5}, "control_interval_iters must be a whole number in \\[1, 1,000,000\\], got 2.5"),
        ({"engine_kwargs": {"foo": 1}}, "engine_kwargs: .*unexpected keyword argument 'foo'"),
        ({"engine_kwargs": {"scheduler": "v9"}}, "engine_kwargs: scheduler must be one of"),
        ({"profile": "gpt-9"}, "unknown profile"),
        ({"profile": []}, "profile list is empty"),
        ({"profile": ["llama-7b-a100", "llama-7b-a100"]}, "names a profile twice; give a mapping"),
        ({"profile": {"llama-7b-a100": 0}}, "'llama-7b-a100': weight must be a number > 0, got 0"),
        ({"profile": {"llama-7b-a100": float("nan")}}, "weight must be a number > 0, got nan"),
        ({"workload": {"source": "embedded:gsm8k", "rate": 3}}, r"unknown key\(s\) \['rate'\]"),
        ({"workload": {"source": "embedded:gsm8k", "weight": 0}}, "weight must be a number > 0, got 0"),
        ({"workload": {"source": "embedded:gsm8k", "weight": "2x"}}, "weight must be a number > 0, got '2x'"),
        # raw TypeErrors, and a string's letters taken for entry names
        ({"slo": 5}, "slo must be a string such as 'ttft:2000,tpot:50', got 5"),
        ({"w_lost": "1"}, r"w_lost must be a number in \[0, 1000\], got '1'"),
        ({"observation_fields": "running"}, "must be a list of entry names, got 'running'"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0it", r"whole number in \[1, 1,000,000\], got 0"),
        ("1.5it", "got 1.5"),
        ("0.0000000000001ms", r"seconds in \[0.001, 3600\], got 1e-16"),
        ("9" * 400 + "s", "got inf"),
        ("2h", "use e.g. 1it, 16it, 50ms or 1s"),
    ],
)
def test_a_control_interval_out_of_range_is_refused(spec: str, message: str) -> None:
    """Too short an interval multiplied decisions over idle time without end (1e-16 s no
    longer advanced the clock); an infinite one decided once."""
    from batchpilot.envs.controller import ControlInterval

    with pytest.raises(ValueError, match=message):
        ControlInterval.parse(spec)
    assert ControlInterval.parse("1ms").seconds == 1e-3
    assert ControlInterval.parse("3600s").seconds == 3600.0


@pytest.mark.parametrize("spec", ["1ms", "0.5s", "1.2345678s", "1000s", "3600s", "16it"])
def test_a_control_interval_reads_back_as_written(spec: str) -> None:
    """The interval a sidecar records is read back by `parse`: an hour once printed as
    3.6e+06ms, which it refused (and 1.2345678 s as 1234.57ms)."""
    from batchpilot.envs.controller import ControlInterval

    interval = ControlInterval.parse(spec)
    assert ControlInterval.parse(str(interval)) == interval


def random_episode(env: gym.Env, seed: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """One episode from `seed` under seeded random actions: its observations and actions."""
    obs, _ = env.reset(seed=seed)
    seen, actions = [obs], []
    rng = np.random.default_rng(0)
    terminated = False
    while not terminated:
        actions.append(rng.integers(env.action_space.nvec))
        obs, _, terminated, _, _ = env.step(actions[-1])
        seen.append(obs)
    return seen, actions


def test_observation_is_the_deployed_controllers() -> None:
    """Train/serve parity in the simulator: the env's observation is what `PolicyController`
    computes from the same telemetry (one `Observer`), for every decision of a run."""
    from batchpilot.agents.policy import PolicyController
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.metrics import SLO
    from batchpilot.envs.run import run
    from batchpilot.envs.sim_engine import SimEngine

    env = make(slo="ttft:2000,tpot:50")
    seen_env, actions = random_episode(env, seed=5)
    seen_policy = []

    def act(o: np.ndarray) -> np.ndarray:
        seen_policy.append(o)
        return actions[len(seen_policy) - 1]

    base = env.unwrapped
    controller = PolicyController(act, "grid", SLO.parse("ttft:2000,tpot:50"), ControlInterval(None, 0.5))
    engine = SimEngine(base.engine.profile, slo=base.slo)
    run(base.workload, engine, controller, ControlInterval(None, 0.5))
    assert len(seen_policy) == len(actions)
    np.testing.assert_array_equal(np.array(seen_policy), np.array(seen_env[:-1]))
    with pytest.raises(ValueError, match="trained to decide every 500ms"):
        run(base.workload, SimEngine(base.engine.profile, slo=base.slo), controller, ControlInterval(1))


def test_an_env_trained_across_slos_scores_and_observes_each_episode_on_its_own() -> None:
    """`slo_scale` draws each episode's targets: the engine scores on them, the observation
    is scaled by them, and a deployed controller, which observes the SLO of the run it serves,
    sees what the env saw, whether it records the training range or not."""
    from batchpilot.agents.policy import PolicyController
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.metrics import SLO
    from batchpilot.envs.run import run
    from batchpilot.envs.sim_engine import SimEngine

    env = make(slo="ttft:2000,tpot:50", slo_scale={"ttft": [0.25, 4], "tpot": [0.6, 3]})
    drawn = []
    for seed in range(6):
        _, info = env.reset(seed=seed)
        slo = env.unwrapped.engine.slo
        assert str(slo) == info["slo"]
        assert 500 <= slo.ttft_ms <= 8000 and 30 <= slo.tpot_ms <= 150
        drawn.append(slo)
    assert len(set(drawn)) == 6
    seen_env, actions = random_episode(env, seed=7)
    base, interval = env.unwrapped, ControlInterval(None, 0.5)
    for scale in ({"ttft": (0.25, 4.0), "tpot": (0.6, 3.0)}, None):
        seen = []

        def act(o: np.ndarray, seen: list = seen) -> np.ndarray:
            seen.append(o)
            return actions[len(seen) - 1]

        trained = SLO.parse("ttft:2000,tpot:50")
        controller = PolicyController(act, "grid", trained, interval, slo_scale=scale)
        run(base.workload, SimEngine(base.engine.profile, slo=base.engine.slo), controller, interval)
        np.testing.assert_array_equal(np.array(seen), np.array(seen_env[:-1]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"slo_scale": [0.5, 2]}, "slo_scale must map ttft and/or tpot"),
        ({"slo_scale": {"e2el": [0.5, 2]}}, "unknown objective 'e2el'"),
        ({"slo": "ttft:2000", "slo_scale": {"tpot": [0.5, 2]}}, "scales tpot, which the SLO"),
        ({"slo_scale": {"ttft": [2, 0.5]}}, r"slo_scale ttft must be 0 < lo <= hi"),
        ({"slo_scale": {"ttft": [0, 2]}}, r"slo_scale ttft must be 0 < lo <= hi"),
        ({"engine": "vllm", "model": "m", "slo_scale": {"ttft": [1, 2]}}, "episodes only"),
    ],
)
def test_a_bad_slo_scale_is_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kwargs)


def test_a_training_workload_can_skip_a_traces_bad_rows(tmp_path) -> None:
    from batchpilot.envs.batching_env import WorkloadSpec

    trace = tmp_path / "burst.csv"
    rows = "".join(f"{i},ChatGPT,100,{0 if i == 2 else 20},0,API log\n" for i in range(6))
    trace.write_text("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n" + rows)
    spec = {"source": str(trace), "num_requests": 5}
    with pytest.raises(ValueError, match=r"burst\.csv:4: Response tokens is 0.*--bad-rows skip"):
        make(workload=[spec])  # at construction, not at the episode that draws it
    make(workload=[spec | {"bad_rows": "skip"}])
    drawn = WorkloadSpec.coerce(spec | {"bad_rows": "skip"}).draw(np.random.default_rng(0), 4096)
    assert (len(drawn), drawn.skipped_rows) == (5, 1)


@pytest.mark.parametrize("n", [2.5, "5", True, 0])
def test_a_workload_specs_request_count_is_checked_by_name(n) -> None:
    """It surfaced as a bare TypeError from numpy, naming no key."""
    from batchpilot.envs.batching_env import WorkloadSpec

    with pytest.raises(ValueError, match=r"num_requests must be a whole number in \[1, 10000000\]"):
        WorkloadSpec.coerce({"source": "embedded:gsm8k", "num_requests": n})


def test_episodes_draw_windows_across_a_whole_trace(tmp_path) -> None:
    from batchpilot.envs.batching_env import WorkloadSpec
    from batchpilot.envs.workloads import trace_window

    trace = tmp_path / "t.csv"
    rows = "".join(f"2023-11-16 18:{i // 60:02d}:{i % 60:02d}.5,{100 + i},{10 + i}\n" for i in range(600))
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows)
    spec = WorkloadSpec.coerce({"source": str(trace), "num_requests": 50})
    rng = np.random.default_rng(0)
    starts = {int(spec.draw(rng, 4096).requests[0].request_id) for _ in range(8)}
    assert len(starts) > 1 and max(starts) > 50  # not always the trace's first 50
    w = spec.draw(rng, 4096)
    assert len(w) == 50 and w.requests[0].arrival_s == 0.0
    whole = WorkloadSpec.coerce({"source": str(trace), "num_requests": 600}).draw(rng, 4096)
    assert whole.requests[0].request_id == "0" and len(whole) == 600
    # a trace holding fewer runs whole, as a suite's scenario takes it (it was an error here)
    more = WorkloadSpec.coerce({"source": str(trace), "num_requests": 900}).draw(rng, 4096)
    assert len(more) == 600 and trace_window(str(trace), 900, 0) == (None, None)


def test_huge_draw_weights_draw_as_their_ratios() -> None:
    """Profile weights of 1e308 each ended in numpy's "Probabilities do not sum to 1" (their
    sum overflowed); mix: weights were already scaled by the largest."""
    import gymnasium as gym

    env = gym.make(
        "batchpilot/Batching-v0",
        profile={"llama-2-7b-a100": 1e308, "llama-3-8b-a100": 1e308},
        workload=[{"source": "fixed:64:16", "arrival": "poisson:2", "num_requests": 10,
                   "weight": w} for w in (1e308, 1e308)],
    )  # fmt: skip
    drawn = set()
    for seed in range(12):
        env.reset(seed=seed)
        drawn.add(env.unwrapped.engine.profile.name)
    assert drawn == {"llama-2-7b-a100", "llama-3-8b-a100"}


def test_numpy_numbers_are_weights_too() -> None:
    """The type check of w_lost and w_recompute let only int and float through."""
    env = make(w_lost=np.float32(1.0), w_recompute=np.int64(0))
    assert env.unwrapped.w_lost == 1.0


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        # each constructed, then failed at the reset that drew it, in a worker
        ({"workload": ["embedded:azure-conv", {"source": "embedded:sharegpt", "arrival": "poison:4"}]}, ValueError, r"workload 1 \(embedded:sharegpt @ poison:4\).*unknown process 'poison'"),
        ({"workload": "embedded:gsm8k"}, ValueError, r"workload 0 \(embedded:gsm8k @ replay\)"),
        # an empty SLO: every policy earned the same return
        ({"slo": ""}, ValueError, "slo names no objective"),
        ({"profile": 123}, ValueError, "profile must be a name, a list of names or a mapping"),
    ],
)
def test_the_constructor_refuses_what_a_reset_would(kwargs: dict, error: type, message: str) -> None:
    with pytest.raises(error, match=message):
        make(**kwargs)


def test_a_workload_spec_object_is_checked_as_its_dict_is_and_numpy_numbers_count() -> None:
    """A WorkloadSpec skipped every check ("Probabilities contain NaN" at a reset); numpy
    numbers were refused as no numbers."""
    from batchpilot.envs.batching_env import WorkloadSpec

    with pytest.raises(ValueError, match="workload spec: weight must be a number > 0, got -1"):
        make(workload=[WorkloadSpec("embedded:gsm8k", "poisson:4", weight=-1)])
    with pytest.raises(ValueError, match="rate_scale"):
        make(workload=[WorkloadSpec("embedded:gsm8k", "poisson:4", rate_scale=(2, 1))])
    spec = {"source": "embedded:gsm8k", "arrival": "poisson:4", "num_requests": np.int64(30), "weight": np.float32(2)}
    env = make(workload=[spec], profile={"llama-7b-a100": np.int64(1)}, control_interval_s=np.float32(0.5))
    assert env.reset(seed=0)[0].shape == (len(OBSERVATION_FIELDS),)


def test_a_cap_between_grid_points_is_reached_and_actions_keep_their_shape() -> None:
    """A cap of 300 requests started and stayed at 256, though grid points past the caps
    act as the caps; a batched (1, 2) action was taken for one."""
    from batchpilot.envs.action_grid import ActionGrid

    grid = ActionGrid("grid")
    assert grid.reset(300, 3000) == Limits(300, 3000)
    assert grid.apply(np.array([len(SEQ_GRID) - 1, len(BUDGET_GRID) - 1])) == Limits(300, 3000)
    assert grid.apply(np.array([SEQ_GRID.index(256), BUDGET_GRID.index(2048)])) == Limits(256, 2048)
    with pytest.raises(ValueError, match="action must be 2 finite entries"):
        grid.apply(np.array([[3, 4]]))
    # a teacher holding the cap is labelled with the point acting as it, not the nearest (256)
    assert grid.limits_at(tuple(grid.action_for(Limits(300, None)))) == Limits(300, 3000)
    env = make()
    with pytest.raises(RuntimeError, match=r"call reset\(\) first"):
        _ = env.unwrapped.telemetry


def test_every_episode_fits_a_v0_cache_the_kv_scale_shrank() -> None:
    """v0 keeps 1% of the blocks free: with a KV cache scaled down to about one context, a
    quarter of the resets drew a request it could not hold (cut to the context only)."""
    env = make(
        profile="llama-3-8b-l4", kv_scale=(0.2, 1.0), engine_kwargs={"scheduler": "v0"},
        workload=[{"source": "mix:gsm8k=1,sharegpt=2", "arrival": "poisson:4", "num_requests": 100}],
    )
    for seed in range(30):
        env.reset(seed=seed)
