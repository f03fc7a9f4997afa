"""Export a trained run as ONNX plus a JSON sidecar (SB3's "Exporting models" recipe).

The graph takes the raw observation (`observation_layout`), applies the run's
VecNormalize statistics (if any), and returns the deterministic action (`ActionGrid`:
grid indices or moves, as float32); the
sidecar (`batchpilot.agents.policy`) carries everything else a controller needs. The run
is read as data only (`batchpilot.agents.checkpoint`: safetensors and JSON, no pickle).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch as th

from batchpilot.agents.checkpoint import (
    STATE,
    CheckpointError,
    load_policy_module,
    normalisation,
    read_state,
)
from batchpilot.agents.onnx_numpy import EXPORT_OPSET
from batchpilot.agents.policy import (
    FORMAT,
    FORMAT_VERSION,
    PolicyFileError,
    action_layout,
    check_not_sidecar,
    ensemble_fields,
    load_policy,
    observation_layout,
    seal,
    sha256,
    sidecar_path,
)
from batchpilot.envs.action_grid import MODES
from batchpilot.envs.json_objects import brief, read_json_object
from batchpilot.envs.metrics import DEFAULT_SLO, SLO, goodput_slo, slo_ranges
from batchpilot.envs.observation import OBSERVATION_FIELDS, checked_fields


class OnnxablePolicy(th.nn.Module):
    """Normalise, run the SB3 policy deterministically (the most likely grid choice)."""

    def __init__(self, policy: Any, mean: np.ndarray, var: np.ndarray, eps: float, clip: float):
        super().__init__()
        self.policy = policy
        self.register_buffer("mean", th.as_tensor(mean, dtype=th.float32))
        self.register_buffer("std", th.as_tensor(np.sqrt(var + eps), dtype=th.float32))
        self.clip = clip

    def forward(self, observation: th.Tensor) -> th.Tensor:
        x = th.clamp((observation - self.mean) / self.std, -self.clip, self.clip)
        nvec = getattr(self.policy.action_space, "nvec", None)
        if nvec is None:
            action, _, _ = self.policy(x, deterministic=True)
            return action.to(th.float32)
        # a grid choice: the argmax of each knob's logits (no distribution ops in the graph)
        latent = self.policy.mlp_extractor.forward_actor(self.policy.extract_features(x))
        logits = th.split(self.policy.action_net(latent), [int(n) for n in nvec], dim=1)
        return th.stack([lg.argmax(dim=1) for lg in logits], dim=1).to(th.float32)


class OnnxableEnsemble(th.nn.Module):
    """Several grid policies as one MLP: the members' layers side by side (block-diagonal
    weights), their action heads summed, and the argmax of each knob's summed logits. That
    is the choice with the highest mean log-probability over the members: a member's
    log-softmax differs from its logits by one constant per knob. The graph reads the union
    of the members' observation entries (`fields`, one tuple per member), in
    `OBSERVATION_FIELDS` order; it is normalised once per distinct pair of entries and
    normalisation among the members, and each member's first layer reads its own copy. One
    chain of dense steps, so the deployed numpy network runs it as it runs a single policy."""

    def __init__(self, members: list[OnnxablePolicy], fields: list[tuple[str, ...]]):
        super().__init__()
        first = members[0].policy
        self.nvec = [int(n) for n in first.action_space.nvec]
        self.fields = ensemble_fields(fields)
        copies: dict[bytes, int] = {}  # each distinct (entries, normalisation): its copy
        copy_of = [
            copies.setdefault(
                repr(f).encode() + m.mean.numpy().tobytes() + m.std.numpy().tobytes(),
                len(copies),
            )
            for m, f in zip(members, fields, strict=True)
        ]
        norms = [copy_of.index(c) for c in range(len(copies))]  # a member with that copy
        widths = [len(fields[i]) for i in norms]
        starts = np.cumsum([0, *widths])
        select = th.zeros(len(self.fields), int(starts[-1]))
        for c, i in enumerate(norms):
            for j, name in enumerate(fields[i]):
                select[self.fields.index(name), starts[c] + j] = 1.0
        self.expand_input = not th.equal(select, th.eye(len(self.fields)))
        if self.expand_input:  # else the one copy is the observation itself
            self.register_buffer("expand", select)
        self.register_buffer("mean", th.cat([members[i].mean for i in norms]))
        self.register_buffer("std", th.cat([members[i].std for i in norms]))
        self.clip = members[0].clip
        nets = [list(m.policy.mlp_extractor.policy_net) for m in members]
        layers: list[th.nn.Module] = []
        for depth, module in enumerate(nets[0]):
            if not isinstance(module, th.nn.Linear):
                layers.append(module)
                continue
            weights = [net[depth].weight.data for net in nets]
            if depth == 0:  # member i reads copy copy_of[i] of the observation
                weight = th.zeros(len(members) * module.out_features, int(starts[-1]))
                for i, (w, c) in enumerate(zip(weights, copy_of, strict=True)):
                    rows = slice(i * module.out_features, (i + 1) * module.out_features)
                    weight[rows, starts[c] : starts[c + 1]] = w
            else:
                weight = th.block_diag(*weights)
            linear = th.nn.Linear(weight.shape[1], weight.shape[0])
            linear.weight.data = weight
            linear.bias.data = th.cat([net[depth].bias.data for net in nets])
            layers.append(linear)
        heads = [m.policy.action_net for m in members]
        head = th.nn.Linear(len(members) * heads[0].in_features, heads[0].out_features)
        head.weight.data = th.cat([h.weight.data for h in heads], dim=1)
        head.bias.data = th.stack([h.bias.data for h in heads]).sum(0)
        self.net = th.nn.Sequential(*layers, head)

    def forward(self, observation: th.Tensor) -> th.Tensor:
        x = observation @ self.expand if self.expand_input else observation
        x = th.clamp((x - self.mean) / self.std, -self.clip, self.clip)
        logits = th.split(self.net(x), self.nvec, dim=1)
        return th.stack([lg.argmax(dim=1) for lg in logits], dim=1).to(th.float32)


def _same_shape(members: list[OnnxablePolicy], runs: list[Path]) -> None:
    """Refuse an ensemble of members that cannot stand side by side, naming the run."""
    first = members[0].policy
    if getattr(first.action_space, "nvec", None) is None:
        raise PolicyFileError(f"{runs[0]}: only grid policies (action_mode grid) form an ensemble")
    valid = (th.nn.Linear, th.nn.Tanh, th.nn.ReLU)
    if type(first.features_extractor).__name__ != "FlattenExtractor" or not all(
        isinstance(x, valid) for x in first.mlp_extractor.policy_net
    ):
        raise PolicyFileError(
            f"{runs[0]}: only MlpPolicy networks (Linear, Tanh, ReLU) form an ensemble"
        )
    if not any(isinstance(x, th.nn.Linear) for x in first.mlp_extractor.policy_net):
        raise PolicyFileError(
            f"{runs[0]}: a policy with no hidden layer (net_arch pi: []) forms no ensemble (its "
            "members' heads would read one observation side by side): export each run alone"
        )

    def shape(m: OnnxablePolicy) -> tuple:
        layers = tuple(  # the first layer's inputs are the member's observation entries
            (type(x).__name__, d and getattr(x, "in_features", 0), getattr(x, "out_features", 0))
            for d, x in enumerate(m.policy.mlp_extractor.policy_net)
        )
        grid = tuple(int(n) for n in getattr(m.policy.action_space, "nvec", ()))
        return layers, grid, type(m.policy.features_extractor).__name__, m.clip

    for m, run in zip(members[1:], runs[1:], strict=True):
        if shape(m) != shape(members[0]):
            raise PolicyFileError(
                f"{run}: its network, action grid or observation clip differs from {runs[0]}'s; "
                "an ensemble needs members of one shape"
            )


def load_run(run_dir: Path, checkpoint: str) -> tuple[dict[str, Any], Path]:
    """The run's ``run.json`` and the checkpoint directory (``best`` or ``final``)."""
    meta_path = run_dir / "run.json"
    if not run_dir.exists():
        raise PolicyFileError(f"{run_dir} does not exist (a directory `batchpilot train` wrote)")
    if not meta_path.is_file():
        hint = ""
        if (run_dir.parent / "run.json").is_file() and run_dir.name in ("best", "final"):
            hint = (
                f"; it is a checkpoint of {run_dir.parent}: export that run "
                f"(--checkpoint {run_dir.name})"
            )
        raise PolicyFileError(f"{run_dir} is not a training run (no run.json){hint}")
    ckpt = run_dir / checkpoint
    if not (ckpt / STATE).is_file():
        kept = [c for c in ("best", "final") if (run_dir / c / STATE).is_file()]
        has = f"the run keeps {' and '.join(kept)}" if kept else "the run keeps no checkpoint yet"
        if kept == ["final"]:
            has += " (best once an evaluation ran, where the config has an eval: block): "
            has += "--checkpoint final"
        raise PolicyFileError(f"{ckpt}/{STATE} does not exist; {has}")
    meta = read_json_object(meta_path, "the run description", PolicyFileError)
    missing = [k for k in ("action_mode", "env_kwargs", "control_interval") if k not in meta]
    if missing:
        raise PolicyFileError(f"{meta_path}: not a run description ({missing[0]} missing)")
    if meta["action_mode"] not in MODES:
        raise PolicyFileError(
            f"{meta_path}: action_mode {brief(meta['action_mode'])} is none of {', '.join(MODES)}"
        )
    if not isinstance(meta["env_kwargs"], dict) or not isinstance(meta["control_interval"], str):
        raise PolicyFileError(f"{meta_path}: env_kwargs or control_interval has the wrong type")
    algo, versions = meta.get("algo"), meta.get("versions")
    if not isinstance(algo, str) or not (
        isinstance(versions, dict) and isinstance(versions.get("batchpilot"), str)
    ):
        raise PolicyFileError(
            f"{meta_path}: algo must be a name and versions an object naming the batchpilot "
            f"version, got algo {brief(algo)}, versions {brief(versions)}"
        )
    try:
        _slo_entries(meta["env_kwargs"])
    except ValueError as exc:
        raise PolicyFileError(f"{meta_path}: env_kwargs: {exc}") from None
    return meta, ckpt


