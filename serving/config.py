"""Settings `batchpilot serve` hands to the scheduler in vLLM's engine process, and the one
check of a controller spec that both sides run. Imports no vLLM, so a bad spec is refused
before vLLM starts.

- ``BATCHPILOT_CONTROLLER``: a spec (``alg1+alg2``, ``alg2:sla_ms=50``, ``policy:PATH``,
  ...); unset: no controller, vLLM's own static limits (the scheduler still tracks).
- ``BATCHPILOT_SLO``: goodput SLOs for the telemetry (default `DEFAULT_SLO`).
- ``BATCHPILOT_DECISION_BUDGET_MS``: a decision slower than this on 3 calls in a row counts
  as a failure (default `DEFAULT_BUDGET_MS`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from batchpilot.agents.specs import make_controller
from batchpilot.baselines.specs import simulator_only
from batchpilot.envs import metrics
from batchpilot.envs.controller import Controller
from batchpilot.envs.metrics import SLO, goodput_slo

CONTROLLER_ENV = "BATCHPILOT_CONTROLLER"
SLO_ENV = "BATCHPILOT_SLO"
BUDGET_ENV = "BATCHPILOT_DECISION_BUDGET_MS"
DEFAULT_SLO = str(metrics.DEFAULT_SLO)
DEFAULT_BUDGET_MS = 5.0


def serving_controller(controller: Controller | str) -> Controller:
    """The controller (or the one a spec names), refused (ValueError) if it cannot run
    inside vLLM."""
    if isinstance(controller, str):
        controller = make_controller(controller)
    if simulator_only(controller):
        raise ValueError(
            f"{controller.name}: reads the simulator's future (oracle); it cannot serve"
        )
    return controller


def engine_settings(environ: Mapping[str, str]) -> tuple[SLO, float]:
    """The SLO and decision budget (s) that `environ` sets, defaults where unset; a
    ValueError names the variable that is bad."""
    text = environ.get(SLO_ENV, DEFAULT_SLO)
    try:
        slo = SLO.parse(text)
    except ValueError as exc:
        raise ValueError(f"{SLO_ENV}={text!r}: {exc}") from None
    goodput_slo(slo, f"{SLO_ENV}={text!r}:")
    text = environ.get(BUDGET_ENV, str(DEFAULT_BUDGET_MS))
    try:
        budget_ms = float(text)
    except ValueError:
        budget_ms = math.nan
    if not 0 < budget_ms < math.inf:
        raise ValueError(f"{BUDGET_ENV}={text!r}: need a finite number of milliseconds > 0")
    return slo, budget_ms / 1e3
