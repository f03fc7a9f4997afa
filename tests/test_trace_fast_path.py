"""The vectorised CSV reader (`envs/trace_fast.py`) against the row-by-row one: the same
arrays, bit for bit, on regular files; on anything irregular it leaves the file to the row
reader, whose result or error (file, line and problem) `load_trace` gives unchanged."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest

from batchpilot.envs import trace_fast, traces
from batchpilot.envs.traces import SKIP_HINT, Trace, TraceError, load_trace

AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens"
VIDUR = "arrived_at,num_prefill_tokens,num_decode_tokens"
SHAREGPT = "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio"


def azure_lines(rows: int, seed: int, *, zones: bool) -> list[str]:
    """Azure rows over a week: fractions of 0 to 20 digits, 'T' or space, and with `zones`
    'Z', '+HH:MM' and '-HH:MM' suffixes on every time."""
    rng = np.random.default_rng(seed)
    start = np.datetime64("2023-11-16T18:00:00", "s").astype(np.int64)
    stamps = (start + rng.integers(0, 7 * 86400, rows)).astype("M8[s]").astype(str)
    lines = []
    for stamp in stamps:
        digits = int(rng.choice([0, 1, 3, 7, 7, 9, 15, 16, 20]))
        text = stamp.replace("T", str(rng.choice([" ", "T"])))
        text += "." + "".join(map(str, rng.integers(0, 10, digits))) if digits else ""
        if zones:
            sign = str(rng.choice(["+", "-"]))
            hh, mm = rng.integers(0, 24), rng.integers(0, 60)
            text += str(rng.choice(["Z", f"{sign}{hh:02d}:{mm:02d}"]))
        lines.append(f"{text},{rng.integers(1, 20000)},{rng.integers(1, 4000)}")
    return lines


def vidur_lines(rows: int, seed: int) -> list[str]:
    """Vidur rows: arrived_at as a float's repr (up to 17 digits), integers and '5.'-style."""
    rng = np.random.default_rng(seed)
    times = [repr(t) for t in np.cumsum(rng.exponential(0.3, rows)).tolist()]
    times[::7] = [str(rng.integers(0, 10**6)) for _ in times[::7]]
    times[3::11] = [f"{rng.integers(0, 999)}." for _ in times[3::11]]
    return [f"{t},{rng.integers(1, 9000)},{rng.integers(1, 900)}" for t in times]


def sharegpt_lines(rows: int, seed: int) -> list[str]:
    """ShareGPT rows; some token counts written '0123' or '123.0' (as pandas does)."""
    rng = np.random.default_rng(seed)
    lines = []
    for p, o in zip(rng.integers(1, 8000, rows), rng.integers(1, 2000, rows), strict=True):
        prompt = str(rng.choice([f"{p}", f"{p}", f"0{p}", f"{p}.0"]))
        lines.append(f"{prompt},{o},{p + o},{p / o!r}")
    return lines


def write(
    path: Path, header: str, lines: list[str], *, eol: str = "\n", packed: bool = False
) -> Path:
    data = (header + eol + eol.join(lines) + eol).encode()
    path.write_bytes(gzip.compress(data) if packed else data)
    return path


