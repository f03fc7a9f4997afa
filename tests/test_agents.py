"""The learned controller: config parsing, both knobs, imitation, training, export, loading."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("stable_baselines3")
pytest.importorskip("onnx")

from helpers import train_configs

from batchpilot.agents.policy import (
    PolicyController,
    PolicyFileError,
    load_policy,
    seal,
    sidecar_path,
)
from batchpilot.agents.specs import make_controller
from batchpilot.envs.action_grid import BUDGET_GRID, SEQ_GRID
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import SLO
from batchpilot.envs.observation import OBSERVATION_FIELDS
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload
from batchpilot.training.train import load_config

SLO_SPEC = "ttft:2000,tpot:50"
TINY = {
    "batchpilot/Batching-v0": {
        "algo": "ppo",
        "seed": 3,
        "n_envs": 1,
        "n_timesteps": 256,
        "normalize": True,
        "imitation": {"teacher": "alg1+alg2", "rounds": 2, "episodes": 1, "epochs": 5},
        "env_kwargs": {
            "profile": ["llama-7b-a100"],
            "workload": [
                {"source": "embedded:azure-conv", "arrival": "replay", "num_requests": 60}
            ],
            "slo": SLO_SPEC,
            "control_interval_s": 0.5,
        },
        "eval": {
            "freq": 128,
            "profile": "llama-7b-a100",
            "workload": [
                {"source": "embedded:azure-conv", "arrival": "replay", "num_requests": 40},
                {"source": "embedded:gsm8k", "arrival": "poisson:4", "num_requests": 30},
            ],
            "seeds": [7],
        },
        "checkpoint_freq": 128,
        "n_steps": 64,
        "batch_size": 32,
        "n_epochs": 1,
        "policy_kwargs": {"net_arch": [16, 16]},
    }
}


def write_config(path: Path, data: dict) -> Path:
    path.write_text(yaml.safe_dump(data))
    return path


def run_metrics(controller, num_requests: int = 150, seed: int = 5) -> dict[str, float]:
    profile = get_profile("llama-7b-a100")
    w = make_workload(
        "embedded:azure-conv",
        "replay",
        num_requests=num_requests,
        seed=seed,
        max_model_len=profile.max_model_len,
        overlong="truncate",
    )
    engine = SimEngine(profile, slo=SLO.parse(SLO_SPEC))
    return run(w, engine, controller, INTERVAL).metrics()


INTERVAL = ControlInterval.parse("500ms")


def fixed(i: int, j: int) -> PolicyController:
    """A policy that always picks grid point (i, j)."""
    return PolicyController(lambda obs: np.array([i, j]), "grid", SLO.parse(SLO_SPEC), INTERVAL)


GSM8K_ON = "{source: embedded:gsm8k, arrival: 'poisson:1', profiles"
ALIAS_BOMB = "\n".join(
    ["batchpilot/Batching-v0:", "  algo: ppo", "  policy_kwargs:", "    x0: &x0 [a, a, a, a, a, a]"]
    + [f"    x{i}: &x{i} [{', '.join([f'*x{i - 1}'] * 6)}]" for i in range(1, 9)]
)
"""A config whose anchors stand for 6**9 (about ten million) values: refused unexpanded."""


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[1, 2]", "one top-level key"),
        ("other/Env-v0: {}", "batchpilot trains on"),
        ("batchpilot/Batching-v0: {algo: dqn}", "algo 'dqn'"),
        ("batchpilot/Batching-v0: {n_timesteps: 0}", "n_timesteps: 0 is outside"),
        ("batchpilot/Batching-v0: {imitation: {bogus: 1}}", "imitation.bogus"),
        ("batchpilot/Batching-v0: {imitation: {rounds: 0}}", "imitation.rounds: 0 is outside"),
        ("batchpilot/Batching-v0: {imitation: {beta: 2}}", "imitation.beta"),
        ("batchpilot/Batching-v0: {env_kwargs: {w_recompute: lots}}", "env_kwargs.w_recompute"),
        ("batchpilot/Batching-v0: [unclosed", "not valid YAML"),
        (
            f"batchpilot/Batching-v0: {{env_kwargs: {{workload: [{GSM8K_ON}: [x]}}]}}}}",
            "workload 0 .embedded:gsm8k.: profiles names 'x', which is not one of the env's",
        ),
        (
            f"batchpilot/Batching-v0: {{env_kwargs: {{workload: [{GSM8K_ON}: [[x]]}}]}}}}",
            "profiles must be a profile name or a list of names, got a list holding other",
        ),
        (
            "batchpilot/Batching-v0: {env_kwargs: {workload: [{source: embedded:gsm8k}]}}",
            "workload 0 .embedded:gsm8k @ replay. on llama-7b-a100: embedded:gsm8k has no",
        ),
        (ALIAS_BOMB, "holds more than 100,000 values once its aliases are expanded"),
        # rl-zoo3's forms: named by line or key, and what batchpilot reads instead
        ("batchpilot/Batching-v0: {n_timesteps: !!int 1e6}", r"line 1: '1e6' is not a whole number \(!!int\); write a count as 1000000, or !!float 1e6"),
        ("batchpilot/Batching-v0: {n_timesteps: !!float 1e6x}", r"line 1: '1e6x' is not a number"),
        ("batchpilot/Batching-v0: {learning_rate: lin_3e-4}", r"learning_rate: 'lin_3e-4' is an rl-zoo3 linear schedule, which batchpilot does not read; give a constant"),
        ("default: &d {n_envs: 2}\nbatchpilot/Batching-v0: {<<: *d}", r"expected one top-level key, the env id \(batchpilot/Batching-v0\); it has 'default', 'batchpilot/Batching-v0'"),
    ],
)
def test_bad_config_is_named(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(body)
    with pytest.raises(ValueError, match=message):
        load_config(path)


def test_fixed_grid_choice_is_exactly_static_batching() -> None:
    """Both knobs reach the engine: a policy holding grid point (i, j) is static:N:T."""
    i, j = SEQ_GRID.index(32), BUDGET_GRID.index(2048)
    static = run_metrics(make_controller("static:32:2048"))
    policy = run_metrics(fixed(i, j))
    for key in ("output_throughput", "num_preemptions", "mean_kv_usage", "engine_iterations"):
        assert policy[key] == pytest.approx(static[key], rel=1e-12), key


def test_both_knobs_change_the_run() -> None:
    small, big = SEQ_GRID.index(8), SEQ_GRID.index(256)
    top = len(BUDGET_GRID) - 1
    assert run_metrics(fixed(small, top))["p50_tpot_ms"] < run_metrics(fixed(big, top))["p50_tpot_ms"]
    chunky = run_metrics(fixed(big, top))
    thin = run_metrics(fixed(big, BUDGET_GRID.index(256)))
    assert thin["engine_iterations"] > chunky["engine_iterations"]


def test_dagger_clones_the_teacher() -> None:
    """After imitation, the policy chooses the teacher's limits on states it never saw."""
    import functools

    import gymnasium as gym
    from stable_baselines3 import PPO

    from batchpilot.agents.imitation import Collector, ImitationSpec, collect_episode, dagger

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    model = PPO("MlpPolicy", make_env(), seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    spec = ImitationSpec(teacher="static:48:1024", rounds=2, episodes=1, epochs=40)
    history = dagger(model, Collector(make_env, spec), spec, seed=0, gamma=0.98)
    assert [h["beta"] for h in history] == [1.0, 0.5]
    fresh = collect_episode(make_env, spec.teacher, 99, model.policy, beta=0.0)
    predicted = model.policy.predict(fresh.obs, deterministic=True)[0]
    np.testing.assert_array_equal(predicted, fresh.labels)
    assert fresh.labels[0].tolist() == [SEQ_GRID.index(48), BUDGET_GRID.index(1024)]


def test_the_warm_started_critic_learns_the_returns_ppo_will_train_it_on() -> None:
    """PPO trains on rewards `VecNormalize` divides by its returns' spread: imitation sets
    those statistics from its episodes and fits the value head on returns so divided (fitted
    on raw returns, it began PPO 8x further from PPO's targets than a constant)."""
    import functools

    import gymnasium as gym
    import torch as th
    from stable_baselines3 import PPO
    from stable_baselines3.common.running_mean_std import RunningMeanStd

    from batchpilot.agents.imitation import (
        RETURN_EPSILON,
        Collector,
        ImitationSpec,
        collect_episode,
        dagger,
        discounted_returns,
    )

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    model = PPO("MlpPolicy", make_env(), seed=0, device="cpu", policy_kwargs={"net_arch": [32]})
    spec = ImitationSpec(teacher="static:48:1024", rounds=1, episodes=2, epochs=5, value_epochs=200)
    returns = RunningMeanStd(shape=())
    dagger(model, Collector(make_env, spec), spec, seed=0, gamma=0.98, returns=returns)
    episodes = [collect_episode(make_env, spec.teacher, s, None, beta=1.0) for s in (0, 1)]
    sums = []  # VecNormalize's running discounted sum, step by step
    for e in episodes:
        acc = 0.0
        for r in e.rewards:
            acc = acc * 0.98 + r
            sums.append(acc)
    assert float(returns.var) == pytest.approx(np.var(sums), rel=1e-3)
    spread = float(np.sqrt(returns.var + RETURN_EPSILON))
    assert spread > 2  # a scale that matters
    raw = np.concatenate([discounted_returns(e.rewards, 0.98) for e in episodes])
    obs = th.as_tensor(np.concatenate([e.obs for e in episodes]))
    with th.no_grad():
        values = model.policy.predict_values(obs).numpy().ravel()
    on_scale, off_scale = np.mean((values - raw / spread) ** 2), np.mean((values - raw) ** 2)
    assert on_scale < np.var(raw / spread) < off_scale


def test_episode_metrics_say_how_many_episodes_a_time_limit_cut() -> None:
    """``episode/*`` averages runs whose workload finished; a truncated one has no metrics,
    so the share of those is logged beside them rather than silently left out."""
    from batchpilot.agents.callbacks import DomainMetricsCallback

    step = {"interval_s": 0.5, "interval_good_output_tokens": 10, "interval_output_tokens": 12,
            "interval_preemptions": 0, "max_num_seqs": 64, "max_num_batched_tokens": 512}  # fmt: skip
    metrics = {"output_goodput": 100.0, "output_throughput": 120.0, "slo_attainment": 0.9,
               "num_preemptions": 0}  # fmt: skip
    recorded: dict[str, float] = {}
    cb = DomainMetricsCallback()
    logger = type("Logger", (), {"record": lambda _, k, v: recorded.__setitem__(k, v)})()
    cb.model = type("Model", (), {"logger": logger})()
    cb.locals = {"infos": [step | {"episode_metrics": metrics}, step | {"TimeLimit.truncated": True}, step]}
    cb._on_step()
    cb._on_rollout_end()
    assert recorded["episode/truncated_share"] == 0.5
    assert recorded["episode/output_goodput"] == 100.0


def test_the_collector_collects_a_claimed_round_0_episode_once(monkeypatch) -> None:
    """Runs of neighbouring seeds share round-0 episodes (the teacher drives, so the env seed
    decides them): each is collected once for all its claims, and collected again only after
    the last claim released it."""
    import batchpilot.agents.imitation as imitation

    collected: list[tuple[int, object]] = []

    def fake(make_env, teacher, seed, policy, beta, stakes, tie_sets, seq_tie_break, regret):
        collected.append((seed, policy))
        return (seed, len(collected))

    monkeypatch.setattr(imitation, "collect_episode", fake)
    spec = imitation.ImitationSpec(teacher="static:48:1024", episodes=3)
    assert imitation.round_seeds(5, 0, 3) == [5, 6, 7]
    episodes = imitation.Collector(lambda: None, spec)
    episodes.expect(imitation.round_seeds(0, 0, 3))
    episodes.expect(imitation.round_seeds(1, 0, 3))
    assert [s for s, _ in collected] == [0, 1, 2, 3]  # collected ahead, 1 and 2 once
    first = episodes.collect([0, 1, 2], None, 1.0)
    assert episodes.collect([1, 2, 3], None, 1.0) == [*first[1:], (3, 4)]
    assert len(collected) == 4
    assert episodes.collect([2], None, 1.0) == [(2, 5)]  # released: collected afresh
    episodes.collect([2], "policy", 0.5)  # a policy drives: never shared
    episodes.collect([2], "policy", 0.5)
    assert collected[-2:] == [(2, "policy"), (2, "policy")]


def test_runs_of_several_seeds_are_the_runs_of_each_alone(tmp_path: Path) -> None:
    """`train --seed 3 4` (one shared collector) leaves in OUT/seed3 and OUT/seed4 the
    checkpoints that `train --seed 3` and `train --seed 4` leave."""
    from batchpilot.training.cli import main

    body = {k: v for k, v in TINY["batchpilot/Batching-v0"].items() if k != "eval"}
    body["imitation"] = body["imitation"] | {"episodes": 2}
    config = write_config(tmp_path / "tiny.yml", {"batchpilot/Batching-v0": body})
    base = ["train", "--config", str(config), "--no-progress"]
    assert main([*base, "--seed", "3", "4", "--out", str(tmp_path / "both")]) == 0
    for seed in (3, 4):
        alone = tmp_path / f"alone{seed}"
        assert main([*base, "--seed", str(seed), "--out", str(alone)]) == 0
        assert json.loads((tmp_path / "both" / f"seed{seed}" / "run.json").read_text())["seed"] == seed
        ours = tmp_path / "both" / f"seed{seed}" / "final"
        assert sorted(p.name for p in ours.iterdir()) == sorted(p.name for p in (alone / "final").iterdir())
        for path in ours.iterdir():
            assert path.read_bytes() == (alone / "final" / path.name).read_bytes(), (seed, path.name)


def test_knob_stakes_is_the_lead_over_the_next_grid_choice() -> None:
    from batchpilot.agents.imitation import knob_stakes

    assert knob_stakes({128: 100.0, 256: 99.0, 512: 50.0}, BUDGET_GRID) == pytest.approx(1 / 101)
    # 37 and 32 are one grid choice (32): its best score leads 16's by 10
    assert knob_stakes({37: 10.0, 32: 9.0, 16: 0.0}, SEQ_GRID) == pytest.approx(10 / 11)
    assert knob_stakes({37: 10.0, 32: 9.0}, SEQ_GRID) == 0.0
    assert knob_stakes({}, SEQ_GRID) == 0.0


def test_label_weights_average_one_and_keep_ties_at_the_floor() -> None:
    from batchpilot.agents.imitation import STAKES_CAP, STAKES_FLOOR, label_weights

    stakes = np.array([[0.0, 0.0], [0.0, 1.0], [1.0, 1e6], [3.0, 1.0], [2.0, 2.0]])
    w = label_weights(stakes, ["max_num_seqs", "budget"])
    np.testing.assert_allclose(w.mean(axis=0), 1.0)
    # knob 0: median non-zero stakes 2, so a tie weighs the floor against 1.5 + floor
    assert w[0, 0] / w[3, 0] == pytest.approx(STAKES_FLOOR / (1.5 + STAKES_FLOOR))
    # knob 1: median 1.5; the huge lead is capped
    assert w[2, 1] / w[0, 1] == pytest.approx((STAKES_CAP + STAKES_FLOOR) / STAKES_FLOOR)
    np.testing.assert_allclose(label_weights(np.zeros((3, 2)), ["budget"]), 1.0)
    np.testing.assert_array_equal(label_weights(stakes, ["budget"])[:, 0], 1.0)
    # max_num_seqs weighed only in the rows near the TPOT target (the last three): the
    # others alike, those by their own stakes (median 2), the budget untouched
    near = np.array([False, False, True, True, True])
    w = label_weights(stakes, [], near)
    np.testing.assert_allclose(w[:, 1], 1.0)
    assert w[0, 0] == w[1, 0] and w[4, 0] / w[3, 0] == pytest.approx(
        (1 + STAKES_FLOOR) / (1.5 + STAKES_FLOOR)
    )
    assert w[0, 0] / w[4, 0] == pytest.approx(1 / (1 + STAKES_FLOOR))


def test_stakes_weighting_lets_a_decisive_minority_label_win() -> None:
    """One state, labelled budget A by 70% near-ties and budget B by 30% decisive
    choices: cloned plainly the policy picks A, weighted by stakes it picks B."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from batchpilot.agents.imitation import ImitationSpec, fit, label_weights

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    spec = ImitationSpec(epochs=30, value_epochs=0)
    obs = np.zeros((100, len(OBSERVATION_FIELDS)), np.float32)
    labels = np.array([[3, 1]] * 70 + [[3, 4]] * 30)
    stakes = np.array([[0.5, 0.0]] * 70 + [[0.5, 0.2]] * 30)
    picks = {}
    for name, knobs in (("uniform", []), ("stakes", ["budget"])):
        weights = label_weights(stakes, knobs)
        model = PPO("MlpPolicy", gym.make("batchpilot/Batching-v0", **kwargs), seed=0, device="cpu")
        accepted = one_hot(labels)
        fit(model.policy, obs, accepted, weights, np.zeros(100), spec, np.random.default_rng(0))
        picks[name] = model.policy.predict(obs[:1], deterministic=True)[0][0].tolist()
    assert picks == {"uniform": [3, 1], "stakes": [3, 4]}


def one_hot(labels: np.ndarray) -> list[np.ndarray]:
    """Each knob's labels as the only choice they accept (`fit`'s masks)."""
    return [np.arange(len(g)) == labels[:, [k]] for k, g in enumerate((SEQ_GRID, BUDGET_GRID))]


def test_acceptable_choices_are_the_sweeps_near_ties() -> None:
    from batchpilot.agents.imitation import acceptable

    sweep = {128: 100.0, 256: 99.5, 512: 90.0, 8192: 99.9}
    mask = acceptable(sweep, BUDGET_GRID, BUDGET_GRID.index(128))
    assert [g for g, m in zip(BUDGET_GRID, mask, strict=True) if m] == [128, 256, 8192]
    # the teacher's own choice is accepted even where its sweep scored it lower
    assert acceptable(sweep, BUDGET_GRID, BUDGET_GRID.index(512))[BUDGET_GRID.index(512)]
    # 37 and 32 are one grid choice (32), scored by the better of the two
    mask = acceptable({37: 10.0, 32: 5.0, 16: 9.99}, SEQ_GRID, SEQ_GRID.index(32))
    assert [g for g, m in zip(SEQ_GRID, mask, strict=True) if m] == [16, 32]
    assert acceptable({}, SEQ_GRID, 2).tolist() == [i == 2 for i in range(len(SEQ_GRID))]


def test_tie_sets_let_decisive_labels_win_over_the_tie_break() -> None:
    """One state where 70% of the labels are ties (every max_num_seqs scored alike, the
    teacher picks the largest) and 30% choose 8 decisively: cloned plainly the policy picks
    the tie-break, fitted to the tie sets it picks 8."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from batchpilot.agents.imitation import ImitationSpec, fit

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    spec = ImitationSpec(epochs=30, value_epochs=0)
    obs = np.zeros((100, len(OBSERVATION_FIELDS)), np.float32)
    top, eight = len(SEQ_GRID) - 1, SEQ_GRID.index(8)
    labels = np.array([[top, 1]] * 70 + [[eight, 1]] * 30)
    plain = one_hot(labels)
    tied = [plain[0].copy(), plain[1]]
    tied[0][:70] = True  # every choice ties where the teacher broke the tie
    picks = {}
    for name, accepted in (("plain", plain), ("tie sets", tied)):
        model = PPO("MlpPolicy", gym.make("batchpilot/Batching-v0", **kwargs), seed=0, device="cpu")
        fit(model.policy, obs, accepted, np.ones((100, 2)), np.zeros(100), spec,
            np.random.default_rng(0))
        picks[name] = int(model.policy.predict(obs[:1], deterministic=True)[0][0][0])
    assert picks == {"plain": top, "tie sets": eight}


