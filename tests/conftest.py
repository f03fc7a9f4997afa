"""Shared fixtures: the shared traces folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

_DEFAULT = Path(__file__).resolve().parents[1] / ".." / "shared" / "traces"
TRACES = Path(os.environ.get("BATCHPILOT_TRACES", _DEFAULT)).resolve()


@pytest.fixture
def traces() -> Path:
    """The shared public traces (../shared/traces beside the repo, or $BATCHPILOT_TRACES)."""
    if not TRACES.is_dir():
        pytest.skip(f"shared traces not found at {TRACES} (set BATCHPILOT_TRACES)")
    return TRACES
