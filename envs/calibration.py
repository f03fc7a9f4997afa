"""Fit the simulator's step-time model to a real engine's measured steps.

    t = base_s + prefill_token_s * P + decode_seq_s * D + kv_token_s * K

by non-negative least squares over (P, D, K, seconds) samples; `calibration_workloads`
are the runs that cover batch sizes, prefill chunk sizes and context lengths.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from batchpilot.envs.profiles import StepTimeModel
from batchpilot.envs.workload import Workload
from batchpilot.envs.workloads import make_workload


@dataclass(frozen=True)
class Fit:
    """A fitted step-time model and how well it explains the samples."""

    model: StepTimeModel
    samples: int
    r2: float
    median_abs_rel_error: float


def fit_step_model(samples: Sequence[tuple[int, int, int, float]]) -> Fit:
    """Least squares with non-negative coefficients (an active-set loop over 4 columns)."""
    data = np.asarray(samples, dtype=np.float64)
    if data.ndim != 2 or data.shape[1] != 4 or len(data) < 8:
        raise ValueError(f"need at least 8 (P, D, K, seconds) samples, got {len(data)}")
    if not np.all(np.isfinite(data)) or np.any(data < 0):
        raise ValueError("step samples must be finite and non-negative")
    X = np.column_stack([np.ones(len(data)), data[:, :3]])
    y = data[:, 3]
    active = list(range(4))
    while True:
        coef = np.zeros(4)
        coef[active] = np.linalg.lstsq(X[:, active], y, rcond=None)[0]
        negative = [i for i in active if coef[i] < 0]
        if not negative:
            break
        active.remove(min(negative, key=lambda i: coef[i]))
    pred = X @ coef
    ss_res = float(np.sum((y - pred) ** 2))
    ss_tot = float(np.sum((y - y.mean()) ** 2)) or 1.0
    rel = np.abs(pred - y) / np.maximum(y, 1e-9)
    return Fit(
        StepTimeModel(*map(float, coef)), len(data), 1 - ss_res / ss_tot, float(np.median(rel))
    )


def calibration_workloads(max_model_len: int, max_batch: int) -> list[tuple[Workload, int]]:
    """(workload, batch limit) pairs: decode batches of 1..max_batch at short, medium and
    long contexts, and prefill-heavy runs of long prompts (all requests at t=0)."""
    runs = []
    contexts = [c for c in (64, 512, 1536) if c + 32 <= max_model_len]
    batch = 1
    while batch <= max_batch:
        for ctx in contexts:
            runs.append(
                (make_workload(f"fixed:{ctx}:32", "all-at-once", num_requests=batch), batch)
            )
        batch *= 2
    for prompt in sorted({p for p in (256, 1024, max_model_len - 16) if p + 4 <= max_model_len}):
        runs.append((make_workload(f"fixed:{prompt}:4", "all-at-once", num_requests=8), 8))
    return runs
