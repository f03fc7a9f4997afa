"""`batchpilot/Batching-v0`: choose an LLM engine's batch-size limit every control interval."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from batchpilot.envs.arrivals import Arrival
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import EngineProfile, get_profile
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.workload import Request, Workload
from batchpilot.envs.workloads import DEFAULT_SOURCE, make_workload

OBSERVATION_FIELDS = (
    "kv_cache_usage",
    "running_frac",
    "waiting_frac",
    "decoding_frac",
    "limit_frac",
    "tbt_over_slo",
    "ttft_over_slo",
    "output_tokens_per_step_frac",
    "preemptions_per_running",
    "prompt_mean_frac",
    "output_mean_frac",
    "length_std_frac",
    "log_arrival_rate",
    "kv_fit_frac",
    "budget_frac",
)
"""Names of the observation vector's entries, in order (see `BatchingEnv`)."""


def observe(
    t: Telemetry, *, b_max: int, max_model_len: int, engine_token_budget: int, slo: SLO
) -> np.ndarray:
    """The observation vector (`OBSERVATION_FIELDS`) for telemetry `t`; see `BatchingEnv`.

    Pure, so that a deployed policy sees exactly what the environment showed it.
    """
    B = b_max
    L = max_model_len
    tpot = (slo.tpot_ms or 100.0) / 1e3
    ttft = (slo.ttft_ms or 2000.0) / 1e3
    mean_len = max(1.0, t.prompt_mean + t.output_mean)
    per_step = t.interval_output_tokens / t.interval_iterations if t.interval_iterations else 0
    obs = np.array(
        [
            t.kv_cache_usage,
            t.num_requests_running / B,
            t.num_requests_waiting / B,
            t.num_decoding / B,
            t.max_num_seqs / B,
            t.recent_tbt_s / tpot,
            t.recent_ttft_s / ttft,
            per_step / B,
            t.interval_preemptions / max(1, t.num_requests_running),
            t.prompt_mean / L,
            t.output_mean / L,
            math.sqrt(max(0.0, t.prompt_var + t.output_var)) / L,
            math.log1p(t.arrival_rate) / 5.0,
            t.kv_capacity_tokens / mean_len / B,
            t.max_num_batched_tokens / engine_token_budget,
        ],
        dtype=np.float64,
    )
    return np.clip(np.nan_to_num(obs, nan=0.0), 0.0, 10.0).astype(np.float32)


@dataclass(frozen=True)
class WorkloadSpec:
    """How to draw an episode's workload: a source, an arrival process and randomisation.

    `rate_scale` (lo, hi) multiplies the arrival rate (Poisson, Gamma, replay) by a
    factor drawn uniformly per episode; `length_scale` does the same for output lengths.
    """

    source: str = DEFAULT_SOURCE
    arrival: str = "replay"
    num_requests: int = 400
    rate_scale: tuple[float, float] = (1.0, 1.0)
    length_scale: tuple[float, float] = (1.0, 1.0)

    @classmethod
    def coerce(cls, value: str | dict | WorkloadSpec) -> WorkloadSpec:
        if isinstance(value, WorkloadSpec):
            return value
        if isinstance(value, str):
            return cls(source=value)
        if isinstance(value, dict):
            unknown = set(value) - set(cls.__dataclass_fields__)
            if unknown:
                raise ValueError(f"workload spec: unknown key(s) {sorted(unknown)}")
            data = dict(value)
            for key in ("rate_scale", "length_scale"):
                if key in data:
                    lo, hi = data[key]
                    if not 0 < lo <= hi:
                        raise ValueError(f"workload spec: {key} must be 0 < lo <= hi, got {lo, hi}")
                    data[key] = (float(lo), float(hi))
            return cls(**data)
        raise TypeError(f"workload spec must be a str, dict or WorkloadSpec, got {type(value)}")

    def draw(self, rng: np.random.Generator, max_model_len: int) -> Workload:
        arrival = Arrival.parse(self.arrival)
        f = rng.uniform(*self.rate_scale)
        if arrival.kind in ("poisson", "gamma"):
            arrival = Arrival(arrival.kind, rate=arrival.rate * f, cv=arrival.cv)
        elif arrival.kind == "replay":
            arrival = Arrival("replay", scale=arrival.scale * f)
        w = make_workload(
            self.source,
            arrival,
            num_requests=self.num_requests,
            seed=int(rng.integers(2**31)),
            max_model_len=max_model_len,
            overlong="truncate",
        )
        g = rng.uniform(*self.length_scale)
        if g != 1.0:
            w = Workload(
                w.name,
                [
                    Request(
                        r.request_id,
                        r.arrival_s,
                        r.prompt_tokens,
                        max(1, min(round(r.output_tokens * g), max_model_len - r.prompt_tokens)),
                    )
                    for r in w.requests
                ],
                source=w.source,
            )
        return w


