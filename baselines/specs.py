"""Controller specs as written on the CLI: ``static:256``, ``alg1:eps=0.05``, ``policy:PATH``.

``A+B`` combines controllers (each limit is the minimum of theirs), e.g. ``alg1+alg2``.
Keyword arguments are ``:``-separated: ``alg2:sla_ms=40:alpha=10``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

from batchpilot.baselines.alg1 import MemoryAwareController
from batchpilot.baselines.alg2 import SLAController
from batchpilot.baselines.checks import MAX_LIMIT, keyword_value
from batchpilot.baselines.combined import MinController
from batchpilot.baselines.mpc import MPC_ARGS, MPCController
from batchpilot.baselines.oracle import OracleController
from batchpilot.baselines.static import StaticController
from batchpilot.envs.controller import Controller
from batchpilot.envs.names import did_you_mean
from batchpilot.envs.plain_numbers import plain_float, plain_int, plain_switch
from batchpilot.envs.profiles import limits_problem

BEST_STATIC = "best-static"
"""Not a controller but a search over static limits, resolved by the evaluation harness."""
RULES = ("alg1+alg2", "alg2:chunk=1")
"""The analytical rules a learned policy is measured against: Algorithms 1+2 (the batch-size
limit), and Algorithm 2 setting the token budget too."""


class ControllerSpecError(ValueError):
    """A controller spec that names no known controller or has bad arguments."""


def _static(args: list[str]) -> Controller:
    if len(args) not in (1, 2):
        raise ControllerSpecError(
            "static takes static:N (max_num_seqs) or static:N:T (and max_num_batched_tokens)"
        )
    spec, values = "static:" + ":".join(args), []
    for what, text in zip(("N", "T"), args, strict=False):
        try:
            value = plain_int(text, signed=True)  # a negative one: the range check names it
        except ValueError:
            raise ControllerSpecError(f"{spec}: {what} must be a whole number") from None
        if not 1 <= value <= MAX_LIMIT:
            raise ControllerSpecError(
                f"{spec}: {what} must be >= 1" if value < 1 else f"{spec}: {what} must be at "
                f"most {MAX_LIMIT:,} (a 32-bit int, as vLLM's own limits)"
            )
        values.append(value)
    if len(values) == 2 and (problem := limits_problem(*values)):
        raise ControllerSpecError(f"{spec}: {problem}")
    return StaticController(*values)


PLAIN: dict[type, Callable[[str], Any]] = {int: partial(plain_int, signed=True), float: plain_float}
"""How a spec's numbers are read: written plainly (`batchpilot.envs.plain_numbers`), a negative
one left to the controller's own range check, which names the bound."""
KINDS = {int: "whole number", float: "number", bool: "switch (true, false, 1 or 0)"}
"""What a keyword's type is called in messages."""


def keyword_args(name: str, args: list[str], types: dict[str, type]) -> dict[str, Any]:
    """Parse ``key=value`` spec arguments into typed keywords, naming any bad one."""
    out: dict[str, Any] = {}
    for arg in args:
        key, sep, text = arg.partition("=")
        if not sep or key not in types:
            raise ControllerSpecError(
                f"{name}: bad argument {arg!r}; use key=value with key one of {', '.join(types)}"
            )
        if key in out:
            raise ControllerSpecError(f"{name}: {key} given twice; give each argument once")
        kind = types[key]
        if kind not in KINDS:  # a keyword's own parser (a grid, a choice) says what it takes
            try:
                out[key] = keyword_value(key, kind, text)
            except ValueError as exc:
                raise ControllerSpecError(f"{name}: {exc}") from None
            continue
        try:
            if kind is bool:
                out[key] = plain_switch(text)
            else:
                out[key] = PLAIN.get(kind, kind)(text)
        except ValueError:
            raise ControllerSpecError(
                f"{name}: {key}={text!r} is not a valid {KINDS[kind]}"
            ) from None
        if kind is float and not math.isfinite(out[key]):
            raise ControllerSpecError(f"{name}: {key}={text!r} is not a finite number")
    return out


def _keyword_factory(
    name: str, cls: Callable[..., Controller], types: dict[str, type]
) -> Callable[[list[str]], Controller]:
    def factory(args: list[str]) -> Controller:
        try:
            return cls(**keyword_args(name, args, types))
        except ControllerSpecError:
            raise
        except ValueError as exc:
            raise ControllerSpecError(f"{name}: {exc}") from None

    return factory


ALG1_ARGS = {
    "eps": float,
    "bound": str,
    "refresh": int,
    "min_samples": int,
    "prior_output_mean": float,
    "prior_output_std": float,
    "blocks": bool,
    "b_min": int,
    "b_max": int,
}
ALG2_ARGS = {
    "sla_ms": float,
    "eps_ms": float,
    "alpha": int,
    "delta": int,
    "b_min": int,
    "b_max": int,
    "window_ms": float,
    "chunk": bool,
    "chunk_min": int,
    "chunk_alpha": int,
    "chunk_delta": int,
}


