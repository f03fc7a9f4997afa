"""Algorithm 1 of Pang et al.: memory-constrained dynamic batching.

With b requests in the system holding S = sum_i (l_in,i + l_out,i) tokens, the central
limit theorem gives S ~ Normal(b * mu, b * sigma^2) with mu = E[l_in] + E[l_out] and
sigma^2 = Var(l_in) + Var(l_out). Requiring P(S > n) <= eps_M, n the KV capacity in
tokens, gives b * mu + theta * sqrt(b) * sigma <= n with theta = Phi^-1(1 - eps_M).

- ``bound="linear"`` (the paper's rule): b <= (n - L0) / mu, with the safety buffer
  L0 = theta * sigma_S = theta * sqrt(b_ref) * sigma recomputed every `refresh`
  decisions at b_ref = the previous decision (a fixed-point iteration of the exact bound);
- ``bound="exact"``: sqrt(b) <= (sqrt((theta sigma)^2 + 4 mu n) - theta sigma) / (2 mu).

Blocks: n = KV blocks x block size. A request holds ceil(len / block_size) blocks, so it
wastes (block_size - 1) / 2 tokens in expectation; ``blocks=True`` (the default) adds that
to mu, which is how the token rule is applied to vLLM's paged cache.

Deviations from the paper, and why:
- Start-up: the first L0 is taken at b_ref = the exact bound, the fixed point of the
  linearisation (the paper computes L0 offline). Starting from b_ref = B_max gave a buffer
  larger than a small KV cache, a limit of 1 until the first refresh, and a slow
  oscillation towards the fixed point after it.
- E[l_out]: the mean over finished requests alone is biased short (short requests finish
  first: 80 tokens against a true 205 after 20 finishes on Azure conversation). The
  estimate here also counts the running requests, as censored observations: each finished
  request counts its length, each running one what it has generated so far plus the mean
  remaining length of a request met at a random point of its life, m (1 + cv^2) / 2 (cv
  the finished requests' coefficient of variation, capped at 1). Solving
  m = (generated tokens + N_run m (1 + cv^2) / 2) / (N_finished + N_run) gives
  m = generated / (N_finished + N_run (1 - cv^2) / 2): for memoryless lengths (cv = 1)
  the geometric maximum-likelihood mean, generated tokens per finished request. Both sums
  come from the telemetry's per-interval counts, so no engine has to report per-request
  state. Var(l_out) keeps the finished requests' cv.
"""

from __future__ import annotations

import math
from statistics import NormalDist

from batchpilot.baselines.checks import MAX_LIMIT, require
from batchpilot.envs.engine import Engine
from batchpilot.envs.telemetry import LENGTH_PRIOR, Limits, Telemetry
from batchpilot.envs.traces import MAX_TOKENS

BOUNDS = ("linear", "exact")


MIN_EPS = 1e-15
"""Smallest eps_M taken: below about 1e-16, 1 - eps rounds to 1 and Phi^-1 is infinite."""


def safety_factor(eps: float) -> float:
    """theta = Phi^-1(1 - eps_M)."""
    return NormalDist().inv_cdf(1.0 - eps)


def exact_bound(n: float, mu: float, sigma: float, theta: float) -> float:
    """Largest real b with b * mu + theta * sqrt(b) * sigma <= n (0 if none)."""
    if n <= 0:
        return 0.0
    root = (math.sqrt((theta * sigma) ** 2 + 4.0 * mu * n) - theta * sigma) / (2.0 * mu)
    return root * root


def linear_bound(n: float, mu: float, buffer: float) -> float:
    """The paper's linearised bound (n - L0) / mu (0 if the buffer exceeds n)."""
    return max(0.0, (n - buffer) / mu)


