"""The main job: train a small learned controller on the embedded default workload, export
it, and compare it with static batching, best-static, Algorithms 1 and 2, their
combination and the oracle (DIR/report.md, DIR/report.html, DIR/results.json).

Runs on the simulated engine with no trace files and no GPU; about 3 minutes on 2 CPU cores.
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

from batchpilot.training.commands.common import COUNT

QUICK_CONFIG = "quick.yml"
CONTROLLERS = "static:256,best-static,alg1,alg2,alg1+alg2,oracle"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config",
        type=Path,
        help=f"training config (default: the shipped training/configs/{QUICK_CONFIG})",
    )
    parser.add_argument(
        "--workload",
        action="append",
        help="comparison workload SOURCE@ARRIVAL, repeatable. Default: the config's "
        "evaluation workload and embedded:sharegpt@poisson:1.3 (never seen in training)",
    )
    parser.add_argument("--seeds", type=COUNT, default=3, help="comparison seeds. Default: 3")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from batchpilot.agents.export import export
    from batchpilot.agents.policy import load_policy
    from batchpilot.training.commands import compare
    from batchpilot.training.train import load_config, train

    config = args.config or Path(str(files("batchpilot.training") / "configs" / QUICK_CONFIG))
    if not config.is_file():
        raise ValueError(f"config {config} does not exist")
    cfg = load_config(config)
    run_dir, policy = args.out / "run", args.out / "policy.onnx"
    print(f"[1/3] training {cfg.n_timesteps} steps ({config}) -> {run_dir}")
    train(cfg, config, run_dir, resume=False, progress=not args.no_progress)
    print(f"[2/3] exporting -> {policy}")
    export(run_dir, policy)
    load_policy(policy)
    ev = cfg.eval or {}
    workloads = args.workload or [
        f"{ev['workload']['source']}@{ev['workload'].get('arrival', 'replay')}"
        if ev
        else compare.DEFAULT_WORKLOAD,
        "embedded:sharegpt@poisson:1.3",
    ]
    profile = ev.get("profile") or cfg.env_kwargs.get("profile", ["llama-7b-a100"])[0]
    argv = [
        "--controllers",
        f"{CONTROLLERS},policy:{policy}",
        *(x for w in workloads for x in ("--workload", w)),
        "--profile",
        profile,
        "--slo",
        cfg.env_kwargs.get("slo", "ttft:2000,tpot:50"),
        "--interval",
        cfg.control_interval,
        "--seeds",
        str(args.seeds),
        "--out",
        str(args.out),
        *(["--no-progress"] if args.no_progress else []),
    ]
    print(f"[3/3] batchpilot compare {' '.join(argv)}")
    parser = argparse.ArgumentParser(prog="batchpilot compare")
    compare.add_arguments(parser)
    return compare.main(parser.parse_args(argv))
