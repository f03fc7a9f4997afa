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
    'Z', '+HH:MM' and '-HH:MM' suffixes."""
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
            text += str(rng.choice(["", "Z", f"{sign}{hh:02d}:{mm:02d}"]))
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
    "missing-field": ("2023-11-16 18:00:00,10", "row has the wrong number of fields"),
    "extra-field": ("2023-11-16 18:00:00,10,5,1", "row has the wrong number of fields"),
    "bad-time": ("2023-11-16 24:00:00,10,5", "TIMESTAMP is '2023-11-16 24:00:00', not a time"),
    "bad-second": ("2023-11-16 23:59:60,10,5", "TIMESTAMP is '2023-11-16 23:59:60', not a time"),
    "short-then-long": (
        "2023-11-16 18:00:00,10\r\n5,2023-11-16 18:00:00,10,5",  # 2 good rows' fields
        "row has the wrong number of fields",
    ),
    "bad-day": ("2023-02-29 18:00:00,10,5", "TIMESTAMP is '2023-02-29 18:00:00', not a time"),
    "bad-zone": (
        "2023-11-16 18:00:00+24:00,10,5",
        "TIMESTAMP is '2023-11-16 18:00:00+24:00', not a time",
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
    lines[10] = "2023-11-16 18:00:00,10,0"
    lines[4_000] = '"2023-11-16 18:00:00",10,5'  # quoted: a good row, read row by row
    lines[4_500] = "2023-11-16 18:00:00,x,5"
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
