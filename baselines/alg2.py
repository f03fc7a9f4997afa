"""Algorithm 2 of Pang et al.: SLA-constrained dynamic batching.

A noisy binary search between a moving lower and upper bound, driven by the recent
average decode latency tau (time between tokens) and the recent average decode batch
b_bar. OCR readings (see the design notes): line 6 is b_high <- max(b_bar, b_low + alpha)
and line 9 is b_low <- min(b_bar, b_high - alpha). Every bound is also kept inside
[B_min, B_max] (the paper states the invariant B_min <= b_low <= b_high <= B_max but its
lines 6 and 9 can leave it; b_bar is clamped to the range first).

The same search can set the per-step token budget (vLLM's ``max_num_batched_tokens``,
the chunk size when prefill and decode share a step): there b_bar is the recent average
number of tokens per step.

Deviations from the paper, and why:
- D_SLA defaults to the run's TPOT target (`engine.slo.tpot_ms`, read at `reset`), so the
  search aims at the objective the run is scored on; an explicit ``sla_ms`` wins, and a run
  with no TPOT target uses `DEFAULT_SLO`'s (50 ms, the paper's value).
- "Recent" is a window of engine time (``window_ms``), not one control interval: with the
  controller consulted every iteration, one interval is one decode step, and the search
  would chase the noise of single steps.
"""

from __future__ import annotations

from collections import deque

from batchpilot.baselines.checks import MAX_LIMIT, require
from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import DEFAULT_SLO, SLO_BOUNDS_MS
from batchpilot.envs.telemetry import Limits, Telemetry

EPS_MS = 10.0
"""eps_D's default, the tolerance band around the target (ms)."""
CHUNK_DEFAULTS = {"chunk_min": 256, "chunk_alpha": 512, "chunk_delta": 64}
"""The token-budget search's keywords (read with ``chunk=1`` alone) and their defaults."""


class RecentMeans:
    """Means of per-interval values over the last `window_s` of engine time, each interval
    weighted by its engine iterations; the latest interval always counts."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._rows: deque[tuple[float, float, tuple[float, ...]]] = deque()
        self._weight = 0.0
        self._sums: list[float] = []

    def add(self, time_s: float, weight: float, *values: float) -> tuple[float, ...]:
        """Add an interval ending at `time_s`; return the window's weighted means."""
        if not self._sums:
            self._sums = [0.0] * len(values)
        self._rows.append((time_s, weight, values))
        self._weight += weight
        self._sums = [s + weight * v for s, v in zip(self._sums, values, strict=True)]
        while len(self._rows) > 1 and self._rows[0][0] <= time_s - self.window_s:
            _, w, old = self._rows.popleft()
            self._weight -= w
            self._sums = [s - w * v for s, v in zip(self._sums, old, strict=True)]
        if len(self._rows) == 1:  # re-anchor: no drift from repeated subtraction
            self._weight, self._sums = weight, [weight * v for v in values]
        return tuple(s / self._weight for s in self._sums)


