"""`batchpilot simulate` end to end, and its errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batchpilot.training.cli import main


def test_help_explains_every_subcommand(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    assert "simulate" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    for flag in ("--trace", "--arrival", "--profile", "--controller", "--json", "examples:"):
        assert flag in text


def test_simulate_writes_metrics_json(tmp_path: Path, traces: Path) -> None:
    out = tmp_path / "m.json"
    code = main(
        [
            "simulate",
            "--trace", str(traces / "gsm8k/gsm8k_test_token_lengths.csv"),
            "--arrival", "poisson:4",
            "--num-requests", "200",
            "--profile", "llama-7b-a100",
            "--controller", "static:64",
            "--json", str(out),
            "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    data = json.loads(out.read_text())
    m = data["metrics"]
    assert data["controller"] == "static:64" and m["completed"] == 200
    for key in (
        "request_throughput", "output_throughput", "request_goodput", "median_ttft_ms",
        "p99_tpot_ms", "p99_itl_ms", "num_preemptions", "recomputed_tokens",
        "mean_kv_usage", "engine_iterations", "simulated_seconds", "wall_seconds",
    ):  # fmt: skip
        assert key in m
    assert m["simulated_seconds"] > 0 and m["engine_iterations"] > 200


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--controller", "static:x"], "static:x: N must be an integer"),
        (["--controller", "magic"], "unknown controller 'magic'"),
        (["--arrival", "poisson"], "poisson takes 1 argument"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--trace", "/nonexistent.csv"], "no such trace file"),
        (["--trace", "embedded:azure-conv", "--profile", "llama-65b-8xa100"], "overlong"),
    ],
)
def test_bad_input_is_a_clear_error(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "batchpilot.training.cli", "simulate", "--no-progress", *args],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 2
    assert message in proc.stderr and "Traceback" not in proc.stderr
