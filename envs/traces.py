"""Trace readers: Azure LLM inference CSV, BurstGPT CSV, Vidur's timed length CSV, length-only
CSVs (ShareGPT, GSM8K), and Mooncake and Bailian (Alibaba's Qwen usage traces) JSONL.

The format is detected from the file's header (or first JSON line). Files are read as
UTF-8 (byte order marks are skipped), gzip-compressed ones through `gzip` line by line;
blank and whitespace-only lines are skipped; every bad row, and every line that is not UTF-8
text, raises a `TraceError` naming the file, the line and the problem. A regular CSV file is
read in vectorised chunks (`trace_fast`), with the row-by-row reader's result; on anything
irregular that reader leaves the file to the row-by-row one, whose result or error stands.
A large file (`PROGRESS_BYTES`) shows the progress of its read where stderr is a terminal.
"""

from __future__ import annotations

import csv
import functools
import gzip
import io
import itertools
import json
import math
import multiprocessing
import re
import sys
import zlib
from array import array
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from batchpilot.envs import trace_fast
from batchpilot.envs.input_files import regular_file, user_path
from batchpilot.envs.json_objects import DuplicateKeys, unique_object
from batchpilot.envs.plain_numbers import is_number, plain_float


class TraceError(ValueError):
    """A trace file that cannot be read: unknown format or a bad row."""


class _FileError(TraceError):
    """A problem of the whole file found at one row (a mix of time styles): no row of it can
    be left out alone, so ``--bad-rows skip`` does not."""


@dataclass(frozen=True)
class Trace:
    """Token lengths of a trace, with arrival times (s from the first request) if it has them."""

    name: str
    path: str
    format: str
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None
    skipped_rows: int = 0
    """Bad rows left out (``bad_rows="skip"``)."""
    first_skipped: str = ""
    """The first left-out row's error (file, line and problem); empty if none."""

    def __len__(self) -> int:
        return len(self.prompt_tokens)


@dataclass(frozen=True)
class _CsvFormat:
    name: str
    prompt: str
    output: str
    time: str | None
    parse_time: Callable[[str], float] | None
    time_hint: str = ""
    """What a valid time looks like, for the error message."""


_DATE_TIME = re.compile(r"(\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d)(\.\d+)?(Z|([+-])(\d\d):(\d\d))?")


def _azure_time(text: str) -> float:
    """'2023-11-16 18:17:03.9799600' -> seconds since the epoch. A 'Z' or '+HH:MM' suffix is
    applied; anything but a date and time is a `ValueError` (numpy would read '1700000000'
    as a year)."""
    match = _DATE_TIME.fullmatch(text.strip())
    if match is None:
        raise ValueError(text)
    whole = np.datetime64(match[1].replace(" ", "T"), "s")  # ns would wrap past 2262
    seconds = float(whole.astype(np.int64)) + float(match[2] or 0)
    if match[4]:  # local time = UTC + offset
        if int(match[5]) > 23 or int(match[6]) > 59:
            raise ValueError(text)
        offset = int(match[5]) * 3600 + int(match[6]) * 60
        seconds -= offset if match[4] == "+" else -offset
    return seconds


def _seconds(text: str) -> float:
    """A finite, non-negative number of seconds."""
    value = plain_float(text, padded=True)
    if not math.isfinite(value) or value < 0:
        raise ValueError(text)
    return value


_CSV_FORMATS = (
    _CsvFormat(
        "azure",
        "ContextTokens",
        "GeneratedTokens",
        "TIMESTAMP",
        _azure_time,
        "a date and time like '2023-11-16 18:17:03.123', any zone as Z or +HH:MM",
    ),
    _CsvFormat(
        "burstgpt", "Request tokens", "Response tokens", "Timestamp", _seconds, "seconds >= 0"
    ),
    # Vidur's processed traces: ShareGPT's columns with arrival times, so it comes first; a
    # header without arrived_at is read as the lengths-only sharegpt format
    _CsvFormat(
        "vidur", "num_prefill_tokens", "num_decode_tokens", "arrived_at", _seconds, "seconds >= 0"
    ),
    _CsvFormat("sharegpt", "num_prefill_tokens", "num_decode_tokens", None, None),
    _CsvFormat("gsm8k", "prompt_tokens_llama2", "output_tokens_llama2", None, None),
)

_FAST_TIMES: dict[Callable[[str], float], trace_fast.TimeKind] = {
    _azure_time: "datetime",
    _seconds: "seconds",
}
"""The times `trace_fast` reads, by the function that reads them row by row."""


