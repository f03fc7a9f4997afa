"""What an engine reports each control interval, and the limits a controller sets.

Field names follow vLLM: `num_requests_running` is `vllm:num_requests_running`,
`kv_cache_usage` is `vllm:kv_cache_usage_perc` (as a fraction), and so on.
"""

from __future__ import annotations

import copy
import math
from collections import deque
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchpilot.envs.metrics import SLO

LENGTH_PRIOR = (512.0, 512.0**2, 256.0, 256.0**2)
"""(prompt mean, prompt variance, output mean, output variance) an engine's workload
estimates start from, until requests arrive or finish."""


class TelemetryError(ValueError):
    """Telemetry with a missing, non-finite or out-of-range value."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Batching limits for the next engine iterations.

    `max_num_seqs` caps requests admitted to RUNNING (vLLM's ``max_num_seqs``);
    `max_num_batched_tokens` is the per-step token budget (chunk size); None keeps the
    engine's configured budget.
    """

    max_num_seqs: int
    max_num_batched_tokens: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.max_num_seqs, int) or self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be an int >= 1, got {self.max_num_seqs!r}")
        if self.max_num_batched_tokens is not None and (
            not isinstance(self.max_num_batched_tokens, int) or self.max_num_batched_tokens < 1
        ):
            raise ValueError(
                f"max_num_batched_tokens must be an int >= 1 or None, "
                f"got {self.max_num_batched_tokens!r}"
            )


@dataclass(frozen=True, slots=True)
class Telemetry:
    """Engine state at the end of a control interval, plus the interval's aggregates."""

    # clock
    time_s: float
    """Engine clock (s since the workload's start)."""
    iteration: int
    """Engine iterations (scheduler steps) so far."""
    # KV cache (vllm:kv_cache_usage_perc, block pool)
    kv_cache_usage: float
    num_free_blocks: int
    num_total_blocks: int
    block_size: int
    # queues (vllm:num_requests_running / _waiting)
    num_requests_running: int
    num_requests_waiting: int
    num_decoding: int
    """Running requests whose prefill is complete."""
    # last iteration
    step_prefill_tokens: int
    step_decode_tokens: int
    step_time_s: float
    # the control interval just ended
    interval_iterations: int
    interval_s: float
    interval_preemptions: int
    interval_prompt_tokens: int
    interval_output_tokens: int
    interval_finished: int
    interval_good_output_tokens: int
    """Output tokens of requests that finished in the interval meeting the SLOs."""
    interval_kv_usage_mean: float
    """Time-weighted mean KV usage over the interval."""
    recent_tbt_s: float
    """Mean time between tokens (decode step time) over the interval; last value if none."""
    recent_decode_batch: float
    """Mean decode requests per step over the interval; last value if none."""
    recent_ttft_s: float
    """Mean TTFT of first tokens produced in the interval; last value if none."""
    # limits in effect
    max_num_seqs: int
    max_num_batched_tokens: int
    # workload estimates
    prompt_mean: float
    prompt_var: float
    output_mean: float
    output_var: float
    num_output_samples: int
    """Finished requests behind `output_mean`/`output_var` (0: the prior is used)."""
    arrival_rate: float
    """Arrivals per second over the last `ArrivalRate.window_s` of engine time."""
    # what a learned controller sees (defaults: an engine that does not report them)
    arrival_rate_short: float = 0.0
    """Arrivals per second over the last `ArrivalRate.short_window_s` of engine time."""
    oldest_waiting_age_s: float = 0.0
    """Age of the request at the head of the waiting queue (0 if none waits)."""
    waiting_prefill_tokens: int = 0
    """Tokens the waiting requests still have to prefill (prompts, and recompute)."""
    recent_tbt_p90_s: float = 0.0
    """90th percentile of the last `StepTimes.maxlen` decode-step times."""
    inflight_on_track_tokens: int = 0
    """Output tokens generated so far by unfinished requests still on track for the SLO
    (`on_track`): a gauge whose change, plus `interval_good_output_tokens`, is the
    learned controller's dense goodput credit."""
    interval_recomputed_tokens: int = 0
    """Tokens whose KV was dropped by preemption in the interval (to be computed again)."""
    interval_bad_output_tokens: int = 0
    """Output tokens of requests that finished in the interval missing an SLO."""
    inflight_off_track_output_tokens: int = 0
    """Full output lengths (``max_tokens``) of unfinished requests no longer on track for the
    SLO (`on_track`), queued ones past their TTFT deadline included: a gauge whose change,
    plus `interval_bad_output_tokens`, is the output lost to the SLO in the interval."""
    step_base_s: float = 0.0
    """Measured step time at no tokens: the intercept of `StepCost`'s line (0 before any
    step)."""
    step_s_per_token: float = 0.0
    """Measured seconds per scheduled token: the slope of `StepCost`'s line (0 before any
    step). With `step_base_s`, the engine's speed: a fast GPU and a light load look alike
    in step times, not in this line."""

    @property
    def kv_capacity_tokens(self) -> int:
        """KV cache capacity in tokens (blocks x block size)."""
        return self.num_total_blocks * self.block_size

    def validate(self) -> Telemetry:
        """Raise `TelemetryError` naming the first non-finite or negative field."""
        for f in fields(self):
            value = getattr(self, f.name)
            if value is None or not math.isfinite(value) or value < 0:
                raise TelemetryError(f"telemetry field {f.name} is {value!r}")
        if not 0.0 <= self.kv_cache_usage <= 1.0 + 1e-9:
            raise TelemetryError(f"telemetry field kv_cache_usage is {self.kv_cache_usage!r}")
        return self


