"""Arguments and helpers shared by several subcommands."""

from __future__ import annotations

import argparse
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from batchpilot.baselines.specs import ControllerSpecError, split_specs
from batchpilot.envs.arrivals import ARRIVAL_KINDS
from batchpilot.envs.metrics import SLO, goodput_slo
from batchpilot.envs.output_files import replace_file, streamed, written
from batchpilot.envs.plain_numbers import plain_float, plain_int
from batchpilot.envs.profiles import DEFAULT_PROFILE
from batchpilot.envs.sim_engine import DEFAULT_SCHEDULER, SCHEDULERS
from batchpilot.envs.traces import BAD_ROWS, DEFAULT_BAD_ROWS
from batchpilot.envs.workload import DEFAULT_OVERLONG, OverlongPolicy
from batchpilot.envs.workloads import (
    DRAWN_REQUESTS,
    is_trace_file,
    names_a_file,
    split_arrival,
)
from batchpilot.training.limits import MAX_REQUESTS, MAX_SEEDS, MAX_TUNING_SEEDS


def whole(low: int, high: int | None = None) -> Callable[[str], int]:
    """An argparse ``type=``: a whole number in [low, high], written plainly (`plain_int`);
    argparse names the option."""

    def parse(text: str) -> int:
        try:
            value = plain_int(text, signed=True)  # a negative one: out of range, named
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a whole number") from None
        if value < low or (high is not None and value > high):
            bound = f">= {low}" if high is None else f"in [{low}, {high}]"
            raise argparse.ArgumentTypeError(f"{value} is out of range; need a number {bound}")
        return value

    parse.__name__ = "whole number"
    return parse


def title_arg(text: str) -> str:
    """An argparse ``type=`` for a report's title: one printable line, not blank (it heads the
    markdown and names the HTML page)."""
    if not text.strip() or not text.isprintable():
        raise argparse.ArgumentTypeError(f"{text!r}: a title is one printable line, not blank")
    return text.strip()


GIVEN = "given_options"
"""The namespace attribute where a `once` action records the options given."""


def _given_once(action: argparse.Action, namespace: argparse.Namespace, problem: str) -> None:
    """Record `action`'s option in the namespace's `GIVEN` set; an `ArgumentError` saying
    `problem` where it was given before."""
    given = vars(namespace).setdefault(GIVEN, set())
    if action.dest in given:
        raise argparse.ArgumentError(action, problem)
    given.add(action.dest)


def once(hint: str = "give it once") -> type[argparse.Action]:
    """An argparse action that stores an option's value and refuses the option a second time
    (argparse keeps the last one silently), saying `hint`; it records the options given in
    the namespace's `GIVEN` set."""

    class Once(argparse.Action):
        def __call__(
            self,
            parser: argparse.ArgumentParser,
            namespace: argparse.Namespace,
            values: Any,
            option_string: str | None = None,
        ) -> None:
            _given_once(self, namespace, f"given more than once; {hint}")
            setattr(namespace, self.dest, values)

    return Once


class OnceFlag(argparse.BooleanOptionalAction):
    """``--x`` / ``--no-x`` (argparse's `BooleanOptionalAction`), refused a second time in
    either spelling, where argparse keeps the last."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        _given_once(self, namespace, "given more than once (or both ways); give one")
        super().__call__(parser, namespace, values, option_string)


class OnceParser(argparse.ArgumentParser):
    """An argument parser whose options (and its subparsers', which are of its class) refuse
    being given twice (`once`) where argparse would keep the last value silently."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", None, once())
        self.register("action", "store", once())


def one_controller(command: str) -> Callable[[str], str]:
    """An argparse ``type=`` for `command`, which runs one controller (a comma separates
    specs)."""

    def parse(spec: str) -> str:
        if "," in spec:
            try:
                specs = split_specs(spec)
            except ControllerSpecError as exc:
                raise argparse.ArgumentTypeError(f"{spec!r}: {exc}") from None
            from batchpilot.agents.specs import SEPARATORS

            hint = f" (if it is one policy's path: {SEPARATORS})" * spec.startswith("policy:")
            raise argparse.ArgumentTypeError(
                f"{spec!r} names several controllers; {command} runs one ({'+'.join(specs)} "
                "takes the smallest of their limits; to compare them: batchpilot compare "
                f"--controllers {','.join(specs)}){hint}"
            )
        return spec

    return parse


def positive(text: str) -> float:
    """An argparse ``type=``: a finite number > 0, written plainly (`plain_float`)."""
    try:
        value = plain_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range; need a finite number > 0")
    return value


def non_negative(text: str) -> float:
    """An argparse ``type=``: a finite number >= 0, written plainly (`plain_float`)."""
    try:
        value = plain_float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a number") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"{text} is out of range; need a finite number >= 0")
    return value


def fraction(text: str) -> float:
    """An argparse ``type=``: a number in (0, 1]."""
    value = positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text} is out of range; need a number in (0, 1]")
    return value


