"""A learned policy as a controller: ``policy:PATH`` loads an exported ONNX file.

Serving needs numpy and onnxruntime only (no stable-baselines3, no torch, no pickle).
The JSON sidecar ``PATH.json`` (written by `batchpilot export`) says how to use the
network: the observation layout, the residual action's baselines and range, the SLO the
observation is normalised by, and the sha256 of the ``.onnx`` file, checked on load.
The observation normalisation (VecNormalize) is part of the ONNX graph.

The sidecar is sealed: ``sidecar_sha256`` is the sha256 of the canonical JSON of every
other field (`canonical_json`), so any edit to its semantic content (``cap_by``,
``max_log2_step``, a new field) is refused, and its values are range-checked against
`SIDECAR_SCHEMA` and the types of `ResidualSpec`'s fields. A checksum is not a signature:
it catches edits and mix-ups, not an author who re-seals; the range checks and the absence
of any executable content (no pickle, ONNX run by onnxruntime) are the safety boundary.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.agents.residual import ResidualCore, ResidualSpec
from batchpilot.agents.schema import Check, dataclass_hints, mapping_problems, number
from batchpilot.envs.batching_env import OBSERVATION_FIELDS, observe
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Limits, Telemetry

FORMAT = "batchpilot-policy"
FORMAT_VERSION = 3
"""2: the residual's limit is capped by `ResidualSpec.cap_by`; 3: the sidecar is sealed
(``sidecar_sha256``) and range-checked."""
SEAL = "sidecar_sha256"

Act = Callable[[np.ndarray], np.ndarray]
"""Raw observation (n,) float32 -> residual action (1,) in [-1, 1]."""


class PolicyFileError(ValueError):
    """A policy file that is missing, corrupt, tampered with or made for another layout."""


def sidecar_path(onnx_path: Path) -> Path:
    return onnx_path.with_suffix(onnx_path.suffix + ".json")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def canonical_json(meta: dict[str, Any]) -> bytes:
    """The sidecar's fields other than the seal, as canonical JSON (sorted keys, no spaces,
    no NaN or infinity)."""
    body = {k: v for k, v in meta.items() if k != SEAL}
    return json.dumps(body, sort_keys=True, separators=(",", ":"), allow_nan=False).encode()


def seal(meta: dict[str, Any]) -> dict[str, Any]:
    """`meta` with its ``sidecar_sha256``."""
    return meta | {SEAL: hashlib.sha256(canonical_json(meta)).hexdigest()}


RESIDUAL_RANGES: dict[str, Check] = {
    "max_log2_step": number(0.0, 8.0, low_open=True),
    "hold": number(1, 100_000, integer=True),
}
"""Ranges of `ResidualSpec` fields. A field without one is still type-checked from its
annotation (a float must be finite); a field may also declare ``metadata={"check": ...}``."""


def _residual_problems(residual: Any) -> list[str]:
    if not isinstance(residual, dict):
        return [f"residual is {residual!r}, not an object"]
    ranges = dict(RESIDUAL_RANGES)
    for f in dataclasses.fields(ResidualSpec):
        if "check" in f.metadata:
            ranges[f.name] = f.metadata["check"]
    hints = dataclass_hints(ResidualSpec)
    return mapping_problems(residual, hints, ranges, prefix="residual.", what="residual")


SIDECAR_SCHEMA: dict[str, Check] = {
    "timesteps": number(0, 1e15, integer=True),
    "sha256": lambda v: (
        None
        if isinstance(v, str) and len(v) == 64 and all(c in "0123456789abcdef" for c in v)
        else f"{v!r} is not a sha256 hex digest"
    ),
    "control_interval": lambda v: None if isinstance(v, str) else f"{v!r} is not a string",
    "slo": lambda v: None if isinstance(v, str) else f"{v!r} is not a string",
}
"""Checks of top-level sidecar fields (every field is covered by the seal either way)."""


def sidecar_problems(meta: dict[str, Any]) -> list[str]:
    """What is out of range or of the wrong type in a sidecar (empty: nothing)."""
    problems = [
        f"{key}: {problem}"
        for key, check in SIDECAR_SCHEMA.items()
        if key in meta and (problem := check(meta[key]))
    ]
    return problems + _residual_problems(meta.get("residual"))


def observation_layout(spec: ResidualSpec) -> list[str]:
    """The policy's input entries: the env's observation, then the residual's features."""
    return [*OBSERVATION_FIELDS, *spec.feature_names]


