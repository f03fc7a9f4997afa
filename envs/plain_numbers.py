"""Numbers, and on/off switches, as users write them in files and on the command line, and as
values."""

from __future__ import annotations

import numbers
from typing import Any


def is_number(value: Any) -> bool:
    """Whether `value` is a real number (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def is_whole(value: Any) -> bool:
    """Whether `value` is an integer (Python's or numpy's), not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def plain_float(text: str, *, padded: bool = False) -> float:
    """`float(text)` for a number written in ASCII without separators: Python's float also
    reads ``3_74`` as 374 and full-width or other scripts' digits, which no file or flag of
    ours means; a `ValueError` for those. Unless `padded` (a trace's cell, where a space after
    the comma is common) it also refuses what float forgives around the number: spaces and a
    leading ``+`` (an exponent's ``5e+1`` is the number itself)."""
    if not text.isascii() or "_" in text:
        raise ValueError(text)
    if not padded and (text != text.strip() or text.startswith("+")):
        raise ValueError(text)
    return float(text)


def plain_int(text: str, *, signed: bool = False) -> int:
    """`int(text)` for a whole number written in ASCII digits alone (after a ``-`` if
    `signed`: a range check then names a negative value): Python's int also reads ``+32``,
    `` 32 ``, ``3_2`` and other scripts' digits; a `ValueError` for those."""
    digits = text[1:] if signed and text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()):
        raise ValueError(text)
    return int(text)


SWITCHES = {"1": True, "true": True, "0": False, "false": False}
"""How an on/off setting is written in a spec (``alg2:chunk=1``) or an option
(``--engine-arg enable_chunked_prefill=true``)."""


def plain_switch(text: str) -> bool:
    """`SWITCHES`' value of `text`; a `ValueError` for anything else."""
    if text not in SWITCHES:
        raise ValueError(text)
    return SWITCHES[text]