def assert_same(fast: Trace, slow: Trace) -> None:
    """Bit-identical arrays and the same counts."""
    assert (fast.name, fast.path, fast.format) == (slow.name, slow.path, slow.format)
    assert (fast.skipped_rows, fast.first_skipped) == (slow.skipped_rows, slow.first_skipped)
    for a, b in [
        (fast.prompt_tokens, slow.prompt_tokens),
        (fast.output_tokens, slow.output_tokens),
        (fast.arrival_s, slow.arrival_s),
    ]:
        assert (a is None) == (b is None)
        if a is not None:
            assert (a.dtype, a.shape) == (b.dtype, b.shape)
            assert a.tobytes() == b.tobytes()


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of a few hundred bytes: lines cross chunk boundaries everywhere."""
    monkeypatch.setattr(trace_fast, "CHUNK_BYTES", 333)


CASES = {
    "azure-2023": (AZURE, lambda: azure_lines(600, 1, zones=False), "\r\n"),
    "azure-zones": (AZURE, lambda: azure_lines(600, 2, zones=True), "\n"),
    "vidur": (VIDUR, lambda: vidur_lines(600, 3), "\n"),
    "sharegpt": (SHAREGPT, lambda: sharegpt_lines(600, 4), "\r\n"),
    "burstgpt": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        lambda: [f"{i * 0.5},GPT-4,{i + 1},{i % 7 + 1},0,Conversation log" for i in range(600)],
        "\n",
    ),
    "gsm8k": (
        "idx,prompt_tokens_llama2,output_tokens_llama2",
        lambda: [f"{i},{i + 5},{i + 9}" for i in range(600)],
        "\r\n",
    ),
}


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_fast_and_row_readers_agree_on_regular_files(
    tmp_path: Path, small_chunks: None, case: str, packed: bool
) -> None:
    header, lines, eol = CASES[case]
    path = write(tmp_path / f"{case}.csv", header, lines(), eol=eol, packed=packed)
    fast = traces._read_csv_fast(path)
    assert fast is not None, "the vectorised reader left a regular file to the row reader"
    assert_same(fast, traces._read_csv_rows(path, False))
    assert_same(load_trace(path), fast)
    assert_same(load_trace(path, bad_rows="skip"), fast)


@pytest.mark.parametrize("first", [2, 300], ids=["one chunk", "two chunks"])
@pytest.mark.parametrize("zone", ["Z", "+01:00"])
def test_azure_times_with_and_without_a_zone_in_one_file_are_refused(
    tmp_path: Path, small_chunks: None, first: int, zone: str
) -> None:
    """A time without a zone is read as UTC: beside times with one it may be hours off, and
    which are right is not known. Both readers accepted the mix; the file is refused, naming
    the first row whose style differs, whether it is in the first chunk or a later one, with
    --bad-rows skip too (which rows are right is the file's to say)."""
    lines = azure_lines(600, 5, zones=False)
    lines[first:] = [line.replace(",", f"{zone},", 1) for line in lines[first:]]
    path = write(tmp_path / "mixed.csv", AZURE, lines)
    assert traces._read_csv_fast(path) is None
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert f"{path}:{first + 2}: TIMESTAMP '{lines[first].split(',')[0]}' has a UTC offset" in str(err.value)
    assert f"where {path}:2's has none" in str(err.value)
    with pytest.raises(TraceError) as skipped:
        load_trace(path, bad_rows="skip")
    assert str(skipped.value) == str(err.value)
    assert "--bad-rows skip cannot choose which rows are right" in str(err.value)


@pytest.mark.parametrize(
    "text",
    [
        f"\ufeff{AZURE}\r\n2023-11-16 18:00:00.5,10,5\r\n\r\n\n2023-11-16 18:00:01,11,6",  # BOM, blank lines, no last newline
        f"{AZURE}\n\n\n2023-11-16T18:00:00Z,10,5\n2023-11-16 19:30:00.5+01:00,11,6\n\n",
        f"{AZURE}\n2023-11-16 18:00:00-05:30,10,5\n2023-11-16 23:30:00Z,11,6\n",
        f"{AZURE}\n2024-02-29 23:59:59.999999999999999,10,5\n0001-01-01 00:00:00,11,6\n",  # leap day; a span error row by row
        f"{AZURE}\n1970-01-01 00:00:00.000000000000000000001,10,5\n",
        f"{VIDUR}\n0.0,374,44\n4.314579,396,109\n2.5,10,5\n.5,1,1\n7.,2,2\n",
        f"{SHAREGPT}\n0000000000000000005,6,11,0.5\n7.000,8,15,0.8\n",
        '"num_prefill_tokens","num_decode_tokens"\n5,6\n',  # a quoted header
    ],
)
def test_fast_reader_edge_cases_match_the_row_reader(tmp_path: Path, text: str) -> None:
    path = tmp_path / "t.csv"
    path.write_bytes(text.encode())
    try:
        expected: Trace | str = traces._read_csv_rows(path, False)
    except TraceError as exc:
        expected = str(exc)
    fast = traces._read_csv_fast(path)
    if isinstance(expected, str):
        assert fast is None
        with pytest.raises(TraceError) as err:
            load_trace(path)
        assert str(err.value) == expected
    else:
        assert fast is not None
        assert_same(fast, expected)


BAD_ROWS = {
    # name: (the line replacing a good one, the row reader's problem)
    "zero-tokens": (
        "2023-11-16 18:00:00,10,0",
        "GeneratedTokens is 0; a request needs at least 1 token",
    ),
    "fraction-tokens": (
        "2023-11-16 18:00:00,10.5,3",
        "ContextTokens is '10.5', not a whole number",
    ),
    "missing-field": ("2023-11-16 18:00:00,10", "2 field(s) where the header has 3"),
    "extra-field": ("2023-11-16 18:00:00,10,5,1", "4 field(s) where the header has 3 (a trailing comma, or a number written 1,000?)"),
    "bad-time": ("2023-11-16 24:00:00,10,5", "TIMESTAMP is '2023-11-16 24:00:00', not a time"),
    "bad-second": ("2023-11-16 23:59:60,10,5", "TIMESTAMP is '2023-11-16 23:59:60', not a time"),
    "short-then-long": (
        "2023-11-16 18:00:00,10\r\n5,2023-11-16 18:00:00,10,5",  # 2 good rows' fields
        "2 field(s) where the header has 3",
    ),
    "bad-day": ("2023-02-29 18:00:00,10,5", "TIMESTAMP is '2023-02-29 18:00:00', not a time"),
    "bad-zone": (
        "2023-11-16 18:00:00+24:00,10,5",
        "TIMESTAMP is '2023-11-16 18:00:00+24:00', not a time",
    ),
    "basic-zone": (  # the ISO basic form: the message said nothing of how to write a zone
        "2023-11-16 18:00:00+0000,10,5",
        "TIMESTAMP is '2023-11-16 18:00:00+0000', not a time (a date and time like "
        "'2023-11-16 18:17:03.123', any zone as Z or +HH:MM)",
    ),
    "no-date": ("1700000000,10,5", "TIMESTAMP is '1700000000', not a time"),
    "latin-1": ("2023-11-16 18:00:00,10,5\udce9", "not UTF-8 text"),
    "nul": ("2023-11-16 18:00:00,10,5\x00", "binary data (NUL bytes)"),
    "bare-cr": (
        "2023-11-16 18:00:00,10,5\r2023-11-16 18:00:00,10,5",
        "lines end in a bare carriage return",
    ),
}


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("bad", sorted(BAD_ROWS))
def test_a_bad_row_deep_in_a_big_file_gets_the_row_readers_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, bad: str, packed: bool
) -> None:
    monkeypatch.setattr(trace_fast, "CHUNK_BYTES", 1 << 14)  # many chunks; the bad row in one
    lines = azure_lines(12_000, 5, zones=False)
    lines[10_000] = BAD_ROWS[bad][0]
    path = tmp_path / "big.csv"
    data = (AZURE + "\r\n" + "\r\n".join(lines) + "\r\n").encode("utf-8", "surrogateescape")
    path.write_bytes(gzip.compress(data) if packed else data)
    assert traces._read_csv_fast(path) is None
    with pytest.raises(TraceError) as err:
        load_trace(path)
    message = str(err.value)
    assert message.startswith(f"{path}:10002: {BAD_ROWS[bad][1]}"), message
    with pytest.raises(TraceError) as row_err:
        traces._read_csv_rows(path, False)
    assert message == str(row_err.value)
    assert message.endswith(f"({SKIP_HINT})") == (bad not in ("latin-1", "nul", "bare-cr"))


