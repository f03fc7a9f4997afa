"""SB3 callbacks: domain metrics in tensorboard, and evaluation against the baselines.

`EvalScenario` runs (profile, workload, seeds) through `batchpilot.envs.run.run`, the
runner a comparison uses, on the simulated engine it trained on; the policy runs there as a
`PolicyController` around the live model and its VecNormalize statistics, so what is
evaluated is what is exported. A trace file's ``num_requests`` are a window per seed, as a
comparison takes them (`batchpilot.envs.workloads.trace_window`); unlike a comparison's
scenario, nothing else is drawn per seed (rate or length scales).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from stable_baselines3.common.callbacks import BaseCallback

from batchpilot.agents.checkpoint import CheckpointError, save_checkpoint
from batchpilot.agents.policy import PolicyController
from batchpilot.baselines.specs import RULES, make_controller
from batchpilot.envs.arrivals import DEFAULT_ARRIVAL
from batchpilot.envs.controller import ControlInterval, Controller
from batchpilot.envs.json_objects import brief, read_json_object
from batchpilot.envs.metrics import SLO, geometric_mean
from batchpilot.envs.plain_numbers import is_number
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.traces import DEFAULT_BAD_ROWS
from batchpilot.envs.workload import Workload
from batchpilot.envs.workloads import (
    is_trace_file,
    make_workload,
    short_trace_note,
    trace_window,
)

RANK_FLOOR = 1e-6
"""The least goodput a run counts with in a checkpoint's geometric mean (`geometric_mean`): a
run without goodput lowers the score without zeroing it, so checkpoints still rank."""
EPISODE_METRICS = ("output_goodput", "output_throughput", "slo_attainment", "num_preemptions")
EVAL_METRICS = ("output_goodput", "output_throughput", "num_preemptions")


class DomainMetricsCallback(BaseCallback):
    """Logs ``domain/*`` (rates over recent control intervals) and ``episode/*`` (the recent
    runs whose workload finished; ``episode/truncated_share``: the share of recent episodes
    a time limit cut short instead, which those averages leave out)."""

    def __init__(self, window: int = 1000) -> None:
        super().__init__()
        self.steps: deque[tuple[float, ...]] = deque(maxlen=window)
        self.episodes: deque[dict[str, float]] = deque(maxlen=20)
        self.ends: deque[bool] = deque(maxlen=20)  # truncated, per recent episode

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
                self.ends.append(False)
            elif info.get("TimeLimit.truncated"):
                self.ends.append(True)
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
        if self.ends:
            self.logger.record("episode/truncated_share", float(np.mean(self.ends)))


@dataclass(frozen=True)
class EvalScenario:
    """Held-out runs the policy is judged on during training: each workload on each profile
    (as the env's `profile` and `workload` lists: a workload's optional ``profiles`` picks
    which), on the same seeds."""

    profile: str | list[str]
    workload: dict[str, Any] | list[dict[str, Any]]
    """`make_workload` arguments (source, arrival, num_requests, bad_rows), and optional
    ``profiles``."""
    slo: str
    interval: str
    seeds: list[int] = field(default_factory=lambda: [1000, 1001])
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """`SimEngine` keywords of the engine trained on (``scheduler``, ...), for every run."""

    @property
    def profiles(self) -> list[str]:
        return [self.profile] if isinstance(self.profile, str) else list(self.profile)

    @property
    def workloads(self) -> list[dict[str, Any]]:
        return [self.workload] if isinstance(self.workload, dict) else list(self.workload)

    def runs(self) -> list[tuple[str, dict[str, Any]]]:
        """(profile, workload) pairs, workloads first."""
        profiles = self.profiles
        return [
            (p, w) for w in self.workloads for p in profiles if p in w.get("profiles", profiles)
        ]

    def check(self) -> list[str]:
        """Draw each run's workload once (its first seed), so one that cannot be drawn fails
        before training, naming it, not when the first evaluation starts. Returns a note for
        each trace that holds fewer requests than asked (every run takes the whole trace)."""
        notes = []
        for name, spec in self.runs():
            try:
                drawn = self._workload(spec, self.seeds[0], get_profile(name).max_model_len)
            except (ValueError, OSError) as exc:
                raise ValueError(f"workload {spec!r} on {name}: {exc}") from None
            note = is_trace_file(spec["source"]) and short_trace_note(
                f"eval workload {spec['source']}", len(drawn), spec.get("num_requests")
            )
            if note and note not in notes:
                notes.append(note)
        return notes

    @staticmethod
    def _workload(spec: dict[str, Any], seed: int, max_model_len: int) -> Workload:
        """Seed `seed`'s workload of `spec` (a trace file's window per seed, as a comparison
        takes it: `trace_window`)."""
        bad_rows = spec.get("bad_rows", DEFAULT_BAD_ROWS)
        num_requests, start = trace_window(spec["source"], spec.get("num_requests"), seed, bad_rows)
        return make_workload(
            spec["source"],
            spec.get("arrival", DEFAULT_ARRIVAL),
            num_requests=num_requests,
            seed=seed,
            max_model_len=max_model_len,
            bad_rows=bad_rows,
            window_start=start,
        )

    def score(self, make: Any) -> dict[str, Any]:
        """Goodput and throughput of ``make()`` controllers, each a geometric mean over the
        runs of the mean over seeds (so a slow profile weighs as much as a fast one), the
        mean preemptions, and ``goodput_by_run`` (one value per `runs` pair)."""
        by_run = []
        for name, spec in self.runs():
            profile = get_profile(name)
            rows = []
            for seed in self.seeds:
                w = self._workload(spec, seed, profile.max_model_len)
                controller: Controller = make()
                engine = SimEngine(profile, slo=SLO.parse(self.slo), **self.engine_kwargs)
                m = run(w, engine, controller, ControlInterval.parse(self.interval)).metrics()
                rows.append([m["output_goodput"], m["output_throughput"], m["num_preemptions"]])
            by_run.append(np.mean(rows, axis=0))
        good, out, pre = np.array(by_run).T
        return {
            "output_goodput": geometric_mean(good, RANK_FLOOR),
            "output_throughput": geometric_mean(out, RANK_FLOOR),
            "num_preemptions": float(pre.mean()),
            "goodput_by_run": [float(g) for g in good],
        }


EVAL_RECORD = "eval.json"
"""The evaluation a best checkpoint was kept for, in its directory: the policy's metrics
(`EvalScenario.score`), the runs and the baselines' scores (`BaselineEvalCallback`)."""


def read_eval_record(best_dir: Path) -> dict[str, Any] | None:
    """The `EVAL_RECORD` of the best checkpoint in `best_dir`, checked for the goodputs it is
    read for (the policy's and each baseline's); None if there is none yet. A bad record is
    a `CheckpointError` naming the file."""
    path = best_dir / EVAL_RECORD
    if not path.is_file():
        return None
    record = read_json_object(path, "the evaluation record", CheckpointError)
    baselines = record.get("baselines", {})
    if not isinstance(baselines, dict):
        raise CheckpointError(f"{path}: baselines must be a JSON object")
    for where, scores in (("", record), *((f"baselines.{b}.", s) for b, s in baselines.items())):
        goodput = scores.get("output_goodput") if isinstance(scores, dict) else None
        if not is_number(goodput) or not goodput >= 0:
            raise CheckpointError(
                f"{path}: {where}output_goodput is {brief(goodput)}; need a number >= 0"
            )
    return record


class BaselineEvalCallback(BaseCallback):
    """Every `eval_freq` calls: evaluate the deterministic policy, keep the best in `best_dir`.

    The baselines' scores (``eval/<spec>_goodput``) are computed once at the start; the
    policy's gain over the geometric mean, across the runs, of the best baseline in each is
    ``eval/gain_vs_best_baseline``; ``eval/run<i>_goodput`` is the policy's goodput per run.
    """

    def __init__(
        self,
        scenario: EvalScenario,
        action_mode: str,
        slo: SLO,
        eval_freq: int,
        best_dir: Path,
        baselines: tuple[str, ...] = RULES,
        fields: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        self.scenario, self.action_mode, self.slo = scenario, action_mode, slo
        self.fields = fields
        self.eval_freq, self.best_dir, self.baselines = eval_freq, best_dir, baselines
        self.reference: dict[str, dict[str, float]] = {}
        record = read_eval_record(best_dir)
        self.best = -1.0 if record is None else record["output_goodput"]

    def _on_training_start(self) -> None:
        for b in self.baselines:
            self.reference[b] = self.scenario.score(lambda b=b: make_controller(b))
        self._evaluate()  # the starting policy (the imitation result) is a candidate too
        self.logger.dump(self.num_timesteps)  # at its own step, as SB3's EvalCallback logs

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
            lambda: PolicyController(
                self._act, self.action_mode, self.slo, interval, fields=self.fields
            )
        )
        # per run, the best baseline there; their geometric mean is the bar
        top = np.max([r["goodput_by_run"] for r in self.reference.values()], axis=0)
        for b, r in self.reference.items():
            self.logger.record(f"eval/{b}_goodput", r["output_goodput"])
        for k in EVAL_METRICS:
            self.logger.record(f"eval/{k}", score[k])
        for i, g in enumerate(score["goodput_by_run"]):
            self.logger.record(f"eval/run{i}_goodput", g)
        gain = score["output_goodput"] / geometric_mean(top, RANK_FLOOR) - 1.0
        self.logger.record("eval/gain_vs_best_baseline", gain)
        if score["output_goodput"] > self.best:
            self.best = score["output_goodput"]
            save_checkpoint(self.model, self.best_dir)
            runs = [
                f"{w['source']}@{w.get('arrival', 'replay')} on {p}"
                for p, w in self.scenario.runs()
            ]
            record = {
                "timesteps": self.num_timesteps,
                **score,
                "runs": runs,
                "baselines": self.reference,
            }
            (self.best_dir / EVAL_RECORD).write_text(json.dumps(record, indent=2) + "\n")
