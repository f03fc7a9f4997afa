"""The paper report's verdicts: computed from the numbers, paired over seeds, and a reduced
Table I run under both schedulers."""

from __future__ import annotations

import math

import pytest

from batchpilot.training.commands.paper import (
    MIN_GAIN,
    STATIC_SEQS,
    STATIC_TOKENS,
    TABLE1_CONTROLLERS,
    TABLE2,
    classify,
    gsm8k_source,
    scenarios,
    summary,
    table1_row,
    table2_row,
    verdicts,
)
from batchpilot.training.evaluate import Scenario, StaticGrid, evaluate


@pytest.mark.parametrize(
    ("args", "verdict"),
    [
        ((0.05,), "appears"),
        ((MIN_GAIN / 2,), "absent"),
        ((-0.05,), "reversed"),
        ((0.05, -0.01, 0.11), "absent"),  # a big mean whose interval holds zero is noise
        ((0.004, 0.001, 0.007), "appears"),  # a small gain every seed agrees on is not
        ((-0.03, -0.05, -0.01), "reversed"),
        ((None,), "absent"),
    ],
)
def test_classify_uses_the_interval_when_there_is_one(args, verdict: str) -> None:
    assert classify(*args) == verdict


def capacity_scenario(static: list[float], dynamic: list[float], scheduler: str) -> dict:
    """A Table II scenario result with the given per-seed capacities."""

    def cap(values: list[float]) -> dict:
        mean = sum(values) / len(values)
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / len(values))
        return {"capacity": {"per_seed": values, "mean": mean, "std": std,
                             "output_throughput_at_capacity": 100 * mean, "bracketed": True},
                "spec": "static:64", "mean": {}}  # fmt: skip

    results = {c: cap(static) for c in ("static:256", "alg1", "alg2", "oracle", "best-static")}
    results["alg1+alg2"] = cap(dynamic)
    return {
        "name": f"Table II [{scheduler.upper()}] 257/62: fixed:257:62 on p, 50 ms TBT",
        "scenario": {"scheduler": scheduler},
        "results": results,
    }


def test_table2_gain_is_paired_over_seeds() -> None:
    # seed-to-seed spread is large, but alg1+alg2 beats static by 0.5 on every seed
    row = table2_row(capacity_scenario([4.0, 6.0, 8.0], [4.5, 6.4, 8.6], "v0"))
    diffs = [0.5, 0.4, 0.6]
    sd = math.sqrt(sum((d - 0.5) ** 2 for d in diffs) / 2)
    half = 4.303 * sd / math.sqrt(3)  # Student t, 2 degrees of freedom
    assert row["gain"] == pytest.approx(0.5 / 6.0)
    assert row["gain_low"] == pytest.approx((0.5 - half) / 6.0)
    assert row["gain_high"] == pytest.approx((0.5 + half) / 6.0)
    assert row["verdict"] == "appears" and row["scheduler"] == "v0"
    assert row["paper_gain"] == pytest.approx(6.6 / 5.4 - 1)
    # the same means, but the seeds disagree: no effect
    noisy = table2_row(capacity_scenario([4.0, 6.0, 8.0], [5.5, 5.4, 8.6], "v1"))
    assert noisy["gain"] == pytest.approx(0.5 / 6.0) and noisy["verdict"] == "absent"


@pytest.fixture(scope="module")
def table1() -> dict:
    """Table I's 7B setting, reduced to 400 requests, under V0 and V1."""
    t1 = [
        Scenario(
            f"Table I [{s.upper()}] 7b-128: fixed:128:128 on llama-2-7b-a100",
            "fixed:128:128",
            "all-at-once",
            400,
            profile="llama-2-7b-a100",
            scheduler=s,
            score="output_throughput",
        )
        for s in ("v0", "v1")
    ]
    grid = StaticGrid(seqs=STATIC_SEQS, tokens=STATIC_TOKENS, first_seqs=STATIC_SEQS[0])
    return evaluate(
        t1, TABLE1_CONTROLLERS.split(","), [0], workers=1, progress=False, static_grid=grid
    )


def test_table1_rows_are_the_runs_numbers(table1: dict) -> None:
    rows = [table1_row(sc) for sc in table1["scenarios"]]
    assert [r["scheduler"] for r in rows] == ["v0", "v1"]
    for sc, row in zip(table1["scenarios"], rows, strict=True):
        res = sc["results"]
        s = res["static:256"]["mean"]["output_throughput"]
        a = res["alg1"]["mean"]["output_throughput"]
        assert (row["static"], row["alg1"]) == (s, a)
        assert row["gain"] == pytest.approx(a / s - 1)
        assert row["verdict"] == classify(a / s - 1)
    # the scheduler reached the engine: V0 stalls decodes for prefills, V1 does not
    assert rows[0]["static"] != rows[1]["static"]


def test_summary_states_the_computed_verdicts(table1: dict) -> None:
    r2 = {"seeds": [0, 1, 2], "scenarios": [capacity_scenario([4, 6, 8], [4.5, 6.4, 8.6], "v1")]}
    r2["scenarios"][0]["capacity_target"] = {"bounds": [["p90_itl_ms", 50.0]]}
    headline, tables = summary(table1, r2)
    lines = headline + tables
    v = verdicts(table1, r2)
    text = "\n".join(lines)
    for row in v["table1"]:
        sign = f"{row['gain']:+.1%}"
        assert any(sign in ln and row["verdict"] in ln and row["scheduler"].upper() in ln
                   for ln in lines)  # fmt: skip
    v1 = next(ln for ln in lines if ln.startswith("- **V1**"))
    assert "Table II" in v1 and "appears in 1 of 1" in v1
    assert "not an upper bound" in text
    assert TABLE2["257/62"][0] in text
    assert headline[0].startswith("**Which of the paper's effects appear")
    assert v1 in headline and not any(ln.startswith(("|", "#")) for ln in headline)