@pytest.mark.parametrize(
    ("ratio", "problem"),
    [
        ("0.5\udce9", "not UTF-8 text"),
        ("0.5\x00", "binary data (NUL bytes)"),
        ("0.\r5", "lines end in a bare carriage return"),
        ("1" * 140_000, "a field is longer than 131,072 characters"),
    ],
)
def test_bad_bytes_in_an_unread_column_get_the_row_readers_error(
    tmp_path: Path, ratio: str, problem: str
) -> None:
    lines = sharegpt_lines(3_000, 10)
    lines[2_000] = f"5,6,11,{ratio}"
    path = tmp_path / "ratio.csv"
    path.write_bytes((SHAREGPT + "\n" + "\n".join(lines) + "\n").encode("utf-8", "surrogateescape"))
    assert traces._read_csv_fast(path) is None
    with pytest.raises(TraceError) as err:
        load_trace(path)
    assert str(err.value).startswith(f"{path}:2002: {problem}"), err.value


def test_a_bad_timestamp_deep_in_a_big_file_is_named_by_its_line(tmp_path: Path) -> None:
    """The span check needs the line: the fast reader leaves it to the row reader."""
    lines = azure_lines(12_000, 6, zones=False)
    lines[9_000] = "1970-01-01 00:00:00,10,5"
    path = write(tmp_path / "span.csv", AZURE, lines)
    assert traces._read_csv_fast(path) is None
    with pytest.raises(
        TraceError, match=r"span\.csv:9002: this timestamp puts the trace's span at"
    ):
        load_trace(path)


