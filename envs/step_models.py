"""Step-time models: what one engine iteration costs, given what the scheduler put in it.

The simulator describes a step by six counts (`StepModel.time`'s arguments):

- ``prefill_seqs``: requests given a prefill chunk (new, partial or recomputed prompts);
- ``prefill_tokens``: tokens in those chunks;
- ``prefill_kv``: their contexts after the step, summed (the KV entries they attend to);
- ``prefill_attn``: the prefill attention work, sum over chunks of chunk x context;
- ``decode_seqs``: requests decoding one token;
- ``decode_kv``: their contexts (KV tokens read), summed.

Two models implement it:

- `LinearStepModel` (``kind: linear``): ``t = base + c_p P + c_d D + c_kv K`` with K all
  contexts; what `batchpilot calibrate` fits and the CPU profile uses.
- `TableStepModel` (``kind: table``): measured and non-linear, built by
  `batchpilot.envs.profile_tables` from per-operator GPU profiles: the step's token count
  through a table (linear layers, all-reduce, embedding: flat until the weights stop
  dominating, then growing), the sampled requests through a second (the LM head), an
  attention cost linear in prefill tokens, chunk x context and decode KV tokens, and
  explicit per-step and per-request CPU overheads.

Both are linear in ``decode_kv`` as the last term (`base_time` + `decode_kv_s` x KV), so
the simulator's closed-form decode runs (batch fixed, context growing by the batch each
step) compute each step's time with the same floating-point operations as one `time` call:
bit-identical step times.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from bisect import bisect_right
from dataclasses import dataclass, field, fields, replace
from itertools import pairwise

from batchpilot.envs.json_objects import brief


class StepModel(ABC):
    """The interface the simulator calls."""

    kind: str = ""

    @abstractmethod
    def base_time(
        self,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_kv: int,
        prefill_attn: int,
        decode_seqs: int,
    ) -> float:
        """Everything but the decode-KV term."""

    @property
    @abstractmethod
    def decode_kv_s(self) -> float:
        """Seconds per decode KV token read (the last, linear term)."""

    def time(
        self,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_kv: int,
        prefill_attn: int,
        decode_seqs: int,
        decode_kv: int,
    ) -> float:
        """Seconds for one step."""
        base = self.base_time(prefill_seqs, prefill_tokens, prefill_kv, prefill_attn, decode_seqs)
        return base + self.decode_kv_s * decode_kv

    def decode_time(self, decode_seqs: int, decode_kv: int) -> float:
        """Seconds for a pure-decode step."""
        return self.time(0, 0, 0, 0, decode_seqs, decode_kv)

    def prefill_time(self, prompt_tokens: int) -> float:
        """Seconds for one request's whole prompt in one chunk (nothing else in the step)."""
        p = prompt_tokens
        return self.time(1, p, p, p * p, 0, 0)

    @abstractmethod
    def slowed(self, factor: float) -> StepModel:
        """The same model with every time multiplied by `factor` (a slower or faster GPU of
        the same shape)."""

    @abstractmethod
    def stretched(self, factor: float) -> StepModel:
        """The same model with the token counts along the linear layers' cost curve
        multiplied by `factor`: the decode knee (where those layers turn compute-bound) moves
        `factor` times as far out, as on a GPU with `factor` times the compute per unit of
        memory bandwidth. Fixed, per-request and attention costs are unchanged."""

    @abstractmethod
    def to_dict(self) -> dict:
        """JSON-ready form, with ``kind``."""

    def extremes(
        self, max_seqs: int, max_tokens: int, max_context: int, max_kv: int
    ) -> tuple[float, float]:
        """Bounds (least, most seconds) on any step of 1 to `max_seqs` requests and 1 to
        `max_tokens` tokens, contexts of at most `max_context` and `max_kv` in all (what
        profile files are checked by; a model never read from one needs none)."""
        raise NotImplementedError


