"""Embedded workloads: compact length tables derived from the shared public traces.

`data/embedded_workloads.json` holds, per trace, 201 quantiles of prompt and output
lengths, their Spearman rank correlation, and (for traces with timestamps) the mean
arrival rate and inter-arrival CV. Sampling uses the quantiles as an inverse CDF and a
Gaussian copula for the correlation. Regenerate the file from the traces with::

    python -m batchpilot.envs.embedded ../shared/traces
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from math import erf, pi, sin, sqrt
from pathlib import Path

import numpy as np

from batchpilot.envs.arrivals import ArrivalSpecError
from batchpilot.envs.input_files import path_arg
from batchpilot.envs.output_files import replace_file

EMBEDDED_PREFIX = "embedded:"
NUM_QUANTILES = 201
SOURCES = {
    "azure-conv": "azure2023/AzureLLMInferenceTrace_conv.csv",
    "azure-code": "azure2023/AzureLLMInferenceTrace_code.csv",
    "sharegpt": "sharegpt/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
    "gsm8k": "gsm8k/gsm8k_test_token_lengths.csv",
}


@dataclass(frozen=True)
class LengthTable:
    """Quantile tables of prompt and output lengths, and arrival statistics."""

    name: str
    prompt_quantiles: np.ndarray
    output_quantiles: np.ndarray
    spearman: float
    rate: float | None
    cv: float | None

    def sample(self, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """Draw `n` (prompt, output) length pairs."""
        rho = 2.0 * sin(pi * self.spearman / 6.0)  # Spearman -> Pearson for a Gaussian copula
        z = rng.standard_normal((n, 2))
        z[:, 1] = rho * z[:, 0] + sqrt(max(0.0, 1.0 - rho * rho)) * z[:, 1]
        u = 0.5 * (1.0 + np.vectorize(erf)(z / sqrt(2.0)))
        grid = np.linspace(0.0, 1.0, len(self.prompt_quantiles))
        prompt = np.interp(u[:, 0], grid, self.prompt_quantiles)
        output = np.interp(u[:, 1], grid, self.output_quantiles)
        return (
            np.maximum(1, np.rint(prompt)).astype(np.int64),
            np.maximum(1, np.rint(output)).astype(np.int64),
        )

    @property
    def arrival(self) -> tuple[float, float]:
        """(rate, CV) of the trace's arrivals; raises for a length-only trace."""
        if self.rate is None or self.cv is None:
            raise ArrivalSpecError(
                f"embedded:{self.name} has no timestamps to {NO_REPLAY}"
            )
        return self.rate, self.cv


NO_REPLAY = (
    "replay (replay is also the arrival where none is given); use poisson:RATE or gamma:RATE:CV"
)
"""How a message goes on where a source has no timestamps to replay."""


@cache
def _tables() -> dict[str, dict]:
    text = resources.files("batchpilot.envs").joinpath("data/embedded_workloads.json").read_text()
    return json.loads(text)["workloads"]


def embedded_names() -> list[str]:
    """Names usable as ``embedded:NAME``."""
    return sorted(_tables())


def embedded_lengths(name: str) -> LengthTable:
    """The length table called `name`."""
    tables = _tables()
    if name not in tables:
        raise ValueError(f"unknown embedded workload {name!r}; known: {', '.join(sorted(tables))}")
    t = tables[name]
    return LengthTable(
        name=name,
        prompt_quantiles=np.asarray(t["prompt_quantiles"], dtype=np.float64),
        output_quantiles=np.asarray(t["output_quantiles"], dtype=np.float64),
        spearman=float(t["spearman"]),
        rate=t.get("rate"),
        cv=t.get("cv"),
    )


def derive(traces_dir: Path) -> dict:
    """Compute the embedded tables from the shared traces folder."""
    from batchpilot.envs.traces import load_trace

    grid = np.linspace(0.0, 1.0, NUM_QUANTILES)
    out: dict[str, dict] = {}
    for name, rel in SOURCES.items():
        if not (traces_dir / rel).is_file():  # load_trace's hint is for a workload's source
            raise ValueError(
                f"{traces_dir / rel}: no such file; TRACES_DIR is the shared traces folder, "
                f"holding {', '.join(sorted(SOURCES.values()))}"
            )
        trace = load_trace(traces_dir / rel)
        p, o = trace.prompt_tokens, trace.output_tokens
        rank_p = np.argsort(np.argsort(p, kind="stable"), kind="stable")
        rank_o = np.argsort(np.argsort(o, kind="stable"), kind="stable")
        entry: dict = {
            "source": rel,
            "requests": len(trace),
            "prompt_quantiles": np.quantile(p, grid).round(1).tolist(),
            "output_quantiles": np.quantile(o, grid).round(1).tolist(),
            "spearman": round(float(np.corrcoef(rank_p, rank_o)[0, 1]), 4),
        }
        if trace.arrival_s is not None:
            gaps = np.diff(trace.arrival_s)
            entry["rate"] = round(float(len(gaps) / trace.arrival_s[-1]), 4)
            entry["cv"] = round(float(gaps.std() / gaps.mean()), 4)
        out[name] = entry
    return {"derived_by": "python -m batchpilot.envs.embedded TRACES_DIR", "workloads": out}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("traces_dir", type=path_arg, help="the shared traces folder")
    parser.add_argument(
        "--out",
        type=path_arg,
        default=Path(__file__).parent / "data" / "embedded_workloads.json",
        help="where to write the tables (default: the JSON batchpilot ships)",
    )
    args = parser.parse_args()
    try:
        tables = derive(args.traces_dir)
        replace_file(args.out, json.dumps(tables, indent=1) + "\n")
    except (OSError, ValueError) as exc:  # a missing or bad trace (TraceError), --out
        parser.error(str(exc))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