def test_skipping_bad_rows_gives_the_row_readers_result(tmp_path: Path, small_chunks: None) -> None:
    lines = azure_lines(5_000, 7, zones=True)
    lines[10] = "2023-11-16 18:00:00Z,10,0"
    lines[4_000] = '"2023-11-16 18:00:00Z",10,5'  # quoted: a good row, read row by row
    lines[4_500] = "2023-11-16 18:00:00Z,x,5"
    path = write(tmp_path / "skip.csv", AZURE, lines)
    trace = load_trace(path, bad_rows="skip")
    assert_same(trace, traces._read_csv_rows(path, True))
    assert (len(trace), trace.skipped_rows) == (4_998, 2)
    assert (
        trace.first_skipped == f"{path}:12: GeneratedTokens is 0; a request needs at least 1 token"
    )
    with pytest.raises(TraceError, match=r"skip\.csv:12: GeneratedTokens is 0"):
        load_trace(path)


def test_irregular_but_good_rows_read_row_by_row(tmp_path: Path) -> None:
    """Quotes, whitespace-only lines and padded numbers are the csv module's to read."""
    lines = sharegpt_lines(3_000, 8)
    lines[100] = '"12","7",19,0.5'
    lines[2_000] = "   \t"
    lines[2_500] = " 42 ,7,49,6.0"
    path = write(tmp_path / "odd.csv", SHAREGPT, lines)
    assert traces._read_csv_fast(path) is None
    trace = load_trace(path)
    assert_same(trace, traces._read_csv_rows(path, False))
    assert (len(trace), trace.prompt_tokens[100], trace.prompt_tokens[2_499]) == (2_999, 12, 42)


def test_a_fast_read_trace_is_cached_and_read_only(tmp_path: Path) -> None:
    path = write(tmp_path / "cached.csv", AZURE, azure_lines(1_000, 9, zones=True))
    trace = load_trace(path)
    assert load_trace(path) is trace
    for column in (trace.prompt_tokens, trace.output_tokens, trace.arrival_s):
        assert not column.flags.writeable
    assert trace.prompt_tokens.dtype == np.int64 and trace.arrival_s.dtype == np.float64


BURSTGPT = "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"


def burstgpt_lines(rows: int, seed: int, *, failed: float = 0.0) -> list[str]:
    """BurstGPT rows: times in decimal seconds, and a `failed` share of failed requests, with
    0 response tokens (as the public trace logs them)."""
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.5, rows)).tolist()
    prompts, outputs = rng.integers(1, 3000, rows), rng.integers(1, 900, rows)
    outputs[rng.random(rows) < failed] = 0
    return [
        f"{t:.6f},ChatGPT,{p},{o},{p + o},Conversation log"
        for t, p, o in zip(times, prompts, outputs, strict=True)
    ]


def bad_tokens(line: str, prompt: str | None = None, output: str | None = None) -> str:
    """A BurstGPT line with its request and/or response tokens replaced."""
    fields = line.split(",")
    fields[2] = fields[2] if prompt is None else prompt
    fields[3] = fields[3] if output is None else output
    return ",".join(fields)


def out_of_range(line: str) -> bool:
    """A BurstGPT line with a token count out of range (every other field good)."""
    return bool(line) and any(not 1 <= float(v) <= traces.MAX_TOKENS for v in line.split(",")[2:4])


