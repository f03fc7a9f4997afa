"""Evaluate exported policies against the references on scenario suites: one
`batchpilot compare` report per suite (DIR/SUITE/), each headed by whether each policy beat
the best reference (tuned static pair, vLLM's default, the rules), and DIR/report.md over
them all, opening with the verdict per suite and policy (wins, losses, geometric means of the
goodput ratios against the best reference and the tuned static pair). Policies run at the
control interval their sidecars record (several policies must share one); giving several
compares candidates on the same runs.

examples:
  batchpilot evaluate --policy runs/mix/policy.onnx --suite training/configs/heldout.yml \\
      --suite training/configs/unseen.yml --seeds 5 --out out/eval
  batchpilot evaluate --policy a.onnx --policy b.onnx --suite training/configs/unseen.yml \\
      --references best-static --seeds 5 --out out/ab
  batchpilot evaluate --policy training/reports/learned/policy.onnx --suite kv-tight \\
      --references best-static,alg1+alg2 --out out/kv
"""

from __future__ import annotations

import argparse

from batchpilot.agents.specs import policy_spec, spec_key
from batchpilot.baselines.specs import split_specs
from batchpilot.envs.input_files import path_arg
from batchpilot.training.commands.common import (
    FIRST_SEED,
    SEEDS,
    check_output,
    once,
    title_arg,
)
from batchpilot.training.evaluate import (
    DEFAULT_SEEDS,
    TUNING_SEED_BASE,
    suite_stems,
)
from batchpilot.training.policy_report import REFERENCES, TITLE
from batchpilot.training.report import command_line


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--policy",
        type=path_arg,
        action="append",
        required=True,
        help="exported policy (.onnx), repeatable: candidates compared on the same runs",
    )
    parser.add_argument(
        "--suite",
        action="append",
        required=True,
        help="scenario suite, repeatable: a name under training/scenarios ('all': each of "
        "them) or a YAML file",
    )
    parser.add_argument(
        "--references",
        action=once("give one comma-separated list"),
        default=REFERENCES,
        help="comma-separated controller specs the policy is compared with. Default: "
        "%(default)s",
    )
    parser.add_argument(
        "--seeds",
        type=SEEDS,
        help="evaluation seeds 0..N-1 (or from --first-seed). Default: each suite's, or "
        f"{DEFAULT_SEEDS}",
    )
    parser.add_argument(
        "--first-seed",
        type=FIRST_SEED,
        default=0,
        help=f"evaluation seeds FIRST..FIRST+N-1 instead (below {TUNING_SEED_BASE}): to score a "
        "policy chosen on the report's seeds on seeds its choice never saw. Default: "
        "%(default)s",
    )
    parser.add_argument(
        "--title", type=title_arg, default=TITLE, help="the report's title (one line)"
    )
    parser.add_argument("--out", type=path_arg, required=True, help="report directory")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def main(args: argparse.Namespace) -> int:
    from batchpilot.agents.policy import read_sidecar
    from batchpilot.training.policy_report import (
        SuiteSection,
        checked_suite,
        run_suite,
        write_suites_report,
    )
    from batchpilot.training.suite import expand_all

    check_output(args.out, "--out", directory=True)
    if spec := next((p for p in args.policy if str(p).startswith("policy:")), None):
        raise ValueError(
            f"--policy {spec}: give the file's path alone; 'policy:' begins a controller spec "
            "(--references takes those)"
        )
    labels = [policy_spec(p) for p in args.policy]
    # a missing or mismatched file fails before any run
    intervals = {str(p): read_sidecar(p)["control_interval"] for p in args.policy}
    if len(intervals) < len(args.policy):
        raise ValueError("--policy: a policy is given twice")
    if len(set(intervals.values())) > 1:
        given = ", ".join(f"{p} ({i})" for p, i in intervals.items())
        raise ValueError(f"--policy: the policies' control intervals differ: {given}")
    try:
        references = split_specs(args.references)
    except ValueError as exc:
        raise ValueError(f"--references {args.references!r}: {exc}") from None
    from batchpilot.training.report import is_reference

    if not any(is_reference(r) for r in references):
        raise ValueError(
            f"--references {args.references!r} names no reference (vLLM's default, a static "
            "pair or a rule): the policy is judged against the best of them; add best-static"
        )
    candidates = {spec_key(label) for label in labels}
    if twice := next((r for r in references if spec_key(r) in candidates), None):
        raise ValueError(
            f"--references names {twice}, a --policy under evaluation: each runs once, as a "
            "candidate; leave it out of --references"
        )
    names = expand_all(args.suite)
    interval = next(iter(intervals.values()))
    suites = [
        (suite, checked_suite(suite, interval, args.seeds, args.first_seed).description)
        for suite in names
    ]  # every suite before the first runs
    try:
        stems = suite_stems([suite for suite, _ in suites])
    except ValueError as exc:
        raise ValueError(f"--suite: {exc}") from None
    sections = []
    for (suite, description), stem in zip(suites, stems, strict=True):
        print(f"[{len(sections) + 1}/{len(suites)}] {suite}")
        results = run_suite(
            args.policy,
            suite,
            args.out / stem,
            references=args.references,
            interval=interval,
            seeds=args.seeds,
            first_seed=args.first_seed,
            progress=not args.no_progress,
        )
        sections.append(SuiteSection(stem, description, results, args.out / stem))
    command = command_line()
    report = write_suites_report(sections, labels, args.out, title=args.title, command=command)
    print(f"wrote {report}")
    return 0
