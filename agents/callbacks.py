"""SB3 callbacks: domain metrics in tensorboard, and evaluation against the baselines.

`EvalScenario` runs (profile, workload, seeds) through `batchpilot.envs.run.run` exactly
as a comparison does; the policy runs there as a `PolicyController` around the live
model and its VecNormalize statistics, so what is evaluated is what is exported.
"""

from __future__ import annotations

import json
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from batchpilot.agents.checkpoint import save_checkpoint
from batchpilot.agents.policy import PolicyController
from batchpilot.baselines.specs import make_controller
from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload

EPISODE_METRICS = ("output_goodput", "output_throughput", "slo_attainment", "num_preemptions")


class DomainMetricsCallback(BaseCallback):
    """Logs ``domain/*`` (rates over recent control intervals) and ``episode/*`` (finished
    runs)."""

    def __init__(self, window: int = 1000) -> None:
        super().__init__()
        self.steps: deque[tuple[float, ...]] = deque(maxlen=window)
        self.episodes: deque[dict[str, float]] = deque(maxlen=20)

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            self.steps.append(
                (
                    info["interval_s"],
                    info["interval_good_output_tokens"],
                    info["interval_output_tokens"],
                    info["interval_preemptions"],
                    info["max_num_seqs"],
                    info["max_num_batched_tokens"],
                )
            )
            if "episode_metrics" in info:
                self.episodes.append(info["episode_metrics"])
        return True

    def _on_rollout_end(self) -> None:
        if self.steps:
            span, good, out, pre, limit, budget = np.array(self.steps).T
            total = max(span.sum(), 1e-9)
            self.logger.record("domain/goodput_tps", good.sum() / total)
            self.logger.record("domain/throughput_tps", out.sum() / total)
            self.logger.record("domain/preemptions_per_s", pre.sum() / total)
            self.logger.record("domain/limit_mean", limit.mean())
            self.logger.record("domain/token_budget_mean", budget.mean())
        for key in EPISODE_METRICS:
            if self.episodes:
                self.logger.record(f"episode/{key}", np.mean([m[key] for m in self.episodes]))


@dataclass(frozen=True)
class EvalScenario:
    """Held-out runs the policy is judged on during training."""

    profile: str
    workload: dict[str, Any]
    """`make_workload` arguments: source, arrival, num_requests."""
    slo: str
    interval: str
    seeds: list[int] = field(default_factory=lambda: [1000, 1001])

    def score(self, make: Any) -> dict[str, float]:
        """Mean output goodput, throughput and preemptions of ``make()`` controllers."""
        rows = []
        profile = get_profile(self.profile)
        for seed in self.seeds:
            w = make_workload(
                self.workload["source"],
                self.workload.get("arrival", "replay"),
                num_requests=self.workload.get("num_requests"),
                seed=seed,
                max_model_len=profile.max_model_len,
                overlong="truncate",
            )
            controller: Controller = make()
            engine = SimEngine(profile, slo=SLO.parse(self.slo))
            m = run(w, engine, controller, ControlInterval.parse(self.interval)).metrics()
            rows.append([m["output_goodput"], m["output_throughput"], m["num_preemptions"]])
        mean = np.mean(rows, axis=0)
        return {"output_goodput": mean[0], "output_throughput": mean[1], "num_preemptions": mean[2]}


class BaselineEvalCallback(BaseCallback):
    """Every `eval_freq` calls: evaluate the deterministic policy, keep the best in `best_dir`.

    The baselines' scores (``eval/<spec>_goodput``) are computed once at the start; the
    policy's gain over the best of them is ``eval/gain_vs_best_baseline``.
    """

    def __init__(
        self,
        scenario: EvalScenario,
        action_mode: str,
        slo: SLO,
        eval_freq: int,
        best_dir: Path,
        baselines: tuple[str, ...] = ("alg1+alg2", "alg2:chunk=1"),
    ) -> None:
        super().__init__()
        self.scenario, self.action_mode, self.slo = scenario, action_mode, slo
        self.eval_freq, self.best_dir, self.baselines = eval_freq, best_dir, baselines
        self.reference: dict[str, dict[str, float]] = {}
        record = best_dir / "eval.json"
        self.best = json.loads(record.read_text())["output_goodput"] if record.exists() else -1.0

    def _on_training_start(self) -> None:
        for b in self.baselines:
            self.reference[b] = self.scenario.score(lambda b=b: make_controller(b))
        self._evaluate()  # the starting policy (the imitation result) is a candidate too

    def _act(self, obs: np.ndarray) -> np.ndarray:
        vecnorm = self.model.get_vec_normalize_env()
        if vecnorm is not None:
            obs = vecnorm.normalize_obs(obs)
        return self.model.predict(obs, deterministic=True)[0]

    def _on_step(self) -> bool:
        if self.n_calls % self.eval_freq == 0:
            self._evaluate()
        return True

    def _evaluate(self) -> None:
        interval = ControlInterval.parse(self.scenario.interval)
        score = self.scenario.score(
            lambda: PolicyController(self._act, self.action_mode, self.slo, interval)
        )
        top = max(r["output_goodput"] for r in self.reference.values())
        for b, r in self.reference.items():
            self.logger.record(f"eval/{b}_goodput", r["output_goodput"])
        for k, v in score.items():
            self.logger.record(f"eval/{k}", v)
        self.logger.record("eval/gain_vs_best_baseline", score["output_goodput"] / top - 1.0)
        if score["output_goodput"] > self.best:
            self.best = score["output_goodput"]
            save_checkpoint(self.model, self.best_dir)
            record = {"timesteps": self.num_timesteps, **score, "baselines": self.reference}
            (self.best_dir / "eval.json").write_text(json.dumps(record, indent=2) + "\n")
