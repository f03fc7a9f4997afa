"""The ``batchpilot`` command line: one subcommand per module in `training.commands`."""

from __future__ import annotations

import argparse
import importlib
import sys

from batchpilot.training.commands.common import OnceParser

SUBCOMMANDS = {
    "simulate": "Run a workload through the simulated engine with one controller.",
    "compare": "Compare controllers on workloads and seeds; write a report with plots.",
    "paper": "Reproduce the paper's Tables I and II in simulation; write a report.",
    "train": "Train a learned controller (imitation of mpc, then PPO) from a YAML config.",
    "evaluate": "Evaluate exported policies against the references on scenario suites.",
    "export": "Export a trained policy as ONNX + JSON sidecar, loadable as policy:PATH.",
    "quickstart": "Main job: train a small policy on the embedded default, export, compare.",
    "serve": "Start vLLM's OpenAI server with a batchpilot controller inside its scheduler.",
    "calibrate": "Fit the simulator's step-time model to a real vLLM engine; write a profile.",
    "profiles": "List the engine profiles (model, GPU, TP, KV capacity), or build one.",
}
"""Subcommand -> one-line help. Each lives in `batchpilot.training.commands.<name>` with
``add_arguments(parser)`` and ``main(args) -> int``; heavy imports stay inside ``main``."""


def build_parser() -> argparse.ArgumentParser:
    parser = OnceParser(  # an option given twice is refused, in every (sub)command
        prog="batchpilot",
        description=(
            "Tune how an LLM serving engine batches requests: simulate vLLM's scheduler, "
            "compare batch-size controllers (static, the paper's Algorithms 1 and 2, a learned "
            "policy), train and export policies, and deploy one inside vLLM."
        ),
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, help_text in SUBCOMMANDS.items():
        module = importlib.import_module(f"batchpilot.training.commands.{name.replace('-', '_')}")
        p = sub.add_parser(
            name,
            help=help_text,
            description=(module.__doc__ or help_text).strip(),
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )
        module.add_arguments(p)
        p.set_defaults(_main=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from batchpilot.envs import traces

    shown = traces.READ_PROGRESS
    traces.READ_PROGRESS = shown and not getattr(args, "no_progress", False)  # its bar too
    try:
        return int(args._main(args) or 0)
    except (ValueError, OSError) as exc:  # bad input: say what is wrong, no traceback
        print(f"batchpilot {args.command}: error: {exc}", file=sys.stderr)
        return 2
    finally:
        traces.READ_PROGRESS = shown


if __name__ == "__main__":
    sys.exit(main())