_GZIP = b"\x1f\x8b"
"""A gzip file's first bytes: such a file is read through `gzip`, streamed."""
_COMPRESSED = {
    _GZIP: "gzip-compressed twice (gunzip it once first)",
    b"PK\x03\x04": "a zip archive (unzip it first)",
    b"BZh": "bzip2-compressed (bunzip2 it first)",
    b"\xfd7zXZ": "xz-compressed (unxz it first)",
    b"\x28\xb5\x2f\xfd": "zstd-compressed (unzstd it first)",
}
"""Compressions refused, by the first line's first bytes (a gzip file's gzip entry only meets
one compressed twice: the file is read through `gzip`)."""
MAX_SPAN_S = 1e8
"""Longest first-to-last arrival span accepted (about 3 years): more is a bad timestamp."""
MAX_TOKENS = 2**31 - 1
"""Most tokens a request's prompt or output may claim: more is a bad value."""
BAD_ROWS = ("error", "skip")
"""What a trace's bad rows do: stop the read with their error, or be left out and counted."""
DEFAULT_BAD_ROWS = "error"
"""`BAD_ROWS`' choice wherever none is given: nothing is left out unless asked for."""
SKIP_HINT = "--bad-rows skip, or a scenario's bad_rows: skip, leaves bad rows out and counts them"
"""How to read a trace past its bad rows, appended to a bad row's error."""
KNOWN_FORMATS = (
    "an Azure LLM inference CSV (TIMESTAMP,ContextTokens,GeneratedTokens), a BurstGPT CSV "
    "(Timestamp,Request tokens,Response tokens), a Vidur CSV (arrived_at,num_prefill_tokens,"
    "num_decode_tokens), a ShareGPT length CSV (num_prefill_tokens,num_decode_tokens), a GSM8K "
    "length CSV (prompt_tokens_llama2,output_tokens_llama2) or a Mooncake or Bailian JSONL "
    "(one JSON object a line: timestamp (Mooncake's in ms; Bailian's, with a chat_id, in s), "
    "input_length, output_length), any of them gzip-compressed"
)
"""The trace formats `load_trace` reads, for messages."""
CACHED_TRACES = 4
"""Trace files kept read per process (`load_trace`)."""
MAX_FIELD = csv.field_size_limit()
"""Longest CSV field read (the csv module's limit, 131,072 characters)."""
MAX_LINE = 2**24
"""Longest line read, in bytes (decompressed): the memory a read takes stays bounded, whatever
the file (a trace's rows are under a kilobyte; a one-line file of gigabytes is no trace)."""


PROGRESS_BYTES = 32 * 2**20
"""Files this large on disk or larger show a progress bar (bytes read) on stderr while they
are read, where stderr is a terminal, in the main process (not in a worker), unless
`READ_PROGRESS` is off: a week of a public trace is a minute's read or more."""
READ_PROGRESS = True
"""Whether a large file's read may show its progress (the CLI's --no-progress turns it off)."""


MAX_GZIP_RATIO = 32
"""Most bytes a gzip trace may decompress to per byte on disk, past `GZIP_FLOOR_BYTES`: real
traces compress 2-5x; more is a decompression bomb, whose rows would fill memory."""
GZIP_FLOOR_BYTES = 64 * 2**20
"""Bytes any gzip trace may decompress to, whatever its ratio."""


class _BoundedGzipFile(gzip.GzipFile):
    """A gzip file read through `read` and `readline` that refuses, with a `TraceError`, to
    decompress past `limit` bytes."""

    def __init__(self, path: Path, handle: BinaryIO, limit: int) -> None:
        super().__init__(fileobj=handle, mode="rb")  # reads nothing yet: it cannot raise
        self._handle = handle  # a file given, not named, is left open by `GzipFile.close`
        self._trace_path = path
        self._left = limit
        self._limit = limit

    def _count(self, data: bytes) -> bytes:
        self._left -= len(data)
        if self._left < 0:
            size = self._trace_path.stat().st_size
            raise TraceError(
                f"{self._trace_path}: the gzip file decompresses to over {self._limit:,} bytes, "
                f"over {self._limit / max(size, 1):,.0f}x its {size:,} bytes on disk (the "
                "public traces compress 2-5x): a decompression bomb? gunzip it to read it anyway"
            )
        return data

    def _bounded(self, size: int | None) -> int:
        """`size` cut to one byte past the limit: no read holds more than that."""
        return self._left + 1 if size is None or size < 0 else min(size, self._left + 1)

    def read(self, size: int | None = -1) -> bytes:
        return self._count(super().read(self._bounded(size)))

    def readline(self, size: int | None = -1) -> bytes:
        return self._count(super().readline(self._bounded(size)))

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._handle.close()


class _ShownRead(io.RawIOBase):
    """A file read with a transient progress bar of its bytes on stderr, gone when closed."""

    def __init__(self, path: Path, what: str) -> None:
        self._file = path.open("rb", buffering=0)
        try:
            self._bar = Progress(
                TextColumn("{task.description}", markup=False),  # a name's [ ] { } as written
                BarColumn(),
                DownloadColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
                transient=True,
            )
            self._task = self._bar.add_task(f"{what} {path.name}", total=path.stat().st_size)
            self._bar.start()
        except BaseException:
            self._file.close()
            raise

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        n = self._file.readinto(buffer)
        self._bar.advance(self._task, n or 0)
        return n

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        position = self._file.seek(offset, whence)
        self._bar.update(self._task, completed=position)
        return position

    def seekable(self) -> bool:
        return True

    def close(self) -> None:
        if not self.closed:
            try:
                self._file.close()
            finally:
                self._bar.stop()
        super().close()


