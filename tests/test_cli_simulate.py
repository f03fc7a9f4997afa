"""`batchpilot simulate` end to end, and its errors."""

from __future__ import annotations

import json
import os
import re
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
    for flag in ("--workload", "--profile", "--controller", "--json", "examples:"):
        assert flag in text
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    usage = capsys.readouterr().out.split("\n\n")[0]
    assert "--controller CONTROLLER" in usage and "[--controller" not in usage  # required
    with pytest.raises(SystemExit):  # it said "required: model, vllm_args"
        main(["serve"])
    assert capsys.readouterr().err.endswith("the following arguments are required: model\n")


@pytest.mark.parametrize(
    "args",
    [
        ["train", "--config", "c.yml", "--out", ""],
        ["compare", "--workload", "embedded:gsm8k@poisson:1", "--controllers", "alg1", "--out", " "],
        ["evaluate", "--policy", "p.onnx", "--suite", "s.yml", "--out", ""],
        ["export", "run", "--out", ""],
        ["simulate", "--workload", "embedded:gsm8k@poisson:1", "--json", ""],
    ],
)
def test_an_empty_path_is_refused_not_read_as_the_current_directory(
    args: list[str], tmp_path: Path, monkeypatch, capsys
) -> None:
    """`--out ''` (an unset shell variable) wrote a whole run or report into the current
    directory, and `--json ''` said ".: is a directory"."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 2
    assert "is an empty or blank path; name a file or directory" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_a_fine_interval_over_a_long_span_is_said(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two requests 1,000 s apart at 1 ms took a million silent decisions (13 s)."""
    from batchpilot.training.commands import simulate

    monkeypatch.setattr(simulate, "MANY_DECISIONS", 50)
    trace = tmp_path / "gap.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,2\n60,20,2\n")
    argv = ["simulate", "--workload", f"{trace}@replay", "--no-progress"]
    assert main([*argv, "--interval", "1s"]) == 0
    assert "note: the arrivals span 60 s: 60 decisions or more at --interval 1000ms" in capsys.readouterr().err
    assert main([*argv, "--interval", "2s"]) == 0
    assert "note:" not in capsys.readouterr().err


