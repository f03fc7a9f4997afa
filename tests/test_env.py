"""The Gymnasium environment: checkers, determinism, actions, rewards, bad arguments."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env
from stable_baselines3.common.env_checker import check_env as sb3_check_env

import batchpilot.envs
from batchpilot.envs.batching_env import OBSERVATION_FIELDS

SMALL = {"source": "embedded:azure-conv", "num_requests": 60}


def make(**kwargs) -> gym.Env:
    return gym.make(batchpilot.envs.ENV_ID, **({"workload": SMALL} | kwargs))


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"action_mode": "delta"}, {"control_token_budget": True, "control_interval_iters": 8, "control_interval_s": None}],
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
        _, _, terminated, truncated, info = env.step(np.array([1.0], dtype=np.float32))
        finished += info["interval_finished"]
        assert not truncated
    assert finished == 60
    assert env.unwrapped.engine.result().metrics()["completed"] == 60


def test_actions_map_to_limits() -> None:
    env = make(b_min=4, b_max=100)
    env.reset(seed=0)
    _, _, _, _, info = env.step(np.array([-1.0], dtype=np.float32))
    assert info["max_num_seqs"] == 4
    _, _, _, _, info = env.step(np.array([1.0], dtype=np.float32))
    assert info["max_num_seqs"] == 100
    delta = make(action_mode="delta", max_log2_step=1.0, b_max=64)
    delta.reset(seed=0)
    _, _, _, _, info = delta.step(np.array([-1.0], dtype=np.float32))
    assert info["max_num_seqs"] == 32  # halved from the starting b_max
    budget = make(control_token_budget=True, min_token_budget=512)
    budget.reset(seed=0)
    _, _, _, _, info = budget.step(np.array([0.0, -1.0], dtype=np.float32))
    assert info["max_num_batched_tokens"] == 512


def test_reward_counts_goodput_and_penalises_preemption() -> None:
    env = make(workload={"source": "embedded:sharegpt", "arrival": "all-at-once", "num_requests": 300})
    env.reset(seed=1)
    _, _, _, _, info = env.step(np.array([1.0], dtype=np.float32))  # cap 1024: thrashes
    total_preempt = 0
    for _ in range(40):
        _, _, terminated, _, info = env.step(np.array([1.0], dtype=np.float32))
        total_preempt += info["interval_preemptions"]
        if info["interval_preemptions"]:
            assert info["reward_preemption"] < 0
        if terminated:
            break
    assert total_preempt > 0


def test_workload_and_profile_mixes_are_sampled_per_episode() -> None:
    env = make(
        profile=["llama-7b-a100", "llama3-70b-8xa100"],
        workload=[SMALL, {"source": "embedded:gsm8k", "arrival": "poisson:5", "num_requests": 30, "rate_scale": [0.5, 2.0]}],
    )
    seen = {(info["profile"], info["workload"].split(" ")[0]) for info in (env.reset(seed=s)[1] for s in range(12))}
    assert len(seen) >= 3


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"engine": "tpu"}, "engine must be 'sim' or 'vllm'"),
        ({"engine": "vllm"}, "needs model=DIR"),
        ({"action_mode": "jump"}, "action_mode must be"),
        ({"control_interval_s": None}, "exactly one of"),
        ({"profile": "gpt-9"}, "unknown profile"),
        ({"workload": {"source": "embedded:gsm8k", "rate": 3}}, r"unknown key\(s\) \['rate'\]"),
        ({"reward_weights": {"latency": 1}}, "unknown key"),
    ],
)
def test_bad_arguments_are_named(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make(**kwargs)