def slo_spec(text: str) -> str:
    """An argparse ``type=``: goodput SLOs as `SLO.parse` takes them, at least one objective."""
    try:
        goodput_slo(SLO.parse(text), repr(text))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


COUNT = whole(1)
"""At least one (requests, seeds, workers, repeats, sizes)."""
SEED = whole(0, 2**32 - 1)
"""A random seed (numpy's range)."""
REQUESTS = whole(1, MAX_REQUESTS)
"""Requests in a run."""
SEEDS = whole(1, MAX_SEEDS)
"""Evaluation seeds."""
FIRST_SEED = whole(0, MAX_SEEDS - 1)
"""The first evaluation seed (``--first-seed``)."""
TUNING_SEEDS = whole(1, MAX_TUNING_SEEDS)
"""best-static's tuning seeds."""
WORKERS = whole(1, 256)
"""Worker processes."""
BAD_ROWS_HELP = (
    "a trace file's rows that cannot be requests (e.g. BurstGPT's failed requests, 0 "
    "response tokens): stop with the first one's error, or skip them (left out, counted and "
    "reported)."
)
"""``--bad-rows``' help."""


DEFAULT_WORKLOAD = "embedded:azure-conv@replay:0.7"
"""The workload of `simulate` and `compare` when none is given: Azure conversation lengths at
0.7x the trace's rate, near the 7B profile's capacity, where the limit matters."""
WORKLOAD_HELP = (
    "SOURCE@ARRIVAL: a trace file (Azure CSV, BurstGPT CSV, Vidur CSV, ShareGPT/GSM8K length "
    "CSV, Mooncake or Bailian JSONL, plain or gzip-compressed; format detected from the header), "
    "embedded:NAME (azure-conv, azure-code, sharegpt, gsm8k: length tables shipped with "
    "batchpilot), mix:NAME=W,..., shift:NAME@0,NAME@T1,...[/PERIOD] or fixed:PROMPT:OUTPUT, "
    "@ an arrival process: all-at-once, poisson:RATE, gamma:RATE:CV, steps:R0@0,R1@T1,..., "
    "ramp:R0:R1[:S] or replay[:SCALE] (a trace's own timestamps at SCALE x its rate; on "
    "embedded:azure-conv or azure-code, the fitted Gamma process of the trace's times; the "
    "length tables have no times)"
)
"""``--workload``'s help (`simulate`, `compare`)."""


def parse_workload(text: str) -> tuple[str, str]:
    """``SOURCE@ARRIVAL`` -> (source, arrival) (`split_arrival`), or a ValueError saying
    what is missing."""
    if split := split_arrival(text):
        return split
    source, at, arrival = text.partition("@")
    if source and at and not names_a_file(text):
        raise ValueError(
            f"workload {text!r}: unknown arrival process {arrival!r}; known: "
            f"{', '.join(ARRIVAL_KINDS)} (e.g. {source}@poisson:4)"
        )
    bare_file = is_trace_file(text) and (not at or names_a_file(text))
    example = f"{text}@replay" if bare_file else "embedded:gsm8k@poisson:4"
    raise ValueError(f"workload {text!r}: use SOURCE@ARRIVAL, e.g. {example}")


def add_workload_arguments(parser: argparse.ArgumentParser) -> None:
    """--workload / --num-requests / --seed / --overlong / --bad-rows."""
    g = parser.add_argument_group("workload")
    g.add_argument(
        "--workload", default=DEFAULT_WORKLOAD, help=f"{WORKLOAD_HELP}. Default: %(default)s"
    )
    g.add_argument(
        "--num-requests",
        type=REQUESTS,
        default=None,
        help="the first N requests of a trace by arrival time (its rows are replayed in time "
        "order; default: all), or N drawn from an embedded table "
        f"(default: {DRAWN_REQUESTS})",
    )
    g.add_argument(
        "--seed", type=SEED, default=0,
        help="seed for sampled lengths and arrivals. Default: %(default)s",
    )  # fmt: skip
    g.add_argument(
        "--overlong",
        choices=[p.value for p in OverlongPolicy],
        default=DEFAULT_OVERLONG.value,
        help="requests longer than the model's context: stop with an error, drop them, or "
        "truncate prompt then output (counted in the output). Default: %(default)s",
    )
    g.add_argument(
        "--bad-rows",
        choices=BAD_ROWS,
        default=DEFAULT_BAD_ROWS,
        help=BAD_ROWS_HELP + " Default: %(default)s",
    )