def _open(path: Path, shown: str = "") -> BinaryIO | gzip.GzipFile:
    """The file opened for reading bytes; a gzip file (by its first bytes, whatever its name)
    through `gzip`, which decompresses as it is read, to at most `MAX_GZIP_RATIO` times its
    size (or `GZIP_FLOOR_BYTES`). A whole read says what it is in `shown`: then a file of
    `PROGRESS_BYTES` or more may show its progress (`PROGRESS_BYTES` says where)."""
    size = path.stat().st_size
    terminal = sys.stderr is not None and sys.stderr.isatty()
    main_process = multiprocessing.parent_process() is None
    if shown and READ_PROGRESS and size >= PROGRESS_BYTES and terminal and main_process:
        handle: BinaryIO = io.BufferedReader(_ShownRead(path, shown))  # type: ignore[assignment]
    else:
        handle = path.open("rb")
    try:
        gzipped = handle.read(len(_GZIP)) == _GZIP
        handle.seek(0)
    except BaseException:
        handle.close()
        raise
    if not gzipped:
        return handle
    return _BoundedGzipFile(path, handle, max(MAX_GZIP_RATIO * size, GZIP_FLOOR_BYTES))


def _raw_lines(path: Path, handle: BinaryIO | gzip.GzipFile) -> Iterator[tuple[int, bytes]]:
    """The file's lines as bytes, numbered; a gzip file's corrupt or cut-short data, or a
    line over `MAX_LINE` bytes (decompressed), is a `TraceError` naming the line."""
    gzipped = isinstance(handle, gzip.GzipFile)
    for number in itertools.count(1):
        try:
            raw = handle.readline(MAX_LINE + 1)
        except (OSError, EOFError, zlib.error) as exc:
            if not gzipped:
                raise
            raise TraceError(
                f"{path}:{number}: the file is gzip-compressed but its data is corrupt or cut "
                f"short ({exc})"
            ) from None
        if not raw:
            return
        if len(raw) > MAX_LINE:
            if number == 1 and raw.lstrip(b"\xef\xbb\xbf \t\r\n").startswith(b"["):
                raise _json_array_error(path)
            raise TraceError(
                f"{path}:{number}: the line is over {MAX_LINE:,} bytes"
                + " decompressed" * gzipped
                + "; a trace's rows are a line each (a one-line or binary file is no trace)"
            )
        yield number, raw


def _text_lines(path: Path, handle: BinaryIO | gzip.GzipFile) -> Iterator[str]:
    """The file's lines as text (UTF-8, byte order marks skipped); a `TraceError` names the
    first line that is binary or not UTF-8."""
    for number, raw in _raw_lines(path, handle):
        if number == 1:
            if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
                raise TraceError(f"{path}:1: not UTF-8 text (UTF-16); save it as UTF-8")
            for magic, what in _COMPRESSED.items():
                if raw.startswith(magic):
                    raise TraceError(f"{path}:1: the file is {what}")
            if raw[257:262] == b"ustar" and b"\x00" in raw[:257]:  # a tar header (or .tar.gz's)
                raise TraceError(f"{path}:1: the file is a tar archive (extract the trace first)")
            while raw.startswith(b"\xef\xbb\xbf"):  # a file saved twice has two
                raw = raw[3:]
        if b"\x00" in raw:
            raise TraceError(f"{path}:{number}: binary data (NUL bytes), not a text trace")
        try:
            yield raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise TraceError(
                f"{path}:{number}: not UTF-8 text (byte {raw[exc.start]:#04x} at column "
                f"{exc.start + 1}); save the file as UTF-8"
            ) from None


def _json_number(value: Any, what: str, where: str) -> float:
    """A JSON number (not a string, bool or null)."""
    if not is_number(value):
        raise TraceError(f"{where}: {what} is {value!r}, not a number")
    try:
        return float(value)
    except OverflowError:  # an int past the float range
        raise TraceError(f"{where}: {what} is {value!r}, too large: a bad value?") from None


def _parse_int(value: str | int | float | None, what: str, where: str) -> int:
    if isinstance(value, bool) or value is None:
        raise TraceError(f"{where}: {what} is {value!r}, not a number")
    try:
        number = plain_float(value, padded=True) if isinstance(value, str) else float(value)
    except (TypeError, ValueError):
        again = " (the header again: two files joined into one?)" if value == what else ""
        raise TraceError(f"{where}: {what} is {value!r}, not a number{again}") from None
    except OverflowError:  # an int past the float range, as a long digit string reads
        number = math.inf if value > 0 else -math.inf  # type: ignore[operator]
    if number > MAX_TOKENS:
        raise TraceError(f"{where}: {what} is {value!r}, over {MAX_TOKENS:,} tokens: a bad value?")
    if not number.is_integer():
        raise TraceError(f"{where}: {what} is {value!r}, not a whole number")
    if number < 1:
        raise TraceError(f"{where}: {what} is {int(number)}; a request needs at least 1 token")
    return int(number)


