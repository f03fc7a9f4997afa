"""Fit a step-time model (`batchpilot.envs.step_models`) to a real engine's measured steps.

A sample is one iteration as the simulator's step model sees it, with its seconds::

    (prefill requests, prefill tokens, prefill contexts, sum of chunk x context,
     decode requests, decode contexts, seconds)

(`StepTracker.step_log` records these). `median_samples` reduces repeated runs of the same
deterministic workloads to the median time of each step, so a fit is not led by noise.
Two forms, both by non-negative least squares:

- ``linear``: ``t = base + c_p P + c_d D + c_kv K`` (`LinearStepModel`; K all contexts);
- ``table``: `TableStepModel` with the step's tokens (P + D) and requests (S) through
  piecewise-linear tables whose knots are powers of two over the measured range, an
  attention cost in prefill tokens, chunk x context and decode contexts; the per-step
  constant lives in the token table (its value at the smallest knot), per-request costs in
  the request table (zero at one request). Both tables are fitted non-decreasing, as sums
  of non-negative rises: more work never takes less time, and no last segment falls
  towards 0 s past the measured range (where a profile's caps may reach).

`calibration_workloads` are the runs that cover batch sizes, prefill chunk sizes and
context lengths.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from batchpilot.envs.step_models import LinearStepModel, StepModel, TableStepModel
from batchpilot.envs.workload import Workload
from batchpilot.envs.workloads import make_workload

FORMS = ("linear", "table")
R2_WARN = 0.9
"""A fit explaining less than this share of the step-time variance is reported as poor."""
Sample = tuple[int, int, int, int, int, int, float]
MIN_CONTEXT = 96
"""The shortest context `calibration_workloads` can cover: its 64-token decode prompts and
their 32 outputs."""


@dataclass(frozen=True)
class Fit:
    """A fitted step-time model and how well it explains the samples it was fitted to."""

    model: StepModel
    samples: int
    r2: float
    median_abs_rel_error: float

    @property
    def form(self) -> str:
        return self.model.kind

    def summary(self) -> str:
        return (
            f"{self.form} fit over {self.samples} steps: R^2 {self.r2:.3f}, median |error| "
            f"{self.median_abs_rel_error:.1%}"
        )

    def warning(self) -> str | None:
        """A sentence saying the fit is poor, or None when R^2 reaches `R2_WARN`."""
        if self.r2 >= R2_WARN:
            return None
        return (
            f"warning: the {self.form} fit explains only R^2 {self.r2:.3f} of the step-time "
            f"variance (below {R2_WARN}); the simulator will be off for this engine: time "
            f"more repeats (noise), or try the other form"
        )


def median_samples(repeats: Iterable[Sequence[Sample]]) -> list[Sample]:
    """The median seconds of each step over repeats of one run (same workload and limits).

    Steps are matched by their position in the run and their counts; a step whose counts
    differ between repeats is its own group.
    """
    groups: dict[tuple, list[float]] = defaultdict(list)
    for run in repeats:
        for step, sample in enumerate(run):
            groups[(step, *sample[:6])].append(sample[6])
    return [(*key[1:], float(np.median(times))) for key, times in groups.items()]


def group_repeats(runs: Sequence[Sequence[Sample]], per_repeat: int) -> list[Sample]:
    """Median samples from ``repeats x per_repeat`` runs in repeat-major order."""
    out: list[Sample] = []
    for i in range(per_repeat):
        out += median_samples(runs[i::per_repeat])
    return out


def _check(samples: Sequence[Sample], columns: int) -> np.ndarray:
    data = np.asarray(samples, dtype=np.float64)
    if data.ndim != 2 or data.shape[1] != 7 or len(data) < max(8, 2 * columns):
        raise ValueError(
            f"need at least {max(8, 2 * columns)} step samples of 7 numbers (prefill requests, "
            f"prefill tokens, prefill contexts, chunk x context, decode requests, decode "
            f"contexts, seconds), got {len(data)}"
        )
    if not np.all(np.isfinite(data)) or np.any(data < 0):
        raise ValueError("step samples must be finite and non-negative")
    return data


def nnls(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """min ||A x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    scale = np.linalg.norm(A, axis=0)
    scale[scale == 0] = 1.0
    A = A / scale
    n = A.shape[1]
    passive = np.zeros(n, dtype=bool)
    x = np.zeros(n)
    tol = 10 * np.finfo(float).eps * np.abs(A).sum(axis=0).max() * max(A.shape)
    for _ in range(30 * n):
        w = A.T @ (b - A @ x)
        if passive.all() or w[~passive].max() <= tol:
            break
        passive[np.argmax(np.where(passive, -np.inf, w))] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(A[:, passive], b, rcond=None)[0]
            if z[passive].min() > 0:
                break
            neg = passive & (z <= 0)
            alpha = np.min(x[neg] / (x[neg] - z[neg]))
            x = x + alpha * (z - x)
            passive &= x > tol
        x = z
    return x / scale


