"""SimEngine.fork and the lookahead oracle `mpc`."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import unit_profile

from batchpilot.baselines.mpc import on_pace, recoverable_step_s
from batchpilot.baselines.specs import ControllerSpecError, make_controller, simulator_only
from batchpilot.baselines.static import StaticController
from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import EngineProfile, get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits, Telemetry
from batchpilot.envs.vllm_engine import VLLMEngine
from batchpilot.envs.workload import Request, Workload
from batchpilot.envs.workloads import make_workload

SLO_ = SLO(ttft_ms=2000, tpot_ms=50)


def tight_engine(fast: bool = True) -> SimEngine:
    """The 7B profile with a KV cache small enough that large batches preempt."""
    profile = dataclasses.replace(get_profile("llama-7b-a100"), num_gpu_blocks=500)
    return SimEngine(profile, slo=SLO_, fast_forward=fast, keep_records=True)


def bursty(n: int = 250, seed: int = 3):
    return make_workload(
        "embedded:azure-conv", "gamma:6:3", num_requests=n, seed=seed, max_model_len=4096,
        overlong="truncate",
    )


SCHEDULE = [(64, None), (8, 512), (200, 2048), (32, None), (128, 256)]
"""(max_num_seqs, max_num_batched_tokens) cycled through by `drive`."""


def drive(engine: SimEngine, steps: int, start: int = 0) -> list[Telemetry]:
    """Alternate limits and advance calls of both kinds (iterations and engine seconds)."""
    out = []
    for i in range(start, start + steps):
        seqs, tokens = SCHEDULE[i % len(SCHEDULE)]
        engine.set_limits(Limits(seqs, tokens))
        if i % 2:
            out.append(engine.advance(max_iterations=7))
        else:
            out.append(engine.advance(until_s=engine.clock_s + 0.4))
        if engine.done:
            break
    return out


def finish(engine: SimEngine, limits: Limits) -> list[Telemetry]:
    engine.set_limits(limits)
    out = []
    while not engine.done:
        out.append(engine.advance(max_iterations=5))
    return out


def same_result(a: SimEngine, b: SimEngine) -> None:
    ra, rb = a.result(), b.result()
    assert ra.records == rb.records
    assert ra.stats == rb.stats  # every latency, inter-token ones included
    assert ra.metrics() == rb.metrics()


@pytest.mark.parametrize("fast", [True, False])
def test_fork_continued_alike_reproduces_the_original(fast: bool) -> None:
    workload = bursty()
    engine = tight_engine(fast)
    engine.reset(workload, Limits(256))
    drive(engine, 40)
    assert engine.result().records and not engine.done
    twin = engine.fork()
    assert drive(twin, 30, start=40) == drive(engine, 30, start=40)
    assert finish(twin, Limits(96)) == finish(engine, Limits(96))
    same_result(twin, engine)
    assert engine.result().metrics()["num_preemptions"] > 0  # the case exercises preemption


def test_fork_continued_otherwise_leaves_the_original_untouched() -> None:
    workload = bursty()
    reference, engine = tight_engine(), tight_engine()
    for e in (reference, engine):
        e.reset(workload, Limits(256))
        drive(e, 40)
    for seqs in (1, 512):
        other = engine.fork()
        finish(other, Limits(seqs, 512 if seqs == 1 else None))
        assert other.result().metrics() != reference.result().metrics()
    assert drive(engine, 30, start=40) == drive(reference, 30, start=40)
    assert finish(engine, Limits(96)) == finish(reference, Limits(96))
    same_result(engine, reference)


def test_fork_without_history_reports_only_what_follows() -> None:
    engine = tight_engine()
    engine.reset(bursty(), Limits(256))
    drive(engine, 40)
    before = len(engine.result().records)
    light = engine.fork(history=False)
    assert light.finished_records() == []
    assert finish(light, Limits(128)) == finish(engine, Limits(128))
    assert light.finished_records() == engine.result().records[before:]
    with pytest.raises(RuntimeError, match="no run metrics"):
        light.result()


def test_fork_shares_the_arrivals_still_to_come() -> None:
    """A fork costs the requests in flight, not the workload's length: the arrivals still
    to come are one shared immutable sequence, and each engine keeps its own place in it."""
    engine = tight_engine()
    engine.reset(bursty(250), Limits(256))
    drive(engine, 10)
    twin = engine.fork(history=False)
    assert twin._arrivals is engine._arrivals
    assert finish(twin, Limits(64))
    assert engine._next < len(engine._arrivals) == twin._next


def test_fork_copies_state_it_does_not_know_about() -> None:
    """State added to the engine later is copied (deep), never shared with the fork."""
    engine = tight_engine()
    engine.reset(bursty(50), Limits(256))
    engine._added_later = {"counts": [1]}  # type: ignore[attr-defined]
    twin = engine.fork()
    twin._added_later["counts"].append(2)  # type: ignore[attr-defined]
    assert engine._added_later == {"counts": [1]}  # type: ignore[attr-defined]


def test_fork_needs_a_reset_engine() -> None:
    with pytest.raises(RuntimeError, match="reset"):
        tight_engine().fork()


@pytest.mark.parametrize(("fast", "scheduler"), [(True, "v1"), (False, "v1"), (True, "v0")])
def test_limits_above_the_peak_demand_change_nothing(fast: bool, scheduler: str) -> None:
    """From many states, a horizon's `peak_demand` holds the limits it never met: rerun with
    max_num_seqs (or the budget) at the peak plus one or the engine's cap, it goes the same
    way to the bit. V0's budget check is not tracked: only its pure-decode horizons leave
    the budget free."""
    profile = dataclasses.replace(get_profile("llama-7b-a100"), num_gpu_blocks=500)
    engine = SimEngine(profile, slo=SLO_, fast_forward=fast, scheduler=scheduler)
    engine.reset(bursty(), Limits(256))
    caps = (engine.max_num_seqs, engine.max_num_batched_tokens)
    checked = {"seqs": 0, "tokens": 0}
    for start in range(0, 60, 6):
        drive(engine, 6, start=start)
        if engine.done:
            break
        for pair in ((caps[0], 2048), (64, caps[1]), caps, (8, 512)):
            reference = engine.fork(history=False)
            reference.set_limits(Limits(*pair))
            horizon = reference.advance(until_s=engine.clock_s + 2.0)
            running, asked = reference.peak_demand()
            seqs = [s for s in (running + 1, caps[0]) if pair[0] > running and s != pair[0]]
            tokens = [t for t in (asked + 1, caps[1]) if pair[1] > asked and t != pair[1]]
            for other in [(s, pair[1]) for s in seqs] + [(pair[0], t) for t in tokens]:
                twin = engine.fork(history=False)
                twin.set_limits(Limits(*other))
                seen = twin.advance(until_s=engine.clock_s + 2.0)
                assert dataclasses.replace(seen, max_num_seqs=pair[0]) == dataclasses.replace(
                    horizon, max_num_batched_tokens=other[1]
                )  # but for the limits it reports
                assert twin.finished_records() == reference.finished_records()
            checked["seqs"] += len(seqs)
            checked["tokens"] += len(tokens)
    assert engine.result().metrics()["num_preemptions"] > 0
    assert checked["seqs"] > 10
    assert checked["tokens"] > (0 if scheduler == "v0" else 10)


# ---------------------------------------------------------------------- mpc
def crowded_cache() -> tuple[Workload, EngineProfile]:
    """Eight 4+40-token requests at once on a 1 s/step engine whose cache holds two whole:
    admitting all of them runs out of blocks and preempts again and again."""
    requests = [Request(f"{i}", 0.0, 4, 40) for i in range(8)]
    return Workload.from_requests("crowded", requests), unit_profile(num_gpu_blocks=26, block_size=4)


def test_mpc_picks_the_candidate_whose_future_is_better() -> None:
    workload, profile = crowded_cache()
    slo = SLO(tpot_ms=1500)
    goodput = {}
    for seqs in (2, 8):
        engine = SimEngine(profile, slo=slo)
        out = run(workload, engine, StaticController(seqs))
        goodput[seqs] = out.metrics()["output_goodput"]
        if seqs == 8:
            assert out.metrics()["num_preemptions"] > 0
    best = max(goodput, key=goodput.get)
    assert goodput[best] > 1.1 * min(goodput.values())
    mpc = make_controller("mpc:horizon_s=10000:replan_s=10000:seqs=2/8:tokens=100")
    engine = SimEngine(profile, slo=slo)
    out = run(workload, engine, mpc)
    assert out.timeline.array()["max_num_seqs"][0] == best
    assert out.metrics()["output_goodput"] == pytest.approx(goodput[best])
    seq_sweep, token_sweep = mpc.sweeps  # its one re-plan
    assert {2, 8} <= set(seq_sweep) and seq_sweep[best] == max(seq_sweep.values()) > seq_sweep[8]
    assert list(token_sweep) == [100]


def test_mpc_recompute_debit_prices_preemption() -> None:
    """``recompute=W`` takes W output tokens off a horizon per token a preemption dropped in
    it: a pair that preempts loses exactly that, one that never preempts nothing."""
    workload, profile = crowded_cache()
    slo = SLO(tpot_ms=1500)
    scores = {}
    for w in (0.0, 0.5):
        engine = SimEngine(profile, slo=slo)
        telemetry = engine.reset(workload, Limits(8, 100))
        mpc = make_controller(f"mpc:horizon_s=10000:recompute={w}")
        mpc.reset(engine)
        scores[w] = {pair: mpc.rollout(telemetry, pair, set()) for pair in ((2, 100), (8, 100))}
    assert scores[0.5][2, 100] == scores[0.0][2, 100]
    fork = engine.fork(history=False)
    fork.set_limits(Limits(8, 100))
    dropped = fork.advance(until_s=10000).interval_recomputed_tokens
    assert dropped > 0
    assert scores[0.5][8, 100] == pytest.approx(scores[0.0][8, 100] - 0.5 * dropped)


def test_mpc_recoverable_pace_does_not_write_off_a_batch_it_can_still_speed_up() -> None:
    """With ``pace=recoverable``, a batch whose recent steps ran past the TPOT target (prefill
    chunks in them) but whose decodes alone would meet it is not lost at the re-plan: a
    candidate that admits nothing can still save it. At the recent pace (the default) it is."""
    profile = get_profile("llama-7b-a100")
    engine = SimEngine(profile, slo=SLO_)
    workload = make_workload("fixed:200:400", "all-at-once", num_requests=40, seed=0)
    engine.reset(workload, Limits(40, 8192))
    telemetry = engine.advance(max_iterations=20)
    assert telemetry.num_requests_running == 40
    slow = dataclasses.replace(telemetry, recent_tbt_s=0.5)  # 10x the 50 ms target
    running = engine.unfinished_requests()[:40]
    step = recoverable_step_s(engine, running, slow)
    kv = sum(prompt + generated for *_, generated, _, prompt in running)
    assert step == profile.step.decode_time(40, kv) < 0.05
    now = slow.time_s
    for _, arrival, first, last, generated, output, _ in running:
        assert on_pace(SLO_, now, arrival, first, last, generated, output, step)
        assert not on_pace(SLO_, now, arrival, first, last, generated, output, 0.5)
    for spec, lost in (("mpc:horizon_s=4:pace=recoverable", set()), ("mpc:horizon_s=4", None)):
        mpc = make_controller(spec)
        mpc.reset(engine)
        assert mpc._lost(slow) == (lost if lost is not None else {r[0] for r in running})
    assert recoverable_step_s(engine, running, telemetry) == min(telemetry.recent_tbt_s, step)


def test_mpc_ttft_ties_go_to_the_least_first_token_wait() -> None:
    """Where every budget scores about alike (all requests meet their SLOs), the default
    keeps the engine's budget (ties go to the current pair); with ``ttft_ties`` the near-ties
    go to the budget whose horizon waits least for first tokens: a lower mean TTFT for
    goodput within the tolerance."""
    requests = [Request(f"d{i}", 0.0, 100, 400) for i in range(16)]
    requests += [Request(f"p{i}", 1.0 + 0.5 * i, 3000, 50) for i in range(3)]
    workload = Workload.from_requests("light", requests)
    metrics, budgets = {}, {}
    for ties in (0.0, 0.01):
        engine = SimEngine(get_profile("llama-7b-a100"), slo=SLO_)
        mpc = make_controller(f"mpc:horizon_s=4:tokens=128/512/4096:ttft_ties={ties}")
        out = run(workload, engine, mpc)
        metrics[ties] = out.metrics()
        budgets[ties] = set(out.timeline.array()["max_num_batched_tokens"].tolist())
    assert budgets[0.0] == {engine.max_num_batched_tokens}
    assert len(budgets[0.01]) > 1
    assert metrics[0.01]["mean_ttft_ms"] < 0.9 * metrics[0.0]["mean_ttft_ms"]
    assert metrics[0.01]["output_goodput"] > 0.99 * metrics[0.0]["output_goodput"]


@pytest.mark.parametrize(
    ("spec", "incumbent", "scores"),
    [
        # the current pair off this plan's grid (a running count of an earlier plan), and best
        ("mpc:seqs=8/32/128:tokens=512/2048:ttft_ties=0.01", (7, 2048), {(7, 2048): 1000.0}),
        # a lead of 2% does not beat a 5% margin, near-ties or not
        ("mpc:seqs=8/32/128:tokens=512/2048:margin=0.05:ttft_ties=0.001", (32, 2048),
         {(32, 2048): 1000.0, (8, 2048): 1020.0}),
    ],
)  # fmt: skip
def test_mpc_ttft_ties_never_leave_a_pair_the_scores_keep(
    spec: str,
    incumbent: tuple[int, int],
    scores: dict[tuple[int, int], float],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Near-ties go to the least wait only among pairs tied with the top score, the current
    pair among them (with its margin): here every other pair waits less but scores lower."""
    import batchpilot.baselines.mpc as mpc_module

    engine = SimEngine(get_profile("llama-7b-a100"), slo=SLO_)
    engine.reset(Workload.from_requests("w", [Request(f"r{i}", 0.1 * i, 100, 50) for i in range(20)]), Limits(256, 2048))
    mpc = make_controller(spec)
    mpc.reset(engine)
    telemetry = engine.advance(until_s=0.5)
    mpc._current = incumbent
    monkeypatch.setattr(mpc_module, "_same_horizon", lambda pair, peaks: None)
    monkeypatch.setattr(
        mpc, "_scored", lambda t, pair, lost: (scores.get(pair, 500.0), (0, 0), 0.0 if pair != incumbent else 9.0)
    )
    assert mpc.decide(telemetry) == Limits(*incumbent)


