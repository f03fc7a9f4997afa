"""Scenario suites: named families of scenarios, each a small YAML file under
``training/scenarios/`` (``batchpilot compare --suite NAME``; ``--suite list`` lists them).

A file holds::

    description: one line on what the family probes
    controllers: [default, best-static, alg1, ...]   # optional: the suite's default rows
    seeds: 5                                         # optional: evaluation seeds 0..N-1
    tuning_seeds: 2                                  # optional: best-static's tuning seeds
    profiles: [llama-2-7b-a100, llama-3-8b-24gb]     # every scenario runs on each
    defaults: {num_requests: 500}                    # optional: fields for every scenario
    scenarios:
      - name: gamma
        source: embedded:azure-conv
        arrival: {llama-2-7b-a100: "gamma:4:3", llama-3-8b-24gb: "gamma:1:3"}
        cv: [2, 4]

Scenario fields are those of `Scenario` (name, source, arrival, num_requests, slo,
interval, overlong, bad_rows, score, scheduler, rate_scale, cv, prompt_scale, output_scale,
and ``profiles`` to override the file's); any value may be a mapping from profile name to
the value on that profile. Ranges (``[LOW, HIGH]``, two numbers) are drawn uniformly per
seed; ``num_requests`` is a whole number (up to `MAX_REQUESTS`) and the other fields are
strings, ``scheduler``, ``overlong``, ``bad_rows`` and ``score`` one of the values `CHOICES`
lists. A trace file's relative path is taken from the working directory (run from the
project root).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from importlib import resources
from pathlib import Path
from typing import Any

from batchpilot.agents.specs import spec_key
from batchpilot.baselines.specs import given_twice, split_specs
from batchpilot.envs.input_files import regular_file, user_path
from batchpilot.envs.plain_numbers import is_number
from batchpilot.envs.profiles import DEFAULT_PROFILE, check_profile_name
from batchpilot.envs.sim_engine import SCHEDULERS
from batchpilot.envs.traces import BAD_ROWS
from batchpilot.envs.workload import OverlongPolicy
from batchpilot.training.evaluate import RANGES, Scenario, check_controllers
from batchpilot.training.limits import MAX_REQUESTS, MAX_SEEDS, MAX_TUNING_SEEDS
from batchpilot.training.report import METRIC_NAMES
from batchpilot.training.yaml_files import load_yaml

TOP_KEYS = (
    "description", "controllers", "seeds", "tuning_seeds", "profiles", "defaults", "scenarios",
)  # fmt: skip
NOT_IN_SUITES = ("profile", "engine", "model", "engine_args", "family")
SCENARIO_KEYS = (*(f.name for f in fields(Scenario) if f.name not in NOT_IN_SUITES), "profiles")
CHOICES = {
    "scheduler": SCHEDULERS,
    "overlong": tuple(p.value for p in OverlongPolicy),
    "bad_rows": BAD_ROWS,
    "score": tuple(METRIC_NAMES),  # the metrics the report ranks controllers by
}
"""Scenario fields with a fixed set of values."""


class SuiteError(ValueError):
    """A suite file that cannot be used; the message names the file and the key."""


@dataclass(frozen=True)
class Suite:
    """A family's scenarios (one per scenario entry and profile) and its run settings."""

    name: str
    description: str
    scenarios: list[Scenario]
    controllers: list[str] | None = None
    seeds: int | None = None
    tuning_seeds: int | None = None
    timed: frozenset[str] = frozenset()
    """The scenarios (by name) whose entry or the file's defaults set an ``interval``."""


def suite_dir() -> Path:
    return Path(str(resources.files("batchpilot.training") / "scenarios"))


def suite_names() -> dict[str, str]:
    """Shipped suite name -> its description."""
    return {p.stem: load_suite(p).description for p in sorted(suite_dir().glob("*.yml"))}


def expand_all(suites: list[str]) -> list[str]:
    """`suites` with ``all`` standing for every shipped suite's name."""
    shipped = [p.stem for p in sorted(suite_dir().glob("*.yml"))]
    return [n for s in suites for n in (shipped if s == "all" else [s])]


def shipped_suite(name: str) -> Path | None:
    """The shipped suite a bare name (no directory, no suffix) names, else None."""
    path = Path(name)
    if path.name != name or path.suffix:
        return None
    shipped = suite_dir() / f"{name}.yml"
    return shipped if shipped.is_file() else None


