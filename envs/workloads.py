"""Build a `Workload` from a trace file or an embedded length table plus an arrival process."""

from __future__ import annotations

import re

import numpy as np

from batchpilot.envs.arrivals import ARRIVAL_KINDS, DEFAULT_ARRIVAL, Arrival
from batchpilot.envs.embedded import (
    EMBEDDED_PREFIX,
    NO_REPLAY,
    embedded_lengths,
    embedded_names,
)
from batchpilot.envs.input_files import user_path
from batchpilot.envs.plain_numbers import plain_float, plain_int
from batchpilot.envs.traces import BAD_ROWS, DEFAULT_BAD_ROWS, MAX_SPAN_S, MAX_TOKENS, load_trace
from batchpilot.envs.workload import (
    DEFAULT_OVERLONG,
    OverlongPolicy,
    Workload,
    WorkloadError,
)

FIXED_PREFIX = "fixed:"
"""``fixed:PROMPT:OUTPUT``: every request has these lengths (the paper's 128/128 setting)."""
MIX_PREFIX = "mix:"
"""``mix:NAME=W,NAME=W``: each request's lengths from embedded table NAME with weight W."""
SHIFT_PREFIX = "shift:"
"""``shift:NAME@0,NAME@T1,...[/PERIOD]``: lengths from embedded table NAME for requests arriving
from T seconds on; with ``/PERIOD`` the schedule repeats every PERIOD seconds (a regime shift)."""
DEFAULT_SOURCE = "embedded:azure-conv"
"""The source `make_workload` and the Gym env use when none is given: Azure 2023 conversation
lengths, no file needed, replayed at the trace's rate (the CLI's default workload,
`batchpilot.training.commands.common.DEFAULT_WORKLOAD`, replays it at 0.7x)."""
MAX_REQUESTS = 10_000_000
"""Requests in a run, wherever a number is given (a run's memory is bounded, its workload is
not)."""
DRAWN_REQUESTS = 1000
"""Requests drawn from an embedded table, mix, shift or fixed source when no number is given."""


def is_trace_file(source: str) -> bool:
    """Whether `source` names a trace file (not an embedded table, mix, shift or fixed, nor
    blank: `make_workload` refuses that)."""
    prefixes = (EMBEDDED_PREFIX, FIXED_PREFIX, MIX_PREFIX, SHIFT_PREFIX)
    return bool(source.strip()) and not source.startswith(prefixes)


def names_a_file(text: str) -> bool:
    """Whether `text` names an existing file (``~`` expanded); a name no path can be (an
    unknown user's ``~``, too long) is none."""
    try:
        return user_path(text).is_file()
    except (OSError, ValueError):
        return False


def draw_probabilities(weights: list[float]) -> np.ndarray:
    """Positive draw weights as probabilities, scaled by the largest first: a sum of huge
    weights would overflow."""
    relative = np.asarray(weights, dtype=np.float64) / max(weights)
    return relative / relative.sum()


def split_arrival(text: str) -> tuple[str, str] | None:
    """``SOURCE@ARRIVAL`` -> (source, arrival), split at the first ``@`` that starts an
    arrival process (``steps:`` has ``@`` of its own), or at a later one where the text
    before it is an existing file (a trace named ``x@poisson.csv``); None where none does."""
    splits = [m for m in re.finditer(rf"@(?=({'|'.join(ARRIVAL_KINDS)})\b)", text) if m.start()]
    if names_a_file(text):  # a file named x@replay.csv, given with no arrival of its own
        splits = [m for m in splits if _parses(text[m.end() :])]
    files = [m for m in splits if names_a_file(text[: m.start()])]
    match = (files or splits or [None])[0]
    return None if match is None else (text[: match.start()], text[match.end() :])


def _parses(arrival: str) -> bool:
    """Whether `arrival` is an arrival process."""
    try:
        Arrival.parse(arrival)
    except ValueError:
        return False
    return True


def arrival_suffix(source: str) -> str | None:
    """Where `source` is the command line's ``SOURCE@ARRIVAL`` (`split_arrival`, a valid
    arrival process) and names no file: a message saying to give source and arrival as two
    keys; else None."""
    split = split_arrival(source)  # no '@ARRIVAL' (most sources): no file to look for
    if split is None or names_a_file(source):
        return None
    base, tail = split
    if not _parses(tail):
        return None
    return (
        f"workload {source!r} ends in an arrival process (@{tail}); in a config or suite give "
        f"source: {base} and arrival: {tail} as two keys (SOURCE@ARRIVAL is the command line's "
        "form)"
    )


