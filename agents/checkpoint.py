"""Training checkpoints in data formats only: no pickle anywhere a run directory is read.

SB3's ``model.zip`` and ``VecNormalize.save`` are pickles (cloudpickled spaces and
schedules, a pickled wrapper): loading one runs whatever code the file names, so a run
directory someone hands you could execute a command. Following SB3's guidance on
exporting a policy (its ``state_dict``), a checkpoint directory holds instead:

- ``policy.safetensors``: the policy's weights and the optimizer's tensors (safetensors:
  raw tensors and a JSON header, nothing executable);
- ``checkpoint.json``: step counts, the policy class and its keyword arguments, the
  observation and action bounds and the optimizer's hyperparameters;
- ``vecnormalize.json``: VecNormalize's running statistics, if the env is normalised.

A model is rebuilt from the config (resume) or from ``checkpoint.json`` (export), then
the tensors are loaded into it by name and shape. Every reader checks what it reads and
raises `CheckpointError` naming the file.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from batchpilot.agents.schema import mapping_problems, number, signature_hints
from batchpilot.envs.input_files import regular_file
from batchpilot.envs.json_objects import read_json_object
from batchpilot.envs.plain_numbers import is_number

FORMAT = "batchpilot-checkpoint"
FORMAT_VERSION = 1
WEIGHTS = "policy.safetensors"
STATE = "checkpoint.json"
VECNORMALIZE = "vecnormalize.json"
_OPT = "optimizer."


MAX_LAYER = 65_536
"""Widest layer (``net_arch`` entry) a config or checkpoint may ask for."""
MAX_PARAMETERS = 100_000_000
"""Most weights and biases a policy may have (`policy_parameters`): 400 MB of float32, about
four times that while training (gradients, Adam's two moments)."""


def ints(value: Any) -> list[int]:
    """Every integer in a JSON value (bools excluded)."""
    if isinstance(value, dict):
        return [i for v in value.values() for i in ints(v)]
    if isinstance(value, list):
        return [i for v in value for i in ints(v)]
    return [value] if isinstance(value, int) and not isinstance(value, bool) else []


def policy_parameters(net_arch: Any, n_obs: int, n_outputs: int) -> int:
    """The weights and biases of an SB3 MlpPolicy with `net_arch` (None: SB3's default) on
    `n_obs` inputs with `n_outputs` action outputs: its policy and value networks and heads
    (a Box action's log_std aside). Only arithmetic: a size is refused before it is allocated."""
    if net_arch is None:
        net_arch = {"pi": [64, 64], "vf": [64, 64]}
    if isinstance(net_arch, dict):  # as SB3's MlpExtractor reads it
        nets = [net_arch.get("pi", []), net_arch.get("vf", [])]
    else:
        nets = [net_arch, net_arch]
    total = 0
    for layers, head in zip(nets, (n_outputs, 1), strict=True):
        widths = [n_obs, *ints(layers), head]
        total += sum((a + 1) * b for a, b in itertools.pairwise(widths))
    return total


def policy_size_problem(net_arch: Any, n_obs: int, n_outputs: int) -> str | None:
    """None if a policy of `net_arch` (`policy_parameters`) is within `MAX_PARAMETERS`, else
    the problem."""
    n = policy_parameters(net_arch, n_obs, n_outputs)
    if n <= MAX_PARAMETERS:
        return None
    return f"a policy of {n:.3g} parameters, over the {MAX_PARAMETERS:,} limit"


class CheckpointError(ValueError):
    """A checkpoint directory that is missing, corrupt or made for another model."""


def _jsonable(value: Any) -> Any:
    """`value` as plain JSON data (tuples -> lists); raises for anything else."""
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    raise TypeError(f"{value!r} ({type(value).__name__}) has no JSON form")


def _read_json(path: Path, what: str) -> dict[str, Any]:
    """The JSON object in the checkpoint file `path` (`what` it holds); a missing or bad
    file is a `CheckpointError` naming it."""
    if not regular_file(path, f"a file of {what}", CheckpointError):
        raise CheckpointError(f"{path} does not exist")
    return read_json_object(path, what, CheckpointError)


def _floats(data: dict[str, Any], key: str, path: Path, n: int | None = None) -> np.ndarray:
    """`data[key]` as a finite float64 vector (of length `n` if given)."""
    try:
        arr = np.asarray(data[key], dtype=np.float64)
    except (KeyError, TypeError, ValueError, OverflowError):  # an int past any float
        raise CheckpointError(f"{path}: {key} is missing or not a list of numbers") from None
    if arr.ndim != 1 or (n is not None and len(arr) != n) or not np.isfinite(arr).all():
        want = f"{n} finite numbers" if n is not None else "a list of finite numbers"
        raise CheckpointError(f"{path}: {key} must be {want}")
    return arr


def _number(data: dict[str, Any], key: str, path: Path, low: float = -math.inf) -> float:
    value = data.get(key)
    if not is_number(value) or not low <= value:
        raise CheckpointError(f"{path}: {key} is {value!r}; need a number >= {low}")
    return float(value)


# ---------------------------------------------------------------------- VecNormalize
def save_vecnormalize(vecnorm: Any, path: Path) -> None:
    """VecNormalize's statistics and settings as JSON (identity observation statistics
    when it normalises rewards only)."""
    n_obs = vecnorm.observation_space.shape[0]
    obs_rms = getattr(vecnorm, "obs_rms", None) if vecnorm.norm_obs else None
    data = {
        "norm_obs": bool(vecnorm.norm_obs),
        "norm_reward": bool(vecnorm.norm_reward),
        "clip_obs": float(vecnorm.clip_obs),
        "clip_reward": float(vecnorm.clip_reward),
        "gamma": float(vecnorm.gamma),
        "epsilon": float(vecnorm.epsilon),
        "obs_mean": obs_rms.mean.tolist() if obs_rms else [0.0] * n_obs,
        "obs_var": obs_rms.var.tolist() if obs_rms else [1.0] * n_obs,
        "obs_count": float(obs_rms.count) if obs_rms else 0.0,
        "ret_mean": float(np.asarray(vecnorm.ret_rms.mean).reshape(-1)[0]),
        "ret_var": float(np.asarray(vecnorm.ret_rms.var).reshape(-1)[0]),
        "ret_count": float(vecnorm.ret_rms.count),
    }
    path.write_text(json.dumps(data, indent=1) + "\n")


MIN_CLIP_OBS = 1e-3
"""The least ``clip_obs`` (in standard deviations) a normalising checkpoint may have: below
it every observation the policy sees is about 0."""


def _check_float32_normalisation(
    path: Path, mean: np.ndarray, var: np.ndarray, epsilon: float
) -> None:
    """Refuse a normalisation the exported graph (float32 weights) cannot hold: a mean past
    float32's range, or a standard deviation sqrt(var + epsilon) that overflows it or is
    below its smallest normal number (0 in float32: NaN actions)."""
    f32 = np.finfo(np.float32)
    std = np.hypot(np.sqrt(var), math.sqrt(epsilon))  # var + epsilon could overflow
    for name, values, bad in (
        ("obs_mean", mean, np.abs(mean) > f32.max),
        ("sqrt(obs_var + epsilon)", std, (std > f32.max) | (std < f32.tiny)),
    ):
        if bad.any():
            i = int(np.argmax(bad))
            raise CheckpointError(
                f"{path}: entry {i}'s {name} is {values[i]:.3g}, outside float32's range "
                f"[{f32.tiny:.3g}, {f32.max:.3g}]: the exported normalisation would overflow or "
                "divide by 0 (NaN actions)"
            )


def read_vecnormalize(path: Path, n_obs: int) -> dict[str, Any]:
    """The checked contents of a ``vecnormalize.json`` for `n_obs` observation entries."""
    data = _read_json(path, "the VecNormalize statistics")
    for key in ("norm_obs", "norm_reward"):
        if not isinstance(data.get(key), bool):
            raise CheckpointError(f"{path}: {key} must be true or false")
    out: dict[str, Any] = {k: data[k] for k in ("norm_obs", "norm_reward")}
    for key in ("clip_obs", "clip_reward", "obs_count", "ret_count"):
        out[key] = _number(data, key, path, low=0.0)
    out["gamma"] = _number(data, "gamma", path, low=0.0)
    out["epsilon"] = _number(data, "epsilon", path, low=0.0)
    out["ret_mean"] = _number(data, "ret_mean", path)
    out["ret_var"] = _number(data, "ret_var", path, low=0.0)
    out["obs_mean"] = _floats(data, "obs_mean", path, n_obs)
    out["obs_var"] = _floats(data, "obs_var", path, n_obs)
    if (out["obs_var"] < 0).any():
        raise CheckpointError(f"{path}: obs_var has negative entries")
    if out["gamma"] > 1.0:
        raise CheckpointError(f"{path}: gamma {out['gamma']} is over 1")
    if out["norm_obs"] and not MIN_CLIP_OBS <= out["clip_obs"] <= np.finfo(np.float32).max:
        raise CheckpointError(
            f"{path}: clip_obs is {out['clip_obs']:g} with norm_obs on; need {MIN_CLIP_OBS:g} "
            f"to {np.finfo(np.float32).max:.3g} standard deviations (below, every normalised "
            "observation would be about 0; above, the exported float32 graph cannot hold it)"
        )
    if out["norm_obs"]:
        _check_float32_normalisation(path, out["obs_mean"], out["obs_var"], out["epsilon"])
    return out


def load_vecnormalize(path: Path, venv: Any) -> Any:
    """A VecNormalize around `venv` with the statistics in `path`."""
    from stable_baselines3.common.vec_env import VecNormalize

    s = read_vecnormalize(path, venv.observation_space.shape[0])
    vn = VecNormalize(
        venv,
        norm_obs=s["norm_obs"],
        norm_reward=s["norm_reward"],
        clip_obs=s["clip_obs"],
        clip_reward=s["clip_reward"],
        gamma=s["gamma"],
        epsilon=s["epsilon"],
    )
    if s["norm_obs"]:
        vn.obs_rms.mean, vn.obs_rms.var = s["obs_mean"], s["obs_var"]
        vn.obs_rms.count = s["obs_count"]
    vn.ret_rms.mean, vn.ret_rms.var = np.float64(s["ret_mean"]), np.float64(s["ret_var"])
    vn.ret_rms.count = s["ret_count"]
    return vn


def has_vecnormalize(directory: Path) -> bool:
    """Whether a checkpoint holds ``vecnormalize.json``; a directory, pipe or broken symlink
    there is a `CheckpointError` naming it (not a checkpoint without normalisation)."""
    path, what = directory / VECNORMALIZE, "a file of the VecNormalize statistics"
    if path.is_symlink() and not path.exists():  # not the same as no file at all
        raise CheckpointError(f"{path}: a broken symlink, not {what}")
    return regular_file(path, what, CheckpointError)


def normalisation(directory: Path, n_obs: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(mean, var, epsilon, clip) of a checkpoint's observation normalisation (identity
    without ``vecnormalize.json`` or with ``norm_obs`` off)."""
    path = directory / VECNORMALIZE
    if not has_vecnormalize(directory):
        return np.zeros(n_obs), np.ones(n_obs), 0.0, math.inf
    s = read_vecnormalize(path, n_obs)
    if not s["norm_obs"]:
        return np.zeros(n_obs), np.ones(n_obs), 0.0, math.inf
    return s["obs_mean"], s["obs_var"], s["epsilon"], s["clip_obs"]


# ---------------------------------------------------------------------- model
def save_checkpoint(model: Any, directory: Path) -> None:
    """Weights, optimizer state, step counts and (if normalised) VecNormalize statistics;
    ``checkpoint.json`` is written last, so a directory holding it holds the rest."""
    import torch as th
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    # a save over an earlier one (``final``) first drops its state: cut short, the directory
    # then holds no checkpoint, not new weights beside the old state
    (directory / STATE).unlink(missing_ok=True)
    policy = model.policy
    tensors = {k: v.detach().cpu().contiguous() for k, v in policy.state_dict().items()}
    opt = policy.optimizer.state_dict()
    for idx, state in opt["state"].items():
        for name, value in state.items():
            tensors[f"{_OPT}{idx}.{name}"] = th.as_tensor(value).detach().cpu().contiguous()
    save_file(tensors, str(directory / WEIGHTS))
    aliases = {cls: name for name, cls in model.policy_aliases.items()}
    state = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "num_timesteps": int(model.num_timesteps),
        "n_updates": int(model._n_updates),
        "policy": aliases[type(policy)],
        "policy_kwargs": _jsonable(model.policy_kwargs),
        "observation_low": model.observation_space.low.tolist(),
        "observation_high": model.observation_space.high.tolist(),
        **_action_bounds(model.action_space),
        "optimizer_param_groups": _jsonable(opt["param_groups"]),
    }
    vecnorm = model.get_vec_normalize_env()
    if vecnorm is not None:
        save_vecnormalize(vecnorm, directory / VECNORMALIZE)
    # the state last, whole (renamed into place): a save cut short leaves no checkpoint.json,
    # and `resume_point` passes the directory over
    partial = directory / f".{STATE}.partial"
    partial.write_text(json.dumps(state, indent=1) + "\n")
    partial.replace(directory / STATE)


def _action_bounds(space: Any) -> dict[str, Any]:
    """The action space as JSON: ``action_nvec`` (MultiDiscrete) or ``action_low/high``."""
    if hasattr(space, "nvec"):
        return {"action_nvec": space.nvec.tolist()}
    return {"action_low": space.low.tolist(), "action_high": space.high.tolist()}


def read_state(directory: Path) -> dict[str, Any]:
    """The checked ``checkpoint.json`` of `directory`."""
    path = directory / STATE
    data = _read_json(path, "the checkpoint state")
    if data.get("format") != FORMAT or data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: not a {FORMAT} version {FORMAT_VERSION} file (a checkpoint written by "
            "another batchpilot version: retrain, or export with the version that trained it)"
        )
    for key in ("num_timesteps", "n_updates"):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise CheckpointError(f"{path}: {key} is {value!r}, not a count")
    if not isinstance(data.get("policy_kwargs"), dict):
        raise CheckpointError(f"{path}: policy_kwargs must be a JSON object")
    if not isinstance(data.get("optimizer_param_groups"), list):
        raise CheckpointError(f"{path}: optimizer_param_groups must be a list")
    return data


def _read_tensors(directory: Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    path = directory / WEIGHTS
    if not regular_file(path, "a checkpoint's weights", CheckpointError):
        raise CheckpointError(f"{path} does not exist")
    try:
        return load_file(str(path), device="cpu")
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def _load_weights(policy: Any, tensors: dict[str, Any], directory: Path) -> None:
    weights = {k: v for k, v in tensors.items() if not k.startswith(_OPT)}
    try:
        policy.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise CheckpointError(
            f"{directory / WEIGHTS}: weights do not fit this model ({_misfit(policy, weights, exc)}"
            "); was the config's policy or observation changed since this checkpoint?"
        ) from None


def _misfit(policy: Any, weights: dict[str, Any], exc: RuntimeError) -> str:
    """What in `weights` does not fit `policy`: the first tensor missing, extra or of another
    shape (how many of each), else torch's own first detail."""
    expected = policy.state_dict()
    missing = sorted(set(expected) - set(weights))
    extra = sorted(set(weights) - set(expected))
    shapes = [
        f"{k} is {tuple(weights[k].shape)}, the model's {tuple(expected[k].shape)}"
        for k in sorted(set(weights) & set(expected))
        if tuple(weights[k].shape) != tuple(expected[k].shape)
    ]
    found = [
        f"{len(names)} {what}, the first: {names[0]}"
        for what, names in (("of another shape", shapes), ("missing", missing), ("extra", extra))
        if names
    ]
    lines = str(exc).strip().splitlines()
    return "; ".join(found) or (lines[1] if len(lines) > 1 else lines[0]).strip()


def _optimizer_state(
    optimizer: Any, tensors: dict[str, Any], groups: list[Any], directory: Path
) -> dict[int, dict[str, Any]]:
    """The ``optimizer.<index>.<name>`` tensors of `directory` as `optimizer`'s state by
    parameter index, each of its parameter's shape (``step``: one number); torch checks
    neither, and a wrong shape fails only in the first update. `groups` (the saved param
    groups) must number the parameters in order, as torch saves them and maps them back."""
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = [g.get("params") if isinstance(g, dict) else None for g in groups]
    in_order = all(isinstance(n, list) for n in saved) and [
        *itertools.chain.from_iterable(saved)
    ] == [*range(len(params))]
    if not in_order:
        raise CheckpointError(
            f"{directory / STATE}: optimizer_param_groups do not number the model's "
            f"{len(params)} parameters 0 to {len(params) - 1} in order"
        )
    path = directory / WEIGHTS
    state: dict[int, dict[str, Any]] = {}
    for key, value in tensors.items():
        if not key.startswith(_OPT):
            continue
        idx, _, name = key.removeprefix(_OPT).partition(".")
        if not (idx.isascii() and idx.isdigit() and name) or int(idx) >= len(params):
            raise CheckpointError(
                f"{path}: tensor {key!r} is not optimizer.<index>.<state> with an index below "
                f"{len(params)} (the model's parameters)"
            )
        want = () if name == "step" else tuple(params[int(idx)].shape)
        if tuple(value.shape) != want:
            raise CheckpointError(
                f"{path}: optimizer tensor {key} has shape {tuple(value.shape)}, "
                f"{'a step count' if name == 'step' else 'the parameter'} {want}"
            )
        state.setdefault(int(idx), {})[name] = value
    return state


def load_checkpoint(model: Any, directory: Path) -> None:
    """Load weights, optimizer state and step counts of `directory` into `model` (built from
    the same config)."""
    state = read_state(directory)
    tensors = _read_tensors(directory)
    _load_weights(model.policy, tensors, directory)
    groups = state["optimizer_param_groups"]
    opt_state = _optimizer_state(model.policy.optimizer, tensors, groups, directory)
    try:
        model.policy.optimizer.load_state_dict({"state": opt_state, "param_groups": groups})
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{directory}: optimizer state does not fit ({exc})") from None
    model.num_timesteps = state["num_timesteps"]
    model._n_updates = state["n_updates"]


def policy_kwargs_problems(kwargs: dict[str, Any]) -> list[str]:
    """Unknown keys and wrong types in `kwargs` (``policy_kwargs``), against the signature of
    SB3's MlpPolicy (the spaces and learning-rate schedule are PPO's to pass); a ``net_arch``
    with keys other than pi and vf or layers outside [1, `MAX_LAYER`]; and an unshared
    features extractor, which the export does not read."""
    from stable_baselines3 import PPO

    hints = signature_hints(PPO.policy_aliases["MlpPolicy"].__init__)
    for k in ("observation_space", "action_space", "lr_schedule"):
        hints.pop(k)
    problems = mapping_problems(kwargs, hints, prefix="policy_kwargs.", what="a policy keyword")
    net_arch = kwargs.get("net_arch")
    if isinstance(net_arch, dict) and set(net_arch) - {"pi", "vf"}:
        stray = sorted(map(str, set(net_arch) - {"pi", "vf"}))
        problems.append(
            f"policy_kwargs.net_arch: unknown key(s) {stray}; PPO reads pi (the policy's layers) "
            "and vf (the value function's)"
        )
    if wide := [v for v in ints(net_arch) if not 1 <= v <= MAX_LAYER]:
        problems.append(f"policy_kwargs.net_arch: layer sizes {wide[:3]} outside [1, {MAX_LAYER}]")
    if kwargs.get("share_features_extractor") is False:
        problems.append(
            "policy_kwargs.share_features_extractor: false is not supported (the export reads "
            "one features extractor; an MlpPolicy's only flattens the observation, so sharing it "
            "changes nothing): leave it out"
        )
    if isinstance(kwargs.get("optimizer_kwargs"), dict):
        problems += optimizer_problems(kwargs["optimizer_kwargs"])
    return problems


def optimizer_problems(options: dict[str, Any]) -> list[str]:
    """What in ``policy_kwargs.optimizer_kwargs`` torch's Adam (SB3's optimizer) refuses, or
    PPO cannot train with (a maximised loss, CUDA graphs, gradients through its steps), found
    by one step of Adam on a scalar, not after the imitation phase."""
    import torch as th

    where = "policy_kwargs.optimizer_kwargs"
    problems = [
        f"{where}.{key}: true is not supported (PPO minimises its loss, on the CPU, with no "
        "graph through the optimizer's steps): leave it out"
        for key in ("maximize", "capturable", "differentiable")
        if options.get(key)
    ]
    if taken := sorted({"params", "lr"} & set(options)):
        problems.append(f"{where}: {', '.join(taken)}: PPO's to set (learning_rate: the rate)")
    if problems:
        return problems
    weight = th.zeros(1, requires_grad=True)
    try:
        adam = th.optim.Adam([weight], lr=1e-3, **options)
        weight.grad = th.ones(1)
        adam.step()
    except Exception as exc:  # any of Adam's refusals, named for the config
        problems.append(f"{where}: torch's Adam refused it ({type(exc).__name__}: {exc})")
    return problems


def load_policy_module(directory: Path) -> Any:
    """The SB3 policy network of a checkpoint, rebuilt from ``checkpoint.json`` (no env)."""
    from gymnasium import spaces
    from stable_baselines3 import PPO

    state = read_state(directory)
    path = directory / STATE
    if state.get("policy") != "MlpPolicy":  # as `batchpilot train` refuses any other
        raise CheckpointError(
            f"{path}: policy {state.get('policy')!r}; batchpilot's observations need MlpPolicy"
        )
    bounds = {}
    keys = ["observation_low", "observation_high"]
    keys += ["action_nvec"] if "action_nvec" in state else ["action_low", "action_high"]
    for key in keys:
        try:
            bounds[key] = np.asarray(state[key], dtype=np.float32)
        except (KeyError, TypeError, ValueError, OverflowError):  # an int past any float
            raise CheckpointError(f"{path}: {key} is missing or not numbers") from None
    knobs = state.get("action_nvec", [])
    for n in knobs if isinstance(knobs, list) else [knobs]:  # astype(int64) would truncate
        if problem := number(1, math.inf, integer=True)(n):
            raise CheckpointError(f"{path}: action_nvec: {problem} (a knob's number of choices)")
    if problems := policy_kwargs_problems(state["policy_kwargs"]):
        raise CheckpointError(f"{path}: {'; '.join(problems)}")
    net_arch = state["policy_kwargs"].get("net_arch")
    n_obs = bounds["observation_low"].size
    # the action head's width: one logit per choice of each knob, or one output per dimension
    outputs = bounds["action_nvec"].sum() if "action_nvec" in bounds else bounds["action_low"].size
    if n_obs > MAX_LAYER or not outputs <= MAX_LAYER:
        raise CheckpointError(
            f"{path}: policy sizes over {MAX_LAYER:,} ({n_obs} observations, {outputs:g} "
            "action outputs)"
        )
    if problem := policy_size_problem(net_arch, n_obs, int(outputs)):
        raise CheckpointError(f"{path}: policy_kwargs.net_arch: {problem}")
    try:
        obs = spaces.Box(bounds["observation_low"], bounds["observation_high"], dtype=np.float32)
        if "action_nvec" in bounds:
            act = spaces.MultiDiscrete(bounds["action_nvec"].astype(np.int64))
        else:
            act = spaces.Box(bounds["action_low"], bounds["action_high"], dtype=np.float32)
        policy = PPO.policy_aliases[state["policy"]](
            obs, act, lambda _: 0.0, **state["policy_kwargs"]
        )
    except (TypeError, ValueError, AssertionError) as exc:  # SB3 checks with assertions too
        raise CheckpointError(f"{path}: cannot build the policy ({exc})") from None
    _load_weights(policy, _read_tensors(directory), directory)
    return policy.eval()


class PeriodicCheckpoint(BaseCallback):
    """Every `save_freq` calls, `save_checkpoint` into ``<directory>/step_<timesteps>``
    (`resume_point` finds the newest for ``--resume``)."""

    def __init__(self, save_freq: int, directory: Path) -> None:
        super().__init__()
        self.save_freq, self.directory = save_freq, directory

    def _on_step(self) -> bool:
        if self.n_calls % self.save_freq == 0:
            save_checkpoint(self.model, self.directory / f"step_{self.num_timesteps}")
        return True


def latest_checkpoint(directory: Path) -> Path | None:
    """The newest complete ``step_<N>`` checkpoint under `directory`, or None."""
    found = [(n, p) for n, p in _step_dirs(directory) if _complete(p)]
    return max(found)[1] if found else None


def resume_point(run: Path) -> Path | None:
    """The newest complete state of the run in `run` to go on from: its latest ``step_<N>``
    checkpoint, or its ``final`` one where that is newer (a run that ended between periodic
    checkpoints, or before its first); None if neither is there."""
    latest, final = latest_checkpoint(run / "checkpoints"), run / "final"
    if not _complete(final):  # none, or a save cut short
        return latest
    steps = read_state(final)["num_timesteps"]  # unreadable: a CheckpointError naming it
    if latest is None or steps >= int(latest.name.removeprefix("step_")):
        return final
    return latest


def incomplete_after(directory: Path, steps: int) -> list[Path]:
    """The ``step_<N>`` directories under `directory` past `steps` that lack a file of a
    checkpoint (a save cut short): `resume_point` passes them over."""
    return [p for n, p in sorted(_step_dirs(directory)) if n > steps and not _complete(p)]


def _step_dirs(directory: Path) -> list[tuple[int, Path]]:
    steps = ((p.name.removeprefix("step_"), p) for p in directory.glob("step_*"))
    return [(int(n), p) for n, p in steps if n.isdigit()]


def _complete(checkpoint: Path) -> bool:
    return (checkpoint / STATE).is_file() and (checkpoint / WEIGHTS).is_file()
