"""Algorithm 1 (memory-aware): theta, the bounds, L0, the update rule and the clamps."""

from __future__ import annotations

import math
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
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


def test_first_buffer_is_taken_at_the_exact_bound() -> None:
    # b* = 51.909 (exact bound); L0 = 1.644854 * sqrt(51.909 * 1300) = 427.29
    c = controller()
    assert c.decide(make_telemetry(num_decoding=0, num_requests_waiting=0)).max_num_seqs == 51
    assert c.buffer == pytest.approx(427.29, abs=0.01)


@pytest.mark.parametrize("blocks", [1000, 120, 60])
def test_start_up_limit_is_the_bound_whatever_b_max(blocks: int) -> None:
    """A buffer taken at b_ref = B_max (1024) would exceed a small cache: limit 1."""
    c = MemoryAwareController(blocks=False)
    c.reset(SimpleNamespace(max_num_seqs=1024, max_num_batched_tokens=8192))
    t = make_telemetry(num_total_blocks=blocks, num_decoding=0)
    exact = exact_bound(blocks * 16, 300, math.sqrt(1300), safety_factor(0.05))
    assert c.decide(t).max_num_seqs == max(math.floor(exact), 1) > 1


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
    assert c.buffer == pytest.approx(427.29, abs=0.01)  # decisions 2 and 3 keep L0
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


def test_output_mean_counts_what_running_requests_generated() -> None:
    """Running requests count as censored observations once min_samples finished here."""
    c = controller(min_samples=20)
    steps = [(3000, 0), (3000, 10), (3000, 10)]  # (output tokens, finishes) per interval
    for tokens, done in steps[:2]:
        c.decide(make_telemetry(interval_output_tokens=tokens, interval_finished=done))
    assert c.output_moments(make_telemetry(num_output_samples=10)) == (256.0, 256.0**2)
    last = make_telemetry(interval_output_tokens=3000, interval_finished=10, output_mean=100.0)
    c.decide(last)
    mean, var = c.output_moments(last)
    cv2 = 900.0 / 100.0**2  # the finished requests' cv^2; 10 requests running
    assert mean == pytest.approx(9000 / (20 + 10 * (1 - cv2) / 2))
    assert var == pytest.approx(cv2 * mean**2)
    memoryless = make_telemetry(output_mean=100.0, output_var=1e4)
    assert c.output_moments(memoryless)[0] == pytest.approx(9000 / 20)  # tokens per finish


@pytest.mark.parametrize(
    ("source", "arrival"), [("embedded:sharegpt", "poisson:10"), ("embedded:gsm8k", "all-at-once")]
)
def test_output_estimate_is_not_biased_short_early_on(source: str, arrival: str) -> None:
    """After 20 finishes (7B/A100) the finished requests' mean is far below the true mean
    (short requests finish first); the estimate that counts running requests is near it."""
    workload = make_workload(source, arrival, num_requests=300, seed=0)
    true_mean = float(workload.output_tokens.mean())
    c = MemoryAwareController()
    seen = {}
    decide = c.decide

    def spy(t):
        limits = decide(t)
        if t.num_output_samples >= 20 and not seen:
            seen.update(finished=t.output_mean, ours=c.output_moments(t)[0])
        return limits

    c.decide = spy
    run(workload, SimEngine(get_profile("llama-7b-a100")), c, max_engine_s=120)
    assert seen["finished"] < 0.6 * true_mean
    assert abs(seen["ours"] - true_mean) < 0.2 * true_mean


def test_admits_up_to_its_own_bound_on_a_small_kv_cache() -> None:
    """ShareGPT lengths on a 7B with a 24k-token KV cache (1,500 blocks; B_max 1,024): from
    the first decision the limit is near the bound at the workload's true moments (a buffer
    taken at B_max held it at 1 for the first 100 decisions), and while requests wait the
    running requests fill it."""
    profile = replace(get_profile("llama-7b-a100"), num_gpu_blocks=1500)
    workload = make_workload("embedded:sharegpt", "poisson:2", num_requests=150, seed=0)
    prompt, output = workload.prompt_tokens, workload.output_tokens
    mu, sigma = prompt.mean() + output.mean() + 7.5, math.sqrt(prompt.var() + output.var())
    own = math.floor(exact_bound(profile.kv_capacity_tokens, mu, sigma, safety_factor(0.05)))
    tl = run(workload, SimEngine(profile), MemoryAwareController(), max_engine_s=120).timeline
    tl = tl.array()
    assert own >= 4 and tl["max_num_seqs"][:100].min() >= own - 1
    queued = tl["num_requests_waiting"] > 0
    full = tl["num_requests_running"][queued] >= tl["max_num_seqs"][queued]
    assert queued.sum() > 100 and full.mean() > 0.8
    assert abs(np.median(tl["max_num_seqs"][queued]) - own) <= 1