def test_regret_labels_fit_the_choice_best_on_average_not_the_labels_mode() -> None:
    """Half the states' teacher picks a 512 budget, half 8,192, each decisively; 1,024 trails
    the best by 2-3% in both. A clone of the labels (weighed by their stakes or not) picks
    one of the two modes; fitted to the regrets it picks 1,024, the least regret on average
    (the student that alternated 512 and 8,192 where the tuned pair held 1,024)."""
    import gymnasium as gym
    from stable_baselines3 import PPO

    from batchpilot.agents.imitation import STAKES_FLOOR, ImitationSpec, fit, regret_costs

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    spec = ImitationSpec(epochs=300, value_epochs=0)  # one batch an epoch
    obs = np.zeros((100, len(OBSERVATION_FIELDS)), np.float32)
    at = {b: BUDGET_GRID.index(b) for b in BUDGET_GRID}
    regrets = np.full((100, len(BUDGET_GRID)), 0.5)
    for rows, costs in ((slice(0, 50), {512: 0, 1024: 0.02, 2048: 0.04, 8192: 0.3}),
                        (slice(50, 100), {8192: 0, 2048: 0.02, 1024: 0.03, 512: 0.3})):
        for budget, cost in costs.items():
            regrets[rows, at[budget]] = cost
    labels = np.array([[0, at[512]]] * 50 + [[0, at[8192]]] * 50)
    stakes = np.stack([np.ones(100), np.full(100, 0.02)], 1)
    picks = {}
    for name, weights, cost in (
        ("clone", np.ones((100, 2)), None),
        ("regret", np.array([[1.0, STAKES_FLOOR]] * 100), regret_costs(regrets, stakes[:, 1])),
    ):
        model = PPO("MlpPolicy", gym.make("batchpilot/Batching-v0", **kwargs), seed=0, device="cpu")
        stats = fit(model.policy, obs, one_hot(labels), weights, np.zeros(100), spec,
                    np.random.default_rng(0), [None, cost])
        picks[name] = BUDGET_GRID[int(model.policy.predict(obs[:1], deterministic=True)[0][0][1])]
    assert picks["clone"] in (512, 8192) and picks["regret"] == 1024
    assert stats["budget_mode_cost"] == pytest.approx(0.025 / 0.02)  # regrets over the stakes