def trace_window(
    source: str,
    num_requests: int | None,
    rng: np.random.Generator | int,
    bad_rows: str = DEFAULT_BAD_ROWS,
) -> tuple[int | None, int | None]:
    """(num_requests, window_start) of a run of `num_requests` requests of `source`, as
    `make_workload` takes them: of a trace file holding more, a window starting at a request
    drawn uniformly from `rng` (a seed: its own stream), so runs see different parts of the
    trace; of one holding no more, the whole trace (None, None), nothing drawn; anything else
    as given, no window."""
    if not is_trace_file(source) or num_requests is None:
        return num_requests, None
    spare = len(load_trace(source, bad_rows=bad_rows)) - num_requests
    if spare <= 0:
        return None, None
    if not isinstance(rng, np.random.Generator):
        rng = np.random.default_rng([rng, 0x1D0])
    return num_requests, int(rng.integers(0, spare + 1))


def short_trace_note(label: str, held: int, asked: int | None, each: str = "run") -> str | None:
    """The note for a trace file that holds fewer requests than `asked` (every `each` takes
    the whole trace, `trace_window`), labelled `label`; None where it holds enough."""
    if asked is None or held >= asked:
        return None
    return (
        f"note: {label}: the trace holds {held:,} request{'s' if held != 1 else ''}, fewer "
        f"than the {asked:,} asked for; every {each} takes the whole trace"
    )


