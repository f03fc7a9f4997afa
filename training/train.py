"""Train a learned controller from an rl-zoo3-style YAML config.

A config has one top-level key, the env id, mapping to the run's settings; the keys in
`RUN_KEYS` are batchpilot's, every other key is a keyword of the algorithm (PPO)::

    batchpilot/Batching-v0:
      algo: ppo
      n_envs: 2
      n_timesteps: 50000
      residual: {baseline: alg1+alg2, max_log2_step: 2.0, hold: 16}
      env_kwargs: {profile: [llama-7b-a100], workload: [...], slo: "ttft:2000,tpot:100"}
      eval: {freq: 10000, profile: llama-7b-a100, workload: {...}, seeds: [1000, 1001]}
      n_steps: 256
      policy_kwargs: {net_arch: [64, 64], log_std_init: -1.0}

A run directory holds ``config.yml``, ``run.json``, ``tb/`` (tensorboard), ``checkpoints/``,
``best/`` (best evaluation) and ``final/``.
"""

from __future__ import annotations

import functools
import json
import re
import shutil
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import yaml

from batchpilot.agents.residual import ResidualSpec
from batchpilot.envs import ENV_ID

RUN_KEYS = (
    "algo",
    "seed",
    "n_envs",
    "n_timesteps",
    "max_episode_steps",
    "normalize",
    "policy",
    "residual",
    "env_kwargs",
    "eval",
    "checkpoint_freq",
)
ALGOS = ("ppo",)


@dataclass
class TrainConfig:
    """A parsed config (see the module docstring)."""

    env_id: str
    algo: str = "ppo"
    seed: int = 0
    n_envs: int = 2
    n_timesteps: int = 50_000
    max_episode_steps: int = 20_000
    normalize: bool = True
    policy: str = "MlpPolicy"
    residual: ResidualSpec = field(default_factory=ResidualSpec)
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] | None = None
    checkpoint_freq: int = 10_000
    hyperparams: dict[str, Any] = field(default_factory=dict)

    @property
    def control_interval(self) -> str:
        """The env step as a `ControlInterval` spec (the policy's deployment cadence)."""
        iters = self.env_kwargs.get("control_interval_iters")
        if iters is not None:
            return f"{iters}it"
        return f"{self.env_kwargs.get('control_interval_s', 0.25) * 1e3:g}ms"


def load_config(path: Path) -> TrainConfig:
    """Parse and check a config file; errors name the file and the bad key."""
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{path}: not valid YAML ({exc})") from None
    if not isinstance(data, dict) or len(data) != 1:
        raise ValueError(f"{path}: expected one top-level key, the env id ({ENV_ID})")
    ((env_id, body),) = data.items()
    if env_id != ENV_ID:
        raise ValueError(f"{path}: env id {env_id!r}; batchpilot trains on {ENV_ID}")
    if not isinstance(body, dict):
        raise ValueError(f"{path}: {env_id} must map to a dict of settings")
    run = {k: body[k] for k in RUN_KEYS if k in body}
    hyper = {k: v for k, v in body.items() if k not in RUN_KEYS}
    if run.get("algo", "ppo") not in ALGOS:
        raise ValueError(f"{path}: algo {run['algo']!r}; supported: {', '.join(ALGOS)}")
    try:
        run["residual"] = ResidualSpec(**run.get("residual", {}))
    except TypeError as exc:
        raise ValueError(f"{path}: residual: {exc}") from None
    for key in ("n_timesteps", "n_envs", "max_episode_steps", "checkpoint_freq"):
        if key in run:
            run[key] = int(run[key])
            if run[key] < 1:
                raise ValueError(f"{path}: {key} must be >= 1")
    cfg = TrainConfig(env_id=env_id, hyperparams=hyper, **run)
    if cfg.env_kwargs.get("action_mode", "absolute") != "absolute":
        raise ValueError(f"{path}: env_kwargs.action_mode must be absolute (the residual's)")
    return cfg


def make_env(cfg: TrainConfig) -> Any:
    """One training env: the registered env, the residual wrapper, SB3's Monitor."""
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    from batchpilot.agents.residual import ResidualWrapper

    env = gym.make(cfg.env_id, max_episode_steps=cfg.max_episode_steps, **cfg.env_kwargs)
    return Monitor(ResidualWrapper(env, cfg.residual))


