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
from typing import Any

import numpy as np
import torch as th

from batchpilot.agents.checkpoint import (
    STATE,
    CheckpointError,
    load_policy_module,
    normalisation,
    read_state,
)
from batchpilot.agents.policy import (
    FORMAT,
    FORMAT_VERSION,
    PolicyFileError,
    action_layout,
    observation_layout,
    seal,
    sha256,
    sidecar_path,
)
from batchpilot.envs.action_grid import MODES
from batchpilot.envs.metrics import DEFAULT_SLO

OPSET = 17


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


def load_run(run_dir: Path, checkpoint: str) -> tuple[dict[str, Any], Path]:
    """The run's ``run.json`` and the checkpoint directory (``best`` or ``final``)."""
    meta_path = run_dir / "run.json"
    if not meta_path.is_file():
        raise PolicyFileError(f"{run_dir} is not a training run (no run.json)")
    ckpt = run_dir / checkpoint
    if not (ckpt / STATE).is_file():
        raise PolicyFileError(f"{ckpt}/{STATE} does not exist (checkpoints: best, final)")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
        ok = (
            meta["action_mode"] in MODES
            and isinstance(meta["env_kwargs"], dict)
            and isinstance(meta["control_interval"], str)
        )
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError) as exc:
        raise PolicyFileError(f"{meta_path}: not a readable run description ({exc})") from None
    if not ok:
        raise PolicyFileError(f"{meta_path}: env_kwargs or control_interval has the wrong type")
    return meta, ckpt


def export(run_dir: Path, out: Path, checkpoint: str = "best") -> dict[str, Any]:
    """Write ``out`` (ONNX) and ``out.json`` (sidecar); returns the sidecar."""
    import onnx
    import stable_baselines3 as sb3

    meta, ckpt = load_run(run_dir, checkpoint)
    layout = observation_layout()["fields"]
    try:
        policy = load_policy_module(ckpt)
        n_obs = policy.observation_space.shape[0]
        if n_obs != len(layout):
            raise PolicyFileError(
                f"{ckpt}: the model takes {n_obs} inputs, this version's layout has {len(layout)}"
            )
        mean, var, eps, clip = normalisation(ckpt, n_obs)
        timesteps = read_state(ckpt)["num_timesteps"]
    except CheckpointError as exc:
        raise PolicyFileError(str(exc)) from None
    module = OnnxablePolicy(policy, mean, var, eps, clip).eval()
    out.parent.mkdir(parents=True, exist_ok=True)
    th.onnx.export(
        module,
        (th.zeros(1, n_obs),),
        str(out),
        opset_version=OPSET,
        input_names=["observation"],
        output_names=["action"],
        dynamic_axes={"observation": {0: "batch"}, "action": {0: "batch"}},
        dynamo=False,
    )
    onnx.checker.check_model(str(out))
    env = meta["env_kwargs"]
    sidecar = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "normalisation": {
            "in_graph": True,
            "mean": np.asarray(mean).tolist(),
            "var": np.asarray(var).tolist(),
            "epsilon": eps,
            "clip": clip if np.isfinite(clip) else None,
        },
        "observation": observation_layout(),
        "action": action_layout(meta["action_mode"]),
        "slo": env.get("slo", str(DEFAULT_SLO)),
        "control_interval": meta["control_interval"],
        "trained_on": {"profile": env.get("profile"), "workload": env.get("workload")},
        "algo": meta["algo"],
        "timesteps": timesteps,
        "checkpoint": str(ckpt),
        "versions": {
            "batchpilot": meta["versions"]["batchpilot"],
            "stable_baselines3": sb3.__version__,
            "torch": th.__version__,
            "onnx": onnx.__version__,
            "opset": OPSET,
        },
        "sha256": sha256(out),
    }
    sidecar = seal(sidecar)
    sidecar_path(out).write_text(json.dumps(sidecar, indent=2, allow_nan=False) + "\n")
    return sidecar
