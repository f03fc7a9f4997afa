"""Arguments and helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from batchpilot.envs.embedded import EMBEDDED_PREFIX


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """--trace / --arrival / --num-requests / --seed / --overlong."""
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--trace",
        default=f"{EMBEDDED_PREFIX}azure-conv",
        help="trace file (Azure CSV, ShareGPT/GSM8K length CSV, Mooncake JSONL, BurstGPT CSV; "
        "format detected from the header) or embedded:NAME (azure-conv, azure-code, sharegpt, "
        "gsm8k: length tables shipped with batchpilot). Default: %(default)s",
    )
    g.add_argument(
        "--arrival",
        default="replay",
        help="all-at-once | poisson:RATE | gamma:RATE:CV | replay[:SCALE] (the trace's own "
        "timestamps, SCALE x the rate; on an embedded table, its fitted Gamma process). "
        "Default: %(default)s",
    )
    g.add_argument(
        "--num-requests",
        type=int,
        default=None,
        help="first N requests of a trace (default: all), or N drawn from an embedded table "
        "(default: 1000)",
    )
    g.add_argument("--seed", type=int, default=0, help="seed for sampled lengths and arrivals")
    g.add_argument(
        "--overlong",
        choices=["error", "drop", "truncate"],
        default="error",
        help="requests longer than the model's context: stop with an error (default), drop "
        "them, or truncate prompt then output",
    )


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
