"""The one check of a controller's settings: a ValueError naming the setting and its value."""

from __future__ import annotations


def require(ok: bool, name: str, value: object, need: str) -> None:
    """Raise ``ValueError("{name} must be {need}, got {value}")`` unless `ok`; `name` as a
    user writes it in a spec (``alg2:chunk_min=0``)."""
    if not ok:
        raise ValueError(f"{name} must be {need}, got {value}")