def add_engine_arguments(parser: argparse.ArgumentParser, *, unset: bool = False) -> None:
    """The simulated engine: ``--profile`` and ``--scheduler``. With `unset` their default
    is None (the command fills in the defaults), so a command can tell them given."""
    parser.add_argument(
        "--profile",
        default=None if unset else DEFAULT_PROFILE,
        help="engine profile name (`batchpilot profiles` lists them) or a profile JSON from "
        f"`batchpilot calibrate` or `batchpilot profiles build`. Default: {DEFAULT_PROFILE}",
    )
    parser.add_argument(
        "--scheduler",
        choices=SCHEDULERS,
        default=None if unset else DEFAULT_SCHEDULER,
        help="simulated scheduling: v1 (vLLM V1: chunked prefills share steps with decodes) "
        f"or v0 (vLLM V0: whole-prompt prefill steps first, decodes stall). Default: "
        f"{DEFAULT_SCHEDULER}",
    )


def check_output(path: Path, option: str, *, directory: bool, replaced: bool = False) -> None:
    """Raise ValueError naming `option` if `path` cannot be written as a directory (or, not
    `directory`, a file): it exists as the other kind, or where it is written cannot be. A
    file is written beside its target (a symlink's) and renamed (`replace_file`), so that
    target's nearest existing parent must be a writable directory; a `streamed` one (a pipe,
    a device, ``/dev/stdout``) must be writable itself, and is refused where a file must be
    `replaced` whole (a profile). Commands call it before any run."""
    want, other = ("a directory", "a file") if directory else ("a file", "a directory")
    if path.exists() and path.is_dir() != directory:
        raise ValueError(f"{option} {path}: is {other}, not {want}")
    try:
        stream = not directory and streamed(path)
    except OSError as exc:  # a symlink loop
        raise ValueError(f"{option} {path}: {exc}") from None
    if stream:
        if replaced:
            raise ValueError(
                f"{option} {path}: is not a regular file (a pipe or device), which the written "
                "file would replace"
            )
        if not os.access(path, os.W_OK):
            raise ValueError(f"{option} {path}: is not writable")
        return
    start = path if directory else written(path).parent  # a file: where the rename writes
    existing = next(p for p in (start, *start.parents) if p.exists())
    if not existing.is_dir():  # an existing `path` is a directory here (checked above)
        raise ValueError(f"{option} {path}: {existing} is a file, not a directory")
    if not os.access(existing, os.W_OK):
        raise ValueError(f"{option} {path}: {existing} is not writable")


def is_profile_json(data: object) -> bool:
    """Whether a JSON value has a profile's top-level keys (`EngineProfile.to_json`)."""
    return isinstance(data, dict) and {"name", "step", "num_gpu_blocks"} <= data.keys()


LARGEST_OWN_FILE = 1 << 20
"""Bytes: a larger file is none that a command wrote (metrics, a profile, step samples)."""
LARGEST_RESULTS_FILE = 1 << 30
"""Bytes: a larger ``results.json`` is none that a report wrote (a suite's: some MB)."""


def check_replaceable(
    path: Path,
    option: str,
    what: str,
    ours: Callable[[Any], bool],
    largest: int = LARGEST_OWN_FILE,
) -> None:
    """Raise ValueError naming `option` if `path` is a file, not empty, whose JSON `ours`
    does not take for `what` (one this command wrote): a trace, a policy or a profile the
    same command reads would be overwritten. An empty file (mktemp's) holds nothing; one of
    over `largest` bytes is none the command wrote."""
    from batchpilot.envs.json_objects import read_json

    size = path.stat().st_size if path.is_file() and not streamed(path) else 0
    if not size:  # appended to (/dev/stdout >> log), or empty (mktemp's)
        return
    if not os.access(path, os.R_OK):
        raise ValueError(f"{option} {path}: cannot read the existing file to see what it holds")
    try:
        if size > largest or not ours(read_json(path, what, finite=False)):
            raise ValueError
    except ValueError:
        raise ValueError(
            f"{option} {path}: the file exists and is not {what}; it would be overwritten (a "
            "trace, a policy or a profile?): give another path, or remove it"
        ) from None


REPORT_PAGES = ("report.md", "report.html")
"""The pages a report writes beside its ``results.json``."""


def check_results_dir(out: Path) -> None:
    """Raise ValueError if the report directory `out` holds a ``results.json`` that no
    batchpilot report wrote (compare, paper and quickstart write theirs there), or report
    pages without one (a directory some other tool wrote)."""
    if not (out / "results.json").exists() and (
        pages := [name for name in REPORT_PAGES if (out / name).exists()]
    ):
        raise ValueError(
            f"--out {out}: holds {' and '.join(pages)} but no results.json, which a report "
            "would replace with no record of what they were; choose a new or empty directory"
        )
    check_replaceable(
        out / "results.json",
        "--out",
        "a results file a batchpilot report wrote",
        lambda data: isinstance(data, dict) and "command" in data,
        largest=LARGEST_RESULTS_FILE,
    )


def write_json(path: Path, data: object, indent: int | None = 2) -> None:
    """Write `data` to `path` as JSON (`replace_file`: whole, or an `OSError` naming `path`)."""
    replace_file(path, json.dumps(data, indent=indent, sort_keys=True) + "\n")
