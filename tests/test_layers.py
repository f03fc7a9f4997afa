"""What a user who only simulates, or only serves an exported policy, imports."""

from __future__ import annotations

import subprocess
import sys


def test_simulating_and_loading_specs_import_neither_vllm_nor_torch() -> None:
    code = """
import sys
from batchpilot.agents.specs import make_controller
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import ControlInterval, run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload
import batchpilot.envs  # registers the Gymnasium env
import batchpilot.serving.config

workload = make_workload("fixed:64:16", arrival="all-at-once", num_requests=8)
out = run(workload, SimEngine(get_profile("llama-2-7b-a100")),
             make_controller("alg1+alg2"), ControlInterval.parse("4it"))
assert out.metrics()["completed"] == 8
print(sorted(m for m in ("vllm", "torch", "stable_baselines3") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
