"""What a learned controller sees: telemetry scaled by fixed constants into one vector.

`Observer` is the one place the observation is built, for the Gymnasium environment and
for a deployed policy alike. Its scaling constants (`SCALES`) are fixed numbers, not
properties of an engine, so a policy file records them (the sidecar's ``observation``)
and a controller refuses a file made with other ones.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

import numpy as np

from batchpilot.envs.metrics import SLO
from batchpilot.envs.telemetry import Telemetry

SCALES: dict[str, float] = {
    "requests": 256.0,
    "tokens": 8192.0,
    "context_tokens": 4096.0,
    "log_rate": 5.0,
    "log2_limit": 10.0,
    "log2_budget": 14.0,
    "log2_kv_tokens": 24.0,
    "default_ttft_s": 2.0,
    "default_tpot_s": 0.1,
    "clip": 10.0,
}
"""Scaling constants (requests, tokens, log scales; TTFT/TPOT targets when the SLO sets
none; the clip bound)."""

OBSERVATION_FIELDS: tuple[str, ...] = (
    "kv_cache_usage",
    "kv_usage_trend",
    "running",
    "waiting",
    "decoding",
    "oldest_waiting_over_ttft",
    "waiting_prefill_tokens",
    "log_arrival_rate_short",
    "log_arrival_rate_long",
    "tbt_mean_over_tpot",
    "tbt_p90_over_tpot",
    "ttft_over_target",
    "prefill_share",
    "tokens_per_step",
    "preemptions_per_running",
    "log2_max_num_seqs",
    "log2_token_budget",
    "kv_fit",
    "prompt_mean",
    "output_mean",
    "log2_kv_capacity",
    "step_base_over_tpot",
    "log2_tokens_per_tpot",
)
"""Names of the observation's entries, in order (meanings: `Observer`). New entries are
appended, never inserted: a training run that names no entries observed the first ones."""


def checked_fields(fields: Sequence[str] | None) -> tuple[str, ...]:
    """`fields` as a tuple, if it names entries of `OBSERVATION_FIELDS`, each once, at least
    one (None: all of them); otherwise a ValueError naming the problem."""
    if fields is None:
        return OBSERVATION_FIELDS
    if isinstance(fields, str):
        raise ValueError(f"observation fields must be a list of entry names, got {fields!r}")
    if not fields:
        raise ValueError("observation fields name none; name at least one")
    unknown = [f for f in fields if f not in OBSERVATION_FIELDS]
    if unknown:
        raise ValueError(
            f"observation fields name entries this version does not compute (unknown: "
            f"{unknown[:3]}); known: {', '.join(OBSERVATION_FIELDS)}"
        )
    twice = [f for f, n in Counter(fields).items() if n > 1]
    if twice:
        raise ValueError(f"observation fields name {twice} more than once; name each once")
    return tuple(fields)


class Observer:
    """Telemetry -> observation vector (`OBSERVATION_FIELDS`), clipped to +-``clip``.

    Stateful only for the KV trend (the change of KV usage since the previous call), so
    call `reset` at the start of a run and once per decision. With R, T, C the
    ``requests``, ``tokens`` and ``context_tokens`` scales:

    | entry | value |
    |---|---|
    | kv_cache_usage | used KV blocks / total |
    | kv_usage_trend | kv_cache_usage - its previous value |
    | running, waiting, decoding | request counts / R |
    | oldest_waiting_over_ttft | age of the head of the waiting queue / TTFT target |
    | waiting_prefill_tokens | tokens the waiting requests must prefill / T |
    | log_arrival_rate_short, _long | log1p(arrivals/s over 5 s, 30 s) / log_rate |
    | tbt_mean_over_tpot, tbt_p90_over_tpot | interval mean and recent p90 step time / TPOT target |
    | ttft_over_target | mean TTFT of the interval's first tokens / TTFT target |
    | prefill_share | prompt tokens / (prompt + output tokens) in the interval |
    | tokens_per_step | (prompt + output tokens) per engine step in the interval / T |
    | preemptions_per_running | preemptions in the interval / max(1, running) |
    | log2_max_num_seqs, log2_token_budget | log2(limits in effect) / log2_limit, log2_budget |
    | kv_fit | KV capacity in requests of mean length (prompt + output) / R |
    | prompt_mean, output_mean | running mean lengths / C |
    | log2_kv_capacity | log2(KV capacity in tokens) / log2_kv_tokens |
    | step_base_over_tpot | measured step time at no tokens / TPOT target |
    | log2_tokens_per_tpot | log2(TPOT target / measured seconds per token) / log2_budget (0
    before any step) |

    The last two are the engine's speed (`Telemetry.step_base_s`, `step_s_per_token`): the
    step-time entries alone cannot tell a fast GPU under heavy load from a slow one under
    light load.

    `fields` picks entries of `OBSERVATION_FIELDS`, in its order or another (a policy file
    names the entries it was trained on); None: all.
    """

    def __init__(self, slo: SLO, fields: Sequence[str] | None = None) -> None:
        self.fields = checked_fields(fields)
        index = tuple(OBSERVATION_FIELDS.index(f) for f in self.fields)
        self._pick = None if index == tuple(range(len(OBSERVATION_FIELDS))) else index
        self.set_slo(slo)
        self._kv_prev: float | None = None
        names = ["requests", "tokens", "context_tokens", "log_rate", "log2_limit"]
        names += ["log2_budget", "log2_kv_tokens", "clip"]
        self._scales = tuple(SCALES[k] for k in names)

    def set_slo(self, slo: SLO) -> None:
        """Scale the entries against `slo`'s targets from now on (unset: `SCALES`' defaults)."""
        self.ttft_s = (slo.ttft_ms / 1e3) if slo.ttft_ms else SCALES["default_ttft_s"]
        self.tpot_s = (slo.tpot_ms / 1e3) if slo.tpot_ms else SCALES["default_tpot_s"]

    def reset(self) -> None:
        self._kv_prev = None

    def __call__(self, t: Telemetry) -> np.ndarray:
        # a decision is hot: plain floats, constants unpacked once, clipped only if needed
        R, T, C, log_rate, log2_limit, log2_budget, log2_kv_tokens, clip = self._scales
        ttft_s, tpot_s, log2, log1p = self.ttft_s, self.tpot_s, math.log2, math.log1p
        kv = t.kv_cache_usage
        kv_prev = kv if self._kv_prev is None else self._kv_prev
        self._kv_prev = kv
        prompt_tokens, running = t.interval_prompt_tokens, t.num_requests_running
        tokens = prompt_tokens + t.interval_output_tokens
        prompt_mean, output_mean = t.prompt_mean, t.output_mean
        capacity = t.kv_capacity_tokens
        per_token = t.step_s_per_token
        values = [
            kv,
            kv - kv_prev,
            running / R,
            t.num_requests_waiting / R,
            t.num_decoding / R,
            t.oldest_waiting_age_s / ttft_s,
            t.waiting_prefill_tokens / T,
            log1p(t.arrival_rate_short) / log_rate,
            log1p(t.arrival_rate) / log_rate,
            t.recent_tbt_s / tpot_s,
            t.recent_tbt_p90_s / tpot_s,
            t.recent_ttft_s / ttft_s,
            prompt_tokens / tokens if tokens else 0.0,
            tokens / max(1, t.interval_iterations) / T,
            t.interval_preemptions / max(1, running),
            log2(max(1, t.max_num_seqs)) / log2_limit,
            log2(max(1, t.max_num_batched_tokens)) / log2_budget,
            capacity / max(1.0, prompt_mean + output_mean) / R,
            prompt_mean / C,
            output_mean / C,
            log2(max(1, capacity)) / log2_kv_tokens,
            t.step_base_s / tpot_s,
            log2(tpot_s / per_token) / log2_budget if per_token > 0 else 0.0,
        ]
        if self._pick is not None:
            values = [values[i] for i in self._pick]
        total = sum(values)  # NaN if any value is NaN
        if total != total or min(values) < -clip or max(values) > clip:
            values = [0.0 if v != v else min(clip, max(-clip, v)) for v in values]
        return np.array(values, dtype=np.float32)