def skip_case(case: str) -> tuple[list[str], bool]:
    """BurstGPT lines (blank ones included) whose only bad rows have token counts out of
    range, and whether the file ends in a newline."""
    if case == "spread":  # 5% failed requests, blank lines before the first
        lines = burstgpt_lines(600, 22, failed=0.05)
        first = next(i for i, line in enumerate(lines) if out_of_range(line))
        assert first >= 10  # past the first chunks
        return ["", *lines[:first], "", "", *lines[first:]], True
    lines = burstgpt_lines(600, 21)
    if case == "prompt-and-output":
        lines[40] = bad_tokens(lines[40], prompt="0")  # the first: its prompt
        lines[41] = bad_tokens(lines[41], output="0.0")
        lines[300] = bad_tokens(lines[300], prompt="00", output="0")  # the prompt's error
        lines[400] = bad_tokens(lines[400], output="2147483648")
        lines[401] = bad_tokens(lines[401], prompt="3000000000.0")
        lines[402] = bad_tokens(lines[402], prompt="99999999999999999999")
        lines[500:500] = ["", ""]
        return [*lines[:20], "", "", *lines[20:]], True
    if case == "first-row":
        lines[0] = bad_tokens(lines[0], output="0")
        lines[1] = bad_tokens(lines[1], prompt="0")
        return lines, True
    assert case == "last-line"
    lines[-1] = bad_tokens(lines[-1], output="0")
    return [*lines[:-1], "", *lines[-1:]], False


@pytest.mark.parametrize("chunk", [7, 333, 1 << 20])
@pytest.mark.parametrize("eol", ["\n", "\r\n"], ids=["lf", "crlf"])
@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
@pytest.mark.parametrize("case", ["spread", "prompt-and-output", "first-row", "last-line"])
def test_skipping_out_of_range_tokens_fast_gives_the_row_readers_result(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str, packed: bool, eol: str, chunk: int
) -> None:
    monkeypatch.setattr(trace_fast, "CHUNK_BYTES", chunk)
    lines, last_newline = skip_case(case)
    text = BURSTGPT + eol + eol.join(lines) + (eol if last_newline else "")
    path = tmp_path / "burstgpt.csv"
    path.write_bytes(gzip.compress(text.encode()) if packed else text.encode())
    slow = traces._read_csv_rows(path, True)
    fast = traces._read_csv_fast(path, True)
    assert fast is not None, "the vectorised reader left a file of out-of-range tokens"
    assert_same(fast, slow)
    assert_same(load_trace(path, bad_rows="skip"), slow)
    first = next(i for i, line in enumerate(lines) if out_of_range(line)) + 2  # header: line 1
    assert fast.first_skipped.startswith(f"{path}:{first}: "), fast.first_skipped
    assert fast.skipped_rows == sum(map(out_of_range, lines))
    # reporting bad rows: as before, the row reader's error
    assert traces._read_csv_fast(path) is None
    with pytest.raises(TraceError) as err:
        load_trace(path)
    with pytest.raises(TraceError) as row_err:
        traces._read_csv_rows(path, False)
    assert str(err.value) == str(row_err.value)
    assert str(err.value) == f"{fast.first_skipped} ({SKIP_HINT})"


def test_skipped_rows_errors_name_their_problem(tmp_path: Path, small_chunks: None) -> None:
    lines = burstgpt_lines(200, 22)
    lines[50] = bad_tokens(lines[50], prompt="0", output="0")
    lines[60] = bad_tokens(lines[60], output="2147483648")
    path = write(tmp_path / "b.csv", BURSTGPT, ["", *lines])
    trace = traces._read_csv_fast(path, True)
    assert trace is not None and (len(trace), trace.skipped_rows) == (198, 2)
    assert (
        trace.first_skipped == f"{path}:53: Request tokens is 0; a request needs at least 1 token"
    )
    lines[50] = lines[51]
    path = write(tmp_path / "c.csv", BURSTGPT, lines)
    trace = traces._read_csv_fast(path, True)
    assert trace is not None and trace.first_skipped == (
        f"{path}:62: Response tokens is '2147483648', over 2,147,483,647 tokens: a bad value?"
    )