def test_grid_regrets_fill_unscored_choices_from_the_nearest_scored() -> None:
    from batchpilot.agents.imitation import grid_regrets, regret_costs

    sweep = {256: 99.0, 1024: 100.0, 2048: 80.0}  # a 2,048 cap: the grid's top unscored
    assert 512 in BUDGET_GRID  # skipped by this teacher's grid
    r = grid_regrets(sweep, BUDGET_GRID)
    assert r[BUDGET_GRID.index(1024)] == 0 and r[BUDGET_GRID.index(256)] == pytest.approx(1 / 101)
    assert r[-1] == r[BUDGET_GRID.index(2048)] == pytest.approx(20 / 101)
    assert r[0] == r[BUDGET_GRID.index(512)] == r.max()  # never scored: the sweep's worst
    assert not grid_regrets({}, BUDGET_GRID).any()
    costs = regret_costs(np.array([[0.0, 0.5, 9.0]]), np.array([0.0, 0.1, 0.3]))
    np.testing.assert_allclose(costs, [[0.0, 2.5, 10.0]])  # over the median stakes, capped
    assert not regret_costs(np.ones((2, 3)), np.zeros(2)).any()


def test_dagger_fits_the_regret_knob_to_its_costs_and_the_other_to_its_labels(monkeypatch) -> None:
    """The budget's regrets reach `fit` as costs over the median stakes, its labels at the
    floor's weight; max_num_seqs keeps plain labels and no costs."""
    from types import SimpleNamespace

    import batchpilot.agents.imitation as imitation

    n = 4
    regrets = [np.zeros((n, len(SEQ_GRID))), np.tile(np.linspace(0, 0.7, len(BUDGET_GRID)), (n, 1))]
    episode = imitation.Episode(
        np.zeros((n, 3), np.float32), np.zeros((n, 2), np.int64),
        np.array([[0.5, 0.1], [0.5, 0.2], [0.5, 0.3], [0.5, 0.0]]),
        [np.eye(len(g), dtype=bool)[[0] * n] for g in (SEQ_GRID, BUDGET_GRID)],
        np.zeros(n), {"output_goodput": 1.0, "num_preemptions": 0.0}, np.zeros(n), regrets,
    )  # fmt: skip
    seen = {}

    def fake_fit(policy, obs, accepted, weights, returns, spec, rng, costs=None):
        seen.update(weights=weights, costs=costs)
        return {}

    monkeypatch.setattr(imitation, "fit", fake_fit)
    collector = SimpleNamespace(collect=lambda seeds, policy, beta: [episode])
    spec = imitation.ImitationSpec(teacher="mpc", rounds=1, episodes=1, regret_knobs=["budget"])
    imitation.dagger(SimpleNamespace(policy=None), collector, spec, seed=0, gamma=0.9)
    assert seen["costs"][0] is None
    np.testing.assert_allclose(seen["costs"][1], np.minimum(regrets[1] / 0.2, imitation.STAKES_CAP))
    np.testing.assert_allclose(seen["weights"][:, 1], imitation.STAKES_FLOOR)
    np.testing.assert_allclose(seen["weights"][:, 0], 1.0)
    # beside stakes: the labels keep their stakes' weights, the costs scaled by regret_weight
    spec = imitation.ImitationSpec(teacher="mpc", rounds=1, episodes=1, regret_knobs=["budget"],
                                   stakes_knobs=["budget"], regret_weight=0.25)  # fmt: skip
    imitation.dagger(SimpleNamespace(policy=None), collector, spec, seed=0, gamma=0.9)
    np.testing.assert_allclose(seen["costs"][1], 0.25 * np.minimum(regrets[1] / 0.2, 10.0))
    stakes = imitation.label_weights(episode.stakes, ["budget"])
    np.testing.assert_allclose(seen["weights"], stakes)


def test_mpc_teacher_regret_labels_cost_nothing_at_the_teachers_choice() -> None:
    import functools

    import gymnasium as gym

    from batchpilot.agents.imitation import collect_episode

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    teacher = "mpc:horizon_s=2:seqs=4/64:tokens=256/2048"
    episode = collect_episode(make_env, teacher, 5, None, 1.0, True, (), "teacher", ("budget",))
    seqs, budget = episode.regrets
    assert not seqs.any() and budget.shape == (len(episode.labels), len(BUDGET_GRID))
    scored = budget.max(1) > 0
    assert scored.any() and (budget >= 0).all()
    assert (budget[np.arange(len(budget)), episode.labels[:, 1]][scored] == 0).all()


@pytest.mark.parametrize(
    ("teacher", "knobs", "problem"),
    [("static:48:1024", ["budget"], "reports how much"), ("mpc", ["chunk"], "'chunk' is not one")],
)
def test_imitation_stakes_errors_name_the_problem(
    teacher: str, knobs: list[str], problem: str
) -> None:
    from batchpilot.agents.imitation import ImitationSpec

    with pytest.raises(ValueError, match=problem):
        ImitationSpec(teacher=teacher, stakes_knobs=knobs)
    with pytest.raises(ValueError, match=problem):
        ImitationSpec(teacher=teacher, tie_sets=knobs)
    assert ImitationSpec(teacher="mpc:horizon_s=4", stakes_knobs=["budget"]).stakes_knobs
    assert ImitationSpec(teacher="mpc:horizon_s=4", tie_sets=["max_num_seqs"]).sweeps
    with pytest.raises(ValueError, match=problem):
        ImitationSpec(teacher=teacher, regret_knobs=knobs)
    assert ImitationSpec(teacher="mpc:horizon_s=4", regret_knobs=["budget"]).sweeps
    with pytest.raises(ValueError, match="regret_knobs names max_num_seqs, whose labels"):
        ImitationSpec(teacher="mpc", regret_knobs=["max_num_seqs"], seq_stakes_tbt=0.8)
    with pytest.raises(ValueError, match="regret_knobs and tie_sets both name 'budget'"):
        ImitationSpec(teacher="mpc:horizon_s=4", regret_knobs=["budget"], tie_sets=["budget"])
    with pytest.raises(ValueError, match="regret_weight must be a number > 0, got 0"):
        ImitationSpec(teacher="mpc:horizon_s=4", regret_knobs=["budget"], regret_weight=0)
    with pytest.raises(ValueError, match="a learned policy does not teach here"):
        ImitationSpec(teacher="policy:training/reports/learned/policy.onnx")  # "unknown controller"
    with pytest.raises(ValueError, match="seq_tie_break needs a teacher that reports"):
        ImitationSpec(teacher="static:48:1024", seq_tie_break="knee")
    with pytest.raises(ValueError, match="seq_tie_break must be one of"):
        ImitationSpec(teacher="mpc", seq_tie_break="smallest")
    assert ImitationSpec(teacher="mpc:horizon_s=4", seq_tie_break="knee").sweeps
    with pytest.raises(ValueError, match="seq_stakes_tbt needs a teacher that reports"):
        ImitationSpec(teacher="static:48:1024", seq_stakes_tbt=0.8)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="seq_stakes_tbt must be a share >= 0"):
            ImitationSpec(teacher="mpc", seq_stakes_tbt=bad)
    with pytest.raises(ValueError, match="stakes_knobs already weighs it everywhere"):
        ImitationSpec(teacher="mpc", seq_stakes_tbt=0.8, stakes_knobs=["max_num_seqs"])
    assert ImitationSpec(teacher="mpc:horizon_s=4", seq_stakes_tbt=0.8).sweeps


