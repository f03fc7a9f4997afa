"""Algorithm 2 (SLA-constrained search): each branch, the clamp, the bound invariants."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from telemetry_builder import make_telemetry

from batchpilot.baselines.alg2 import RecentMeans, SLAController, SLASearch
from batchpilot.baselines.specs import make_controller
from batchpilot.baselines.static import StaticController
from batchpilot.envs.controller import ControlInterval
from batchpilot.envs.metrics import DEFAULT_SLO, SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.workloads import make_workload

ENGINE = SimpleNamespace(max_num_seqs=100, max_num_batched_tokens=4096, slo=SLO())


def search() -> SLASearch:
    """D_SLA 50 ms, eps_D 10 ms, alpha 20, delta 5, B_min 1, B_max 100."""
    return SLASearch(0.050, 0.010, 20, 5, 1, 100)


def test_too_slow_pulls_the_upper_bound_down() -> None:
    s = search()
    assert s.update(0.070, 60) == 30  # b_high = max(60, 1 + 20), b_low = max(1 - 5, 1)
    assert (s.b_low, s.b_high) == (1, 60)
    assert s.update(0.070, 10) == 11  # b_high = max(10, 1 + 20) = 21
    assert (s.b_low, s.b_high) == (1, 21)


def test_headroom_pushes_the_lower_bound_up() -> None:
    s = search()
    assert s.update(0.020, 60) == 80  # b_low = min(60, 100 - 20), b_high = min(105, 100)
    assert (s.b_low, s.b_high) == (60, 100)
    assert s.update(0.020, 95) == 90  # b_low = min(95, 100 - 20) = 80
    assert (s.b_low, s.b_high) == (80, 100)


def test_inside_the_band_recentres_on_the_recent_batch() -> None:
    s = search()
    assert s.update(0.050, 60) == 60  # [60 - 10, 60 + 10]
    assert (s.b_low, s.b_high) == (50, 70)
    assert s.update(0.041, 95) == 92  # b_high capped at B_max: [85, 100] -> 92
    assert (s.b_low, s.b_high) == (85, 100)


def test_band_edges_count_as_inside() -> None:
    for tau in (0.040, 0.060):
        s = search()
        s.update(tau, 30)
        assert (s.b_low, s.b_high) == (20, 40)


def test_limit_never_below_running_decodes() -> None:
    c = SLAController()
    c.reset(ENGINE)
    slow = make_telemetry(recent_tbt_s=0.2, recent_decode_batch=60, num_decoding=90)
    assert c.decide(slow).max_num_seqs == 90


def test_b_max_defaults_to_the_engine_cap() -> None:
    c = SLAController()
    c.reset(ENGINE)
    assert (c.search.lo, c.search.hi) == (1, 100)
    c = SLAController(b_max=40, b_min=8)
    c.reset(ENGINE)
    assert (c.search.lo, c.search.hi) == (8, 40)


def test_chunk_search_sets_a_token_budget_at_least_the_limit() -> None:
    c = SLAController(chunk=True)
    c.reset(ENGINE)
    slow = make_telemetry(
        recent_tbt_s=0.2,
        interval_iterations=2,
        interval_prompt_tokens=3000,
        interval_output_tokens=40,
    )
    limits = c.decide(slow)  # tokens/step = 1520: c_high = max(1520, 256 + 512) = 1520
    assert limits.max_num_batched_tokens == (256 + 1520) // 2
    assert limits.max_num_batched_tokens >= limits.max_num_seqs


def test_bad_parameters_are_named() -> None:
    with pytest.raises(ValueError, match=r"eps_ms \(20\) must be below sla_ms \(10\)"):
        SLAController(sla_ms=10, eps_ms=20)
    with pytest.raises(ValueError, match="alpha"):
        SLAController(alpha=-1)
    with pytest.raises(ValueError, match="B_min"):
        SLAController(b_min=50, b_max=10)
    with pytest.raises(ValueError, match=r"sla_ms must be in \[0.001, 1e\+09\] ms, got 0"):
        SLAController(sla_ms=0)  # not the default target in disguise


@settings(max_examples=200, deadline=None)
@given(
    lo=st.integers(1, 50),
    span=st.integers(0, 300),
    alpha=st.integers(0, 400),
    delta=st.integers(0, 50),
    steps=st.lists(
        st.tuples(st.floats(0, 1.0), st.floats(0, 2000), st.integers(0, 2000)), max_size=40
    ),
)
def test_bounds_stay_ordered_inside_the_range(lo, span, alpha, delta, steps) -> None:
    hi = lo + span
    c = SLAController(alpha=alpha, delta=delta, b_min=lo, b_max=hi)
    c.reset(SimpleNamespace(max_num_seqs=10_000, max_num_batched_tokens=8192, slo=SLO()))
    for tau, batch, decoding in steps:
        t = make_telemetry(recent_tbt_s=tau, recent_decode_batch=batch, num_decoding=decoding)
        b = c.decide(t).max_num_seqs
        assert lo <= c.search.b_low <= c.search.b_high <= hi
        assert min(max(decoding, lo), hi) <= b <= hi


def test_settles_tbt_inside_the_band_on_a_steady_load() -> None:
    """7B/A100, 512/256 tokens at 15 req/s (over capacity): static:256 decodes at ~63 ms."""
    profile = get_profile("llama-7b-a100")
    workload = make_workload("fixed:512:256", "poisson:15", num_requests=800, seed=0)

    def steady_tbt_ms(controller) -> np.ndarray:
        tl = run(workload, SimEngine(profile), controller, ControlInterval(1)).timeline.array()
        end = tl["time_s"][-1]
        keep = (tl["time_s"] > 0.3 * end) & (tl["time_s"] < 0.8 * end)
        return tl["recent_tbt_s"][keep] * 1e3

    tbt = steady_tbt_ms(SLAController(sla_ms=50, eps_ms=10))
    in_band = np.mean((tbt >= 40) & (tbt <= 60))
    assert 40 <= np.median(tbt) <= 60 and in_band >= 0.6
    static = steady_tbt_ms(StaticController(256))
    assert np.median(static) > 60 and np.mean((static >= 40) & (static <= 60)) < 0.3


def test_d_sla_comes_from_the_runs_tpot_target_unless_given() -> None:
    c = SLAController()
    c.reset(SimpleNamespace(**vars(ENGINE) | dict(slo=SLO.parse("ttft:2000,tpot:100"))))
    assert c.sla_s == pytest.approx(0.100)
    c = SLAController(sla_ms=40)  # an explicit sla_ms wins
    c.reset(SimpleNamespace(**vars(ENGINE) | dict(slo=SLO.parse("tpot:100"))))
    assert c.sla_s == pytest.approx(0.040)
    c = SLAController()  # no TPOT target: the default SLO's
    c.reset(SimpleNamespace(**vars(ENGINE) | dict(slo=SLO.parse("ttft:2000"))))
    assert c.sla_s == pytest.approx(DEFAULT_SLO.tpot_ms / 1e3)
    with pytest.raises(ValueError, match=r"TPOT target \(8 ms\) must exceed eps_D \(10 ms\)"):
        SLAController().reset(SimpleNamespace(**vars(ENGINE) | dict(slo=SLO.parse("tpot:8"))))


def test_specs_and_combinations_read_the_simulators_slo() -> None:
    engine = SimEngine(get_profile("llama-7b-a100"), slo=SLO.parse("ttft:2000,tpot:100"))
    both = make_controller("alg1+alg2")
    both.reset(engine)
    assert both.parts[1].sla_s == pytest.approx(0.100)
    own = make_controller("alg2:sla_ms=30")
    own.reset(engine)
    assert own.sla_s == pytest.approx(0.030)


def test_recent_latency_is_a_time_window_not_one_interval() -> None:
    """Decode steps alternating 30 / 70 ms, one per control interval: each interval alone is
    outside the 40-60 ms band, their mean over the window is inside it."""

    def bounds(window_ms: float) -> tuple[int, int]:
        c = SLAController(window_ms=window_ms)
        c.reset(ENGINE)
        for i in range(40):
            tau = 0.030 if i % 2 else 0.070
            c.decide(make_telemetry(time_s=0.05 * i, recent_tbt_s=tau, recent_decode_batch=50))
        return c.search.b_low, c.search.b_high

    assert bounds(200) == (40, 60)  # re-centred on b_bar = 50 with alpha / 2 = 10
    assert bounds(0) != (40, 60)


def test_window_weights_intervals_by_iterations_and_forgets_old_ones() -> None:
    w = RecentMeans(1.0)
    assert w.add(0.0, 1, 10.0) == (10.0,)
    assert w.add(0.5, 3, 20.0) == (17.5,)
    assert w.add(1.2, 1, 30.0) == (pytest.approx(22.5),)  # the interval at 0.0 has left
    assert w.add(5.0, 2, 40.0) == (40.0,)  # only the latest is left


def test_settles_on_a_tpot_target_from_the_slo() -> None:
    """The steady load of the test above with a 30 ms TPOT target: TBT settles in 20-40 ms."""
    profile = get_profile("llama-7b-a100")
    workload = make_workload("fixed:512:256", "poisson:15", num_requests=800, seed=0)
    engine = SimEngine(profile, slo=SLO.parse("ttft:2000,tpot:30"))
    tl = run(workload, engine, SLAController(), ControlInterval(1)).timeline.array()
    end = tl["time_s"][-1]
    keep = (tl["time_s"] > 0.3 * end) & (tl["time_s"] < 0.8 * end)
    assert 20 <= np.median(tl["recent_tbt_s"][keep] * 1e3) <= 40


@pytest.mark.vllm
def test_serving_engine_view_carries_the_slo_to_alg2() -> None:
    """Inside vLLM a controller is reset with the scheduler's `EngineView`: `set_slo`
    (serve's --slo) must reach Algorithm 2 through it."""
    vllm_scheduler = pytest.importorskip("batchpilot.envs.vllm_scheduler")
    view = vllm_scheduler.EngineView(16, 1000, 2048, 64, 2048, SLO())
    sched = SimpleNamespace(tracker=SimpleNamespace(slo=SLO()), view=view)
    vllm_scheduler.TrackingScheduler.set_slo(sched, SLO.parse("ttft:2000,tpot:100"))
    c = SLAController()
    c.reset(sched.view)
    assert c.sla_s == pytest.approx(0.100) and sched.tracker.slo.tpot_ms == 100
