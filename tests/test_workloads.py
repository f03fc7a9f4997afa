"""Trace readers, arrival processes, embedded tables and the overlong policy."""

from __future__ import annotations

import bz2
import gzip
import io
import json
import os
import shutil
import sys
import tarfile
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from batchpilot.envs import traces as traces_module
from batchpilot.envs.arrivals import Arrival, ArrivalSpecError
from batchpilot.envs.embedded import derive, embedded_lengths, embedded_names
from batchpilot.envs.traces import TraceError, load_trace
from batchpilot.envs.workload import MAX_COUNT, Request, Workload, WorkloadError, scale_range
from batchpilot.envs.workloads import make_workload


@pytest.mark.parametrize(
    ("rel", "fmt", "rows", "timed"),
    [
        ("azure2023/AzureLLMInferenceTrace_conv.csv", "azure", 19366, True),
        ("azure2023/AzureLLMInferenceTrace_code.csv", "azure", 8819, True),
        ("sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv", "sharegpt", 30731, False),
        ("gsm8k/gsm8k_test_token_lengths.csv", "gsm8k", 1319, False),
    ],
)
def test_shared_traces_load(traces: Path, rel: str, fmt: str, rows: int, timed: bool) -> None:
    trace = load_trace(traces / rel)
    assert (trace.format, len(trace)) == (fmt, rows)
    assert (trace.arrival_s is not None) == timed
    assert trace.prompt_tokens.min() >= 1 and trace.output_tokens.min() >= 1
    if timed:
        assert trace.arrival_s[0] == 0 and np.all(np.diff(trace.arrival_s) >= 0)


def test_azure_conv_matches_its_published_statistics(traces: Path) -> None:
    trace = load_trace(traces / "azure2023/AzureLLMInferenceTrace_conv.csv")
    assert trace.prompt_tokens.mean() == pytest.approx(1155, abs=1)
    assert trace.output_tokens.mean() == pytest.approx(211, abs=1)
    assert len(trace) / trace.arrival_s[-1] == pytest.approx(5.53, abs=0.01)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,x\n", ":2: GeneratedTokens is 'x', not a number"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,0\n", ":2: GeneratedTokens is 0"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", ":2: TIMESTAMP is 'yesterday', not a time"),
        ("num_prefill_tokens,num_decode_tokens\n5,6\n7\n", ":3: 1 field(s) where the header has 2"),
        ("num_prefill_tokens,num_decode_tokens\n5,6.5\n", ":2: num_decode_tokens is '6.5', not a whole number"),
        ("num_prefill_tokens,num_decode_tokens\n1e30,6\n", ":2: num_prefill_tokens is '1e30', over 2,147,483,647 tokens"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 1e19}\n', ":1: output_length is 1e+19, over 2,147,483,647"),
        ("a,b\n1,2\n", "unknown trace format"),
        ("num_prefill_tokens,num_decode_tokens,num_prefill_tokens\n5,6,7\n", ":1: the header names column(s) ['num_prefill_tokens'] more than once"),
        # read as Azure, the other pair ignored without a word
        ("TIMESTAMP,ContextTokens,GeneratedTokens,num_prefill_tokens,num_decode_tokens\n2023-11-16 18:15:46,10,5,7,3\n",
         ":1: the header has the token columns of several formats (ContextTokens/GeneratedTokens, num_prefill_tokens/num_decode_tokens)"),
        ("num_prefill_tokens,num_decode_tokens\n", "no requests in the file"),
        ('{"timestamp": 0, "input_length": 5, "output_length": 3}\n{"timestamp": 1,\n', ":2: not valid JSON"),
        ('{"timestamp": 0, "input_length": 5}\n', ":1: missing field(s) ['output_length']"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n1700000000,10,5\n", ":2: TIMESTAMP is '1700000000', not a time (a date and time like"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n2500-01-01 00:00:00,10,5\n", ":3: this timestamp puts the trace's span at 1.5e+10 s"),
        ("ContextTokens,GeneratedTokens\n100,20\n", ":1: the header has ContextTokens/GeneratedTokens (azure format) but no TIMESTAMP column"),
        ("Model,Request tokens,Response tokens\nm,100,20\n", ":1: the header has Request tokens/Response tokens (burstgpt format) but no Timestamp column"),
        ('{"timestamp": 0, "input_length": ' + "9" * 400 + ', "output_length": 5}\n', ":1: input_length is " + "9" * 400 + ", over 2,147,483,647 tokens"),
        ("num_prefill_tokens,num_decode_tokens\n" + "9" * 400 + ",6\n", ":2: num_prefill_tokens is '" + "9" * 400 + "', over 2,147,483,647 tokens"),
        ('{"timestamp": ' + "9" * 400 + ', "input_length": 5, "output_length": 5}\n', ":1: timestamp is " + "9" * 400 + ", too large"),
        ('{"timestamp": 0, "input_length": ' + "9" * 5000 + ', "output_length": 5}\n', ":1: a number has over 4,300 digits"),
        ("\nnum_prefill_tokens,num_decode_tokens\n5,6\n", ":1: the first line is blank"),
        ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46+99:99,10,5\n", ":2: TIMESTAMP is '2023-11-16 18:15:46+99:99', not a time"),
        ('{"timestamp": 0, "input_length": 5, "input_length": -5, "output_length": 3}\n', ":1: field(s) input_length given twice"),
        ('\n{"timestamp": 0, "input_length": 5, "output_length": 3}\n', ":1: the first line is blank"),
        ("ContextTokens,GeneratedTokens\r100,20\r200,30\r", ":1: lines end in a bare carriage return"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n-1.5,10,5\n", ":3: arrived_at is '-1.5', not a time (seconds >= 0)"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\nnan,10,5\n", ":3: arrived_at is 'nan', not a time"),
        ("num_prefill_tokens,num_decode_tokens\n5,6\n,\n", ":3: num_prefill_tokens is '', not a number"),
        ("num_prefill_tokens,num_decode_tokens\n3_74,6\n", ":2: num_prefill_tokens is '3_74', not a number"),
        ("num_prefill_tokens,num_decode_tokens\n5,6\nnum_prefill_tokens,num_decode_tokens\n", ":3: num_prefill_tokens is 'num_prefill_tokens', not a number (the header again: two files joined into one?)"),
        ("num_prefill_tokens,num_decode_tokens\n\uff13\uff14,6\n", ":2: num_prefill_tokens is '\uff13\uff14', not a number"),
        ("arrived_at,num_prefill_tokens,num_decode_tokens\n1_0.5,10,5\n", ":2: arrived_at is '1_0.5', not a time"),
    ],
)
def test_bad_rows_name_file_line_and_problem(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, "bad.jsonl" if text.startswith("{") else "bad.csv", text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(path) in str(err.value) and message in str(err.value)


@pytest.mark.parametrize(
    ("times", "arrival_s"),
    [
        (["2023-11-16 18:00:00", "2023-11-16T18:00:01.25"], [0.0, 1.25]),
        (["2023-11-16 18:00:00Z", "2023-11-16 19:30:00.5+01:00"], [0.0, 1800.5]),
        (["2023-11-16 18:00:00-05:30", "2023-11-16 23:30:00Z"], [0.0, 0.0]),
    ],
)
def test_azure_times_with_and_without_a_zone(
    tmp_path: Path, times: list[str], arrival_s: list[float]
) -> None:
    path = write(tmp_path, "t.csv", AZURE + "".join(f"{t},10,5\n" for t in times))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # numpy's timezone warning must not leak
        assert load_trace(path).arrival_s.tolist() == pytest.approx(arrival_s)


def test_skip_bad_rows_counts_them(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "burst.csv",
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
        "5.0,ChatGPT,100,20,120,Conversation log\n"
        "6.5,ChatGPT,50,0,50,Conversation log\n"
        "7.0,GPT-4,30,10,40,API log\n",
    )
    with pytest.raises(TraceError, match=r":3: Response tokens is 0.*\(--bad-rows skip"):
        load_trace(path)
    trace = load_trace(path, bad_rows="skip")
    assert (trace.format, len(trace), trace.skipped_rows) == ("burstgpt", 2, 1)
    assert trace.first_skipped == f"{path}:3: Response tokens is 0; a request needs at least 1 token"
    assert trace.arrival_s.tolist() == [0.0, 2.0]
    workload = make_workload(str(path), "replay", bad_rows="skip")
    assert (len(workload), workload.skipped_rows) == (2, 1)
    assert workload.fit_context(64, "drop").skipped_rows == 1  # the count stays with it
    assert make_workload(str(path), "replay", num_requests=1, bad_rows="skip").skipped_rows == 1


def test_a_trace_of_only_bad_rows_is_refused_even_when_skipping(tmp_path: Path) -> None:
    path = write(tmp_path, "bad.csv", "num_prefill_tokens,num_decode_tokens\n5,0\n0,3\n")
    with pytest.raises(TraceError, match=r"bad\.csv: all 2 rows are bad; the first: .*:2: num_decode"):
        load_trace(path, bad_rows="skip")


@pytest.mark.parametrize("source", ["embedded:gsm8k", "fixed:8:8"])
def test_bad_rows_takes_error_or_skip(source: str) -> None:
    with pytest.raises(WorkloadError, match="bad_rows is 'drop'; one of error, skip"):
        make_workload(source, "poisson:1", num_requests=2, bad_rows="drop")


def test_a_trace_shorter_than_the_requests_asked_for_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, "short.csv", "num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n")
    assert len(make_workload(str(path), "poisson:1", num_requests=2).requests) == 2
    assert len(make_workload(str(path), "poisson:1").requests) == 2
    with pytest.raises(WorkloadError, match=r"short\.csv: the trace holds 2 requests, fewer than the 3"):
        make_workload(str(path), "poisson:1", num_requests=3)