def _csv_header(
    path: Path, handle: BinaryIO | gzip.GzipFile
) -> tuple[_CsvFormat, csv.DictReader[str]]:
    """The format named by the header of the CSV in `handle`, and a reader past the header
    (its stripped column names in `fieldnames`); a `TraceError` for a header of no format."""
    reader = csv.DictReader(_text_lines(path, handle))
    try:
        header = [h.strip() for h in (reader.fieldnames or [])]
    except (TraceError, csv.Error) as exc:
        raise _csv_error(path, 1, exc) from None
    reader.fieldnames = header
    twice = sorted({h for h in header if header.count(h) > 1})
    if twice:
        raise TraceError(f"{path}:1: the header names column(s) {twice} more than once")
    present = [f for f in _CSV_FORMATS if f.prompt in header and f.output in header]
    pairs = sorted({f"{f.prompt}/{f.output}" for f in present})
    if len(pairs) > 1:
        raise TraceError(
            f"{path}:1: the header has the token columns of several formats ({', '.join(pairs)}); "
            "keep one pair, or rename the others"
        )
    fmt = _detect(header)
    if fmt is None:
        raise TraceError(
            f"{path}: unknown trace format; header {header!r} has none of the known column "
            f"pairs ({', '.join(sorted({f'{f.prompt}/{f.output}' for f in _CSV_FORMATS}))})"
            + (_separator_hint(header) or _case_hint(header) or _jsonl_hint(path))
        )
    timed = _case_fixed(header) if fmt.time is None else None
    if timed is not None and timed.time is not None:  # a time column named but for case
        column = next(h for h in header if h.lower() == timed.time.lower())
        raise TraceError(
            f"{path}:1: column {column!r} is not {timed.time!r} but for case: as written, the "
            f"file is the {fmt.name} format (lengths alone), its arrival times left out; write "
            f"{timed.time} to replay them (the {timed.name} format), or drop the column"
        )
    if fmt.time is not None and fmt.time not in header:
        raise TraceError(
            f"{path}:1: the header has {fmt.prompt}/{fmt.output} ({fmt.name} format) but no "
            f"{fmt.time} column; header {header!r} (to use its lengths alone, with "
            "poisson:RATE or gamma:RATE:CV arrivals, name those columns "
            "num_prefill_tokens,num_decode_tokens)"
        )
    return fmt, reader


def _rows_csv(path: Path) -> tuple[_CsvFormat, Iterator[tuple[int, dict[str, str]]]]:
    handle = _open(path, "reading row by row")
    try:
        fmt, reader = _csv_header(path, handle)
    except BaseException:
        handle.close()
        raise

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        with handle:
            try:
                last = reader.line_num
                for row in reader:  # a record over several lines: a quoted text, or a stray quote
                    if reader.line_num - last > 1 and _swallows_rows(row, fmt, reader.fieldnames):
                        first = reader.line_num - _newlines(row)
                        raise _quote_error(path, first, reader.line_num)
                    last = reader.line_num
                    if not _blank(row):
                        yield reader.line_num, row
            except csv.Error as exc:  # raised before line_num counts the record's line
                raise _csv_error(path, reader.line_num + 1, exc) from None

    return fmt, rows()


def _detect(header: list[str]) -> _CsvFormat | None:
    """The format of a CSV `header`: the first whose token columns it has (None if none), but
    a timed format whose time column it lacks gives way to another with the same token
    columns (vidur's without arrived_at is sharegpt's); else its missing time is an error."""
    candidates = [f for f in _CSV_FORMATS if f.prompt in header and f.output in header]
    for fmt in candidates:
        sharing = sum((f.prompt, f.output) == (fmt.prompt, fmt.output) for f in candidates)
        if fmt.time is None or fmt.time in header or sharing == 1:
            return fmt
    return None


def _case_fixed(header: list[str]) -> _CsvFormat | None:
    """The format of `header` with each name that matches a format's but for case written
    as that format writes it."""
    names = {n.lower(): n for f in _CSV_FORMATS for n in (f.prompt, f.output, f.time) if n}
    return _detect([names.get(h.lower(), h) for h in header])


def _case_hint(header: list[str]) -> str:
    """For a header whose names match a format's but for case: the names to write."""
    fmt = _case_fixed(header)
    if fmt is None:
        return ""
    wanted = [n for n in (fmt.time, fmt.prompt, fmt.output) if n]
    return f"; the names match the {fmt.name} format's but for case: write {', '.join(wanted)}"


