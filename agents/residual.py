"""Warm start from the baselines: the policy acts as a residual on Algorithms 1+2.

The baselines (by default ``alg1+alg2``) decide at every engine decision as they would
alone; their recommendations are added to the observation (``<part>_limit_frac``, each
part's limit / B) and the smallest of them is the action's zero point:

    limit = clip(min(round(min(parts) * 2 ** (a * max_log2_step)), cap), b_min, B)

with a in [-1, 1] and cap the limit of the `cap_by` part (Algorithm 1's memory bound by
default), so the policy never admits more than Algorithm 1 judges the KV cache can hold.

The policy chooses `a` every `hold` decisions and keeps it in between, so a = 0 (an
untrained policy, see `zero_action_head`) is exactly the baseline. `ResidualCore` is
pure Python/numpy and shared by the training wrapper and the deployed controller.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from batchpilot.baselines.specs import make_controller
from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import Telemetry


@dataclass(frozen=True)
class ResidualSpec:
    """How the residual action is built: baselines, action range and hold."""

    baseline: str = "alg1+alg2"
    """Controller spec; ``A+B`` contributes one feature per part, zero point = the min."""
    max_log2_step: float = 2.0
    """a = +-1 multiplies the baseline's limit by 2 ** +-max_log2_step."""
    hold: int = 16
    """Engine decisions the policy's action is kept for (the baselines decide at each)."""
    cap_by: str | None = "alg1"
    """The part whose limit the policy may not exceed (None: no cap)."""

    def __post_init__(self) -> None:
        if self.max_log2_step <= 0 or self.hold < 1:
            raise ValueError(
                f"residual: need max_log2_step > 0 and hold >= 1, got {self.max_log2_step}, "
                f"{self.hold}"
            )
        names = [p.split(":")[0] for p in self.parts]
        if self.cap_by is not None and self.cap_by not in names:
            raise ValueError(f"residual: cap_by {self.cap_by!r} is not a part of {self.baseline!r}")

    @property
    def parts(self) -> list[str]:
        return [p.strip() for p in self.baseline.split("+")]

    @property
    def feature_names(self) -> tuple[str, ...]:
        """Observation entries the residual adds after the env's own."""
        return tuple(f"{p.split(':')[0]}_limit_frac" for p in self.parts)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class ResidualCore:
    """Baseline recommendations, their features, and the residual action -> limit map."""

    def __init__(self, spec: ResidualSpec, b_min: int = 1) -> None:
        self.spec = spec
        self.b_min = b_min
        self.controllers = [make_controller(p) for p in spec.parts]
        names = [p.split(":")[0] for p in spec.parts]
        self._cap = None if spec.cap_by is None else names.index(spec.cap_by)
        self.b_max = 1
        self.parts: list[int] = []

    def reset(self, engine: Engine, b_max: int) -> None:
        for c in self.controllers:
            c.reset(engine)
        self.b_max = b_max

    def decide(self, t: Telemetry) -> None:
        """Advance every baseline one decision on `t`; their limits become the zero point."""
        self.parts = [c.decide(t).max_num_seqs for c in self.controllers]

    def features(self) -> np.ndarray:
        return np.clip(np.array(self.parts, np.float32) / self.b_max, 0.0, 10.0)

    def limit(self, action: np.ndarray | float) -> int:
        """The limit for residual action `a` around the current zero point."""
        a = float(np.clip(np.asarray(action, dtype=np.float64).reshape(-1)[0], -1.0, 1.0))
        if not math.isfinite(a):
            raise ValueError(f"residual action is not finite: {action!r}")
        limit = round(min(self.parts) * 2.0 ** (a * self.spec.max_log2_step))
        if self._cap is not None:
            limit = min(limit, self.parts[self._cap])
        return int(min(self.b_max, max(self.b_min, limit)))


INTERVAL_SUMS = ("interval_good_output_tokens", "interval_output_tokens", "interval_preemptions")
"""Telemetry counts the wrapper sums over a held action (``info["held_<name>"]``)."""


class ResidualWrapper(gym.Wrapper):
    """`batchpilot/Batching-v0` with the residual action and the baseline features.

    One wrapper step holds the action for `spec.hold` env steps (stopping early at the
    episode's end); its reward is the env's reward rate averaged over engine time,
    sum(r_i * dt_i) / sum(dt_i), so goodput and throughput terms stay tokens per second.
    ``info`` adds the limit, ``held_s`` and the `INTERVAL_SUMS` over the held steps, and at
    the episode's end ``episode_metrics``, the run's `vllm bench serve` metrics.
    """

    def __init__(self, env: gym.Env, spec: ResidualSpec) -> None:
        super().__init__(env)
        base = env.unwrapped
        if base.action_mode != "absolute" or base.control_token_budget:
            raise ValueError("ResidualWrapper needs action_mode='absolute' and no token budget")
        self.residual = spec
        self.core = ResidualCore(spec, b_min=base.b_min)
        n = len(spec.feature_names)
        low = np.concatenate([env.observation_space.low, np.zeros(n, np.float32)])
        high = np.concatenate([env.observation_space.high, np.full(n, 10.0, np.float32)])
        self.observation_space = spaces.Box(low, high, dtype=np.float32)
        self.action_space = spaces.Box(-1.0, 1.0, (1,), np.float32)

    def _obs(self, obs: np.ndarray) -> np.ndarray:
        return np.concatenate([obs, self.core.features()]).astype(np.float32)

    def reset(self, **kwargs: Any) -> tuple[np.ndarray, dict[str, Any]]:
        obs, info = self.env.reset(**kwargs)
        base = self.env.unwrapped
        self.core.reset(base.engine, base._b_max)
        self.core.decide(base.telemetry)
        return self._obs(obs), info

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict[str, Any]]:
        base = self.env.unwrapped
        lo, hi = base.b_min, base._b_max
        weighted = span = 0.0
        totals = dict.fromkeys(INTERVAL_SUMS, 0.0)
        for _ in range(self.residual.hold):
            limit = self.core.limit(action)
            a_env = 0.0 if hi == lo else 2.0 * (limit - lo) / (hi - lo) - 1.0
            obs, reward, terminated, truncated, info = self.env.step(np.array([a_env], np.float32))
            dt = max(info["interval_s"], 1e-9)
            weighted += reward * dt
            span += dt
            for k in INTERVAL_SUMS:
                totals[k] += info[k]
            self.core.decide(base.telemetry)
            if terminated or truncated:
                info["episode_metrics"] = base.engine.result().metrics()
                break
        info |= {f"held_{k}": v for k, v in totals.items()} | {"held_s": span, "limit": limit}
        return self._obs(obs), weighted / span, terminated, truncated, info