def make_workload(
    source: str = DEFAULT_SOURCE,
    arrival: str | Arrival = DEFAULT_ARRIVAL,
    *,
    num_requests: int | None = None,
    seed: int = 0,
    max_model_len: int | None = None,
    overlong: OverlongPolicy | str = DEFAULT_OVERLONG,
    bad_rows: str = DEFAULT_BAD_ROWS,
    window_start: int | None = None,
) -> Workload:
    """A workload from `source`: a trace path, ``embedded:NAME``, ``fixed:PROMPT:OUTPUT``,
    ``mix:A=W,B=W`` or ``shift:A@0,B@T/P`` (`mix_components`, `shift_phases`).

    `arrival` is an `Arrival` spec; ``replay`` on an embedded table replays its fitted
    Gamma process (the trace's mean rate and inter-arrival CV). `num_requests` takes the
    first N requests of a trace by arrival time (its rows in time order; all by default; a
    trace that holds fewer is an error) or draws N from an embedded table or a fixed source
    (`DRAWN_REQUESTS` by default); with
    `window_start`, a trace's N requests from that one on instead: a replay replays their own
    times from 0, any other process draws the N arrivals alone (a rate step or ramp falls
    within the run).
    `max_model_len` with `overlong` applies the context policy. `bad_rows` (`BAD_ROWS`)
    says what a trace file's bad rows do (`load_trace`); those left out are counted in the
    workload.
    """
    if not source.strip():  # Path('') is '.', a directory
        raise WorkloadError("the source is empty: name a trace file or embedded:NAME")
    if num_requests is not None and (isinstance(num_requests, bool) or num_requests < 1):
        raise WorkloadError(f"num_requests is {num_requests!r}; need at least 1 (None: default)")
    if problem := arrival_suffix(source):
        raise WorkloadError(problem)
    if bad_rows not in BAD_ROWS:
        raise WorkloadError(f"bad_rows is {bad_rows!r}; one of {', '.join(BAD_ROWS)}")
    if isinstance(seed, bool) or not 0 <= seed < 2**32:
        raise WorkloadError(f"seed is {seed!r}; need a whole number in [0, 2**32)")
    process = arrival if isinstance(arrival, Arrival) else Arrival.parse(arrival)
    rng = np.random.default_rng(seed)
    skipped = 0, ""
    first = 0  # the first request's index in the source
    if window_start is not None and (not is_trace_file(source) or num_requests is None):
        raise WorkloadError(f"{source}: window_start needs a trace file and num_requests")
    if source.startswith(FIXED_PREFIX):
        n = num_requests or DRAWN_REQUESTS
        prompt_len, output_len = fixed_lengths(source)
        prompt, output = np.full(n, prompt_len), np.full(n, output_len)
        times = process.times(n, rng)
        label = f"{prompt_len}/{output_len} tokens ({process_label(process)})"
    elif source.startswith(MIX_PREFIX):
        n = num_requests or DRAWN_REQUESTS
        names, weights = mix_components(source)
        pick = rng.choice(len(names), size=n, p=weights)
        prompt, output = _lengths_by_table(names, pick, rng)
        if process.kind == "replay":
            raise WorkloadError(f"workload {source!r}: a mix has no timestamps to {NO_REPLAY}")
        times = process.times(n, rng)
        label = f"{source.removeprefix(MIX_PREFIX)} ({process_label(process)})"
    elif source.startswith(SHIFT_PREFIX):
        n = num_requests or DRAWN_REQUESTS
        names, starts, period = shift_phases(source)
        if process.kind == "replay":
            raise WorkloadError(f"workload {source!r}: a shift has no timestamps to {NO_REPLAY}")
        if process.kind == "all-at-once" and len(names) > 1:
            raise WorkloadError(
                f"workload {source!r}: all-at-once arrives at 0 s, in the first phase alone; "
                "give the shift a rate (e.g. @poisson:4)"
            )
        times = process.times(n, rng)
        phase = np.searchsorted(starts, times % period if period else times, side="right") - 1
        prompt, output = _lengths_by_table(names, phase, rng)
        label = f"{source.removeprefix(SHIFT_PREFIX)} ({process_label(process)})"
    elif source.startswith(EMBEDDED_PREFIX):
        name = source.removeprefix(EMBEDDED_PREFIX)
        n = num_requests or DRAWN_REQUESTS
        table = embedded_lengths(name)
        prompt, output = table.sample(n, rng)
        if process.kind == "replay":
            rate, cv = table.arrival
            process = Arrival("gamma", rate=rate * process.scale, cv=cv)
        times = process.times(n, rng)
        label = f"{name} ({process_label(process)})"
    else:
        trace = load_trace(source, bad_rows=bad_rows)
        skipped = trace.skipped_rows, trace.first_skipped
        n = num_requests or len(trace)
        if n > len(trace):
            raise WorkloadError(
                f"{source}: the trace holds {len(trace):,} "
                f"request{'s' if len(trace) != 1 else ''}, fewer than the "
                f"{n} asked for; ask for at most {len(trace)} (or none: the whole trace)"
            )
        if process.kind == "replay" and trace.arrival_s is None:
            raise WorkloadError(
                f"{source}: a {trace.format} length table has no timestamps to {NO_REPLAY} "
                "(replay reads Azure, BurstGPT, Vidur, Mooncake and Bailian traces' times)"
            )
        window = ""
        if window_start is not None:
            if not 0 <= window_start <= len(trace) - n:
                raise WorkloadError(
                    f"{source}: window_start {window_start} with {n} requests runs past the "
                    f"trace's {len(trace)} requests"
                )
            first = window_start
            window = f"[{first}:{first + n}]"
        own = None if trace.arrival_s is None else trace.arrival_s[first:]
        times = process.times(n, rng, own)
        read = ""
        if process.kind == "replay" and n > 1:  # the rate read: a wrong time unit shows here
            span = float(times[-1] - times[0])
            over = f"over {_figure(span)} s, {_figure((n - 1) / span)}/s" if span > 0 else "at once"
            read = f": {trace.format} trace, {n:,} requests {over}"
        label = f"{trace.name} ({process_label(process)}{read}){window}"
        prompt = trace.prompt_tokens[first : first + n]
        output = trace.output_tokens[first : first + n]
    workload = Workload(
        label,
        times,
        prompt,
        output,
        np.arange(first, first + len(times)),
        source=source,
        skipped_rows=skipped[0],
        first_skipped=skipped[1],
    )
    if max_model_len is not None:
        workload = workload.fit_context(max_model_len, overlong)
    return workload