def _jsonl_hint(path: Path) -> str:
    """For a file named as JSON Lines that was read as CSV: why."""
    if not {".jsonl", ".json"} & {x.lower() for x in path.suffixes}:
        return ""
    return "; read as CSV because its first line is not a JSON object (JSON Lines: one a line)"


def _separator_hint(header: list[str]) -> str:
    """For a header of one column holding tabs or semicolons: what the file looks like."""
    if len(header) != 1:
        return ""
    counts = {"tab": header[0].count("\t"), "semicolon": header[0].count(";")}
    name = max(counts, key=counts.__getitem__)
    if not counts[name]:
        return ""
    columns = [h.strip() for h in header[0].split("\t" if name == "tab" else ";")]
    fmt = _detect(columns)
    known = f" (its columns, split there, are the {fmt.name} format's)" if fmt else ""
    return (
        f"; the file looks {name}-separated{known}, and traces are read as comma-separated "
        f"CSV: convert the {name}s to commas"
    )


def _blank(row: dict[str, str | None]) -> bool:
    """A CSV row from a line of only whitespace (the csv module skips only empty lines): one
    whitespace field, the rest missing. A line of only commas is a row of empty fields."""
    first, *rest = row.values()
    if None in row or first is None or first.strip():
        return False
    return all(value is None for value in rest)


def _texts(row: dict[str | None, Any]) -> list[str]:
    """A CSV record's fields (those past the header's columns too) that hold text."""
    values = [v for value in row.values() for v in (value if isinstance(value, list) else [value])]
    return [v for v in values if v]


def _newlines(row: dict[str | None, Any]) -> int:
    """The line breaks inside a CSV record's quoted fields: a record over several lines (a
    quote never closed takes the file's last line break too, not one more line)."""
    return sum(v.rstrip("\r\n").count("\n") for v in _texts(row))


def _swallows_rows(row: dict[str | None, Any], fmt: _CsvFormat, header: Sequence[str]) -> bool:
    """Whether a line inside one of the record's quoted fields is a row of the trace (the
    header's columns, numbers where its token counts go): a stray quote joined lines, not a
    quoted text over several lines (a prompt column's)."""
    at = [header.index(fmt.prompt), header.index(fmt.output)]
    for text in _texts(row):
        for line in text.split("\n")[1:]:
            try:
                cells = next(csv.reader([line.rstrip("\r")]), [])
            except csv.Error:
                continue
            if len(cells) == len(header) and all(_is_number(cells[i]) for i in at):
                return True
    return False


def _is_number(text: str) -> bool:
    """Whether a CSV cell reads as a number (`plain_float`, spaces around it allowed)."""
    try:
        plain_float(text, padded=True)
    except ValueError:
        return False
    return True


def _quote_error(path: Path, first: int, last: int) -> TraceError:
    """A record over lines `first`-`last` that swallowed rows of the trace (`_swallows_rows`):
    a quote that opens a field and is never closed (or closed lines later) joined the lines
    between into one row; reading it would drop them and pair one line's time with another's
    lengths, and no row of it can be left out alone."""
    return TraceError(
        f"{path}:{first}: a quote opened on this line runs on to line {last}, joining lines "
        f"{first}-{last} into one row (a stray '\"'?); fix the file: --bad-rows skip cannot "
        "leave those lines out one by one"
    )


def _csv_error(path: Path, line: int, exc: Exception) -> TraceError:
    if isinstance(exc, TraceError):
        return exc
    if "field larger than field limit" in str(exc):
        return TraceError(
            f"{path}:{line}: a field is longer than {MAX_FIELD:,} characters; not a trace "
            "(or a quote is never closed)"
        )
    if "new-line character seen in unquoted field" in str(exc):
        return TraceError(
            f"{path}:{line}: lines end in a bare carriage return (old Mac line endings); "
            "convert them to \\n or \\r\\n"
        )
    return TraceError(f"{path}:{line}: not readable as CSV ({exc})")


_Row = tuple[int, int, float | None]
"""A request's prompt and output tokens, and its arrival time (s) where the trace has one."""


def _read_csv(path: Path, skip_bad_rows: bool) -> Trace:
    """The CSV trace, by the vectorised reader where it takes the file, else row by row."""
    fast = _read_csv_fast(path, skip_bad_rows)
    return fast if fast is not None else _read_csv_rows(path, skip_bad_rows)


def _read_csv_rows(path: Path, skip_bad_rows: bool) -> Trace:
    """The CSV trace read row by row: any file, each bad row's error naming its line."""
    fmt, rows = _rows_csv(path)
    parse: Callable[[dict[str, str], str], _Row] = functools.partial(_csv_row, fmt)
    if fmt.parse_time is _azure_time:
        parse = _one_zone_style(parse, fmt.time or "")
    with closing(rows):  # a bad row's error closes the file now, not at garbage collection
        return _collect(path, fmt.name, rows, parse, fmt.time is not None, skip_bad_rows)


