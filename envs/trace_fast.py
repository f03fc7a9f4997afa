"""Vectorised reading of regular CSV traces, the fast path of `traces.load_trace`.

A file is read in chunks of whole lines, each split into fields and converted with numpy.
It takes only what it reads exactly as the row-by-row reader does: plain ASCII, no quotes,
``\\n`` or ``\\r\\n`` line ends, empty lines, the same field count on every non-empty line,
token counts like '123' or '123.0', times like '2023-11-16 18:17:03.9799600+01:00' or
'4.314579'. On anything else `read_columns` returns None and the caller reads the file row
by row, which gives its result or its error. Asked to skip bad rows, it leaves out the rows
whose only fault is a whole-number token count out of range (BurstGPT's failed requests have
0 response tokens), counts them, and names the first one's line and text.
"""

from __future__ import annotations

import gzip
import zlib
from dataclasses import dataclass
from typing import BinaryIO, Literal

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

CHUNK_BYTES = 1 << 20
"""Bytes read at a time: the reader's working memory is a small multiple of this."""
MAX_LINE = 1 << 20
"""Longest line taken (bytes); a longer one is left to the row-by-row reader."""
_MAX_DIGITS = 15
"""Most digits read by arithmetic (`_digits`): N < 2**53, so N / 10**k is float('.ddd'),
rounded once; longer decimals go through numpy's string conversion."""
_MAX_TEXT = 32
"""Most characters in a decimal taken (longer ones are left to the row reader)."""
_POW10 = np.array([float(10**k) for k in range(_MAX_DIGITS + 1)])  # exact

TimeKind = Literal["datetime", "seconds"]
Columns = tuple[np.ndarray, np.ndarray, np.ndarray | None]
"""Prompt and output tokens (int64) and arrival times (float64, s) if the trace has them."""


@dataclass(frozen=True)
class Skipped:
    """Rows left out for a token count out of range (`read_columns`' ``skip``): how many, and
    the first one's line number (the header's is 1) and text (without its line end)."""

    rows: int = 0
    line: int = 0
    text: bytes = b""


_Chunk = tuple[Columns, Skipped, bool | None]
"""A chunk's kept rows' columns, its left-out rows (their `Skipped.line`: the lines in the
chunk before the first), and whether its dates and times carry a zone (None: no such times,
or no row)."""


@dataclass(frozen=True)
class Layout:
    """Where a CSV trace's values are, and the limits its row reader applies."""

    columns: int
    prompt: int
    output: int
    time: int | None
    time_kind: TimeKind | None
    max_tokens: int
    max_field: int
    """Fields this long or longer are left to the csv module (its field size limit)."""


def read_columns(
    handle: BinaryIO | gzip.GzipFile, layout: Layout, *, skip: bool = False
) -> tuple[Columns, Skipped] | None:
    """The columns of the lines left in `handle` (past the header, line 1), and the rows left
    out; None if any line is irregular, the data is unreadable, or no row is kept. A row with
    a whole-number token count out of range (below 1 or over `Layout.max_tokens`) is left out
    with `skip` (the row reader skips it: its tokens are read before its time, which must
    still be regular), else it gives None."""
    parts: list[Columns] = []
    skipped = Skipped()
    zoned: set[bool] = set()  # the chunks' zone styles: a mix is left to the row reader
    line = 2  # the number of the next chunk's first line
    rest = b""
    while True:
        try:
            block = handle.read(CHUNK_BYTES)
        except (OSError, EOFError, zlib.error):  # corrupt gzip data: the row reader names it
            return None
        if not block:
            break
        data = rest + block
        cut = data.rfind(b"\n") + 1
        rest = data[cut:]
        if len(rest) > MAX_LINE:
            return None
        if cut:
            chunk = _parse_chunk(memoryview(data)[:cut], layout, skip)
            if chunk is None:
                return None
            parts.append(chunk[0])
            skipped = _add(skipped, chunk[1], line)
            if chunk[2] is not None:
                zoned.add(chunk[2])
            if skip:  # lines are counted for a left-out row's line number
                line += int(np.count_nonzero(np.frombuffer(data, np.uint8, cut) == ord("\n")))
    if rest:  # a last line without a newline
        chunk = None if rest.endswith(b"\r") else _parse_chunk(rest + b"\n", layout, skip)
        if chunk is None:
            return None
        parts.append(chunk[0])
        skipped = _add(skipped, chunk[1], line)
        if chunk[2] is not None:
            zoned.add(chunk[2])
    columns = _concatenate(parts)
    return None if columns is None or len(zoned) > 1 else (columns, skipped)


