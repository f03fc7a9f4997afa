"""Step times of every shipped measured GPU profile beside the linear roofline's for the same
model, GPU and TP (`roofline_profile`, the model the measured ones replace):

- decode: one pure-decode step of B requests at context 512, B = 1, 8, 32, 64, 128 (ms);
- prefill: one request's whole prompt of P tokens in one step, P = 128 ... 8,192 (ms;
  past a model's context or the 4,096-token Vidur tables it is extrapolated: marked *).

With --simulate, also runs `batchpilot simulate` for Llama-2-70B on 2, 4 and 8 x A100:
B requests of 512/128 tokens at t=0 under static:B (median TPOT) and one request of P
tokens (TTFT), the checks the issue names.

    python tests/benchmarks/profile_table.py [--simulate]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from batchpilot.envs.profiles import (
    ARCHITECTURES,
    GIB,
    GPUS,
    PROFILES,
    SHIPPED_MEASURED,
    Hardware,
    ModelShape,
    roofline_profile,
)
from batchpilot.training.cli import main as cli

BATCHES = (1, 8, 32, 64, 128)
PROMPTS = (128, 256, 512, 1024, 2048, 4096, 8192)


def roofline_for(spec: dict) -> object:
    arch, gpu = ARCHITECTURES[spec["model"]], GPUS[spec["gpu"]]
    params = arch.weight_bytes_per_gpu(1) / arch.dtype_bytes
    shape = ModelShape(
        arch.title, params, arch.layers, arch.kv_heads, arch.head_dim, arch.max_model_len
    )
    memory = spec.get("gpu_memory_gib", gpu.memory_gib) * GIB
    return roofline_profile(shape, Hardware(gpu.title, memory, gpu.bandwidth, gpu.flops), spec["tp"])


def step_table() -> None:
    head = "".join(f"{f'B={b}':>14}" for b in BATCHES)
    print(f"decode step, context 512 (ms): measured / roofline\n{'profile':<22}{head}")
    for name, spec in SHIPPED_MEASURED.items():
        step, line = PROFILES[name].step, roofline_for(spec).step
        cells = "".join(
            f"{step.decode_time(b, 512 * b) * 1e3:>7.1f} /{line.decode_time(b, 512 * b) * 1e3:>5.1f}"
            for b in BATCHES
        )
        print(f"{name:<22}{cells}")
    head = "".join(f"{f'P={p}':>16}" for p in PROMPTS)
    print(f"\nprefill of one P-token prompt in one step (ms): measured / roofline\n{'profile':<22}{head}")
    for name, spec in SHIPPED_MEASURED.items():
        profile, line = PROFILES[name], roofline_for(spec).step
        table_max = profile.step.token_knots[-1]
        cells = ""
        for p in PROMPTS:
            mark = "*" if p > min(profile.max_model_len, table_max) else " "
            cells += f"{profile.step.prefill_time(p) * 1e3:>8.1f}{mark}/{line.prefill_time(p) * 1e3:>6.1f}"
        print(f"{name:<22}{cells}")


def _simulate(profile: str, trace: str, n: int, controller: str, out: Path) -> dict:
    argv = [
        "simulate", "--profile", profile, "--workload", f"{trace}@all-at-once",
        "--num-requests", str(n), "--controller", controller, "--json", str(out),
        "--no-progress",
    ]
    import contextlib
    import io

    with contextlib.redirect_stdout(io.StringIO()):
        if cli(argv) != 0:
            raise SystemExit(f"batchpilot {' '.join(argv)} failed")
    return json.loads(out.read_text())["metrics"]


def simulate_checks() -> None:
    names = ("llama-2-70b-a100x2", "llama-2-70b-a100x4", "llama-2-70b-a100x8")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "m.json"
        print("\nbatchpilot simulate, B requests of 512/128 tokens at t=0, static:B: median TPOT (ms)")
        print(f"{'profile':<22}" + "".join(f"{f'B={b}':>10}" for b in (1, 8, 16, 32, 64)))
        for name in names:
            cells = ""
            for b in (1, 8, 16, 32, 64):
                m = _simulate(name, "fixed:512:128", b, f"static:{b}", out)
                cells += f"{m['p50_tpot_ms']:>10.1f}"
            print(f"{name:<22}{cells}")
        prompts = (128, 512, 1024, 2048, 4000)
        print("\nbatchpilot simulate, one request of P prompt tokens (1 output): TTFT (ms)")
        print(f"{'profile':<22}" + "".join(f"{f'P={p}':>10}" for p in prompts))
        for name in names:
            cells = ""
            for p in prompts:
                m = _simulate(name, f"fixed:{p}:1", 1, "static:1", out)
                cells += f"{m['p50_ttft_ms']:>10.1f}"
            print(f"{name:<22}{cells}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--simulate", action="store_true", help="also the simulate checks")
    args = parser.parse_args()
    step_table()
    if args.simulate:
        simulate_checks()


if __name__ == "__main__":
    main()
