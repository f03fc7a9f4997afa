"""Trace loading speed: the row-by-row CSV reader vs the vectorised one (`envs/trace_fast.py`)
on generated Azure-style (Azure 2023's timestamps, or ones of varied fractions and zones),
Vidur-style (arrived_at as float reprs), ShareGPT-style (lengths only) and BurstGPT-style
(decimal seconds, 5% failed requests with 0 response tokens, read with bad_rows="skip")
files, plain and gzip. Prints rows per second side by side and checks that both readers
give the same arrays, bit for bit, and the same skipped rows and first skipped error.

    python tests/benchmarks/trace_load.py [--rows 1000000] [--format azure vidur ...]
        [--gzip] [--dir /tmp] [--keep]
"""

from __future__ import annotations

import argparse
import functools
import gzip
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from batchpilot.envs import traces


def azure_rows(rows: int, rng: np.random.Generator, zones: bool = False) -> list[str]:
    """Azure 2023-style lines ('2023-11-16 18:15:46.6805900', a week), or with `zones` a
    second's fraction of 0 to 9 digits, a 'T' or a space, and a 'Z', '+01:00' or no zone."""
    start = np.datetime64("2024-05-10T00:00:00", "s").astype(np.int64)
    stamps = (start + np.sort(rng.integers(0, 7 * 86400, rows))).astype("M8[s]").astype(str)
    digits = rng.integers(0, 10, rows) if zones else np.full(rows, 7)
    zone = rng.choice(["", "", "Z", "+01:00", "-05:30"], rows) if zones else np.full(rows, "")
    gap = rng.choice([" ", "T"], rows) if zones else np.full(rows, " ")
    fraction = [str(f).zfill(9) for f in rng.integers(0, 10**9, rows)]
    prompt, output = rng.integers(1, 8000, rows), rng.integers(1, 2000, rows)
    return [
        f"{s[:10]}{g}{s[11:]}{'.' + f[:d] if d else ''}{z},{p},{o}"
        for s, g, f, d, z, p, o in zip(
            stamps, gap, fraction, digits, zone, prompt, output, strict=True
        )
    ]


def vidur_rows(rows: int, rng: np.random.Generator) -> list[str]:
    """Vidur-style lines: arrived_at as a float's repr (up to 17 digits)."""
    arrived = np.cumsum(rng.exponential(0.2, rows))
    prompt, output = rng.integers(1, 8000, rows), rng.integers(1, 2000, rows)
    return [f"{a!r},{p},{o}" for a, p, o in zip(arrived.tolist(), prompt, output, strict=True)]


def burstgpt_rows(rows: int, rng: np.random.Generator) -> list[str]:
    """BurstGPT-style lines: times in decimal seconds, a model, and 5% failed requests with 0
    response tokens (bad rows, left out with bad_rows="skip")."""
    stamps = np.cumsum(rng.exponential(0.4, rows)).round(3)
    model = rng.choice(["ChatGPT", "GPT-4"], rows)
    log = rng.choice(["Conversation log", "API log"], rows)
    prompt, output = rng.integers(1, 8000, rows), rng.integers(1, 2000, rows)
    output[rng.random(rows) < 0.05] = 0
    return [
        f"{t!r},{m},{p},{o},{p + o},{g}"
        for t, m, p, o, g in zip(stamps.tolist(), model, prompt, output, log, strict=True)
    ]


def sharegpt_rows(rows: int, rng: np.random.Generator) -> list[str]:
    """ShareGPT length lines: two token counts, their total and their ratio."""
    prompt, output = rng.integers(1, 8000, rows), rng.integers(1, 2000, rows)
    return [f"{p},{o},{p + o},{p / o!r}" for p, o in zip(prompt, output, strict=True)]


FORMATS: dict[str, tuple[str, Callable[[int, np.random.Generator], list[str]]]] = {
    "azure": ("TIMESTAMP,ContextTokens,GeneratedTokens", azure_rows),
    "azure-zones": (
        "TIMESTAMP,ContextTokens,GeneratedTokens",
        functools.partial(azure_rows, zones=True),
    ),
    "vidur": ("arrived_at,num_prefill_tokens,num_decode_tokens", vidur_rows),
    "sharegpt": ("num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio", sharegpt_rows),
    "burstgpt": (
        "Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type",
        burstgpt_rows,
    ),
}
SKIP = {"burstgpt"}
"""Formats read with bad_rows="skip" (their files have bad rows)."""


def write(path: Path, fmt: str, rows: int, packed: bool) -> None:
    """A generated trace of `rows` rows (CRLF line ends, as Azure's), gzipped if `packed`."""
    header, make = FORMATS[fmt]
    text = "\r\n".join([header, *make(rows, np.random.default_rng(0))]) + "\r\n"
    data = text.encode()
    path.write_bytes(gzip.compress(data, compresslevel=1) if packed else data)


def timed(read: Callable[[], traces.Trace | None]) -> tuple[traces.Trace | None, float]:
    t0 = time.perf_counter()
    trace = read()
    return trace, time.perf_counter() - t0


def same(a: traces.Trace, b: traces.Trace) -> bool:
    """Bit-identical arrays (and dtypes), the same skipped rows and first skipped error."""
    if (a.skipped_rows, a.first_skipped) != (b.skipped_rows, b.first_skipped):
        return False
    pairs = [(a.prompt_tokens, b.prompt_tokens), (a.output_tokens, b.output_tokens)]
    if (a.arrival_s is None) != (b.arrival_s is None):
        return False
    if a.arrival_s is not None:
        pairs.append((a.arrival_s, b.arrival_s))
    return all(x.dtype == y.dtype and x.tobytes() == y.tobytes() for x, y in pairs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--format", nargs="+", choices=sorted(FORMATS), default=sorted(FORMATS))
    parser.add_argument("--gzip", action="store_true", help="also gzip-compressed copies")
    parser.add_argument("--dir", type=Path, default=Path(tempfile.gettempdir()))
    parser.add_argument("--keep", action="store_true", help="keep the generated files")
    args = parser.parse_args()
    print(
        f"{'file':<40}{'MB':>7}{'bad rows':>15}{'row-by-row rows/s':>19}"
        f"{'vectorised rows/s':>19}{'speedup':>9}"
    )
    for fmt in args.format:
        skip = fmt in SKIP
        for packed in (False, True) if args.gzip else (False,):
            path = args.dir / f"bench_{fmt}_{args.rows}.csv{'.gz' if packed else ''}"
            write(path, fmt, args.rows, packed)
            slow, slow_s = timed(lambda p=path, s=skip: traces._read_csv_rows(p, s))
            fast, fast_s = timed(lambda p=path, s=skip: traces._read_csv_fast(p, s))
            if len(slow) + slow.skipped_rows != args.rows:
                raise SystemExit(f"{path}: the row reader read {len(slow)} of {args.rows} rows")
            if fast is None:
                print(f"{path.name}: the vectorised reader left it to the row reader")
                continue
            if not same(slow, fast):
                raise SystemExit(f"{path}: the readers differ")
            bad_rows = f"{slow.skipped_rows:,} skipped" if skip else "error"
            print(
                f"{path.name:<40}{path.stat().st_size / 1e6:>7.0f}{bad_rows:>15}"
                f"{args.rows / slow_s:>19,.0f}"
                f"{args.rows / fast_s:>19,.0f}{slow_s / fast_s:>8.0f}x"
            )
            if not args.keep:
                path.unlink()
    print(
        "(every file timed by both readers gave the same arrays, bit for bit, and the same "
        "skipped rows and first skipped error)"
    )


if __name__ == "__main__":
    main()