@dataclass(frozen=True)
class LinearStepModel(StepModel):
    """``t = base_s + prefill_token_s P + decode_seq_s D + kv_token_s K`` (seconds),
    K = all contexts in the step (prefill and decode)."""

    base_s: float
    prefill_token_s: float
    decode_seq_s: float
    kv_token_s: float
    kind = "linear"

    def base_time(
        self,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_kv: int,
        prefill_attn: int,
        decode_seqs: int,
    ) -> float:
        return (
            self.base_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.kv_token_s * prefill_kv
        )

    @property
    def decode_kv_s(self) -> float:
        return self.kv_token_s

    def __call__(self, prefill_tokens: int, decode_seqs: int, kv_tokens: int) -> float:
        """The fitted form: P prefill tokens, D decode requests, K contexts in all."""
        return (
            self.base_s
            + self.prefill_token_s * prefill_tokens
            + self.decode_seq_s * decode_seqs
            + self.kv_token_s * kv_tokens
        )

    def slowed(self, factor: float) -> LinearStepModel:
        return LinearStepModel(*(getattr(self, f.name) * factor for f in fields(self)))

    def stretched(self, factor: float) -> LinearStepModel:
        """No knee: each token through the linear layers costs 1/`factor` as much."""
        return replace(
            self,
            prefill_token_s=self.prefill_token_s / factor,
            decode_seq_s=self.decode_seq_s / factor,
        )

    def to_dict(self) -> dict:
        return {"kind": self.kind, **{f.name: getattr(self, f.name) for f in fields(self)}}

    def extremes(
        self, max_seqs: int, max_tokens: int, max_context: int, max_kv: int
    ) -> tuple[float, float]:
        least = self.base_s + min(self.prefill_token_s, self.decode_seq_s) + self.kv_token_s
        most = (
            self.base_s
            + self.prefill_token_s * max_tokens
            + self.decode_seq_s * max_seqs
            + self.kv_token_s * max_kv
        )
        return least, most

    def validate(self, origin: str) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or not value >= 0:
                raise ValueError(f"{origin}: step.{f.name} must be a number >= 0, got {value!r}")


def _interp(xs: tuple[float, ...], ys: tuple[float, ...], x: float) -> float:
    """Piecewise-linear through the knots, extended linearly past either end."""
    i = bisect_right(xs, x)
    i = min(max(i, 1), len(xs) - 1)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def _extent(xs: tuple[float, ...], ys: tuple[float, ...], high: float) -> tuple[float, float]:
    """Least and most of `_interp` over counts 1 to `high`: at an end or at a knot between."""
    inner = [y for x, y in zip(xs, ys, strict=True) if 1 < x < high]
    values = [_interp(xs, ys, 1), _interp(xs, ys, high), *inner]
    return min(values), max(values)


