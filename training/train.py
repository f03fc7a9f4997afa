"""Train a learned controller from an rl-zoo3-style YAML config.

A config has one top-level key, the env id, mapping to the run's settings; the keys in
`RUN_KEYS` are batchpilot's, every other key is a keyword of the algorithm (PPO)::

    batchpilot/Batching-v0:
      algo: ppo
      n_envs: 2
      n_timesteps: 50000
      imitation: {teacher: "mpc:horizon_s=8", rounds: 3, episodes: 4}
      env_kwargs: {profile: [llama-7b-a100], workload: [...], slo: "ttft:2000,tpot:50"}
      eval: {freq: 10000, profile: llama-7b-a100, workload: [{...}, ...], seeds: [1000, 1001]}
      n_steps: 256
      policy_kwargs: {net_arch: [64, 64]}

Training has two phases: imitation of the ``imitation.teacher`` controller (behaviour
cloning with DAgger rounds, `batchpilot.agents.imitation`; tensorboard ``imitation/*``),
then PPO (tensorboard ``ppo_*``). The evaluation callback keeps the best policy seen,
the imitation result included, in ``best/``: best by the geometric mean, over the
``eval`` runs (each workload on each profile), of the goodput on its seeds.

A run directory holds ``config.yml``, ``run.json``, ``tb/`` (tensorboard), ``checkpoints/``,
``best/`` (best evaluation) and ``final/``; with a ``report`` setting, also
``policy.onnx`` (`kept_checkpoint`, exported) and ``report/`` (`write_report`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import json
import os
import shutil
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

from batchpilot.agents.imitation import Collector, ImitationSpec, round_seeds
from batchpilot.agents.schema import (
    EXACT_COUNT,
    Check,
    dataclass_hints,
    mapping_problems,
    number,
    signature_hints,
    unknown_key,
    whole_float,
)
from batchpilot.baselines.specs import split_specs
from batchpilot.envs import ENV_ID
from batchpilot.envs.arrivals import DEFAULT_ARRIVAL
from batchpilot.envs.batching_env import CONTROL_INTERVAL_S
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.input_files import regular_file
from batchpilot.envs.metrics import DEFAULT_SLO
from batchpilot.envs.observation import checked_fields
from batchpilot.training.limits import MAX_REQUESTS, MAX_SEEDS
from batchpilot.training.yaml_files import load_yaml

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
    imitation: ImitationSpec | None = None
    """The warm start (`ImitationSpec`); None: PPO from scratch."""
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    eval: dict[str, Any] | None = None
    checkpoint_freq: int = 10_000
    report: dict[str, Any] | None = None
    """The evaluation report `train` ends with: ``suites`` (scenario suites: names under
    training/scenarios or YAML paths relative to the config), ``seeds``, ``controllers``
    (the references; the trained policy is added); None: no report."""
    hyperparams: dict[str, Any] = field(default_factory=dict)
    """Every other key: keyword arguments of the algorithm (PPO)."""

    @property
    def sim_engine_kwargs(self) -> dict[str, Any]:
        """`SimEngine` keywords of the engine trained on ({} for a vLLM run: its keywords
        are vLLM's, and its evaluations run the default simulator)."""
        if self.env_kwargs.get("engine", "sim") != "sim":
            return {}
        return dict(self.env_kwargs.get("engine_kwargs") or {})

    @property
    def control_interval(self) -> str:
        """The env step as a `ControlInterval` spec (the policy's deployment cadence)."""
        iters = self.env_kwargs.get("control_interval_iters")
        if iters is not None:
            return str(ControlInterval(iterations=iters))
        seconds = self.env_kwargs.get("control_interval_s")
        seconds = CONTROL_INTERVAL_S if seconds is None else seconds
        return str(ControlInterval(iterations=None, seconds=seconds))


RUN_KEYS = tuple(f for f in TrainConfig.__dataclass_fields__ if f not in ("env_id", "hyperparams"))
"""batchpilot's own config keys: `TrainConfig`'s fields (checked against their types)."""
RUN_RANGES: dict[str, Check] = {
    "seed": number(0, 2**32 - 1, integer=True),
    "n_envs": number(1, 64, integer=True),
    "n_timesteps": number(1, 1e12, integer=True),
    "max_episode_steps": number(1, 1e9, integer=True),
    "checkpoint_freq": number(1, 1e12, integer=True),
}
SET_BY_BATCHPILOT = ("policy", "env", "seed", "tensorboard_log", "device", "_init_setup_model")
"""PPO arguments a config may not give (batchpilot passes them; ``policy`` is a run key)."""
PPO_RANGES: dict[str, Check] = {
    "learning_rate": number(0.0, 1.0, low_open=True),
    "n_steps": number(1, 1e7, integer=True),
    "batch_size": number(1, 1e7, integer=True),
    "n_epochs": number(1, 1e4, integer=True),
    "gamma": number(0.0, 1.0),
    "gae_lambda": number(0.0, 1.0),
    "clip_range": number(0.0, 10.0, low_open=True),
    "clip_range_vf": number(0.0, 1e6, low_open=True),
    "ent_coef": number(0.0, 1e3),
    "vf_coef": number(0.0, 1e3),
    "max_grad_norm": number(0.0, 1e6, low_open=True),
    "target_kl": number(0.0, 1e3, low_open=True),
    "stats_window_size": number(1, 1e6, integer=True),
    "verbose": number(0, 2, integer=True),
}


def _seeds_problem(seeds: list[int]) -> str | None:
    """``eval.seeds``' range check: at least one seed, each one `seed` may be, none twice
    (a repeated seed would count twice in the evaluation's mean)."""
    if not seeds:
        return "needs at least one seed"
    if len(seeds) > MAX_SEEDS:
        return f"{len(seeds):,} seeds; at most {MAX_SEEDS:,}"
    if len(set(seeds)) < len(seeds):
        return f"a seed given twice in {seeds}"
    problems = [RUN_RANGES["seed"](s) for s in seeds]
    return next((f"an entry: {p}" for p in problems if p), None)


EVAL_RANGES: dict[str, Check] = {"freq": number(1, 1e12, integer=True), "seeds": _seeds_problem}
EVAL_WORKLOAD = {
    "source": str, "arrival": str, "num_requests": int, "bad_rows": str, "profiles": list[str],
}  # fmt: skip
WORKLOAD_RANGES: dict[str, Check] = {"num_requests": number(1, MAX_REQUESTS, integer=True)}
REPORT_KEYS = {"suites": list[str], "seeds": int, "controllers": str}
REPORT_RANGES: dict[str, Check] = {"seeds": number(1, MAX_SEEDS, integer=True)}
IMITATION_RANGES: dict[str, Check] = {
    "rounds": number(1, 1000, integer=True),
    "episodes": number(1, 1e6, integer=True),
    "beta": number(0.0, 1.0),
    "epochs": number(1, 1e5, integer=True),
    "batch_size": number(1, 1e7, integer=True),
    "learning_rate": number(0.0, 1.0, low_open=True),
    "value_epochs": number(0, 1e5, integer=True),
}


def _env_class() -> Any:
    """The registered env's class."""
    import importlib

    import gymnasium as gym

    module, _, name = str(gym.registry[ENV_ID].entry_point).partition(":")
    return getattr(importlib.import_module(module), name)


def _env_hints() -> dict[str, Any]:
    """Keyword arguments of the registered env's constructor and their annotations."""
    return signature_hints(_env_class().__init__)


def setting_hints() -> tuple[dict[str, Any], dict[str, Any]]:
    """The annotations of a config's top-level keys: batchpilot's own (`TrainConfig`) and
    PPO's arguments a config may set."""
    from stable_baselines3 import PPO

    ppo_hints = {
        k: v for k, v in signature_hints(PPO.__init__).items() if k not in SET_BY_BATCHPILOT
    }
    return dataclass_hints(TrainConfig), ppo_hints


def _eval_hints() -> dict[str, Any]:
    """The annotations of a config's `eval` keys."""
    from batchpilot.agents.callbacks import EvalScenario

    hints = dataclass_hints(EvalScenario) | {"freq": int}
    return {k: v for k, v in hints.items() if k not in ("slo", "interval", "engine_kwargs")}


SCHEDULED = ("learning_rate", "clip_range", "clip_range_vf")
"""PPO's settings rl-zoo3 configs may give as a schedule (``lin_3e-4``)."""


def config_problems(body: dict[str, Any]) -> list[str]:
    """Every unknown key, wrong type and out-of-range value of a config's settings."""
    from stable_baselines3 import PPO

    from batchpilot.agents.checkpoint import policy_kwargs_problems

    run_hints, ppo_hints = setting_hints()
    problems = []
    for key, value in body.items():
        if key in RUN_KEYS:
            hint = dict if key == "imitation" else run_hints[key]
            problems += mapping_problems({key: value}, {key: hint}, RUN_RANGES)
        elif key in SCHEDULED and isinstance(value, str) and value.startswith("lin_"):
            problems.append(
                f"{key}: {value!r} is an rl-zoo3 linear schedule, which batchpilot does not "
                "read; give a constant"
            )
        elif key in ppo_hints:
            problems += mapping_problems({key: value}, ppo_hints, PPO_RANGES)
        else:
            known = [*RUN_KEYS, *ppo_hints]
            what = "not a batchpilot setting nor a PPO argument"
            if key in SET_BY_BATCHPILOT:
                what = "batchpilot sets it"
            problems.append(f"{key}: {unknown_key(key, known, what)}")
    if problems:
        return problems  # the nested checks below assume the right container types
    imitation = body.get("imitation") or {}
    problems += mapping_problems(
        imitation, dataclass_hints(ImitationSpec), IMITATION_RANGES, prefix="imitation.", what="it"
    )
    # given, but read by nothing (a default cannot be told from a value given in the spec)
    if "regret_weight" in imitation and not imitation.get("regret_knobs"):
        problems.append(
            "imitation.regret_weight: it weighs the regret labels of regret_knobs, which are "
            "none here: give regret_knobs, or leave regret_weight out"
        )
    if "beta" in imitation and imitation.get("rounds", ImitationSpec.rounds) == 1:
        problems.append(
            "imitation.beta: only DAgger rounds read it (the rounds after the first), and "
            "rounds is 1: give more rounds, or leave beta out"
        )
    env_kwargs = body.get("env_kwargs", {})
    problems += mapping_problems(
        env_kwargs, _env_hints(), prefix="env_kwargs.", what=f"a keyword of {ENV_ID}"
    )
    specs = env_kwargs.get("workload")
    specs = specs if isinstance(specs, list) else [specs]
    for i, spec in enumerate(specs):
        # `WorkloadSpec` takes it as given: a huge count would exhaust memory at the first draw
        if isinstance(spec, dict) and "num_requests" in spec:
            where = "env_kwargs.workload" if len(specs) == 1 else f"env_kwargs.workload[{i}]"
            if problem := WORKLOAD_RANGES["num_requests"](spec["num_requests"]):
                problems.append(f"{where}.num_requests: {problem}")
    if body.get("eval") == {}:  # read as no evaluation: no best checkpoint, unsaid
        problems.append("eval: an empty block; give its profile and workload, or drop it")
    problems += mapping_problems(
        body.get("eval") or {}, _eval_hints(), EVAL_RANGES, prefix="eval.", what="eval"
    )
    workloads = (body.get("eval") or {}).get("workload")
    workloads = [workloads] if isinstance(workloads, dict) else workloads
    for i, workload in enumerate(workloads if isinstance(workloads, list) else []):
        if not isinstance(workload, dict):  # the type check above names it
            continue
        # what `EvalScenario.score` passes to `make_workload`
        where = "eval.workload" if len(workloads) == 1 else f"eval.workload[{i}]"
        problems += mapping_problems(
            workload, EVAL_WORKLOAD, WORKLOAD_RANGES, prefix=f"{where}.", what="it"
        )
        if "source" not in workload:
            problems.append(f"{where}: needs a source (e.g. embedded:azure-conv)")
    problems += mapping_problems(
        body.get("report") or {}, REPORT_KEYS, REPORT_RANGES, prefix="report.", what="report"
    )
    policy_kwargs = body.get("policy_kwargs") or {}
    problems += policy_kwargs_problems(policy_kwargs)
    if body.get("policy", "MlpPolicy") != "MlpPolicy":
        problems.append(f"policy: {body['policy']!r}; batchpilot's observations need MlpPolicy")
    if body.get("algo", "ppo") not in ALGOS:
        problems.append(f"algo {body['algo']!r}; supported: {', '.join(ALGOS)}")
    n_steps = body.get("n_steps", inspect.signature(PPO).parameters["n_steps"].default)
    n_rollout = n_steps * body.get("n_envs", TrainConfig.n_envs)
    if n_rollout <= 1:
        problems.append(f"n_steps x n_envs is {n_rollout}; PPO needs more than 1")
    batch = body.get("batch_size", 0)  # as given (SB3's own default it warns about itself)
    if batch > n_rollout > 1:
        problems.append(
            f"batch_size: {batch} is more than a rollout (n_steps x n_envs = {n_rollout}); "
            f"PPO would train on batches of {n_rollout}"
        )
    steps = body.get("n_timesteps", TrainConfig.n_timesteps)
    if steps < n_rollout:
        problems.append(
            f"n_timesteps: {steps} is less than a rollout (n_steps x n_envs = {n_rollout}); "
            "PPO collects whole rollouts, so it would train that many steps"
        )
    return problems


def _whole_number(value: Any) -> Any:
    """`value` as an int if it is a whole-number float up to 2^53 (still exact), else as is."""
    if whole_float(value) and abs(value) <= EXACT_COUNT:
        return int(value)
    return value


def _whole(values: dict[str, Any], hints: dict[str, Any]) -> dict[str, Any]:
    """`values` with each whole-number float given for a key annotated int (or a list of
    ints) read as that int; a fraction, or a float past 2^53, stays a float."""
    out = dict(values)
    for key, hint in hints.items():
        if key not in out or int not in (hint, *typing.get_args(hint)):
            continue
        value = out[key]
        whole = [_whole_number(v) for v in value] if isinstance(value, list) else None
        out[key] = _whole_number(value) if whole is None else whole
    return out


def whole_counts(body: dict[str, Any]) -> dict[str, Any]:
    """`body` with each whole-number float given for a count read as that int: a setting, a
    PPO argument, a key of `imitation`, `eval`, `report` or `env_kwargs` of type int (or list
    of int: `eval.seeds`), and a workload's `num_requests` there. rl-zoo3 writes ``n_timesteps:
    !!float 1e6``, and YAML reads ``1e6`` as a float. A fraction, or a float past 2^53, stays
    a float, which the count's check refuses."""
    run_hints, ppo_hints = setting_hints()
    body = _whole(body, run_hints | ppo_hints)
    nested = {
        "imitation": dataclass_hints(ImitationSpec),
        "eval": _eval_hints(),
        "report": REPORT_KEYS,
        "env_kwargs": _env_hints(),
    }
    for key, hints in nested.items():
        if not isinstance(body.get(key), dict):
            continue
        body[key] = _whole(body[key], hints)
        workloads = body[key].get("workload")
        if isinstance(workloads, dict):
            body[key]["workload"] = _whole(workloads, {"num_requests": int})
        elif isinstance(workloads, list):
            body[key]["workload"] = [
                _whole(w, {"num_requests": int}) if isinstance(w, dict) else w for w in workloads
            ]
    return body


def load_config(path: str | os.PathLike[str]) -> TrainConfig:
    """Parse and check a whole config file up front; errors name the file and every bad key
    (a missing file, a directory or a pipe too)."""
    path = Path(path)
    if not regular_file(path, "a YAML config"):
        raise ValueError(f"config {path} does not exist")
    body = whole_counts(_body(path))
    problems = config_problems(body)
    if problems:
        raise ValueError(f"{path}: " + "; ".join(problems))
    run = {k: body[k] for k in RUN_KEYS if k in body}
    hyper = {k: v for k, v in body.items() if k not in RUN_KEYS}
    if run.get("imitation") is not None:
        try:
            run["imitation"] = ImitationSpec(**run["imitation"])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{path}: imitation: {exc}") from None
    cfg = TrainConfig(env_id=ENV_ID, hyperparams=hyper, **run)
    _check_values(cfg, path)
    return cfg


def _check_values(cfg: TrainConfig, path: Path) -> None:
    """The env's, the evaluation's, the teacher's and the report's own value checks (profiles,
    workload specs, SLO, control interval, engine keywords, controller specs, suites) and the
    policy's size, run before anything is written or trained; errors name the file."""
    from batchpilot.agents.checkpoint import policy_size_problem

    try:
        env = _env_class()(**cfg.env_kwargs)  # a real engine starts at the first reset only
        for note in env.workload_notes:  # the env drew each spec, and names one it cannot
            print(note)
        env.close()
    except (ValueError, TypeError, OSError) as exc:
        raise ValueError(f"{path}: env_kwargs: {exc}") from None
    net_arch = (cfg.hyperparams.get("policy_kwargs") or {}).get("net_arch")
    n_obs, n_outputs = env.observation_space.shape[0], int(env.action_space.nvec.sum())
    if problem := policy_size_problem(net_arch, n_obs, n_outputs):
        raise ValueError(f"{path}: policy_kwargs.net_arch: {problem}")
    if cfg.eval:
        _check_eval(cfg, path)
    if cfg.imitation is not None:
        from batchpilot.baselines.specs import make_controller  # as the imitation phase does

        if env.grid.mode != "grid":
            raise ValueError(
                f"{path}: imitation clones a teacher's grid choices: it needs action_mode grid, "
                f"not {env.grid.mode!r} (or leave imitation out)"
            )

        try:
            make_controller(cfg.imitation.teacher)
        except ValueError as exc:
            raise ValueError(f"{path}: imitation.teacher: {exc}") from None
    if cfg.report is not None:
        _check_report(cfg.report, cfg.control_interval, path)


def _eval_workload_key(spec: dict[str, Any]) -> tuple:
    """One spelling of an eval workload, to find one listed twice: the arrival as it parses
    (``poisson:2`` and ``poisson:2.0`` are one), defaults filled in, profiles as a set."""
    from batchpilot.envs.arrivals import Arrival
    from batchpilot.envs.traces import DEFAULT_BAD_ROWS

    arrival = spec.get("arrival", DEFAULT_ARRIVAL)
    with contextlib.suppress(ValueError):  # a bad one is refused as the workload is drawn
        arrival = Arrival.parse(arrival)
    profiles = frozenset(spec.get("profiles", ()))
    bad_rows = spec.get("bad_rows", DEFAULT_BAD_ROWS)
    return (spec["source"], arrival, spec.get("num_requests"), bad_rows, profiles)


def _check_eval(cfg: TrainConfig, path: Path) -> None:
    """`cfg.eval`'s profiles and workloads, each workload drawn once."""
    from batchpilot.envs.profiles import get_profile

    ev = _eval_scenario(cfg, str(DEFAULT_SLO))
    try:
        if not ev.profiles:
            raise ValueError("needs a profile name or a list of them")
        for name in ev.profiles:
            get_profile(name)
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: eval.profile: {exc}") from None
    if not ev.workloads:
        raise ValueError(f"{path}: eval.workload: needs a workload or a list of them")
    if len(set(ev.profiles)) < len(ev.profiles):
        raise ValueError(f"{path}: eval.profile: a profile named twice in {ev.profiles}")
    keys = [_eval_workload_key(w) for w in ev.workloads]
    if twice := next((i for i, k in enumerate(keys) if k in keys[:i]), None):
        raise ValueError(
            f"{path}: eval.workload: entries {keys.index(keys[twice])} and {twice} are the same "
            "workload; it would count twice in the evaluation's mean"
        )
    for w in ev.workloads:
        if not set(w.get("profiles", ev.profiles)) & set(ev.profiles):
            raise ValueError(
                f"{path}: eval.workload {w['source']}: its profiles {w['profiles']} "
                f"name none of eval.profile {ev.profiles}"
            )
        strays = [name for name in w.get("profiles", ()) if name not in ev.profiles]
        if strays:
            raise ValueError(
                f"{path}: eval.workload {w['source']}: profiles names {strays[0]!r}, which is "
                f"not one of eval.profile {ev.profiles}"
            )
    for name in ev.profiles:
        if not any(name in w.get("profiles", ev.profiles) for w in ev.workloads):
            raise ValueError(
                f"{path}: eval.profile {name!r}: no eval workload applies to it (each lists "
                "other profiles); it would never be scored"
            )
    try:
        for note in ev.check():
            print(note)
    except ValueError as exc:
        raise ValueError(f"{path}: eval.{exc}") from None


def _eval_scenario(cfg: TrainConfig, slo: str) -> Any:
    """The `EvalScenario` of `cfg.eval` (a profile or workload it lacks: an empty list)."""
    from batchpilot.agents.callbacks import EvalScenario

    given = {k: v for k, v in (cfg.eval or {}).items() if k != "freq"}
    scenario = {"profile": [], "workload": []} | given
    return EvalScenario(
        slo=slo, interval=cfg.control_interval, engine_kwargs=cfg.sim_engine_kwargs, **scenario
    )


def _check_report(report: dict[str, Any], interval: str, path: Path) -> None:
    """`report`'s suites (each file parsed whole, as `checked_suite` takes them at the
    policy's `interval`) and controller specs, as `write_report` reads them."""
    from batchpilot.training.evaluate import DEFAULT_SEEDS, check_controllers, suite_stems
    from batchpilot.training.policy_report import REFERENCES, checked_suite
    from batchpilot.training.suite import SuiteError

    suites = _report_suites(report)
    try:
        if not suites:
            raise ValueError("needs at least one suite (a name under training/scenarios or a file)")
        suite_stems(suites)
        for suite in suites:
            where = _suite_path(suite, path)
            try:
                checked_suite(where, interval, report.get("seeds", DEFAULT_SEEDS))
            except (SuiteError, OSError) as exc:  # a file not found or not read
                if where == suite:  # a shipped suite's name
                    raise
                raise ValueError(
                    f"{exc} (a suite that is no shipped name is a file, taken from the "
                    "config's folder; trace paths inside it, from the working directory)"
                ) from None
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: report.suites: {exc}") from None
    try:
        check_controllers(split_specs(report.get("controllers", REFERENCES)))
    except (ValueError, OSError) as exc:
        raise ValueError(f"{path}: report.controllers: {exc}") from None


def _report_suites(report: dict[str, Any]) -> list[str]:
    """``report.suites``, ``all`` standing for every shipped suite (as ``--suite all``)."""
    from batchpilot.training.suite import expand_all

    return expand_all(report.get("suites", []))


def _suite_path(suite: str, config_path: Path) -> str:
    """A ``report.suites`` entry as `run_suite` takes it: a shipped suite's name as it is,
    anything else a path relative to the config."""
    from batchpilot.training.suite import shipped_suite

    return suite if shipped_suite(suite) else str((config_path.parent / suite).resolve())


def make_env(cfg: TrainConfig) -> Any:
    """One training env: the registered env in SB3's Monitor."""
    import gymnasium as gym
    from stable_baselines3.common.monitor import Monitor

    return Monitor(gym.make(cfg.env_id, max_episode_steps=cfg.max_episode_steps, **cfg.env_kwargs))


def make_vec_env(cfg: TrainConfig, seed: int | None = None) -> Any:
    """`n_envs` envs in subprocesses (in-process for one), seeded with `seed` (None: the
    config's)."""
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    fns = [functools.partial(make_env, cfg) for _ in range(cfg.n_envs)]
    venv = SubprocVecEnv(fns) if cfg.n_envs > 1 else DummyVecEnv(fns)
    venv.seed(cfg.seed if seed is None else seed)
    return venv


def _new_model(cfg: TrainConfig, venv: Any, tb: Path, config_path: Path) -> Any:
    """PPO as `cfg` sets it up; a ValueError naming `config_path` if PPO refuses it."""
    from stable_baselines3 import PPO

    try:
        return PPO(
            cfg.policy,
            venv,
            seed=cfg.seed,
            tensorboard_log=str(tb),
            device="cpu",
            **cfg.hyperparams,
        )
    except (TypeError, ValueError, AssertionError) as exc:  # PPO's own argument checks
        raise ValueError(f"{config_path}: PPO refused the config ({exc})") from None


@dataclass
class _Run:
    """A run between `_start` and `_learn`."""

    cfg: TrainConfig
    out: Path
    model: Any
    previous: Path | None
    """The checkpoint it resumes from (None: a new run)."""
    callbacks: list[Any]
    random_state: tuple[Any, Any, Any]
    """Python's, numpy's and torch's global random states once the model was built."""
    returns: Any = None
    """The return statistics the imitation phase fitted its critic's scale to (SB3's
    `RunningMeanStd`; None: none), which PPO's `VecNormalize` starts from."""


def train(cfg: TrainConfig, config_path: Path, out: Path, *, resume: bool, progress: bool) -> Path:
    """Train (or resume) a run in `out`; returns the checkpoint to export (`kept_checkpoint`)."""
    return train_runs(cfg, config_path, [(cfg.seed, out)], resume=resume, progress=progress)[0]


def train_runs(
    cfg: TrainConfig,
    config_path: Path,
    runs: list[tuple[int, Path]],
    *,
    resume: bool,
    progress: bool,
) -> list[Path]:
    """Train (or resume) runs of `cfg` with these (training seed, directory) pairs; returns
    each one's checkpoint to export (`kept_checkpoint`). Their imitation phases run side by
    side on one `collector` (round-0 episodes collected once; one run's episodes keep the
    workers busy while another fits), then their PPO phases one after another (PPO draws from
    the global random generators; beside a busy pool its env steps crawl); each run is the run
    it would be alone, bit for bit."""
    from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    started = [
        _start(dataclasses.replace(cfg, seed=seed), config_path, out, resume) for seed, out in runs
    ]
    imitating = [r for r in started if r.previous is None and cfg.imitation is not None]
    if imitating:
        named = len(imitating) > 1
        seeds = [r.cfg.seed for r in imitating]
        bar = Progress(
            TextColumn("[bold]imitation[/] {task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("rounds"),
            TimeElapsedColumn(),
            disable=not progress,
        )
        # the collector closes first: on an error, the other phases stop at their next episode
        with bar, ThreadPoolExecutor(len(imitating)) as threads, collector(cfg, seeds) as episodes:
            tasks = [
                bar.add_task(f"seed {r.cfg.seed}", total=cfg.imitation.rounds) for r in imitating
            ]
            phases = [
                threads.submit(_imitate, r, episodes, named, functools.partial(bar.advance, t))
                for r, t in zip(imitating, tasks, strict=True)
            ]
            wait(phases, return_when=FIRST_EXCEPTION)
            for phase in phases:
                phase.result()
    return [_learn(r, progress) for r in started]


def _start(cfg: TrainConfig, config_path: Path, out: Path, resume: bool) -> _Run:
    """Check `out`, build the run's model (with in-process stand-ins for its envs, which
    `_learn` starts), write ``config.yml`` and ``run.json``, set up the callbacks."""
    from stable_baselines3.common.vec_env import DummyVecEnv

    from batchpilot.agents.callbacks import BaselineEvalCallback, DomainMetricsCallback
    from batchpilot.agents.checkpoint import (
        STATE,
        WEIGHTS,
        PeriodicCheckpoint,
        incomplete_after,
        load_checkpoint,
        read_state,
        resume_point,
    )
    from batchpilot.envs.metrics import SLO

    previous = resume_point(out) if resume else None
    if resume and previous is None:
        raise ValueError(
            f"--resume: no checkpoint under {out}/checkpoints or {out}/final (a run stopped "
            "before its first checkpoint is started again without --resume)"
        )
    if not resume and _holds_run(out):
        raise ValueError(f"{out} already holds a run; pass --resume or choose another --out")
    if previous is not None:  # resuming
        _check_same_config(config_path, out / "config.yml")
        steps = read_state(previous)["num_timesteps"]
        if cut := incomplete_after(out / "checkpoints", steps):
            names = ", ".join(p.name for p in cut)
            print(
                f"note: {out}: resuming from {previous.name}; {names} passed over (no "
                f"{STATE} or {WEIGHTS}: a save cut short)",
                flush=True,
            )

    # the model is rebuilt from the config; a checkpoint holds only data (no pickle)
    stand_in = DummyVecEnv([functools.partial(make_env, cfg) for _ in range(cfg.n_envs)])
    try:
        model = _new_model(cfg, stand_in, out / "tb", config_path)
        if previous is not None:
            load_checkpoint(model, previous)
    except (TypeError, AssertionError) as exc:  # PPO's own checks, met loading a checkpoint
        raise ValueError(f"{config_path}: PPO refused the config ({exc})") from None
    finally:
        stand_in.close()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file system that refuses it though its parent looks writable
        why = exc.strerror or exc
        raise ValueError(f"--out {out}: cannot create the run directory ({why})") from None
    if not resume:
        shutil.copyfile(config_path, out / "config.yml")
    meta = {
        "env_id": cfg.env_id,
        "algo": cfg.algo,
        "action_mode": cfg.env_kwargs.get("action_mode", "grid"),
        "imitation": cfg.imitation.to_dict() if cfg.imitation else None,
        # the entries observed, named even where the config leaves them to the default
        # (which grows as entries are added): export reads them from here
        "env_kwargs": cfg.env_kwargs
        | {"observation_fields": list(checked_fields(cfg.env_kwargs.get("observation_fields")))},
        "control_interval": cfg.control_interval,
        "seed": cfg.seed,
        "versions": {"batchpilot": version("batchpilot")},
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2) + "\n")

    slo = SLO.parse(cfg.env_kwargs.get("slo", str(DEFAULT_SLO)))
    callbacks = [
        DomainMetricsCallback(),
        PeriodicCheckpoint(max(1, cfg.checkpoint_freq // cfg.n_envs), out / "checkpoints"),
    ]
    if cfg.eval:
        evaluator = BaselineEvalCallback(
            _eval_scenario(cfg, str(slo)),
            cfg.env_kwargs.get("action_mode", "grid"),
            slo,
            max(1, int(cfg.eval.get("freq", 10_000)) // cfg.n_envs),
            out / "best",
            fields=cfg.env_kwargs.get("observation_fields"),
        )
        callbacks.append(evaluator)
    return _Run(cfg, out, model, previous, callbacks, _random_state())


RESUME_KEEPS = ("algo", "policy", "normalize", "policy_kwargs", "env_kwargs", "imitation")
"""The config keys a resumed run must keep: the network, its inputs, its environment and
SLO, and its warm start, which ``run.json`` records for export; another value would train one
network in two worlds and describe only the second. Other keys (how long, PPO's settings,
the evaluation, the report) may change."""


def _check_same_config(config_path: Path, kept: Path) -> None:
    """Refuse to resume the run whose config is `kept` with `config_path` where they differ
    in `RESUME_KEEPS` (a key left out counts as its default), naming the keys; say so where
    the evaluation changed (the best checkpoint's bar is the old evaluation's score)."""
    if not kept.is_file():
        return  # a run from before configs were kept: nothing to compare
    new, old = (_body(p) for p in (config_path, kept))
    changed = []
    for key in RESUME_KEEPS:
        a, b = _effective(key, new), _effective(key, old)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            changed += [f"{key}.{k}" for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
        else:
            changed.append(key)
    if changed:
        raise ValueError(
            f"--resume: {config_path} differs from the run's {kept} in {', '.join(changed)}, "
            f"which a run keeps ({', '.join(RESUME_KEEPS)}); train the new config into "
            "another --out"
        )
    if new.get("eval") != old.get("eval"):
        print(
            f"note: {config_path} evaluates otherwise than the run's {kept}: the best "
            "checkpoint so far was chosen by the old evaluation, and its score is the bar",
            flush=True,
        )


def _body(path: Path) -> dict[str, Any]:
    """The settings under a config file's one top-level key, the env id; an error naming the
    file where it holds anything else."""
    data = load_yaml(path)
    if not isinstance(data, dict) or len(data) != 1:
        found = f"; it has {', '.join(map(repr, data))}" if isinstance(data, dict) and data else ""
        raise ValueError(
            f"{path}: expected one top-level key, the env id ({ENV_ID}){found} (anchors for "
            "other sections can be defined inside the env id's mapping)"
        )
    ((env_id, body),) = data.items()
    if env_id != ENV_ID:
        raise ValueError(f"{path}: env id {env_id!r}; batchpilot trains on {ENV_ID}")
    if not isinstance(body, dict):
        raise ValueError(f"{path}: {env_id} must map to a dict of settings")
    return body


def _effective(key: str, body: dict[str, Any]) -> Any:
    """`body`'s value of `key`, its default where it is left out (env_kwargs: each keyword's)."""
    if key == "env_kwargs":
        defaults = {
            k: p.default
            for k, p in inspect.signature(_env_class().__init__).parameters.items()
            if p.default is not inspect.Parameter.empty
        }
        return defaults | (body.get(key) or {})
    if key == "policy_kwargs":  # PPO's: none given is SB3's defaults, as {} is
        return body.get(key) or {}
    if key == "imitation" and body.get(key) is not None:  # as the run reads it
        try:
            return ImitationSpec(**body[key]).to_dict()
        except (TypeError, ValueError):  # a kept config of another version: as written
            return body[key]
    if key in body:
        return body[key]
    setting = TrainConfig.__dataclass_fields__.get(key)
    return None if setting is None or setting.default is dataclasses.MISSING else setting.default


def _random_state() -> tuple[Any, Any, Any]:
    """Python's, numpy's and torch's global random states (`_learn` restores them)."""
    import random

    import numpy as np
    import torch as th

    return random.getstate(), np.random.get_state(), th.get_rng_state()


def _learn(run: _Run, progress: bool) -> Path:
    """The PPO phase of a started run, on its envs (in subprocesses), from the random state
    its model was built with (a resumed run: seeded past the steps it took); returns the
    checkpoint to export (`kept_checkpoint`)."""
    import random

    import numpy as np
    import torch as th
    from stable_baselines3.common.callbacks import CallbackList
    from stable_baselines3.common.vec_env import VecNormalize

    from batchpilot.agents.checkpoint import (
        VECNORMALIZE,
        has_vecnormalize,
        load_vecnormalize,
        save_checkpoint,
    )

    cfg, model, previous = run.cfg, run.model, run.previous
    if previous is not None and model.num_timesteps >= cfg.n_timesteps:
        print(
            f"{run.out}: already at {model.num_timesteps:,} steps, n_timesteps is "
            f"{cfg.n_timesteps:,}: nothing to train (a config with more goes on)"
        )
        return kept_checkpoint(run.out)
    # a resumed run goes on to new episodes: seeded as the config's seed would not repeat
    seed = cfg.seed if previous is None else (cfg.seed + model.num_timesteps) % 2**32
    venv = make_vec_env(cfg, seed)
    try:
        if previous is not None and has_vecnormalize(previous):
            venv = load_vecnormalize(previous / VECNORMALIZE, venv)
            venv.gamma = model.gamma  # the config's, as PPO's: a resume may change it
        elif previous is None and cfg.normalize:  # rewards only: the observation has fixed
            venv = VecNormalize(  # scales (`Observer`)
                venv, norm_obs=False, norm_reward=True, gamma=model.gamma
            )
            if run.returns is not None:  # the scale the warm-started critic was fitted on
                venv.ret_rms = run.returns
        model.set_env(venv)
        if previous is None:
            python_state, numpy_state, torch_state = run.random_state
            random.setstate(python_state)
            np.random.set_state(numpy_state)
            th.set_rng_state(torch_state)
        else:
            model.set_random_seed(seed)
        remaining = cfg.n_timesteps - (model.num_timesteps if previous is not None else 0)
        model.learn(
            max(remaining, 0),
            callback=CallbackList(run.callbacks),
            progress_bar=progress,
            tb_log_name="ppo",
            reset_num_timesteps=previous is None,
        )
    finally:
        venv.close()
    save_checkpoint(model, run.out / "final")
    return kept_checkpoint(run.out)


def kept_checkpoint(out: Path) -> Path:
    """The checkpoint of the run in `out` to export: its best (by the evaluation), or its final
    one where the config has no ``eval`` (no best is kept)."""
    from batchpilot.agents.checkpoint import STATE

    best = out / "best"
    return best if (best / STATE).exists() else out / "final"


def write_report(cfg: TrainConfig, config_path: Path, out: Path, *, progress: bool) -> Path:
    """Export the run's best policy to ``out/policy.onnx`` and compare it with the references
    on each suite of ``cfg.report`` (``out/report/<suite>/``, each headed by whether the
    learned policy won, as quickstart's report is, and ``out/report/report.md`` over them
    all: `batchpilot evaluate`'s report); returns the latter."""
    from batchpilot.agents.export import export
    from batchpilot.agents.specs import policy_spec
    from batchpilot.training.evaluate import DEFAULT_SEEDS
    from batchpilot.training.policy_report import (
        REFERENCES,
        TITLE,
        SuiteSection,
        run_suite,
        write_suites_report,
    )
    from batchpilot.training.report import command_line
    from batchpilot.training.suite import load_suite

    assert cfg.report is not None
    policy = out / "policy.onnx"
    export([out], policy, kept_checkpoint(out).name)
    sections = []
    for suite in _report_suites(cfg.report):
        path = _suite_path(suite, config_path)
        dest = out / "report" / Path(suite).stem
        results = run_suite(
            [policy],
            path,
            dest,
            references=cfg.report.get("controllers", REFERENCES),
            interval=cfg.control_interval,
            seeds=cfg.report.get("seeds", DEFAULT_SEEDS),  # not the suite's: training's time
            progress=progress,
        )
        sections.append(SuiteSection(dest.name, load_suite(path).description, results, dest))
    command = command_line()
    return write_suites_report(
        sections, [policy_spec(policy)], out / "report", title=TITLE, command=command
    )


def collector(cfg: TrainConfig, seeds: Iterable[int]) -> Collector:
    """The imitation phase's episode collector for `cfg`'s runs (two workers a core: a round's
    last episodes share them), collecting ahead the round-0 episodes of the runs with these
    training seeds (`batchpilot.agents.imitation.Collector`)."""
    assert cfg.imitation is not None
    spec = cfg.imitation
    made = Collector(functools.partial(make_env, cfg), spec, workers=2 * (os.cpu_count() or 1))
    for seed in seeds:
        made.expect(round_seeds(seed, 0, spec.episodes))
    return made


def _imitate(run: _Run, episodes: Collector, named: bool, advance: Callable[[], None]) -> None:
    """A run's imitation phase (`batchpilot.agents.imitation.dagger`) on `episodes`, logged as
    ``imitation/*`` in ``tb/imitation`` and printed (`named`: each line naming the run's seed);
    `advance` is called after each round (a progress bar's)."""
    from stable_baselines3.common.logger import configure

    from batchpilot.agents.imitation import dagger

    cfg = run.cfg
    assert cfg.imitation is not None
    logger = configure(str(run.out / "tb" / "imitation"), ["tensorboard"])
    prefix = f"seed {cfg.seed}: " if named else ""

    def log(values: dict[str, float], round_: int) -> None:
        for k, v in values.items():
            logger.record(f"imitation/{k}", v)
        logger.dump(round_)
        figures = ", ".join(f"{k} {v:.4g}" for k, v in values.items())
        print(f"{prefix}imitation round {round_}: {figures}", flush=True)
        advance()

    if cfg.normalize:  # PPO's critic learns normalised returns: fit it on that scale
        from stable_baselines3.common.running_mean_std import RunningMeanStd

        run.returns = RunningMeanStd(shape=())
    model, gamma = run.model, run.model.gamma
    dagger(model, episodes, cfg.imitation, seed=cfg.seed, gamma=gamma, log=log, returns=run.returns)
    logger.close()


def _holds_run(out: Path) -> bool:
    """`out` has a run that saved a checkpoint or its final state, readable or not (a run
    that failed before its first checkpoint may be started again)."""
    from batchpilot.agents.checkpoint import STATE, latest_checkpoint

    return (out / "run.json").exists() and (
        latest_checkpoint(out / "checkpoints") is not None or (out / "final" / STATE).exists()
    )