class SLASearch:
    """The bounds b_low, b_high of Algorithm 2 and its update (lines 3-14)."""

    def __init__(
        self, sla_s: float, eps_s: float, alpha: int, delta: int, lo: int, hi: int
    ) -> None:
        if sla_s <= 0 or eps_s < 0 or eps_s >= sla_s:
            raise ValueError(f"need 0 <= eps_D < D_SLA, got D_SLA={sla_s} s, eps_D={eps_s} s")
        if alpha < 0 or delta < 0:
            raise ValueError(f"alpha and delta must be >= 0, got {alpha}, {delta}")
        if not 1 <= lo <= hi:
            raise ValueError(f"need 1 <= B_min <= B_max, got {lo}, {hi}")
        self.sla_s, self.eps_s, self.alpha, self.delta = sla_s, eps_s, alpha, delta
        self.lo, self.hi = lo, hi
        self.b_low, self.b_high = lo, hi

    def update(self, tau_s: float, b_bar: float) -> int:
        """New bounds from the recent latency and batch; returns floor((b_low + b_high) / 2)."""
        lo, hi, alpha, delta = self.lo, self.hi, self.alpha, self.delta
        bar = min(max(round(b_bar), lo), hi)
        if tau_s > self.sla_s + self.eps_s:  # too slow: pull the upper bound down
            self.b_high = min(max(bar, self.b_low + alpha), hi)
            self.b_low = max(self.b_low - delta, lo)
        elif tau_s < self.sla_s - self.eps_s:  # headroom: push the lower bound up
            self.b_low = max(min(bar, self.b_high - alpha), lo)
            self.b_high = min(self.b_high + delta, hi)
        else:  # inside the band: re-centre on b_bar
            self.b_high = min(bar + alpha // 2, hi)
            self.b_low = max(bar - alpha // 2, lo)
        return (self.b_low + self.b_high) // 2


class SLAController:
    """Algorithm 2: keeps the recent time between tokens within D_SLA +/- eps_D.

    Parameters (paper symbols; third-party defaults, not the paper's values):
        sla_ms: D_SLA, the target time between tokens. Default: the run's TPOT target
            (the engine's ``slo.tpot_ms`` at `reset`), else `DEFAULT_SLO`'s (50 ms).
        eps_ms: eps_D, the tolerance band. Default `EPS_MS` (10 ms).
        window_ms: tau and b_bar are averaged over this much recent engine time (each
            control interval weighted by its iterations). Default 200 ms; 0: the last
            control interval only.
        alpha: the gap kept between b_low and b_high. Default 20.
        delta: the small correction step. Default 5.
        b_min, b_max: B_min and B_max; b_max defaults to the engine's cap.
        chunk: also search the per-step token budget in [chunk_min, the engine's budget]
            with gap `chunk_alpha` and step `chunk_delta` (tokens). Default off.

    The limit is clamped to [N_decode, B_max] (line 15), the token budget to at least
    the limit so that decodes are never cut.
    """

    def __init__(
        self,
        sla_ms: float | None = None,
        *,
        eps_ms: float | None = None,
        window_ms: float = 200.0,
        alpha: int = 20,
        delta: int = 5,
        b_min: int = 1,
        b_max: int | None = None,
        chunk: bool = False,
        chunk_min: int = CHUNK_DEFAULTS["chunk_min"],
        chunk_alpha: int = CHUNK_DEFAULTS["chunk_alpha"],
        chunk_delta: int = CHUNK_DEFAULTS["chunk_delta"],
    ) -> None:
        if b_min < 1 or (b_max is not None and b_max < b_min):
            raise ValueError(f"need 1 <= B_min <= B_max, got b_min={b_min}, b_max={b_max}")
        require(b_min <= MAX_LIMIT, "b_min", b_min, f"at most {MAX_LIMIT:,}")
        require(b_max is None or b_max <= MAX_LIMIT, "b_max", b_max, f"at most {MAX_LIMIT:,}")
        for name, value in (("alpha", alpha), ("delta", delta)):
            require(0 <= value <= MAX_LIMIT, name, value, f"in [0, {MAX_LIMIT:,}]")
        require(1 <= chunk_min <= MAX_LIMIT, "chunk_min", chunk_min, f"in [1, {MAX_LIMIT:,}]")
        for name, value in (("chunk_alpha", chunk_alpha), ("chunk_delta", chunk_delta)):
            require(0 <= value <= MAX_LIMIT, name, value, f"in [0, {MAX_LIMIT:,}]")
        chunking = zip(CHUNK_DEFAULTS.items(), (chunk_min, chunk_alpha, chunk_delta), strict=True)
        given = [name for (name, default), value in chunking if value != default]
        if given and not chunk:
            raise ValueError(
                f"{', '.join(given)}: only the token-budget search reads it (alg2:chunk=1:...)"
            )
        require(window_ms >= 0, "window_ms", window_ms, ">= 0")
        low, high = SLO_BOUNDS_MS
        require(
            sla_ms is None or low <= sla_ms <= high, "sla_ms", sla_ms, f"in [{low:g}, {high:g}] ms"
        )
        default = ", its default" if eps_ms is None else ""
        eps_ms = EPS_MS if eps_ms is None else eps_ms
        require(eps_ms >= 0, "eps_ms", eps_ms, ">= 0")
        if sla_ms is not None and eps_ms >= sla_ms:
            raise ValueError(
                f"eps_ms ({eps_ms:g}{default}) must be below sla_ms ({sla_ms:g}); give a smaller "
                "one (alg2:eps_ms=N)"
            )
        self.sla_ms = sla_ms
        self.window_s = window_ms / 1e3
        sla = DEFAULT_SLO.tpot_ms if sla_ms is None else sla_ms
        self.params = (sla / 1e3, eps_ms / 1e3, alpha, delta)
        self.b_min, self.b_max_arg = b_min, b_max
        self.chunk = chunk
        self.chunk_params = (chunk_min, chunk_alpha, chunk_delta)
        self.name = "alg2"
        self._build(b_max or b_min, chunk_min)  # validates the parameters before any run

    def _build(self, seqs_cap: int, tokens_cap: int) -> None:
        self.recent = RecentMeans(self.window_s)
        hi = min(self.b_max_arg or seqs_cap, seqs_cap)
        self.search = SLASearch(*self.params, min(self.b_min, hi), hi)
        self.chunk_search: SLASearch | None = None
        if self.chunk:
            c_min, c_alpha, c_delta = self.chunk_params
            sla_s, eps_s = self.params[:2]
            self.chunk_search = SLASearch(
                sla_s, eps_s, c_alpha, c_delta, min(c_min, tokens_cap), tokens_cap
            )

    def reset(self, engine: Engine) -> None:
        """Bounds back to [B_min, B_max]; B_max from the engine's cap unless given; D_SLA
        from the run's TPOT target unless ``sla_ms`` was given."""
        if self.sla_ms is None:
            tpot_ms = engine.slo.tpot_ms or DEFAULT_SLO.tpot_ms
            if tpot_ms / 1e3 <= self.params[1]:
                raise ValueError(
                    f"alg2: D_SLA from the run's TPOT target ({tpot_ms:g} ms) must exceed "
                    f"eps_D ({self.params[1] * 1e3:g} ms); give alg2:eps_ms or alg2:sla_ms"
                )
            self.params = (tpot_ms / 1e3, *self.params[1:])
        self._build(engine.max_num_seqs, engine.max_num_batched_tokens)

    @property
    def sla_s(self) -> float:
        """D_SLA in force (s)."""
        return self.search.sla_s

    def decide(self, telemetry: Telemetry) -> Limits:
        steps = max(telemetry.interval_iterations, 1)
        tokens = (telemetry.interval_prompt_tokens + telemetry.interval_output_tokens) / steps
        tau, b_bar, tokens = self.recent.add(
            telemetry.time_s, steps, telemetry.recent_tbt_s, telemetry.recent_decode_batch, tokens
        )
        b = self.search.update(tau, b_bar)
        b = min(max(b, telemetry.num_decoding), self.search.hi)
        if self.chunk_search is None:
            return Limits(b)
        budget = self.chunk_search.update(tau, tokens)  # b_bar: tokens per step
        return Limits(b, max(budget, b))
