"""Settings `batchpilot serve` hands to the scheduler in vLLM's engine process, and the one
check of a controller spec that both sides run. Imports no vLLM, so a bad spec is refused
before vLLM starts.

- ``BATCHPILOT_CONTROLLER``: a spec (``alg1+alg2``, ``alg2:sla_ms=50``, ``policy:PATH``,
  ...); unset: no controller, vLLM's own static limits (the scheduler still tracks).
- ``BATCHPILOT_SLO``: goodput SLOs for the telemetry (default `DEFAULT_SLO`).
- ``BATCHPILOT_DECISION_BUDGET_MS``: a decision slower than this on 3 calls in a row counts
  as a failure (default `DEFAULT_BUDGET_MS`).
- ``BATCHPILOT_DECISION_DEADLINE_MS``: the longest the engine waits for one decision; one
  not back by then leaves the engine on static limits until it returns (default
  `DEADLINE_BUDGETS` times the budget: 50 ms; at least the budget).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

from batchpilot.agents.specs import FACTORIES, make_controller
from batchpilot.baselines.specs import (
    BEST_STATIC,
    SIMULATOR_ONLY,
    ControllerSpecError,
    simulator_only,
    spec_parts,
)
from batchpilot.envs import metrics
from batchpilot.envs.controller import Controller
from batchpilot.envs.metrics import SLO, goodput_slo
from batchpilot.envs.names import did_you_mean
from batchpilot.envs.plain_numbers import plain_float

CONTROLLER_ENV = "BATCHPILOT_CONTROLLER"
SLO_ENV = "BATCHPILOT_SLO"
BUDGET_ENV = "BATCHPILOT_DECISION_BUDGET_MS"
DEADLINE_ENV = "BATCHPILOT_DECISION_DEADLINE_MS"
PARENT_ENV = "BATCHPILOT_SERVE_PID"
"""The pid of the `batchpilot serve` that started the server: the server stops when it dies."""
DEFAULT_SLO = str(metrics.DEFAULT_SLO)
DEFAULT_BUDGET_MS = 5.0
DEADLINE_BUDGETS = 10
"""The default decision deadline, in decision budgets (50 ms at the default 5 ms budget)."""
STUCK_S = 30.0
"""A late decision still out after this many seconds is a failure: static limits for good."""
MS_RANGE = (1e-3, STUCK_S * 1e3)
"""The decision budget's and deadline's range in ms: 1 us (a rule decides in tens) to
`STUCK_S`, the longest a late decision may stay out before it counts as failed (the engine
waits no longer than that for one)."""


class EngineSettings(NamedTuple):
    slo: SLO
    budget_s: float
    deadline_s: float


def serving_controller(controller: Controller | str) -> Controller:
    """The controller (or the one a spec names), refused (ValueError) if it cannot run
    inside vLLM."""
    if isinstance(controller, str):
        _check_servable_names(controller)
        controller = make_controller(controller)
    if simulator_only(controller):
        raise ValueError(
            f"{controller.name}: needs the simulator (oracle reads its true lengths, mpc forks "
            "it to look ahead); it cannot serve"
        )
    return controller


def _check_servable_names(spec: str) -> None:
    """A ControllerSpecError for a part of `spec` naming no controller, listing those that
    can serve (not the simulator's own, as `make_controller`'s message does)."""
    servable = sorted(set(FACTORIES) - SIMULATOR_ONLY)
    for part in spec_parts(spec):
        name = part.split(":")[0]
        if name not in FACTORIES and name != BEST_STATIC:  # best-static: make_controller says
            raise ControllerSpecError(
                f"unknown controller {part!r}; {did_you_mean(name, servable)}serve takes: "
                f"{', '.join(servable)}, and A+B combinations (the lower of their limits)"
            )


def engine_settings(environ: Mapping[str, str]) -> EngineSettings:
    """The SLO, decision budget and decision deadline (s) that `environ` sets, defaults
    where unset; a ValueError names the variable that is bad."""
    text = environ.get(SLO_ENV, DEFAULT_SLO)
    try:
        slo = SLO.parse(text)
    except ValueError as exc:
        raise ValueError(f"{SLO_ENV}={text!r}: {exc}") from None
    goodput_slo(slo, f"{SLO_ENV}={text!r}:")
    budget_ms = milliseconds(environ, BUDGET_ENV, DEFAULT_BUDGET_MS)
    default_ms = min(DEADLINE_BUDGETS * budget_ms, MS_RANGE[1])
    deadline_ms = milliseconds(environ, DEADLINE_ENV, default_ms)
    if deadline_ms < budget_ms:
        raise ValueError(
            f"{DEADLINE_ENV}={environ[DEADLINE_ENV]!r}: below the {budget_ms:g} ms decision budget"
        )
    return EngineSettings(slo, budget_ms / 1e3, deadline_ms / 1e3)


def milliseconds(environ: Mapping[str, str], name: str, default: float) -> float:
    """The milliseconds (within `MS_RANGE`) `environ` sets `name` to, else `default`."""
    text = environ.get(name, str(default))
    try:
        ms = plain_float(text)
    except ValueError:
        ms = math.nan
    low, high = MS_RANGE
    if not low <= ms <= high:
        raise ValueError(f"{name}={text!r}: need a number of milliseconds in [{low:g}, {high:g}]")
    return ms
