"""List the simulator's engine profiles, or build one from Vidur's operator profiles.

A profile is one deployment: model, GPU, tensor parallelism, KV-cache capacity (as vLLM
computes it: GPU memory x gpu_memory_utilization, less weights, activation peak and a
runtime reserve, in 16-token blocks) and a step-time model. ``table (measured)`` profiles
take their step times from per-operator GPU measurements (Vidur: linear layers per token
count, attention fitted to the one measured table and scaled, NCCL all-reduce) plus
explicit per-step and per-request CPU overheads; ``table (carried)`` ones the same with
another GPU's linear layers, carried over by the datasheets' bandwidth and FLOPs; ``linear``
ones from a roofline or a `batchpilot calibrate` fit. `batchpilot profiles --json` prints
each profile's sources.

examples:
  batchpilot profiles
  batchpilot profiles --json
  batchpilot profiles build --model llama-2-70b --gpu a100 --tp 4 --out profiles/70b-tp4.json
  batchpilot profiles build --model llama-3-8b --gpu a100 --tp 1 --gpu-memory-gib 22 \\
      --gpu-memory-utilization 0.9 --out profiles/8b-24gb.json
  batchpilot profiles build --model llama-2-70b --gpu h200 --tp 2 --out profiles/70b-h200x2.json
  batchpilot profiles build --model ~/models/internlm-20b/config.json \\
      --vidur-model internlm/internlm-20b --gpu h100 --vidur ~/vidur/data/profiling \\
      --out profiles/internlm-20b-h100.json
  batchpilot simulate --profile profiles/70b-tp4.json --controller alg1
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import json
from pathlib import Path

from batchpilot.envs.input_files import path_arg
from batchpilot.envs.profiles import (
    GPUS,
    INT_LIMITS,
    MIN_MODEL_LEN,
    RUNTIME_RESERVE_GIB,
    SEQ_OVERHEAD_S,
    STEP_OVERHEAD_S,
    TP_SIZES,
    Architecture,
    measured_profile,
)
from batchpilot.training.commands.common import (
    COUNT,
    check_output,
    check_replaceable,
    fraction,
    is_profile_json,
    non_negative,
    positive,
    whole,
)

DEFAULT_VIDUR = Path("..") / "shared" / "profiling" / "vidur"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the profiles as JSON")
    sub = parser.add_subparsers(dest="action", metavar="[build]")
    build = sub.add_parser(
        "build",
        help="build a measured profile from a Vidur profiling directory",
        description=(
            "Derive the step-time tables from --vidur (see `python -m "
            "batchpilot.envs.profile_tables --help`) and build one profile. The CPU overheads "
            f"are explicit parameters: the defaults ({STEP_OVERHEAD_S * 1e3:g} ms per step, "
            f"{SEQ_OVERHEAD_S * 1e6:g} us per scheduled request) are an assumption for vLLM V1 "
            "whose sources each profile states (`batchpilot profiles --json`, "
            "step.source.overheads)."
        ),
    )
    build.add_argument(
        "--model",
        required=True,
        help="llama-2-7b | llama-2-70b | llama-3-8b | llama-3-70b | codellama-34b, or a "
        "Hugging Face config.json (file or directory) of another Llama-family model",
    )
    build.add_argument(
        "--vidur-model",
        metavar="ORG/NAME",
        help="with a config.json: the model's directory under the Vidur profiles' "
        "compute/<gpu>/ (default: the config's _name_or_path)",
    )
    build.add_argument(
        "--gpu",
        required=True,
        choices=tuple(GPUS),
        help="the GPU: Vidur measured "
        + ", ".join(k for k, g in GPUS.items() if g.vidur_compute)
        + " (some models on some); the others take their own compute/<gpu>/ tables where "
        "--vidur has them, and else (as a model Vidur did not time on the GPU) the nearest "
        "measured GPU's timings, carried over by the datasheets' bandwidth and FLOPs (the "
        "profile's step.source says which)",
    )
    build.add_argument(
        "--tp",
        type=COUNT,
        choices=TP_SIZES,  # checked before Vidur's tables are read
        default=1,
        help="tensor parallel size: 1, 2, 4 or 8. Default: 1",
    )
    build.add_argument(
        "--gpu-memory-gib", type=positive, help="memory per GPU (default: the GPU's)"
    )
    defaults = inspect.signature(measured_profile).parameters
    build.add_argument(
        "--gpu-memory-utilization",
        type=fraction,
        default=defaults["gpu_memory_utilization"].default,
        help="the share of GPU memory vLLM takes (its --gpu-memory-utilization); the KV cache "
        "gets what the weights and activations leave. Default: %(default)s",
    )
    for option, what in (
        ("max_num_seqs", "the engine's cap on running requests (vLLM's --max-num-seqs)"),
        ("max_num_batched_tokens", "the engine's cap on tokens a step (vLLM's "
         "--max-num-batched-tokens)"),
        ("block_size", "tokens per KV cache block"),
    ):  # fmt: skip
        build.add_argument(
            f"--{option.replace('_', '-')}",
            type=whole(1, INT_LIMITS[option]),
            default=defaults[option].default,
            help=f"{what}. Default: %(default)s",
        )
    build.add_argument(
        "--max-model-len",
        type=whole(MIN_MODEL_LEN, INT_LIMITS["max_model_len"]),
        help="the context vLLM serves (its --max-model-len), at most the model's. Default: "
        "the model's (its config's, with RoPE scaling as vLLM reads it)",
    )
    build.add_argument(
        "--step-overhead-ms",
        type=non_negative,
        help=f"CPU time per step on the critical path. Default: {STEP_OVERHEAD_S * 1e3:g}",
    )
    build.add_argument(
        "--seq-overhead-us",
        type=non_negative,
        help=f"CPU time per scheduled request per step. Default: {SEQ_OVERHEAD_S * 1e6:g}",
    )
    build.add_argument(
        "--runtime-reserve-gib",
        type=non_negative,
        help=f"non-torch memory and CUDA graphs per GPU. Default: {RUNTIME_RESERVE_GIB:g}",
    )
    build.add_argument(
        "--vidur",
        type=path_arg,
        default=DEFAULT_VIDUR,
        help="Vidur profiling directory (compute/, network/: data/profiling of a "
        "github.com/microsoft/vidur checkout). Default: %(default)s, relative to the working "
        "directory (the project root's sibling shared/)",
    )
    build.add_argument("--name", help="profile name (default: the output file's stem)")
    build.add_argument("--out", type=path_arg, required=True, help="profile JSON to write")


def _table(rows: list[dict]) -> str:
    cols = [
        ("name", "name", "<"),
        ("model", "model", "<"),
        ("tp", "TP", ">"),
        ("context", "context", ">"),
        ("kv_capacity_tokens", "KV tokens", ">"),
        ("step_model", "step model", "<"),
        ("gpu", "GPU", "<"),
    ]
    cells = [[h for _, h, _ in cols]]
    for r in rows:
        cells.append(
            [f"{r[k]:,}" if isinstance(r[k], int) and k != "tp" else str(r[k]) for k, _, _ in cols]
        )
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    lines = []
    for row in cells:
        parts = [f"{c:{a}{w}}" for c, (_, _, a), w in zip(row, cols, widths, strict=True)]
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    from batchpilot.envs.profiles import PROFILES

    if args.action == "build":
        return _build(args)
    rows = []
    for p in PROFILES.values():
        row = p.summary()
        if args.json:
            row["step"] = p.step.to_dict()
            for key in ("token_knots", "token_s", "seq_knots", "seq_s"):
                row["step"].pop(key, None)  # the tables themselves: see the profile JSON
        rows.append(row)
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        print(_table(rows))
        print("\n`batchpilot profiles --json` for descriptions and sources of each step model.")
    return 0


def _check_shape(model: Architecture, table: Path) -> None:
    """`table` was measured on `model`'s shape: another model's times would pass for its own
    (a ValueError naming both)."""
    from batchpilot.envs.profile_tables import SHAPE_COLUMNS, table_shape

    shape = table_shape(table)
    if not shape:
        print(f"note: {table} names no model shape ({', '.join(SHAPE_COLUMNS)}): not checked")
        return
    shape = {**shape, "head_dim": shape["hidden"] // shape["heads"]}  # Vidur's heads: even
    mine = {k: getattr(model, k) for k in shape}
    differ = [f"{k} {mine[k]:,} vs {v:,}" for k, v in shape.items() if mine[k] != v]
    if differ:
        raise ValueError(
            f"{model.title}'s shape differs from the one {table} was measured on "
            f"({'; '.join(differ)}): its times are another model's; give --vidur-model the "
            "directory of a table measured on this shape"
        )


def _build(args: argparse.Namespace) -> int:
    from batchpilot.envs.profile_tables import derive, linear_tables
    from batchpilot.envs.profiles import (
        ARCHITECTURES,
        architecture,
        linear_table_keys,
        write_profile,
    )

    if not args.vidur.is_dir():
        where = "" if args.vidur.is_absolute() else f"; relative to {Path.cwd()}"
        what = "a file, not a directory" if args.vidur.exists() else "no such directory"
        raise ValueError(
            f"{args.vidur}: {what} (--vidur{where}); give the data/profiling directory of a "
            "github.com/microsoft/vidur checkout"
        )
    if not (args.vidur / "compute").is_dir():
        raise ValueError(
            f"{args.vidur}: no compute/ directory, so not Vidur's data/profiling (--vidur); "
            "give the data/profiling directory of a github.com/microsoft/vidur checkout"
        )
    check_output(args.out, "--out", directory=False, replaced=True)
    check_replaceable(args.out, "--out", "a profile", is_profile_json)
    optional = {
        "gpu_memory_gib": args.gpu_memory_gib,
        "step_overhead_s": None if args.step_overhead_ms is None else args.step_overhead_ms / 1e3,
        "seq_overhead_s": None if args.seq_overhead_us is None else args.seq_overhead_us / 1e6,
        "runtime_reserve_gib": args.runtime_reserve_gib,
    }
    model = architecture(args.model, args.vidur_model)
    gpu = GPUS[args.gpu]
    keys = list(linear_table_keys(args.gpu, model.vidur_name).values())
    if not any((args.vidur / "compute" / k / "mlp.csv").is_file() for k in keys):
        have = sorted("/".join(p.parts[-4:-1]) for p in args.vidur.glob("compute/*/*/*/mlp.csv"))
        hint = ""
        names = sorted({h.split("/", 1)[1] for h in have} - {model.vidur_name})
        packed = [k for k in keys if (args.vidur / "compute" / k / "mlp.csv.gz").is_file()]
        if packed:
            hint = f"; compute/{packed[0]}/mlp.csv.gz is compressed: gunzip it"
        elif args.model not in ARCHITECTURES and args.vidur_model is None and names:
            near = difflib.get_close_matches(model.vidur_name, names, n=1, cutoff=0)
            hint = (
                f"; a model Vidur timed under another name: --vidur-model NAME, the name after "
                f"the GPU (e.g. --vidur-model {near[0]})"
            )
        raise ValueError(
            f"no linear-layer table for {model.title} on {gpu.title} or a GPU to carry from "
            f"(Vidur compute/{{{','.join(keys)}}}/mlp.csv); measured: "
            f"{', '.join(have) or 'none'}{hint}"
        )
    # only the file this profile uses: the first with its TP (a broken table of a GPU it
    # would not carry from stops nothing; one it passes over is said)
    use = keys  # none usable: all, for `measured_profile` to say what each has
    for key in keys:
        path = args.vidur / "compute" / key / "mlp.csv"
        if not path.exists():
            continue
        if not path.is_file():
            print(f"note: {path} is not a file: passed over")
            continue
        if str(args.tp) not in linear_tables(path):
            print(f"note: {path} has no rows at TP {args.tp}: passed over")
            continue
        use = [key]
        break
    if len(use) == 1:
        _check_shape(model, args.vidur / "compute" / use[0] / "mlp.csv")
    tables = derive(args.vidur, use, gpu.vidur_network)
    profile = measured_profile(
        tables,
        model,
        args.gpu,
        args.tp,
        name=args.out.stem if args.name is None else args.name,  # --name '': refused
        gpu_memory_utilization=args.gpu_memory_utilization,
        block_size=args.block_size,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=args.max_num_batched_tokens,
        max_model_len=args.max_model_len,
        **{k: v for k, v in optional.items() if v is not None},
    )
    write_profile(profile, args.out)
    one = profile.step.decode_time(1, 1) * 1e3  # a unit slip in the tables shows here
    print(f"wrote {args.out}: {profile.description}; a one-request decode step {one:.3g} ms")
    if (extended := profile.step.source["extended"]) != "none":
        print(f"note: past the measured sizes, extended linearly: {extended}")
    return 0
