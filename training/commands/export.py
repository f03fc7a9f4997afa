"""Export a trained run's policy as ONNX with a JSON sidecar (observation layout,
normalisation, action mapping, SLO and profile assumptions, versions, sha256). Load it
anywhere a controller spec is taken as ``policy:PATH`` (numpy and the onnx package at serve time).

Several runs (grid policies of one network shape, trained for the same SLO and control
interval, e.g. one config under several seeds) export as one ensemble: per knob, the choice
with the highest mean log-probability over the members, in one graph that deploys as a single
policy does (the network's cost per decision grows with the number of members).

examples:
  batchpilot export runs/quick --out runs/quick/policy.onnx
  batchpilot export runs/7b --checkpoint final --out policies/7b.onnx
  batchpilot export runs/seed1 runs/seed2 runs/seed3 --out policies/ensemble.onnx
  batchpilot simulate --controller policy:runs/quick/policy.onnx
"""

from __future__ import annotations

import argparse

from batchpilot.envs.input_files import path_arg


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "run_dirs",
        type=path_arg,
        nargs="+",
        metavar="RUN_DIR",
        help="a `batchpilot train` run directory; several make one ensemble policy",
    )
    parser.add_argument("--out", type=path_arg, required=True, help="ONNX file to write")
    parser.add_argument(
        "--checkpoint",
        choices=["best", "final"],
        default="best",
        help="best evaluation or last step. Default: %(default)s",
    )


def main(args: argparse.Namespace) -> int:
    from batchpilot.agents.export import export
    from batchpilot.agents.policy import load_policy, sidecar_path
    from batchpilot.agents.specs import policy_spec
    from batchpilot.training.commands.common import check_output

    check_output(args.out, "--out", directory=False, replaced=True)
    check_output(sidecar_path(args.out), "--out's sidecar", directory=False, replaced=True)
    sidecar = export(args.run_dirs, args.out, args.checkpoint)
    load_policy(args.out)  # the file just written must load as a controller
    print(f"wrote {args.out} and {sidecar_path(args.out)} (sha256 {sidecar['sha256'][:12]}…)")
    try:
        policy_spec(args.out)
    except ValueError as exc:  # it loads by path, not as a spec
        print(f"note: {exc}; `simulate` or `compare` cannot name it as policy:PATH")
    resolved = [run.resolve() for run in args.run_dirs]
    for run in dict.fromkeys(r for r in resolved if resolved.count(r) > 1):
        print(f"note: {run} is {resolved.count(run)} members: it counts that often in the vote")
    return 0