@dataclass(frozen=True)
class TableStepModel(StepModel):
    """Measured step time (seconds)::

        t = step_overhead_s + seq_overhead_s S                     CPU: scheduler, inputs, outputs
          + token_table(P + D)                                     linear layers, all-reduce, emb
          + seq_table(S)                                           LM head over sampled rows
          + attn_base_s + attn_prefill_token_s P + attn_pair_s W   attention: prefill
          + attn_decode_kv_s K_d                                   attention: decode (KV read)

    S = requests in the step, P prefill tokens, D decode requests, W = sum of chunk x
    context over prefill chunks, K_d decode contexts. Tables are interpolated linearly and
    extended linearly past their last knot. `source` says where every number came from.
    """

    token_knots: tuple[float, ...]
    token_s: tuple[float, ...]
    seq_knots: tuple[float, ...]
    seq_s: tuple[float, ...]
    attn_base_s: float
    attn_prefill_token_s: float
    attn_pair_s: float
    attn_decode_kv_s: float
    step_overhead_s: float
    seq_overhead_s: float
    source: dict[str, str] = field(default_factory=dict, compare=False)
    kind = "table"

    def base_time(
        self,
        prefill_seqs: int,
        prefill_tokens: int,
        prefill_kv: int,
        prefill_attn: int,
        decode_seqs: int,
    ) -> float:
        seqs = prefill_seqs + decode_seqs
        return (
            self.step_overhead_s
            + self.seq_overhead_s * seqs
            + _interp(self.token_knots, self.token_s, prefill_tokens + decode_seqs)
            + _interp(self.seq_knots, self.seq_s, seqs)
            + self.attn_base_s
            + self.attn_prefill_token_s * prefill_tokens
            + self.attn_pair_s * prefill_attn
        )

    @property
    def decode_kv_s(self) -> float:
        return self.attn_decode_kv_s

    def slowed(self, factor: float) -> TableStepModel:
        times = {}
        for f in fields(self):
            if f.name.endswith("_s"):  # the times (the knots are counts)
                value = getattr(self, f.name)
                times[f.name] = (
                    tuple(v * factor for v in value) if isinstance(value, tuple) else value * factor
                )
        return replace(self, **times)

    def stretched(self, factor: float) -> TableStepModel:
        """Both tables (linear layers over tokens, LM head over requests) read at counts
        divided by `factor`."""
        return replace(
            self,
            token_knots=tuple(k * factor for k in self.token_knots),
            seq_knots=tuple(k * factor for k in self.seq_knots),
        )

    def to_dict(self) -> dict:
        out = {"kind": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def extremes(
        self, max_seqs: int, max_tokens: int, max_context: int, max_kv: int
    ) -> tuple[float, float]:
        token_least, token_most = _extent(self.token_knots, self.token_s, max_tokens)
        seq_least, seq_most = _extent(self.seq_knots, self.seq_s, max_seqs)
        fixed = self.step_overhead_s + self.attn_base_s
        least = (
            fixed
            + self.seq_overhead_s
            + token_least
            + seq_least
            + min(self.attn_prefill_token_s + self.attn_pair_s, self.attn_decode_kv_s)
        )
        most = (
            fixed
            + self.seq_overhead_s * max_seqs
            + token_most
            + seq_most
            + self.attn_prefill_token_s * max_tokens
            + self.attn_pair_s * max_tokens * max_context
            + self.attn_decode_kv_s * max_kv
        )
        return least, most

    def validate(self, origin: str) -> None:
        for name in ("token", "seq"):
            xs, ys = getattr(self, f"{name}_knots"), getattr(self, f"{name}_s")
            if len(xs) < 2 or len(xs) != len(ys):
                raise ValueError(
                    f"{origin}: step.{name}_knots and step.{name}_s need the same length >= 2"
                )
            if any(b <= a for a, b in pairwise(xs)):
                raise ValueError(f"{origin}: step.{name}_knots must be strictly increasing")
            if xs[0] < 1:
                raise ValueError(f"{origin}: step.{name}_knots start at {xs[0]:g}; counts are >= 1")
            if min(ys) < 0:
                raise ValueError(f"{origin}: step.{name}_s must be >= 0")
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, float) and not value >= 0:
                raise ValueError(f"{origin}: step.{f.name} must be >= 0, got {value!r}")


MAX_STEP_S = 60.0
"""The longest one-request decode step a profile may time (anything longer is a unit slip)."""
MIN_STEP_S = 1e-4
"""The shortest one-request decode step a profile may time: vLLM's own bookkeeping takes
milliseconds a step (a tiny model on a CPU: 2.7 ms); a thousandth of a real step is a unit
slip, such as operator tables in seconds read as milliseconds."""
MAX_ANY_STEP_S = 3600.0
"""The longest step a profile may time within its caps: a whole 128k-token prompt in one
step takes a measured 70B profile 100 s; an hour is no engine step."""

STEP_MODELS: dict[str, type[StepModel]] = {"linear": LinearStepModel, "table": TableStepModel}


