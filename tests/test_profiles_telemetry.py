"""Engine profiles (vLLM's KV capacity arithmetic, JSON files) and telemetry checks."""

from __future__ import annotations

import dataclasses
import json
import math
import os
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_profile_file_refused

from batchpilot.envs.metrics import SLO
from batchpilot.envs.profiles import (
    A100_80G,
    GIB,
    LLAMA_7B,
    PROFILES,
    EngineProfile,
    get_profile,
    roofline_profile,
)
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import (
    ArrivalRate,
    LapsedFirstTokens,
    Limits,
    StepCost,
    TelemetryError,
    on_track,
)
from batchpilot.envs.workloads import make_workload


def test_kv_capacity_follows_vllms_arithmetic() -> None:
    p = roofline_profile(LLAMA_7B, A100_80G, tp=1, gpu_memory_utilization=0.9)
    kv_token = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 heads x 128, fp16: 512 KiB
    assert kv_token == 512 * 1024
    free = 80 * GIB * 0.9 - 6.74e9 * 2 - 3 * GIB
    assert p.num_gpu_blocks == math.floor(free / (kv_token * 16))
    tp8 = roofline_profile(LLAMA_7B, A100_80G, tp=8)
    assert tp8.num_gpu_blocks > 8 * p.num_gpu_blocks  # weights shard too, so more than 8x
    assert tp8.step.decode_seq_s == pytest.approx(p.step.decode_seq_s / 8)


def test_shipped_profiles_are_sane() -> None:
    for p in PROFILES.values():
        assert p.kv_capacity_tokens >= p.max_model_len
        assert p.step.decode_time(1, 100) < p.step.decode_time(64, 100) < p.step.decode_time(64, 100_000)
        assert p.step.prefill_time(512) > p.step.decode_time(1, 512)


def test_profile_json_round_trip_and_errors(tmp_path: Path) -> None:
    path = tmp_path / "p.json"
    path.write_text(PROFILES["cpu-tiny-llama"].to_json())
    assert get_profile(str(path)) == PROFILES["cpu-tiny-llama"]
    bom = tmp_path / "bom.json"  # a byte order mark was refused, as no trace's is
    bom.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
    assert get_profile(str(bom)) == PROFILES["cpu-tiny-llama"]
    bad = json.loads(path.read_text())
    bad["step"]["kv_token_s"] = -1
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"step.kv_token_s must be a number >= 0"):
        get_profile(str(path))
    bad["step"]["kv_token_s"] = 0.0
    bad["step"]["base_s"] = 1e308
    path.write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"decode step at 1e\+308 s, over 60 s"):
        get_profile(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        get_profile(str(path))
    path.write_bytes(b"\xff\xfe{")
    with pytest.raises(ValueError, match=r"p.json: the profile is not UTF-8 text"):
        get_profile(str(path))
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"p.json: the profile nests too deeply"):
        get_profile(str(path))
    path.write_text('{"block_size": ' + "1" * 5000 + "}")
    with pytest.raises(ValueError, match=r"p.json: the profile holds an integer of over 4300 digits"):
        get_profile(str(path))
    path.write_text(json.dumps({"name": "x"}))
    with pytest.raises(ValueError, match="not an engine profile"):
        get_profile(str(path))
    for missing in ("missing.json", "missing.JSON", "missing"):  # a path, not a profile name
        with pytest.raises(ValueError, match=f"{missing}: no such profile file"):
            get_profile(str(tmp_path / missing))
    text = PROFILES["llama-2-7b-a100"].to_json()  # json would keep the second block_size
    path.write_text(text.replace('"block_size": 16', '"block_size": 16, "block_size": 32'))
    with pytest.raises(ValueError, match=r"p.json: the profile gives a key twice in one object \(block_size\)"):
        get_profile(str(path))
    with pytest.raises(ValueError, match=r": a directory, not a profile JSON file"):
        get_profile(str(tmp_path))
    os.mkfifo(tmp_path / "pipe.json")  # opening it to read would block
    with pytest.raises(ValueError, match=r"pipe.json: not a regular file \(a pipe, device"):
        get_profile(str(tmp_path / "pipe.json"))
    with pytest.raises(ValueError, match=r"no profile named; known: .*llama-2-7b-a100"):
        get_profile(" ")


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["step"].update(base_s=10**400), "step.base_s is a 401-digit integer, past a float's range"),
        (lambda d: d["step"].update(kv_token_s=[1e-7]), r"step.kv_token_s must be a number, got \[1e-07\]"),
        (lambda d: d["step"].update(prefill_token_s=1e308), r"\(256 requests, 2,048 tokens, 2,048-token contexts, 262,144 KV tokens\) at up to inf s, over 3600 s"),
        (lambda d: d["step"].update(prefill_token_s=2.0), r"at up to 409\d\.\d+ s, over 3600 s"),
        (lambda d: d["step"].update(decode_seq_s=20.0), r"at up to 51\d\d\.\d+ s, over 3600 s"),
        # operator tables in seconds read as milliseconds: 0 ms latencies, 32,768 req/s
        (lambda d: d["step"].update(base_s=2e-6, decode_seq_s=0.0, kv_token_s=0.0), r"one-request decode step at 2e-06 s, under 0.1 ms: not an engine step \(times in seconds where milliseconds were meant\?\)"),
        (lambda d: d.update(block_size=10**30), "block_size is 1000000000000000000000000000000, over 65,536"),
    ],
)
def test_bad_linear_profiles_are_rejected(tmp_path: Path, edit, message: str) -> None:
    assert_profile_file_refused(tmp_path, "cpu-tiny-llama", edit, message)


