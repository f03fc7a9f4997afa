"""Controller specs as written on the CLI: ``static:256``, ``alg1:eps=0.05``, ``policy:PATH``."""

from __future__ import annotations

from collections.abc import Callable

from batchpilot.baselines.static import StaticController
from batchpilot.envs.controller import Controller


class ControllerSpecError(ValueError):
    """A controller spec that names no known controller or has bad arguments."""


def _static(args: list[str]) -> Controller:
    if len(args) != 1:
        raise ControllerSpecError("static takes one argument: static:N (max_num_seqs)")
    try:
        n = int(args[0])
    except ValueError:
        raise ControllerSpecError(f"static:{args[0]}: N must be an integer") from None
    if n < 1:
        raise ControllerSpecError(f"static:{n}: N must be >= 1")
    return StaticController(n)


FACTORIES: dict[str, Callable[[list[str]], Controller]] = {"static": _static}
"""Spec name -> factory taking the spec's ':'-separated arguments."""


def make_controller(spec: str) -> Controller:
    """Build the controller a spec names."""
    name, *args = spec.strip().split(":")
    if name not in FACTORIES:
        raise ControllerSpecError(
            f"unknown controller {spec!r}; known: {', '.join(sorted(FACTORIES))}"
        )
    return FACTORIES[name](args)