def make_vec_env(cfg: TrainConfig) -> Any:
    """`n_envs` envs in subprocesses (in-process for one), seeded from the config."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [functools.partial(make_env, cfg) for _ in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.n_envs > 1 else DummyVecEnv(fns)
    venv.seed(cfg.seed)
    return venv


def latest_checkpoint(run_dir: Path) -> tuple[Path, Path | None] | None:
    """(model zip, VecNormalize pickle or None) of the newest periodic checkpoint."""
    found = []
    for p in (run_dir / "checkpoints").glob("ckpt_*_steps.zip"):
        m = re.fullmatch(r"ckpt_(\d+)_steps\.zip", p.name)
        if m:
            found.append((int(m.group(1)), p))
    if not found:
        return None
    steps, model = max(found)
    vecnorm = run_dir / "checkpoints" / f"ckpt_vecnormalize_{steps}_steps.pkl"
    return model, vecnorm if vecnorm.exists() else None


def _new_model(cfg: TrainConfig, venv: Any, tb: Path) -> Any:
    from stable_baselines3 import PPO

    model = PPO(
        cfg.policy, venv, seed=cfg.seed, tensorboard_log=str(tb), device="cpu", **cfg.hyperparams
    )
    # warm start: a zero action head makes the untrained policy's mean the baselines' limit
    head = model.policy.action_net
    head.weight.data.zero_()
    head.bias.data.zero_()
    return model


def train(cfg: TrainConfig, config_path: Path, out: Path, *, resume: bool, progress: bool) -> Path:
    """Train (or resume) a run in `out`; returns the directory of the best checkpoint."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.vec_env import VecNormalize

    from batchpilot.agents.callbacks import (
        BaselineEvalCallback,
        DomainMetricsCallback,
        EvalScenario,
        save_checkpoint,
    )
    from batchpilot.envs.metrics import SLO

    previous = latest_checkpoint(out) if resume else None
    if resume and previous is None:
        raise ValueError(f"--resume: no checkpoint under {out}/checkpoints")
    if not resume and (out / "run.json").exists():
        raise ValueError(f"{out} already holds a run; pass --resume or choose another --out")
    out.mkdir(parents=True, exist_ok=True)
    if not resume:
        shutil.copyfile(config_path, out / "config.yml")
    meta = {
        "env_id": cfg.env_id,
        "algo": cfg.algo,
        "residual": cfg.residual.to_dict(),
        "env_kwargs": cfg.env_kwargs,
        "control_interval": cfg.control_interval,
        "versions": {"batchpilot": version("batchpilot")},
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")

    venv = make_vec_env(cfg)
    if previous is not None:
        model_path, vecnorm_path = previous
        if vecnorm_path is not None:
            venv = VecNormalize.load(str(vecnorm_path), venv)
        model = PPO.load(model_path, env=venv, device="cpu", tensorboard_log=str(out / "tb"))
    else:
        if cfg.normalize:
            venv = VecNormalize(
                venv, norm_obs=True, norm_reward=True, gamma=cfg.hyperparams.get("gamma", 0.99)
            )
        model = _new_model(cfg, venv, out / "tb")

    slo = SLO.parse(cfg.env_kwargs.get("slo", "ttft:2000,tpot:100"))
    callbacks = [
        DomainMetricsCallback(),
        CheckpointCallback(
            max(1, cfg.checkpoint_freq // cfg.n_envs),
            str(out / "checkpoints"),
            name_prefix="ckpt",
            save_vecnormalize=True,
        ),
    ]
    if cfg.eval:
        ev = dict(cfg.eval)
        freq = int(ev.pop("freq", 10_000))
        scenario = EvalScenario(slo=str(slo), interval=cfg.control_interval, **ev)
        callbacks.append(
            BaselineEvalCallback(
                scenario, cfg.residual, slo, max(1, freq // cfg.n_envs), out / "best"
            )
        )
    remaining = cfg.n_timesteps - (model.num_timesteps if previous is not None else 0)
    try:
        model.learn(
            max(remaining, 0),
            callback=CallbackList(callbacks),
            progress_bar=progress,
            tb_log_name="ppo",
            reset_num_timesteps=previous is None,
        )
    finally:
        venv.close()
    save_checkpoint(model, out / "final")
    return out / "best" if (out / "best" / "model.zip").exists() else out / "final"
