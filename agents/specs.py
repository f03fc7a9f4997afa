"""Controller specs with learned policies: the baselines' specs plus ``policy:PATH``.

`make_controller` here is the one to call wherever a user may name an exported policy
(``simulate``, ``compare``, ``serve``); `batchpilot.baselines.specs` builds the rules alone,
since baselines sit below agents.
"""

from __future__ import annotations

from collections import ChainMap
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

from batchpilot.baselines import specs as baseline_specs
from batchpilot.envs.controller import Controller


def _policy(args: list[str]) -> Controller:
    from batchpilot.agents.policy import load_policy  # lazy: onnx only when asked

    if not args:
        raise baseline_specs.ControllerSpecError(
            "policy takes the exported file: policy:PATH (e.g. policy:runs/p/policy.onnx)"
        )
    return load_policy(":".join(args))


FACTORIES: ChainMap[str, Callable[[list[str]], Controller]] = ChainMap(
    {"policy": _policy}, baseline_specs.FACTORIES
)
"""Spec name -> factory: ``policy`` and (a live view of) the baselines'."""


SEPARATORS = (
    "',' separates controller specs and '+' joins two controllers (unless a digit follows "
    "it), so a policy's path in a spec cannot hold either: move or link the file"
)
"""Why a policy path cannot hold ',' or '+' (`policy_spec`)."""


def make_controller(spec: str) -> Controller:
    """Build the controller a spec names (``policy:PATH`` included); ``A+B`` is the minimum."""
    try:
        return baseline_specs.make_controller(spec, FACTORIES)
    except ValueError as exc:
        from batchpilot.agents.policy import PolicyFileError, PolicyFileMissing

        if isinstance(exc, PolicyFileError) and baseline_specs.COMBINE.search(spec):
            raise PolicyFileError(f"{exc} (if the path holds a '+': {SEPARATORS})") from None
        cut = spec.startswith("policy:") and not spec.endswith(".onnx")
        if isinstance(exc, PolicyFileMissing) and cut:
            raise PolicyFileError(f"{exc} (if the path holds a ',': {SEPARATORS})") from None
        raise


def policy_spec(path: Path) -> str:
    """``policy:PATH``, for a path a user gave alone (``--policy``, a run's directory);
    a ValueError naming the problem if the spec would split it."""
    spec = f"policy:{path}"
    if "," in spec or baseline_specs.COMBINE.search(spec):
        raise ValueError(f"policy path {path}: {SEPARATORS}")
    return spec


def is_learned(spec: str) -> bool:
    """Whether a spec names a learned policy (``policy:PATH``, alone or in ``A+B``)."""
    return any(p.partition(":")[0] == "policy" for p in baseline_specs.spec_parts(spec))


def spec_key(spec: str) -> str:
    """`batchpilot.baselines.specs.spec_key` with each policy's path resolved: one policy
    named by two paths is one controller."""
    parts = []
    for part in baseline_specs.spec_parts(spec):
        name, sep, path = part.partition(":")
        if name == "policy" and sep:
            with suppress(OSError, RuntimeError, ValueError):  # a symlink loop, a NUL byte
                part = f"policy:{Path(path).expanduser().resolve()}"
        parts.append(part)
    return baseline_specs.spec_key("+".join(parts))
