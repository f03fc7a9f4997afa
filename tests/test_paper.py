"""The paper reproduction's summary, on reduced Table I and II settings."""

from __future__ import annotations

import re

import pytest

from batchpilot.training.commands.paper import (
    PAPER_TABLE1,
    TABLE1_CONTROLLERS,
    TABLE2_CONTROLLERS,
    summary,
)
from batchpilot.training.evaluate import CapacityTarget, Scenario, evaluate


@pytest.fixture(scope="module")
def results() -> tuple[dict, dict]:
    t1 = [
        Scenario(
            "Table I: 65B gsm8k",
            "embedded:gsm8k",
            "all-at-once",
            120,
            profile="llama-65b-8xa100",
            score="output_throughput",
        ),
        Scenario(
            "Table I: 65B 68/345",
            "fixed:68:345",
            "all-at-once",
            120,
            profile="llama-65b-8xa100",
            score="output_throughput",
        ),
        Scenario(
            "Table I: 7B 128/128",
            "fixed:128:128",
            "all-at-once",
            120,
            profile="llama-7b-a100",
            score="output_throughput",
        ),
    ]
    t2 = [
        Scenario(
            "Table II: 70B, 257/62 tokens",
            "fixed:257:62",
            "poisson:5",
            80,
            profile="llama3-70b-8xa100",
            slo="tpot:50",
        ),
    ]
    r1 = evaluate(t1, TABLE1_CONTROLLERS.split(","), [0], workers=1, progress=False)
    target = CapacityTarget.parse("p90_itl_ms:50,p90_ttft_ms:2000", num_requests=60, max_probes=5)
    r2 = evaluate(
        t2, TABLE2_CONTROLLERS.split(","), [0], capacity=target, workers=1, progress=False
    )
    return r1, r2


def test_table1_rows_carry_the_run_and_the_paper(results) -> None:
    r1, r2 = results
    lines = summary(r1, r2)
    rows = [ln for ln in lines if ln.startswith("| ") and "→" in ln and "setting" not in ln]
    assert len(rows) == 3 + 1
    for sc, row, key in zip(r1["scenarios"], rows, PAPER_TABLE1, strict=False):
        res = sc["results"]
        s = res["static:256"]["mean"]["output_throughput"]
        a = res["alg1"]["mean"]["output_throughput"]
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[3] == f"{s:,.0f}" and cells[4] == f"{a:,.0f}"
        assert cells[5] == f"{(a / s - 1) * 100:+.1f}%"
        _, paper_static, paper_dynamic = PAPER_TABLE1[key]
        assert cells[1] == f"{paper_static:,} → {paper_dynamic:,}"


def test_table2_row_states_capacity_from_the_run(results) -> None:
    r1, r2 = results
    row = next(line for line in summary(r1, r2) if line.startswith("| 70B, 257/62"))
    res = r2["scenarios"][0]["results"]
    s, d = res["static:256"]["capacity"]["mean"], res["alg1+alg2"]["capacity"]["mean"]
    assert f"{s:.2f} → {d:.2f}" in row
    assert "5.4 → 6.6" in row


def test_chunk_search_sentence_is_computed(results) -> None:
    text = "\n".join(summary(*results))
    assert re.search(r"changed capacity by [+-]\d+\.\d% to [+-]\d+\.\d%", text)