def test_mpc_refuses_an_engine_it_cannot_fork() -> None:
    mpc = make_controller("mpc")
    assert simulator_only(mpc)
    with pytest.raises(TypeError, match=r"VLLMEngine lacks fork.*--engine sim"):
        mpc.reset(VLLMEngine.__new__(VLLMEngine))


def test_mpc_refuses_to_serve() -> None:
    from batchpilot.serving.config import serving_controller

    with pytest.raises(ValueError, match="cannot serve"):
        serving_controller("mpc:horizon_s=2")


@pytest.mark.parametrize(
    "spec",
    [
        "mpc:seqs=8/x",
        "mpc:horizon_s=0",
        "mpc:rounds=0",
        "mpc:depth=3",
        "mpc:future=psychic",
        "mpc:recompute=-1",
        "mpc:recompute=nan",
        "mpc:lengths=guessed",
        "mpc:pace=hopeful",
        "mpc:ttft_ties=1",
        "mpc:ttft_ties=-0.1",
        "mpc:rate=long",
    ],
)
def test_mpc_spec_errors_name_the_problem(spec: str) -> None:
    with pytest.raises(ControllerSpecError, match="mpc"):
        make_controller(spec)


def test_replace_future_swaps_the_arrivals_still_to_come() -> None:
    engine = tight_engine()
    engine.reset(bursty(), Limits(64, None))
    drive(engine, 6)
    arrived = [r for r in bursty().requests if r.arrival_s <= engine.clock_s]
    assert engine.arrived_requests(5) == arrived[-5:]
    blind = engine.fork()
    blind.replace_future([])
    finish(blind, Limits(64, None))
    finish(engine, Limits(64, None))
    assert len(blind.result().records) == len(arrived) < len(engine.result().records) == 250
    late = [Request("b", engine.clock_s + 2, 8, 8), Request("a", engine.clock_s + 1, 8, 8)]
    with pytest.raises(ValueError, match="sorted and not before the clock"):
        blind.replace_future(late)
    with pytest.raises(RuntimeError, match="whose future is its own"):
        blind.arrived_requests(5)


