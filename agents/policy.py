"""A learned policy as a controller: ``policy:PATH`` loads an exported ONNX file.

Serving needs numpy and the `onnx` package only (no onnxruntime, stable-baselines3, torch
or pickle): `batchpilot.agents.onnx_numpy` lowers the graph to a few numpy calls per
decision and refuses any op an export does not write.
The JSON sidecar ``PATH.json`` (written by `batchpilot export`) says how to use the
network: the observation's entries and scaling constants, the action's grids, the SLO
the observation is normalised by, the control interval it was trained at, and the
sha256 of the ``.onnx`` file, checked on load. A policy observes against the SLO of the
run it serves, with a warning where that lies outside the SLOs it was trained at (``slo``,
times ``slo_scale`` for one trained across SLOs, the env's `slo_scale`). The controller
builds the entries the sidecar names, so a policy trained before an entry was added still
serves; a sidecar naming an entry this version does not compute, or with other scaling constants
(`batchpilot.envs.observation.SCALES`) or action grids, is refused, and
`batchpilot.envs.run.run` refuses to call the controller at another control interval than
the sidecar's. Any observation normalisation (VecNormalize) is part of the ONNX graph.

The sidecar is sealed: ``sidecar_sha256`` is the sha256 of the canonical JSON of every
other field (`canonical_json`), so any edit to its semantic content (a grid, a scale, a
new field) is refused, and its values are range-checked against `SIDECAR_SCHEMA`. A
checksum is not a signature: it catches edits and mix-ups, not an author who re-seals;
the range checks and the absence of any executable content (no pickle; the graph's ops
checked one by one against a short list) are the safety boundary.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchpilot.agents.onnx_numpy import Act, GraphError, compile_graph
from batchpilot.agents.schema import Check, number
from batchpilot.envs.action_grid import BUDGET_GRID, MODES, SEQ_GRID, ActionGrid
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.engine import Engine
from batchpilot.envs.input_files import regular_file, user_path
from batchpilot.envs.json_objects import check_size, read_json_object
from batchpilot.envs.metrics import SLO, goodput_slo, slo_ranges
from batchpilot.envs.observation import OBSERVATION_FIELDS, SCALES, Observer, checked_fields
from batchpilot.envs.telemetry import Limits, Telemetry

FORMAT = "batchpilot-policy"
FORMAT_VERSION = 4
"""2: the residual's limit is capped by `ResidualSpec.cap_by`; 3: the sidecar is sealed
(``sidecar_sha256``) and range-checked; 4: both knobs on log grids (no residual), the
observation's scaling constants recorded and enforced."""
SEAL = "sidecar_sha256"

logger = logging.getLogger("batchpilot.policy")
_WARNED: set[tuple[str, SLO]] = set()
"""(policy name, SLO) pairs whose SLO warning this process has logged."""


class PolicyFileError(ValueError):
    """A policy file that is missing, corrupt, tampered with or made for another layout."""


class PolicyFileMissing(PolicyFileError):
    """A policy's .onnx file that does not exist."""


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
    return problems


def observation_layout(fields: Sequence[str] | None = None) -> dict[str, Any]:
    """The policy's input: the observation's fields and scaling constants (`Observer`)."""
    return {"fields": list(checked_fields(fields)), "scales": dict(SCALES)}


def action_layout(mode: str) -> dict[str, Any]:
    """The policy's output: the mode and the grids it indexes (`ActionGrid`)."""
    return {"mode": mode, "seq_grid": list(SEQ_GRID), "budget_grid": list(BUDGET_GRID)}


