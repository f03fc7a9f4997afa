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
"""

from __future__ import annotations

from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import Limits, Telemetry


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
        sla_ms: D_SLA, the target time between tokens. Default 50 ms.
        eps_ms: eps_D, the tolerance band. Default 10 ms.
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
        sla_ms: float = 50.0,
        *,
        eps_ms: float = 10.0,
        alpha: int = 20,
        delta: int = 5,
        b_min: int = 1,
        b_max: int | None = None,
        chunk: bool = False,
        chunk_min: int = 256,
        chunk_alpha: int = 512,
        chunk_delta: int = 64,
    ) -> None:
        if b_min < 1 or (b_max is not None and b_max < b_min):
            raise ValueError(f"need 1 <= B_min <= B_max, got b_min={b_min}, b_max={b_max}")
        self.params = (sla_ms / 1e3, eps_ms / 1e3, alpha, delta)
        self.b_min, self.b_max_arg = b_min, b_max
        self.chunk = chunk
        self.chunk_params = (chunk_min, chunk_alpha, chunk_delta)
        self.name = "alg2"
        self._build(b_max or b_min, chunk_min)  # validates the parameters before any run

    def _build(self, seqs_cap: int, tokens_cap: int) -> None:
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
        """Bounds back to [B_min, B_max]; B_max from the engine's cap unless given."""
        self._build(engine.max_num_seqs, engine.max_num_batched_tokens)

    def decide(self, telemetry: Telemetry) -> Limits:
        tau = telemetry.recent_tbt_s
        b = self.search.update(tau, telemetry.recent_decode_batch)
        b = min(max(b, telemetry.num_decoding), self.search.hi)
        if self.chunk_search is None:
            return Limits(b)
        steps = max(telemetry.interval_iterations, 1)  # tokens per step, approximately
        tokens = (telemetry.interval_prompt_tokens + telemetry.interval_output_tokens) / steps
        budget = self.chunk_search.update(tau, tokens)
        return Limits(b, max(budget, b))
