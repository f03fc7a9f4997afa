"""The evaluation harness (runs, best-static, capacity bisection) and `batchpilot compare`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from batchpilot.envs.metrics import SLO
from batchpilot.training.cli import main
from batchpilot.training.engines import make_engine
from batchpilot.training.evaluate import CapacityTarget, Scenario, Task, capacity_search, evaluate

SMALL = Scenario("small", "fixed:64:32", "poisson:4", 60, profile="llama-7b-a100")


def test_capacity_target_parses_and_checks() -> None:
    t = CapacityTarget.parse("p90_itl_ms:50,p90_ttft_ms:2000")
    assert t.bounds == (("p90_itl_ms", 50.0), ("p90_ttft_ms", 2000.0))
    assert t.met({"p90_itl_ms": 50.0, "p90_ttft_ms": 10.0, "unfinished": 0})
    assert not t.met({"p90_itl_ms": 50.1, "p90_ttft_ms": 10.0, "unfinished": 0})
    assert not t.met({"p90_itl_ms": 1.0, "p90_ttft_ms": 1.0, "unfinished": 3})
    with pytest.raises(ValueError, match="not METRIC:MAX"):
        CapacityTarget.parse("p90_itl_ms=50")
    with pytest.raises(ValueError, match="not a run metric"):
        CapacityTarget.parse("p91_itl_ms:50").met({"unfinished": 0})


def test_capacity_is_bracketed_by_a_failing_rate() -> None:
    """Bisection ends with the capacity passing and a rate within rel_tol above it failing."""
    target = CapacityTarget(bounds=(("p90_ttft_ms", 1000.0),), num_requests=150, rel_tol=0.05)
    found = capacity_search(Task(SMALL, "static:32", 0), target)
    cap, probes = found["capacity"], found["probes"]
    assert found["bracketed"] and cap > 1.0
    assert any(p["met"] and p["rate"] == cap for p in probes)
    above = min(p["rate"] for p in probes if not p["met"])
    assert cap < above <= cap * 1.05 + 1e-9
    assert all(not p["met"] for p in probes if p["rate"] > above)


def test_evaluate_runs_every_controller_and_resolves_best_static() -> None:
    res = evaluate(
        [SMALL], ["static:4", "alg1", "best-static"], [0, 1], workers=1, progress=False,
        best_static_grid=(4, 64),
    )  # fmt: skip
    sc = res["scenarios"][0]
    assert sc["best_static"]["best"] == 64  # 4 running at a time starves a 4 req/s load
    assert sc["results"]["best-static"]["spec"] == "static:64"
    small, big = sc["results"]["static:4"], sc["results"]["best-static"]
    assert len(small["per_seed"]) == 2 and small["mean"]["completed"] == 60
    assert big["mean"]["median_ttft_ms"] < small["mean"]["median_ttft_ms"]
    assert set(sc["timelines"]["alg1"]) >= {"time_s", "max_num_seqs", "kv_cache_usage"}
    assert len(sc["itl_ms_quantiles"]["alg1"]) == 201


def test_engine_factory_errors_name_the_problem() -> None:
    with pytest.raises(ValueError, match="needs a model"):
        make_engine("vllm", profile="llama-7b-a100", slo=SLO())
    with pytest.raises(ValueError, match="unknown engine 'tpu'"):
        make_engine("tpu", profile="llama-7b-a100", slo=SLO())


def test_compare_writes_report_html_and_json(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    code = main(
        [
            "compare", "--controllers", "static:256,alg1+alg2", "--workload", "fixed:64:32@poisson:4",
            "--num-requests", "60", "--seeds", "2", "--capacity-requests", "60", "--workers", "1",
            "--out", str(out), "--no-progress",
        ]
    )  # fmt: skip
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["controllers"] == ["static:256", "alg1+alg2"]
    cap = results["scenarios"][0]["results"]["alg1+alg2"]["capacity"]
    assert cap["mean"] > 0 and len(cap["per_seed"]) == 2
    md = (out / "report.md").read_text()
    assert "| alg1+alg2 |" in md and "vs static:256" in md and "capacity req/s" in md
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 3
    assert not any(p.suffix == ".svg" for p in out.iterdir())


def test_compare_rejects_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compare", "--controllers", "alg1:eps=2", "--out", str(tmp_path)]) == 2
    assert "eps must be in" in capsys.readouterr().err
    assert main(["compare", "--workload", "embedded:gsm8k", "--out", str(tmp_path)]) == 2
    assert "SOURCE@ARRIVAL" in capsys.readouterr().err