def test_mooncake_jsonl(tmp_path: Path) -> None:
    rows = [
        {"timestamp": 2000, "input_length": 10, "output_length": 3, "hash_ids": [1]},
        {"timestamp": 500, "input_length": 20, "output_length": 4, "hash_ids": [2, 3]},
    ]
    path = write(tmp_path, "m.jsonl", "\n".join(json.dumps(r) for r in rows) + "\n")
    trace = load_trace(path)
    assert trace.format == "mooncake"
    assert trace.arrival_s.tolist() == [0.0, 1.5]  # ms -> s, sorted by time
    assert trace.prompt_tokens.tolist() == [20, 10]


def test_bailian_jsonl_counts_seconds(tmp_path: Path) -> None:
    """Alibaba's Bailian (Qwen) usage traces share Mooncake's field names but count seconds;
    their chat_id tells them apart (read as milliseconds, the load would be 1000x)."""
    rows = [
        {"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 521,
         "output_length": 132, "type": "text", "turn": 1, "hash_ids": [1]},
        {"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 400,
         "output_length": 80, "type": "text", "turn": 2, "hash_ids": [2]},
        {"chat_id": 161, "parent_chat_id": -1, "timestamp": 60.0, "input_length": 10,
         "output_length": 5, "type": "search", "turn": 1, "hash_ids": []},
    ]  # fmt: skip
    text = "\n".join(json.dumps(r) for r in rows) + "\n"
    trace = load_trace(write(tmp_path, "qwen_traceA_blksz_16.jsonl", text.replace("}\n", "}\n\n", 1)))
    assert trace.format == "bailian"
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 1.114, 2.5])
    assert trace.prompt_tokens.tolist() == [10, 521, 400]
    bad = text + '{"chat_id": 162, "timestamp": -1, "input_length": 3, "output_length": 1}\n'
    with pytest.raises(TraceError, match=r"b\.jsonl:4: timestamp is -1; need a time >= 0 \(s\)"):
        load_trace(write(tmp_path, "b.jsonl", bad))
    # no chat_id in the first object: Mooncake's milliseconds, as before
    mooncake = "\n".join(json.dumps({k: r[k] for k in r if k != "chat_id"}) for r in rows)
    assert load_trace(write(tmp_path, "m.jsonl", mooncake)).arrival_s[-1] == pytest.approx(2.5e-3)
    # a first line that is no JSON object is the row reader's error, with its line; skipped,
    # the next object still says Bailian
    with pytest.raises(TraceError, match=r"c\.jsonl:1: not valid JSON"):
        load_trace(write(tmp_path, "c.jsonl", "{nope\n" + text))
    skipped = load_trace(write(tmp_path, "d.jsonl", "{nope\n" + text), bad_rows="skip")
    assert (skipped.format, skipped.skipped_rows, skipped.arrival_s[-1]) == ("bailian", 1, 2.5)
    # one file, one format: a first object without chat_id once made a Bailian file's later
    # rows milliseconds, silently
    late = json.dumps({k: rows[0][k] for k in rows[0] if k != "chat_id"}) + "\n" + text
    with pytest.raises(TraceError, match=r"e\.jsonl:2: a chat_id, where the file's first object is Mooncake's"):
        load_trace(write(tmp_path, "e.jsonl", late))
    early = text + json.dumps({k: rows[0][k] for k in rows[0] if k != "chat_id"}) + "\n"
    with pytest.raises(TraceError, match=r"f\.jsonl:4: no chat_id, where the file's first object is Bailian's"):
        load_trace(write(tmp_path, "f.jsonl", early))


VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,374,44\n4.314579,396,109\n2.5,10,5\n"


@pytest.mark.parametrize(
    "text",
    [
        VIDUR,
        # arxiv_summarization's columns, the time last
        "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio,arrived_at\n374,44,418,8.5,0\n396,109,505,3.6,4.314579\n10,5,15,2.0,2.5\n",
    ],
)
def test_vidur_traces_replay_their_arrived_at(tmp_path: Path, text: str) -> None:
    """Vidur's processed traces were read as ShareGPT lengths, their arrival times ignored."""
    path = write(tmp_path, "splitwise_conv.csv", text)
    trace = load_trace(path)
    assert trace.format == "vidur"
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 2.5, 4.314579])
    assert trace.prompt_tokens.tolist() == [374, 10, 396]
    assert trace.output_tokens.tolist() == [44, 5, 109]
    workload = make_workload(str(path), "replay")
    assert [r.arrival_s for r in workload.requests] == pytest.approx([0.0, 2.5, 4.314579])