def test_the_decode_knee_is_where_a_decode_step_takes_the_tpot_target() -> None:
    from types import SimpleNamespace

    from batchpilot.agents.imitation import decode_knee, nearest_tie

    line = SimpleNamespace(step_base_s=0.030, step_s_per_token=0.0002)
    assert decode_knee(line, 40.0) == pytest.approx(50.0)  # 30 ms + 50 x 0.2 ms = 40 ms
    assert decode_knee(line, 25.0) == 1.0  # slower than the target alone: one at a time
    idle = SimpleNamespace(step_base_s=0.0, step_s_per_token=0.0)  # before any step
    assert decode_knee(line, None) == decode_knee(idle, 40.0) == float("inf")
    mask = np.isin(SEQ_GRID, (16, 48, 64, 1024))
    assert SEQ_GRID[nearest_tie(mask, SEQ_GRID, 50.0)] == 48
    assert SEQ_GRID[nearest_tie(mask, SEQ_GRID, 2.0)] == 16
    assert SEQ_GRID[nearest_tie(mask, SEQ_GRID, float("inf"))] == 1024
    assert SEQ_GRID[nearest_tie(np.isin(SEQ_GRID, (32, 128)), SEQ_GRID, 64.0)] == 128


def test_mpc_teacher_labels_carry_their_stakes() -> None:
    import functools

    import gymnasium as gym

    from batchpilot.agents.imitation import collect_episode

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    teacher = "mpc:horizon_s=2:seqs=4/64:tokens=256/2048"
    episode = collect_episode(make_env, teacher, 5, None, beta=1.0, stakes=True)
    assert episode.stakes.shape == episode.labels.shape
    assert (episode.stakes >= 0).all() and (episode.stakes > 0).any(axis=0).all()
    plain = collect_episode(make_env, teacher, 5, None, beta=1.0)
    np.testing.assert_array_equal(plain.labels, episode.labels)
    assert (plain.stakes == 1).all()
    for k, masks in enumerate(plain.acceptable):  # the teacher's choice alone
        np.testing.assert_array_equal(masks.argmax(1), plain.labels[:, k])
        assert (masks.sum(1) == 1).all()
    tied = collect_episode(make_env, teacher, 5, None, 1.0, True, ("max_num_seqs",))
    np.testing.assert_array_equal(tied.labels, episode.labels)
    seqs, budget = tied.acceptable
    assert seqs[np.arange(len(seqs)), tied.labels[:, 0]].all()
    assert (seqs.sum(1) > 1).any()  # where the sweep tied, more than one choice
    assert (seqs.sum(1)[episode.stakes[:, 0] >= 0.01] == 1).all()  # decisive: one choice
    np.testing.assert_array_equal(budget, plain.acceptable[1])


def test_the_step_knee_is_where_the_step_models_decode_step_takes_the_tpot_target() -> None:
    from batchpilot.agents.imitation import step_knee

    step = get_profile("llama-2-70b-a100x4").step
    knee = step_knee(step, 600, 40.0)
    assert 1 < knee < SEQ_GRID[-1]
    n = int(knee)
    assert step.decode_time(n, n * 600) <= 0.040 < step.decode_time(n + 1, (n + 1) * 600)
    assert step_knee(step, 600, 20.0) == 1.0  # one request alone takes over 20 ms
    assert step_knee(step, 600, 10_000.0) == step_knee(step, 600, None) == float("inf")
    assert step_knee(step, 2000, 40.0) < knee  # longer contexts read more KV a step


def test_step_knee_labels_lie_below_the_teachers_own() -> None:
    """At 50 ms a 7B on an A100 decodes about 150 requests of 600 tokens a step: labels at
    that knee lie below the teacher's, which break near-ties toward the grid's top."""
    import functools

    import gymnasium as gym

    from batchpilot.agents.imitation import collect_episode

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"]
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    teacher = "mpc:horizon_s=2:seqs=4/64:tokens=256/2048"
    own = collect_episode(make_env, teacher, 5, None, 1.0, True, ("max_num_seqs",))
    knee = collect_episode(make_env, teacher, 5, None, 1.0, True, ("max_num_seqs",), "step_knee")
    ties, labels = knee.acceptable[0], knee.labels[:, 0]
    assert ties[np.arange(len(ties)), labels].all()
    assert labels.mean() < own.labels[:, 0].mean() - 1


@pytest.mark.parametrize("tpot_ms", [50, 15])
def test_knee_labels_take_the_near_tie_nearest_the_decode_knee(tpot_ms: int) -> None:
    """A 7B on an A100 decodes far more than 1,024 requests within 50 ms a step: there each
    knee label is its tie set's largest choice. Within 15 ms it decodes a few dozen: there
    the knee labels lie below the teacher's own (which break ties toward the top)."""
    import functools

    import gymnasium as gym

    from batchpilot.agents.imitation import collect_episode

    kwargs = TINY["batchpilot/Batching-v0"]["env_kwargs"] | {"slo": f"ttft:2000,tpot:{tpot_ms}"}
    make_env = functools.partial(gym.make, "batchpilot/Batching-v0", **kwargs)
    teacher = "mpc:horizon_s=2:seqs=4/64:tokens=256/2048"
    own = collect_episode(make_env, teacher, 5, None, 1.0, True, ("max_num_seqs",))
    knee = collect_episode(make_env, teacher, 5, None, 1.0, True, ("max_num_seqs",), "knee")
    ties, labels = knee.acceptable[0], knee.labels[:, 0]
    assert ties[np.arange(len(ties)), labels].all()  # each label is one of its near-ties
    assert (ties.sum(1) > 1).any()
    if tpot_ms == 50:
        np.testing.assert_array_equal(labels, len(SEQ_GRID) - 1 - ties[:, ::-1].argmax(1))
    else:
        assert labels.mean() < own.labels[:, 0].mean() - 2


@pytest.fixture(scope="module")
def trained_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from batchpilot.training.train import train

    root = tmp_path_factory.mktemp("train")
    config = write_config(root / "tiny.yml", TINY)
    train(load_config(config), config, root / "run", resume=False, progress=False)
    return root / "run"


def test_evaluation_runs_each_workload_on_its_profiles_and_takes_the_geometric_mean() -> None:
    from batchpilot.agents.callbacks import EvalScenario

    gsm8k = {"source": "embedded:gsm8k", "arrival": "poisson:4", "num_requests": 30}
    conv = {"source": "embedded:azure-conv", "arrival": "poisson:1", "num_requests": 20}
    scenarios = EvalScenario(
        profile=["llama-7b-a100", "llama-2-70b-a100x4"],
        workload=[gsm8k, conv | {"profiles": ["llama-2-70b-a100x4"]}],
        slo=SLO_SPEC,
        interval="500ms",
        seeds=[1, 2],
    )
    assert [(p, w["source"]) for p, w in scenarios.runs()] == [
        ("llama-7b-a100", "embedded:gsm8k"),
        ("llama-2-70b-a100x4", "embedded:gsm8k"),
        ("llama-2-70b-a100x4", "embedded:azure-conv"),
    ]
    score = scenarios.score(lambda: make_controller("static:64:2048"))
    by_run = score["goodput_by_run"]
    assert len(set(by_run)) == 3 and min(by_run) > 0
    assert score["output_goodput"] == pytest.approx(np.prod(by_run) ** (1 / 3))
    one = EvalScenario("llama-2-70b-a100x4", conv, SLO_SPEC, "500ms", seeds=[1, 2])
    assert one.score(lambda: make_controller("static:64:2048"))["output_goodput"] == by_run[2]