def load_suite(name_or_path: str | Path) -> Suite:
    """A shipped suite by name, or a suite YAML file (with or without .yml)."""
    path = shipped_suite(str(name_or_path)) or user_path(name_or_path, SuiteError)
    blank = not str(name_or_path).strip()  # Path('') is '.', a directory
    if blank or (not path.suffix and not path.exists()):  # a directory: regular_file says
        known = ", ".join(p.stem for p in sorted(suite_dir().glob("*.yml")))
        raise SuiteError(f"unknown suite {str(name_or_path)!r}; known: {known}, all")
    if not regular_file(path, "a suite file", SuiteError):
        raise SuiteError(f"{path}: no such suite file")
    try:
        data = load_yaml(path)
    except ValueError as exc:
        raise SuiteError(str(exc)) from None
    return parse_suite(data, path)


def parse_suite(data: Any, path: Path) -> Suite:
    """Validate a suite's parsed YAML; every error names `path` and the key."""
    if not isinstance(data, dict):
        raise SuiteError(f"{path}: a suite is a mapping with a 'scenarios' list")
    for key in data:
        if key not in TOP_KEYS:
            raise SuiteError(f"{path}: unknown key {key!r}; known: {', '.join(TOP_KEYS)}")
    entries = data.get("scenarios")
    if not isinstance(entries, list) or not entries:
        raise SuiteError(f"{path}: 'scenarios' must be a non-empty list")
    defaults = data.get("defaults", {})
    if not isinstance(defaults, dict):
        raise SuiteError(f"{path}: 'defaults' must be a mapping of scenario fields")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SuiteError(f"{path}: 'description' must be a string, got {description!r}")
    if "profiles" in data and "profiles" in defaults:  # the defaults' were taken, silently
        raise SuiteError(f"{path}: 'profiles' given at the top and in 'defaults': give one")
    profiles = _as_profiles(data.get("profiles", [DEFAULT_PROFILE]), f"{path}: 'profiles'")
    scenarios, timed = [], set()
    for i, entry in enumerate(entries):
        where = f"{path}: scenarios[{i}]"
        if not isinstance(entry, dict):
            raise SuiteError(f"{where}: each scenario is a mapping of fields")
        name = str(entry.get("name", "unnamed"))
        where += f" ({name if name.isprintable() and len(name) <= 40 else repr(name[:40])})"
        merged = {**defaults, **entry}
        for key in merged:
            if key not in SCENARIO_KEYS:
                raise SuiteError(
                    f"{where}: unknown key {key!r}; known: {', '.join(SCENARIO_KEYS)}"
                )
        for key in ("name", "source"):
            if key not in merged:
                raise SuiteError(f"{where}: missing key {key!r}")
        on = _as_profiles(merged.pop("profiles", profiles), f"{where}: 'profiles'")
        for key, value in entry.items():  # (defaults may serve other scenarios' profiles too)
            strays = [k for k in value if k not in on] if isinstance(value, dict) else []
            if strays:
                raise SuiteError(
                    f"{where}: {key!r} gives a value for {strays[0]!r}, which is not one of the "
                    f"scenario's profiles ({', '.join(map(str, on))})"
                )
        for profile in on:
            scenarios.append(_scenario(path.stem, merged, profile, where))
            if "interval" in merged:
                timed.add(scenarios[-1].name)
    used = {sc.profile for sc in scenarios}
    for key, value in defaults.items():
        strays = [k for k in value if k not in used] if isinstance(value, dict) else []
        if strays:
            raise SuiteError(
                f"{path}: defaults: {key!r} gives a value for {strays[0]!r}, a profile no "
                "scenario runs on"
            )
    names = [sc.name for sc in scenarios]
    if twice := sorted({n for n in names if names.count(n) > 1}):
        raise SuiteError(f"{path}: scenario names must be unique; given twice: {twice}")
    for key, high in (("seeds", MAX_SEEDS), ("tuning_seeds", MAX_TUNING_SEEDS)):
        value = data.get(key)
        if value is not None and not _is_count(value, high):
            raise SuiteError(f"{path}: {key!r} must be an integer in [1, {high}], got {value!r}")
    return Suite(
        name=path.stem,
        description=description,
        scenarios=scenarios,
        controllers=_controllers(data.get("controllers"), path, scenarios),
        seeds=data.get("seeds"),
        tuning_seeds=data.get("tuning_seeds"),
        timed=frozenset(timed),
    )


