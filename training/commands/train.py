"""Train a learned batch-size controller (both knobs: max_num_seqs and
max_num_batched_tokens) from an rl-zoo3-style YAML config: imitation of a teacher (the
lookahead oracle mpc, with DAgger rounds), then PPO on parallel simulated envs;
tensorboard logs (imitation/*, SB3's, domain/*, episode/*, eval/*), periodic evaluation
against the baselines on a held-out workload keeping the best checkpoint in OUT/best,
periodic checkpoints for --resume.

examples:
  batchpilot train --config training/configs/quick.yml --out runs/quick
  batchpilot train --config training/configs/mix.yml --seed 2 --out runs/mix-seed2
  batchpilot train --config training/configs/llama-7b.yml --out runs/7b --resume
  tensorboard --logdir runs/7b/tb
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batchpilot.training.commands.common import whole


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="YAML config (rl-zoo3 style)")
    parser.add_argument("--out", type=Path, required=True, help="run directory")
    parser.add_argument(
        "--resume", action="store_true", help="continue from the latest checkpoint in --out"
    )
    parser.add_argument(
        "--seed",
        type=whole(0, 2**32 - 1),
        help="training seed, instead of the config's (as rl-zoo3's --seed; recorded in run.json)",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def main(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from batchpilot.training.train import load_config, train, write_report

    if not args.config.is_file():
        raise ValueError(f"config {args.config} does not exist")
    cfg = load_config(args.config)
    if args.seed is not None:
        cfg = dataclasses.replace(cfg, seed=args.seed)
    start = time.perf_counter()
    best = train(cfg, args.config, args.out, resume=args.resume, progress=not args.no_progress)
    print(f"trained {cfg.n_timesteps} steps in {time.perf_counter() - start:.0f} s; policy: {best}")
    if cfg.report:
        report = write_report(cfg, args.config, args.out, progress=not args.no_progress)
        print(f"evaluation report: {report}")
    else:
        print(f"export it: batchpilot export {args.out} --out {args.out / 'policy.onnx'}")
    return 0