def test_training_writes_checkpoints_and_domain_metrics(trained_run: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    for name in ("best", "final"):
        for file in ("checkpoint.json", "policy.safetensors", "vecnormalize.json"):
            assert (trained_run / name / file).is_file()
    assert list((trained_run / "checkpoints").glob("step_*/policy.safetensors"))
    assert not list(trained_run.rglob("*.pkl")) and not list(trained_run.rglob("*.zip"))
    (events,) = list((trained_run / "tb" / "ppo_1").rglob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events.parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in (
        "domain/goodput_tps",
        "domain/limit_mean",
        "domain/token_budget_mean",
        "eval/output_goodput",
        "eval/alg1+alg2_goodput",
        "eval/gain_vs_best_baseline",
        "train/value_loss",
    ):
        assert tag in tags, tag
    # PPO's reward normalisation starts from the imitation episodes' return statistics (the
    # scale its critic was fitted on): its count holds them besides PPO's own steps
    first = min((trained_run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    stats = json.loads((first / "vecnormalize.json").read_text())
    assert stats["ret_count"] > int(first.name[5:]) + 1
    # the imitation result's evaluation at step 0 (it once waited for the first rollout's step)
    assert min(e.step for e in acc.Scalars("eval/output_goodput")) == 0
    imitation = EventAccumulator(str(trained_run / "tb" / "imitation"))
    imitation.Reload()
    assert {"imitation/nll", "imitation/accuracy"} <= set(imitation.Tags()["scalars"])
    record = json.loads((trained_run / "best" / "eval.json").read_text())
    assert set(record["baselines"]) == {"alg1+alg2", "alg2:chunk=1"}
    assert record["runs"] == [
        "embedded:azure-conv@replay on llama-7b-a100",
        "embedded:gsm8k@poisson:4 on llama-7b-a100",
    ]
    assert {"eval/run0_goodput", "eval/run1_goodput"} <= tags


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not valid JSON"),
        ('{"output_goodput": 1, "output_goodput": 2}', "the evaluation record gives a key twice in one object (output_goodput)"),
        ("[1]", "the evaluation record must be a JSON object, not an array"),
        ('{"runs": []}', "output_goodput is None; need a number >= 0"),
        ('{"output_goodput": NaN}', "the evaluation record: output_goodput is NaN, not a number JSON allows"),
        ('{"output_goodput": 5, "baselines": []}', "baselines must be a JSON object"),
        ('{"output_goodput": 5, "baselines": {"alg1": {"output_goodput": "x"}}}', "baselines.alg1.output_goodput is 'x'; need a number >= 0"),
    ],
)
def test_a_bad_evaluation_record_is_named(tmp_path: Path, text: str, message: str) -> None:
    """The best checkpoint's eval.json, read on resume (the goodput to beat) and by `train`'s
    summary: a bad one is a CheckpointError naming the file, not a KeyError or a JSON
    traceback."""
    from batchpilot.agents.callbacks import BaselineEvalCallback, read_eval_record
    from batchpilot.agents.checkpoint import CheckpointError
    from batchpilot.training.commands.train import best_summary

    assert read_eval_record(tmp_path) is None and best_summary(tmp_path) == ""
    (tmp_path / "eval.json").write_text('{"output_goodput": 246.4, "baselines": {"alg1+alg2": {"output_goodput": 151}}}')
    assert read_eval_record(tmp_path)["output_goodput"] == 246.4
    assert best_summary(tmp_path) == " (evaluation goodput 246 tok/s; alg1+alg2 151)"
    (tmp_path / "eval.json").write_text(text)
    for read in (read_eval_record, best_summary):
        with pytest.raises(CheckpointError, match=re.escape(f"{tmp_path / 'eval.json'}: {message}")):
            read(tmp_path)
    with pytest.raises(CheckpointError, match=re.escape(message)):
        BaselineEvalCallback(None, "grid", SLO(), 1, tmp_path)  # type: ignore[arg-type]


def test_resume_continues_the_step_count(
    trained_run: Path, tmp_path: Path, monkeypatch, capsys
) -> None:
    import shutil

    import batchpilot.training.train as train_module
    from batchpilot.agents.checkpoint import read_state
    from batchpilot.training.train import train

    seeds = []  # the envs' seeds: a resumed run once drew its first episodes again
    make_vec_env = train_module.make_vec_env
    monkeypatch.setattr(
        train_module, "make_vec_env", lambda cfg, seed=None: seeds.append(seed) or make_vec_env(cfg, seed)
    )

    data = json.loads(json.dumps(TINY))
    data["batchpilot/Batching-v0"]["n_timesteps"] = 384
    config = write_config(tmp_path / "longer.yml", data)
    run_dir = tmp_path / "run"
    shutil.copytree(trained_run, run_dir)
    steps = read_state(run_dir / "checkpoints" / "step_256")["num_timesteps"]
    train(load_config(config), config, run_dir, resume=True, progress=False)
    assert read_state(run_dir / "final")["num_timesteps"] >= 384
    assert seeds == [TINY["batchpilot/Batching-v0"]["seed"] + steps]  # new episodes
    with pytest.raises(ValueError, match="already holds a run"):
        train(load_config(config), config, run_dir, resume=False, progress=False)
    # resumed again at the same n_timesteps: said, and no env started ("trained in 6 s" before)
    final = read_state(run_dir / "final")["num_timesteps"]
    train(load_config(config), config, run_dir, resume=True, progress=False)
    assert f"already at {final:,} steps, n_timesteps is 384: nothing to train" in (
        capsys.readouterr().out
    )
    assert len(seeds) == 1 and read_state(run_dir / "final")["num_timesteps"] == final


@pytest.fixture(scope="module")
def exported(trained_run: Path) -> Path:
    from batchpilot.agents.export import export

    out = trained_run.parent / "policy.onnx"
    export([trained_run], out, "final")
    return out


def test_onnx_matches_the_sb3_policy(trained_run: Path, exported: Path) -> None:
    """The exported graph acts as SB3's predict does, run by onnxruntime and by the
    deployed numpy network (the observation has fixed scales: VecNormalize normalises
    rewards only, the graph's normalisation is the identity)."""
    ort = pytest.importorskip("onnxruntime")
    from batchpilot.agents.checkpoint import load_policy_module, normalisation

    policy = load_policy_module(trained_run / "final")
    n_obs = policy.observation_space.shape[0]
    mean, var, _, clip = normalisation(trained_run / "final", n_obs)
    assert np.allclose(mean, 0) and np.allclose(var, 1) and not np.isfinite(clip)
    rng = np.random.default_rng(0)
    obs = rng.uniform(0, 2, size=(64, n_obs)).astype(np.float32)
    expected = policy.predict(obs, deterministic=True)[0]
    session = ort.InferenceSession(str(exported), providers=["CPUExecutionProvider"])
    got = session.run(None, {"observation": obs})[0]
    np.testing.assert_allclose(got, expected, atol=1e-5)
    act = load_policy(exported).act
    np.testing.assert_array_equal(np.stack([act(o) for o in obs]), expected)


def test_sidecar_describes_the_policy(exported: Path) -> None:
    meta = json.loads(sidecar_path(exported).read_text())
    from batchpilot.envs.observation import OBSERVATION_FIELDS, SCALES

    assert meta["observation"] == {"fields": list(OBSERVATION_FIELDS), "scales": SCALES}
    assert meta["action"] == {
        "mode": "grid",
        "seq_grid": list(SEQ_GRID),
        "budget_grid": list(BUDGET_GRID),
    }
    assert meta["slo"] == SLO_SPEC
    assert meta["control_interval"] == "500ms"
    assert {"batchpilot", "stable_baselines3", "torch", "onnx"} <= set(meta["versions"])


def test_policy_spec_runs_as_a_controller(exported: Path) -> None:
    controller = make_controller(f"policy:{exported}")
    m = run_metrics(controller, num_requests=60)
    assert m["completed"] == 60


def test_a_policy_path_is_found_under_home_and_not_split(
    exported: Path, tmp_path: Path, monkeypatch
) -> None:
    """``policy:~/...`` is the file under the home directory (no shell expands it there); a
    path that ``+`` would split says so."""
    from batchpilot.agents.policy import PolicyFileError

    monkeypatch.setenv("HOME", str(tmp_path))
    for name in ("p", "a+b"):
        (tmp_path / name).mkdir()
        for src in (exported, sidecar_path(exported)):
            (tmp_path / name / src.name).write_bytes(src.read_bytes())
    assert make_controller(f"policy:~/p/{exported.name}").control_interval is not None
    with pytest.raises(PolicyFileError, match=r"does not exist: .*if the path holds a '\+'"):
        make_controller(f"policy:{tmp_path}/a+b/{exported.name}")
    # a ',' split it before make_controller saw it: "policy:DIR/a" of "policy:DIR/a,b/p.onnx"
    with pytest.raises(PolicyFileError, match=r"does not exist: .*if the path holds a ','"):
        make_controller(f"policy:{tmp_path}/a")
    with pytest.raises(PolicyFileError) as missing:
        make_controller(f"policy:{tmp_path}/none.onnx")  # a whole .onnx name: no hint
    assert "holds a" not in str(missing.value)
    # a home that cannot be expanded: the loader's error, not a traceback from the hint
    with pytest.raises(PolicyFileError, match="no home directory"):
        make_controller("policy:~no_such_user_here/x")


def another_member(run: Path, dst: Path, **run_json) -> Path:
    """A copy of `run` whose final weights are shifted by seeded noise (a second member), with
    `run_json` changes to its run description."""
    import shutil

    from safetensors.numpy import load_file, save_file

    shutil.copytree(run, dst)
    weights = dst / "final" / "policy.safetensors"
    rng = np.random.default_rng(1)
    tensors = {}
    for key, value in load_file(weights).items():
        noise = rng.standard_normal(value.shape).astype(value.dtype)
        tensors[key] = np.asarray(value + 0.3 * noise) if value.dtype.kind == "f" else value
    save_file(tensors, weights)
    meta = json.loads((dst / "run.json").read_text())
    (dst / "run.json").write_text(json.dumps(meta | run_json))
    return dst


def summed_logit_choice(
    runs: list[Path], obs: np.ndarray, columns: list[list[int]] | None = None
) -> np.ndarray:
    """SB3's reference for an ensemble: per knob, the argmax of the members' summed logits,
    each member on its own observation normalisation and clip, and on its own `columns` of
    `obs` (default: all)."""
    import torch as th

    from batchpilot.agents.checkpoint import load_policy_module, normalisation

    logits = 0
    for k, member in enumerate(runs):
        policy = load_policy_module(member / "final")
        mine = obs if columns is None else obs[:, columns[k]]
        mean, var, eps, clip = normalisation(member / "final", mine.shape[1])
        x = np.clip((mine - mean) / np.sqrt(var + eps), -clip, clip).astype(np.float32)
        with th.no_grad():
            latent = policy.mlp_extractor.forward_actor(policy.extract_features(th.as_tensor(x)))
            logits = logits + policy.action_net(latent)
    nvec = [int(n) for n in policy.action_space.nvec]
    return np.stack([lg.argmax(1).numpy() for lg in th.split(logits, nvec, 1)], 1)


def test_an_ensemble_exports_as_one_policy(trained_run: Path, exported: Path, tmp_path) -> None:
    """Several runs export as one graph choosing, per knob, the argmax of the members' summed
    logits; onnxruntime and the deployed numpy network agree with SB3's networks. One member
    twice acts as that member alone."""
    from batchpilot.agents.checkpoint import load_policy_module
    from batchpilot.agents.export import export

    ort = pytest.importorskip("onnxruntime")
    other = another_member(trained_run, tmp_path / "other")
    out = tmp_path / "ensemble.onnx"
    export([trained_run, other], out, "final")
    policies = [load_policy_module(r / "final") for r in (trained_run, other)]
    n_obs = policies[0].observation_space.shape[0]
    obs = np.random.default_rng(0).uniform(0, 2, size=(256, n_obs)).astype(np.float32)
    expected = summed_logit_choice([trained_run, other], obs)
    alone = [p.predict(obs, deterministic=True)[0] for p in policies]
    assert (alone[0] != alone[1]).any() and (expected != alone[0]).any()  # members disagree
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"observation": obs})[0], expected)
    act = load_policy(out).act
    np.testing.assert_array_equal(np.stack([act(o) for o in obs]), expected)
    meta = json.loads(sidecar_path(out).read_text())
    assert [m["checkpoint"] for m in meta["members"]] == [
        str(trained_run / "final"),
        str(other / "final"),
    ]
    twice = tmp_path / "twice.onnx"
    export([trained_run, trained_run], twice, "final")
    single = load_policy(exported).act
    act = load_policy(twice).act
    np.testing.assert_array_equal(
        np.stack([act(o) for o in obs]), np.stack([single(o) for o in obs])
    )


