"""A tiny random-weight Llama checkpoint for the real engine's tests and calibration.

Throughput and latency depend on a model's shapes, not its weights, so a random-weight
model of a real architecture stands in for a downloaded one where there is no hub.
"""

from __future__ import annotations

from pathlib import Path

TINY_LLAMA = {
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "vocab_size": 2048,
    "max_position_embeddings": 4096,
}


def tiny_llama(directory: str | Path, seed: int = 0) -> Path:
    """Write a random-weight bf16 Llama (3.7 M parameters) to `directory`; reuse one there."""
    path = Path(directory)
    if (path / "config.json").is_file() and any(path.glob("*.safetensors")):
        return path
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(**TINY_LLAMA, torch_dtype="bfloat16")
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    return path