@pytest.mark.parametrize(
    ("rows", "first", "last"),
    [
        (["8,\"ChatGPT,508,229,737,API log"] + ["9,ChatGPT,10,5,15,API log"] * 3
         + ["12,\"ChatGPT,14,6,20,API log"], 3, 7),  # closed lines later: one plausible row
        (["9,ChatGPT,10,5,15,API log"] * 2 + ["8,\"ChatGPT,508,229,737,API log"]
         + ["9,ChatGPT,10,5,15,API log"] * 3, 5, 8),  # never closed: on to the end
    ],
)  # fmt: skip
@pytest.mark.parametrize("bad_rows", ["error", "skip"])
def test_a_stray_quote_is_refused_naming_its_line(
    tmp_path: Path, rows: list[str], first: int, last: int, bad_rows: str
) -> None:
    """A stray quote joined the lines up to the next quote into one row: 100 rows read as
    55 with nothing skipped, one line's time with another's lengths."""
    header = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n"
    path = write(tmp_path, "burst.csv", header + "0,ChatGPT,5,5,10,API log\n" + "\n".join(rows) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(path, bad_rows=bad_rows)
    assert str(err.value).startswith(
        f"{path}:{first}: a quote opened on this line runs on to line {last}, joining lines "
    )


def test_a_quoted_text_over_several_lines_is_read(tmp_path: Path) -> None:
    """A prompt column's text over lines is no stray quote (the check refused it once)."""
    text = 'num_prefill_tokens,num_decode_tokens,prompt\n5,6,"Hello,\nhow are you?"\n7,8,"a\n\nb"\n9,1,x\n'
    trace = load_trace(write(tmp_path, "prompts.csv", text))
    assert trace.prompt_tokens.tolist() == [5, 7, 9] and trace.output_tokens.tolist() == [6, 8, 1]


def test_a_replayed_trace_names_its_format_span_and_rate(tmp_path: Path) -> None:
    """A JSONL in seconds without Bailian's chat_id is read as Mooncake's milliseconds: the
    replay ran 1000x too fast and nothing said so."""
    rows = [{"timestamp": t, "input_length": 10, "output_length": 5} for t in (0, 1, 2, 4)]
    path = write(tmp_path, "mine.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    assert make_workload(str(path), "replay").name == (
        "mine (replay: mooncake trace, 4 requests over 0.004 s, 750/s)"
    )
    assert make_workload(str(path), "replay:0.5", num_requests=3).name.endswith(
        ": mooncake trace, 3 requests over 0.004 s, 500/s)"
    )
    lengths = write(tmp_path, "lengths.csv", "num_prefill_tokens,num_decode_tokens\n10,5\n")
    with pytest.raises(WorkloadError, match=f"^{lengths}: a sharegpt length table has no timestamps"):
        make_workload(str(lengths), "replay")  # which of several --workload was not said


def test_a_trace_path_under_home_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--workload=~/t.csv@replay` or a config's ``source: ~/t.csv``: no shell expands the ~."""
    monkeypatch.setenv("HOME", str(tmp_path))
    write(tmp_path, "t.csv", VIDUR)
    assert load_trace("~/t.csv").prompt_tokens.tolist() == [374, 10, 396]
    with pytest.raises(WorkloadError, match=r"the trace holds 3 requests, fewer than the 4"):
        make_workload("~/t.csv", "replay", num_requests=4)


def test_a_space_after_the_comma_reads_as_the_number(tmp_path: Path) -> None:
    """Trace cells are read as float() reads them around the number (a flag's or a spec's
    '+5' and ' 5' are refused: `plain_float`)."""
    path = write(tmp_path, "spaced.csv", VIDUR.replace(",", ", ").replace("\n2.5", "\n +2.5"))
    trace = load_trace(path)
    assert trace.arrival_s.tolist() == pytest.approx([0.0, 2.5, 4.314579])
    assert trace.prompt_tokens.tolist() == [374, 10, 396]


def test_a_length_csv_without_arrived_at_stays_untimed(tmp_path: Path, traces: Path) -> None:
    path = write(tmp_path, "arxiv.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n3772,54,3826,69.8\n")
    trace = load_trace(path)
    assert (trace.format, trace.arrival_s, trace.prompt_tokens.tolist()) == ("sharegpt", None, [3772])
    shared = load_trace(traces / "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv")
    assert (shared.format, shared.arrival_s) == ("sharegpt", None)
    # only a format sharing its token columns with an untimed one gives way when its time is missing
    path = write(tmp_path, "azure.csv", "ContextTokens,GeneratedTokens\n1,2\n")
    with pytest.raises(TraceError, match=r"ContextTokens/GeneratedTokens \(azure format\) but no TIMESTAMP.*name those columns num_prefill_tokens,num_decode_tokens\)"):
        load_trace(path)


@pytest.mark.parametrize(
    "text",
    [
        '[{"id": "QWJhYvA_0", "conversations": [{"from": "human", "value": "hi"}]}]\n',
        '[\n  {\n    "id": "QWJhYvA_0",\n    "conversations": []\n  }\n]\n',
        ' [1, 2]\n',
    ],
)
def test_a_json_array_is_refused_naming_the_formats_read(tmp_path: Path, text: str) -> None:
    """ShareGPT_V3_unfiltered_cleaned_split.json was read as a CSV: 'duplicate header columns'."""
    path = write(tmp_path, "ShareGPT_V3_unfiltered_cleaned_split.json", text)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:1: a JSON array, not a trace format this reader knows")
    for known in ("Azure", "BurstGPT", "Vidur", "ShareGPT length CSV", "GSM8K", "Bailian JSONL"):
        assert known in message
    assert "needs tokenizing into a length CSV" in message and "more than once" not in message
    assert "go one JSON object a line (JSON Lines), not in an array" in message  # Mooncake's


@pytest.mark.parametrize("blank", ["   ", "\t", " \t ", "  \r", ""])
def test_whitespace_only_lines_are_skipped_like_blank_ones(tmp_path: Path, blank: str) -> None:
    """A line of spaces or a tab was 'the wrong number of fields'."""
    texts = {
        "azure": AZURE + f"2023-11-16 18:15:46,5,5\n{blank}\n2023-11-16 18:15:48,11,6\n{blank}\n",
        "sharegpt": f"num_prefill_tokens,num_decode_tokens\n5,5\n{blank}\n{blank}\n11,6\n{blank}",
        "mooncake": MOONCAKE_ROW + f"{blank}\n" + '{"timestamp": 2000, "input_length": 11, "output_length": 6}\n' + f"{blank}\n",
    }
    for fmt, text in texts.items():
        trace = load_trace(write(tmp_path, f"{fmt}.csv", text))
        assert (trace.format, trace.prompt_tokens.tolist(), trace.skipped_rows) == (fmt, [5, 11], 0)


def test_a_line_of_only_commas_is_still_a_bad_row(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "num_prefill_tokens,num_decode_tokens,pd_ratio\n10,5,2\n  \n,,\n11,6,2\n")
    with pytest.raises(TraceError, match=r"t\.csv:4: num_prefill_tokens is '', not a number"):
        load_trace(path)
    trace = load_trace(path, bad_rows="skip")
    assert (trace.prompt_tokens.tolist(), trace.skipped_rows) == ([10, 11], 1)
    assert trace.first_skipped.startswith(f"{path}:4: ")


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ("TIMESTAMP\tContextTokens\tGeneratedTokens", "the file looks tab-separated (its columns, split there, are the azure format's)"),
        ("num_prefill_tokens;num_decode_tokens", "the file looks semicolon-separated (its columns, split there, are the sharegpt format's)"),
        ("a\tb\tc", "the file looks tab-separated, and traces are read as comma-separated CSV"),
    ],
)
def test_a_tab_or_semicolon_separated_file_is_named(tmp_path: Path, header: str, message: str) -> None:
    sep = "\t" if "\t" in header else ";"
    path = write(tmp_path, "t.tsv", f"{header}\n" + sep.join(["2023-11-16 18:15:46", "10", "5"][-header.count(sep) - 1 :]) + "\n")
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert "unknown trace format" in str(err.value) and message in str(err.value), err.value
    assert f"convert the {'tabs' if sep == chr(9) else 'semicolons'} to commas" in str(err.value)


@pytest.mark.parametrize(
    ("name", "text", "hint"),
    [
        ("lc.csv", "timestamp,contexttokens,generatedtokens\n2023-11-16 18:15:46.68,10,5\n",
         "the names match the azure format's but for case: write TIMESTAMP, ContextTokens, GeneratedTokens"),
        ("t.jsonl", 'not json\n{"timestamp": 0, "input_length": 5, "output_length": 3}\n',
         "read as CSV because its first line is not a JSON object"),
    ],
)  # fmt: skip
def test_an_unknown_header_says_what_it_nearly_is(tmp_path: Path, name: str, text: str, hint: str) -> None:
    """A lower-case Azure header, or a .jsonl file whose first line is no JSON, got only the
    list of known column pairs."""
    with pytest.raises(TraceError, match="unknown trace format") as err:
        load_trace(write(tmp_path, name, text))
    assert hint in str(err.value)
    with pytest.raises(TraceError) as plain:
        load_trace(write(tmp_path, "x.csv", "a,b\n1,2\n"))
    assert "case" not in str(plain.value) and "JSON" not in str(plain.value)


def test_a_comma_header_with_a_tab_in_a_name_gets_no_separator_hint(tmp_path: Path) -> None:
    path = write(tmp_path, "t.csv", "a\tx,b\n1,2\n")
    with pytest.raises(TraceError, match="unknown trace format") as err:
        load_trace(path)
    assert "separated" not in str(err.value)


def test_gzip_traces_are_read_as_they_decompress(tmp_path: Path, traces: Path) -> None:
    """A .gz trace was refused with 'gunzip it first'."""
    for rel in ("gsm8k/gsm8k_test_token_lengths.csv", "azure2023/AzureLLMInferenceTrace_code.csv"):
        plain = load_trace(traces / rel)
        packed = tmp_path / (Path(rel).name + ".gz")
        with (traces / rel).open("rb") as source, gzip.open(packed, "wb") as sink:
            shutil.copyfileobj(source, sink)
        trace = load_trace(packed)
        assert (trace.name, trace.format, len(trace)) == (plain.name, plain.format, len(plain))
        assert np.array_equal(trace.prompt_tokens, plain.prompt_tokens)
        assert np.array_equal(trace.output_tokens, plain.output_tokens)
        assert (trace.arrival_s is None) == (plain.arrival_s is None)
        if plain.arrival_s is not None:
            assert np.array_equal(trace.arrival_s, plain.arrival_s)
    mooncake = tmp_path / "m.jsonl.gz"  # the magic, not the name, says gzip: any name reads
    mooncake.write_bytes(gzip.compress((MOONCAKE_ROW + '{"timestamp": 1000, "input_length": 9, "output_length": 2}\n').encode()))
    assert load_trace(mooncake).arrival_s.tolist() == [0.0, 1.0]
    renamed = tmp_path / "lengths.csv"
    renamed.write_bytes(gzip.compress(b"num_prefill_tokens,num_decode_tokens\n10,5\n"))
    assert load_trace(renamed).prompt_tokens.tolist() == [10]


class Terminal(io.StringIO):
    """A stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_a_large_trace_shows_its_read_on_a_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, traces: Path
) -> None:
    """A week of a trace read for a minute or more (row by row, far more) with nothing on the
    screen: a file of `PROGRESS_BYTES` or more now shows a bar of its bytes on a terminal's
    stderr (lowered here to 1 byte), gone when read, and reads as it did (plain, gzip, JSONL,
    an irregular CSV row by row, a name rich would read as markup or a format); a bad row's
    error is the same and leaves no bar running; --no-progress and worker processes show none."""
    conv = traces / "azure2023/AzureLLMInferenceTrace_conv.csv"
    quoted = tmp_path / "q{0}[b].csv"  # a quoted field: the vectorised reader leaves it
    quoted.write_text('num_prefill_tokens,num_decode_tokens\n"5",6\n7,8\n')
    packed = tmp_path / "conv.csv.gz"
    packed.write_bytes(gzip.compress(conv.read_bytes()))
    mooncake = tmp_path / "m.jsonl"
    mooncake.write_text(MOONCAKE_ROW + '{"timestamp": 1000, "input_length": 9, "output_length": 2}\n')
    bad = tmp_path / "bad.csv"
    bad.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n7,0\n")
    files = {conv: "reading AzureLLMInferenceTrace_conv.csv", packed: "reading conv.csv.gz",
             mooncake: "reading m.jsonl", quoted: "reading row by row q{0}[b].csv"}  # fmt: skip
    quiet = {path: load_trace(path) for path in files}
    with pytest.raises(TraceError) as unshown:
        load_trace(bad)
    monkeypatch.setattr(traces_module, "PROGRESS_BYTES", 1)
    monkeypatch.setattr(traces_module, "READ_PROGRESS", True)
    monkeypatch.setenv("TERM", "xterm")

    def read_on_a_terminal(path: Path) -> tuple[Any, str]:
        traces_module._read.cache_clear()
        screen = Terminal()
        monkeypatch.setattr("sys.stderr", screen)
        try:
            return load_trace(path), screen.getvalue()
        except TraceError as exc:
            return exc, screen.getvalue()

    for path, shown in files.items():
        trace, screen = read_on_a_terminal(path)
        assert shown in screen
        assert np.array_equal(trace.prompt_tokens, quiet[path].prompt_tokens)
        assert np.array_equal(trace.output_tokens, quiet[path].output_tokens)
        assert trace.arrival_s is None or np.array_equal(trace.arrival_s, quiet[path].arrival_s)
    error, screen = read_on_a_terminal(bad)
    assert "reading bad.csv" in screen and str(error) == str(unshown.value)
    bars = [t for t in threading.enumerate() if type(t).__name__ == "_RefreshThread"]
    for bar in bars:  # stopped, not joined, by rich: each ends at its next wake
        bar.join(timeout=5)
    assert not [bar for bar in bars if bar.is_alive()]
    monkeypatch.setattr(traces_module, "READ_PROGRESS", False)  # --no-progress
    assert read_on_a_terminal(conv)[1] == ""
    monkeypatch.setattr(traces_module, "READ_PROGRESS", True)
    monkeypatch.setattr("multiprocessing.parent_process", lambda: object())  # a worker
    assert read_on_a_terminal(conv)[1] == ""
    traces_module._read.cache_clear()
    monkeypatch.setattr("sys.stderr", io.StringIO())  # not a terminal: nothing shown
    load_trace(conv)
    assert sys.stderr.getvalue() == ""


def test_no_progress_turns_the_trace_readers_bar_off_for_the_command_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from batchpilot.training.cli import main

    trace = tmp_path / "t.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens\n5,6\n")
    seen = []

    def read(*_: object) -> None:
        seen.append(traces_module.READ_PROGRESS)
        raise TraceError("stop here")

    monkeypatch.setattr(traces_module, "_read", read)
    for flag in ("--no-progress", "--seed=1"):
        assert main(["simulate", "--workload", f"{trace}@poisson:1", flag]) == 2
    assert seen == [False, True]
    assert traces_module.READ_PROGRESS is True  # as before the command


def tar_of(data: bytes) -> bytes:
    """A tar archive of one file holding `data` (a trace as it is often downloaded)."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        info = tarfile.TarInfo("trace.csv")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (gzip.compress(b"num_prefill_tokens,num_decode_tokens\n5,6\n7,0\n"), ":3: num_decode_tokens is 0"),
        (gzip.compress(b"num_prefill_tokens,num_decode_tokens\n5,6\n\xff,3\n"), ":3: not UTF-8 text"),
        (gzip.compress(b"a,b\n1,2\n"), "unknown trace format"),
        (gzip.compress(gzip.compress(b"num_prefill_tokens,num_decode_tokens\n5,6\n")), ":1: the file is gzip-compressed twice"),
        (gzip.compress(("num_prefill_tokens,num_decode_tokens\n" + "5,6\n" * 50_000).encode())[:-200], "gzip-compressed but its data is corrupt or cut short"),
        (gzip.compress(b"num_prefill_tokens,num_decode_tokens\n5,6\n" + b"9" * 2**25), ":3: the line is over 16,777,216 bytes decompressed"),
        (bz2.compress(b"num_prefill_tokens,num_decode_tokens\n5,6\n"), ":1: the file is bzip2-compressed (bunzip2 it first)"),
        (gzip.compress(tar_of(b"num_prefill_tokens,num_decode_tokens\n5,6\n")), ":1: the file is a tar archive (extract the trace first)"),
    ],
    ids=["gzip-bad-row", "gzip-latin-1", "gzip-unknown", "gzip-twice", "gzip-cut-short", "gzip-long-line", "bzip2", "tar.gz"],
)
def test_compressed_traces_name_file_and_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "t.csv.gz"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value).startswith(str(path)) and message in str(err.value), err.value


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"[" + b'{"id": "x", "conversations": []},' * 600_000 + b"{}]", ":1: a JSON array, not a trace format"),
        (b"\x01" * 2**25, ":1: the line is over 16,777,216 bytes; a trace's rows are a line each"),
    ],
    ids=["json-array", "binary"],
)
def test_a_one_line_file_is_read_a_bounded_line_at_most(tmp_path: Path, data: bytes, message: str) -> None:
    """A plain file's first line was read whole (2x a 1.5 GB file's size in memory), then
    said to 'decompress' past the limit, and a large JSON array lost its hint."""
    import tracemalloc

    path = tmp_path / "t.json"
    path.write_bytes(data)
    tracemalloc.start()
    try:
        with pytest.raises(TraceError) as err:
            load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert message in str(err.value) and peak < 2 * 2**24 + 2**22 < len(data) * 2, (peak, err.value)


@pytest.mark.parametrize(
    ("header", "row"),
    [(b"num_prefill_tokens,num_decode_tokens\n", b"1,1\n"), (b"", b'{"timestamp": 0, "input_length": 5, "output_length": 3}\n')],
    ids=["csv-vectorised", "jsonl-row-by-row"],
)
def test_a_gzip_decompression_bomb_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, traces: Path, header: bytes, row: bytes
) -> None:
    """A 190 kB .gz of one repeated row read 2 GB into memory; real traces compress 2-5x and
    still read past the floor (here lowered to 1 MiB to keep the files small)."""
    monkeypatch.setattr(traces_module, "GZIP_FLOOR_BYTES", 2**20)
    bomb = tmp_path / "bomb.gz"
    bomb.write_bytes(gzip.compress(header + row * (2**21 // len(row))))
    with pytest.raises(TraceError) as err:
        load_trace(bomb)
    assert str(err.value).startswith(f"{bomb}: the gzip file decompresses to over 1,048,576 bytes")
    assert "decompression bomb" in str(err.value)
    real = tmp_path / "conv.csv.gz"  # 719 kB, about 4x its gzip size: under the ratio
    real.write_bytes(gzip.compress((traces / "azure2023/AzureLLMInferenceTrace_conv.csv").read_bytes()))
    monkeypatch.setattr(traces_module, "GZIP_FLOOR_BYTES", 0)
    assert len(load_trace(real)) == len(load_trace(traces / "azure2023/AzureLLMInferenceTrace_conv.csv"))


def test_missing_file() -> None:
    with pytest.raises(TraceError, match="no such trace file"):
        load_trace("/nonexistent/trace.csv")


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("poisson", "takes 1 argument"),
        ("poisson:-1", "must be > 0"),
        ("gamma:2", "takes 2 argument"),
        ("gamma:2:x", "CV 'x' is not a number"),
        ("gamma:1:1e300", r"CV must be in \[0.01, 100\]"),
        ("gamma:1:1e-200", r"CV must be in \[0.01, 100\]"),
        ("uniform:3", "unknown process 'uniform'"),
        ("replay:1:2", "at most one SCALE"),
        # a rate that underflowed a gap's shape to 0 (ZeroDivisionError), a ramp whose span
        # overflowed, or one whose ratio made NaN arrival times
        ("gamma:1e-320:100", r"gamma arrivals: rate \(req/s\) must be in \[1e-06, 1e\+06\], got 9.99989e-321"),
        ("ramp:1e308:1e308", r"rate \(req/s\) must be in \[1e-06, 1e\+06\], got 1e\+308"),
        ("ramp:1:1e160", "got 1e\\+160"),
        ("steps:1e308@0,1@100", "got 1e\\+308"),
        ("replay:1e-320", r"replay arrivals: scale must be in \[1e-06, 1e\+06\]"),
        ("ramp:1:2:1e20", r"ramp arrivals: a time of 1e\+20 s is past 1e\+08 s"),
        ("steps:1@0,2@1e12", "a time of 1e\\+12 s is past"),
        ("ramp:1:2:1e-320", r"a ramp over 1e-320 s is shorter than 0.001 s"),  # NaN times
    ],
)
def test_bad_arrival_specs(spec: str, message: str) -> None:
    with pytest.raises(ArrivalSpecError, match=message):
        Arrival.parse(spec)


@pytest.mark.parametrize("arrival", ["poisson:1e-6", "gamma:1e-6:2", "steps:1@0,1e-6@1", "replay:1e-6"])
def test_arrivals_spanning_years_are_refused(tmp_path: Path, arrival: str) -> None:
    """The lowest rate a spec may give, over 200 requests: a run of 6 years, which would
    score nothing."""
    rows = "".join(f"2023-11-16 18:{s // 60:02d}:{s % 60:02d},10,5\n" for s in range(200))
    path = write(tmp_path, "t.csv", AZURE + rows)
    with pytest.raises(ArrivalSpecError, match=r"200 requests arrive over .* s, more than 1e\+08 s"):
        make_workload(str(path), arrival, num_requests=200)


@pytest.mark.parametrize("start", ["0", "0.00", "0e3", " 0", "0 "])
def test_a_first_step_may_start_at_any_spelling_of_zero(start: str) -> None:
    """``steps:5@0.00,...`` said "start must be > 0, got 0.00" beside "the first step must
    start at 0"; spaces around it are a number's as elsewhere."""
    assert Arrival.parse(f"steps:5@{start},1@10").steps == ((0.0, 5.0), (10.0, 1.0))


def test_fixed_lengths_past_a_traces_ceiling_are_refused() -> None:
    with pytest.raises(WorkloadError, match=r"token counts must be in \[1, 2,147,483,647\]"):
        make_workload("fixed:99999999999:5", "poisson:1", num_requests=2)


def test_mix_weights_are_relative_however_large() -> None:
    w = make_workload("mix:gsm8k=1e308,sharegpt=1e308", "poisson:1", num_requests=50)
    assert len(w.requests) == 50


@pytest.mark.parametrize("value", ["15", [True, True], ["0.5", "2"], [1, 2, 3], 2, [1, 10**400]])
def test_scale_ranges_are_two_numbers(value: object) -> None:
    """'15' once read as (1, 5): every value was passed to float()."""
    with pytest.raises(ValueError, match="rate_scale must be"):
        scale_range(value, "rate_scale")
    assert scale_range([1, 2.5], "rate_scale") == (1.0, 2.5)
    with pytest.raises(ValueError, match=r"must lie within \[0.001, 1000\], got \[1e-300, 1\]"):
        scale_range([1e-300, 1], "prompt_scale")
    assert scale_range([1e-3, 1e3], "rate_scale") == (1e-3, 1e3)


def test_arrival_processes_have_their_rates_and_cv() -> None:
    rng = np.random.default_rng(0)
    n = 20000
    t = Arrival.parse("poisson:4").times(n, rng)
    assert (n - 1) / t[-1] == pytest.approx(4, rel=0.03)
    gaps = np.diff(Arrival.parse("gamma:2:3").times(n, rng))
    assert 1 / gaps.mean() == pytest.approx(2, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(3, rel=0.1)
    assert Arrival.parse("all-at-once").times(5, rng).tolist() == [0] * 5
    replay = Arrival.parse("replay:2").times(3, rng, np.array([10.0, 12.0, 16.0]))
    assert replay.tolist() == [0.0, 1.0, 3.0]
    with pytest.raises(ArrivalSpecError, match="needs a trace with timestamps"):
        Arrival.parse("replay").times(3, rng, None)


def test_embedded_tables_reproduce_the_traces(traces: Path) -> None:
    assert embedded_names() == ["azure-code", "azure-conv", "gsm8k", "sharegpt"]
    shipped = json.loads(
        (Path(__file__).parents[1] / "envs/data/embedded_workloads.json").read_text()
    )
    assert derive(traces) == shipped  # the committed file is what the script derives
    table = embedded_lengths("azure-conv")
    prompt, output = table.sample(50000, np.random.default_rng(1))
    assert np.median(prompt) == pytest.approx(1020, rel=0.05)
    assert np.median(output) == pytest.approx(129, rel=0.05)
    assert prompt.mean() == pytest.approx(1155, rel=0.05)


def test_the_tables_tool_names_a_missing_trace(tmp_path: Path, monkeypatch, capsys) -> None:
    """`python -m batchpilot.envs.embedded DIR`: a traceback for a folder without the traces,
    then a workload source's hint ("the embedded workloads need no file")."""
    from batchpilot.envs import embedded

    monkeypatch.setattr("sys.argv", ["embedded", str(tmp_path), "--out", str(tmp_path / "t.json")])
    with pytest.raises(SystemExit) as done:
        embedded.main()
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "AzureLLMInferenceTrace_conv.csv: no such file; TRACES_DIR is the shared traces" in err
    assert not (tmp_path / "t.json").exists()


def test_make_workload_is_deterministic_per_seed() -> None:
    a = make_workload("embedded:sharegpt", "poisson:3", num_requests=50, seed=7)
    b = make_workload("embedded:sharegpt", "poisson:3", num_requests=50, seed=7)
    c = make_workload("embedded:sharegpt", "poisson:3", num_requests=50, seed=8)
    assert list(a.requests) == list(b.requests) and list(a.requests) != list(c.requests)
    with pytest.raises(ArrivalSpecError, match="no timestamps"):
        make_workload("embedded:gsm8k", "replay")
    # where no arrival is given, the error never said that replay was the default
    for source in ("embedded:gsm8k", "mix:sharegpt=1", "shift:gsm8k@0,sharegpt@20"):
        with pytest.raises(ValueError, match=r"\(replay is also the arrival where none is given\)"):
            make_workload(source)
    with pytest.raises(ValueError, match="unknown embedded workload") as caught:
        make_workload("embedded:nope")
    assert "two keys" not in str(caught.value)
    # the command line's SOURCE@ARRIVAL in a config or suite's source
    with pytest.raises(ValueError, match="give source: embedded:gsm8k and arrival: poisson:4 as"):
        make_workload("embedded:gsm8k@poisson:4")
    # so for every source: the others were "use fixed:PROMPT:OUTPUT", "is not NAME=WEIGHT" and
    # "no trace file"
    for source, arrival in (("fixed:64:16", "poisson:2"), ("mix:sharegpt=1,gsm8k=1", "gamma:2:3"),
                            ("traces/conv.csv", "replay:2"), ("embedded:gsm8k", "steps:1@0,2@10")):  # fmt: skip
        with pytest.raises(ValueError, match=f"give source: {source} and arrival: {arrival} as"):
            make_workload(f"{source}@{arrival}")
    shift = make_workload("shift:gsm8k@0,sharegpt@20/40", "poisson:2", num_requests=5)
    assert len(shift) == 5  # its '@'s are phase starts


def test_overlong_policy_is_explicit() -> None:
    w = Workload.from_requests("w", [Request("a", 0, 100, 50), Request("b", 1, 10, 5)])
    with pytest.raises(WorkloadError, match="request a needs 150 tokens"):
        w.fit_context(64, "error")
    dropped = w.fit_context(64, "drop")
    assert [r.request_id for r in dropped.requests] == ["b"] and dropped.dropped == 1
    with pytest.raises(WorkloadError, match="all 2 requests are longer than the model's context of 8"):
        w.fit_context(8, "drop")
    cut = w.fit_context(64, "truncate")
    assert (cut.requests[0].prompt_tokens, cut.requests[0].output_tokens) == (14, 50)
    assert cut.truncated == 1


def test_scaled_lengths_round_and_fit_a_context_when_given_one() -> None:
    w = Workload.from_requests("w", [Request("a", 0, 100, 50), Request("b", 1, 3, 1)])
    assert w.scaled() is w
    doubled = w.scaled(2.0, 0.5)
    assert [(r.prompt_tokens, r.output_tokens) for r in doubled.requests] == [(200, 25), (6, 1)]
    cut = w.scaled(2.0, 1.0, max_model_len=220)  # the prompt kept, the output cut to fit
    assert [(r.prompt_tokens, r.output_tokens) for r in cut.requests] == [(200, 20), (6, 1)]
    assert w.scaled(10.0, 1.0, max_model_len=220).requests[0].prompt_tokens == 219


@pytest.mark.parametrize(
    ("columns", "message"),
    [
        (([0.0, 1.0], [5], [5]), r"prompt_tokens must be one value a request \(2 requests\)"),
        (([0.0], [2.5], [5]), r"prompt_tokens\[0\] is 2.5; token counts are whole numbers"),
        (([0.0], [5], [float("nan")]), r"output_tokens\[0\] is nan"),
        (([0.0], [float("inf")], [5]), "prompt_tokens holds counts past"),
        (([[0.0]], [5], [5]), r"arrival_s must be one value a request, got shape \(1, 1\)"),
        ((["soon"], [5], [5]), "arrival_s must be numbers"),
        (([0.0], [True], [5]), "prompt_tokens must be numbers, got bool"),
        (([0.0], [2**62], [1]), "prompt_tokens holds counts past"),
    ],
)
def test_bad_columns_are_named(columns: tuple[list, list, list], message: str) -> None:
    with pytest.raises(WorkloadError, match=message):
        Workload("w", *columns)


def test_a_workload_is_its_columns_sorted_by_arrival_and_read_only() -> None:
    w = Workload("w", [2.0, 0.5, 1.0], [30, 10, 20], [3.0, 1.0, 2.0], ["c", "a", "b"])
    assert [r.request_id for r in w.requests] == ["a", "b", "c"]
    assert w.requests[-1] == Request("c", 2.0, 30, 3) and w.output_tokens.dtype == np.int64
    assert [r.prompt_tokens for r in w.requests[1:]] == [20, 30]
    with pytest.raises(ValueError, match="read-only"):
        w.prompt_tokens[0] = 1


def test_a_workload_keeps_its_own_copy_and_names_the_first_bad_request() -> None:
    prompt = np.array([5, 6])
    w = Workload("w", [0.0, 1.0], prompt, [1, 1])
    prompt[0] = 0  # the caller's array, not the workload's
    assert w.prompt_tokens[0] == 5
    with pytest.raises(WorkloadError, match=r"request a has arrival_s=-1\.0"):
        Workload.from_requests("w", [Request("a", -1.0, 1, 1), Request("b", 0.0, 0, 1)])
    big = Workload("w", [0.0], [2**40], [1]).scaled(2.0**30)  # past int64: capped, not wrapped
    assert big.prompt_tokens[0] == MAX_COUNT - 1


def test_bad_requests_are_rejected() -> None:
    with pytest.raises(WorkloadError, match="prompt_tokens=0"):
        Workload.from_requests("w", [Request("a", 0, 0, 5)])
    with pytest.raises(WorkloadError, match="arrival_s=nan"):
        Workload.from_requests("w", [Request("a", float("nan"), 3, 5)])


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
MOONCAKE_ROW = '{"timestamp": 0, "input_length": 5, "output_length": 3}\n'


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ((AZURE + "2023-11-16 18:15:46.68,10,5\n,10,5\n").encode(), ":3: TIMESTAMP is '', not a time"),
        ((AZURE + "2023-11-16 18:15:46.68,10,5\nNaT,10,5\n").encode(), ":3: TIMESTAMP is 'NaT', not a time"),
        ((MOONCAKE_ROW + '{"timestamp": null, "input_length": 5, "output_length": 3}\n').encode(), ":2: timestamp is None, not a number"),
        ((MOONCAKE_ROW + '{"timestamp": "abc", "input_length": 5, "output_length": 3}\n').encode(), ":2: timestamp is 'abc', not a number"),
        ((MOONCAKE_ROW + '{"timestamp": -5, "input_length": 5, "output_length": 3}\n').encode(), ":2: timestamp is -5"),
        ((MOONCAKE_ROW + '{"timestamp": 1, "input_length": true, "output_length": 3}\n').encode(), ":2: input_length is True, not a number"),
        ((MOONCAKE_ROW + '{"timestamp": 1, "input_length": 5, "output_length": "7"}\n').encode(), ":2: output_length is '7', not a number"),
        (b"\x1f\x8b\x08\x00" + bytes(range(256)), "gzip-compressed"),
        (b"num_prefill_tokens,num_decode_tokens\n5,6\n\x00\x01\x02\xff\xfe,3\n", ":3: binary data"),
        ("num_prefill_tokens,num_decode_tokens\n5,6\n7,8\n9,caf\u00e9\n".encode("latin-1"), ":4: not UTF-8 text"),
        (("num_prefill_tokens,num_decode_tokens\n5,6\n7," + "9" * 140_000 + "\n").encode(), ":3: a field is longer than 131,072 characters"),
        (b"\xff\xfe" + "num_prefill_tokens\n".encode("utf-16-le"), ":1: not UTF-8 text"),
        ((AZURE + "2023-11-16 18:15:46.68,10,5\n1970-01-01 00:00:01,10,5\n2023-11-16 18:15:47.68,10,5\n").encode(), ":3: this timestamp puts the trace's span at"),
        ((MOONCAKE_ROW + '{"timestamp": 1e300, "input_length": 5, "output_length": 3}\n').encode(), ":2: this timestamp"),
        ((MOONCAKE_ROW + "[" * 100_000 + "\n").encode(), ":2: JSON nested too deeply"),
    ],
    ids=["azure-empty-time", "azure-NaT", "mooncake-null-time", "mooncake-abc-time", "mooncake-negative-time", "mooncake-bool-length", "mooncake-string-length", "gzip", "binary", "latin-1", "huge-field", "utf-16", "azure-1970", "mooncake-1e300", "deep-json"],
)
def test_unreadable_traces_name_file_and_line(tmp_path: Path, data: bytes, message: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value).startswith(str(path)), err.value
    assert message in str(err.value), err.value


@pytest.mark.parametrize(
    ("text", "fmt"),
    [
        (AZURE + "2023-11-16 18:15:46.68,10,5\n2023-11-16 18:15:47.68,11,6\n", "azure"),
        ("Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type\n0,m,10,5,15,x\n2,m,11,6,17,x\n", "burstgpt"),
        ("num_prefill_tokens,num_decode_tokens\n10,5\n11,6\n", "sharegpt"),
        ("prompt_tokens_llama2,output_tokens_llama2\n10,5\n11,6\n", "gsm8k"),
        (MOONCAKE_ROW + '{"timestamp": 1000, "input_length": 11, "output_length": 6}\n', "mooncake"),
    ],
)
def test_a_utf8_bom_is_accepted_in_every_format(tmp_path: Path, text: str, fmt: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeff".encode() + text.encode())
    trace = load_trace(path)
    assert trace.format == fmt
    assert trace.prompt_tokens.tolist()[-1] == 11 and len(trace) == 2
    if trace.arrival_s is not None:
        assert trace.arrival_s.tolist() == pytest.approx([0.0, 1.0 if fmt in ("azure", "mooncake") else 2.0])


def test_a_header_saved_with_two_byte_order_marks_is_read(tmp_path: Path) -> None:
    """The second mark stuck to the first name: a timed Vidur trace was read as ShareGPT's
    lengths, its arrival times left out."""
    path = tmp_path / "t.csv"
    path.write_bytes("\ufeff\ufeff".encode() + b"arrived_at,num_prefill_tokens,num_decode_tokens\n0,10,5\n2,11,6\n")
    trace = load_trace(path)
    assert trace.format == "vidur" and trace.arrival_s.tolist() == [0.0, 2.0]
    jsonl = tmp_path / "t.jsonl"  # read as CSV, the first line not seen as JSON
    jsonl.write_bytes("\ufeff\ufeff".encode() + (MOONCAKE_ROW + '{"timestamp": 1000, "input_length": 11, "output_length": 6}\n').encode())
    assert load_trace(jsonl).format == "mooncake"


def test_a_time_column_named_but_for_case_is_named(tmp_path: Path) -> None:
    """'Arrived_At' made the file ShareGPT's lengths alone: replay said it had no timestamps,
    and poisson arrivals dropped the column silently."""
    path = tmp_path / "t.csv"
    path.write_text("Arrived_At,num_prefill_tokens,num_decode_tokens\n0,10,5\n2,11,6\n")
    with pytest.raises(TraceError, match=r"t.csv:1: column 'Arrived_At' is not 'arrived_at' but for case"):
        load_trace(path)


def test_missing_trace_suggests_the_embedded_workloads(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match=r"no such trace file.*embedded:azure-conv"):
        make_workload(str(tmp_path / "nope.csv"))


def test_a_directory_or_an_empty_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="a directory, not a trace file"):
        load_trace(tmp_path)
    os.mkfifo(tmp_path / "pipe.csv")
    with pytest.raises(TraceError, match=r"pipe\.csv: not a regular file"):
        load_trace(tmp_path / "pipe.csv")
    (tmp_path / "empty.csv").write_bytes(b"")
    with pytest.raises(TraceError, match=r"empty\.csv: the file is empty"):
        load_trace(tmp_path / "empty.csv")


def test_shift_source_draws_each_phase_from_its_own_table_and_repeats() -> None:
    w = make_workload("shift:gsm8k@0,azure-code@20/40", "poisson:10", num_requests=2000, seed=3)
    phase_b = [(r.arrival_s % 40) >= 20 for r in w.requests]
    prompts = np.array([r.prompt_tokens for r in w.requests])
    b = np.array(phase_b)
    assert b.any() and (~b).any() and max(r.arrival_s for r in w.requests) > 80  # >= 2 cycles
    assert np.median(prompts[~b]) < 200 < np.median(prompts[b])  # GSM8K ~68, Azure code ~2,000
    late_b = [r for r in w.requests if 60 <= r.arrival_s < 80]  # second cycle, phase B
    assert late_b and np.median([r.prompt_tokens for r in late_b]) > 200


def test_shift_source_without_period_stays_in_its_last_phase() -> None:
    w = make_workload("shift:azure-code@0,gsm8k@10", "poisson:10", num_requests=500, seed=0)
    assert all(r.prompt_tokens < 1000 for r in w.requests if r.arrival_s >= 10)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("shift:gsm8k@5,sharegpt@20", "first phase must start at 0"),
        ("shift:gsm8k@0,sharegpt@0", "starts increasing"),
        ("shift:gsm8k@0,sharegpt", "NAME@START_S"),
        ("shift:gsm8k@0,sharegpt@x", "NAME@START_S"),
        ("shift:gsm8k@0,nosuch@10", "nosuch"),
        ("shift:gsm8k@0,sharegpt@20/10", "period"),
        ("shift:gsm8k@0,sharegpt@20/abc", "period"),
        ("shift:gsm8k@0,sharegpt@20/", "the period '' must be a number"),  # was: no repeat
        ("shift:/data/trace.csv@0", "shift: takes embedded table names, not files"),
        ("shift:traces/x.csv@0", "shift: takes embedded table names, not files"),
        ("shift:/120", "'' is not NAME@START_S"),
        # never reached, where steps: refuses such times
        ("shift:sharegpt@0,gsm8k@1e300", "'gsm8k@1e300' is not NAME@START_S .* up to 1e"),
        ("shift:sharegpt@0,gsm8k@60/1e300", "period '1e300' .* up to 1e"),
    ],
)
def test_bad_shift_sources_are_named(source: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):  # WorkloadError, or the embedded table's
        make_workload(source, "poisson:1", num_requests=10)


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("mix:gsm8k=1,gsm8k=2", "'gsm8k' given twice; give it one weight"),
        ("mix:gsm8k=0,sharegpt=1", "'gsm8k=0' is not NAME=WEIGHT"),
        ("mix:gsm8k", "'gsm8k' is not NAME=WEIGHT"),
        # numbers as Python reads them but no spec means: separators, signs, other scripts
        ("mix:gsm8k=1_0", "'gsm8k=1_0' is not NAME=WEIGHT"),
        ("fixed:+32:8", "use fixed:PROMPT:OUTPUT with whole token counts"),
        ("fixed:\u0663\u0662:8", "use fixed:PROMPT:OUTPUT with whole token counts"),
        ("fixed:3_2:8", "use fixed:PROMPT:OUTPUT with whole token counts"),
    ],
)
def test_bad_mix_sources_are_named(source: str, problem: str) -> None:
    with pytest.raises(WorkloadError, match=problem):
        make_workload(source, "poisson:1", num_requests=10)


def test_arrival_rates_are_plain_numbers() -> None:
    with pytest.raises(ArrivalSpecError, match="rate '1_0' is not a number"):
        Arrival.parse("poisson:1_0")
    with pytest.raises(ArrivalSpecError, match="is not a number"):
        Arrival.parse("poisson:\u0662")
    assert Arrival.parse("poisson:2.5e0").rate == 2.5


def test_shift_source_cannot_replay_or_arrive_at_once() -> None:
    with pytest.raises(WorkloadError, match="no timestamps"):
        make_workload("shift:gsm8k@0,sharegpt@20", "replay", num_requests=10)
    with pytest.raises(WorkloadError, match="all-at-once arrives at 0 s, in the first phase"):
        make_workload("shift:gsm8k@0,sharegpt@20", "all-at-once", num_requests=10)
    assert len(make_workload("shift:gsm8k@0", "all-at-once", num_requests=10)) == 10


def test_a_pretty_printed_json_object_is_named_as_one(tmp_path: Path) -> None:
    path = write(tmp_path, "one.json", '{\n  "timestamp": 0,\n  "input_length": 5,\n  "output_length": 3\n}\n')
    with pytest.raises(TraceError, match=r"one\.json:1: not valid JSON .*an object spread over lines"):
        load_trace(path)
