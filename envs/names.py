"""Names a user types (controllers, profiles, config keys): the closest known one, for errors."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(name: object, known: Iterable[str]) -> str:
    """``"did you mean 'x'? "`` for the known name closest to `name` (a string, compared
    regardless of case: ``A100`` is ``a100``), or ``""``."""
    if not isinstance(name, str):
        return ""
    by_case = {k.lower(): k for k in known}
    close = difflib.get_close_matches(name.lower(), list(by_case), n=1)
    return f"did you mean {by_case[close[0]]!r}? " if close else ""
