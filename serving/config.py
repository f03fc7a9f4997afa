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

from batchpilot.agents.specs import make_controller
from batchpilot.baselines.specs import simulator_only
from batchpilot.envs import metrics
from batchpilot.envs.controller import Controller

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