def test_ensemble_members_keep_their_own_observation_normalisation(
    trained_run: Path, tmp_path
) -> None:
    """Members that normalise observations differently each read their own normalised copy:
    the graph equals the argmax of the members' summed logits, each on its own statistics
    and clip."""
    import shutil

    from batchpilot.agents.checkpoint import load_policy_module
    from batchpilot.agents.export import export

    ort = pytest.importorskip("onnxruntime")
    n_obs = load_policy_module(trained_run / "final").observation_space.shape[0]
    rng = np.random.default_rng(2)
    first = Path(shutil.copytree(trained_run, tmp_path / "first"))
    other = another_member(trained_run, tmp_path / "other")
    for member in (first, other):
        stats = json.loads((member / "final" / "vecnormalize.json").read_text())
        stats |= {
            "norm_obs": True,
            "clip_obs": 1.5,
            "obs_mean": rng.uniform(0, 1, n_obs).tolist(),
            "obs_var": rng.uniform(0.2, 2, n_obs).tolist(),
        }
        (member / "final" / "vecnormalize.json").write_text(json.dumps(stats))
    members = [first, other, first]
    out = tmp_path / "ensemble.onnx"
    export(members, out, "final")
    obs = rng.uniform(0, 3, size=(256, n_obs)).astype(np.float32)
    expected = summed_logit_choice(members, obs)
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"observation": obs})[0], expected)
    act = load_policy(out).act
    np.testing.assert_array_equal(np.stack([act(o) for o in obs]), expected)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"control_interval": "1s"}, "control_interval '1s' differs"),
        ({"env_kwargs": {"slo": "ttft:100,tpot:10"}}, "trained with another slo than"),
    ],
)
def test_an_ensemble_of_unlike_runs_is_refused(
    trained_run: Path, tmp_path, change, message
) -> None:
    from batchpilot.agents.export import export

    other = another_member(trained_run, tmp_path / "other", **change)
    with pytest.raises(PolicyFileError, match=message):
        export([trained_run, other], tmp_path / "x.onnx", "final")