def test_simulate_writes_metrics_json(tmp_path: Path, traces: Path) -> None:
    out = tmp_path / "m.json"
    code = main(
        [
            "simulate",
            "--workload", f"{traces / 'gsm8k/gsm8k_test_token_lengths.csv'}@poisson:4",
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
    # what the controller chose, decision by decision (static: one pair, every step)
    chosen = data["limits_chosen"]
    assert chosen == {"max_num_seqs": {"64": m["engine_iterations"]},
                      "max_num_batched_tokens": {"8192": m["engine_iterations"]}}  # fmt: skip


def test_simulate_says_which_limits_a_controller_chose(capsys) -> None:
    """Why a policy lost at a tight TPOT was a script's question: it held max_num_seqs at
    1,024 while its teacher chose 16-64."""
    argv = ["simulate", "--workload", "embedded:gsm8k@poisson:8", "--num-requests", "300",
            "--controller", "alg1", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.fullmatch(
        r"limits chosen \([\d,]+ decisions\): max_num_seqs ([\d,]+ \d+%(, )?){1,4}; "
        r"max_num_batched_tokens ([\d,]+ \d+%(, )?){1,4}",
        line,
    ), line


def test_limits_above_the_engines_caps_are_recorded_as_applied(tmp_path: Path) -> None:
    """``static:5000:20000`` on a 1,024-request engine was summarised as max_num_seqs 5,000
    (the budget as its cap, 8,192): the summary said a limit the engine never ran."""
    out = tmp_path / "m.json"
    argv = ["simulate", "--controller", "static:5000:20000", "--profile", "llama-2-7b-h100",
            "--num-requests", "50", "--no-progress", "--json", str(out)]  # fmt: skip
    assert main(argv) == 0
    data = json.loads(out.read_text())
    steps = data["metrics"]["engine_iterations"]
    assert data["limits_chosen"] == {"max_num_seqs": {"1024": steps},
                                     "max_num_batched_tokens": {"8192": steps}}  # fmt: skip


def test_simulate_runs_a_policy_at_its_trained_interval_unless_told_otherwise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = Path(__file__).resolve().parents[1] / "training/reports/learned/policy.onnx"
    argv = ["simulate", "--controller", f"policy:{policy}", "--num-requests", "50",
            "--no-progress", "--json", str(tmp_path / "m.json")]  # fmt: skip
    assert main(argv) == 0
    assert json.loads((tmp_path / "m.json").read_text())["metrics"]["completed"] == 50
    assert main([*argv, "--interval", "1it"]) == 2
    assert "trained to decide every 500ms" in capsys.readouterr().err
    combined = [a.replace(f"policy:{policy}", f"policy:{policy}+alg1") for a in argv]
    assert main([*combined, "--interval", "1it"]) == 2  # the combination keeps the policy's
    assert "trained to decide every 500ms" in capsys.readouterr().err


def test_simulate_truncates_overlong_requests_by_default_and_says_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The one default of every command: compare and the suites truncate too."""
    argv = ["simulate", "--workload", "embedded:azure-conv@replay", "--num-requests", "200",
            "--profile", "llama-65b-8xa100", "--controller", "static:64", "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert re.search(r"goodput [\d,.]+ tok/s of [\d,.]+ \(SLO ttft:2000,tpot:50: [\d.]+% of requests "
                     r"met it\), p99 TTFT [\d,]+ ms, p99 TPOT [\d,.]+ ms, \d+ preemptions", out)  # fmt: skip
    assert re.search(r"\d+ of 200 requests were longer than the 2,048-token context and "
                     r"truncated \(--overlong truncate\)", out)  # fmt: skip


def test_an_unreachable_tpot_target_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Llama-3-8B on an L4 cannot decode a token in 50 ms: goodput 0 for every controller is
    the SLO's doing, and simulate and compare say so; at 150 ms they are silent."""
    argv = ["--profile", "llama-3-8b-l4", "--workload", "embedded:azure-conv@poisson:0.2",
            "--num-requests", "20", "--no-progress"]  # fmt: skip
    note = r"one request alone decodes at \d+ ms a token on llama-3-8b-l4, over the TPOT target"
    assert main(["simulate", *argv]) == 0
    assert re.search(f"note: {note} of 50 ms", capsys.readouterr().out)
    assert main(["simulate", *argv, "--slo", "ttft:5000,tpot:150"]) == 0
    assert "note:" not in capsys.readouterr().out
    compare = ["compare", *argv, "--controllers", "static:8", "--seeds", "1", "--no-capacity"]
    assert main([*compare, "--out", str(tmp_path)]) == 0
    assert re.search(f"note: .*: {note} of 50 ms", capsys.readouterr().err)


def test_simulate_skips_bad_trace_rows_when_asked_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    trace = tmp_path / "lengths.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n100,20\n100,0\n" + "100,20\n" * 3)
    argv = ["simulate", "--workload", f"{trace}@poisson:4", "--no-progress"]
    assert main(argv) == 2
    assert "lengths.csv:3: num_decode_tokens is 0" in capsys.readouterr().err
    out = tmp_path / "m.json"
    assert main([*argv, "--bad-rows", "skip", "--json", str(out)]) == 0
    assert f"bad rows of {trace} left out (--bad-rows skip): 1; the first: {trace}:3:" in (
        capsys.readouterr().out
    )
    metrics = json.loads(out.read_text())["metrics"]
    assert (metrics["skipped_rows"], metrics["completed"]) == (1, 4)


@pytest.mark.parametrize("arrival", ["poisson:1", "steps:1@0,2@10", "replay"])
def test_a_trace_whose_name_holds_an_at_sign_and_a_process_is_split_after_it(
    tmp_path: Path, arrival: str
) -> None:
    """``x@poisson.csv@poisson:1`` was split at its first ``@``: "unknown process
    'poisson.csv@poisson:1'"."""
    from batchpilot.training.commands.common import parse_workload

    trace = tmp_path / "x@poisson.csv"
    trace.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:00:00,10,5\n")
    assert parse_workload(f"{trace}@{arrival}") == (str(trace), arrival)
    assert parse_workload("embedded:gsm8k@steps:1@0,2@10") == ("embedded:gsm8k", "steps:1@0,2@10")
    with pytest.raises(ValueError, match=r"use SOURCE@ARRIVAL, e\.g\. .*x@poisson\.csv@replay$"):
        parse_workload(str(trace))  # was "unknown arrival process 'poisson.csv'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--controller", "static:x"], "static:x: N must be a whole number"),
        (["--controller", "magic"], "unknown controller 'magic'"),
        (["--controller", "policy"], "policy takes the exported file: policy:PATH"),  # was "PosixPath('.') has an empty name"
        (["--controller", "policy:/p/a,b/p.onnx"], "(if it is one policy's path: ',' separates controller specs"),
        (["--controller", "static:256,alg1"], "simulate runs one (static:256+alg1 takes the "
         "smallest of their limits; to compare them: batchpilot compare --controllers static:256,alg1)"),
        (["--controller", "statc:256"], "unknown controller 'statc:256'; did you mean 'static'?"),
        (["--controller", "best-statc"], "did you mean 'best-static'?"),
        (["--profile", "llama2-7b-h100"], "did you mean 'llama-2-7b-h100'?"),
        (["--workload", "embedded:gsm8k@poisson"], "poisson takes 1 argument"),
        (["--workload", "embedded:gsm8k"], "use SOURCE@ARRIVAL, e.g. embedded:gsm8k@poisson:4"),
        (["--workload", "/data/trace.csv"], "use SOURCE@ARRIVAL, e.g. /data/trace.csv@replay"),
        (["--workload", "embedded:gsm8k@poison:3"], "unknown arrival process 'poison:3'; known: "
         "all-at-once, poisson, gamma, steps, ramp, replay"),
        (["--profile", "nope"], "unknown profile 'nope'"),
        (["--workload", "/nonexistent.csv@replay"], "no such trace file"),
        # a user without a home directory: pathlib's RuntimeError was a traceback
        (["--profile", "~nouser_xq/p.json"], "~nouser_xq/p.json: no home directory to expand"),
        (["--workload", "~nouser_xq/x.csv@replay"], "~nouser_xq/x.csv: no home directory"),
        (["--controller", "policy:~nouser_xq/p.onnx"], "~nouser_xq/p.onnx: no home directory"),
        (["--workload", "embedded:azure-conv@replay", "--profile", "llama-65b-8xa100",
          "--overlong", "error"],
         "drop or truncate such requests (--overlong"),
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


@pytest.mark.parametrize(
    ("argv", "option"),
    [
        (["simulate", "--num-requests", "0"], "--num-requests"),
        (["simulate", "--num-requests", "-1"], "--num-requests"),
        (["simulate", "--num-requests", "-5"], "--num-requests"),
        (["simulate", "--num-requests", "1e3"], "--num-requests"),
        (["simulate", "--seed", "-1"], "--seed"),
        (["simulate", "--seed", "abc"], "--seed"),
        (["simulate", "--seed", str(2**32)], "--seed"),
        (["simulate", "--num-requests", "10000000000"], "--num-requests"),
        (["compare", "--workers", "-3"], "--workers"),
        (["compare", "--workers", "100000"], "--workers"),
        (["compare", "--workers", "0"], "--workers"),
        (["compare", "--seeds", "0"], "--seeds"),
        (["compare", "--seeds", "1001"], "--seeds"),
        (["compare", "--seeds", "99999999999"], "--seeds"),
        (["compare", "--tuning-seeds", "101"], "--tuning-seeds"),
        (["compare", "--tuning-seeds", "99999999999"], "--tuning-seeds"),
        (["compare", "--num-requests", "10000001"], "--num-requests"),
        (["evaluate", "--seeds", "1001"], "--seeds"),
        (["compare", "--slo", ""], "--slo"),
        (["compare", "--slo", " , "], "--slo"),
        (["simulate", "--slo", ""], "--slo"),
        (["simulate", "--slo", "ttft:0"], "--slo"),
        (["compare", "--seed", "-1"], "--seed"),
        (["compare", "--num-requests", "0"], "--num-requests"),
        (["compare", "--tuning-seeds", "-2"], "--tuning-seeds"),
        (["compare", "--capacity-requests", "0"], "--capacity-requests"),
        (["paper", "--workers", "-3"], "--workers"),
        (["paper", "--seeds", "0"], "--seeds"),
        (["paper", "--seeds", "1"], "--seeds"),
        (["quickstart", "--seeds", "-1"], "--seeds"),
        (["quickstart", "--seeds", "1001"], "--seeds"),
        (["paper", "--seeds", "1001"], "--seeds"),
        (["calibrate", "--repeats", "0"], "--repeats"),
        (["calibrate", "--max-num-seqs", "-4"], "--max-num-seqs"),
        (["calibrate", "--num-gpu-blocks", "0"], "--num-gpu-blocks"),
        (["serve", "--decision-budget-ms", "nan"], "--decision-budget-ms"),
        (["serve", "--decision-budget-ms", "-1"], "--decision-budget-ms"),
        (["serve", "--decision-budget-ms", "1_0"], "--decision-budget-ms"),  # float() reads 10
        (["serve", "--decision-budget-ms", "+1"], "--decision-budget-ms"),  # float() reads 1
        (["serve", "--decision-budget-ms", "1 "], "--decision-budget-ms"),
        (["simulate", "--num-requests", "1_0"], "--num-requests"),  # int() reads 10
        (["compare", "--seeds", "+3"], "--seeds"),
        (["compare", "--workers", "\u0663"], "--workers"),  # int() reads Arabic-Indic 3
        (["profiles", "build", "--out", "x", "--step-overhead-ms", "1_0"], "--step-overhead-ms"),
        (["serve", "--slo", ""], "--slo"),
        (["serve", "--slo", "ttft:-1"], "--slo"),
    ],
)
def test_bad_numbers_are_refused_naming_the_option(argv, option, capsys) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}" in err and "Traceback" not in err, err


@pytest.mark.parametrize("title", ["", " ", "a\nb"])
def test_a_blank_or_multiline_report_title_is_refused(title: str, capsys) -> None:
    """`evaluate --title ''` headed the report "# ", and a newline split its heading."""
    with pytest.raises(SystemExit) as done:
        main(["evaluate", "--policy", "p.onnx", "--suite", "steady", "--out", "x", "--title", title])
    assert done.value.code == 2
    assert "a title is one printable line, not blank" in capsys.readouterr().err


def test_a_decision_deadline_below_the_budget_is_named_by_its_flag(tmp_path, capsys) -> None:
    (tmp_path / "config.json").write_text("{}")  # a model directory, as serve checks
    argv = ["serve", str(tmp_path), "--controller", "alg1", "--decision-budget-ms", "5",
            "--decision-deadline-ms", "2"]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--decision-deadline-ms '2': below the 5 ms decision budget" in err, err  # not '2.0'
    assert "BATCHPILOT_" not in err


@pytest.mark.parametrize("flags", [["--scheduler-cls", "x.Y"], ["--scheduler-cls=x.Y"], ["--scheduler_cls", "x.Y"]])
def test_serve_keeps_its_scheduler_class(tmp_path, capsys, flags: list[str]) -> None:
    """The controller runs in batchpilot's scheduler class: another one, in any spelling vLLM
    takes, is refused before vLLM starts."""
    (tmp_path / "config.json").write_text("{}")
    assert main(["serve", str(tmp_path), "--controller", "static:3", *flags]) == 2
    assert "--scheduler-cls is batchpilot's; drop it" in capsys.readouterr().err


def test_serve_leaves_the_default_deadline_to_the_engine() -> None:
    """Without --decision-deadline-ms the engine's own default applies (`engine_settings`,
    at most a minute for any budget): serve once computed an infinite one for a huge budget
    and blamed the flag nobody gave."""
    from batchpilot.serving.config import DEADLINE_ENV, PARENT_ENV, engine_settings
    from batchpilot.training.cli import build_parser
    from batchpilot.training.commands.serve import split_arguments, vllm_command

    args = build_parser().parse_args(["serve", "m", "--controller", "static:3",
                                      "--decision-budget-ms", "30000"])  # fmt: skip
    _, env = vllm_command(split_arguments(args))
    assert DEADLINE_ENV not in env and env[PARENT_ENV] == str(os.getpid())
    assert engine_settings(env).deadline_s == 30.0


@pytest.mark.parametrize("flags", [["--model", "other"], ["--model=other"]])
def test_serve_refuses_a_second_model(tmp_path, capsys, flags: list[str]) -> None:
    """vLLM serves the last --model it is given: one among vLLM's arguments replaced the
    checked MODEL silently."""
    (tmp_path / "config.json").write_text("{}")
    assert main(["serve", str(tmp_path), "--controller", "static:3", *flags]) == 2
    assert f"--model among vLLM's arguments: MODEL ({tmp_path}) names the model" in capsys.readouterr().err


def test_every_numeric_option_is_range_checked() -> None:
    """No command takes a bare int/float: each numeric option has a validator naming it."""
    from batchpilot.training.cli import build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices
    bare = []
    for name, sub in commands.items():
        subparsers = [sub] + [
            p for a in sub._actions if a.choices and isinstance(a.choices, dict) for p in a.choices.values()
        ]
        for p in subparsers:
            bare += [f"{name} {a.option_strings}" for a in p._actions if a.type in (int, float)]
    assert bare == []


def test_library_refuses_non_positive_request_counts() -> None:
    from batchpilot.envs.workload import WorkloadError
    from batchpilot.envs.workloads import make_workload

    for n in (0, -1):
        with pytest.raises(WorkloadError, match="num_requests"):
            make_workload("embedded:gsm8k", "poisson:1", num_requests=n)
    with pytest.raises(WorkloadError, match="seed"):
        make_workload("embedded:gsm8k", "poisson:1", seed=-1)


def test_simulate_checks_json_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import batchpilot.envs.run

    def no_run(*args: object, **kwargs: object) -> None:
        raise AssertionError("ran")

    monkeypatch.setattr(batchpilot.envs.run, "run", no_run)
    taken = tmp_path / "taken"
    taken.write_text("")
    for path, message in ((tmp_path, "is a directory, not a file"),
                          (taken / "m.json", f"{taken} is a file, not a directory")):  # fmt: skip
        assert main(["simulate", "--no-progress", "--json", str(path)]) == 2
        assert f"error: --json {path}: {message}" in capsys.readouterr().err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full (Linux)")
def test_a_json_file_that_cannot_be_written_is_named(capfd: pytest.CaptureFixture[str]) -> None:
    """A write that fails without naming its file (a full disk) names it all the same; a
    device is written in place (``--json /dev/stdout`` prints the metrics)."""
    argv = ["simulate", "--no-progress", "--num-requests", "10", "--json"]
    assert main([*argv, "/dev/full"]) == 2
    assert "error: cannot write /dev/full: No space left on device" in capfd.readouterr().err
    assert main([*argv, "/dev/stdout"]) == 0
    assert '"metrics": {' in capfd.readouterr().out


def test_a_policy_whose_network_overflows_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Finite weights that overflow float32 pass the load checks; the first decision's
    infinite logits are then an error naming the policy, not a traceback."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    from batchpilot.agents.policy import seal, sha256

    shipped = Path(__file__).resolve().parents[1] / "training/reports/learned/policy.onnx"
    model = onnx.load(str(shipped))
    last = [n for n in model.graph.node if n.op_type == "Gemm"][-1].input[1]
    for init in model.graph.initializer:
        if init.name == last:
            huge = np.sign(numpy_helper.to_array(init)) * np.float32(3e38)
            init.CopyFrom(numpy_helper.from_array(huge.astype(np.float32), init.name))
    policy = tmp_path / "overflow.onnx"
    onnx.save(model, str(policy))
    meta = json.loads(Path(f"{shipped}.json").read_text())
    del meta["sidecar_sha256"]
    Path(f"{policy}.json").write_text(json.dumps(seal(meta | {"sha256": sha256(policy)})))
    argv = ["simulate", "--controller", f"policy:{policy}", "--num-requests", "20",
            "--workload", "embedded:gsm8k@poisson:4", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"policy:{policy}: the policy's network output NaN or infinite logits" in err
    assert "weights overflow float32" in err and "Traceback" not in err
    # as a user runs it (pytest records warnings itself): numpy's warning said it first
    shown = subprocess.run(
        [sys.executable, "-m", "batchpilot.training.cli", *argv], capture_output=True, text=True
    )
    assert shown.returncode == 2 and "RuntimeWarning" not in shown.stderr, shown.stderr


def test_an_empty_interval_is_refused_not_read_as_the_default(capsys) -> None:
    """`simulate --interval ''` ran at the default interval (compare refused it)."""
    args = ["simulate", "--workload", "embedded:gsm8k@poisson:1", "--num-requests", "3"]
    assert main([*args, "--interval", ""]) == 2
    assert "control interval '': use e.g. 1it" in capsys.readouterr().err


def test_simulate_json_replaces_only_a_metrics_file_it_wrote(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--workload g.csv@poisson:5 --json g.csv`` replaced the trace it read with metrics
    (and ``--profile p.json --json p.json`` the profile); an earlier --json may be replaced."""
    trace = tmp_path / "g.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n" + "30,20\n" * 60)
    before = trace.read_text()
    argv = ["simulate", "--workload", f"{trace}@poisson:5", "--num-requests", "40",
            "--no-progress", "--json"]  # fmt: skip
    assert main([*argv, str(trace)]) == 2
    assert "exists and is not a metrics file that simulate wrote" in capsys.readouterr().err
    assert trace.read_text() == before
    out = tmp_path / "m.json"
    out.write_text("")  # as mktemp leaves it
    assert main([*argv, str(out)]) == 0 and main([*argv, str(out)]) == 0  # a rerun replaces
    nested = tmp_path / "n.json"
    nested.write_text("[" * 100_000 + "]" * 100_000)  # a RecursionError in json
    assert main([*argv, str(nested)]) == 2
    assert "is not a metrics file that simulate wrote" in capsys.readouterr().err
    assert json.loads(out.read_text())["metrics"]["completed"] == 40


@pytest.mark.parametrize("flags", [[], ["--async-scheduling"], ["--async_scheduling"], ["--no_async_scheduling"]])
def test_serve_leaves_a_users_async_scheduling_alone(flags: list[str]) -> None:
    """batchpilot turns vLLM's async scheduling off unless the user chose, in either spelling:
    ``--async_scheduling`` was overridden by the '--no-async-scheduling' added after it."""
    from batchpilot.training.cli import build_parser
    from batchpilot.training.commands.serve import split_arguments, vllm_command

    args = build_parser().parse_args(["serve", "m", "--controller", "static:3", *flags])
    cmd, _ = vllm_command(split_arguments(args))
    assert cmd.count("--no-async-scheduling") == (0 if flags else 1)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--seed", "1", "--seed", "2"],
        ["profiles", "build", "--model", "llama-2-7b", "--gpu", "h100", "--out", "a.json", "--out", "b.json"],
    ],
)
def test_an_option_given_twice_is_refused_in_every_command(argv: list[str], capsys) -> None:
    """argparse kept the last value silently; a nested subcommand (profiles build) too."""
    with pytest.raises(SystemExit):
        main(argv)
    assert "given more than once; give it once" in capsys.readouterr().err


def test_compare_names_policies_trained_at_different_intervals(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """compare told the first policy to run at its interval ("not 1it"), which the user never
    gave and the second policy would then refuse."""
    import shutil

    from batchpilot.agents.policy import seal

    shipped = Path(__file__).resolve().parents[1] / "training/reports/learned/policy.onnx"
    other = tmp_path / "other.onnx"
    shutil.copy(shipped, other)
    meta = json.loads(Path(f"{shipped}.json").read_text())
    del meta["sidecar_sha256"]
    Path(f"{other}.json").write_text(json.dumps(seal(meta | {"control_interval": "1it"})))
    argv = ["compare", "--controllers", f"policy:{shipped},policy:{other}", "--num-requests", "5",
            "--seeds", "1", "--no-capacity", "--no-progress", "--out", str(tmp_path / "out")]  # fmt: skip
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"policy:{shipped} (500ms), policy:{other} (1it)); a run consults every controller at one" in err
