"""Derive the small step-time tables the measured GPU profiles need from Vidur's operator
profiles (microsoft/vidur, MIT licence; a copy lives in ``../shared/profiling/vidur``)::

    python -m batchpilot.envs.profile_tables ../shared/profiling/vidur

writes ``envs/data/profile_tables.json`` (``--out`` for elsewhere). Never commit the raw CSVs.

What is derived, per input:

- ``compute/<gpu>/<org>/<model>/mlp.csv`` (one row per token count and TP degree; medians
  of repeated kernel timings): per layer, the sum of input layernorm, QKV projection, RoPE,
  output projection, post-attention layernorm, gate/up projection, activation, down
  projection and the two residual adds (ms); the embedding (once per step); the gate/up
  projection alone (scaled to the LM head by `batchpilot.envs.profiles`). GEMM timings
  step up and down with tile quantisation; the tables keep the closest non-decreasing
  fit (isotonic least squares) at knots on a geometric grid of ratio 2^(1/6).
- ``compute/a100/attention-70b-shape-tp2/attention.csv`` (64 query / 8 KV heads, head dim
  128, TP 2, FlashAttention on A100; in a Vidur checkout the TP-2 rows of
  ``compute/a100/meta-llama/Llama-2-70b-hf/attention.csv``, which holds every TP degree it
  profiled, are read): the only attention table. Fitted per layer by
  least squares in relative error as an analytic FlashAttention cost: decode
  ``a + c B K`` (B requests of context K: KV bytes read), prefill ``a + alpha C +
  beta C (K + C)`` (a chunk of C tokens after K cached ones). The fit's median and 90th
  percentile relative errors are written beside the coefficients.
- ``network/<gpu>_dgx/all_reduce.csv`` (NCCL all-reduce within one DGX node): time by
  message size in bytes for 2, 4 and 8 GPUs, thinned like the linear layers.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from batchpilot.envs.input_files import path_arg
from batchpilot.envs.output_files import replace_file

DATA_PATH = Path(__file__).resolve().parent / "data" / "profile_tables.json"
LAYER_OPS = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
    "add",  # two residual adds per layer
)
ATTENTION_TABLES = (
    "compute/a100/attention-70b-shape-tp2/attention.csv",
    "compute/a100/meta-llama/Llama-2-70b-hf/attention.csv",
)
"""Where the attention table is read from, the first that exists: this project's extract, or
a Vidur checkout's own (Llama-2-70B's on the A100)."""
ATTENTION_SHAPE = {"q_heads_per_gpu": 32, "kv_heads_per_gpu": 4, "head_dim": 128, "gpu": "a100"}
"""The measured attention table's shape: 64 query and 8 KV heads split over TP 2."""
ATTENTION_ROWS = {"n_embd": 8192, "n_q_head": 64, "n_kv_head": 8, "num_tensor_parallel_workers": 2}
"""The attention table's columns for `ATTENTION_SHAPE`: its rows of another model shape or TP
degree are not read (a TP-8 row times a quarter of the heads)."""
GRID_RATIO = 2 ** (1 / 6)
MAX_JUMP = 10.0
"""The most a linear-layer time may change from one measured token count to the next (up:
beyond the tokens' own growth) by more than `MIN_JUMP_MS`: Vidur's tables change at most 4x
(an embedding's microseconds, timed to the microsecond); more is a bad cell."""
MIN_JUMP_MS = 1.0
"""A change smaller than this is no bad cell whatever its ratio (a timer's noise on a time of
microseconds)."""
REPEAT_SPREAD = 1.5
"""The most two rows of a linear-layer table timing the same token count and TP may differ by
(their layer's ops summed): Vidur's own repeats agree within 6%; more is two runs mixed."""


MAX_COUNT = 2**53
"""The largest count (tokens, workers, bytes) a table may hold: past it floats skip whole
numbers."""