def _finite(value: object, where: str) -> float:
    """A JSON number as a finite float; anything else is a ValueError naming `where`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{where} must be a number, got {brief(value)}")
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not math.isfinite(number):
        raise ValueError(f"{where} is {brief(value)}, not a finite number")
    return number


def step_model_from_dict(data: object, origin: str = "profile") -> StepModel:
    """A step model from its JSON form; ``kind`` defaults to ``linear`` (older files).
    Errors name the field. `check_step_range` checks its times against a deployment's caps."""
    if not isinstance(data, dict):
        raise ValueError(f"{origin}: step must be an object, got {type(data).__name__}")
    data = dict(data)
    given_kind = "kind" in data
    kind = data.pop("kind", "linear")
    cls = STEP_MODELS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise ValueError(
            f"{origin}: step.kind {brief(kind)} unknown; known: {', '.join(STEP_MODELS)}"
        )
    names = {f.name: f for f in fields(cls)}
    unknown = sorted(set(data) - set(names))
    if unknown:
        fits = [k for k, c in STEP_MODELS.items() if set(data) <= {f.name for f in fields(c)}]
        hint = (
            f'; step.kind is missing, and the fields are a {fits[0]} step model\'s ("kind": '
            f'"{fits[0]}")'
            if not given_kind and fits
            else ""
        )
        raise ValueError(f"{origin}: step.{unknown[0]} is not a field of a {kind} step model{hint}")
    missing = [n for n, f in names.items() if n not in data and n != "source"]
    if missing:
        raise ValueError(f"{origin}: step.{missing[0]} missing ({kind} step model)")
    values: dict[str, object] = {}
    for name, value in data.items():
        where = f"{origin}: step.{name}"
        if name == "source":
            if not isinstance(value, dict):
                raise ValueError(f"{where} must be an object")
            values[name] = {str(k): str(v) for k, v in value.items()}
        elif str(names[name].type).startswith("tuple"):
            if not isinstance(value, list):
                raise ValueError(f"{where} must be a list of numbers, got {brief(value)}")
            values[name] = tuple(_finite(v, f"{where}[{i}]") for i, v in enumerate(value))
        else:
            values[name] = _finite(value, where)
    model = cls(**values)
    model.validate(origin)
    return model


def check_step_range(
    model: StepModel, max_seqs: int, max_tokens: int, max_context: int, max_kv: int, origin: str
) -> None:
    """A one-request decode step must take from `MIN_STEP_S` to `MAX_STEP_S`, and no step
    within a deployment's caps (`StepModel.extremes`) less than 0 or more than
    `MAX_ANY_STEP_S`."""
    one = model.decode_time(1, 1)
    if not one >= MIN_STEP_S:
        raise ValueError(
            f"{origin}: the step model times a one-request decode step at {one:g} s, under "
            f"{MIN_STEP_S * 1e3:g} ms: not an engine step (times in seconds where milliseconds "
            "were meant?)"
        )
    if not one <= MAX_STEP_S:
        raise ValueError(
            f"{origin}: the step model times a one-request decode step at {one:g} s, over "
            f"{MAX_STEP_S:g} s: not an engine step (seconds, not milliseconds?)"
        )
    least, most = model.extremes(max_seqs, max_tokens, max_context, max_kv)
    caps = (
        f"steps within the profile's caps ({max_seqs:,} requests, {max_tokens:,} tokens, "
        f"{max_context:,}-token contexts, {max_kv:,} KV tokens)"
    )
    if not least >= 0:
        raise ValueError(
            f"{origin}: the step model times {caps} at as little as {least:g} s: a table "
            "extended past its knots falls below 0"
        )
    if not most <= MAX_ANY_STEP_S:
        raise ValueError(
            f"{origin}: the step model times {caps} at up to {most:g} s, over "
            f"{MAX_ANY_STEP_S:g} s: not engine steps (seconds, not milliseconds?)"
        )