def _score(model: StepModel, data: np.ndarray) -> tuple[float, float]:
    pred = np.array([model.time(*map(int, row[:6])) for row in data])
    y = data[:, 6]
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    return 1 - ss_res / ss_tot, float(np.median(rel))


def _knots(values: np.ndarray) -> tuple[float, ...]:
    """Powers of two from 1 through the largest value (the last knot at it)."""
    top = max(2.0, float(values.max()))
    knots = [1.0]
    while knots[-1] * 2 < top:
        knots.append(knots[-1] * 2)
    knots.append(top)
    return tuple(knots)


def _hat(knots: tuple[float, ...], x: np.ndarray) -> np.ndarray:
    """Piecewise-linear interpolation weights of each knot at each x (rows: x)."""
    eye = np.eye(len(knots))
    return np.column_stack([np.interp(x, knots, eye[j]) for j in range(len(knots))])


def _ramps(hat: np.ndarray) -> np.ndarray:
    """Columns for a table's rises from one knot to the next: column j sums the weights of
    knots j onwards, so non-negative rises make a non-decreasing table (``cumsum``)."""
    return np.cumsum(hat[:, ::-1], axis=1)[:, ::-1]


def fit_step_model(
    samples: Sequence[Sample], form: str = "linear", source: str = "batchpilot calibrate"
) -> Fit:
    """Fit `form` (``linear`` or ``table``) by non-negative least squares."""
    if form == "linear":
        data = _check(samples, 4)
        K = data[:, 2] + data[:, 5]
        X = np.column_stack([np.ones(len(data)), data[:, 1], data[:, 4], K])
        model: StepModel = LinearStepModel(*map(float, nnls(X, data[:, 6])))
    elif form == "table":
        data = _check(samples, 12)
        tokens = data[:, 1] + data[:, 4]
        seqs = data[:, 0] + data[:, 4]
        token_knots, seq_knots = _knots(tokens), _knots(seqs)
        seq_cols = _ramps(_hat(seq_knots, seqs)[:, 1:])  # zero at one request: constant below
        X = np.column_stack(
            [_ramps(_hat(token_knots, tokens)), seq_cols, data[:, 1], data[:, 3], data[:, 5]]
        )
        coef = nnls(X, data[:, 6])
        nt = len(token_knots)
        ns = len(seq_knots) - 1
        model = TableStepModel(
            token_knots=token_knots,
            token_s=tuple(map(float, np.cumsum(coef[:nt]))),
            seq_knots=seq_knots,
            seq_s=(0.0, *map(float, np.cumsum(coef[nt : nt + ns]))),
            attn_base_s=0.0,
            attn_prefill_token_s=float(coef[nt + ns]),
            attn_pair_s=float(coef[nt + ns + 1]),
            attn_decode_kv_s=float(coef[nt + ns + 2]),
            step_overhead_s=0.0,
            seq_overhead_s=0.0,
            source={
                "fit": f"{source}: non-negative least squares over {len(data)} median step "
                "times; per-step and per-request overheads are inside the token and request "
                "tables (the token table at 1 token holds the per-step constant)"
            },
        )
    else:
        raise ValueError(f"unknown step-model form {form!r}; use one of {', '.join(FORMS)}")
    r2, err = _score(model, data)
    return Fit(model, len(data), r2, err)


def calibration_workloads(max_model_len: int, max_batch: int) -> list[tuple[Workload, int]]:
    """(workload, batch limit) pairs: decode batches of 1..max_batch at short, medium and
    long contexts, and prefill-heavy runs of prompts from 128 tokens to the context limit
    (all requests at t=0, so every repeat schedules the same steps). A context below
    `MIN_CONTEXT` leaves no decode run: a ValueError."""
    if max_model_len < MIN_CONTEXT:
        raise ValueError(
            f"calibration needs a context (max_model_len) of at least {MIN_CONTEXT} tokens "
            f"for its shortest decode run (a 64-token prompt, 32 outputs), got {max_model_len}"
        )
    runs = []
    contexts = [c for c in (64, 512, 1536) if c + 32 <= max_model_len]
    batch = 1
    while batch <= max_batch:
        for ctx in contexts:
            runs.append(
                (make_workload(f"fixed:{ctx}:32", "all-at-once", num_requests=batch), batch)
            )
        batch *= 2
    prompts = (128, 512, 1024, max_model_len - 16)
    for prompt in sorted({p for p in prompts if p + 4 <= max_model_len}):
        runs.append((make_workload(f"fixed:{prompt}:4", "all-at-once", num_requests=8), 8))
    return runs