@dataclass(slots=True)
class IntervalTotals:
    """An engine's running totals over one control interval (both engines keep one)."""

    start_s: float
    iterations: int = 0
    preemptions: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    finished: int = 0
    good_tokens: int = 0
    bad_tokens: int = 0
    decode_steps: int = 0
    decode_seqs: int = 0
    decode_time: float = 0.0
    kv_time: float = 0.0
    """KV usage integrated over the interval (fraction x seconds)."""
    ttft_n: int = 0
    ttft_sum: float = 0.0
    recomputed_tokens: int = 0

    def recent(self, last: tuple[float, float, float]) -> tuple[float, float, float]:
        """(mean TBT, mean decode batch, mean TTFT) over the interval; `last`'s where none."""
        tbt, batch, ttft = last
        if self.decode_steps:
            tbt = self.decode_time / self.decode_steps
            batch = self.decode_seqs / self.decode_steps
        if self.ttft_n:
            ttft = self.ttft_sum / self.ttft_n
        return tbt, batch, ttft

    def telemetry_fields(self, now: float, kv_usage: float) -> dict[str, float | int]:
        """The ``interval_*`` fields of `Telemetry` for an interval ending at `now`."""
        span = now - self.start_s
        return {
            "interval_iterations": self.iterations,
            "interval_s": span,
            "interval_preemptions": self.preemptions,
            "interval_prompt_tokens": self.prompt_tokens,
            "interval_output_tokens": self.output_tokens,
            "interval_finished": self.finished,
            "interval_good_output_tokens": self.good_tokens,
            "interval_kv_usage_mean": self.kv_time / span if span > 0 else kv_usage,
            "interval_recomputed_tokens": self.recomputed_tokens,
            "interval_bad_output_tokens": self.bad_tokens,
        }


class RunningStats:
    """Welford running mean and variance, starting from a prior until samples arrive."""

    def __init__(self, prior_mean: float, prior_var: float) -> None:
        self.prior_mean, self.prior_var = prior_mean, prior_var
        self.n = 0
        self._mean = 0.0
        self._m2 = 0.0

    def add(self, x: float) -> None:
        self.n += 1
        delta = x - self._mean
        self._mean += delta / self.n
        self._m2 += delta * (x - self._mean)

    @property
    def mean(self) -> float:
        return self._mean if self.n else self.prior_mean

    @property
    def var(self) -> float:
        return self._m2 / (self.n - 1) if self.n > 1 else self.prior_var


class ArrivalRate:
    """Arrival rate over a sliding window of engine time (at least `min_span_s` long, so
    a burst at start-up reads as a count per second, not a spike over microseconds)."""

    window_s = 30.0
    short_window_s = 5.0
    min_span_s = 1.0

    def __init__(self) -> None:
        self._times: deque[float] = deque()
        self._short: deque[float] = deque()  # the last `short_window_s` of them

    def add(self, t: float) -> None:
        """An arrival at `t`; arrivals past the windows are dropped here too, so memory stays
        bounded where no one asks for the rate (a server without a controller)."""
        self._times.append(t)
        while self._times[0] < t - self.window_s:
            self._times.popleft()
        self._short.append(t)
        while self._short[0] < t - self.short_window_s:
            self._short.popleft()

    def copy(self) -> ArrivalRate:
        other = copy.copy(self)
        other._times = self._times.copy()
        other._short = self._short.copy()
        return other

    def rate(self, now: float) -> float:
        while self._times and self._times[0] < now - self.window_s:
            self._times.popleft()
        return len(self._times) / min(self.window_s, max(now, self.min_span_s))

    def short_rate(self, now: float) -> float:
        """Arrivals per second over the last `short_window_s`."""
        while self._short and self._short[0] < now - self.short_window_s:
            self._short.popleft()
        return len(self._short) / min(self.short_window_s, max(now, self.min_span_s))