class PolicyController:
    """Controller protocol around a policy: telemetry -> `Observer` -> act -> `ActionGrid`.

    `control_interval` is the cadence it was trained at; `batchpilot.envs.run.run`
    refuses to call it at another. It observes against the SLO of the engine it is reset on
    (the entries are ratios to its targets), and warns where that lies outside `slo` (times
    `slo_scale`, the ranges of factors it was trained across).
    """

    def __init__(
        self,
        act: Act,
        mode: str,
        slo: SLO,
        control_interval: ControlInterval,
        name: str = "policy",
        fields: Sequence[str] | None = None,
        slo_scale: dict[str, tuple[float, float]] | None = None,
    ) -> None:
        self.act = act
        self.grid = ActionGrid(mode)
        self.observer = Observer(slo, fields)
        self.slo = slo
        self.slo_scale = slo_scale
        self.control_interval = control_interval
        self.name = name
        self._ready = False

    def reset(self, engine: Engine) -> None:
        self.observer.set_slo(engine.slo)
        outside = slo_outside(self.slo, self.slo_scale or {}, engine.slo)
        if outside and (self.name, engine.slo) not in _WARNED:  # once per process, not per run
            _WARNED.add((self.name, engine.slo))
            logger.warning(
                "%s was trained for the SLO %s%s; this run is scored on %s (%s): it observes "
                "against the run's targets, outside what it trained on",
                self.name,
                self.slo,
                "" if self.slo_scale is None else f" scaled by {fmt_ranges(self.slo_scale)}",
                engine.slo,
                "; ".join(outside),
            )
        self.grid.reset(engine.max_num_seqs, engine.max_num_batched_tokens)
        self.observer.reset()
        self._ready = True

    def decide(self, telemetry: Telemetry) -> Limits:
        if not self._ready:
            raise RuntimeError("call reset(engine) before decide()")
        try:
            action = self.act(self.observer(telemetry))
        except FloatingPointError as exc:  # the observation is finite: the file is at fault
            raise PolicyFileError(
                f"{self.name}: {exc} at t={telemetry.time_s:.3f} s from a finite observation "
                "(its weights overflow float32)"
            ) from None
        return self.grid.apply(action)


def slo_outside(base: SLO, scale: dict[str, tuple[float, float]], slo: SLO) -> list[str]:
    """How `slo` lies outside the targets `base` times `scale` covers (empty: inside); an
    end-to-end target is not scaled, so it must be `base`'s."""

    def ms(v: float | None) -> str:
        return "unset" if v is None else f"{v:g} ms"

    problems = []
    if slo.e2el_ms != base.e2el_ms:
        problems.append(f"e2el {ms(slo.e2el_ms)}, not {ms(base.e2el_ms)}")
    for key in ("ttft", "tpot"):
        lo, hi = scale.get(key, (1.0, 1.0))
        trained, target = getattr(base, f"{key}_ms"), getattr(slo, f"{key}_ms")
        if trained is None or target is None:
            if trained != target:
                problems.append(f"{key} {'unset' if target is None else 'set'}")
        elif not trained * lo * (1 - 1e-9) <= target <= trained * hi * (1 + 1e-9):
            covered = f"{trained * lo:g}" if lo == hi else f"[{trained * lo:g}, {trained * hi:g}]"
            problems.append(f"{key} {target:g} ms, not {covered}")
    return problems


def fmt_ranges(scale: dict[str, tuple[float, float]]) -> str:
    """``ttft 0.2-4x, tpot 0.6-3x``."""
    return ", ".join(f"{k} {lo:g}-{hi:g}x" for k, (lo, hi) in scale.items())


def check_not_sidecar(onnx_path: Path) -> None:
    """Refuse a policy path that names a sidecar (``X.onnx.json``) instead of its file."""
    if onnx_path.name.endswith(".onnx.json"):
        raise PolicyFileError(
            f"{onnx_path} is a policy's JSON sidecar; name its .onnx file "
            f"(policy:{onnx_path.with_suffix('')})"
        )


def read_sidecar(onnx_path: Path) -> dict[str, Any]:
    """The sidecar of `onnx_path` (``~`` expanded, as no shell does in ``policy:~/...``),
    checked against the file and this version's layout."""
    return read_policy_files(onnx_path)[0]