def test_every_setting_runs_under_each_scheduler() -> None:
    t1, t2 = scenarios(["v0", "v1"])
    assert {s.scheduler for s in t1} == {s.scheduler for s in t2} == {"v0", "v1"}
    assert len({s.name for s in t1 + t2}) == len(t1) + len(t2)
    from batchpilot.envs.profiles import PROFILES

    assert all(PROFILES[s.profile].step.kind == "table" for s in t1 + t2)  # measured profiles


@pytest.mark.parametrize(
    ("schedulers", "message"),
    [
        ("v0,", "--schedulers: use v0, v1 or both, got 'v0,'"),
        ("v0,v0", "--schedulers: a scheduler given twice in 'v0,v0'"),
    ],
)
def test_bad_schedulers_are_named_before_anything_runs(
    tmp_path, capsys: pytest.CaptureFixture[str], schedulers: str, message: str
) -> None:
    """A stray comma is not dropped, nor a repeat met as clashing scenario names."""
    from batchpilot.training.cli import main

    out = tmp_path / "paper"
    assert main(["paper", "--schedulers", schedulers, "--out", str(out), "--no-progress"]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--out", "{file}"], "--out {file}: is a file, not a directory"),
        (["--capacity-slo", "x"], "capacity SLO 'x'"),
        # its advice was "--interval 500ms", a flag paper has not
        (["--controllers-extra", "alg1,policy:training/reports/learned/policy.onnx"],
         "policy:training/reports/learned/policy.onnx is a learned policy, which decides at"),
        (["--controllers-extra", "alg1,alg1"], "--controllers-extra names alg1 twice"),
        (["--controllers-extra", "static:8,static:08"],
         "--controllers-extra names static:8 and static:08 twice"),
    ],
)
def test_a_bad_out_or_capacity_slo_is_named_before_table_one_runs(
    tmp_path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    extra: list[str], message: str,
) -> None:
    """Both were found only after Table I (and --out after Table II too): 12 s to minutes."""
    from batchpilot.training import evaluate
    from batchpilot.training.cli import main

    def no_runs(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(evaluate, "evaluate", no_runs)
    taken = tmp_path / "taken"
    taken.write_text("")
    out = [] if "--out" in extra else ["--out", str(tmp_path / "out")]  # an option once
    argv = ["paper", *out, "--no-progress", *(a.format(file=taken) for a in extra)]
    assert main(argv) == 2
    assert message.format(file=taken) in capsys.readouterr().err


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("embedded:sharegpt", "embedded:sharegpt: Table I is GSM8K's; use embedded:gsm8k"),
        ("azure2023/AzureLLMInferenceTrace_conv.csv", "is not a GSM8K length table (its format: azure)"),
    ],
)
def test_table_one_takes_gsm8k_lengths_only(
    traces, tmp_path, capsys: pytest.CaptureFixture[str], source: str, message: str
) -> None:
    """Any workload ran, and its tables were set beside the paper's GSM8K figures."""
    from batchpilot.training.cli import main

    source = source if source.startswith("embedded:") else str(traces / source)
    with pytest.raises(SystemExit):
        main(["paper", "--gsm8k", source, "--out", str(tmp_path / "p"), "--no-progress"])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "p").exists()
    assert gsm8k_source(str(traces / "gsm8k/gsm8k_test_token_lengths.csv")).endswith(".csv")


def test_a_bad_gsm8k_row_is_named_without_an_option_paper_lacks(tmp_path) -> None:
    """The error ended "(--bad-rows skip, or a scenario's bad_rows: skip, ...)": paper has
    neither."""
    import argparse

    bad = tmp_path / "g.csv"
    bad.write_text("prompt_tokens_llama2,output_tokens_llama2\n10,0\n20,5\n")
    with pytest.raises(argparse.ArgumentTypeError) as err:
        gsm8k_source(str(bad))
    assert str(err.value) == f"{bad}:2: output_tokens_llama2 is 0; a request needs at least 1 token"


def test_an_extra_controller_a_table_already_runs_runs_once(
    tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """static:0256 is Table I's static:256: it was run a second time beside it."""
    from batchpilot.training import evaluate
    from batchpilot.training.cli import main

    asked: list[list[str]] = []

    def record(scenarios, controllers, *args, **kwargs):
        asked.append(controllers)
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "evaluate", record)
    argv = ["paper", "--out", str(tmp_path / "out"), "--no-progress",
            "--controllers-extra", "static:0256,alg1"]
    with pytest.raises(KeyboardInterrupt):
        main(argv)
    assert asked == [["static:256", "alg1", "alg1+alg2", "oracle"]]


def test_the_report_links_both_tables_on_both_pages(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The links to Table I's and II's pages were appended to report.md after report.html was
    written from it: the HTML page had none."""
    import functools

    from batchpilot.training.cli import main
    from batchpilot.training.commands import paper

    monkeypatch.setattr(paper, "scenarios", functools.partial(paper.scenarios, scale=0.01))
    argv = ["paper", "--out", str(tmp_path), "--no-progress", "--schedulers", "v1"]
    assert main([*argv, "--capacity-requests", "20", "--workers", "1"]) == 0
    line = "Details: [Table I settings](table1/report.md), [Table II settings](table2/report.md)."
    assert line in (tmp_path / "report.md").read_text()
    assert line in (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert md.index("Which of the paper's effects appear") < md.index("Command:")  # was after