def _one_zone_style(
    parse: Callable[[dict[str, str], str], _Row], column: str
) -> Callable[[dict[str, str], str], _Row]:
    """`parse` of Azure rows, refusing the file at the first time whose zone style differs
    from the first good row's: times without a 'Z' or '+HH:MM' suffix are read as UTC, so
    beside times with one they may be hours off, and which are right is not known."""
    first: list[tuple[bool, str]] = []  # the first good row's: zoned, and where

    def checked(row: dict[str, str], where: str) -> _Row:
        read = parse(row, where)
        zoned = bool(_DATE_TIME.fullmatch(row[column].strip())[3])  # type: ignore[index]
        if not first:
            first.append((zoned, where))
        elif zoned != first[0][0]:
            has, other = ("a", "none") if zoned else ("no", "one")
            raise _FileError(
                f"{where}: {column} {row[column]!r} has {has} UTC offset where "
                f"{first[0][1]}'s has {other}: times without one are read as UTC, so mixed "
                "they may be hours apart; give every time an offset ('Z' for UTC) or none "
                "(a property of the file: --bad-rows skip cannot choose which rows are right)"
            )
        return read

    return checked


def _read_csv_fast(path: Path, skip_bad_rows: bool = False) -> Trace | None:
    """The CSV trace read by `trace_fast` (the row reader's result, faster), or None where
    that reader leaves the file to the row reader (`trace_fast.read_columns`). With
    `skip_bad_rows` it leaves out the rows with a token count out of range, as the row reader
    does, and gives the first one's error by reading that row as the row reader does."""
    with _open(path, "reading") as handle:
        fmt, reader = _csv_header(path, handle)
        header = reader.fieldnames or []
        layout = _fast_layout(fmt, header)
        if layout is None or reader.line_num != 1:  # a header over lines: quoted newlines
            return None
        read = trace_fast.read_columns(handle, layout, skip=skip_bad_rows)
    if read is None:
        return None
    (prompts, outputs, times), skipped = read
    if times is not None and times.max() - times.min() > MAX_SPAN_S:
        return None  # the error names the line: the row reader's
    first_skipped = ""
    if skipped.rows:
        first_skipped = _row_error(path, fmt, header, skipped.line, skipped.text)
        if not first_skipped:  # not a bad row after all (it cannot be): read row by row
            return None
    return _finish(path, fmt.name, prompts, outputs, times, None, (skipped.rows, first_skipped))


def _row_error(path: Path, fmt: _CsvFormat, header: Sequence[str], line: int, text: bytes) -> str:
    """The row reader's error for the row `text` (a regular line: ASCII, no quotes, no line
    end) on `line` of `path`, as `_rows_csv` reads it and `_collect` names it; empty if the row
    is good."""
    values = next(csv.reader([text.decode("ascii")]))
    try:
        _csv_row(fmt, dict(zip(header, values, strict=True)), f"{path}:{line}")
    except TraceError as exc:
        return str(exc)
    return ""


def _fast_layout(fmt: _CsvFormat, header: Sequence[str]) -> trace_fast.Layout | None:
    """Where `fmt`'s columns are in `header`, for `trace_fast`; None for a time it cannot read."""
    kind = _FAST_TIMES.get(fmt.parse_time) if fmt.parse_time else None
    if fmt.time is not None and kind is None:
        return None
    return trace_fast.Layout(
        columns=len(header),
        prompt=header.index(fmt.prompt),
        output=header.index(fmt.output),
        time=None if fmt.time is None else header.index(fmt.time),
        time_kind=kind,
        max_tokens=MAX_TOKENS,
        max_field=MAX_FIELD,
    )


def _csv_row(fmt: _CsvFormat, row: dict[str, str], where: str) -> _Row:
    if None in row or any(v is None for v in row.values()):
        columns = sum(k is not None for k in row)
        cells = sum(v is not None for k, v in row.items() if k is not None)
        cells += len(row.get(None) or ())  # type: ignore[call-overload]
        raise TraceError(
            f"{where}: {cells} field(s) where the header has {columns}"
            + (" (a trailing comma, or a number written 1,000?)" if cells > columns else "")
        )
    p = _parse_int(row[fmt.prompt], fmt.prompt, where)
    o = _parse_int(row[fmt.output], fmt.output, where)
    if fmt.time is None or fmt.parse_time is None:
        return p, o, None
    try:
        return p, o, fmt.parse_time(row[fmt.time])
    except ValueError:
        raise TraceError(
            f"{where}: {fmt.time} is {row[fmt.time]!r}, not a time ({fmt.time_hint})"
        ) from None


JSONL_TIME_UNITS = {"mooncake": ("ms", 1000.0), "bailian": ("s", 1.0)}
"""The JSONL formats' timestamp units: Mooncake's traces count milliseconds, Alibaba's
Bailian (Qwen) usage traces seconds."""
JSONL_LOOKAHEAD = 64
"""Lines read ahead for the first JSON object that tells a JSONL's format."""