def test_a_policy_trained_across_slos_observes_the_slo_it_serves(
    trained_run: Path, exported: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sidecar records `slo_scale`; the controller scales its observation by the run's
    SLO, warns where that lies outside the trained range, and a member trained at one SLO
    does not join an ensemble trained across them."""
    from batchpilot.agents.export import export

    env_kwargs = json.loads((trained_run / "run.json").read_text())["env_kwargs"]
    scale = {"ttft": [0.5, 2], "tpot": [1, 3]}
    member = another_member(trained_run, tmp_path / "m", env_kwargs=env_kwargs | {"slo_scale": scale})
    out = tmp_path / "slo.onnx"
    assert export([member], out, "final")["slo_scale"] == {"ttft": [0.5, 2.0], "tpot": [1.0, 3.0]}
    policy = load_policy(out)
    profile = get_profile("llama-7b-a100")
    caplog.set_level("WARNING", logger="batchpilot.policy")
    policy.reset(SimEngine(profile, slo=SLO.parse("ttft:1000,tpot:120")))
    assert (policy.observer.ttft_s, policy.observer.tpot_s) == (1.0, 0.12)
    assert not caplog.records
    policy.reset(SimEngine(profile, slo=SLO.parse("ttft:5000,tpot:120")))
    assert policy.observer.ttft_s == 5.0
    assert "ttft 5000 ms, not [1000, 4000]" in caplog.text
    policy.reset(SimEngine(profile, slo=SLO.parse("ttft:1000,tpot:120,e2el:9000")))
    assert "e2el 9000 ms, not unset" in caplog.text  # not scaled in training: must be the same
    fixed = load_policy(exported)  # trained at one SLO: observes the run's too, and says so
    fixed.reset(SimEngine(profile, slo=SLO.parse("ttft:1000,tpot:120")))
    assert (fixed.observer.ttft_s, fixed.observer.tpot_s) == (1.0, 0.12)
    assert "ttft 1000 ms, not 2000; tpot 120 ms, not 50" in caplog.text
    with pytest.raises(PolicyFileError, match="trained with another slo_scale than"):
        export([trained_run, member], tmp_path / "x.onnx", "final")
    one = tmp_path / "one"
    one.mkdir()
    edit_sidecar(copy_policy(out, one), slo_scale={"ttft": [1, 1]})  # no range: one SLO
    assert load_policy(one / "p.onnx").slo_scale is None
    for bad, message in (({"e2el": [1, 2]}, "unknown objective"), ({"tpot": [2, 1]}, "0 < lo")):
        (tmp_path / message).mkdir()
        copy = copy_policy(out, tmp_path / message)
        edit_sidecar(copy, slo_scale=bad)
        with pytest.raises(PolicyFileError, match=f"bad or missing slo/slo_scale.*{message}"):
            load_policy(copy)


def test_a_run_on_some_observation_entries_exports_and_serves_them(tmp_path: Path) -> None:
    """`observation_fields` picks the entries: the env, the evaluation callback, the export and
    the served controller all observe exactly those, in that order."""
    from batchpilot.agents.export import export
    from batchpilot.training.train import train

    picked = ["waiting", "kv_cache_usage", "tbt_p90_over_tpot", "log2_max_num_seqs"]
    body = json.loads(json.dumps(TINY))
    spec = body["batchpilot/Batching-v0"]
    spec.update(n_timesteps=64, checkpoint_freq=64)
    del spec["imitation"]
    spec["env_kwargs"]["observation_fields"] = picked
    spec["eval"] |= {"freq": 64, "workload": spec["eval"]["workload"][1:]}
    config = write_config(tmp_path / "picked.yml", body)
    train(load_config(config), config, tmp_path / "run", resume=False, progress=False)
    out = tmp_path / "picked.onnx"
    sidecar = export([tmp_path / "run"], out, "best")
    assert sidecar["observation"]["fields"] == picked
    policy = load_policy(out)
    assert policy.observer.fields == tuple(picked)
    assert run_metrics(policy, num_requests=40)["completed"] == 40
    meta = json.loads((tmp_path / "run" / "run.json").read_text())
    meta["env_kwargs"]["observation_fields"] = picked[:2]
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    with pytest.raises(PolicyFileError, match="takes 4 inputs, its run observes 2 entries"):
        export([tmp_path / "run"], out, "best")
    meta["env_kwargs"]["observation_fields"] = ["waiting", "queue_mood"]
    (tmp_path / "run" / "run.json").write_text(json.dumps(meta))
    with pytest.raises(PolicyFileError, match=r"run.json: env_kwargs: observation fields.*queue_mood"):
        export([tmp_path / "run"], out, "best")


def test_members_on_other_observation_entries_form_one_ensemble(
    trained_run: Path, tmp_path: Path
) -> None:
    """The graph reads the union of the members' entries, in layout order, and each member
    reads its own, in its own order: a member whose run names the entries reversed."""
    from batchpilot.agents.export import export

    ort = pytest.importorskip("onnxruntime")
    reversed_ = list(OBSERVATION_FIELDS[::-1])
    env = json.loads((trained_run / "run.json").read_text())["env_kwargs"]
    other = another_member(trained_run, tmp_path / "other", env_kwargs=env | {"observation_fields": reversed_})
    out = tmp_path / "mixed.onnx"
    sidecar = export([trained_run, other], out, "final")
    assert sidecar["observation"]["fields"] == list(OBSERVATION_FIELDS)
    assert [m["observation_fields"] for m in sidecar["members"]] == [list(OBSERVATION_FIELDS), reversed_]
    n = len(OBSERVATION_FIELDS)
    obs = np.random.default_rng(3).uniform(0, 2, size=(256, n)).astype(np.float32)
    expected = summed_logit_choice([trained_run, other], obs, [list(range(n)), list(range(n))[::-1]])
    assert (expected != summed_logit_choice([trained_run, other], obs)).any()  # the order counts
    session = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(session.run(None, {"observation": obs})[0], expected)
    act = load_policy(out).act
    np.testing.assert_array_equal(np.stack([act(o) for o in obs]), expected)


def copy_policy(src: Path, dst_dir: Path) -> Path:
    dst = dst_dir / "p.onnx"
    dst.write_bytes(src.read_bytes())
    sidecar_path(dst).write_text(sidecar_path(src).read_text())
    return dst


def edit_sidecar(path: Path, **changes) -> None:
    """Change sidecar fields and re-seal it (as an author of a new sidecar would)."""
    from batchpilot.agents.policy import seal

    meta = json.loads(sidecar_path(path).read_text()) | changes
    sidecar_path(path).write_text(json.dumps(seal(meta)))


def test_missing_policy_file(tmp_path: Path) -> None:
    with pytest.raises(PolicyFileError, match=r"policy file .*nope\.onnx does not exist"):
        load_policy(tmp_path / "nope.onnx")
    with pytest.raises(PolicyFileError, match="a directory, not a policy file; name the"):
        load_policy(tmp_path)
    (tmp_path / "bad.onnx").write_text("not a model")
    with pytest.raises(PolicyFileError, match=r"bad\.onnx's JSON sidecar .*bad\.onnx\.json does not exist"):
        load_policy(tmp_path / "bad.onnx")
    with pytest.raises(PolicyFileError, match=r"is a policy's JSON sidecar; name its \.onnx file"):
        load_policy(tmp_path / "bad.onnx.json")
    os.mkfifo(tmp_path / "pipe.onnx")  # opening it to read would block
    with pytest.raises(PolicyFileError, match=r"pipe\.onnx: not a regular file \(a pipe"):
        load_policy(tmp_path / "pipe.onnx")
    os.mkfifo(tmp_path / "bad.onnx.json")
    with pytest.raises(PolicyFileError, match=r"bad\.onnx\.json: not a regular file \(a pipe"):
        load_policy(tmp_path / "bad.onnx")


def test_tampered_onnx_is_refused(exported: Path, tmp_path: Path) -> None:
    p = copy_policy(exported, tmp_path)
    data = bytearray(p.read_bytes())
    data[len(data) // 2] ^= 0xFF
    p.write_bytes(bytes(data))
    with pytest.raises(PolicyFileError, match="sha256 does not match"):
        load_policy(p)


def test_corrupt_sidecar_is_refused(exported: Path, tmp_path: Path) -> None:
    p = copy_policy(exported, tmp_path)
    sealed = sidecar_path(p).read_text()
    sidecar_path(p).write_text("{not json")
    with pytest.raises(PolicyFileError, match="not valid JSON"):
        load_policy(p)
    sidecar_path(p).write_text('{"format": ' + "9" * 5000 + "}")
    with pytest.raises(PolicyFileError, match=r"p\.onnx\.json: the policy sidecar holds an integer of over"):
        load_policy(p)
    sidecar_path(p).write_text("[]")
    with pytest.raises(PolicyFileError, match=r"p\.onnx\.json: the policy sidecar must be a JSON object, not an array"):
        load_policy(p)
    # json would keep the second format_version (the sealed one) and load the policy
    sidecar_path(p).write_text(sealed.replace('"format_version"', '"format_version": 99, "format_version"', 1))
    with pytest.raises(PolicyFileError, match=r"p\.onnx\.json: the policy sidecar gives a key twice in one object \(format_version\)"):
        load_policy(p)


def test_other_version_is_refused(exported: Path, tmp_path: Path) -> None:
    p = copy_policy(exported, tmp_path)
    edit_sidecar(p, format_version=99)
    with pytest.raises(PolicyFileError, match="format version 99"):
        load_policy(p)


def test_other_observation_layout_is_refused(exported: Path, tmp_path: Path) -> None:
    p = copy_policy(exported, tmp_path)
    meta = json.loads(sidecar_path(p).read_text())
    fields = meta["observation"]["fields"]
    for bad in ([*fields[:-1], "queue_mood"], [*fields[:-1], fields[0]], []):
        edit_sidecar(p, observation=meta["observation"] | {"fields": bad})
        with pytest.raises(PolicyFileError, match="observation layout"):
            load_policy(p)
    edit_sidecar(p, observation=meta["observation"] | {"fields": fields[1:]})
    with pytest.raises(PolicyFileError, match=f"not a \\(batch, {len(fields) - 1}\\)"):
        load_policy(p)  # known entries, but not as many as the network's inputs
    scales = meta["observation"]["scales"] | {"requests": 512.0}
    edit_sidecar(p, observation=meta["observation"] | {"scales": scales})
    with pytest.raises(PolicyFileError, match="scaling constants"):
        load_policy(p)
    edit_sidecar(p, observation=meta["observation"], action=meta["action"] | {"seq_grid": [1, 2]})
    with pytest.raises(PolicyFileError, match="action"):
        load_policy(p)


def test_policy_runs_only_at_its_control_interval(exported: Path) -> None:
    controller = make_controller(f"policy:{exported}")
    with pytest.raises(ValueError, match="trained to decide every 500ms"):
        run(
            make_workload("fixed:64:16", "poisson:4", num_requests=10, seed=0),
            SimEngine(get_profile("llama-7b-a100"), slo=SLO.parse(SLO_SPEC)),
            controller,
            ControlInterval.parse("1it"),
        )


def test_non_onnx_file_with_matching_checksum_is_refused(exported: Path, tmp_path: Path) -> None:
    import hashlib

    p = copy_policy(exported, tmp_path)
    p.write_bytes(b"not an onnx graph")
    edit_sidecar(p, sha256=hashlib.sha256(b"not an onnx graph").hexdigest())
    with pytest.raises(PolicyFileError, match="not a loadable ONNX model"):
        load_policy(p)


def test_cli_reports_bad_policy_cleanly(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from batchpilot.training.cli import main

    code = main(
        [
            "simulate",
            "--controller",
            f"policy:{tmp_path / 'x.onnx'}",
            "--no-progress",
            "--num-requests",
            "5",
        ]
    )
    assert code == 2
    assert "does not exist" in capsys.readouterr().err


def test_train_report_step_says_first_whether_the_policy_won(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`train` with a `report` setting ends with a comparison per suite, headed (as the
    quickstart's) by the learned policy's verdict against the best reference."""
    from batchpilot.training.cli import main

    suite = tmp_path / "one.yml"
    suite.write_text(
        yaml.safe_dump(
            {
                "description": "one tiny scenario",
                "scenarios": [
                    {"name": "tiny", "profiles": ["llama-7b-a100"], "source": "embedded:gsm8k",
                     "arrival": "poisson:4", "num_requests": 30}
                ],
            }
        )
    )
    run = dict(TINY["batchpilot/Batching-v0"])
    run["report"] = {"suites": [str(suite)], "seeds": 2, "controllers": "static:64"}
    config = write_config(tmp_path / "tiny.yml", {"batchpilot/Batching-v0": run})
    out = tmp_path / "run"
    assert main(["train", "--config", str(config), "--out", str(out), "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"seed \d+: policy \S+ \(evaluation goodput [\d,]+ tok/s; alg1\+alg2 [\d,]+", printed)
    md = (out / "report" / "one" / "report.md").read_text()
    title, verdict, *_ = md.split("\n\n")
    assert title == "# Controller comparison"
    assert verdict.startswith("**The learned policy ")
    assert "- one/tiny on llama-7b-a100: " in verdict
    assert "<b>The learned policy " in (out / "report" / "one" / "report.html").read_text()
    combined = (out / "report" / "report.md").read_text().split("\n")
    assert combined[0] == "# The learned controller against the references"
    assert combined[2].startswith("**The learned policy ") and "over 1 suite " in combined[2]
    assert "| [one](#one) | 1 |" in "\n".join(combined) and "## one" in combined

    # by `batchpilot evaluate`: that policy and a copy, on that suite and a shipped one
    policy, copy = out / "policy.onnx", tmp_path / "copy.onnx"
    for a, b in ((policy, copy), (sidecar_path(policy), sidecar_path(copy))):
        b.write_bytes(a.read_bytes())
    argv = ["evaluate", "--policy", str(policy), "--policy", str(copy), "--references",
            "best-static,static:64", "--seeds", "2", "--out", str(tmp_path / "eval"),
            "--no-progress"]  # fmt: skip
    assert main([*argv, "--suite", str(suite), "--suite", "steady"]) == 0
    text = (tmp_path / "eval" / "report.md").read_text()
    assert_suites_report(text, tmp_path / "eval", ["one", "steady"], [policy, copy])
    rows = [x.split(" | ") for x in text.split("\n") if x.startswith("| [")]
    assert [r[1] for r in rows] == [f"`policy:{p}`" for p in (policy, policy, copy, copy)]
    assert [r[2:] for r in rows[:2]] == [r[2:] for r in rows[2:]]  # the same actions: equal
    interval = r"\d+\.\d{3}x \(\d+\.\d{3}-\d+\.\d{3}\)"  # paired over the 2 seeds
    assert all(re.fullmatch(interval, r[5]) and re.fullmatch(interval, r[6]) for r in rows), rows

    meta = json.loads(sidecar_path(copy).read_text())
    meta.pop("sidecar_sha256")
    sidecar_path(copy).write_text(json.dumps(seal(meta | {"control_interval": "1s"})))
    assert main([*argv, "--suite", "steady"]) == 2  # one interval for every policy


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"--policy": "none.onnx"}, "none.onnx does not exist"),
        ({"--references": " , "}, "--references ' , ': an empty controller spec between commas"),
        ({"--references": "alg1,"}, "--references 'alg1,': an empty controller spec between commas"),
        ({"--references": "bogus"}, "unknown controller 'bogus'"),
        ({"--suite": "nosuch"}, "unknown suite 'nosuch'"),
        ({"--suite": "steady", "--suite ": "steady"}, "two suites share a name (steady, steady)"),
        ({"--policy ": "{policy}"}, "a policy is given twice"),
        ({"--policy": "runs/a+b/policy.onnx"}, "policy path runs/a+b/policy.onnx: ',' separates"),
        # "policy file policy:... does not exist", and "given twice in" a list never typed
        ({"--policy": "policy:{policy}"}, "give the file's path alone; 'policy:' begins a"),
        ({"--references": "alg1,policy:{policy}"}, "--references names policy:"),
    ],
)
def test_evaluate_refuses_bad_input_before_any_run(tmp_path: Path, capsys, change, message) -> None:
    from importlib.resources import files

    from batchpilot.training.cli import main

    policy = files("batchpilot.training") / "reports" / "learned" / "policy.onnx"
    given = {"--policy": str(policy), "--suite": "steady", "--out": str(tmp_path / "x")}
    given |= {k: v.format(policy=policy) for k, v in change.items()}
    argv = ["evaluate", "--no-progress", *(x for k, v in given.items() for x in (k.strip(), v))]
    assert main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.rglob("results.json"))