class StepTimes:
    """The last `maxlen` decode-step times, for TBT quantiles."""

    maxlen = 64

    def __init__(self) -> None:
        self._times: deque[float] = deque(maxlen=self.maxlen)

    def add(self, seconds: float) -> None:
        self._times.append(seconds)

    def copy(self) -> StepTimes:
        other = copy.copy(self)
        other._times = self._times.copy()
        return other

    def extend(self, seconds: list[float]) -> None:
        self._times.extend(seconds[-self.maxlen :])

    def p90(self) -> float:
        if not self._times:
            return 0.0
        ordered = sorted(self._times)
        return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


class StepCost:
    """Step time against tokens scheduled per step, as a line fitted by exponentially
    weighted least squares over recent steps (each step's weight falls by `decay` a step).

    Where the tokens per step have not varied enough to fit a slope (`min_spread`), or the
    fit is not a rising line through positive times, the line is the mean cost per token
    through the origin."""

    decay = 1.0 - 1.0 / 512
    min_spread = 0.05
    """Least standard deviation of tokens per step, as a fraction of their mean, to fit."""

    def __init__(self) -> None:
        self.w = self.x = self.y = self.xx = self.xy = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        d = self.decay
        self.w = d * self.w + 1.0
        self.x = d * self.x + tokens
        self.y = d * self.y + seconds
        self.xx = d * self.xx + tokens * tokens
        self.xy = d * self.xy + tokens * seconds

    def add_steps(self, tokens: int, seconds: list[float]) -> None:
        """`add` each of `seconds` in turn with the same `tokens` (the same figures)."""
        d = self.decay
        w, x, y, xx, xy = self.w, self.x, self.y, self.xx, self.xy
        sq = tokens * tokens
        for s in seconds:
            w = d * w + 1.0
            x = d * x + tokens
            y = d * y + s
            xx = d * xx + sq
            xy = d * xy + tokens * s
        self.w, self.x, self.y, self.xx, self.xy = w, x, y, xx, xy

    def line(self) -> tuple[float, float]:
        """(seconds at no tokens, seconds per token); (0, 0) before any step with tokens."""
        w, x = self.w, self.x
        if x <= 0.0:
            return 0.0, 0.0
        mx, my = x / w, self.y / w
        var = self.xx / w - mx * mx
        if var > (self.min_spread * mx) ** 2:
            slope = (self.xy / w - mx * my) / var
            base = my - slope * mx
            if slope > 0.0 and base >= 0.0:
                return base, slope
        return 0.0, my / mx


def on_track(
    slo: SLO, now: float, arrival: float, first_token: float, last_token: float, generated: int
) -> bool:
    """Whether an unfinished request can still meet `slo` as far as its latencies so far
    show: TTFT met (or its deadline not passed yet), mean TPOT so far within target,
    end-to-end deadline not passed."""
    if slo.ttft_ms is not None:
        ttft = (first_token if first_token >= 0 else now) - arrival
        if ttft > slo.ttft_ms / 1e3:  # as `SLO.met`, to the bit
            return False
    if (
        slo.tpot_ms is not None
        and generated > 1
        and (last_token - first_token) / (generated - 1) > slo.tpot_ms / 1e3
    ):
        return False
    return slo.e2el_ms is None or now - arrival <= slo.e2el_ms / 1e3


def first_token_limit_ms(slo: SLO) -> float:
    """The age (ms) past which a request with no first token yet is off track (`on_track`):
    the tighter of the TTFT and end-to-end targets; infinite if `slo` sets neither."""
    limits = [v for v in (slo.ttft_ms, slo.e2el_ms) if v is not None]
    return min(limits) if limits else math.inf


class LapsedFirstTokens:
    """Requests with no first token yet, and the summed weight of those `on_track` finds off
    track: past `first_token_limit_ms` of age. Incremental: a report costs the requests
    that lapsed since the last one, not the queue's length.

    Requests are added in the order of their arrival times (an engine clock's). Memory is
    bounded by the requests held plus those that left within the last limit's span (a
    removed one is forgotten lazily; the order is compacted when it holds twice as many).
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every request."""
        self._held: dict[str, tuple[float, int]] = {}  # key -> (arrival, weight)
        self._order: deque[tuple[float, str]] = deque()  # not lapsed yet (lazily)
        self._lapsed: set[str] = set()
        self._total = 0
        self._limit_ms = math.inf

    def __len__(self) -> int:
        return len(self._held)

    def add(self, key: str, arrival_s: float, weight: int) -> None:
        """A request with no first token, arrived at `arrival_s`, with `weight` at stake."""
        self.discard(key)
        self._held[key] = (arrival_s, weight)
        if self._limit_ms < math.inf:
            order = self._order
            if order and order[-1][1] == key:  # its entry just made: an earlier arrival time
                order.pop()  # given after it (`StepTracker.set_arrival`), kept in order
            order.append((arrival_s, key))
            if len(self._order) > 2 * len(self._held) + 64:
                self._reorder()

    def discard(self, key: str) -> None:
        """The request got its first token or left (no-op if not held)."""
        held = self._held.pop(key, None)
        if held is not None and key in self._lapsed:
            self._lapsed.remove(key)
            self._total -= held[1]

    def _reorder(self) -> None:
        """The order again from the held requests not lapsed (added in arrival order)."""
        if self._limit_ms == math.inf:
            self._order = deque()
        else:
            lapsed = self._lapsed
            self._order = deque((a, k) for k, (a, _) in self._held.items() if k not in lapsed)

    def lapsed_weight(self, now: float, slo: SLO) -> int:
        """Summed weight of the held requests off track at `now` under `slo`."""
        limit = first_token_limit_ms(slo)
        if limit != self._limit_ms:  # a new SLO: none lapsed, all held in order again
            self._limit_ms = limit
            self._lapsed.clear()
            self._total = 0
            self._reorder()
        order, held, lapsed = self._order, self._held, self._lapsed
        while order and now - order[0][0] > limit / 1e3:  # `on_track`'s test, to the bit
            arrival, key = order.popleft()
            entry = held.get(key)
            if entry is not None and entry[0] == arrival and key not in lapsed:
                lapsed.add(key)
                self._total += entry[1]
        return self._total