def _lengths_by_table(
    names: list[str], which: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """(prompt, output) lengths, request i's drawn from embedded table ``names[which[i]]``
    (each table sampled once, in the order of `names`)."""
    prompt, output = np.ones(len(which), dtype=np.int64), np.ones(len(which), dtype=np.int64)
    for i, name in enumerate(names):
        rows = which == i
        if rows.any():
            prompt[rows], output[rows] = embedded_lengths(name).sample(int(rows.sum()), rng)
    return prompt, output


def fixed_lengths(source: str) -> tuple[int, int]:
    """(prompt, output) tokens of a ``fixed:PROMPT:OUTPUT`` source."""
    parts = source.removeprefix(FIXED_PREFIX).split(":")
    try:
        prompt, output = (plain_int(p) for p in parts)
    except ValueError:
        raise WorkloadError(
            f"workload {source!r}: use fixed:PROMPT:OUTPUT with whole token counts"
        ) from None
    if not (1 <= prompt <= MAX_TOKENS and 1 <= output <= MAX_TOKENS):
        raise WorkloadError(f"workload {source!r}: token counts must be in [1, {MAX_TOKENS:,}]")
    return prompt, output


def _number(text: str) -> float:
    """`text` as a float; NaN if it is not a plain number (`plain_float`)."""
    try:
        return plain_float(text)
    except ValueError:
        return float("nan")


def mix_components(source: str) -> tuple[list[str], np.ndarray]:
    """Table names and normalised weights of a ``mix:NAME=W,...`` source."""
    names, weights = [], []
    for part in source.removeprefix(MIX_PREFIX).split(","):
        name, _, text = part.partition("=")
        weight = _number(text)
        if not np.isfinite(weight) or weight <= 0:
            raise WorkloadError(f"workload {source!r}: {part!r} is not NAME=WEIGHT (weight > 0)")
        embedded_lengths(name)  # names the known tables if unknown
        if name in names:
            raise WorkloadError(f"workload {source!r}: {name!r} given twice; give it one weight")
        names.append(name)
        weights.append(weight)
    return names, draw_probabilities(weights)


def shift_phases(source: str) -> tuple[list[str], np.ndarray, float | None]:
    """Table names, phase starts (s) and repeat period (None: no repeat) of a ``shift:``."""
    spec = source.removeprefix(SHIFT_PREFIX)
    body, slash, period_text = spec.partition("/")
    # a path (not "/PERIOD" alone), or a trace file's name before an @
    if re.match(r"~|\.|/(?![0-9.]*$)", spec) or re.search(r"\.(csv|jsonl?)(\.gz)?@", spec):
        raise WorkloadError(
            f"workload {source!r}: shift: takes embedded table names, not files (e.g. "
            f"shift:sharegpt@0,azure-code@60/120; known: {', '.join(embedded_names())})"
        )
    names, starts = [], []
    for part in body.split(","):
        name, sep, start = part.partition("@")
        t = _number(start)
        if not sep or not 0 <= t <= MAX_SPAN_S or (starts and t <= starts[-1]):
            raise WorkloadError(
                f"workload {source!r}: {part!r} is not NAME@START_S with starts increasing "
                f"from 0, up to {MAX_SPAN_S:.0e} s (e.g. shift:sharegpt@0,azure-code@60/120)"
            )
        embedded_lengths(name)  # names the known tables if unknown
        names.append(name)
        starts.append(t)
    if starts[0] != 0.0:
        raise WorkloadError(f"workload {source!r}: the first phase must start at 0")
    period = None
    if slash:
        period = _number(period_text)
        if not starts[-1] < period <= MAX_SPAN_S:
            raise WorkloadError(
                f"workload {source!r}: the period {period_text!r} must be a number of seconds "
                f"after the last phase's start ({starts[-1]:g}), up to {MAX_SPAN_S:.0e}"
            )
    return names, np.asarray(starts), period


def _figure(x: float) -> str:
    """`x` to three significant figures, an exponent only under 0.001: 0.0485, 12.3, 1,030."""
    return f"{x:,.0f}" if x >= 100 else f"{x:.3g}" if x >= 1e-3 else f"{x:.1e}"


def process_label(process: Arrival) -> str:
    """Short human label for an arrival process."""
    if process.kind == "poisson":
        return f"poisson {process.rate:g}/s"
    if process.kind == "gamma":
        return f"gamma {process.rate:g}/s cv {process.cv:g}"
    if process.kind == "replay":
        return "replay" if process.scale == 1.0 else f"replay x{process.scale:g}"
    if process.kind == "steps":
        return "steps " + ", ".join(f"{r:g}/s from {t:g}s" for t, r in process.steps)
    if process.kind == "ramp":
        over = "" if process.ramp_s is None else f" over {process.ramp_s:g}s"
        return f"ramp {process.rate:g}->{process.rate_end:g}/s{over}"
    return "all at once"


__all__ = [
    "DEFAULT_SOURCE",
    "FIXED_PREFIX",
    "MIX_PREFIX",
    "SHIFT_PREFIX",
    "embedded_names",
    "fixed_lengths",
    "make_workload",
    "mix_components",
    "process_label",
    "shift_phases",
]
