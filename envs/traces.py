"""Trace readers: Azure LLM inference CSV, length-only CSVs, Mooncake JSONL, BurstGPT CSV.

The format is detected from the file's header (or first JSON line). Every bad row raises a
`TraceError` naming the file, the line and the problem.
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np


class TraceError(ValueError):
    """A trace file that cannot be read: unknown format or a bad row."""


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

    def __len__(self) -> int:
        return len(self.prompt_tokens)


@dataclass(frozen=True)
class _CsvFormat:
    name: str
    prompt: str
    output: str
    time: str | None
    parse_time: Callable[[str], float] | None


def _azure_time(text: str) -> float:
    """'2023-11-16 18:17:03.9799600' -> seconds since the epoch (float, ns precision kept)."""
    ns = np.datetime64(text.strip().replace(" ", "T"), "ns").astype(np.int64)
    return float(ns) * 1e-9


_CSV_FORMATS = (
    _CsvFormat("azure", "ContextTokens", "GeneratedTokens", "TIMESTAMP", _azure_time),
    _CsvFormat("burstgpt", "Request tokens", "Response tokens", "Timestamp", float),
    _CsvFormat("sharegpt", "num_prefill_tokens", "num_decode_tokens", None, None),
    _CsvFormat("gsm8k", "prompt_tokens_llama2", "output_tokens_llama2", None, None),
)


def _parse_int(value: str | int | float | None, what: str, where: str) -> int:
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise TraceError(f"{where}: {what} is {value!r}, not a number") from None
    if not math.isfinite(number) or number != int(number):
        raise TraceError(f"{where}: {what} is {value!r}, not a whole number")
    if number < 1:
        raise TraceError(f"{where}: {what} is {int(number)}; a request needs at least 1 token")
    return int(number)


def _rows_csv(path: Path) -> tuple[_CsvFormat, Iterator[tuple[int, dict[str, str]]]]:
    handle = path.open(newline="")
    reader = csv.DictReader(handle)
    header = [h.strip() for h in (reader.fieldnames or [])]
    reader.fieldnames = header
    for fmt in _CSV_FORMATS:
        if fmt.prompt in header and fmt.output in header:
            break
    else:
        handle.close()
        raise TraceError(
            f"{path}: unknown trace format; header {header!r} has none of the known column "
            "pairs (ContextTokens/GeneratedTokens, num_prefill_tokens/num_decode_tokens, "
            "prompt_tokens_llama2/output_tokens_llama2, Request tokens/Response tokens)"
        )

    def rows() -> Iterator[tuple[int, dict[str, str]]]:
        with handle:
            for row in reader:
                yield reader.line_num, row

    return fmt, rows()


def _read_csv(path: Path, skip_bad_rows: bool) -> Trace:
    fmt, rows = _rows_csv(path)
    prompts: list[int] = []
    outputs: list[int] = []
    times: list[float] = []
    skipped = 0
    for line, row in rows:
        where = f"{path}:{line}"
        try:
            if None in row or any(v is None for v in row.values()):
                raise TraceError(f"{where}: row has the wrong number of fields")
            p = _parse_int(row[fmt.prompt], fmt.prompt, where)
            o = _parse_int(row[fmt.output], fmt.output, where)
            if fmt.time is not None and fmt.parse_time is not None:
                try:
                    t = fmt.parse_time(row[fmt.time])
                except ValueError:
                    raise TraceError(
                        f"{where}: {fmt.time} is {row[fmt.time]!r}, not a time"
                    ) from None
                times.append(t)
        except TraceError:
            if not skip_bad_rows:
                raise
            skipped += 1
            continue
        prompts.append(p)
        outputs.append(o)
    return _finish(path, fmt.name, prompts, outputs, times if fmt.time else None, skipped)


def _read_mooncake(path: Path, skip_bad_rows: bool) -> Trace:
    prompts: list[int] = []
    outputs: list[int] = []
    times: list[float] = []
    skipped = 0
    with path.open() as handle:
        for line, text in enumerate(handle, start=1):
            if not text.strip():
                continue
            where = f"{path}:{line}"
            try:
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as exc:
                    raise TraceError(f"{where}: not valid JSON ({exc.msg})") from None
                if not isinstance(row, dict):
                    raise TraceError(f"{where}: expected a JSON object")
                missing = {"timestamp", "input_length", "output_length"} - row.keys()
                if missing:
                    raise TraceError(f"{where}: missing field(s) {sorted(missing)}")
                p = _parse_int(row["input_length"], "input_length", where)
                o = _parse_int(row["output_length"], "output_length", where)
                t = float(row["timestamp"])
                if not math.isfinite(t):
                    raise TraceError(f"{where}: timestamp is {row['timestamp']!r}")
            except TraceError:
                if not skip_bad_rows:
                    raise
                skipped += 1
                continue
            prompts.append(p)
            outputs.append(o)
            times.append(t / 1000.0)
    return _finish(path, "mooncake", prompts, outputs, times, skipped)


def _finish(
    path: Path,
    fmt: str,
    prompts: list[int],
    outputs: list[int],
    times: list[float] | None,
    skipped: int,
) -> Trace:
    if not prompts:
        raise TraceError(f"{path}: no requests in the file")
    arrival = None
    if times is not None:
        t = np.asarray(times, dtype=np.float64)
        order = np.argsort(t, kind="stable")
        arrival = t[order] - t[order[0]]
        prompts = list(np.asarray(prompts)[order])
        outputs = list(np.asarray(outputs)[order])
    return Trace(
        name=path.stem,
        path=str(path),
        format=fmt,
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        output_tokens=np.asarray(outputs, dtype=np.int64),
        arrival_s=arrival,
        skipped_rows=skipped,
    )


def load_trace(path: str | Path, *, skip_bad_rows: bool = False) -> Trace:
    """Read a trace file, detecting its format from the header.

    With `skip_bad_rows`, rows that would raise are counted in `Trace.skipped_rows` instead
    (BurstGPT, for one, logs failed requests with zero response tokens).
    """
    path = Path(path)
    if not path.is_file():
        raise TraceError(f"{path}: no such trace file")
    with path.open() as handle:
        first = handle.readline().lstrip()
    if first.startswith("{"):
        return _read_mooncake(path, skip_bad_rows)
    return _read_csv(path, skip_bad_rows)
