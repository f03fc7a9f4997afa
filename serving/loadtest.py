"""A bounded load test on a running OpenAI-compatible server: concurrent streaming clients
for a fixed time, then the server's ``/metrics`` (vLLM's and batchpilot's).

    python -m batchpilot.serving.loadtest --url http://127.0.0.1:8000 --clients 8 --seconds 30

Prints a short table (what the clients saw, the server's key metrics, histograms as their
means) and writes every number to a JSON file (``--out``; histograms as count and sum).
Memory stays bounded however long it runs: TTFTs go into a streaming quantile sketch.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from batchpilot.envs.input_files import path_arg
from batchpilot.envs.metrics import LatencySketch
from batchpilot.envs.output_files import replace_file
from batchpilot.envs.plain_numbers import plain_float, plain_int


@dataclass
class LoadResult:
    """What the clients saw, and the server's metrics afterwards."""

    requests_ok: int = 0
    requests_failed: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    ttft_s: LatencySketch = field(default_factory=LatencySketch)
    """Time to first token of each request that succeeded, s."""
    errors: list[str] = field(default_factory=list)
    """The first `KEPT_ERRORS` failures (all are counted in `requests_failed`)."""
    metrics: dict[str, float] = field(default_factory=dict)
    metrics_error: str = ""
    """Why the server's metrics could not be read after the run, if they could not."""

    def summary(self) -> dict[str, float | int | str | list[str] | None]:
        """Every number, JSON-ready (a TTFT quantile of no request, and a server's metric that
        is not finite, is null)."""
        median = p99 = None
        if self.ttft_s.n:
            median, p99 = (v * 1e3 for v in self.ttft_s.percentiles([50, 99]))
        return {
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "output_tokens_per_s": self.output_tokens / self.seconds if self.seconds else 0.0,
            "median_ttft_ms": median,
            "p99_ttft_ms": p99,
            "errors": self.errors,
            "metrics_error": self.metrics_error,
        } | {k: (v if math.isfinite(v) else None) for k, v in self.metrics.items()}


KEPT_ERRORS = 5
"""Failures a `LoadResult` keeps the text of: a server that is down fails every request."""