def _add(skipped: Skipped, chunk: Skipped, line: int) -> Skipped:
    """The rows left out so far and those of the next chunk, whose first line is `line`."""
    if not chunk.rows:
        return skipped
    if skipped.rows:
        return Skipped(skipped.rows + chunk.rows, skipped.line, skipped.text)
    return Skipped(chunk.rows, line + chunk.line, chunk.text)


def _concatenate(parts: list[Columns]) -> Columns | None:
    """The chunks' columns joined; None if they hold no row."""
    if not parts or not sum(len(p[0]) for p in parts):
        return None
    prompt = np.concatenate([p[0] for p in parts])
    output = np.concatenate([p[1] for p in parts])
    if parts[0][2] is None:
        return prompt, output, None
    return prompt, output, np.concatenate([p[2] for p in parts])  # type: ignore[misc]


def _parse_chunk(data: bytes | memoryview, layout: Layout, skip: bool) -> _Chunk | None:
    """The columns of `data`, whole lines ending in a newline, and the rows left out (with
    `skip`, those with a token count out of range); None if any line is irregular."""
    buf = np.frombuffer(data, np.uint8)
    fields = _fields(buf, layout)
    if fields is None:
        return None
    start, end = fields
    most = layout.max_tokens
    prompt = _tokens(buf, start[:, layout.prompt], end[:, layout.prompt], most)
    output = _tokens(buf, start[:, layout.output], end[:, layout.output], most)
    if prompt is None or output is None:
        return None
    times, zoned = None, None
    if layout.time is not None:  # every row's, a left-out one's too: all must be regular
        at = start[:, layout.time], end[:, layout.time]
        if layout.time_kind == "datetime":
            read = _datetimes(buf, *at)
            times, zoned = (None, None) if read is None else read
        else:
            times = _decimals(buf, *at)
        if times is None:
            return None
    in_range = [ok for _, ok in (prompt, output) if ok is not None]
    if not in_range:
        return (prompt[0], output[0], times), Skipped(), zoned
    if not skip:
        return None
    good = np.logical_and.reduce(in_range)
    first = int(np.argmin(good))
    row_end = int(end[first, -1])
    skipped = Skipped(
        rows=len(good) - int(np.count_nonzero(good)),
        line=int(np.count_nonzero(buf[:row_end] == ord("\n"))),  # lines before it
        text=bytes(buf[start[first, 0] : row_end]),
    )
    kept = (prompt[0][good], output[0][good], None if times is None else times[good])
    return kept, skipped, zoned


def _fields(buf: np.ndarray, layout: Layout) -> tuple[np.ndarray, np.ndarray] | None:
    """Each row's field bounds (start, end: two rows x columns arrays), empty lines left out;
    None for a quote, NUL or non-ASCII byte, a carriage return not before a newline, a line
    of another field count, or a field or line too long."""
    if (buf.view(np.int8) <= 0).any() or (buf == ord('"')).any():  # NUL, non-ASCII, quote
        return None
    seps = np.flatnonzero((buf == ord(",")) | (buf == ord("\n")))
    newline = buf[seps] == ord("\n")
    start = np.concatenate(([0], seps[:-1] + 1))
    before_return = newline & (buf[seps - 1] == ord("\r"))  # buf[-1] is a newline: no wrap
    if np.count_nonzero(before_return) != np.count_nonzero(buf == ord("\r")):
        return None  # a carriage return not before a newline
    end = seps - before_return
    after_newline = np.concatenate(([True], newline[:-1]))
    empty_line = newline & after_newline & (start == end)
    if empty_line.any():
        keep = ~empty_line
        start, end, newline = start[keep], end[keep], newline[keep]
    columns = layout.columns
    if len(newline) % columns:
        return None
    start, end = start.reshape(-1, columns), end.reshape(-1, columns)
    if (newline.reshape(-1, columns) != (np.arange(columns) == columns - 1)).any():
        return None
    if start.size and (end - start).max() >= layout.max_field:
        return None
    if start.size and (end[:, -1] - start[:, 0]).max() > MAX_LINE:
        return None
    return start, end


