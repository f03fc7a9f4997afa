"""Compare batch-size controllers on the same engine and workloads: every controller on
every workload and seed (in parallel processes), capacity by bisection over the Poisson
arrival rate, and a report (DIR/report.md, self-contained DIR/report.html, DIR/results.json).

`best-static` is resolved per workload by a grid search over static:N (the best mean score
in hindsight). Workloads are SOURCE@ARRIVAL: a trace path, embedded:NAME or
fixed:PROMPT:OUTPUT, and an arrival process (all-at-once, poisson:R, gamma:R:CV, replay).

examples:
  batchpilot compare --controllers static:256,alg1,alg2,alg1+alg2,oracle --seeds 3 --out out/cmp
  batchpilot compare --workload embedded:sharegpt@poisson:4 --workload fixed:128:128@all-at-once \\
      --controllers static:256,best-static,alg1 --profile llama-7b-a100 --out out/cmp2
  batchpilot compare --engine vllm --model /models/tiny --controllers static:64,alg1 --out out/v
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from batchpilot.training.commands.common import COUNT

DEFAULT_CONTROLLERS = "static:256,alg1,alg2,alg1+alg2,oracle"


DEFAULT_WORKLOAD = "embedded:azure-conv@replay:0.7"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controllers",
        default=DEFAULT_CONTROLLERS,
        help="comma-separated controller specs (static:N, alg1[:key=value...], alg2[:...], "
        "A+B, oracle, best-static). Default: %(default)s",
    )
    parser.add_argument(
        "--workload",
        action="append",
        help="SOURCE@ARRIVAL, repeatable; one table per workload. Default: "
        f"{DEFAULT_WORKLOAD} (Azure conversation at 0.7x its rate: near the 7B profile's "
        "capacity, where the limit matters)",
    )
    parser.add_argument(
        "--num-requests", type=COUNT, help="requests per run (default: whole trace, or 1000)"
    )
    parser.add_argument(
        "--overlong",
        choices=["error", "drop", "truncate"],
        default="truncate",
        help="requests longer than the model's context. Default: %(default)s",
    )
    parser.add_argument("--engine", choices=["sim", "vllm"], default="sim")
    parser.add_argument("--model", help="model directory for --engine vllm")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="real-engine setting, repeatable: num_gpu_blocks (KV pressure), max_num_seqs, "
        "max_model_len, max_num_batched_tokens, time_scale",
    )
    parser.add_argument(
        "--profile", default="llama-7b-a100", help="sim engine profile. Default: %(default)s"
    )
    parser.add_argument(
        "--scheduler",
        choices=("v1", "v0"),
        default="v1",
        help="simulated scheduling: v1 (vLLM V1: chunked prefills share steps with decodes) "
        "or v0 (vLLM V0: whole-prompt prefill steps first, decodes stall). Default: %(default)s",
    )
    parser.add_argument(
        "--slo", default="ttft:2000,tpot:50", help="goodput SLOs in ms. Default: %(default)s"
    )
    parser.add_argument("--interval", default="1it", help="control interval. Default: %(default)s")
    parser.add_argument("--seeds", type=COUNT, default=3, help="seeds 0..N-1. Default: %(default)s")
    parser.add_argument(
        "--capacity-slo",
        default="p90_itl_ms:50,p90_ttft_ms:2000",
        help="capacity = highest Poisson rate with every METRIC:MAX met. Default: %(default)s",
    )
    parser.add_argument(
        "--capacity-requests",
        type=COUNT,
        default=500,
        help="requests per capacity probe. Default: %(default)s",
    )
    parser.add_argument("--no-capacity", action="store_true", help="skip the capacity search")
    parser.add_argument(
        "--workers", type=COUNT, help="worker processes (default: CPU count; 1 for vllm)"
    )
    parser.add_argument("--out", type=Path, required=True, help="report directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def parse_workload(text: str) -> tuple[str, str]:
    """``SOURCE@ARRIVAL`` -> (source, arrival)."""
    source, sep, arrival = text.rpartition("@")
    if not sep or not source or not arrival:
        raise ValueError(f"workload {text!r}: use SOURCE@ARRIVAL, e.g. embedded:gsm8k@poisson:4")
    return source, arrival


def main(args: argparse.Namespace) -> int:
    from batchpilot.training.commands.common import write_json
    from batchpilot.training.engines import parse_engine_args
    from batchpilot.training.evaluate import CapacityTarget, Scenario, evaluate
    from batchpilot.training.report import write_report

    controllers = [c.strip() for c in args.controllers.split(",") if c.strip()]
    if args.seeds < 1:
        raise ValueError("--seeds must be >= 1")
    scenarios = []
    for text in args.workload or [DEFAULT_WORKLOAD]:
        source, arrival = parse_workload(text)
        scenarios.append(
            Scenario(
                name=f"{source} @ {arrival}",
                source=source,
                arrival=arrival,
                num_requests=args.num_requests,
                profile=args.profile,
                engine=args.engine,
                model=args.model,
                engine_args=parse_engine_args(args.engine_arg),
                scheduler=args.scheduler,
                slo=args.slo,
                interval=args.interval,
                overlong=args.overlong,
            )
        )
    capacity = None
    if not args.no_capacity:
        capacity = CapacityTarget.parse(args.capacity_slo, num_requests=args.capacity_requests)
    results = evaluate(
        scenarios,
        controllers,
        list(range(args.seeds)),
        capacity=capacity,
        workers=args.workers,
        progress=not args.no_progress,
    )
    command = "batchpilot " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    results["command"] = command
    write_json(args.out / "results.json", results)
    report = write_report(results, args.out, title="Controller comparison", command=command)
    print(f"wrote {report}, {args.out / 'report.html'}, {args.out / 'results.json'}")
    print(f"harness wall time {results['wall_s']:.1f} s on {results['workers']} worker(s)")
    return 0