def test_evaluate_checks_every_suite_before_the_first_runs(tmp_path: Path, capsys) -> None:
    """A scenario's own interval was overridden by the policy's without a word (every
    controller runs at the policy's here), and a later suite's seeds reaching the tuning seeds
    failed after the earlier suites had run."""
    from importlib.resources import files

    from batchpilot.training.cli import main

    policy = files("batchpilot.training") / "reports" / "learned" / "policy.onnx"
    one = {"description": "one", "seeds": 1, "profiles": ["llama-2-7b-a100"],
           "defaults": {"num_requests": 20},
           "scenarios": [{"name": "p", "source": "embedded:azure-conv", "arrival": "poisson:3"}]}  # fmt: skip
    (tmp_path / "a.yml").write_text(yaml.safe_dump(one))
    (tmp_path / "b.yml").write_text(yaml.safe_dump(one | {"seeds": 5}))
    timed = one | {"scenarios": [one["scenarios"][0] | {"interval": "2s"}]}
    (tmp_path / "t.yml").write_text(yaml.safe_dump(timed))
    base = ["evaluate", "--no-progress", "--policy", str(policy), "--references", "static:8"]
    suites = ["--suite", str(tmp_path / "a.yml"), "--suite", str(tmp_path / "b.yml")]
    assert main([*base, *suites, "--first-seed", "996", "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'b.yml'}: --first-seed 996 with 5 seeds reaches seed 1000" in err
    assert main([*base, "--suite", str(tmp_path / "t.yml"), "--out", str(tmp_path / "o")]) == 2
    assert "scenario 't/p on llama-2-7b-a100' sets interval 2s; the policy decides every 500ms" in (
        capsys.readouterr().err
    )
    assert not list(tmp_path.rglob("results.json"))
    assert main([*base, "--suite", str(tmp_path / "a.yml"), "--out", str(tmp_path / "o")]) == 0
    with pytest.raises(SystemExit):  # the second list replaced the first, silently
        main([*base, "--references", "alg1", "--suite", "steady", "--out", str(tmp_path / "r")])
    assert "--references: given more than once; give one comma-separated list" in (
        capsys.readouterr().err
    )


def assert_suites_report(text: str, out: Path, suites: list[str], policies: list[Path]) -> None:
    """A combined report opens with each policy's verdict over its suites, a row per suite
    and policy, then each suite's own report with its plots linked in its directory."""
    results = [json.loads((out / s / "results.json").read_text()) for s in suites]
    n = sum(len(r["scenarios"]) for r in results)
    lines = text.split("\n")
    assert lines[0] == "# The learned controller against the references"
    for line, policy in zip(lines[2::2], policies, strict=False):
        assert line.startswith(f"`policy:{policy}`: **The learned policy ")
        assert f" {n} scenarios over {len(suites)} suites" in line
    for s, r in zip(suites, results, strict=True):
        assert sum(x.startswith(f"| [{s}](#{s}) |") for x in lines) == len(policies)
        assert f"## {s}" in lines
        assert all(f"policy:{p}" in r["controllers"] for p in policies)
    images = [x[x.index("](") + 2 : -1] for x in lines if x.startswith("![")]
    assert images and all((out / i).is_file() and "/" in i for i in images)
    assert not any(x.startswith("# ") for x in lines[1:])  # one title: the suites' went down


@pytest.mark.parametrize("with_eval", [True, False])
def test_quickstart_trains_exports_and_reports(tmp_path: Path, with_eval: bool) -> None:
    """The main job end to end on a tiny config: the policy is a row of the report. A config
    without ``eval`` keeps no best checkpoint: the final one is exported."""
    import copy

    from batchpilot.training.cli import main

    data = copy.deepcopy(TINY)
    if not with_eval:
        del data["batchpilot/Batching-v0"]["eval"]
    config = write_config(tmp_path / "tiny.yml", data)
    out = tmp_path / "qs"
    argv = [
        "quickstart",
        "--config",
        str(config),
        "--workload",
        "fixed:256:64@poisson:8",
        "--seeds",
        "1",
        "--out",
        str(out),
        "--no-progress",
    ]
    assert main(argv) == 0
    results = json.loads((out / "results.json").read_text())
    rows = json.dumps(results)
    assert f"policy:{out / 'policy.onnx'}" in rows
    assert "alg1+alg2" in rows
    assert "policy:" in (out / "report.md").read_text()
    kept = "best" if with_eval else "final"
    assert (out / "run" / kept / "policy.safetensors").is_file()
    assert (out / "run" / "best").exists() == with_eval


@pytest.mark.parametrize(
    ("workload", "problem"),
    [
        ("embedded:gsm8k", "use SOURCE@ARRIVAL"),
        ("embedded:gsm8k@poisson:-1", "poisson"),
        ("{trace}@replay", "more than once"),
    ],
)
def test_quickstart_refuses_a_bad_workload_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], workload: str, problem: str
) -> None:
    from batchpilot.training.cli import main

    trace = tmp_path / "twice.csv"
    trace.write_text("TIMESTAMP,ContextTokens,ContextTokens,GeneratedTokens\n")
    out = tmp_path / "qs"
    argv = ["quickstart", "--config", str(write_config(tmp_path / "tiny.yml", TINY)),
            "--workload", workload.format(trace=trace), "--out", str(out), "--no-progress"]
    assert main(argv) == 2
    assert problem in capsys.readouterr().err
    assert not (out / "run").exists()  # nothing trained


def test_quickstart_compares_on_the_configs_evaluation_runs(tmp_path: Path) -> None:
    """Quickstart's default comparison: the evaluation workloads that run on the first
    evaluation profile, on that profile; without an ``eval``, compare's default workload
    on the training profile."""
    import copy

    from batchpilot.training.commands.common import DEFAULT_WORKLOAD
    from batchpilot.training.commands.quickstart import comparison

    data = copy.deepcopy(TINY)
    run = data["batchpilot/Batching-v0"]
    run["env_kwargs"]["profile"] = ["llama-2-7b-a100", "llama-2-70b-a100x4"]
    run["eval"]["profile"] = ["llama-2-70b-a100x4", "llama-2-7b-a100"]
    run["eval"]["workload"] = [
        {"source": "embedded:gsm8k", "arrival": "poisson:9", "num_requests": 20},
        {
            "source": "embedded:sharegpt",
            "arrival": "poisson:2",
            "num_requests": 20,
            "profiles": ["llama-2-7b-a100"],
        },
        {"source": "embedded:azure-conv", "arrival": "gamma:1:3", "num_requests": 20},
    ]
    cfg = load_config(write_config(tmp_path / "two.yml", data))
    assert comparison(cfg) == (
        "llama-2-70b-a100x4",
        ["embedded:gsm8k@poisson:9", "embedded:azure-conv@gamma:1:3"],
        ["--num-requests", "20"],
    )
    assert comparison(cfg, bad_rows="skip")[2] == ["--bad-rows", "skip", "--num-requests", "20"]
    run["eval"]["workload"][2]["num_requests"] = 30
    cfg = load_config(write_config(tmp_path / "sizes.yml", data))
    with pytest.raises(ValueError, match=r"one num_requests, but .* on llama-2-70b-a100x4 give 20, 30"):
        comparison(cfg)
    del run["eval"]
    cfg = load_config(write_config(tmp_path / "none.yml", data))
    assert comparison(cfg) == ("llama-2-7b-a100", [DEFAULT_WORKLOAD], [])
    bad = tmp_path / "bad.csv"  # a BurstGPT-like failed request: refused, with no way round it
    bad.write_text(
        "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:50.000000,100,0\n"
        "2023-11-16 18:15:51.000000,100,9\n"
    )
    with pytest.raises(ValueError, match=r"GeneratedTokens is 0.*--bad-rows skip"):
        comparison(cfg, [f"{bad}@replay"])
    assert comparison(cfg, [f"{bad}@replay"], "skip") == (
        "llama-2-7b-a100", [f"{bad}@replay"], ["--bad-rows", "skip"]
    )
    with pytest.raises(ValueError, match="--workload embedded:gsm8k@poisson:2 is given twice"):
        comparison(cfg, ["embedded:gsm8k@poisson:2", "embedded:gsm8k@poisson:2"])  # after training
    # compared on the simulated scheduler it trained on (it was always V1's)
    run["env_kwargs"]["engine_kwargs"] = {"scheduler": "v0"}
    cfg = load_config(write_config(tmp_path / "v0.yml", data))
    assert comparison(cfg) == ("llama-2-7b-a100", [DEFAULT_WORKLOAD], ["--scheduler", "v0"])


@pytest.mark.parametrize("name", train_configs())
def test_shipped_configs_build_their_envs(name: str) -> None:
    from importlib.resources import files

    from batchpilot.training.train import make_env

    cfg = load_config(Path(str(files("batchpilot.training") / "configs" / name)))
    env = make_env(cfg)
    obs, _ = env.reset(seed=0)
    assert env.observation_space.contains(obs)
    env.close()


def test_a_config_path_may_be_a_string() -> None:
    """The Python API took `str` for a trace but not for a config (an AttributeError)."""
    assert load_config("training/configs/quick.yml") == load_config(
        Path("training/configs/quick.yml")
    )


def test_runs_without_hidden_layers_export_alone_not_as_an_ensemble(tmp_path: Path) -> None:
    """Each exported alone; side by side, the head read one observation per member as if
    it were their features: a torch traceback."""
    from batchpilot.agents.export import export
    from batchpilot.training.train import train

    body = json.loads(json.dumps(TINY))
    spec = body["batchpilot/Batching-v0"]
    spec.update(n_timesteps=64, checkpoint_freq=64, policy_kwargs={"net_arch": {"pi": [], "vf": [8]}})
    del spec["imitation"], spec["eval"]
    config = write_config(tmp_path / "linear.yml", body)
    runs = [tmp_path / "a", tmp_path / "b"]
    for out in runs:
        train(load_config(config), config, out, resume=False, progress=False)
    assert export(runs[:1], tmp_path / "one.onnx", "final")
    with pytest.raises(PolicyFileError, match=r"a policy with no hidden layer \(net_arch pi: \[\]\) forms no ensemble"):
        export(runs, tmp_path / "two.onnx", "final")
