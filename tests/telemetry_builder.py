"""`make_telemetry(**fields)`: a valid `Telemetry` with neutral defaults, for controller tests."""

from __future__ import annotations

from typing import Any

from batchpilot.envs.telemetry import Telemetry

DEFAULTS: dict[str, Any] = {
    "time_s": 1.0,
    "iteration": 10,
    "kv_cache_usage": 0.5,
    "num_free_blocks": 500,
    "num_total_blocks": 1000,
    "block_size": 16,
    "num_requests_running": 10,
    "num_requests_waiting": 5,
    "num_decoding": 10,
    "step_prefill_tokens": 0,
    "step_decode_tokens": 10,
    "step_time_s": 0.05,
    "interval_iterations": 1,
    "interval_s": 0.05,
    "interval_preemptions": 0,
    "interval_prompt_tokens": 0,
    "interval_output_tokens": 10,
    "interval_finished": 0,
    "interval_good_output_tokens": 0,
    "interval_kv_usage_mean": 0.5,
    "recent_tbt_s": 0.05,
    "recent_decode_batch": 10.0,
    "recent_ttft_s": 0.2,
    "max_num_seqs": 256,
    "max_num_batched_tokens": 8192,
    "prompt_mean": 100.0,
    "prompt_var": 400.0,
    "output_mean": 200.0,
    "output_var": 900.0,
    "num_output_samples": 100,
    "arrival_rate": 1.0,
}


def make_telemetry(**fields: Any) -> Telemetry:
    """Telemetry with `DEFAULTS` overridden by `fields` (validated)."""
    return Telemetry(**(DEFAULTS | fields)).validate()
