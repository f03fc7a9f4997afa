"""Algorithm 1 (memory-aware): theta, the bounds, L0, the update rule and the clamps."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from telemetry_builder import make_telemetry

from batchpilot.baselines.alg1 import (
    MemoryAwareController,
    exact_bound,
    linear_bound,
    safety_factor,
)
from batchpilot.baselines.static import StaticController
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload

# make_telemetry defaults: n = 1000 blocks x 16 = 16,000 tokens, E[l_in] = 100,
# Var(l_in) = 400, E[l_out] = 200, Var(l_out) = 900: mu = 300, sigma^2 = 1300.
ENGINE = SimpleNamespace(max_num_seqs=64, max_num_batched_tokens=8192)


def controller(**kw) -> MemoryAwareController:
    c = MemoryAwareController(**({"blocks": False} | kw))
    c.reset(ENGINE)
    return c


@pytest.mark.parametrize(("eps", "theta"), [(0.05, 1.644854), (0.01, 2.326348), (0.2, 0.841621)])
def test_theta_is_the_normal_quantile(eps: float, theta: float) -> None:
    assert safety_factor(eps) == pytest.approx(theta, abs=1e-6)


def test_exact_bound_solves_the_quadratic() -> None:
    theta, sigma, mu, n = safety_factor(0.05), math.sqrt(1300), 300.0, 16000.0
    b = exact_bound(n, mu, sigma, theta)
    assert b == pytest.approx(51.909, abs=1e-3)
    assert b * mu + theta * math.sqrt(b) * sigma == pytest.approx(n)
    assert exact_bound(0.0, mu, sigma, theta) == 0.0


def test_linear_bound_subtracts_the_buffer() -> None:
    assert linear_bound(16000, 300, 474.45) == pytest.approx(51.752, abs=1e-3)
    assert linear_bound(100, 300, 474.45) == 0.0


def test_first_decision_uses_buffer_at_b_max() -> None:
    # L0 = 1.644854 * sqrt(64 * 1300) = 474.45; (16000 - 474.45) / 300 = 51.75
    c = controller()
    assert c.decide(make_telemetry(num_decoding=0, num_requests_waiting=0)).max_num_seqs == 51
    assert c.buffer == pytest.approx(474.45, abs=0.01)


def test_exact_option_and_block_rounding() -> None:
    assert controller(bound="exact").decide(make_telemetry()).max_num_seqs == 51
    # blocks: mu = 300 + (16 - 1) / 2 = 307.5 -> (16000 - 474.45) / 307.5 = 50.49
    assert controller(blocks=True).decide(make_telemetry()).max_num_seqs == 50


def test_updates_only_when_prefills_wait_and_decodes_run() -> None:
    c = controller()
    assert c.decide(make_telemetry()).max_num_seqs == 51
    longer = {"prompt_mean": 400.0}  # mu = 600: bound (16000 - 474.45) / 600 = 25.9
    assert (
        c.decide(make_telemetry(num_requests_waiting=0, num_decoding=5, **longer)).max_num_seqs
        == 51
    )
    assert (
        c.decide(make_telemetry(num_requests_waiting=9, num_decoding=0, **longer)).max_num_seqs
        == 51
    )
    assert (
        c.decide(make_telemetry(num_requests_waiting=9, num_decoding=5, **longer)).max_num_seqs
        == 25
    )


def test_clamps_to_running_decodes_and_bounds() -> None:
    assert controller().decide(make_telemetry(num_decoding=60)).max_num_seqs == 60
    assert controller().decide(make_telemetry(num_decoding=100)).max_num_seqs == 64  # B_max
    assert controller(b_max=30).decide(make_telemetry()).max_num_seqs == 30
    tiny = make_telemetry(num_total_blocks=2, num_free_blocks=1, num_decoding=0)
    assert controller(b_min=4).decide(tiny).max_num_seqs == 4


def test_prior_until_min_samples() -> None:
    # prior l_out 256 +/- 256: mu = 356, sigma^2 = 400 + 65536; exact bound
    expected = math.floor(exact_bound(16000, 356, math.sqrt(65936), safety_factor(0.05)))
    few = make_telemetry(num_output_samples=19)
    assert controller(bound="exact").decide(few).max_num_seqs == expected == 37
    enough = make_telemetry(num_output_samples=20)
    assert controller(bound="exact").decide(enough).max_num_seqs == 51


def test_buffer_refreshes_every_refresh_decisions() -> None:
    c = controller(refresh=3)
    c.decide(make_telemetry())
    noisy = make_telemetry(output_var=90000.0)
    c.decide(noisy)
    c.decide(noisy)
    assert c.buffer == pytest.approx(474.45, abs=0.01)  # decisions 2 and 3 keep L0
    c.decide(noisy)  # decision 4 refreshes at b_ref = 51
    assert c.buffer == pytest.approx(safety_factor(0.05) * math.sqrt(51 * 90400), abs=0.01)


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match="eps"):
        MemoryAwareController(eps=0.7)
    with pytest.raises(ValueError, match="bound"):
        MemoryAwareController(bound="quadratic")


def test_keeps_preemptions_near_zero_where_a_large_static_cap_thrashes() -> None:
    """Azure conversation lengths on a 7B/A100: ~90 requests fit in the KV cache."""
    profile = get_profile("llama-7b-a100")
    workload = make_workload("embedded:azure-conv", "all-at-once", num_requests=400, seed=0)
    static = run(workload, SimEngine(profile), StaticController(256)).metrics()
    alg1 = run(workload, SimEngine(profile), MemoryAwareController()).metrics()
    assert static["num_preemptions"] >= 30 and static["recomputed_tokens"] >= 40_000
    assert alg1["num_preemptions"] <= static["num_preemptions"] / 5
    assert alg1["recomputed_tokens"] <= static["recomputed_tokens"] / 5
    assert alg1["output_throughput"] > static["output_throughput"]
