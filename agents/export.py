"""Export a trained run as ONNX plus a JSON sidecar (SB3's "Exporting models" recipe).

The graph takes the raw observation (`observation_layout`), applies the run's
VecNormalize statistics, and returns the deterministic residual action in [-1, 1]; the
sidecar (`batchpilot.agents.policy`) carries everything else a controller needs.
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import torch as th

from batchpilot.agents.policy import (
    FORMAT,
    FORMAT_VERSION,
    PolicyFileError,
    observation_layout,
    sha256,
    sidecar_path,
)
from batchpilot.agents.residual import ResidualSpec

OPSET = 17


class OnnxablePolicy(th.nn.Module):
    """Normalise, run the SB3 policy deterministically, clip to the action space."""

    def __init__(self, policy: Any, mean: np.ndarray, var: np.ndarray, eps: float, clip: float):
        super().__init__()
        self.policy = policy
        self.register_buffer("mean", th.as_tensor(mean, dtype=th.float32))
        self.register_buffer("std", th.as_tensor(np.sqrt(var + eps), dtype=th.float32))
        self.clip = clip

    def forward(self, observation: th.Tensor) -> th.Tensor:
        x = th.clamp((observation - self.mean) / self.std, -self.clip, self.clip)
        action, _, _ = self.policy(x, deterministic=True)
        return th.clamp(action, -1.0, 1.0)


def load_run(run_dir: Path, checkpoint: str) -> tuple[dict[str, Any], Path]:
    """The run's ``run.json`` and the checkpoint directory (``best`` or ``final``)."""
    meta_path = run_dir / "run.json"
    if not meta_path.is_file():
        raise PolicyFileError(f"{run_dir} is not a training run (no run.json)")
    ckpt = run_dir / checkpoint
    if not (ckpt / "model.zip").is_file():
        raise PolicyFileError(f"{ckpt}/model.zip does not exist (checkpoints: best, final)")
    return json.loads(meta_path.read_text()), ckpt


def normalisation(ckpt: Path, n_obs: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(mean, var, epsilon, clip) of the checkpoint's VecNormalize; identity without one."""
    path = ckpt / "vecnormalize.pkl"
    if not path.is_file():
        return np.zeros(n_obs), np.ones(n_obs), 0.0, float("inf")
    with path.open("rb") as f:  # our own training output, never a downloaded file
        vn = pickle.load(f)
    if not vn.norm_obs:
        return np.zeros(n_obs), np.ones(n_obs), 0.0, float("inf")
    return vn.obs_rms.mean, vn.obs_rms.var, float(vn.epsilon), float(vn.clip_obs)


def export(run_dir: Path, out: Path, checkpoint: str = "best") -> dict[str, Any]:
    """Write ``out`` (ONNX) and ``out.json`` (sidecar); returns the sidecar."""
    import onnx
    import stable_baselines3 as sb3
    from stable_baselines3 import PPO

    meta, ckpt = load_run(run_dir, checkpoint)
    spec = ResidualSpec(**meta["residual"])
    layout = observation_layout(spec)
    model = PPO.load(ckpt / "model.zip", device="cpu")
    n_obs = model.observation_space.shape[0]
    if n_obs != len(layout):
        raise PolicyFileError(
            f"{ckpt}: the model takes {n_obs} inputs, this version's layout has {len(layout)}"
        )
    mean, var, eps, clip = normalisation(ckpt, n_obs)
    module = OnnxablePolicy(model.policy, mean, var, eps, clip).eval()
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
        "observation": layout,
        "normalisation": {
            "in_graph": True,
            "mean": np.asarray(mean).tolist(),
            "var": np.asarray(var).tolist(),
            "epsilon": eps,
            "clip": clip if np.isfinite(clip) else None,
        },
        "action": {
            "output": "residual a in [-1, 1]",
            "limit": "clip(min(round(min(baseline parts) * 2 ** (a * max_log2_step)), "
            "cap_by part), 1, max_num_seqs)",
            "hold": "a is kept for `hold` decisions; the baselines decide at every one",
        },
        "residual": spec.to_dict(),
        "slo": env.get("slo", "ttft:2000,tpot:100"),
        "control_interval": meta["control_interval"],
        "trained_on": {"profile": env.get("profile"), "workload": env.get("workload")},
        "algo": meta["algo"],
        "timesteps": int(model.num_timesteps),
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
    sidecar_path(out).write_text(json.dumps(sidecar, indent=2) + "\n")
    return sidecar
