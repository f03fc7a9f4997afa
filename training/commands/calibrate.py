"""Measure a real vLLM engine's iteration times (schedule, forward pass, outputs) across
batch sizes, prefill chunk sizes and context lengths, fit the simulator's step-time model
to them, and write an engine profile (JSON) the simulator takes as ``--profile PATH``.

The profile's KV cache is the engine's (block size, blocks) and its caps are the ones the
engine ran with. Set OMP_NUM_THREADS before starting (1 gives the steadiest times on CPU).

examples:
  OMP_NUM_THREADS=1 batchpilot calibrate --model /tmp/tiny --out profiles/cpu-tiny.json
  batchpilot simulate --profile profiles/cpu-tiny.json --controller alg1
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model directory vLLM can load")
    parser.add_argument("--out", type=Path, required=True, help="profile JSON to write")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument("--max-num-seqs", type=int, default=64, help="largest batch. Default: 64")
    parser.add_argument(
        "--max-model-len", type=int, default=2048, help="context length. Default: 2048"
    )
    parser.add_argument(
        "--max-num-batched-tokens", type=int, default=2048, help="token budget. Default: 2048"
    )
    parser.add_argument(
        "--num-gpu-blocks", type=int, help="KV blocks (default: what vLLM allocates)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs of the grid. Default: 2")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    import time

    from rich.progress import Progress

    from batchpilot.envs.calibration import calibration_workloads, fit_step_model
    from batchpilot.envs.profiles import EngineProfile
    from batchpilot.envs.telemetry import Limits
    from batchpilot.envs.vllm_engine import make_vllm_engine

    engine = make_vllm_engine(
        args.model,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks,
    )
    runs = calibration_workloads(engine.max_model_len, engine.max_num_seqs)
    samples: list[tuple[int, int, int, float]] = []
    warm = runs[len(runs) // 2][0]
    engine.reset(warm, Limits(engine.max_num_seqs))  # first steps are slow: not measured
    while not engine.done:
        engine.advance(max_iterations=100)
    tracker = engine.scheduler.tracker
    with Progress(disable=args.no_progress) as bar:
        task = bar.add_task("calibrating", total=len(runs) * args.repeats)
        for _ in range(args.repeats):
            for workload, batch in runs:
                engine.reset(workload, Limits(batch))
                while not engine.done:  # a whole iteration, as the simulator's step is
                    start = time.perf_counter()
                    engine.advance(max_iterations=1)
                    prefill, decode, kv, _ = tracker.step_log[-1]
                    samples.append((prefill, decode, kv, time.perf_counter() - start))
                bar.advance(task)
    fit = fit_step_model(samples)
    name = args.name or args.out.stem
    profile = EngineProfile(
        name=name,
        description=(
            f"{args.model} measured by batchpilot calibrate ({fit.samples} steps, R^2 "
            f"{fit.r2:.3f}, median |error| {fit.median_abs_rel_error:.1%})"
        ),
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_total_blocks,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        step=fit.model,
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(profile.to_json() + "\n")
    m = fit.model
    print(
        f"fitted {fit.samples} steps: base {m.base_s * 1e3:.3f} ms + {m.prefill_token_s * 1e6:.3f} "
        f"us/prefill token + {m.decode_seq_s * 1e6:.2f} us/decode request + "
        f"{m.kv_token_s * 1e9:.2f} ns/KV token; R^2 {fit.r2:.3f}, median |error| "
        f"{fit.median_abs_rel_error:.1%}"
    )
    print(f"wrote {args.out}")
    return 0