class PolicyController:
    """Controller protocol around a policy: telemetry -> observation -> action -> limit.

    Call it at the cadence it was trained at (the sidecar's ``control_interval``): the
    baselines decide at every call, the policy every ``hold`` calls.
    """

    def __init__(self, act: Act, spec: ResidualSpec, slo: SLO, name: str = "policy") -> None:
        self.act = act
        self.spec = spec
        self.slo = slo
        self.name = name
        self.core = ResidualCore(spec)
        self._engine: Engine | None = None
        self._calls = 0
        self._action = np.zeros(1, np.float32)

    def reset(self, engine: Engine) -> None:
        self._engine = engine
        self.core.reset(engine, engine.max_num_seqs)
        self._calls = 0

    def observation(self, t: Telemetry) -> np.ndarray:
        """The policy's input for `t` (after the baselines have decided on it)."""
        e = self._engine
        env_obs = observe(
            t,
            b_max=e.max_num_seqs,
            max_model_len=e.max_model_len,
            engine_token_budget=e.max_num_batched_tokens,
            slo=self.slo,
        )
        return np.concatenate([env_obs, self.core.features()])

    def decide(self, telemetry: Telemetry) -> Limits:
        if self._engine is None:
            raise RuntimeError("call reset(engine) before decide()")
        self.core.decide(telemetry)
        if self._calls % self.spec.hold == 0:
            self._action = self.act(self.observation(telemetry))
        self._calls += 1
        return Limits(self.core.limit(self._action))


def read_sidecar(onnx_path: Path) -> dict[str, Any]:
    """The sidecar of `onnx_path`, checked against the file and this version's layout."""
    side = sidecar_path(onnx_path)
    for p in (onnx_path, side):
        if not p.is_file():
            raise PolicyFileError(f"policy file {p} does not exist (write it: batchpilot export)")
    try:
        meta = json.loads(side.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise PolicyFileError(f"{side}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise PolicyFileError(f"{side}: not a batchpilot policy sidecar (format != {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise PolicyFileError(
            f"{side}: format version {meta.get('format_version')!r}, this batchpilot reads "
            f"{FORMAT_VERSION}; re-export the policy with this version"
        )
    try:
        sealed = meta.get(SEAL) == hashlib.sha256(canonical_json(meta)).hexdigest()
    except ValueError:  # NaN or infinity somewhere
        sealed = False
    if not sealed:
        raise PolicyFileError(
            f"{side}: {SEAL} does not match the sidecar's content: it was edited after "
            "`batchpilot export` (re-export the policy)"
        )
    problems = sidecar_problems(meta)
    if problems:
        raise PolicyFileError(f"{side}: {'; '.join(problems)}")
    if meta.get("sha256") != sha256(onnx_path):
        raise PolicyFileError(
            f"{onnx_path}: sha256 does not match its sidecar: the file was modified or "
            "belongs to another export"
        )
    try:
        spec = ResidualSpec(**meta["residual"])
        SLO.parse(meta["slo"])
        ControlInterval.parse(meta["control_interval"])
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyFileError(
            f"{side}: bad or missing residual/slo/control_interval entry ({exc})"
        ) from None
    expected = observation_layout(spec)
    if meta.get("observation") != expected:
        raise PolicyFileError(
            f"{side}: observation layout {meta.get('observation')} differs from this "
            f"version's {expected}; retrain or re-export with this version"
        )
    return meta


def onnx_act(onnx_path: Path, n_obs: int) -> Act:
    """An `Act` running the ONNX graph with onnxruntime (one thread: decisions are tiny)."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise PolicyFileError("policy controllers need onnxruntime (the serve extra)") from None
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.inter_op_num_threads = 1
    try:
        session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises its own exception types
        raise PolicyFileError(f"{onnx_path}: not a loadable ONNX model ({exc})") from None
    (inp,) = session.get_inputs()
    if list(inp.shape)[-1] != n_obs:
        raise PolicyFileError(f"{onnx_path}: input has shape {inp.shape}, sidecar says {n_obs}")
    name = inp.name
    run = session.run

    def act(obs: np.ndarray) -> np.ndarray:
        return run(None, {name: obs.reshape(1, -1).astype(np.float32, copy=False)})[0][0]

    return act


def load_policy(path: str | Path) -> PolicyController:
    """The controller a ``policy:PATH`` spec names, after checking file and sidecar."""
    onnx_path = Path(path)
    meta = read_sidecar(onnx_path)
    spec = ResidualSpec(**meta["residual"])
    act = onnx_act(onnx_path, len(meta["observation"]))
    return PolicyController(act, spec, SLO.parse(meta["slo"]), name=f"policy:{path}")