KEYWORD_ARGS: dict[str, dict[str, type]] = {
    "alg1": ALG1_ARGS,
    "alg2": ALG2_ARGS,
    "oracle": {"slack_blocks": int},
    "mpc": MPC_ARGS,
}
"""The keyword arguments of each controller spelled ``name:key=value:...``."""
FACTORIES: dict[str, Callable[[list[str]], Controller]] = {
    "static": _static,
    "alg1": _keyword_factory("alg1", MemoryAwareController, KEYWORD_ARGS["alg1"]),
    "alg2": _keyword_factory("alg2", SLAController, KEYWORD_ARGS["alg2"]),
    "oracle": _keyword_factory("oracle", OracleController, KEYWORD_ARGS["oracle"]),
    "mpc": _keyword_factory("mpc", MPCController, KEYWORD_ARGS["mpc"]),
}
"""Spec name -> factory taking the spec's ':'-separated arguments. Learned policies
(``policy:PATH``) live a layer up: `batchpilot.agents.specs.make_controller`."""
SIMULATOR_ONLY = frozenset({"oracle", "mpc"})
"""Specs whose controllers need the simulator (`simulator_only`): they cannot drive vLLM."""


COMBINE = re.compile(r"\+(?!\d)")
"""The ``+`` of ``A+B`` (the minimum of two controllers): one followed by a digit is an
exponent's sign (``alg2:sla_ms=5e+1``)."""


def spec_parts(spec: str) -> list[str]:
    """The controllers ``A+B`` combines, stripped (a spec of one controller: itself)."""
    return [part.strip() for part in COMBINE.split(spec)]


def spec_key(spec: str) -> str:
    """One spelling of the controller a spec names, to find one given twice: numbers as they
    parse, keywords in order, the parts of ``A+B`` sorted (``static:08`` and ``static:8`` are
    one controller). A part that does not parse, or names no rule, is kept as written."""
    return "+".join(sorted(_part_key(part) for part in spec_parts(spec)))


def given_twice(specs: Sequence[str], key: Callable[[str], str] = spec_key) -> str:
    """The first controller `specs` name twice by `key`, as they spell it (``alg1``,
    ``static:8 and static:08``); empty if none is."""
    seen: dict[str, str] = {}
    for spec in specs:
        k = key(spec)
        if k in seen:
            return spec if seen[k] == spec else f"{seen[k]} and {spec}"
        seen[k] = spec
    return ""


def _part_key(part: str) -> str:
    name, *args = part.split(":")
    try:
        if name == "static":
            return ":".join([name, *(str(plain_int(a, signed=True)) for a in args)])
        if name in KEYWORD_ARGS:
            values = keyword_args(name, args, KEYWORD_ARGS[name])
            return ":".join([name, *(f"{k}={values[k]!r}" for k in sorted(values))])
    except ValueError:
        pass
    return part


def split_specs(text: str) -> list[str]:
    """Comma-separated controller specs; an empty one (``a,,b``, a stray comma) is a
    ControllerSpecError, not skipped."""
    if not text.strip():
        raise ControllerSpecError("no controller spec given; e.g. static:256,alg1+alg2")
    specs = [c.strip() for c in text.split(",")]
    if not all(specs):
        raise ControllerSpecError(
            "an empty controller spec between commas; e.g. static:256,alg1+alg2"
        )
    return specs


def make_controller(
    spec: str, factories: Mapping[str, Callable[[list[str]], Controller]] = FACTORIES
) -> Controller:
    """Build the controller a spec names from `factories`; ``A+B`` is the minimum of A and B."""
    parts = spec_parts(spec)
    if not all(parts):
        raise ControllerSpecError(
            f"empty controller spec in {spec!r}; use e.g. alg1, static:256 or alg1+alg2"
        )
    if len(parts) > 1:
        if resolved := [p for p in parts if p.split(":")[0] in (BEST_STATIC, "default")]:
            entries = [*resolved, "+".join(p for p in parts if p not in resolved)]
            raise ControllerSpecError(
                f"{spec!r}: {resolved[0]} is resolved per workload by `batchpilot compare` (to "
                "static limits) and runs alone, not in an A+B combination; give it as its own "
                f"entry: --controllers {','.join(e for e in entries if e)}"
            )
        return MinController([make_controller(p, factories) for p in parts])
    name, *args = parts[0].split(":")
    if "" in args:
        raise ControllerSpecError(
            f"{parts[0]!r}: empty argument after ':' (e.g. static:256, policy:PATH)"
        )
    if name == BEST_STATIC:
        raise ControllerSpecError(
            f"{spec!r} is a grid search over static:N on a workload, not a controller: "
            "`batchpilot compare` resolves it to the best static:N before running"
        )
    if name not in factories:
        raise ControllerSpecError(
            f"unknown controller {spec!r}; {did_you_mean(name, [*factories, BEST_STATIC])}known: "
            f"{', '.join(sorted(factories))}, and A+B "
            f"combinations (`batchpilot compare` also takes {BEST_STATIC} and default)"
        )
    controller = factories[name](args)
    controller.name = parts[0]
    return controller


def simulator_only(controller: Controller) -> bool:
    """Whether the controller, or any part of a combination, needs the simulator (reads
    the true future, as the oracle does): such a controller cannot drive vLLM."""
    if getattr(controller, "simulator_only", False):
        return True
    return any(simulator_only(p) for p in getattr(controller, "parts", ()))
