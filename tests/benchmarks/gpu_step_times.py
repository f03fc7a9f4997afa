"""A measured profile's step model against a real GPU: one Llama-shaped model's forward pass
timed on a CUDA GPU, beside the profile's step time less its CPU overheads.

``measure`` (needs torch and a CUDA GPU) builds the model (a known name or a Hugging Face
config.json, `architecture`) with random bf16 weights (all layers, embedding, LM head over one row per request) and times one engine
step per case: pure decode (B requests at context L), one fresh prompt of P tokens in one
chunk, and a chunk beside decodes. Attention is torch's scaled-dot-product attention
(FlashAttention on Hopper) over contiguous KV, not vLLM's paged kernels. Each case is
captured in a CUDA graph and replayed, so the figure is GPU time, as vLLM's graphs run
decode; the median of ``--repeats`` replays (CUDA events) is kept.

``--tp N`` times one GPU's shard of a tensor-parallel engine (query and KV heads, the MLP's
intermediate size, the embedding and the LM head's vocabulary split N ways; KV heads replicated
where fewer than N, as vLLM does) with no all-reduce: one GPU cannot time NCCL across N.

``compare`` (CPU) reads that file and prints, per case, the measured ms, the profile's
``step.time`` less ``step_overhead_s + seq_overhead_s x requests`` (its CPU part, which a
GPU measurement does not contain) and, for a shard, less the profile's all-reduce (Vidur's
measured NCCL table, two per layer), and their ratio.

    python tests/benchmarks/gpu_step_times.py measure --model llama-2-7b --out h100.json
    python tests/benchmarks/gpu_step_times.py compare h100.json --profile llama-2-7b-h100
    python tests/benchmarks/gpu_step_times.py measure --model codellama-34b --out cl34-h100.json
    batchpilot profiles build --model codellama-34b --gpu h100 --tp 1 --out cl34.json
    python tests/benchmarks/gpu_step_times.py compare cl34-h100.json --profile cl34.json
    python tests/benchmarks/gpu_step_times.py measure --model llama-2-70b --tp 4 --out 70b-tp4.json
    python tests/benchmarks/gpu_step_times.py compare 70b-tp4.json --profile llama-2-70b-h100x4
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
from collections.abc import Callable
from pathlib import Path

from batchpilot.envs.profile_tables import load_tables
from batchpilot.envs.profiles import (
    ARCHITECTURES,
    GPUS,
    Architecture,
    EngineProfile,
    all_reduce_layer_ms,
    architecture,
    get_profile,
)

DECODE_BATCHES = (1, 4, 16, 32, 64, 128, 256)
DECODE_CONTEXTS = (512, 2048)
PREFILL_TOKENS = (128, 256, 512, 1024, 2048, 4096)
MIXED = ((128, 16, 1024), (512, 16, 1024), (512, 64, 1024), (2048, 64, 1024))
"""(prefill tokens, decode requests, decode context) of the mixed steps."""


def cases() -> list[tuple[int, int, int]]:
    """Every case as (prefill tokens of one fresh prompt, decode requests, their context)."""
    out = [(0, b, c) for c in DECODE_CONTEXTS for b in DECODE_BATCHES]
    out += [(p, 0, 0) for p in PREFILL_TOKENS]
    return out + list(MIXED)


def measure(arch: Architecture, repeats: int, tp: int = 1) -> dict:
    """Time every case on the current CUDA device, one GPU's shard of `tp` (see the module
    docstring)."""
    import torch
    import torch.nn.functional as F

    dev, dt = torch.device("cuda"), torch.bfloat16
    torch.manual_seed(0)
    h, d = arch.hidden, arch.head_dim
    for what, n in (("heads", arch.heads), ("intermediate", arch.intermediate)):
        if tp < 1 or n % tp:
            raise SystemExit(f"{arch.title}'s {what} ({n}) do not split {tp} ways")
    if arch.kv_heads % tp and tp % arch.kv_heads:  # vLLM splits or replicates them evenly
        raise SystemExit(f"{arch.title}'s {arch.kv_heads} KV heads do not split {tp} ways")
    nq, inter, vocab = arch.heads // tp, arch.intermediate // tp, -(-arch.vocab // tp)
    nkv = int(arch.kv_heads_per_gpu(tp))

    def weight(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, device=dev, dtype=dt) / cols**0.5

    layers = [
        {
            "qkv": weight((nq + 2 * nkv) * d, h),
            "o": weight(h, nq * d),
            "gate_up": weight(2 * inter, h),
            "down": weight(h, inter),
            "norm1": torch.ones(h, device=dev, dtype=dt),
            "norm2": torch.ones(h, device=dev, dtype=dt),
        }
        for _ in range(arch.layers)
    ]
    embed, lm_head = weight(vocab, h), weight(vocab, h)
    most_kv = max(b * c for _, b, c in cases())
    # one KV store read by every layer: the bytes each layer reads are real, the footprint is
    # one layer's (all layers' KV at B=256, L=2,048 would not fit)
    kv_store = torch.randn(2, most_kv, nkv, d, device=dev, dtype=dt)

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5).to(dt) * w

    def forward(ids: torch.Tensor, p: int, b: int, c: int) -> torch.Tensor:
        x = embed[ids]
        for w in layers:
            q, k, v = F.linear(rms(x, w["norm1"]), w["qkv"]).split([nq * d, nkv * d, nkv * d], -1)
            outs = []
            if p:
                qp = q[:p].view(1, p, nq, d).transpose(1, 2)
                kp = k[:p].view(1, p, nkv, d).transpose(1, 2)
                vp = v[:p].view(1, p, nkv, d).transpose(1, 2)
                o = F.scaled_dot_product_attention(qp, kp, vp, is_causal=True, enable_gqa=True)
                outs.append(o.transpose(1, 2).reshape(p, nq * d))
            if b:
                qd = q[p:].view(b, 1, nq, d).transpose(1, 2)
                kd = kv_store[0, : b * c].view(b, c, nkv, d).transpose(1, 2)
                vd = kv_store[1, : b * c].view(b, c, nkv, d).transpose(1, 2)
                o = F.scaled_dot_product_attention(qd, kd, vd, enable_gqa=True)
                outs.append(o.transpose(1, 2).reshape(b, nq * d))
            x = x + F.linear(torch.cat(outs) if len(outs) > 1 else outs[0], w["o"])
            gate, up = F.linear(rms(x, w["norm2"]), w["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        rows = torch.cat([x[p - 1 : p], x[p:]]) if p else x  # one sampled row per request
        return F.linear(rows, lm_head)

    results = []
    for p, b, c in cases():
        ids = torch.randint(0, vocab, (p + b,), device=dev)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(3):  # warm-up: kernel selection, allocator
                forward(ids, p, b, c)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph), torch.no_grad():
            forward(ids, p, b, c)
        times = []
        for _ in range(repeats):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        del graph
        row = {"prefill_tokens": p, "decode_seqs": b, "decode_context": c}
        row |= {"ms": statistics.median(times), "ms_min": min(times)}
        results.append(row)
        print(f"P={p:5d} B={b:4d} L={c:5d}: {row['ms']:8.3f} ms (min {row['ms_min']:.3f})")
    props = torch.cuda.get_device_properties(dev)
    return {
        "date": datetime.date.today().isoformat(),
        "device": props.name,
        "device_memory_gib": round(props.total_memory / 2**30, 2),
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "model": arch.title,
        "tp": tp,
        "dtype": "bfloat16",
        "repeats": repeats,
        "method": "whole forward (embedding, layers, LM head on one row per request) in a "
        "CUDA graph; median of replays timed with CUDA events; SDPA attention over "
        "contiguous KV" + (f"; one GPU's shard of TP {tp}, no all-reduce" if tp > 1 else ""),
        "cases": results,
    }


def all_reduce_s(profile: EngineProfile) -> Callable[[int], float]:
    """The profile's all-reduce time in a step of so many tokens: two per layer of tokens x
    hidden x 2 bytes, read off Vidur's NCCL table of its GPU and TP (0 at TP 1)."""
    tp = profile.tensor_parallel_size
    if tp == 1:
        return lambda tokens: 0.0
    arch = next((a for a in ARCHITECTURES.values() if a.title == profile.model), None)
    gpu = next((g for g in GPUS.values() if g.title == profile.gpu), None)
    if arch is None or gpu is None or gpu.vidur_network is None:
        raise SystemExit(
            f"{profile.name}: a shard is compared with the shipped tables' all-reduce, for a "
            f"known model and an NVLink GPU ({profile.model} on {profile.gpu} is not)"
        )
    net = load_tables()["all_reduce"][gpu.vidur_network][str(tp)]
    return lambda tokens: arch.layers * all_reduce_layer_ms(arch, net, tokens) * 1e-3