def read_policy_files(onnx_path: Path) -> tuple[dict[str, Any], bytes]:
    """`read_sidecar`'s sidecar, and the .onnx file's bytes its sha256 was checked on: what
    runs is what was checked, though the file be replaced after (a re-export landing)."""
    onnx_path = user_path(onnx_path, PolicyFileError)
    side = sidecar_path(onnx_path)
    check_not_sidecar(onnx_path)
    for p in (onnx_path, side):
        what = "policy file" if p == onnx_path else f"{onnx_path}'s JSON sidecar"
        a_file = (
            "a policy file; name the .onnx file `batchpilot export` wrote (e.g. DIR/policy.onnx)"
            if p == onnx_path
            else "a JSON sidecar"
        )
        if not regular_file(p, a_file, PolicyFileError):
            raise (PolicyFileMissing if p == onnx_path else PolicyFileError)(
                f"{what} {p} does not exist: a policy is the .onnx file and its sidecar that "
                "`batchpilot export` writes side by side"
            )
    meta = read_json_object(side, "the policy sidecar", PolicyFileError)
    if meta.get("format") != FORMAT:
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
    if not isinstance(meta.get("sha256"), str):
        raise PolicyFileError(f"{side}: no sha256 of the policy file (re-export the policy)")
    check_size(onnx_path, "the policy file", PolicyFileError)
    data = onnx_path.read_bytes()
    if not data:
        raise PolicyFileError(f"{onnx_path}: the policy file is empty (re-export the policy)")
    if meta["sha256"] != hashlib.sha256(data).hexdigest():
        raise PolicyFileError(
            f"{onnx_path}: sha256 does not match its sidecar: the file was modified or "
            "belongs to another export"
        )
    if not isinstance(meta.get("action"), dict):
        raise PolicyFileError(f"{side}: action is missing or not a mapping (re-export)")
    try:
        slo_ranges(meta.get("slo_scale", {}), goodput_slo(SLO.parse(meta["slo"]), "slo"))
        ControlInterval.parse(meta["control_interval"])
        mode = meta["action"]["mode"]
    except (KeyError, TypeError, ValueError) as exc:
        raise PolicyFileError(
            f"{side}: bad or missing slo/slo_scale/control_interval/action entry ({exc})"
        ) from None
    observation = meta.get("observation")
    try:
        if not isinstance(observation, dict) or set(observation) != {"fields", "scales"}:
            raise ValueError("not a mapping of fields and scales")
        if not isinstance(observation["fields"], list):
            raise ValueError("fields is not a list")
        checked_fields(observation["fields"])
        if observation["scales"] != SCALES:
            raise ValueError(f"scaling constants differ from this version's {SCALES}")
    except (TypeError, ValueError) as exc:
        raise PolicyFileError(
            f"{side}: observation layout is not one this version builds ({exc}); retrain with "
            "this version"
        ) from None
    if "members" in meta:
        _check_members(meta["members"], observation["fields"], side)
    if mode not in MODES or meta["action"] != action_layout(mode):
        raise PolicyFileError(
            f"{side}: action {meta['action']} differs from this version's "
            f"{action_layout(mode if mode in MODES else MODES[0])}; retrain with this version"
        )
    return meta, data


def ensemble_fields(fields: Sequence[Sequence[str]]) -> tuple[str, ...]:
    """The observation entries of an ensemble whose members observe `fields` (one list each):
    their union, in `OBSERVATION_FIELDS` order."""
    return tuple(f for f in OBSERVATION_FIELDS if any(f in m for m in fields))


def _check_members(members: Any, fields: list[str], side: Path) -> None:
    """Refuse an ensemble sidecar whose ``observation.fields`` are not its members'
    ``observation_fields`` as the export joins them (`ensemble_fields`): the graph would read
    its inputs in another order."""
    try:
        if not isinstance(members, list) or not all(isinstance(m, dict) for m in members):
            raise TypeError("members must be a list of objects")
        # members exported before they recorded their entries all observed the sidecar's
        named = [m.get("observation_fields", fields) for m in members]
        if not all(isinstance(f, list) for f in named):
            raise TypeError("each member needs a list of observation_fields")
        union = [*ensemble_fields([checked_fields(f) for f in named])]
    except (TypeError, ValueError) as exc:
        raise PolicyFileError(f"{side}: members: {exc}") from None
    if union != fields:
        pairs = enumerate(zip(fields, union, strict=False))
        i = next((i for i, (a, b) in pairs if a != b), min(len(fields), len(union)))
        raise PolicyFileError(
            f"{side}: observation.fields are not the members' observation_fields joined in "
            f"layout order: entry {i} is {fields[i] if i < len(fields) else 'missing'}, theirs "
            f"{union[i] if i < len(union) else 'missing'}; re-export the policy"
        )


def numpy_act(onnx_path: Path, data: bytes, n_obs: int, mode: str) -> Act:
    """An `Act` running the ONNX graph `data` (of `onnx_path`) with numpy
    (`batchpilot.agents.onnx_numpy`): the action (2,) is grid indices or moves (`ActionGrid`
    in `mode`)."""
    try:
        return compile_graph(data, n_obs, ActionGrid(mode).nvec)
    except ImportError:
        raise PolicyFileError("policy controllers need the onnx package (serve extra)") from None
    except GraphError as exc:
        raise PolicyFileError(f"{onnx_path}: {exc}") from None


def load_policy(path: str | Path) -> PolicyController:
    """The controller a ``policy:PATH`` spec names, after checking file and sidecar."""
    onnx_path = user_path(path, PolicyFileError)
    meta, data = read_policy_files(onnx_path)
    fields = meta["observation"]["fields"]
    slo = SLO.parse(meta["slo"])
    return PolicyController(
        numpy_act(onnx_path, data, len(fields), meta["action"]["mode"]),
        meta["action"]["mode"],
        slo,
        ControlInterval.parse(meta["control_interval"]),
        name=f"policy:{path}",
        fields=fields,
        slo_scale=slo_ranges(meta.get("slo_scale") or {}, slo) or None,
    )