class Member(NamedTuple):
    """One exported run: its ``run.json``, the observation entries it was trained on, its
    policy as a module, its sidecar entries."""

    meta: dict[str, Any]
    fields: tuple[str, ...]
    module: OnnxablePolicy
    entries: dict[str, Any]


def _member(run_dir: Path, checkpoint: str) -> Member:
    """Load one run for export."""
    meta, ckpt = load_run(run_dir, checkpoint)
    try:
        policy = load_policy_module(ckpt)
        n_obs = policy.observation_space.shape[0]
        named = meta["env_kwargs"].get("observation_fields")
        try:  # an older run.json may name none: that run observed the first n_obs entries
            layout = checked_fields(named if named is not None else OBSERVATION_FIELDS[:n_obs])
        except (TypeError, ValueError) as exc:
            raise PolicyFileError(f"{run_dir}/run.json: env_kwargs: {exc}") from None
        if n_obs != len(layout):
            raise PolicyFileError(
                f"{ckpt}: the model takes {n_obs} inputs, its run observes {len(layout)} entries"
            )
        mean, var, eps, clip = normalisation(ckpt, n_obs)
        timesteps = read_state(ckpt)["num_timesteps"]
    except CheckpointError as exc:
        raise PolicyFileError(str(exc)) from None
    env = meta["env_kwargs"]
    entries = {
        "normalisation": {
            "in_graph": True,
            "mean": np.asarray(mean).tolist(),
            "var": np.asarray(var).tolist(),
            "epsilon": eps,
            "clip": clip if np.isfinite(clip) else None,
        },
        "trained_on": {"profile": env.get("profile"), "workload": env.get("workload")},
        "timesteps": timesteps,
        "checkpoint": str(ckpt),
    }
    return Member(meta, layout, OnnxablePolicy(policy, mean, var, eps, clip).eval(), entries)