def compare(data: dict, profile: EngineProfile) -> list[dict]:
    """Per case: measured ms, the profile's GPU part (ms; a shard's less the all-reduce)
    and model / measured."""
    tp = data.get("tp", 1)
    if tp != profile.tensor_parallel_size:
        raise SystemExit(
            f"the measurement is of TP {tp}, {profile.name} of TP {profile.tensor_parallel_size}"
        )
    step, all_reduce = profile.step, all_reduce_s(profile)
    cpu = getattr(step, "step_overhead_s", 0.0), getattr(step, "seq_overhead_s", 0.0)
    rows = []
    for case in data["cases"]:
        p, b, c = case["prefill_tokens"], case["decode_seqs"], case["decode_context"]
        seqs = (1 if p else 0) + b
        model_s = step.time(1 if p else 0, p, p, p * p, b, b * c) - cpu[0] - cpu[1] * seqs
        model_s -= all_reduce(p + b)
        rows.append(case | {"model_ms": model_s * 1e3, "ratio": model_s * 1e3 / case["ms"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    m = sub.add_parser("measure", help="time the cases on this machine's CUDA GPU")
    m.add_argument(
        "--model",
        default="llama-2-7b",
        help=f"{' | '.join(ARCHITECTURES)}, or a Hugging Face config.json. Default: %(default)s",
    )
    m.add_argument("--repeats", type=int, default=50)
    m.add_argument("--tp", type=int, default=1, help="time one GPU's shard of this TP size")
    m.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="a measurement beside a profile's step model")
    c.add_argument("measured", type=Path)
    c.add_argument("--profile", required=True)
    args = parser.parse_args()
    if args.command == "measure":
        data = measure(architecture(args.model), args.repeats, args.tp)
        args.out.write_text(json.dumps(data, indent=1) + "\n")
        return
    data = json.loads(args.measured.read_text())
    rows = compare(data, get_profile(args.profile))
    shard = f", one shard of TP {data['tp']}" if data.get("tp", 1) > 1 else ""
    print(f"{data['model']} on {data['device']}{shard} (torch {data['torch']}) vs {args.profile}")
    print(f"{'P':>5} {'B':>4} {'L':>5} {'measured ms':>12} {'model ms':>9} {'model/meas':>10}")
    for r in rows:
        print(
            f"{r['prefill_tokens']:5d} {r['decode_seqs']:4d} {r['decode_context']:5d} "
            f"{r['ms']:12.3f} {r['model_ms']:9.3f} {r['ratio']:10.2f}"
        )
    ratios = [r["ratio"] for r in rows]
    print(
        f"model/measured: median {statistics.median(ratios):.2f}, "
        f"range {min(ratios):.2f}-{max(ratios):.2f}"
    )


if __name__ == "__main__":
    main()
