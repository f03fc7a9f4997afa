"""Peak memory of `batchpilot simulate` by run length: 10k, 100k and 1M requests.

Each size runs in its own process (by default the embedded Azure conversation workload
replayed at its own rate, static:256 on llama-7b-a100, `simulate`'s defaults); the table
shows that process's peak RSS (``wait4``'s ``ru_maxrss``), its wall time and the run's
p99 ITL and TTFT, so memory can be read beside the numbers it bought.

    python tests/benchmarks/memory.py [--sizes 10000 100000 1000000] [--interval 1s]
    python tests/benchmarks/memory.py --workload fixed:128:128@all-at-once --interval 10s
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def measure(n: int, workload: str, interval: str) -> tuple[float, float, dict[str, float]]:
    """(peak RSS in MB, wall seconds, metrics) of one `simulate` run of `n` requests."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        cmd = [
            sys.executable,
            "-m",
            "batchpilot.training.cli",
            "simulate",
            "--workload",
            workload,
            "--num-requests",
            str(n),
            "--interval",
            interval,
            "--no-progress",
            "--json",
            str(out),
        ]
        start = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        if os.waitstatus_to_exitcode(status) != 0:
            raise SystemExit(f"{' '.join(cmd)} failed")
        metrics = json.loads(out.read_text())["metrics"]
    return usage.ru_maxrss / 1024, wall, metrics  # ru_maxrss is in KiB on Linux


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument(
        "--workload", default="embedded:azure-conv@replay", help="SOURCE@ARRIVAL. Default: %(default)s"
    )
    parser.add_argument(
        "--interval",
        default="1it",
        help="control interval (1it: simulate's default, one decision per iteration; 1s "
        "lets the simulator advance decode runs in closed form, ~10x faster). Default: 1it",
    )
    args = parser.parse_args()
    print(f"{'requests':>10}{'peak RSS MB':>13}{'wall s':>9}{'p99 ITL ms':>12}{'p99 TTFT ms':>13}")
    for n in args.sizes:
        rss, wall, m = measure(n, args.workload, args.interval)
        print(f"{n:>10,}{rss:>13,.0f}{wall:>9.1f}{m['p99_itl_ms']:>12.2f}{m['p99_ttft_ms']:>13.1f}")


if __name__ == "__main__":
    main()