def _read_jsonl(path: Path, skip_bad_rows: bool) -> Trace:
    """A Mooncake or a Bailian JSONL: both name timestamp, input_length and output_length; a
    first object (within `JSONL_LOOKAHEAD` lines, past bad ones) with Bailian's ``chat_id``
    makes the file Bailian's (timestamps in seconds), any other Mooncake's (milliseconds)."""
    with _open(path, "reading") as handle:
        lines = ((line, text) for line, text in enumerate(_text_lines(path, handle), 1))
        rows = ((line, text) for line, text in lines if text.strip())
        ahead = list(itertools.islice(rows, JSONL_LOOKAHEAD))
        fmt = "mooncake"
        for _, text in ahead:
            try:
                head = json.loads(text)
            except (ValueError, RecursionError):  # the row reader names what is wrong
                continue
            if isinstance(head, dict):
                fmt = "bailian" if "chat_id" in head else "mooncake"
                break
        parse = functools.partial(_jsonl_row, fmt=fmt)
        return _collect(path, fmt, itertools.chain(ahead, rows), parse, True, skip_bad_rows)


def _jsonl_row(text: str, where: str, *, fmt: str) -> _Row:
    """One JSONL request of a `fmt` file, its timestamp in that format's unit
    (`JSONL_TIME_UNITS`). A row of the other format (with or without Bailian's ``chat_id``)
    is an error: its timestamps would be read 1,000 times off."""
    unit, per_second = JSONL_TIME_UNITS[fmt]
    try:
        row = json.loads(text, object_pairs_hook=unique_object)
    except json.JSONDecodeError as exc:
        spread = " (an object spread over lines? JSON Lines holds one object a line)"
        raise TraceError(
            f"{where}: not valid JSON ({exc.msg}){spread if text.strip() == '{' else ''}"
        ) from None
    except DuplicateKeys as exc:
        raise TraceError(f"{where}: field(s) {exc} given twice") from None
    except RecursionError:
        raise TraceError(f"{where}: JSON nested too deeply") from None
    except ValueError:  # an int of more digits than Python converts
        raise TraceError(
            f"{where}: a number has over {sys.get_int_max_str_digits():,} digits: a bad value?"
        ) from None
    if not isinstance(row, dict):
        raise TraceError(f"{where}: expected a JSON object")
    missing = {"timestamp", "input_length", "output_length"} - row.keys()
    if missing:
        raise TraceError(f"{where}: missing field(s) {sorted(missing)}")
    if ("chat_id" in row) != (fmt == "bailian"):
        first = "Bailian's, with" if fmt == "bailian" else "Mooncake's, without"
        raise TraceError(
            f"{where}: {'no' if fmt == 'bailian' else 'a'} chat_id, where the file's first object "
            f"is {first} one: one file holds one format (timestamps in s or ms)"
        )
    p = _parse_int(row["input_length"], "input_length", where)
    o = _parse_int(row["output_length"], "output_length", where)
    for key in ("input_length", "output_length"):
        _json_number(row[key], key, where)
    t = _json_number(row["timestamp"], "timestamp", where)
    if not math.isfinite(t) or t < 0:
        raise TraceError(f"{where}: timestamp is {row['timestamp']!r}; need a time >= 0 ({unit})")
    return p, o, t / per_second


def _collect(
    path: Path,
    fmt: str,
    rows: Iterable[tuple[int, Any]],
    parse: Callable[[Any, str], _Row],
    timed: bool,
    skip_bad_rows: bool,
) -> Trace:
    """The trace of `rows` (line number, raw row), each read by `parse`; a bad row raises its
    `TraceError`, or with `skip_bad_rows` is counted and left out. Values are kept in typed
    arrays (8 bytes each, not a Python object): a week-long trace holds millions of rows."""
    prompts, outputs, lines = array("q"), array("q"), array("q")
    times = array("d")
    skipped = 0
    first_skipped = ""
    for line, row in rows:
        try:
            p, o, t = parse(row, f"{path}:{line}")
        except _FileError:
            raise
        except TraceError as exc:
            if not skip_bad_rows:
                raise TraceError(f"{exc} ({SKIP_HINT})") from None
            skipped += 1
            first_skipped = first_skipped or str(exc)
            continue
        prompts.append(p)
        outputs.append(o)
        if t is not None:
            times.append(t)
            lines.append(line)
    return _finish(
        path,
        fmt,
        np.frombuffer(prompts, np.int64),  # views: the arrays are not copied
        np.frombuffer(outputs, np.int64),
        np.frombuffer(times, np.float64) if timed else None,
        lines,
        (skipped, first_skipped),
    )