def test_mpc_with_a_sampled_future_does_not_see_the_workloads_future() -> None:
    """Two workloads alike until a burst of long prompts that only the second has: at a
    re-plan before the burst, the true-future oracle's horizon scores see it (the burst
    misses its TTFT deadlines), the sampled ones do not."""
    calm = list(bursty(120).requests)
    t = calm[-1].arrival_s
    burst = [Request(f"x{i}", t + 0.5 + 1e-3 * i, 3000, 200) for i in range(200)]
    scores = {}
    for future in ("true", "sampled"):
        for name, requests in (("calm", calm), ("burst", calm + burst)):
            engine = tight_engine()
            engine.reset(Workload.from_requests(name, requests), Limits(32, 512))
            telemetry = engine.advance(until_s=t)
            mpc = make_controller(f"mpc:horizon_s=8:future={future}")
            mpc.reset(engine)
            mpc.decide(telemetry)
            scores[future, name] = mpc.rollout(telemetry, (32, 512), set())
    assert scores["sampled", "calm"] == scores["sampled", "burst"]
    assert scores["true", "burst"] < scores["true", "calm"] - 100 * 200


def test_a_renewal_future_keeps_the_arrivals_bursts() -> None:
    """Arrivals four at a time every 3 s: a renewal draw's gaps are the recent gaps (0 or 3 s)
    scaled to the short-window rate, so its arrivals come in bursts on one beat, about four a
    beat; a Poisson draw (``future=sampled``) spreads them. Arrivals at one instant and no
    others draw a Poisson stream at the short-window rate, not a burst without end."""
    import numpy as np

    requests = [Request(f"r{i}", 3.0 * (i // 4), 64, 32) for i in range(400)]
    engine = tight_engine()
    engine.reset(Workload.from_requests("beat", requests), Limits(64))
    telemetry = engine.advance(until_s=100.0)
    draws = {}
    for future in ("renewal", "sampled"):
        mpc = make_controller(f"mpc:horizon_s=60:future={future}")
        mpc.reset(engine)
        draws[future] = [
            [r.arrival_s for r in getattr(mpc, f"_{future}_future")(telemetry)] for _ in range(20)
        ]
    beat = 3.0 / (telemetry.arrival_rate_short * 45 / 63)  # 63 recent gaps span 45 s
    bursts = 0
    for times in draws["renewal"]:
        beats = (np.asarray(times) - 99.0) / beat  # the last arrival was at 99 s
        np.testing.assert_allclose(beats, np.round(beats), atol=1e-9)
        assert telemetry.time_s < times[0] and times[-1] <= telemetry.time_s + 60
        bursts += len(np.unique(np.round(beats)))
    assert 3.0 < sum(map(len, draws["renewal"])) / bursts < 5.5
    spread = [np.diff(t) for t in draws["sampled"]]
    assert not any(np.allclose(d / beat, np.round(d / beat)) for d in spread)
    at_once = [Request(f"r{i}", 1.0 + 1e-9 * i, 64, 32) for i in range(8)]
    engine.reset(Workload.from_requests("at once", at_once), Limits(64))
    telemetry = engine.advance(until_s=2.0)
    mpc = make_controller("mpc:horizon_s=60:future=renewal")
    mpc.reset(engine)
    assert len(mpc._renewal_future(telemetry)) < 8 * 60 * 3


def test_a_drawn_future_at_the_lower_rate_does_not_run_a_burst_on() -> None:
    """Calm arrivals (1/s), then a burst of 40 in one second: just after it the short window
    (5 s) counts 8/s, the long one (30 s) about 2.3/s. ``rate=recent`` draws the burst's
    rate for the whole horizon, ``rate=lower`` the long window's; where the load has fallen
    (20 s after the burst, still in the long window), both draw the short window's."""
    calm = [Request(f"c{i}", float(i), 64, 32) for i in range(60)]
    burst = [Request(f"b{i}", 60.0 + i / 40, 64, 32) for i in range(40)]
    later = [Request(f"l{i}", 61.0 + 5.0 * i, 64, 32) for i in range(10)]
    engine = tight_engine()
    engine.reset(Workload.from_requests("burst", calm + burst + later), Limits(64))
    telemetry = engine.advance(until_s=61.0)
    assert telemetry.arrival_rate_short > 2 * telemetry.arrival_rate
    counts = {}
    for rate in ("recent", "lower"):
        mpc = make_controller(f"mpc:horizon_s=60:future=sampled:rate={rate}")
        mpc.reset(engine)
        counts[rate] = sum(len(mpc._sampled_future(telemetry)) for _ in range(20)) / 20
    assert counts["recent"] == pytest.approx(telemetry.arrival_rate_short * 60, rel=0.1)
    assert counts["lower"] == pytest.approx(telemetry.arrival_rate * 60, rel=0.1)
    quiet = engine.advance(until_s=80.0)
    assert quiet.arrival_rate_short < quiet.arrival_rate
    rates = []
    for rate in ("recent", "lower"):
        mpc = make_controller(f"mpc:horizon_s=60:future=sampled:rate={rate}")
        mpc.reset(engine)
        rates.append(mpc._future_rate(quiet))
    assert rates[0] == rates[1] == quiet.arrival_rate_short


def test_a_bursty_rate_takes_the_lower_rate_only_where_the_gaps_are_bursty() -> None:
    """``rate=bursty``: on arrivals evenly spaced at a rate that steps up (gaps' CV near 0) it
    keeps the short window, where ``rate=lower`` lags at the long one; on bursts of 20 at one
    instant every 20 s (CV far above `BURSTY_CV`) it takes the lower rate."""
    import numpy as np

    from batchpilot.baselines.mpc import BURSTY_CV

    steps = [Request(f"s{i}", 0.5 * i, 64, 32) for i in range(60)]  # 2/s for 30 s
    steps += [Request(f"f{i}", 30.0 + 0.1 * i, 64, 32) for i in range(80)]  # then 10/s
    bursts = [Request(f"b{i}", 20.0 * (i // 20) + 1e-3 * (i % 20), 64, 32) for i in range(200)]
    rates = {}
    for name, requests, at in (("steps", steps, 38.0), ("bursts", bursts, 80.5)):
        engine = tight_engine()
        engine.reset(Workload.from_requests(name, requests), Limits(64))
        telemetry = engine.advance(until_s=at)
        gaps = np.diff([r.arrival_s for r in engine.arrived_requests(64)])
        assert (gaps.std() > BURSTY_CV * gaps.mean()) == (name == "bursts")
        for rate in ("recent", "lower", "bursty"):
            mpc = make_controller(f"mpc:horizon_s=16:future=sampled:rate={rate}")
            mpc.reset(engine)
            rates[name, rate] = mpc._future_rate(telemetry)
        assert telemetry.arrival_rate != telemetry.arrival_rate_short
    assert rates["steps", "bursty"] == rates["steps", "recent"] > rates["steps", "lower"]
    assert rates["bursts", "bursty"] == rates["bursts", "lower"] < rates["bursts", "recent"]


def test_an_auto_future_renews_bursts_and_draws_poisson_otherwise() -> None:
    """``future=auto``: a re-plan on bursts of 20 at one instant (gaps' CV far above
    `BURSTY_CV`) draws the renewal future, one on evenly spaced arrivals at a rate that steps
    the Poisson one (each the same draw as that future's own planner, from the same seed)."""
    steps = [Request(f"s{i}", 0.5 * i, 64, 32) for i in range(60)]
    steps += [Request(f"f{i}", 30.0 + 0.1 * i, 64, 32) for i in range(80)]
    bursts = [Request(f"b{i}", 20.0 * (i // 20) + 1e-3 * (i % 20), 64, 32) for i in range(200)]
    for name, requests, at, alike in (
        ("steps", steps, 38.0, "sampled"),
        ("bursts", bursts, 80.5, "renewal"),
    ):
        engine = tight_engine()
        engine.reset(Workload.from_requests(name, requests), Limits(64))
        telemetry = engine.advance(until_s=at)
        futures = {}
        for future in ("auto", "sampled", "renewal"):
            mpc = make_controller(f"mpc:horizon_s=16:future={future}")
            mpc.reset(engine.fork())
            mpc.decide(telemetry)
            futures[future] = [r.arrival_s for r in mpc._futures[0]]
        other = "renewal" if alike == "sampled" else "sampled"
        assert futures["auto"] == futures[alike] != futures[other], name


def test_several_drawn_futures_score_a_pair_by_their_mean() -> None:
    """``draws=K`` scores each candidate over K futures drawn once a re-plan and shared by
    every candidate: its score is the mean of the K single-future scores, and the futures
    differ (each is a draw of its own)."""
    requests = list(bursty(200).requests)
    engine = tight_engine()
    engine.reset(Workload.from_requests("bursty", requests), Limits(32, 512))
    telemetry = engine.advance(until_s=requests[120].arrival_s)
    mpc = make_controller("mpc:horizon_s=8:future=sampled:draws=3")
    mpc.reset(engine)
    mpc.decide(telemetry)
    futures = mpc._futures
    assert len(futures) == 3 and len({tuple(r.arrival_s for r in f) for f in futures}) == 3
    singles = [mpc._rollout(telemetry, (32, 512), set(), f)[0] for f in futures]
    assert len(set(singles)) > 1
    assert mpc.rollout(telemetry, (32, 512), set()) == pytest.approx(sum(singles) / 3)
    one = make_controller("mpc:horizon_s=8:future=sampled:draws=1")
    one.reset(engine)
    limits = one.decide(telemetry)  # one draw: the single future's scores, exactly
    (future,) = one._futures
    assert one._scored(telemetry, (32, 512), set()) == one._rollout(telemetry, (32, 512), set(), future)
    default = make_controller("mpc:horizon_s=8:future=sampled")
    default.reset(engine)
    assert (default.decide(telemetry), default.sweeps) == (limits, one.sweeps)


def test_mpc_reuses_only_horizons_it_would_repeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scoring a candidate by a rolled-out twin whose limits never acted (`_same_horizon`)
    leaves every choice and every sweep score as rolling each candidate out gives them,
    with fewer rollouts."""
    from batchpilot.baselines import mpc as mpc_module

    def episode() -> tuple[list, object]:
        engine = tight_engine()
        mpc = make_controller("mpc:horizon_s=4:future=sampled")
        telemetry = engine.reset(bursty(150), Limits(64))
        mpc.reset(engine)
        trace = []
        while not engine.done:
            limits = mpc.decide(telemetry)
            trace.append((limits, mpc.sweeps))
            engine.set_limits(limits)
            telemetry = engine.advance(until_s=engine.clock_s + 0.5)
        return trace, mpc

    reusing, fast = episode()
    monkeypatch.setattr(mpc_module, "_same_horizon", lambda pair, peaks: None)
    rolling, slow = episode()
    assert reusing == rolling
    assert fast.reused > 0.2 * slow.rollouts
    assert fast.rollouts + fast.reused == slow.rollouts and slow.reused == 0


def test_replace_outputs_gives_a_fork_other_lengths() -> None:
    engine = tight_engine()
    engine.reset(bursty(60), Limits(64))
    drive(engine, 6)
    entries = engine.unfinished_requests()
    assert len(entries) > 5 and any(e[4] for e in entries)
    fork = engine.fork(history=False)
    fork.replace_outputs([gen + 1 for _, _, _, _, gen, _, _ in entries])
    fork.replace_future([])
    finish(fork, Limits(64))
    done = {r.request_id: r.output_tokens for r in fork.finished_records()}
    assert done == {rid: gen + 1 for rid, _, _, _, gen, _, _ in entries}
    assert engine.unfinished_requests() == entries  # the original keeps its lengths
    rid, _, _, _, gen, _, prompt = next(e for e in entries if e[4])
    for outputs, problem in (
        ([gen + 1] * (len(entries) - 1), "lengths for"),
        ([e[4] if e[0] == rid else e[5] for e in entries], f"request {rid} has generated"),
        ([engine.max_tokens - prompt + 1 if e[0] == rid else e[5] for e in entries], rid),
    ):
        with pytest.raises(ValueError, match=problem):
            engine.fork().replace_outputs(outputs)


def test_mpc_with_sampled_lengths_does_not_see_the_admitted_requests_outputs() -> None:
    """Two workloads alike but for the output lengths of the requests admitted at the first
    re-plan (none finished yet): with ``lengths=sampled`` the oracle plans alike for both,
    with the true lengths it does not."""
    later = [Request(f"later{i}", 5.0 + 0.1 * i, 200, 100) for i in range(30)]
    sweeps = {}
    for lengths in ("true", "sampled"):
        for output in (20, 600):
            first = [Request(f"first{i}", 0.0, 300, output) for i in range(24)]
            engine = tight_engine()
            telemetry = engine.reset(Workload.from_requests(f"out{output}", first + later), Limits(8, 512))
            mpc = make_controller(f"mpc:horizon_s=8:lengths={lengths}")
            mpc.reset(engine)
            mpc.decide(telemetry)
            sweeps[lengths, output] = mpc.sweeps
    assert sweeps["sampled", 20] == sweeps["sampled", 600]
    assert sweeps["true", 20] != sweeps["true", 600]
