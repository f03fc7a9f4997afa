"""Value checks for files a user writes or is handed (training configs, policy sidecars).

A field is checked against its type annotation (`type_problem`: a float must be finite,
an int whole and not a bool, ``list[int]`` a list of ints, ...) and, where one is
declared, a range (`number`). Schemas are derived from dataclasses and signatures, so a
field added to them is checked without another edit here.
"""

from __future__ import annotations

import collections.abc
import inspect
import math
import types
import typing
from collections.abc import Callable, Iterable
from typing import Any

from batchpilot.envs.names import did_you_mean
from batchpilot.envs.plain_numbers import is_number

Check = Callable[[Any], str | None]
"""A value check: None if the value is fine, else what is wrong with it."""


EXACT_COUNT = 2**53
"""The largest count a float holds exactly: a whole float up to it is read as that count
(YAML reads ``1e6`` as a float), one past it stays a float."""


def whole_float(value: Any) -> bool:
    """Whether `value` is a float with a whole value (any size)."""
    return isinstance(value, float) and value.is_integer()


def number(low: float, high: float, *, integer: bool = False, low_open: bool = False) -> Check:
    """A finite number in [low, high] ((low, high] with `low_open`); a whole one if `integer`."""
    span = f"{'(' if low_open else '['}{_bound(low)}, {_bound(high)}]"

    def check(value: Any) -> str | None:
        kind = int if integer else (int, float)
        # a whole float past EXACT_COUNT (not read as a count): its range is the problem, if any
        if whole_float(value) and abs(value) > EXACT_COUNT and not low <= value <= high:
            return f"{value!r} is outside {span}"
        if isinstance(value, bool) or not isinstance(value, kind):
            return f"{value!r} is not {'a whole number' if integer else 'a number'}"
        if not math.isfinite(value) or value < low or value > high or (low_open and value == low):
            return f"{value!r} is outside {span}"
        return None

    return check


def _bound(x: float) -> str:
    """A bound as written: whole ones below 1e10 in full (4294967295, not 4.29497e+09)."""
    return f"{int(x)}" if abs(x) < 1e10 and x == int(x) else f"{x:g}"


def _name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _of_kind(value: Any, annotation: Any) -> bool:
    """Whether `value` is of `annotation`'s plain kind (an int of float's too), whatever its
    problem: a NaN is a float, not a null."""
    kind = typing.get_origin(annotation) or annotation
    if kind is float:
        kind = (int, float)
    elif kind in (tuple, collections.abc.Sequence):  # read from a list, as `type_problem` does
        kind = list
    if isinstance(value, bool) or not isinstance(kind, type | tuple):
        return False
    return isinstance(value, kind)


def type_problem(value: Any, annotation: Any) -> str | None:
    """None if `value` (as parsed from YAML or JSON) fits `annotation`, else the problem."""
    if annotation is Any or annotation is inspect.Parameter.empty or isinstance(annotation, str):
        return None
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin in (typing.Union, types.UnionType):
        problems = [type_problem(value, a) for a in args]
        if None in problems:
            return None
        pairs = [(a, p) for a, p in zip(args, problems, strict=True) if "cannot be given" not in p]
        usable = [p for _, p in pairs]
        if len(usable) > 1:  # the member of the value's own kind says why (nan: not finite)
            kind = [p for a, p in pairs if _of_kind(value, a)]
            usable = kind if len(kind) == 1 else usable
        return usable[0] if len(usable) == 1 else f"{value!r} is not of type {_name(annotation)}"
    if annotation is None or annotation is type(None):
        return None if value is None else f"{value!r} is not null"
    if annotation is bool:
        return None if isinstance(value, bool) else f"{value!r} is not true or false"
    if annotation is int:
        if whole_float(value) and abs(value) > EXACT_COUNT:  # past it, not read as a count
            return f"{value!r} is too large for a count (past 2^53)"
        ok = isinstance(value, int) and not isinstance(value, bool)
        return None if ok else f"{value!r} is not of type int"
    if annotation is float:
        if not is_number(value):
            return f"{value!r} is not of type float"
        return None if math.isfinite(value) else f"{value!r} is not finite"
    if annotation is str:
        return None if isinstance(value, str) else f"{value!r} is not of type str"
    if origin is typing.Literal:
        return None if value in args else f"{value!r} is not one of {list(args)}"
    if annotation in (list, tuple) or origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, list):
            return f"{value!r} is not a list"
        for item in value:
            problem = type_problem(item, args[0]) if args else None
            if problem:
                return f"an entry: {problem}"
        return None
    if annotation is dict or origin in (dict, collections.abc.Mapping):
        if not isinstance(value, dict):
            return f"{value!r} is not a mapping"
        for key, item in value.items():
            problem = type_problem(item, args[1]) if len(args) == 2 else None
            if problem:
                return f"{key}: {problem}"
        return None
    return f"{value!r}: a {_name(annotation)} cannot be given in a file"


def unknown_key(key: Any, known: Iterable[str], what: str) -> str:
    """'unknown key ...' with the closest known key as a suggestion; `key` as parsed from
    YAML or JSON (YAML's may be a number, a bool or null)."""
    known = sorted(known)
    return f"unknown key {key!r} ({what}); {did_you_mean(key, known)}known: {', '.join(known)}"


def signature_hints(fn: Callable[..., Any]) -> dict[str, Any]:
    """Parameter name -> annotation of `fn` (unresolvable annotations: Any)."""
    try:
        sig = inspect.signature(fn, eval_str=True)
    except (NameError, TypeError):
        sig = inspect.signature(fn)
    return {
        name: p.annotation
        for name, p in sig.parameters.items()
        if name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    }


def mapping_problems(
    data: dict[str, Any],
    hints: dict[str, Any],
    ranges: dict[str, Check] | None = None,
    *,
    prefix: str = "",
    what: str = "",
) -> list[str]:
    """Unknown keys, wrong types and out-of-range values of `data` against `hints`."""
    problems = []
    for key, value in data.items():
        if key not in hints:
            problems.append(f"{prefix}{key}: " + unknown_key(key, hints, what))
            continue
        problem = type_problem(value, hints[key])
        if problem is None and ranges and key in ranges and value is not None:  # None: off
            problem = ranges[key](value)
        if problem:
            problems.append(f"{prefix}{key}: {problem}")
    return problems


def dataclass_hints(cls: type) -> dict[str, Any]:
    """Field name -> resolved annotation of a dataclass."""
    hints = typing.get_type_hints(cls)
    return {f: hints[f] for f in cls.__dataclass_fields__}