def _finish(
    path: Path,
    fmt: str,
    prompt_tokens: np.ndarray,
    output_tokens: np.ndarray,
    times: np.ndarray | None,
    lines: Sequence[int] | None,
    skipped: tuple[int, str],
) -> Trace:
    """The trace, time-ordered; `times`: the arrival times for a trace with times, and `lines`
    their lines, for a bad time's error (None where the caller checked the span);
    `skipped`: the bad rows left out and the first one's error."""
    if not len(prompt_tokens):
        if skipped[0]:
            raise TraceError(f"{path}: all {skipped[0]:,} rows are bad; the first: {skipped[1]}")
        raise TraceError(f"{path}: no requests in the file")
    arrival = None
    if times is not None:
        order = np.argsort(times, kind="stable")
        arrival = times[order] - times[order[0]]
        if arrival[-1] > MAX_SPAN_S:
            # the outlier is the end farther from its neighbour
            first = len(times) > 1 and arrival[1] - arrival[0] > arrival[-1] - arrival[-2]
            assert lines is not None, "a span check was skipped"  # the fast reader checks it
            line = lines[order[0] if first else order[-1]]
            raise TraceError(
                f"{path}:{line}: this timestamp puts the trace's span at {arrival[-1]:.3g} s, "
                f"over {MAX_SPAN_S:.0e} s (3 years): a bad timestamp?"
            )
        prompt_tokens, output_tokens = prompt_tokens[order], output_tokens[order]
    return Trace(
        name=Path(path.name.removesuffix(".gz")).stem,
        path=str(path),
        format=fmt,
        prompt_tokens=prompt_tokens,
        output_tokens=output_tokens,
        arrival_s=arrival,
        skipped_rows=skipped[0],
        first_skipped=skipped[1],
    )


def load_trace(path: str | Path, *, bad_rows: str = DEFAULT_BAD_ROWS) -> Trace:
    """Read a trace file, detecting its format from the header: an Azure LLM inference CSV,
    a BurstGPT CSV or a Vidur CSV (arrived_at,num_prefill_tokens,num_decode_tokens), which
    have arrival times; a ShareGPT or GSM8K length CSV, which have none; or a Mooncake or
    Bailian JSONL (`KNOWN_FORMATS`). A gzip-compressed file is read as it decompresses; a
    JSON array (as ShareGPT's conversations file) is refused.

    `bad_rows` (`BAD_ROWS`): a row that cannot be a request raises ``error``, or with
    ``skip`` is left out and counted in `Trace.skipped_rows` (BurstGPT, for one, logs failed
    requests with zero response tokens). A file with no good row raises either way.
    """
    from batchpilot.envs.embedded import EMBEDDED_PREFIX, embedded_names

    if bad_rows not in BAD_ROWS:
        raise ValueError(f"bad_rows is {bad_rows!r}; one of {', '.join(BAD_ROWS)}")
    skip_bad_rows = bad_rows == "skip"
    path = user_path(path, TraceError)  # a config's or a --workload=PATH's ~
    exists = regular_file(path, "a trace file", TraceError)
    if exists and path.stat().st_size == 0:
        raise TraceError(f"{path}: the file is empty")
    if not exists:
        names = ", ".join(f"{EMBEDDED_PREFIX}{n}" for n in embedded_names())
        raise TraceError(
            f"{path}: no such trace file; the embedded workloads need no file ({names}), "
            "or see the README for where to get the public traces"
        )
    stat = path.stat()
    return _read(path, (path.resolve(), stat.st_mtime_ns, stat.st_size), skip_bad_rows)


def _json_array_error(path: Path) -> TraceError:
    """The error for a file holding a JSON array (a ShareGPT export, say)."""
    return TraceError(
        f"{path}:1: a JSON array, not a trace format this reader knows; it reads "
        f"{KNOWN_FORMATS}. Request records (timestamp, input_length, output_length) go one "
        "JSON object a line (JSON Lines), not in an array; a ShareGPT conversations file "
        "(ShareGPT_V3_unfiltered_cleaned_split.json) needs tokenizing into a length CSV "
        "(num_prefill_tokens,num_decode_tokens) first"
    )


@functools.lru_cache(maxsize=CACHED_TRACES)
def _read(path: Path, version: tuple[Path, int, int], skip_bad_rows: bool) -> Trace:
    """The trace in `path`, read once per process while its `version` (the file, its time
    and size) stays: a comparison draws many runs from one file."""
    with _open(path) as handle:
        first = next(_text_lines(path, handle), "").lstrip()
    if not first:
        raise TraceError(f"{path}:1: the first line is blank; expected a CSV header or JSON")
    if first.startswith("["):
        raise _json_array_error(path)
    if first.startswith("{"):
        trace = _read_jsonl(path, skip_bad_rows)
    else:
        trace = _read_csv(path, skip_bad_rows)
    for column in (trace.prompt_tokens, trace.output_tokens, trace.arrival_s):
        if column is not None:
            column.flags.writeable = False  # shared by every reader of the cache
    return trace