def test_telemetry_reports_engine_state_and_estimates() -> None:
    profile = PROFILES["llama-7b-a100"]
    engine = SimEngine(profile)
    work = make_workload("embedded:gsm8k", "poisson:20", num_requests=300, seed=0)
    t = engine.reset(work, Limits(32))
    t = engine.advance(until_s=5.0)
    assert t.validate() is t
    assert t.num_requests_running <= 32
    # as vLLM's BlockPool.get_usage: the null block is neither free nor usable
    assert t.kv_cache_usage == pytest.approx(1 - t.num_free_blocks / (t.num_total_blocks - 1))
    assert t.kv_capacity_tokens == profile.kv_capacity_tokens
    arrived = [r for r in work.requests if r.arrival_s <= t.time_s]
    assert t.prompt_mean == pytest.approx(sum(r.prompt_tokens for r in arrived) / len(arrived))
    assert t.arrival_rate == pytest.approx(len(arrived) / t.time_s)
    assert 0 < t.recent_tbt_s < 0.2 and t.recent_decode_batch > 1
    assert t.num_output_samples == t.interval_finished > 0


def test_nan_telemetry_is_named() -> None:
    engine = SimEngine(PROFILES["llama-7b-a100"])
    t = engine.reset(make_workload("embedded:gsm8k", "poisson:5", num_requests=5), Limits(4))
    with pytest.raises(TelemetryError, match="recent_tbt_s is nan"):
        dataclasses.replace(t, recent_tbt_s=float("nan")).validate()
    with pytest.raises(TelemetryError, match=r"kv_cache_usage is 1\.5"):
        dataclasses.replace(t, kv_cache_usage=1.5).validate()


def test_limits_reject_bad_values() -> None:
    with pytest.raises(ValueError, match="max_num_seqs must be an int >= 1"):
        Limits(0)
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        Limits(4, -1)
    assert isinstance(PROFILES["cpu-tiny-llama"], EngineProfile)


def test_step_cost_fits_the_line_of_step_time_on_tokens() -> None:
    """The weighted least-squares line through steps on a line is that line; steps of one
    size give the mean cost per token; no step gives zeros."""
    cost = StepCost()
    assert cost.line() == (0.0, 0.0)
    for tokens in [8, 512, 40, 2048, 16, 300] * 20:
        cost.add(tokens, 0.012 + 3e-5 * tokens)
    base, per_token = cost.line()
    assert base == pytest.approx(0.012, rel=1e-6) and per_token == pytest.approx(3e-5, rel=1e-6)
    steady = StepCost()
    for _ in range(50):
        steady.add(32, 0.02)
    assert steady.line() == (0.0, pytest.approx(0.02 / 32))
    stepped, run = StepCost(), StepCost()
    for c in (stepped, run):
        c.add(300, 0.05)
    for s in (0.021, 0.0213, 0.0216):
        stepped.add(24, s)
    run.add_steps(24, [0.021, 0.0213, 0.0216])  # a closed-form decode run: the same figures
    assert vars(run) == vars(stepped)


