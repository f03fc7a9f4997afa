"""Workloads, engines (simulated and vLLM), telemetry, and the Gymnasium environment.

Importing this package registers ``batchpilot/Batching-v0``.
"""

from gymnasium.envs.registration import register, registry

ENV_ID = "batchpilot/Batching-v0"

if ENV_ID not in registry:
    register(
        id=ENV_ID,
        entry_point="batchpilot.envs.batching_env:BatchingEnv",  # no step cap: an episode
        # ends with its workload, however long a step (`control_interval_s`) is
    )

__all__ = ["ENV_ID"]
