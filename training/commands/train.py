"""Train a learned batch-size controller (both knobs: max_num_seqs and
max_num_batched_tokens) from an rl-zoo3-style YAML config: imitation of a teacher (the
lookahead oracle mpc, with DAgger rounds), then PPO on parallel simulated envs;
tensorboard logs (imitation/*, SB3's, domain/*, episode/*, eval/*), periodic evaluation
against the baselines on a held-out workload keeping the best checkpoint in OUT/best,
periodic checkpoints for --resume.

examples:
  batchpilot train --config training/configs/quick.yml --out runs/quick
  batchpilot train --config training/configs/mix.yml --seed 2 --out runs/mix-seed2
  batchpilot train --config training/configs/mix-drsb.yml --seed 0 1 2 3 --out runs/drsb
    (four runs in runs/drsb/seed0 .. seed3, each the run it would be alone: their imitation
    phases share one pool of workers, side by side, and the round-0 episodes, which depend
    only on the env seed; their PPO phases run one after another)
  batchpilot train --config training/configs/llama-7b.yml --out runs/7b --resume
  tensorboard --logdir runs/7b/tb
"""

from __future__ import annotations

import argparse
from pathlib import Path

from batchpilot.envs.input_files import path_arg
from batchpilot.training.commands.common import SEED, check_output


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=path_arg, required=True, help="YAML config (rl-zoo3 style)"
    )
    parser.add_argument("--out", type=path_arg, required=True, help="run directory")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue from the newest checkpoint in --out (its final state, where newer)",
    )
    parser.add_argument(
        "--seed",
        type=SEED,
        nargs="+",
        help="training seed, instead of the config's (as rl-zoo3's --seed; recorded in "
        "run.json); several: one run each, in OUT/seed<N>",
    )
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")


def best_summary(best: Path) -> str:
    """`` (evaluation goodput 246 tok/s; alg1+alg2 151, ...)``: the best checkpoint's
    evaluation beside the baselines', from its ``eval.json`` (empty if it has none)."""
    from batchpilot.agents.callbacks import read_eval_record

    data = read_eval_record(best)
    if data is None:
        return ""
    rules = ", ".join(
        f"{name} {r['output_goodput']:,.0f}" for name, r in data.get("baselines", {}).items()
    )
    return f" (evaluation goodput {data['output_goodput']:,.0f} tok/s; {rules})"


def _run_seed(out: Path) -> int | None:
    """The seed the run in `out` trained with (its run.json), which a --resume without
    --seed keeps; None without one."""
    from batchpilot.agents.checkpoint import CheckpointError
    from batchpilot.envs.json_objects import read_json_object

    if not (out / "run.json").is_file():
        return None
    seed = read_json_object(out / "run.json", "the run description", CheckpointError).get("seed")
    return seed if isinstance(seed, int) and not isinstance(seed, bool) else None


def main(args: argparse.Namespace) -> int:
    import dataclasses
    import time

    from batchpilot.training.train import load_config, train_runs, write_report

    check_output(args.out, "--out", directory=True)
    twice = sorted({s for s in args.seed or [] if args.seed.count(s) > 1})
    if twice:
        raise ValueError(f"--seed: {', '.join(map(str, twice))} given twice; give each seed once")
    cfg = load_config(args.config)
    resumed = _run_seed(args.out) if args.resume and not args.seed else None
    seeds = args.seed or [cfg.seed if resumed is None else resumed]
    outs = [args.out] if len(seeds) == 1 else [args.out / f"seed{s}" for s in seeds]
    start = time.perf_counter()
    runs = list(zip(seeds, outs, strict=True))
    if cfg.report is not None:  # the report names the exported policy: fail before training
        from batchpilot.agents.specs import policy_spec

        for out in outs:
            policy_spec(out / "policy.onnx")
    bests = train_runs(cfg, args.config, runs, resume=args.resume, progress=not args.no_progress)
    took = time.perf_counter() - start
    print(f"trained {len(runs)} run(s) to {cfg.n_timesteps:,} steps in {took:.0f} s")
    for (seed, out), best in zip(runs, bests, strict=True):
        print(f"seed {seed}: policy {best}{best_summary(best)}")
        if cfg.report is not None:
            run_cfg = dataclasses.replace(cfg, seed=seed)
            report = write_report(run_cfg, args.config, out, progress=not args.no_progress)
            print(f"evaluation report: {report}")
        else:
            pick = "" if best.name == "best" else f" --checkpoint {best.name}"  # no eval: final
            print(f"export it: batchpilot export {out}{pick} --out {out / 'policy.onnx'}")
    return 0
