"""The one JSON reader for files users hand in (profiles, model configs, training runs,
checkpoints, policy sidecars: `read_json`, `read_json_object`): every way a file can fail to
be JSON is one error naming the file and the problem, and a key given twice is an error
(`unique_object`, which the trace reader's JSON Lines rows use too), where `json` keeps
the last value silently; `brief` shows a value read from one in an error message."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any


class DuplicateKeys(ValueError):
    """A JSON object that gives a key twice; its argument lists the keys."""


def brief(value: object) -> str:
    """`value`'s repr, or where that is long its digits (an integer) or its start."""
    text = repr(value)
    if len(text) <= 40:
        return text
    if isinstance(value, int):
        return f"a {len(text.lstrip('-'))}-digit integer"
    return text[:40] + "..."


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' ``object_pairs_hook``: the pairs as a dict, or `DuplicateKeys` naming
    every key given twice."""
    row = dict(pairs)
    if len(row) < len(pairs):
        keys = [k for k, _ in pairs]
        raise DuplicateKeys(", ".join(sorted({k for k in keys if keys.count(k) > 1})))
    return row


def number_problem(value: object) -> str | None:
    """Why `value` is no number a file may hold (NaN, an infinity, an integer past a float's
    range), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        name = "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
        return f"{name}, not a number JSON allows"
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            float(value)
        except OverflowError:
            return f"a {len(str(abs(value))):,}-digit integer, past a float's range"
    return None


def _bad_number(document: object) -> str | None:
    """The first number in `document` (parsed JSON) that `number_problem` refuses, as
    ``"FIELD is PROBLEM"`` (``a.b[2]``), or None; walked with a stack, as deep as json reads."""
    stack: list[tuple[str, object]] = [("", document)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, dict):
            items = [(f"{where}.{k}" if where else str(k), v) for k, v in value.items()]
        elif isinstance(value, list):
            items = [(f"{where}[{i}]", v) for i, v in enumerate(value)]
        else:
            problem = number_problem(value)
            if problem is not None:
                return f"{where or 'the value'} is {problem}"
            continue
        stack.extend(reversed(items))  # the first field is checked first
    return None


MAX_FILE_BYTES = 2**28
"""The largest JSON, YAML or policy file read whole (256 MiB): a profile of two million
knots is 60 MB, a policy of a 2,048-wide network 17 MB; past this a read would hold the
file in memory for a file no batchpilot command writes."""


def check_size(file: Path, what: str, error: type[ValueError] = ValueError) -> None:
    """An `error` naming `file` if it is over `MAX_FILE_BYTES` (a missing file passes: the
    read says so)."""
    try:
        size = file.stat().st_size
    except OSError:
        return
    if size > MAX_FILE_BYTES:
        raise error(
            f"{file}: {what} is {size:,} bytes, over the {MAX_FILE_BYTES:,} a batchpilot file "
            "may hold: the wrong file?"
        )


def read_json(
    file: Path, what: str, error: type[ValueError] = ValueError, *, finite: bool = True
) -> object:
    """`file`'s JSON value, `what` saying what it should hold ("the profile"); an unreadable,
    non-UTF-8, invalid or absurdly nested file, one with NaN or Infinity or an integer past a
    float's range (naming the field; with `finite` False, a file others write, such as a
    model config, whose readers check the fields they use), or a key given twice in an object
    (json keeps the last silently), is an `error` naming the file and the problem."""
    check_size(file, what, error)
    try:
        # a byte order mark (Windows editors write one) is skipped, as traces and YAML do
        text = file.read_text(encoding="utf-8-sig")
        data = json.loads(text, object_pairs_hook=unique_object)
        bad = _bad_number(data) if finite else None
    except DuplicateKeys as exc:
        raise error(f"{file}: {what} gives a key twice in one object ({exc})") from None
    except OSError as exc:
        raise error(f"{file}: cannot read {what} ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise error(f"{file}: {what} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise error(
            f"{file}: not valid JSON ({exc.msg}, line {exc.lineno} column {exc.colno})"
        ) from None
    except ValueError:  # json.loads' only other ValueError: an integer too long to convert
        raise error(
            f"{file}: {what} holds an integer of over {sys.get_int_max_str_digits()} digits"
        ) from None
    except RecursionError:
        raise error(f"{file}: {what} nests too deeply to be read") from None
    if bad is not None:
        raise error(f"{file}: {what}: {bad}")
    return data


def read_json_object(
    file: Path, what: str, error: type[ValueError] = ValueError, *, finite: bool = True
) -> dict[str, Any]:
    """`read_json` for a file that must hold a JSON object; any other value is an `error`
    naming the file and what it holds instead."""
    data = read_json(file, what, error, finite=finite)
    if not isinstance(data, dict):
        kinds = {list: "an array", str: "a string", bool: "true or false", type(None): "null"}
        held = kinds.get(type(data), "a number")
        raise error(f"{file}: {what} must be a JSON object, not {held}")
    return data
