"""Helpers shared by tests (importable as `helpers`: pytest puts tests/ on the path)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from batchpilot.envs.profiles import PROFILES, EngineProfile, LinearStepModel, get_profile
from batchpilot.envs.step_models import StepModel


def unit_profile(
    num_gpu_blocks: int = 64, block_size: int = 4, budget: int = 100, max_num_seqs: int = 64
) -> EngineProfile:
    """Every step lasts exactly 1 s: times in tests count steps."""
    return EngineProfile(
        name="unit",
        description="unit-time test profile",
        block_size=block_size,
        num_gpu_blocks=num_gpu_blocks,
        max_model_len=4096,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=budget,
        step=LinearStepModel(base_s=1.0, prefill_token_s=0.0, decode_seq_s=0.0, kv_token_s=0.0),
    )


def profile_like(engine: Any, step: StepModel, name: str, description: str) -> EngineProfile:
    """A profile with a real engine's shape (blocks, context, caps) and the given step times."""
    return EngineProfile(
        name=name,
        description=description,
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_total_blocks,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        step=step,
    )


def assert_profile_file_refused(
    tmp_path: Path, name: str, edit: Callable[[dict], object], message: str
) -> None:
    """Shipped profile `name` as a file, changed by `edit`, is refused with `message`
    (a regex) and the file's path."""
    data = json.loads(PROFILES[name].to_json())
    edit(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(ValueError, match=message) as info:
        get_profile(str(path))
    assert str(path) in str(info.value)


CONFIGS = Path(__file__).resolve().parents[1] / "training" / "configs"
"""The committed training configs and suites (`experiments/` holds the recipes not shipped)."""


def train_configs() -> list[str]:
    """Every committed training config (suites left out), as a path under `CONFIGS`."""
    paths = sorted(CONFIGS.rglob("*.yml"))
    return [str(p.relative_to(CONFIGS)) for p in paths if "batchpilot/Batching-v0:" in p.read_text()]
