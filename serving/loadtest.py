"""A bounded load test on a running OpenAI-compatible server: concurrent streaming clients
for a fixed time, then the server's ``/metrics`` (vLLM's and batchpilot's).

    python -m batchpilot.serving.loadtest --url http://127.0.0.1:8000 --clients 8 --seconds 30
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.request
from dataclasses import dataclass, field

import numpy as np


@dataclass
class LoadResult:
    """What the clients saw, and the server's metrics afterwards."""

    requests_ok: int = 0
    requests_failed: int = 0
    output_tokens: int = 0
    seconds: float = 0.0
    ttft_s: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)

    def summary(self) -> dict[str, float | int | list[str]]:
        ttft = np.asarray(self.ttft_s) * 1e3
        return {
            "requests_ok": self.requests_ok,
            "requests_failed": self.requests_failed,
            "output_tokens_per_s": self.output_tokens / self.seconds if self.seconds else 0.0,
            "median_ttft_ms": float(np.median(ttft)) if ttft.size else float("nan"),
            "p99_ttft_ms": float(np.percentile(ttft, 99)) if ttft.size else float("nan"),
            "errors": self.errors[:5],
        } | self.metrics


def stream_once(url: str, model: str, prompt: list[int], max_tokens: int) -> tuple[float, int]:
    """One streaming completion; (time to first token, tokens received)."""
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)
    start = time.perf_counter()
    first, chunks = -1.0, 0
    stream = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=max_tokens,
        stream=True,
        extra_body={"ignore_eos": True},
    )
    for _ in stream:
        if first < 0:
            first = time.perf_counter() - start
        chunks += 1
    return first, chunks


def scrape(url: str, prefixes: tuple[str, ...] = ("vllm:", "batchpilot:")) -> dict[str, float]:
    """Unlabelled sums of the server's Prometheus samples whose names start with `prefixes`."""
    text = urllib.request.urlopen(f"{url}/metrics", timeout=10).read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(prefixes):
            name, _, value = line.rpartition(" ")
            key = name.split("{")[0]
            out[key] = out.get(key, 0.0) + float(value)
    return out


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
                    result.ttft_s.append(ttft)
            except Exception as exc:  # count every failure, keep loading
                with lock:
                    result.requests_failed += 1
                    result.errors.append(f"{type(exc).__name__}: {exc}")

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    result.seconds = time.perf_counter() - start
    result.metrics = scrape(url)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", help="served model name (default: the server's first)")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--prompt-tokens", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=32)
    args = parser.parse_args()
    model = (
        args.model or json.load(urllib.request.urlopen(f"{args.url}/v1/models"))["data"][0]["id"]
    )
    result = run_load(
        args.url,
        model,
        clients=args.clients,
        seconds=args.seconds,
        prompt_tokens=args.prompt_tokens,
        max_tokens=args.max_tokens,
    )
    print(json.dumps(result.summary(), indent=2))


if __name__ == "__main__":
    main()
