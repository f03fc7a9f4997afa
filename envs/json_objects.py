"""A JSON object hook for the files users hand in (traces, profiles): a key given twice is
an error, where `json` keeps the last value silently."""

from __future__ import annotations

from typing import Any


class DuplicateKeys(ValueError):
    """A JSON object that gives a key twice; its argument lists the keys."""


def unique_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """`json.loads`' ``object_pairs_hook``: the pairs as a dict, or `DuplicateKeys` naming
    every key given twice."""
    row = dict(pairs)
    if len(row) < len(pairs):
        keys = [k for k, _ in pairs]
        raise DuplicateKeys(", ".join(sorted({k for k in keys if keys.count(k) > 1})))
    return row
