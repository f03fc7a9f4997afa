"""Requests and workloads: what arrives at the engine, when, and how long it is."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum
from numbers import Real

import numpy as np


class WorkloadError(ValueError):
    """A workload that cannot be served as given (bad lengths, context overflow, ...)."""


@dataclass(frozen=True, slots=True)
class Request:
    """One inference request: arrival time (s from the workload's start) and token lengths."""

    request_id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int


class OverlongPolicy(StrEnum):
    """What to do with a request whose prompt + output exceeds the model's context."""

    ERROR = "error"
    """Raise a `WorkloadError` naming the first such request (the default)."""
    DROP = "drop"
    """Leave such requests out; the count is reported in `Workload.dropped`."""
    TRUNCATE = "truncate"
    """Cut the prompt from the left, then the output, until it fits; counted in `truncated`."""


DEFAULT_OVERLONG = OverlongPolicy.TRUNCATE
"""The overlong policy wherever none is given (every command, suite and training workload):
the requests cut are counted and reported."""


@dataclass
class Workload:
    """A named, time-ordered list of requests."""

    name: str
    requests: list[Request]
    dropped: int = 0
    truncated: int = 0
    source: str = field(default="")
    skipped_rows: int = 0
    """Bad rows of the trace file left out (``bad_rows="skip"``)."""
    first_skipped: str = ""
    """The first left-out row's error; empty if none."""

    def __post_init__(self) -> None:
        for r in self.requests:
            if r.prompt_tokens < 1 or r.output_tokens < 1:
                raise WorkloadError(
                    f"{self.name}: request {r.request_id} has prompt_tokens={r.prompt_tokens}, "
                    f"output_tokens={r.output_tokens}; both must be >= 1"
                )
            if not np.isfinite(r.arrival_s) or r.arrival_s < 0:
                raise WorkloadError(
                    f"{self.name}: request {r.request_id} has arrival_s={r.arrival_s}; "
                    "must be finite and >= 0"
                )
        self.requests = sorted(self.requests, key=lambda r: r.arrival_s)

    def __len__(self) -> int:
        return len(self.requests)

    def lengths(self) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output lengths as integer arrays."""
        p = np.fromiter((r.prompt_tokens for r in self.requests), dtype=np.int64)
        o = np.fromiter((r.output_tokens for r in self.requests), dtype=np.int64)
        return p, o

    def scaled(
        self, prompt_scale: float = 1.0, output_scale: float = 1.0, max_model_len: int = 0
    ) -> Workload:
        """Every prompt and output length times its factor (rounded, at least 1 token).
        With `max_model_len`, a prompt is cut to leave one token of the context and the
        output to what the context leaves after the prompt; without, `fit_context` is the
        caller's to apply."""
        if prompt_scale == output_scale == 1.0:
            return self
        cap = max_model_len or 1 << 62
        reqs = []
        for r in self.requests:
            prompt = min(max(1, round(r.prompt_tokens * prompt_scale)), cap - 1)
            output = min(max(1, round(r.output_tokens * output_scale)), cap - prompt)
            reqs.append(Request(r.request_id, r.arrival_s, prompt, output))
        return replace(self, requests=reqs)

    def check_fits(self, max_model_len: int, kv_tokens: int | None = None) -> None:
        """Raise `WorkloadError` for the first request longer than the engine's context
        (or, given `kv_tokens`, than its whole KV cache)."""
        for r in self.requests:
            total = r.prompt_tokens + r.output_tokens
            if total > max_model_len:
                raise WorkloadError(
                    f"{self.name}: request {r.request_id} needs {total} tokens, over the "
                    f"engine's max_model_len {max_model_len}; apply an overlong policy"
                )
            if kv_tokens is not None and total > kv_tokens:
                raise WorkloadError(
                    f"{self.name}: request {r.request_id} needs {total} tokens of KV cache, "
                    f"more than the engine's {kv_tokens}"
                )

    def fit_context(self, max_model_len: int, policy: OverlongPolicy | str) -> Workload:
        """Apply `policy` to requests longer than `max_model_len` tokens in total."""
        policy = OverlongPolicy(policy)
        kept: list[Request] = []
        dropped = truncated = 0
        for r in self.requests:
            total = r.prompt_tokens + r.output_tokens
            if total <= max_model_len:
                kept.append(r)
                continue
            if policy is OverlongPolicy.ERROR:
                raise WorkloadError(
                    f"{self.name}: request {r.request_id} needs {total} tokens "
                    f"(prompt {r.prompt_tokens} + output {r.output_tokens}) but the model's "
                    f"context is {max_model_len}; drop or truncate such requests (--overlong, "
                    "a suite's overlong:) or use a profile with a longer context"
                )
            if policy is OverlongPolicy.DROP:
                dropped += 1
                continue
            output = min(r.output_tokens, max_model_len - 1)
            prompt = min(r.prompt_tokens, max_model_len - output)
            kept.append(Request(r.request_id, r.arrival_s, prompt, output))
            truncated += 1
        if dropped and not kept:
            raise WorkloadError(
                f"{self.name}: all {dropped} requests are longer than the model's context of "
                f"{max_model_len} tokens (overlong=drop)"
            )
        counts = {"dropped": self.dropped + dropped, "truncated": self.truncated + truncated}
        return replace(self, requests=kept, **counts)


def scale_range(value: object, what: str) -> tuple[float, float]:
    """`value` as a (lo, hi) range of scale factors, 0 < lo <= hi < inf, else an error
    naming `what`."""
    if not (
        isinstance(value, list | tuple)
        and len(value) == 2
        and all(isinstance(v, Real) and not isinstance(v, bool) for v in value)
    ):
        raise ValueError(f"{what} must be [lo, hi] (two numbers), got {value!r}")
    try:
        lo, hi = float(value[0]), float(value[1])
    except OverflowError:  # an int past the float range
        lo = hi = np.inf
    if not 0 < lo <= hi < np.inf:
        raise ValueError(f"{what} must be 0 < lo <= hi < inf, got {value!r}")
    return lo, hi