@pytest.mark.parametrize(
    "change",
    [
        "0,ChatGPT,5,0,5,Conversation log",  # a time out of order: still a good row's (kept)
        "x,ChatGPT,5,0,5,Conversation log",  # a bad time too: the row reader's
        "1.5,ChatGPT,5,1.5,5,Conversation log",  # not a whole number
        "1.5,ChatGPT,,0,5,Conversation log",  # no prompt
        '1.5,ChatGPT,"5",0,5,Conversation log',
        "1.5,ChatGPT,5,0,5",
        "1.5,ChatGPT,-1,0,5,Conversation log",
        "1.5,ChatGPT,5,0,5,Conversation log\r",  # a bare carriage return: the last line
    ],
)
def test_skipping_leaves_other_bad_rows_to_the_row_reader(tmp_path: Path, change: str) -> None:
    lines = burstgpt_lines(300, 23, failed=0.1)
    lines[-1] = change
    path = tmp_path / "mixed.csv"
    path.write_bytes((BURSTGPT + "\n" + "\n".join(lines)).encode())
    try:
        expected: Trace | str = traces._read_csv_rows(path, True)
    except TraceError as exc:
        expected = str(exc)
    fast = traces._read_csv_fast(path, True)
    if change.startswith("0,"):
        assert fast is not None
    else:
        assert fast is None
    if isinstance(expected, str):
        with pytest.raises(TraceError) as err:
            load_trace(path, bad_rows="skip")
        assert str(err.value) == expected
    else:
        assert_same(load_trace(path, bad_rows="skip"), expected)


@pytest.mark.parametrize("packed", [False, True], ids=["plain", "gzip"])
def test_a_file_of_only_bad_rows_gets_the_row_readers_error(tmp_path: Path, packed: bool) -> None:
    lines = [bad_tokens(line, output="0") for line in burstgpt_lines(50, 24)]
    path = write(tmp_path / "failed.csv", BURSTGPT, ["", *lines], packed=packed)
    with pytest.raises(TraceError) as row_err:
        traces._read_csv_rows(path, True)
    assert str(row_err.value) == (
        f"{path}: all 50 rows are bad; the first: {path}:3: Response tokens is 0; a request "
        "needs at least 1 token"
    )
    with pytest.raises(TraceError) as err:
        load_trace(path, bad_rows="skip")
    assert str(err.value) == str(row_err.value)


def test_skipping_agrees_with_the_row_reader_on_random_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Small random files of good rows, rows with token counts out of range, other bad rows
    and blank lines, in random chunk sizes: the same result or error, either reader."""
    rng = np.random.default_rng(25)
    tokens = ["0", "0", "00", "0.0", "7.0", "0007", "2147483647", "2147483648", "1.5", "x", ""]
    times = ["", "x", "-1", "1e3", "7.", ".5", "200000000"]
    fast_skips = 0
    for k in range(300):
        lines = []
        for i in range(int(rng.integers(1, 30))):
            fields = [f"{i * 0.37 + rng.random():.4f}", "m", *rng.integers(1, 99, 2).astype(str)]
            for j in (2, 3):
                if rng.random() < 0.15:
                    fields[j] = str(rng.choice(tokens[:8] if rng.random() < 0.9 else tokens))
            if rng.random() < 0.03:
                fields[0] = str(rng.choice(times))
            lines.extend([""] * int(rng.random() < 0.1) + [",".join([*fields, "9", "log"])])
        eol = str(rng.choice(["\n", "\r\n"]))
        text = BURSTGPT + eol + eol.join(lines) + eol * int(rng.random() < 0.7)
        path = tmp_path / f"r{k}.csv"
        path.write_bytes(gzip.compress(text.encode()) if rng.random() < 0.2 else text.encode())
        monkeypatch.setattr(trace_fast, "CHUNK_BYTES", int(rng.choice([1, 5, 16, 64, 4096])))
        try:
            expected: Trace | str = traces._read_csv_rows(path, True)
        except TraceError as exc:
            expected = str(exc)
        fast = traces._read_csv_fast(path, True)
        if fast is not None:
            assert not isinstance(expected, str), expected
            assert_same(fast, expected)
            fast_skips += fast.skipped_rows > 0
    assert fast_skips > 100  # the fast path took many files with rows to skip