def _rows(path: Path) -> list[tuple[int, dict[str, str]]]:
    """(line, row) of each data row; an unreadable file, a row with more cells than the
    header or a file of no data rows is a ValueError naming the file (and the line)."""
    rows = []
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            if twice := sorted({h for h in header if header.count(h) > 1}):
                raise ValueError(f"{path}:1: the header names column(s) {twice} more than once")
            if len(header) == 1 and (sep := next((c for c in ";\t|" if c in header[0]), "")):
                raise ValueError(
                    f"{path}:1: one column, separated by {sep!r}: Vidur's tables are "
                    "comma-separated (save the file as CSV with ',')"
                )
            for row in reader:
                if None in row:  # DictReader's key for cells past the header's columns
                    raise ValueError(
                        f"{path}:{reader.line_num}: {len(row[None])} cell(s) more than the "
                        "header has columns"
                    )
                rows.append((reader.line_num, row))
    except OSError as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not UTF-8 text (a CSV expected)") from None
    except csv.Error as exc:
        raise ValueError(f"{path}: not a readable CSV ({exc})") from None
    if not rows:
        raise ValueError(f"{path}: no data rows (empty, or a header only)")
    return rows


def _column(path: Path, row: dict[str, str], name: str, line: int) -> float:
    """Cell `name` of `row` (at `line` of `path`): a finite number >= 0 (counts, sizes, times)."""
    try:
        value = float(row[name])
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{path}:{line}: column {name!r} missing or not a number") from None
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{path}:{line}: column {name!r} is {row[name]!r}, not a number >= 0")
    return value


def _count(path: Path, row: dict[str, str], name: str, line: int, least: int = 1) -> int:
    """Cell `name`: a whole number in [`least`, `MAX_COUNT`] (tokens, requests, workers, bytes)."""
    value = _column(path, row, name, line)
    if not value.is_integer() or not least <= value <= MAX_COUNT:
        raise ValueError(
            f"{path}:{line}: column {name!r} is {row[name]!r}, not a whole number in "
            f"[{least}, 2^53]"
        )
    return int(value)


def _time(path: Path, row: dict[str, str], name: str, line: int) -> float:
    """A measured time (ms): > 0 (a kernel takes time; the attention fit in relative error
    divides by it)."""
    value = _column(path, row, name, line)
    if value == 0:
        raise ValueError(f"{path}:{line}: column {name!r} is 0; a measured time must be > 0")
    return value


