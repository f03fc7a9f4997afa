"""Run a workload through the simulated vLLM engine with one controller, print the
metrics (``vllm bench serve`` names) and optionally write them as JSON.

examples:
  batchpilot simulate                                   # embedded Azure-conversation lengths
  batchpilot simulate --profile llama-7b-a100 --controller static:256 --json out/conv.json \\
      --workload ../shared/traces/azure2023/AzureLLMInferenceTrace_conv.csv@replay
  batchpilot simulate --workload embedded:gsm8k@all-at-once --num-requests 1319 \\
      --profile llama-65b-8xa100 --controller static:256
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING

from batchpilot.envs.input_files import path_arg
from batchpilot.envs.metrics import DEFAULT_SLO
from batchpilot.training.commands.common import (
    add_engine_arguments,
    add_workload_arguments,
    check_output,
    check_replaceable,
    one_controller,
    parse_workload,
    slo_spec,
    write_json,
)

if TYPE_CHECKING:
    from batchpilot.envs.run import Timeline


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_workload_arguments(parser)
    add_engine_arguments(parser)
    parser.add_argument(
        "--controller",
        type=one_controller("simulate"),
        default="static:256",
        help="controller spec, e.g. static:256. Default: %(default)s",
    )
    parser.add_argument(
        "--interval",
        help="how often the controller decides: Nit (engine iterations, 1 to 1,000,000) or "
        "Nms / Ns (engine time, 1ms to 3600s). Default: a learned policy's trained interval, "
        "else 1it",
    )
    parser.add_argument(
        "--slo",
        type=slo_spec,
        default=str(DEFAULT_SLO),
        help="goodput SLOs in ms, as for `vllm bench serve --goodput`, at least one objective "
        "(ttft, tpot, e2el). Default: %(default)s",
    )
    parser.add_argument(
        "--json",
        type=path_arg,
        help="write the aggregate metrics to this file (an existing file only if an earlier "
        "--json wrote it)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    from rich.console import Console
    from rich.table import Table

    from batchpilot.agents.specs import make_controller
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.metrics import SLO
    from batchpilot.envs.profiles import get_profile, unreachable_tpot
    from batchpilot.envs.run import run
    from batchpilot.envs.sim_engine import SimEngine
    from batchpilot.envs.workloads import make_workload

    if args.json is not None:
        check_output(args.json, "--json", directory=False)
        check_replaceable(
            args.json,
            "--json",
            "a metrics file that simulate wrote",
            lambda data: isinstance(data, dict) and set(METRICS_KEYS) <= data.keys(),
        )
    profile = get_profile(args.profile)
    source, arrival = parse_workload(args.workload)
    workload = make_workload(
        source,
        arrival,
        num_requests=args.num_requests,
        seed=args.seed,
        max_model_len=profile.max_model_len,
        overlong=args.overlong,
        bad_rows=args.bad_rows,
    )
    controller = make_controller(args.controller)
    trained = getattr(controller, "control_interval", None)
    interval = ControlInterval.parse(args.interval) if args.interval is not None else trained
    engine = SimEngine(profile, slo=SLO.parse(args.slo), scheduler=args.scheduler)
    if interval is not None and interval.seconds is not None:
        span = float(workload.arrival_s[-1]) if len(workload) else 0.0
        if (decisions := span / interval.seconds) > MANY_DECISIONS:
            print(
                f"note: the arrivals span {span:,.0f} s: {decisions:,.0f} decisions or more at "
                f"--interval {interval}, idle stretches included; a coarser interval runs faster",
                file=sys.stderr,
            )
    out = run(workload, engine, controller, interval, progress=not args.no_progress)
    metrics = out.metrics()
    metrics["dropped_requests"] = workload.dropped
    metrics["truncated_requests"] = workload.truncated
    metrics["skipped_rows"] = workload.skipped_rows
    chosen = out.timeline.limits_chosen()

    table = Table(title=f"{controller.name} on {workload.name}, profile {profile.name}")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in sorted(metrics):
        value = metrics[key]
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)
    print(
        f"goodput {metrics['output_goodput']:,.1f} tok/s of {metrics['output_throughput']:,.1f} "
        f"(SLO {engine.slo}: {metrics['slo_attainment']:.1%} of requests met it), p99 TTFT "
        f"{metrics['p99_ttft_ms']:,.0f} ms, p99 TPOT {metrics['p99_tpot_ms']:,.1f} ms, "
        f"{metrics['num_preemptions']:,} preemptions"
    )
    print(chosen_line(out.timeline, chosen))
    if workload.truncated or workload.dropped:
        fate = "truncated" if workload.truncated else "dropped"
        count = workload.truncated or workload.dropped
        print(
            f"{count:,} of {len(workload) + workload.dropped:,} requests were longer than the "
            f"{profile.max_model_len:,}-token context and {fate} (--overlong {args.overlong})"
        )
    if workload.skipped_rows:
        print(
            f"bad rows of {source} left out (--bad-rows skip): {workload.skipped_rows:,}; "
            f"the first: {workload.first_skipped}"
        )
    if note := unreachable_tpot(profile, engine.slo.tpot_ms):
        print(f"note: {note}")
    if args.json:
        write_json(
            args.json,
            {
                "workload": workload.name,
                "profile": profile.name,
                "scheduler": args.scheduler,
                "controller": controller.name,
                "slo": str(engine.slo),
                "metrics": metrics,
                "limits_chosen": {k: {str(v): n for v, n in c.items()} for k, c in chosen.items()},
            },
        )
        print(f"wrote {args.json}")
    return 0


MANY_DECISIONS = 1e6
"""Decisions (the arrivals' span over a time interval) past which simulate says a run is long:
a controller is consulted every interval, idle or not (about 13 s of a run per million)."""
METRICS_KEYS = ("controller", "metrics", "workload")
"""Keys of the object `--json` writes: an existing file without them is not replaced."""


def chosen_line(timeline: Timeline, chosen: dict[str, dict[int, int]], most: int = 4) -> str:
    """The limits the controller chose most often (`chosen`: `Timeline.limits_chosen`), each
    with its share of the decisions (every `stride`-th of a long run's)."""
    parts = []
    for name, counts in chosen.items():
        total = sum(counts.values())
        common = sorted(counts.items(), key=lambda vn: (-vn[1], vn[0]))[:most]
        parts.append(f"{name} " + ", ".join(f"{v:,} {n / total:.0%}" for v, n in common))
    which = (
        f"{timeline.decisions:,} decisions"
        if timeline.stride == 1
        else f"every {timeline.stride}th of {timeline.decisions:,} decisions"
    )
    return f"limits chosen ({which}): " + "; ".join(parts)