def _digits(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields of 1 to `_MAX_DIGITS` ASCII digits as int64; None if any is other."""
    length = end - start
    value = np.zeros(len(start), np.int64)
    if not len(start):
        return value
    width = int(length.max())
    if length.min() < 1 or width > _MAX_DIGITS:
        return None
    for j in range(width):  # right-aligned: a shorter field's leading digits are zeros
        at = end - (width - j)  # may wrap below 0 (a longer field is in buf): masked
        digit = np.where(at >= start, buf[at] - np.uint8(ord("0")), np.uint8(0))
        if digit.max() > 9:
            return None
        value = value * 10 + digit
    return value


def _tokens(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray, most: int
) -> tuple[np.ndarray, np.ndarray | None] | None:
    """Whole-number token counts, as '123', '0123' or '123.0', read as the row reader reads
    them (int(float(text))), and which are from 1 to `most` (None if all are; an out-of-range
    one, the row reader's bad row, reads as 0); None for any other text (the row reader's
    result or error)."""
    value = _digits(buf, start, end)
    if value is None:  # '123.0', or not a count
        value = _decimals(buf, start, end)
        if value is None or (value != np.floor(value)).any():
            return None
    if not value.size or (value.min() >= 1 and value.max() <= most):
        return value.astype(np.int64, copy=False), None
    good = (value >= 1) & (value <= most)
    return np.where(good, value, 0).astype(np.int64, copy=False), good


def _decimals(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fields like '12', '4.314579', '5.' or '.5' (digits and at most one '.', up to
    `_MAX_TEXT` characters) as float(text) gives them, by numpy's string conversion
    (correctly rounded, as Python's); else None."""
    length = end - start
    if not len(start):
        return np.zeros(0)
    if length.min() < 1 or length.max() > _MAX_TEXT:
        return None
    text = _text(buf, start, end)
    is_dot = text == ord(".")
    is_digit = text - np.uint8(ord("0")) <= 9  # the padding's zeros wrap past 9
    if ((is_dot | is_digit).sum(axis=1) != length).any() or is_dot.sum(axis=1).max() > 1:
        return None
    if not is_digit.any(axis=1).all():
        return None
    return text.view(f"S{text.shape[1]}").ravel().astype(np.float64)


def _text(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """The fields buf[start:end] as rows (uint8) as wide as the longest, zero-padded: numpy
    byte strings once viewed as such."""
    length = end - start
    width = int(length.max())
    padded = np.concatenate((buf, np.zeros(width, np.uint8)))  # every window fits
    text = sliding_window_view(padded, width)[start]
    return np.where(np.arange(width) < length[:, None], text, np.uint8(0))


def _fixed(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray | None:
    """The `width` ASCII digits at each of `at`, as int64; None if any is not a digit."""
    value = np.zeros(len(at), np.int64)
    for j in range(width):
        digit = buf[at + j] - np.uint8(ord("0"))
        if (digit > 9).any():
            return None
        value = value * 10 + digit
    return value


def _datetimes(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, bool | None] | None:
    """'2023-11-16 18:17:03[.fraction][Z|+HH:MM|-HH:MM]' (or a 'T' between date and time)
    as seconds since the epoch, as `traces._azure_time` computes them, and whether they carry
    a zone (None: no time); None for any other text, a date or time out of range (numpy's
    check, left to the row reader), or times with a zone beside times without."""
    if len(start) and (end - start).min() < 19:
        return None
    for at, (one, other) in ((4, b"--"), (7, b"--"), (10, b" T"), (13, b"::"), (16, b"::")):
        char = buf[start + at]
        if not ((char == one) | (char == other)).all():
            return None
    parts = [_fixed(buf, start + at, width) for at, width in _DATE_TIME_FIELDS]
    if any(p is None for p in parts):
        return None
    seconds = _epoch_seconds(*parts)  # type: ignore[arg-type]
    zone = _zones(buf, start, end)
    if seconds is None or zone is None:
        return None
    zoned = zone[0] > 0
    some, every = bool(zoned.any()), bool(zoned.all())
    if some and not every:  # a mix of styles: the row reader names the line
        return None
    fraction = _fractions(buf, start + 19, end - zone[0])
    if fraction is None:
        return None
    return seconds.astype(np.float64) + fraction - zone[1], some if len(zoned) else None


_DATE_TIME_FIELDS = ((0, 4), (5, 2), (8, 2), (11, 2), (14, 2), (17, 2))
"""(offset, width) of year, month, day, hour, minute and second in a date and time."""


def _epoch_seconds(
    year: np.ndarray,
    month: np.ndarray,
    day: np.ndarray,
    hour: np.ndarray,
    minute: np.ndarray,
    second: np.ndarray,
) -> np.ndarray | None:
    """Seconds since the epoch of valid dates and times (int64); None if any is out of range."""
    if ((month < 1) | (month > 12)).any() or (hour > 23).any():
        return None
    if (minute > 59).any() or (second > 59).any():
        return None
    months = (year - 1970) * 12 + month - 1
    first = months.astype("M8[M]").astype("M8[D]").astype(np.int64)
    days_in_month = (months + 1).astype("M8[M]").astype("M8[D]").astype(np.int64) - first
    if ((day < 1) | (day > days_in_month)).any():
        return None
    return (first + day - 1) * 86400 + hour * 3600 + minute * 60 + second


def _zones(
    buf: np.ndarray, start: np.ndarray, end: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """Each time's zone suffix: its length (0, 1 for 'Z' or 6 for '+HH:MM') and its offset
    east of UTC (s, float64); None for an offset out of range."""
    none = np.zeros(len(start))
    only_dates = np.count_nonzero(buf == ord("-")) == 2 * len(start)  # no '-HH:MM'
    if only_dates and not (buf == ord("Z")).any() and not (buf == ord("+")).any():
        return none.astype(np.int64), none
    tail = end - start - 19
    z = (tail >= 1) & (buf[end - 1] == ord("Z"))
    sign = buf[end - 6]  # within the field: it is 19 characters or more
    offset = (tail >= 6) & ((sign == ord("+")) | (sign == ord("-"))) & (buf[end - 3] == ord(":"))
    length = np.where(offset, 6, z.astype(np.int64))
    east = np.zeros(len(start))
    if offset.any():
        at = end[offset] - 5
        hours, minutes = _fixed(buf, at, 2), _fixed(buf, at + 3, 2)
        if hours is None or minutes is None or (hours > 23).any() or (minutes > 59).any():
            return None
        sign_of = np.where(sign[offset] == ord("+"), 1, -1)
        east[offset] = (sign_of * (hours * 3600 + minutes * 60)).astype(np.float64)
    return length, east


def _fractions(buf: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray | None:
    """Fractions of a second: empty, or '.' and digits; None for anything else."""
    fraction = np.zeros(len(start))
    has = end > start
    if not has.any():
        return fraction
    if (buf[start[has]] != ord(".")).any():
        return None
    start, end = start[has] + 1, end[has]
    digits = _digits(buf, start, end)
    value = (
        _decimals(buf, start - 1, end)  # over `_MAX_DIGITS` digits: '.123...' as float() reads it
        if digits is None
        else digits / _POW10[end - start]
    )
    if value is None:
        return None
    fraction[has] = value
    return fraction