def test_simulator_reports_the_engines_speed() -> None:
    """The measured line moves with the profile's step times: half as fast, twice the
    seconds per token and the base, whatever the load."""
    profile = PROFILES["llama-7b-a100"]
    lines = []
    for scale in (1.0, 2.0):
        engine = SimEngine(profile.scaled(step_time=scale))
        work = make_workload("embedded:sharegpt", "poisson:4", num_requests=200, seed=0)
        engine.reset(work, Limits(64, 512))
        t = engine.advance(until_s=20.0)
        lines.append((t.step_base_s, t.step_s_per_token))
    (base, per_token), (slow_base, slow_per_token) = lines
    assert 0 < base < 0.1 and 0 < per_token < 1e-3
    assert slow_per_token == pytest.approx(2 * per_token, rel=0.3)
    assert slow_base == pytest.approx(2 * base, rel=0.3)


@pytest.mark.parametrize("slo", ["ttft:200,tpot:50", "e2el:150,ttft:400", "tpot:50"])
def test_lapsed_first_tokens_weigh_what_on_track_writes_off(slo: str) -> None:
    """Incremental, the weight of requests with no first token that `on_track` finds off
    track equals a walk over them all, through arrivals, first tokens, departures, a key
    reused, a change of SLO; and what it remembers stays bounded by what it holds."""
    rng = np.random.default_rng(0)
    targets = [SLO.parse(slo), SLO.parse("ttft:300")]  # then a looser one
    watch, held, now, n = LapsedFirstTokens(), {}, 0.0, 0
    for step in range(3000):
        target = targets[step // 2000]  # the SLO changes two-thirds of the way
        now += float(rng.exponential(0.01))
        if rng.random() < 0.55 or not held:
            key = f"r{n - 3}" if rng.random() < 0.05 else f"r{n}"  # sometimes a key again
            n += 1
            weight = int(rng.integers(1, 100))
            watch.add(key, now, weight)
            held[key] = (now, weight)
        else:
            key = list(held)[int(rng.integers(len(held)))]
            watch.discard(key)
            del held[key]
        if step % 7 == 0:
            walked = sum(w for a, w in held.values() if not on_track(target, now, a, -1, -1, 0))
            assert watch.lapsed_weight(now, target) == walked
            assert len(watch) == len(held)
            assert len(watch._order) <= 2 * len(held) + 65
    assert watch.lapsed_weight(now, targets[-1]) > 0
    watch.clear()
    assert watch.lapsed_weight(now, targets[-1]) == 0 and len(watch) == 0
    for i in range(10_000):  # requests that come and go long before their deadline
        watch.add(f"q{i}", now + i, 1)
        watch.discard(f"q{i}")
    assert len(watch._order) <= 65


def test_arrival_rates_count_the_arrivals_in_their_windows() -> None:
    """The short and long rates are the arrivals in the last 5 s and 30 s per second (at
    least 1 s of span), through bursts and gaps, read at any time after the arrivals (each
    read only moves engine time on)."""
    rng = np.random.default_rng(1)
    rates, times, now = ArrivalRate(), [], 0.0
    for _ in range(400):
        now += float(rng.choice([0.0, 0.001, 0.5, 7.0]))  # bursts, steady, gaps
        times.append(now)
        rates.add(now)
        if rng.random() < 0.3:
            later = now + float(rng.uniform(0, 6))
            long_n = sum(t >= later - 30.0 for t in times)
            short_n = sum(t >= later - 5.0 for t in times)
            assert rates.rate(later) == long_n / min(30.0, max(later, 1.0))
            assert rates.short_rate(later) == short_n / min(5.0, max(later, 1.0))
            now = later  # engine time only moves on