def _controllers(value: Any, path: Path, scenarios: list[Scenario]) -> list[str] | None:
    """The suite's controller specs (a list or a comma-separated string), each buildable on
    its scenarios (`check_controllers`), None if not given."""
    if isinstance(value, str):
        try:
            value = split_specs(value)
        except ValueError as exc:
            raise SuiteError(f"{path}: 'controllers' {value!r}: {exc}") from None
    if value is not None and not (
        isinstance(value, list) and value and all(isinstance(c, str) and c for c in value)
    ):
        raise SuiteError(
            f"{path}: 'controllers' must be a non-empty list of controller specs, got {value!r}"
        )
    twice = given_twice(value or [], key=spec_key)
    if twice:
        raise SuiteError(f"{path}: 'controllers' gives {twice} twice")
    try:
        check_controllers(value or [], scenarios)
    except ValueError as exc:
        raise SuiteError(f"{path}: 'controllers': {exc}") from None
    return value


def _is_count(value: Any, high: int) -> bool:
    """Whether `value` is a whole number in [1, high] (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= high


def _as_profiles(value: Any, where: str) -> list[str]:
    """A suite's `profiles` value as a list of profile names, each given once."""
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise SuiteError(f"{where} must be a profile name or a list of them")
    twice = sorted({v for v in value if value.count(v) > 1})
    if twice:
        raise SuiteError(f"{where} names {', '.join(twice)} twice; give each profile once")
    return value


def _scenario(family: str, fields_: dict[str, Any], profile: str, where: str) -> Scenario:
    """The scenario of one entry on one profile (per-profile mappings resolved)."""
    from batchpilot.envs.profiles import get_profile

    try:
        get_profile(profile)
    except ValueError as exc:
        raise SuiteError(f"{where}: 'profiles': {exc}") from None
    kw: dict[str, Any] = {}
    for key, value in fields_.items():
        if isinstance(value, dict):
            if not value:
                raise SuiteError(
                    f"{where}: {key!r} is an empty mapping; give one value, or one per profile"
                )
            if profile not in value:
                raise SuiteError(
                    f"{where}: {key!r} gives values for {', '.join(map(str, value))} but not "
                    f"for profile {profile!r}"
                )
            value = value[profile]
        kw[key] = _field(key, value, where)
    if isinstance(kw["name"], str):  # titles a report's heading and its plots' files
        try:
            check_profile_name(kw["name"], "scenario name")
        except ValueError as exc:
            raise SuiteError(f"{where}: {exc}") from None
    kw["name"] = f"{family}/{kw['name']} on {profile}"
    try:
        sc = Scenario(profile=profile, family=family, **kw)
        _check(sc)
    except (TypeError, ValueError) as exc:
        raise SuiteError(f"{where}: {exc}") from None
    return sc


def _field(key: str, value: Any, where: str) -> Any:
    """Scenario field `key`'s `value` on one profile, type (and choice) checked; a range as a
    tuple (its bounds are checked by `Scenario`)."""
    if key in RANGES:
        if not (isinstance(value, list) and len(value) == 2 and all(map(is_number, value))):
            raise SuiteError(f"{where}: {key!r} must be [LOW, HIGH] (two numbers), got {value!r}")
        return (float(value[0]), float(value[1]))
    if key == "num_requests":
        if not _is_count(value, MAX_REQUESTS):
            raise SuiteError(
                f"{where}: 'num_requests' must be an integer in [1, {MAX_REQUESTS}], got {value!r}"
            )
        return value
    if not isinstance(value, str):
        raise SuiteError(f"{where}: {key!r} must be a string, got {value!r}")
    if key in CHOICES and value not in CHOICES[key]:
        known = ", ".join(CHOICES[key])
        raise SuiteError(f"{where}: {key!r} must be one of {known}, got {value!r}")
    return value


def _check(sc: Scenario) -> None:
    """Parse what a run would parse, so a bad value fails at load time: a trace file is read
    whole (`load_trace` keeps it read, so the run reads it no more), and its first requests
    under the scenario's arrival process (a replay needs the trace's times)."""
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.metrics import SLO, goodput_slo
    from batchpilot.envs.workloads import arrival_suffix, make_workload

    goodput_slo(SLO.parse(sc.slo), "'slo'")
    ControlInterval.parse(sc.interval)
    if not sc.is_trace_file:
        make_workload(sc.source, sc.arrival, num_requests=2, seed=0)
    elif not regular_file(user_path(sc.source), "a trace file"):
        raise ValueError(
            arrival_suffix(sc.source)  # make_workload says so where it runs
            or f"no trace file {sc.source!r} (a relative path is taken from the working "
            f"directory, {Path.cwd()})"
        )
    else:
        make_workload(sc.source, sc.arrival, num_requests=1, seed=0, bad_rows=sc.bad_rows)