class TelemetryAccumulator:
    """What an engine keeps between two telemetry reports, and the one place `Telemetry`
    is assembled: both engines (the simulator and the vLLM tracker) feed one and call
    `report` with their scheduler's state.

    `interval` holds the interval's totals (the engine adds to it as steps run);
    `last_step` is the latest step's (prefill tokens, decode requests, seconds);
    `step_times` the recent decode-step times; `step_cost` the line of step time on
    tokens per step (the engine adds each step that scheduled tokens).
    """

    def __init__(self, length_prior: tuple[float, float, float, float] = LENGTH_PRIOR) -> None:
        pm, pv, om, ov = length_prior
        self.prompt_stats = RunningStats(pm, pv)
        self.output_stats = RunningStats(om, ov)
        self.arrivals = ArrivalRate()
        self.step_times = StepTimes()
        self.step_cost = StepCost()
        self.interval = IntervalTotals(0.0)
        self.last_step: tuple[int, int, float] = (0, 0, 0.0)
        self.recent = (0.0, 0.0, 0.0)

    def arrived(self, t: float, prompt_tokens: int) -> None:
        """A request arrived at engine time `t`."""
        self.prompt_stats.add(prompt_tokens)
        self.arrivals.add(t)

    def finished(self, output_tokens: int, good: bool) -> None:
        """A request finished after `output_tokens` tokens, meeting its SLOs if `good`."""
        self.output_stats.add(output_tokens)
        self.interval.finished += 1
        if good:
            self.interval.good_tokens += output_tokens
        else:
            self.interval.bad_tokens += output_tokens

    def report(self, now: float, iteration: int, **state: float) -> Telemetry:
        """`Telemetry` at engine time `now`; starts a new interval.

        `state` holds the fields only the engine's scheduler knows: KV usage and blocks,
        block size, running / waiting / decoding counts, the limits in force, the waiting
        queue's oldest age and prefill tokens, the on-track and off-track in-flight tokens.
        """
        iv = self.interval
        tbt, batch, ttft = self.recent = iv.recent(self.recent)
        prefill, decode, step_time = self.last_step
        step_base, step_per_token = self.step_cost.line()
        telemetry = Telemetry(
            time_s=now,
            iteration=iteration,
            step_prefill_tokens=prefill,
            step_decode_tokens=decode,
            step_time_s=step_time,
            **iv.telemetry_fields(now, float(state["kv_cache_usage"])),
            recent_tbt_s=tbt,
            recent_decode_batch=batch,
            recent_ttft_s=ttft,
            prompt_mean=self.prompt_stats.mean,
            prompt_var=self.prompt_stats.var,
            output_mean=self.output_stats.mean,
            output_var=self.output_stats.var,
            num_output_samples=self.output_stats.n,
            arrival_rate=self.arrivals.rate(now),
            arrival_rate_short=self.arrivals.short_rate(now),
            recent_tbt_p90_s=self.step_times.p90(),
            step_base_s=step_base,
            step_s_per_token=step_per_token,
            **state,  # type: ignore[arg-type]
        )
        self.interval = IntervalTotals(now)
        return telemetry

    def copy(self) -> TelemetryAccumulator:
        """An independent copy (for `SimEngine.fork`)."""
        other = copy.copy(self)
        other.prompt_stats = copy.copy(self.prompt_stats)
        other.output_stats = copy.copy(self.output_stats)
        other.arrivals = self.arrivals.copy()
        other.step_times = self.step_times.copy()
        other.step_cost = copy.copy(self.step_cost)
        other.interval = copy.copy(self.interval)
        return other
