"""Warm start by imitation: behaviour cloning from a teacher controller, with DAgger rounds.

The teacher (by default the lookahead oracle ``mpc``) is any controller spec. Round 0
lets the teacher drive the environment and records (observation, teacher's action);
each later round lets the current policy drive (with probability ``1 - beta`` per
decision, ``beta`` halving each round) while the teacher still labels every state the
policy visits, and the policy is refitted on everything gathered so far (Ross et al.,
DAgger). The policy is SB3's own policy object (`ActorCriticPolicy`), so PPO continues
from exactly what was cloned. The ``imitation`` library would fit, but pins
gymnasium 0.29 and stable-baselines3 2.2; this loop is the few lines it needs.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np


@dataclass(frozen=True)
class ImitationSpec:
    """Settings of the imitation phase (the config's ``imitation`` key)."""

    teacher: str = "mpc:horizon_s=8"
    """Controller spec of the teacher (a simulator-only oracle may be used)."""
    rounds: int = 3
    """Round 0 (teacher drives) plus `rounds - 1` DAgger rounds (policy drives)."""
    episodes: int = 4
    """Episodes collected per round."""
    beta: float = 0.5
    """Probability the teacher acts in DAgger round 1; halves each later round."""
    epochs: int = 30
    batch_size: int = 256
    learning_rate: float = 1e-3
    value_epochs: int = 10
    """Epochs fitting the value head to the collected discounted returns."""

    def __post_init__(self) -> None:
        for key in ("rounds", "episodes", "epochs", "batch_size"):
            if getattr(self, key) < 1:
                raise ValueError(f"imitation: {key} must be >= 1, got {getattr(self, key)}")
        if not 0.0 <= self.beta <= 1.0:
            raise ValueError(f"imitation: beta must be in [0, 1], got {self.beta}")
        if self.learning_rate <= 0 or self.value_epochs < 0:
            raise ValueError("imitation: need learning_rate > 0 and value_epochs >= 0")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Episode:
    """What one collected episode leaves: states, teacher labels, rewards, its metrics."""

    obs: np.ndarray
    labels: np.ndarray
    rewards: np.ndarray
    metrics: dict[str, float]


def collect_episode(
    make_env: Callable[[], gym.Env],
    teacher_spec: str,
    seed: int,
    policy: Any | None,
    beta: float,
) -> Episode:
    """Run one episode; the teacher labels every state; who acts: see the module doc.

    `policy` is an SB3 policy (None: the teacher always acts).
    """
    import torch as th

    from batchpilot.baselines.specs import make_controller

    th.set_num_threads(1)
    env = make_env()
    base = env.unwrapped
    obs, _ = env.reset(seed=seed)
    teacher = make_controller(teacher_spec)
    teacher.reset(base.engine)
    rng = np.random.default_rng(seed)
    states, labels, rewards = [], [], []
    done = False
    info: dict[str, Any] = {}
    while not done:
        label = base.grid.action_for(teacher.decide(base.telemetry))
        states.append(obs)
        labels.append(label)
        action = label
        if policy is not None and rng.random() >= beta:
            action = policy.predict(obs, deterministic=True)[0]
        obs, reward, terminated, truncated, info = env.step(action)
        rewards.append(reward)
        done = terminated or truncated
    env.close()
    metrics = info.get("episode_metrics") or base.engine.result().metrics()
    return Episode(
        np.asarray(states, np.float32),
        np.asarray(labels, np.int64),
        np.asarray(rewards, np.float64),
        metrics,
    )


def discounted_returns(rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.empty_like(rewards)
    acc = 0.0
    for i in range(len(rewards) - 1, -1, -1):
        acc = rewards[i] + gamma * acc
        out[i] = acc
    return out


def fit(
    policy: Any,
    obs: np.ndarray,
    labels: np.ndarray,
    returns: np.ndarray,
    spec: ImitationSpec,
    rng: np.random.Generator,
) -> dict[str, float]:
    """Behaviour cloning (negative log-likelihood of the teacher's actions), then the
    value head on the returns (so PPO starts with a critic). Returns the final losses."""
    import torch as th

    params = list(policy.parameters())
    opt = th.optim.Adam(params, lr=spec.learning_rate)
    x = th.as_tensor(obs)
    y = th.as_tensor(labels)
    v = th.as_tensor(returns, dtype=th.float32)
    n = len(x)
    policy.set_training_mode(True)
    nll = th.zeros(())
    for _ in range(spec.epochs):
        for idx in np.array_split(rng.permutation(n), max(1, n // spec.batch_size)):
            dist = policy.get_distribution(x[idx])
            nll = -dist.log_prob(y[idx]).mean()
            opt.zero_grad()
            nll.backward()
            opt.step()
    value_loss = th.zeros(())
    for _ in range(spec.value_epochs):
        for idx in np.array_split(rng.permutation(n), max(1, n // spec.batch_size)):
            value_loss = th.nn.functional.mse_loss(policy.predict_values(x[idx]).flatten(), v[idx])
            opt.zero_grad()
            value_loss.backward()
            opt.step()
    policy.set_training_mode(False)
    with th.no_grad():
        predicted = policy.get_distribution(x).mode().numpy()
    return {
        "nll": float(nll.detach()),
        "accuracy": float((predicted == labels).all(axis=1).mean()),
        "value_loss": float(value_loss.detach()),
    }


def dagger(
    model: Any,
    make_env: Callable[[], gym.Env],
    spec: ImitationSpec,
    *,
    seed: int,
    gamma: float,
    workers: int = 1,
    log: Callable[[dict[str, float], int], None] | None = None,
) -> list[dict[str, float]]:
    """Clone `spec.teacher` into `model.policy` over `spec.rounds` rounds (see module doc).

    `log(values, round)` receives each round's ``imitation/*`` figures. Returns them.
    """
    rng = np.random.default_rng(seed)
    obs_all: list[np.ndarray] = []
    labels_all: list[np.ndarray] = []
    returns_all: list[np.ndarray] = []
    history = []
    for r in range(spec.rounds):
        beta = 1.0 if r == 0 else spec.beta**r
        policy = None if r == 0 else model.policy
        seeds = [seed + 10_000 * r + i for i in range(spec.episodes)]
        args = [(make_env, spec.teacher, s, policy, beta) for s in seeds]
        if workers > 1:
            ctx = multiprocessing.get_context("spawn")  # no fork of a process running torch
            with ProcessPoolExecutor(min(workers, len(args)), mp_context=ctx) as pool:
                episodes = list(pool.map(collect_episode, *zip(*args, strict=True)))
        else:
            episodes = [collect_episode(*a) for a in args]
        for ep in episodes:
            obs_all.append(ep.obs)
            labels_all.append(ep.labels)
            returns_all.append(discounted_returns(ep.rewards, gamma))
        stats = fit(
            model.policy,
            np.concatenate(obs_all),
            np.concatenate(labels_all),
            np.concatenate(returns_all),
            spec,
            rng,
        )
        stats |= {
            "beta": beta,
            "samples": float(sum(len(o) for o in obs_all)),
            "driver_goodput": float(np.mean([e.metrics["output_goodput"] for e in episodes])),
            "driver_preemptions": float(np.mean([e.metrics["num_preemptions"] for e in episodes])),
        }
        if log is not None:
            log(stats, r)
        history.append(stats)
    return history