class BatchingEnv(gym.Env):
    """
    ## Description
    An LLM serving engine (vLLM V1, simulated or real) serves a stream of requests with
    continuous batching. Every control interval the agent sets the engine's batch-size
    limit (`max_num_seqs`, and optionally the per-step token budget
    `max_num_batched_tokens`). Too low a limit wastes the accelerator; too high overflows
    the KV cache (preemption and recompute) or breaks the latency objectives.

    ## Action Space
    `Box(-1, 1, (1,))`, or `(2,)` with `control_token_budget=True` (second entry: the
    token budget, mapped linearly onto [`min_token_budget`, engine budget]).

    - `action_mode="absolute"`: the limit is `b_min + (a + 1) / 2 * (b_max - b_min)`.
    - `action_mode="delta"`: a bounded change, `limit * 2 ** (a * max_log2_step)`.

    ## Observation Space
    `Box(0, 10, (15,), float32)`; B = `b_max`, L = the model's context length:

    | idx | name | meaning |
    |---|---|---|
    | 0 | kv_cache_usage | used KV blocks / total (vllm:kv_cache_usage_perc) |
    | 1 | running_frac | running requests / B |
    | 2 | waiting_frac | waiting requests / B (clipped at 10) |
    | 3 | decoding_frac | running requests past prefill / B |
    | 4 | limit_frac | current limit / B |
    | 5 | tbt_over_slo | recent time between tokens / TPOT SLO (clipped) |
    | 6 | ttft_over_slo | recent TTFT / TTFT SLO (clipped) |
    | 7 | output_tokens_per_step_frac | output tokens per engine step in the interval / B |
    | 8 | preemptions_per_running | preemptions in the interval / max(1, running) |
    | 9 | prompt_mean_frac | running mean prompt length / L |
    | 10 | output_mean_frac | running mean output length / L |
    | 11 | length_std_frac | sqrt(Var prompt + Var output) / L |
    | 12 | log_arrival_rate | log1p(arrivals per s) / 5 |
    | 13 | kv_fit_frac | KV capacity in mean-size requests / B (Algorithm 1's linear bound) |
    | 14 | budget_frac | token budget / engine budget |

    ## Rewards
    Per interval, with goodput measured in output tokens of requests that finished in
    the interval meeting every SLO, and `scale` a reference decode throughput (tokens/s):

        r = w_goodput * good_tokens/s / scale + w_throughput * output_tokens/s / scale
            - w_preemption * preemptions / max(1, running)
            - w_tbt * max(0, recent_tbt / tpot_slo - 1)

    Defaults: `reward_weights = {"goodput": 1, "throughput": 0.1, "preemption": 0.5,
    "tbt": 0.5}`.

    ## Episode End
    Terminated when every request of the episode's workload has finished; truncated by
    the `max_episode_steps` of `gymnasium.make` (default 512).

    ## Arguments
    - `engine`: `"sim"` (default) or `"vllm"` (needs `model`, a model directory; extra
      `engine_kwargs` go to `make_vllm_engine`).
    - `profile`: engine profile name or JSON path, or a list to draw from per episode.
    - `workload`: a source string (`embedded:NAME` or a trace path), a dict of
      `WorkloadSpec` fields, or a list of them to draw from per episode.
    - `slo`: goodput SLOs, `"ttft:2000,tpot:100"` (ms).
    - `control_interval_s` or `control_interval_iters`: one env step's length.
    - `action_mode`, `max_log2_step`, `b_min`, `b_max` (default: the engine's cap),
      `control_token_budget`, `min_token_budget`, `reward_weights`, `reward_scale_tps`.

    ## Examples
    ```python
    import gymnasium as gym
    import batchpilot.envs  # registers batchpilot/Batching-v0

    env = gym.make("batchpilot/Batching-v0", profile="llama-7b-a100",
                   workload={"source": "embedded:azure-conv", "rate_scale": (0.5, 1.5)})
    obs, info = env.reset(seed=0)
    obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
    ```
    """

    metadata: ClassVar[dict[str, Any]] = {"render_modes": []}

    def __init__(
        self,
        engine: str = "sim",
        profile: str | list[str] = "llama-7b-a100",
        workload: str | dict | list[str | dict] = DEFAULT_SOURCE,
        slo: str = "ttft:2000,tpot:100",
        control_interval_s: float | None = 0.25,
        control_interval_iters: int | None = None,
        action_mode: str = "absolute",
        max_log2_step: float = 0.5,
        b_min: int = 1,
        b_max: int | None = None,
        control_token_budget: bool = False,
        min_token_budget: int = 256,
        reward_weights: dict[str, float] | None = None,
        reward_scale_tps: float | None = None,
        model: str | None = None,
        engine_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if engine not in ("sim", "vllm"):
            raise ValueError(f"engine must be 'sim' or 'vllm', got {engine!r}")
        if engine == "vllm" and not model:
            raise ValueError("engine='vllm' needs model=DIR (a model directory vLLM can load)")
        if action_mode not in ("absolute", "delta"):
            raise ValueError(f"action_mode must be 'absolute' or 'delta', got {action_mode!r}")
        if (control_interval_s is None) == (control_interval_iters is None):
            raise ValueError("set exactly one of control_interval_s and control_interval_iters")
        self.engine_kind = engine
        self.profiles = [profile] if isinstance(profile, str) else list(profile)
        if not self.profiles:
            raise ValueError("profile list is empty")
        self._profile_objs = [get_profile(p) for p in self.profiles]
        specs = workload if isinstance(workload, list) else [workload]
        if not specs:
            raise ValueError("workload list is empty")
        self.workloads = [WorkloadSpec.coerce(s) for s in specs]
        self.slo = SLO.parse(slo)
        self.control_interval_s = control_interval_s
        self.control_interval_iters = control_interval_iters
        self.action_mode = action_mode
        self.max_log2_step = max_log2_step
        self.b_min = b_min
        self.b_max_arg = b_max
        self.control_token_budget = control_token_budget
        self.min_token_budget = min_token_budget
        weights = {"goodput": 1.0, "throughput": 0.1, "preemption": 0.5, "tbt": 0.5}
        unknown = set(reward_weights or {}) - set(weights)
        if unknown:
            raise ValueError(f"reward_weights: unknown key(s) {sorted(unknown)}")
        self.reward_weights = weights | dict(reward_weights or {})
        self.reward_scale_tps = reward_scale_tps
        self.model = model
        self.engine_kwargs = engine_kwargs or {}
        self.action_space = spaces.Box(-1.0, 1.0, (2 if control_token_budget else 1,), np.float32)
        self.observation_space = spaces.Box(
            0.0, 10.0, (len(OBSERVATION_FIELDS),), np.float32
        )
        self._engine: Engine | None = None
        self._vllm_engine: Engine | None = None

    # ------------------------------------------------------------------ helpers
    def _make_engine(self, profile: EngineProfile) -> Engine:
        if self.engine_kind == "vllm":
            if self._vllm_engine is None:  # one real engine per env: start-up is costly
                from batchpilot.envs.vllm_engine import make_vllm_engine

                self._vllm_engine = make_vllm_engine(
                    self.model, slo=self.slo, **self.engine_kwargs
                )
            return self._vllm_engine
        from batchpilot.envs.sim_engine import SimEngine

        return SimEngine(profile, slo=self.slo)

    def _scale(self, profile: EngineProfile) -> float:
        if self.reward_scale_tps is not None:
            return self.reward_scale_tps
        b = min(256, profile.max_num_seqs)
        return b / profile.step(0, b, b * 512)

    def _observe(self, t: Telemetry) -> np.ndarray:
        return observe(
            t,
            b_max=self._b_max,
            max_model_len=self._engine.max_model_len,
            engine_token_budget=self._engine.max_num_batched_tokens,
            slo=self.slo,
        )

    def _reward(self, t: Telemetry) -> tuple[float, dict[str, float]]:
        w = self.reward_weights
        span = max(t.interval_s, 1e-9)
        tpot = (self.slo.tpot_ms or 100.0) / 1e3
        parts = {
            "goodput": t.interval_good_output_tokens / span / self._scale_tps,
            "throughput": t.interval_output_tokens / span / self._scale_tps,
            "preemption": -t.interval_preemptions / max(1, t.num_requests_running),
            "tbt": -max(0.0, t.recent_tbt_s / tpot - 1.0),
        }
        return float(sum(w[k] * v for k, v in parts.items())), parts

    def _limits(self, action: np.ndarray) -> Limits:
        a = np.clip(np.asarray(action, dtype=np.float64).reshape(-1), -1.0, 1.0)
        if not np.all(np.isfinite(a)):
            raise ValueError(f"action has non-finite entries: {action!r}")
        lo, hi = self.b_min, self._b_max
        if self.action_mode == "absolute":
            limit = lo + (a[0] + 1.0) / 2.0 * (hi - lo)
        else:
            limit = self._limit * 2.0 ** (a[0] * self.max_log2_step)
        limit = int(min(hi, max(lo, round(limit))))
        budget = None
        if self.control_token_budget:
            top = self._engine.max_num_batched_tokens
            low = min(self.min_token_budget, top)
            budget = round(low + (a[1] + 1.0) / 2.0 * (top - low))
        return Limits(limit, budget)

    # ------------------------------------------------------------------ gym API
    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[np.ndarray, dict[str, Any]]:
        super().reset(seed=seed)
        rng = self.np_random
        profile = self._profile_objs[int(rng.integers(len(self._profile_objs)))]
        self._engine = self._make_engine(profile)
        self._scale_tps = self._scale(profile)
        self._b_max = min(self.b_max_arg or self._engine.max_num_seqs, self._engine.max_num_seqs)
        if self.b_min > self._b_max:
            raise ValueError(f"b_min {self.b_min} > b_max {self._b_max}")
        spec = self.workloads[int(rng.integers(len(self.workloads)))]
        self.workload = spec.draw(rng, self._engine.max_model_len)
        self._limit = self._b_max
        self._telemetry = self._engine.reset(self.workload, Limits(self._limit))
        info = {"workload": self.workload.name, "profile": profile.name}
        return self._observe(self._telemetry), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        if self._engine is None:
            raise RuntimeError("call reset() before step()")
        limits = self._limits(action)
        self._limit = limits.max_num_seqs
        self._engine.set_limits(limits)
        until = None
        if self.control_interval_s is not None:
            until = self._telemetry.time_s + self.control_interval_s
        t = self._engine.advance(max_iterations=self.control_interval_iters, until_s=until)
        self._telemetry = t
        reward, parts = self._reward(t)
        info = asdict(t) | {f"reward_{k}": v for k, v in parts.items()}
        terminated = self._engine.done
        return self._observe(t), reward, terminated, False, info

    @property
    def telemetry(self) -> Telemetry:
        """The latest telemetry (for wrappers that compute baseline features)."""
        return self._telemetry

    @property
    def engine(self) -> Engine:
        """The engine of the current episode."""
        if self._engine is None:
            raise RuntimeError("call reset() first")
        return self._engine
