"""Names a user types (controllers, profiles, config keys): the closest known one, for errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the known name closest to `name` (a string), or ``""``."""
    close = difflib.get_close_matches(name, list(known), n=1) if isinstance(name, str) else []
    return f"did you mean {close[0]!r}? " if close else ""