def export(run_dirs: list[Path], out: Path, checkpoint: str = "best") -> dict[str, Any]:
    """Write ``out`` (ONNX) and ``out.json`` (sidecar) for one run, or for several as an
    ensemble (`OnnxableEnsemble`; the sidecar lists them under ``members``); returns the
    sidecar. Nothing is written over an existing policy unless the new one loads as
    `policy:PATH` will load it (`load_policy`: sidecar values, graph ops)."""
    if not run_dirs:
        raise PolicyFileError("no run to export")
    check_not_sidecar(out)  # before anything is written: X.onnx.json is X.onnx's sidecar
    if out.suffix.lower() != ".onnx":
        raise PolicyFileError(
            f"{out}: a policy file's name ends in .onnx (its sidecar is the .onnx.json beside "
            f"it); e.g. {out.with_name(out.name + '.onnx')}"
        )
    members = [_member(run, checkpoint) for run in run_dirs]
    meta = members[0].meta
    for other, run in zip(members[1:], run_dirs[1:], strict=True):
        for key in ("action_mode", "control_interval"):
            if other.meta[key] != meta[key]:
                raise PolicyFileError(
                    f"{run}: {key} {other.meta[key]!r} differs from {run_dirs[0]}'s "
                    f"{meta[key]!r}; an ensemble's members must agree"
                )
        ours = _slo_entries(meta["env_kwargs"])
        for key, value in _slo_entries(other.meta["env_kwargs"]).items():
            if value != ours[key]:
                raise PolicyFileError(f"{run}: trained with another {key} than {run_dirs[0]}")
    modules = [m.module for m in members]
    if len(members) == 1:
        module: th.nn.Module = modules[0]
        fields = members[0].fields
    else:
        _same_shape(modules, run_dirs)
        module = OnnxableEnsemble(modules, [m.fields for m in members]).eval()
        fields = module.fields
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")  # in place only once it loads
    try:
        sidecar = _write(module, fields, members, partial)
        try:
            load_policy(partial)
        except PolicyFileError as exc:
            raise PolicyFileError(f"{run_dirs[0]}: the export would not load ({exc})") from None
        partial.replace(out)
        sidecar_path(partial).replace(sidecar_path(out))
    finally:
        partial.unlink(missing_ok=True)
        sidecar_path(partial).unlink(missing_ok=True)
    return sidecar