def stream_once(url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """One streaming completion; (time to first token, output tokens as the server's usage
    counts them, or the chunks with a choice where it sends none). A `RuntimeError` for a
    stream that ends before its first token."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    start = time.perf_counter()
    first, chunks, tokens = -1.0, 0, None
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    for chunk in stream:
        if chunk.choices:
            if first < 0:
                first = time.perf_counter() - start
            chunks += 1
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    if first < 0:
        raise RuntimeError("the stream ended before its first token")
    if not (isinstance(tokens, int) and 0 < tokens <= max_tokens):  # none, or not believable
        tokens = chunks
    return first, tokens


def scrape(url: str, prefixes: tuple[str, ...] = ("vllm:", "batchpilot:")) -> dict[str, float]:
    """The server's Prometheus samples whose names start with `prefixes`.

    Counters and gauges by sample name (a series per label set is kept apart as
    ``name{k="v",...}`` when there are several); histograms as ``_count`` and ``_sum`` summed
    over label sets (buckets and quantiles dropped).
    """
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    series: dict[str, list[tuple[str, float]]] = {}
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(prefixes):
            continue
        for sample in family.samples:
            if sample.name.endswith(("_bucket", "_created", "_gcount", "_gsum")):
                continue
            if "quantile" in sample.labels:
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            series.setdefault(sample.name, []).append((labels, float(sample.value)))
    out: dict[str, float] = {}
    for name, values in series.items():
        if len(values) == 1 or name.endswith(("_count", "_sum")):
            out[name] = sum(v for _, v in values)
        else:
            out.update({f"{name}{{{labels}}}": v for labels, v in values})
    return out


def table(result: LoadResult) -> str:
    """A short plain-text table of `result`: client view first, then the server's."""
    s, m = result.summary(), result.metrics

    def mean_ms(name: str, per_second: float = 1e3) -> str:
        """The histogram's mean in ms (or another unit: `per_second` of it a second)."""
        n, total = m.get(f"{name}_count", 0.0), m.get(f"{name}_sum")
        return f"{total / n * per_second:.1f}" if n and total is not None else "-"

    rows = [
        ("requests ok / failed", f"{s['requests_ok']} / {s['requests_failed']}"),
        ("output tokens/s (clients)", f"{s['output_tokens_per_s']:.1f}"),
        (
            "TTFT median / p99 (ms)",
            " / ".join(_ms(s[k]) for k in ("median_ttft_ms", "p99_ttft_ms")),
        ),
        (
            "vllm: mean TTFT / ITL / e2e (ms)",
            " / ".join(
                mean_ms(f"vllm:{n}")
                for n in (
                    "time_to_first_token_seconds",
                    "inter_token_latency_seconds",
                    "e2e_request_latency_seconds",
                )
            ),
        ),
        ("vllm:num_preemptions", _count(m, "vllm:num_preemptions_total")),
        (
            "batchpilot:max_num_seqs (now)",
            ", ".join(f"{v:g}" for k, v in m.items() if k.startswith("batchpilot:max_num_seqs"))
            or "-",
        ),
        (
            "batchpilot: decisions, mean (us)",  # tens of us: 0.0 in ms
            (
                f"{_count(m, 'batchpilot:decision_time_seconds_count')}, "
                f"{mean_ms('batchpilot:decision_time_seconds', 1e6)}"
            ),
        ),
        (
            "batchpilot:controller_fallbacks",
            _count(m, "batchpilot:controller_fallbacks_total"),
        ),
    ]
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    lines += [f"error: {e}" for e in result.errors]
    if result.metrics_error:
        lines.append(f"the server's metrics: {result.metrics_error}")
    return "\n".join(lines)


def _count(metrics: dict[str, float], name: str) -> str:
    """A counter the server exported (summed over its label sets, which `scrape` keeps
    apart), or "-" where it did not (metrics not read, or a plain vLLM server without
    batchpilot's)."""
    values = [v for k, v in metrics.items() if k == name or k.startswith(f"{name}{{")]
    return f"{sum(values):g}" if values else "-"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def run_load(
    url: str,
    model: str,
    *,
    clients: int,
    seconds: float,
    prompt_tokens: int = 64,
    max_tokens: int = 32,
) -> LoadResult:
    """`clients` threads each streaming requests back to back until `seconds` have passed."""
    result = LoadResult()
    lock = threading.Lock()
    deadline = time.perf_counter() + seconds

    def client(i: int) -> None:
        prompt = [(i * 31 + k) % 1000 + 1 for k in range(prompt_tokens)]
        while time.perf_counter() < deadline:
            try:
                ttft, n = stream_once(url, model, prompt, max_tokens)
                with lock:
                    result.requests_ok += 1
                    result.output_tokens += n
                    result.ttft_s.add(ttft)
            except Exception as exc:  # count every failure, keep loading
                with lock:
                    result.requests_failed += 1
                    if len(result.errors) < KEPT_ERRORS:
                        result.errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - start
    try:
        result.metrics = scrape(url)
    except (OSError, ValueError) as exc:  # the clients' counts stand without them
        result.metrics_error = f"{type(exc).__name__}: {exc}"
    return result


def bounded(kind: type, low: float, high: float) -> Callable[[str], int | float]:
    """An argparse type: a `kind` (int or float) number in [low, high], written plainly
    (`batchpilot.envs.plain_numbers`), else a usage error naming it."""
    read = plain_int if kind is int else plain_float

    def parse(text: str) -> int | float:
        try:
            value = read(text)
        except ValueError:
            value = None
        if value is None or not low <= value <= high:
            what = (
                f"whole number in [{low}, {high}]"
                if kind is int
                else f"number in [{low:g}, {high:g}]"
            )
            raise argparse.ArgumentTypeError(f"{text[:40]!r} is not a {what}")
        return value

    return parse


def writable(text: str) -> Path:
    """An argparse type: a file path whose directory exists and that is not a directory
    (checked before a run that may last hours, whose numbers it holds)."""
    path = path_arg(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: is a directory; name a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: its directory {path.parent} does not exist")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: not writable here")
    return path


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--url",
        default="http://127.0.0.1:8000",
        help="the server's base URL (it serves /v1 and /metrics). Default: %(default)s",
    )
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument(
        "--clients",
        type=bounded(int, 1, 1024),
        default=8,
        help="concurrent streaming clients, each sending its next request when the last one "
        "ends. Default: %(default)s",
    )
    parser.add_argument(
        "--seconds",
        type=bounded(float, 0.001, 86_400),
        default=30.0,
        help="how long the clients keep sending (requests in flight then finish). "
        "Default: %(default)s",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=bounded(int, 1, 2**20),
        default=64,
        help="prompt length in token ids (sent as ids: no tokenizer needed). Default: %(default)s",
    )
    parser.add_argument(
        "--max-tokens",
        type=bounded(int, 1, 2**20),
        default=32,
        help="output tokens per request (ignore_eos: each request makes all of them). "
        "Default: %(default)s",
    )
    parser.add_argument(
        "--out",
        type=writable,
        default="loadtest.json",
        help="JSON file for every number (checked before the run). Default: %(default)s",
    )
    args = parser.parse_args()
    try:  # the server is there before the run, with or without --model
        served = json.load(urllib.request.urlopen(f"{args.url}/v1/models", timeout=10))
        ids = [entry["id"] for entry in served["data"]]
        if not all(isinstance(i, str) for i in ids):
            raise TypeError(f"model ids {ids!r} are not all strings")
        model = args.model or ids[0]
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        parser.error(f"--url {args.url}: no served model to read ({type(exc).__name__}: {exc})")
    if model not in ids:
        parser.error(f"--model {model}: not served at {args.url} (it serves {', '.join(ids)})")
    result = run_load(
        args.url,
        model,
        clients=args.clients,
        seconds=args.seconds,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
    )
    try:  # first: the numbers outlive a table a server's odd answer breaks
        replace_file(args.out, json.dumps(result.summary(), indent=2, allow_nan=False) + "\n")
    except OSError as exc:
        print(table(result))
        parser.exit(1, f"--out {args.out}: cannot write it ({exc}); the table holds the numbers\n")
    print(table(result))
    print(f"all numbers: {args.out}")
    if not result.requests_ok:
        parser.exit(1, f"no request succeeded ({result.requests_failed:,} failed)\n")


if __name__ == "__main__":
    main()