class MemoryAwareController:
    """Algorithm 1: the largest limit whose KV demand overflows with probability <= eps.

    Parameters (paper symbols):
        eps: eps_M, the tolerated probability of overflowing the KV cache. Default 0.05.
        bound: ``linear`` (the paper's rule with buffer L0) or ``exact`` (the quadratic).
        refresh: decisions between recomputations of L0. Default 100.
        min_samples: finished requests needed before the output-length estimate (see
            the module notes) replaces the prior. Default 20.
        prior_output_mean, prior_output_std: the prior for l_out (tokens). Default 256, 256.
        blocks: add the expected block-rounding waste (block_size - 1) / 2 to mu.
        b_min, b_max: B_min and B_max; b_max defaults to the engine's cap.

    The limit is recomputed only when prefills wait and decodes run (the first decision
    always computes it); it is then clamped to [max(N_decode, B_min), B_max].
    """

    def __init__(
        self,
        eps: float = 0.05,
        *,
        bound: str = "linear",
        refresh: int = 100,
        min_samples: int = 20,
        prior_output_mean: float = LENGTH_PRIOR[2],
        prior_output_std: float = LENGTH_PRIOR[3] ** 0.5,
        blocks: bool = True,
        b_min: int = 1,
        b_max: int | None = None,
    ) -> None:
        if not MIN_EPS <= eps < 0.5:
            raise ValueError(f"eps must be in [{MIN_EPS:g}, 0.5), got {eps}")
        if bound not in BOUNDS:
            raise ValueError(f"bound must be one of {', '.join(BOUNDS)}, got {bound!r}")
        require(refresh >= 1, "refresh", refresh, ">= 1")
        require(min_samples >= 0, "min_samples", min_samples, ">= 0")
        require(1 <= b_min <= MAX_LIMIT, "b_min", b_min, f"in [1, {MAX_LIMIT:,}]")
        require(b_max is None or b_max <= MAX_LIMIT, "b_max", b_max, f"at most {MAX_LIMIT:,}")
        # a request's length is at most MAX_TOKENS: a prior past it squared overflows
        require(
            0 < prior_output_mean <= MAX_TOKENS,
            "prior_output_mean",
            prior_output_mean,
            f"in (0, {MAX_TOKENS}] tokens",
        )
        require(
            0 <= prior_output_std <= MAX_TOKENS,
            "prior_output_std",
            prior_output_std,
            f"in [0, {MAX_TOKENS}] tokens",
        )
        if b_max is not None and b_max < b_min:
            raise ValueError(f"b_max {b_max} is below b_min {b_min}")
        self.eps, self.bound, self.refresh, self.min_samples = eps, bound, refresh, min_samples
        self.prior = (prior_output_mean, prior_output_std**2)
        self.blocks = blocks
        self.b_min, self.b_max_arg = b_min, b_max
        self.theta = safety_factor(eps)
        self.name = "alg1"
        self.b_max = b_max or b_min
        self.buffer = 0.0
        self._decisions = 0
        self._limit = self.b_max
        self._generated = 0
        self._finished = 0

    def reset(self, engine: Engine) -> None:
        """Take B_max from the engine's cap unless given; forget the previous run."""
        self.b_max = min(self.b_max_arg or engine.max_num_seqs, engine.max_num_seqs)
        self.b_min = min(self.b_min, self.b_max)
        self.buffer = 0.0
        self._decisions = 0
        self._limit = self.b_max
        self._generated = 0
        self._finished = 0

    def output_moments(self, t: Telemetry) -> tuple[float, float]:
        """(E, Var) of l_out with the running requests as censored observations (see the
        module notes) once `min_samples` requests have finished under this controller;
        before that the telemetry's
        finished-request estimates if they rest on `min_samples` (a controller attached
        to a running engine), else the prior."""
        enough = max(self.min_samples, 1)
        if self._finished >= enough:
            cv2 = min(t.output_var / max(t.output_mean, 1.0) ** 2, 1.0)
            censored = t.num_requests_running * (1.0 - cv2) / 2.0
            mean = self._generated / (self._finished + censored)
            return mean, cv2 * mean * mean
        if t.num_output_samples >= enough:
            return t.output_mean, t.output_var
        return self.prior

    def moments(self, t: Telemetry) -> tuple[float, float]:
        """(mu, sigma^2) per request in tokens: E and Var of l_in + l_out (plus block waste)."""
        out_mean, out_var = self.output_moments(t)
        mu = t.prompt_mean + out_mean
        if self.blocks:
            mu += (t.block_size - 1) / 2.0
        return max(mu, 1.0), t.prompt_var + out_var

    def memory_bound(self, t: Telemetry) -> int:
        """floor of the bound on b at the current estimates and buffer L0."""
        mu, var = self.moments(t)
        n = t.kv_capacity_tokens
        if self.bound == "exact":
            return math.floor(exact_bound(n, mu, math.sqrt(var), self.theta))
        return math.floor(linear_bound(n, mu, self.buffer))

    def decide(self, telemetry: Telemetry) -> Limits:
        self._generated += telemetry.interval_output_tokens
        self._finished += telemetry.interval_finished
        if self._decisions % self.refresh == 0:  # L0 = theta * sigma_S at b_ref
            mu, var = self.moments(telemetry)
            b_ref = self._limit
            if self._decisions == 0:  # the fixed point: where the linear and exact bounds meet
                b_ref = exact_bound(telemetry.kv_capacity_tokens, mu, math.sqrt(var), self.theta)
            self.buffer = self.theta * math.sqrt(b_ref * var)
        b = self._limit
        if self._decisions == 0 or (
            telemetry.num_requests_waiting > 0 and telemetry.num_decoding > 0
        ):
            b = self.memory_bound(telemetry)
        self._decisions += 1
        self._limit = min(max(b, telemetry.num_decoding, self.b_min), self.b_max)
        return Limits(self._limit)
