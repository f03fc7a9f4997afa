"""The main job: train a small learned controller on the embedded default workloads
(training/configs/quick.yml: Llama-2-70B on 4 A100s under a math/chat regime shift, where
no static pair suits both regimes; imitation of the lookahead oracle, then PPO), export it, and
compare it on fresh seeds of the config's evaluation workloads with vLLM's default limits,
the tuned static pair, Algorithms 1+2, Algorithm 2 with the token budget and the memory
oracle (no preemption with the true lengths: a packing bound, not a goodput bound)
(DIR/report.md, DIR/report.html, DIR/results.json). The report's first
lines say whether the learned policy beat the best reference on goodput and by how much
(paired over seeds).

Runs on the simulated engine with no trace files and no GPU; most of the time goes to the
lookahead oracle labelling states during imitation.
DIR/run holds the training run (tensorboard logs in DIR/run/tb), DIR/policy.onnx the
exported policy.

examples:
  batchpilot quickstart --out out/quickstart
  batchpilot quickstart --config training/configs/llama-7b.yml --seeds 5 --out out/7b
  tensorboard --logdir out/quickstart/run/tb
"""

from __future__ import annotations

import argparse
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING

from batchpilot.baselines.specs import BEST_STATIC, RULES
from batchpilot.envs.input_files import path_arg
from batchpilot.envs.metrics import DEFAULT_SLO
from batchpilot.envs.profiles import DEFAULT_PROFILE
from batchpilot.envs.traces import BAD_ROWS, DEFAULT_BAD_ROWS
from batchpilot.training.commands.common import (
    BAD_ROWS_HELP,
    DEFAULT_WORKLOAD,
    SEEDS,
    check_output,
    check_results_dir,
    parse_workload,
)

if TYPE_CHECKING:
    from batchpilot.training.train import TrainConfig

QUICK_CONFIG = "quick.yml"
CONTROLLERS = ",".join(("default", BEST_STATIC, *RULES, "oracle"))
"""The references the learned policy is compared with (`batchpilot evaluate`'s, with the
memory oracle, a packing bound, in place of the lookahead oracle, a planner that simulates
ahead at every decision)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=path_arg,
        help=f"training config (default: the shipped training/configs/{QUICK_CONFIG})",
    )
    parser.add_argument(
        "--workload",
        action="append",
        help="comparison workload SOURCE@ARRIVAL, repeatable (compare's default number of "
        "requests). Default: the config's evaluation workloads on fresh seeds, with their "
        "num_requests and bad_rows; else compare's default workload",
    )
    parser.add_argument(
        "--bad-rows",
        choices=BAD_ROWS,
        help=f"{BAD_ROWS_HELP} Default: the config's evaluation workloads' bad_rows, else "
        f"{DEFAULT_BAD_ROWS}",
    )
    parser.add_argument(
        "--seeds",
        type=SEEDS,
        default=10,
        help="comparison seeds, paired (on the main job the gain over the tuned static pair "
        "varies by about 20%% seed to seed; a 95%% interval over 5 seeds is 1.7x as wide as "
        "over 10). Default: %(default)s",
    )
    parser.add_argument("--out", type=path_arg, required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from batchpilot.agents.export import export
    from batchpilot.agents.policy import load_policy
    from batchpilot.training.policy_report import compare_policy, learned_verdict
    from batchpilot.training.train import load_config, train

    check_output(args.out, "--out", directory=True)
    check_results_dir(args.out)  # before training: compare would refuse it after
    config = args.config or Path(str(files("batchpilot.training") / "configs" / QUICK_CONFIG))
    cfg = load_config(config)
    profile, workloads, options = comparison(cfg, args.workload, args.bad_rows)  # stops early
    run_dir, policy = args.out / "run", args.out / "policy.onnx"
    print(f"[1/3] training {cfg.n_timesteps} steps ({config}) -> {run_dir}")
    best = train(cfg, config, run_dir, resume=False, progress=not args.no_progress)
    print(f"[2/3] exporting -> {policy}")
    export([run_dir], policy, checkpoint=best.name)  # "final" where the config has no eval
    load_policy(policy)
    argv = [
        "--controllers",
        f"{CONTROLLERS},policy:{policy}",
        *(x for w in workloads for x in ("--workload", w)),
        *options,
        "--profile",
        profile,
        "--slo",
        cfg.env_kwargs.get("slo", str(DEFAULT_SLO)),
        "--interval",
        cfg.control_interval,
        "--seeds",
        str(args.seeds),
        "--no-capacity",  # the main job stays quick: goodput per seed, no capacity bisection
        "--out",
        str(args.out),
        *(["--no-progress"] if args.no_progress else []),
    ]
    print(f"[3/3] batchpilot compare {' '.join(argv)}")
    results = compare_policy(argv, [f"policy:{policy}"])
    print(learned_verdict(results, f"policy:{policy}"))
    return 0


def comparison(
    cfg: TrainConfig, workloads: list[str] | None = None, bad_rows: str | None = None
) -> tuple[str, list[str], list[str]]:
    """The profile, SOURCE@ARRIVAL workloads and further compare options the policy is
    compared with: the config's evaluation runs on its first evaluation profile, with their
    ``num_requests`` and ``bad_rows`` (compare takes one of each: a `ValueError` if the runs
    differ), else compare's default workload on the first training profile, on the simulated
    scheduler trained on; `workloads`, if
    given, in place of the config's (with compare's defaults), each checked here (a bad one
    is a `ValueError` before any training); `bad_rows`, if given, for every workload."""
    from batchpilot.agents.callbacks import EvalScenario
    from batchpilot.baselines.specs import given_twice
    from batchpilot.envs.batching_env import profile_weights
    from batchpilot.envs.workloads import make_workload

    for text in workloads or []:
        make_workload(*parse_workload(text), num_requests=1, bad_rows=bad_rows or DEFAULT_BAD_ROWS)
    if twice := given_twice(workloads or [], key=str):
        raise ValueError(f"--workload {twice} is given twice")  # compare refuses it
    scheduler = cfg.sim_engine_kwargs.get("scheduler")  # the one trained on, if set
    engine = ["--scheduler", scheduler] if scheduler else []
    given_rows = ["--bad-rows", bad_rows] if bad_rows else []
    if not cfg.eval:
        given = cfg.env_kwargs.get("profile", DEFAULT_PROFILE)
        profile = next(iter(profile_weights(given)))
        return profile, workloads or [DEFAULT_WORKLOAD], engine + given_rows
    ev = EvalScenario(
        profile=cfg.eval["profile"],
        workload=cfg.eval["workload"],
        slo=str(DEFAULT_SLO),
        interval=cfg.control_interval,
    )
    profile = ev.profiles[0]
    if workloads:
        return profile, workloads, engine + given_rows
    runs = [w for p, w in ev.runs() if p == profile]
    options = engine + given_rows
    keys = ("num_requests",) if bad_rows else ("num_requests", "bad_rows")  # given, it stands
    for key in keys:
        values = {w.get(key) for w in runs}
        if len(values) > 1:
            raise ValueError(
                f"quickstart compares with one {key}, but the config's evaluation workloads on "
                f"{profile} give {', '.join(sorted(map(str, values)))}; give them one, or "
                "pass --workload"
            )
        if (value := values.pop()) is not None:
            options += [f"--{key.replace('_', '-')}", str(value)]
    return profile, [f"{w['source']}@{w.get('arrival', 'replay')}" for w in runs], options
