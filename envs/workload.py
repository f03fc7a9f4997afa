"""Requests and workloads: what arrives at the engine, when, and how long it is."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from numbers import Real
from typing import overload

import numpy as np

from batchpilot.envs.plain_numbers import is_number


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
    """Raise a `WorkloadError` naming the first such request."""
    DROP = "drop"
    """Leave such requests out; the count is reported in `Workload.dropped`."""
    TRUNCATE = "truncate"
    """Cut the prompt from the left, then the output, until it fits; counted in `truncated`."""


DEFAULT_OVERLONG = OverlongPolicy.TRUNCATE
"""The overlong policy wherever none is given (every command, suite and training workload):
the requests cut are counted and reported."""


class Requests(Sequence[Request]):
    """A workload's requests, read-only, each made from the workload's columns when it is
    read: a workload holds 32 bytes a request, not a Python object each."""

    __slots__ = ("_arrival", "_ids", "_output", "_prompt")

    def __init__(
        self, ids: np.ndarray, arrival_s: np.ndarray, prompt: np.ndarray, output: np.ndarray
    ) -> None:
        self._ids, self._arrival, self._prompt, self._output = ids, arrival_s, prompt, output

    def __len__(self) -> int:
        return len(self._arrival)

    @overload
    def __getitem__(self, index: int) -> Request: ...

    @overload
    def __getitem__(self, index: slice) -> list[Request]: ...

    def __getitem__(self, index: int | slice) -> Request | list[Request]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        return Request(
            str(self._ids[index]),
            float(self._arrival[index]),
            int(self._prompt[index]),
            int(self._output[index]),
        )

    def __iter__(self) -> Iterator[Request]:
        return (self[i] for i in range(len(self)))


MAX_COUNT = 2**61
"""The largest token count a column may hold: a prompt and its output sum exactly in int64."""


def _frozen(array: np.ndarray) -> np.ndarray:
    """`array` read-only: a copy if it is writable (the caller may hold it), else itself."""
    if array.flags.writeable:
        array = array.copy()
        array.flags.writeable = False
    return array


def _column(workload: str, name: str, values: object, n: int | None, whole: bool) -> np.ndarray:
    """`values` as a read-only column, `n` long if given: token counts (int64) if `whole`,
    else times (float64); a `WorkloadError` naming `workload` and the column if they are not
    one number a request."""
    try:
        raw = np.asarray(values)
    except ValueError as e:  # a ragged nesting
        raise WorkloadError(f"{workload}: {name} is not one value a request ({e})") from None
    if raw.ndim != 1 or (n is not None and len(raw) != n):
        want = "" if n is None else f" ({n} requests)"
        raise WorkloadError(
            f"{workload}: {name} must be one value a request{want}, got shape {raw.shape}"
        )
    if raw.dtype.kind not in "iuf":
        raise WorkloadError(f"{workload}: {name} must be numbers, got {raw.dtype} values")
    if not whole:
        return _frozen(raw.astype(np.float64, copy=False))
    if raw.dtype.kind == "f" and len(bad := np.flatnonzero(raw != np.round(raw))):
        i = bad[0]  # NaN is never equal to itself; inf is caught below
        raise WorkloadError(f"{workload}: {name}[{i}] is {raw[i]}; token counts are whole numbers")
    if (np.abs(raw) > MAX_COUNT).any():
        raise WorkloadError(f"{workload}: {name} holds counts past {MAX_COUNT:,}")
    return _frozen(raw.astype(np.int64, copy=False))


@dataclass(eq=False)
class Workload:
    """A named, time-ordered set of requests, held as columns (one row a request)."""

    name: str
    arrival_s: np.ndarray
    """Arrival times, s from the workload's start (float)."""
    prompt_tokens: np.ndarray
    """Prompt lengths (int64, read-only, as every column)."""
    output_tokens: np.ndarray
    """Output lengths (int64)."""
    request_ids: np.ndarray | None = None
    """Each request's id (ints or strings); by default its row in the order given."""
    dropped: int = 0
    truncated: int = 0
    source: str = field(default="")
    skipped_rows: int = 0
    """Bad rows of the trace file left out (``bad_rows="skip"``)."""
    first_skipped: str = ""
    """The first left-out row's error; empty if none."""

    def __post_init__(self) -> None:
        arrival = _column(self.name, "arrival_s", self.arrival_s, None, whole=False)
        n = len(arrival)
        prompt = _column(self.name, "prompt_tokens", self.prompt_tokens, n, whole=True)
        output = _column(self.name, "output_tokens", self.output_tokens, n, whole=True)
        ids = np.arange(n) if self.request_ids is None else np.asarray(self.request_ids)
        if ids.shape != (n,):
            raise WorkloadError(
                f"{self.name}: request_ids must be one value a request ({n} requests), got "
                f"shape {ids.shape}"
            )
        ids = _frozen(ids)
        short = (prompt < 1) | (output < 1)
        bad = short | ~(np.isfinite(arrival) & (arrival >= 0))
        if bad.any():
            i = int(np.argmax(bad))  # the first bad request, its lengths checked first
            raise WorkloadError(
                f"{self.name}: request {ids[i]} has prompt_tokens={prompt[i]}, "
                f"output_tokens={output[i]}; both must be >= 1"
                if short[i]
                else f"{self.name}: request {ids[i]} has arrival_s={arrival[i]}; "
                "must be finite and >= 0"
            )
        if (np.diff(arrival) < 0).any():
            order = np.argsort(arrival, kind="stable")
            arrival, prompt, output, ids = (
                _frozen(a[order]) for a in (arrival, prompt, output, ids)
            )
        self.arrival_s, self.prompt_tokens, self.output_tokens = arrival, prompt, output
        self.request_ids = ids

    @classmethod
    def from_requests(cls, name: str, requests: Iterable[Request], **fields: object) -> Workload:
        """A workload of these requests (in any order; stored by arrival)."""
        rows = list(requests)
        return cls(
            name,
            np.array([r.arrival_s for r in rows], dtype=np.float64),
            np.array([r.prompt_tokens for r in rows], dtype=np.int64),
            np.array([r.output_tokens for r in rows], dtype=np.int64),
            np.array([r.request_id for r in rows], dtype=str),
            **fields,  # type: ignore[arg-type]
        )

    @property
    def requests(self) -> Requests:
        """The requests in arrival order, each made when read."""
        assert self.request_ids is not None  # set in __post_init__
        return Requests(self.request_ids, self.arrival_s, self.prompt_tokens, self.output_tokens)

    def __len__(self) -> int:
        return len(self.arrival_s)

    def _with(
        self, keep: np.ndarray | slice, prompt: np.ndarray, output: np.ndarray, **counts: int
    ) -> Workload:
        """This workload's rows `keep` with these lengths (already cut to `keep`)."""
        assert self.request_ids is not None
        return replace(
            self,
            arrival_s=self.arrival_s[keep],
            prompt_tokens=prompt,
            output_tokens=output,
            request_ids=self.request_ids[keep],
            **counts,
        )

    def scaled(
        self, prompt_scale: float = 1.0, output_scale: float = 1.0, max_model_len: int = 0
    ) -> Workload:
        """Every prompt and output length times its factor (rounded, at least 1 token).
        With `max_model_len`, a prompt is cut to leave one token of the context and the
        output to what the context leaves after the prompt; without, `fit_context` is the
        caller's to apply."""
        if prompt_scale == output_scale == 1.0:
            return self
        cap = max_model_len or MAX_COUNT
        # at most `cap` before the cast to int64 (a float past its range would wrap)
        prompt, output = (
            np.minimum(np.maximum(1.0, np.round(tokens * scale)), float(cap)).astype(np.int64)
            for tokens, scale in (
                (self.prompt_tokens, prompt_scale),
                (self.output_tokens, output_scale),
            )
        )
        prompt = np.minimum(prompt, cap - 1)
        output = np.minimum(output, cap - prompt)
        return self._with(slice(None), prompt, output)

    def check_fits(self, max_model_len: int, kv_tokens: int | None = None) -> None:
        """Raise `WorkloadError` for the first request longer than the engine's context
        (or, given `kv_tokens`, than its whole KV cache)."""
        total = self.prompt_tokens + self.output_tokens
        cap = max_model_len if kv_tokens is None else min(max_model_len, kv_tokens)
        over = np.flatnonzero(total > cap)
        if not len(over):
            return
        i = over[0]
        assert self.request_ids is not None
        if total[i] > max_model_len:
            raise WorkloadError(
                f"{self.name}: request {self.request_ids[i]} needs {total[i]} tokens, over "
                f"the engine's max_model_len {max_model_len}; apply an overlong policy"
            )
        raise WorkloadError(
            f"{self.name}: request {self.request_ids[i]} needs {total[i]} tokens of KV cache, "
            f"more than the engine's {kv_tokens}"
        )

    def fit_context(self, max_model_len: int, policy: OverlongPolicy | str) -> Workload:
        """Apply `policy` to requests longer than `max_model_len` tokens in total."""
        policy = OverlongPolicy(policy)
        prompt, output = self.prompt_tokens, self.output_tokens
        over = prompt + output > max_model_len
        count = int(over.sum())
        if not count:
            return self
        if policy is OverlongPolicy.ERROR:
            i = np.flatnonzero(over)[0]
            assert self.request_ids is not None
            raise WorkloadError(
                f"{self.name}: request {self.request_ids[i]} needs {prompt[i] + output[i]} "
                f"tokens (prompt {prompt[i]} + output {output[i]}) but the model's context is "
                f"{max_model_len}; drop or truncate such requests (--overlong, a suite's "
                "overlong:) or use a profile with a longer context"
            )
        if policy is OverlongPolicy.DROP:
            if count == len(self):
                raise WorkloadError(
                    f"{self.name}: all {count} requests are longer than the model's context "
                    f"of {max_model_len} tokens (overlong=drop)"
                )
            keep = ~over
            return self._with(keep, prompt[keep], output[keep], dropped=self.dropped + count)
        output = np.where(over, np.minimum(output, max_model_len - 1), output)
        prompt = np.where(over, np.minimum(prompt, max_model_len - output), prompt)
        return self._with(slice(None), prompt, output, truncated=self.truncated + count)


SCALE_BOUNDS = (1e-3, 1e3)
"""The smallest and largest scale factor a range may hold: past them a factor is a slip (a
prompt scaled by 1e-300 is one token, a rate by 1e300 all arrives at once)."""


def scale_factor(value: float, what: str) -> float:
    """`value` if it is a number within `SCALE_BOUNDS`, else an error naming `what`."""
    low, high = SCALE_BOUNDS
    if not (
        is_number(value) and low <= value <= high
    ):
        raise ValueError(f"{what} must be a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def scale_range(
    value: object, what: str, bounds: tuple[float, float] = SCALE_BOUNDS
) -> tuple[float, float]:
    """`value` as a (lo, hi) range of scale factors, 0 < lo <= hi < inf and within `bounds`,
    else an error naming `what`."""
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
    if lo < bounds[0] or hi > bounds[1]:
        raise ValueError(
            f"{what} must lie within [{bounds[0]:g}, {bounds[1]:g}], got [{lo:g}, {hi:g}]"
        )
    return lo, hi
