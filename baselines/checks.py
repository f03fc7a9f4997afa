"""The checks of a controller's settings: a ValueError naming the setting and its value."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

MAX_LIMIT = 2**31 - 1
"""The largest limit (requests or tokens) a controller's setting may give: a 32-bit int, as
vLLM's own limits."""


def require(ok: bool, name: str, value: object, need: str) -> None:
    """Raise ``ValueError("{name} must be {need}, got {value}")`` unless `ok`; `name` as a
    user writes it in a spec (``alg2:chunk_min=0``)."""
    if not ok:
        raise ValueError(f"{name} must be {need}, got {value}")


def keyword_value(key: str, parse: Callable[[str], T], text: str) -> T:
    """`parse(text)` for the spec keyword `key`; its ValueError is ``"{key}='{text}': why"``."""
    try:
        return parse(text)
    except ValueError as exc:
        raise ValueError(f"{key}={text!r}: {exc}") from None