def _isotonic(y: np.ndarray) -> np.ndarray:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for v in y:
        blocks.append([float(v), 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, n2 = blocks.pop()
            m1, n1 = blocks[-1]
            blocks[-1] = [(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2]
    return np.concatenate([np.full(int(n), m) for m, n in blocks])


def _check_jumps(
    path: Path, what: str, x: np.ndarray, y: np.ndarray, count: str = "num_tokens"
) -> None:
    """Refuse a series (counts `x` of column `count`, ascending; times `y`) whose time, from
    one point to the next, grows over `MAX_JUMP` times faster than its count or falls to under
    1/`MAX_JUMP`: one bad cell, which the non-decreasing fit would carry to the points after
    it (a high one lifts them all)."""
    if len(x) < 2:
        return
    with np.errstate(divide="ignore", invalid="ignore"):  # 0 ms times: inf, or nan if both
        change = y[1:] / y[:-1]
        jump = np.nan_to_num(np.maximum(change / (x[1:] / x[:-1]), 1 / change), nan=0.0)
    jump[np.abs(np.diff(y)) <= MIN_JUMP_MS] = 0.0
    i = int(np.argmax(jump))
    if jump[i] > MAX_JUMP:
        raise ValueError(
            f"{path}: {what} took {y[i]:g} ms at {count} {x[i]:.0f} and {y[i + 1]:g} ms "
            f"at {x[i + 1]:.0f}, a jump of over {MAX_JUMP:g}x (Vidur's tables: at most 4x); a "
            "bad cell on one of those rows?"
        )


def _thin(x: np.ndarray, y: np.ndarray) -> tuple[list[float], list[float]]:
    """The isotonic (non-decreasing) fit to the measured points, kept at knots on a
    geometric grid (and the last point)."""
    order = np.argsort(x)
    x, y = x[order], _isotonic(y[order])
    grid = [float(x[0])]
    while grid[-1] * GRID_RATIO < x[-1]:
        grid.append(grid[-1] * GRID_RATIO)
    picked = sorted({int(np.argmin(np.abs(x - g))) for g in grid} | {len(x) - 1})
    return [float(x[i]) for i in picked], [round(float(y[i]), 5) for i in picked]


SHAPE_COLUMNS = {
    "n_embd": "hidden",
    "n_expanded_embd": "intermediate",
    "n_head": "heads",
    "n_kv_head": "kv_heads",
}
"""A Vidur linear-layer table's columns of the model shape it was measured on, and the
`Architecture` fields they are (its ``vocab_size`` is padded: 32,768 for Llama-2's 32,000)."""


def table_shape(path: Path) -> dict[str, int]:
    """The model shape a Vidur linear-layer table was measured on (`Architecture` field ->
    value; empty if it names none); a table of two shapes is a ValueError."""
    shapes = {}
    for line, row in _rows(path):
        if not all(row.get(c) for c in SHAPE_COLUMNS):
            return {}
        shape = tuple(_count(path, row, c, line) for c in SHAPE_COLUMNS)
        shapes.setdefault(shape, line)
    if len(shapes) > 1:
        (a, line_a), (b, line_b) = list(shapes.items())[:2]
        raise ValueError(
            f"{path}: rows of two model shapes (line {line_a}: {a}, line {line_b}: {b}; "
            f"{', '.join(SHAPE_COLUMNS)})"
        )
    return dict(zip(SHAPE_COLUMNS.values(), next(iter(shapes)), strict=True))


def linear_tables(path: Path) -> dict[str, dict[str, list[float]]]:
    """Per TP degree: token knots, per-layer linear ops (ms), embedding (ms), gate/up (ms)."""
    by_tp: dict[int, dict[int, list[tuple[float, float, float]]]] = defaultdict(
        lambda: defaultdict(list)
    )
    lines: dict[tuple[int, int], list[int]] = defaultdict(list)
    for line, row in _rows(path):
        # each op > 0: a 0 is an op that was not timed, and would drop out of the step
        ops = [_time(path, row, f"time_stats.{op}.median", line) for op in LAYER_OPS]
        tp = _count(path, row, "num_tensor_parallel_workers", line)
        tokens = _count(path, row, "num_tokens", line)
        emb = _time(path, row, "time_stats.emb.median", line)
        up = _time(path, row, "time_stats.mlp_up_proj.median", line)
        layer = sum(ops)
        if layer == math.inf:
            raise ValueError(
                f"{path}:{line}: the layer's linear ops sum to {layer:g} ms; a measured time "
                "must be finite"
            )
        by_tp[tp][tokens].append((layer, emb, up))
        lines[tp, tokens].append(line)
    for (tp, tokens), at in lines.items():
        times = [point[0] for point in by_tp[tp][tokens]]
        low, high = int(np.argmin(times)), int(np.argmax(times))
        if times[high] > REPEAT_SPREAD * times[low]:
            raise ValueError(
                f"{path}: lines {at[low]} and {at[high]} both time {tokens:,}-token steps at TP "
                f"{tp}, {times[low]:.4g} and {times[high]:.4g} ms a layer "
                f"({times[high] / times[low]:.2f}x apart; Vidur's repeats agree within 6%): "
                "two profiling runs in one file?"
            )
    out = {}
    for tp, points in sorted(by_tp.items()):
        x = np.array(sorted(points))
        med = np.array([np.median(points[t], axis=0) for t in x])
        for i, op in enumerate(("the layer's linear ops", "emb", "mlp_up_proj")):
            _check_jumps(path, f"at TP {tp}, {op}", x, med[:, i])
        knots, layer = _thin(x, med[:, 0])
        _, emb = _thin(x, med[:, 1])
        _, up = _thin(x, med[:, 2])
        out[str(tp)] = {"tokens": knots, "layer_ms": layer, "emb_ms": emb, "up_proj_ms": up}
    return out


def _fit(
    columns: list[np.ndarray], t: np.ndarray, path: Path
) -> tuple[list[float], float, float]:
    """Least squares in relative error; coefficients, median and p90 |relative error|."""
    X = np.column_stack(columns)
    scaled = X / t[:, None]
    if not np.isfinite(scaled).all():  # LAPACK fails on them, or never returns
        raise ValueError(f"{path}: counts too large for their times to fit (a ratio overflows)")
    coef, _, rank, _ = np.linalg.lstsq(scaled, np.ones_like(t), rcond=None)
    if rank < X.shape[1]:  # lstsq's least-norm answer is one of many: no measurement
        raise ValueError(
            f"{path}: {len(t)} row(s) too alike to fit {X.shape[1]} coefficients (rank "
            f"{rank}): the table needs more distinct batch, chunk and context sizes"
        )
    rel = np.abs(X @ coef / t - 1)
    return coef.tolist(), float(np.median(rel)), float(np.percentile(rel, 90))


def attention_fit(path: Path) -> dict[str, object]:
    """The analytic FlashAttention cost fitted to the measured attention table's rows of
    `ATTENTION_ROWS`' shape and TP degree."""
    dec, pre = [], []
    reference = tuple(ATTENTION_ROWS.values())
    others: dict[tuple[int, ...], int] = defaultdict(int)
    for line, row in _rows(path):
        shape = tuple(_count(path, row, column, line) for column in ATTENTION_ROWS)
        if shape != reference:
            others[shape] += 1
            continue
        kv = _count(path, row, "kv_cache_size", line, least=0)
        if row.get("is_prefill") not in ("True", "False"):
            raise ValueError(
                f"{path}:{line}: column 'is_prefill' is {row.get('is_prefill')!r}, not True "
                "or False"
            )
        if row["is_prefill"] == "True":
            chunk = _count(path, row, "prefill_chunk_size", line)
            pre.append((chunk, kv, _time(path, row, "time_stats.attn_prefill.median", line)))
        else:
            batch = _count(path, row, "batch_size", line)
            dec.append((batch, kv, _time(path, row, "time_stats.attn_decode.median", line)))
    if not dec or not pre:

        def shape(values: Sequence[int]) -> str:
            return ", ".join(f"{k}={v}" for k, v in zip(ATTENTION_ROWS, values, strict=True))

        elsewhere = "; ".join(f"{n} of {shape(other)}" for other, n in others.items())
        raise ValueError(
            f"{path}: needs both decode and prefill rows of {shape(reference)}"
            + (f" (other rows: {elsewhere})" if others else "")
        )
    with np.errstate(over="ignore"):  # `_fit` names the file where a product overflows
        b, k, t = np.array(dec).T
        (d_base, d_kv), d_med, d_p90 = _fit([np.ones_like(b), b * k], t, path)
        c, k, t = np.array(pre).T
        (p_base, p_tok, p_pair), p_med, p_p90 = _fit([np.ones_like(c), c, c * (k + c)], t, path)
    fitted = {  # as a profile takes them (`measured_profile`: the two bases' mean)
        "base (decode's and prefill's mean)": (d_base + p_base) / 2,
        "decode per batch x context token": d_kv,
        "prefill per token": p_tok,
        "prefill per token pair": p_pair,
    }
    for name, value in fitted.items():
        if value < 0:
            raise ValueError(
                f"{path}: the fitted {name} time is {value:.3g} ms, below 0: the table's times "
                "fall where its sizes grow"
            )
    return {
        "reference": ATTENTION_SHAPE,
        "decode": {
            "base_ms": d_base,
            "kv_token_ms": d_kv,
            "points": len(dec),
            "median_rel_error": round(d_med, 4),
            "p90_rel_error": round(d_p90, 4),
        },
        "prefill": {
            "base_ms": p_base,
            "token_ms": p_tok,
            "pair_ms": p_pair,
            "points": len(pre),
            "median_rel_error": round(p_med, 4),
            "p90_rel_error": round(p_p90, 4),
        },
    }


def all_reduce_tables(path: Path) -> dict[str, dict[str, list[float]]]:
    """Per GPU count (all in one node): message bytes and milliseconds."""
    points: dict[int, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    for line, row in _rows(path):
        n = _count(path, row, "num_workers", line)
        if _count(path, row, "devices_per_node", line) != n:
            continue  # spans nodes
        size = _count(path, row, "size", line)
        points[n][size].append(_time(path, row, "time_stats.all_reduce.median", line))
    out = {}
    for n, by_size in sorted(points.items()):
        x = np.array(sorted(by_size))
        y = np.array([np.median(by_size[s]) for s in x])
        _check_jumps(path, f"the all-reduce of {n} GPUs", x, y, count="size")
        knots, ms = _thin(x, y)
        out[str(n)] = {"bytes": knots, "ms": ms}
    return out


def derive(
    vidur_dir: Path, models: Sequence[str] | None = None, network: str | None = None
) -> dict[str, object]:
    """All tables from a Vidur profiling directory. With `models` (``<gpu>/<org>/<name>``
    each) only their linear layers, where measured, and `network`'s all-reduce (None: none)
    are read: files of other models and GPUs cannot stop one profile's build."""
    vidur_dir = Path(vidur_dir)
    if not (vidur_dir / "compute").is_dir():
        raise ValueError(f"{vidur_dir}: not a Vidur profiling directory (no compute/)")
    if models is None:
        mlp = {"/".join(p.parts[-4:-1]): p for p in vidur_dir.glob("compute/*/*/*/mlp.csv")}
        nets = [p.parts[-2] for p in vidur_dir.glob("network/*_dgx/all_reduce.csv")]
    else:
        mlp = {model: vidur_dir / "compute" / model / "mlp.csv" for model in models}
        nets = [] if network is None else [f"{network}_dgx"]
    linear = {key: linear_tables(path) for key, path in sorted(mlp.items()) if path.is_file()}
    attention_path = next(
        (vidur_dir / name for name in ATTENTION_TABLES if (vidur_dir / name).is_file()), None
    )
    if attention_path is None:
        raise ValueError(
            f"{vidur_dir}: no attention table ({' or '.join(ATTENTION_TABLES)}): the measured "
            "attention of the 70B shape at TP 2 on the A100"
        )
    all_reduce = {}
    for name in sorted(nets):
        path = vidur_dir / "network" / name / "all_reduce.csv"
        if path.is_file():
            all_reduce[name.removesuffix("_dgx")] = all_reduce_tables(path)
    return {
        "source": (
            "derived by `python -m batchpilot.envs.profile_tables` from Vidur's operator "
            "profiles (github.com/microsoft/vidur, data/profiling, MIT licence)"
        ),
        "linear": linear,
        "attention": attention_fit(attention_path),
        "all_reduce": all_reduce,
    }


def load_tables(path: Path = DATA_PATH) -> dict:
    """The committed tables (or another derivation's JSON)."""
    return json.loads(Path(path).read_text())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m batchpilot.envs.profile_tables", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("vidur_dir", type=path_arg, help="Vidur profiling directory")
    parser.add_argument("--out", type=path_arg, default=DATA_PATH, help="default: %(default)s")
    args = parser.parse_args(argv)
    try:
        tables = derive(args.vidur_dir)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        replace_file(args.out, json.dumps(tables, separators=(",", ":")) + "\n")
    except (ValueError, OSError) as exc:  # bad input or --out: say what is wrong, no traceback
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    att = tables["attention"]
    print(
        f"wrote {args.out} ({args.out.stat().st_size / 1024:.0f} KiB): "
        f"{len(tables['linear'])} model/GPU linear tables, attention fit "
        f"(decode median error {att['decode']['median_rel_error']:.1%}, prefill "
        f"{att['prefill']['median_rel_error']:.1%}), all-reduce for "
        f"{', '.join(tables['all_reduce'])}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