def _slo_entries(env: dict[str, Any]) -> dict[str, Any]:
    """A run's ``slo`` and ``slo_scale`` (empty: one SLO) as its sidecar records them; a
    `ValueError` for a bad one."""
    text = env.get("slo", str(DEFAULT_SLO))
    if not isinstance(text, str):
        raise ValueError(f"slo must be a string like {DEFAULT_SLO}, got {brief(text)}")
    slo = goodput_slo(SLO.parse(text), "slo")
    ranges = slo_ranges(env.get("slo_scale") or {}, slo)
    return {"slo": str(slo), "slo_scale": {k: list(r) for k, r in ranges.items()}}


def _write(
    module: th.nn.Module, fields: tuple[str, ...], members: list[Member], out: Path
) -> dict[str, Any]:
    """Write the graph to `out` and its sidecar beside it; returns the sidecar."""
    import onnx
    import stable_baselines3 as sb3

    meta = members[0].meta
    th.onnx.export(
        module,
        (th.zeros(1, len(fields)),),
        str(out),
        opset_version=EXPORT_OPSET,
        input_names=["observation"],
        output_names=["action"],
        dynamic_axes={"observation": {0: "batch"}, "action": {0: "batch"}},
        dynamo=False,
    )
    onnx.checker.check_model(str(out))
    env = meta["env_kwargs"]
    entries = (
        members[0].entries
        if len(members) == 1
        else {"members": [m.entries | {"observation_fields": list(m.fields)} for m in members]}
    )
    sidecar = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "observation": observation_layout(fields),
        "action": action_layout(meta["action_mode"]),
        **{k: v for k, v in _slo_entries(env).items() if v},
        "control_interval": meta["control_interval"],
        "algo": meta["algo"],
        **entries,
        "versions": {
            "batchpilot": meta["versions"]["batchpilot"],
            "stable_baselines3": sb3.__version__,
            "torch": th.__version__,
            "onnx": onnx.__version__,
            "opset": EXPORT_OPSET,
        },
        "sha256": sha256(out),
    }
    sidecar = seal(sidecar)
    sidecar_path(out).write_text(json.dumps(sidecar, indent=2, allow_nan=False) + "\n")
    return sidecar
