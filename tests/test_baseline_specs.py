"""Controller specs, the min-combination, the oracle and the fixed-length workload source."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from telemetry_builder import make_telemetry

from batchpilot.baselines.alg1 import MemoryAwareController
from batchpilot.baselines.alg2 import SLAController
from batchpilot.baselines.combined import MinController
from batchpilot.baselines.oracle import OracleController, peak_blocks
from batchpilot.baselines.specs import (
    FACTORIES,
    SIMULATOR_ONLY,
    ControllerSpecError,
    given_twice,
    make_controller,
    simulator_only,
)
from batchpilot.baselines.static import StaticController
from batchpilot.envs.metrics import DEFAULT_SLO, SLO
from batchpilot.envs.profiles import get_profile
from batchpilot.envs.run import run
from batchpilot.envs.sim_engine import SimEngine
from batchpilot.envs.telemetry import Limits
from batchpilot.envs.workload import WorkloadError
from batchpilot.envs.workloads import make_workload


def test_specs_build_their_controllers() -> None:
    assert isinstance(make_controller("static:256"), StaticController)
    a1 = make_controller("alg1:eps=0.01:bound=exact:blocks=0")
    assert isinstance(a1, MemoryAwareController)
    assert (a1.eps, a1.bound, a1.blocks, a1.name) == (
        0.01,
        "exact",
        False,
        "alg1:eps=0.01:bound=exact:blocks=0",
    )
    a2 = make_controller("alg2:sla_ms=40:alpha=10")
    assert isinstance(a2, SLAController) and a2.params[:3] == (0.040, 0.010, 10)
    both = make_controller("alg1 + alg2:sla_ms=40")
    assert isinstance(both, MinController) and both.name == "alg1+alg2:sla_ms=40"
    assert isinstance(make_controller("oracle"), OracleController)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("alg1:eps=x", "eps='x' is not a valid number"),
        ("alg1:eps=1_0", "eps='1_0' is not a valid number"),  # Python's float reads 10
        ("alg2:sla_ms=+50", r"sla_ms='\+50' is not a valid number"),  # float() reads 50
        ("alg2:sla_ms= 50", "sla_ms=' 50' is not a valid number"),
        ("alg1:eps", "bad argument 'eps'"),
        ("alg1:gamma=2", "key one of eps, bound"),
        ("alg1:eps=0.7", "eps must be in"),
        ("alg1:eps=1e-300", r"alg1: eps must be in \[1e-15, 0.5\), got 1e-300"),
        ("alg1:blocks=yes", "blocks='yes' is not a valid switch"),
        ("alg2:alpha=1.5", "alpha='1.5' is not a valid whole number"),
        ("alg2:alpha= 5", "alpha=' 5' is not a valid whole number"),  # int() reads 5
        ("mpc:seqs=8/1_6", "mpc: seqs='8/1_6': whole numbers >= 1 separated by '/'"),
        # the parser's reason was replaced by "is not a valid grid"; empty parts were skipped
        ("mpc:seqs=0", "mpc: seqs='0': each value must be >= 1"),
        ("mpc:tokens=8//32", "mpc: tokens='8//32': whole numbers >= 1 separated by '/'"),
        ("mpc:seqs=8/", "mpc: seqs='8/': whole numbers >= 1 separated by '/'"),
        ("mpc:future=x", "mpc: future='x': one of true, sampled, renewal"),
        ("alg2:sla_ms=5", r"eps_ms .10, its default\) must be below sla_ms .5\); give a smaller"),
        ("alg2:sla_ms=5:eps_ms=7", r"eps_ms .7\) must be below sla_ms .5\)"),
        ("alg2:sla_ms=5:eps_ms=10", r"eps_ms .10\) must be below"),  # given: not "its default"
        ("alg1+nope", "unknown controller 'nope'"),
        ("best-static", "grid search"),
        ("static:x", "N must be a whole number"),
        ("static:0_8", "N must be a whole number"),
        ("static:-1", "N must be >= 1"),
        ("static:99999999999999999999999", "N must be at most 2,147,483,647"),
        ("static:64:4294967296", "T must be at most 2,147,483,647"),
        ("alg1:eps=0.05:eps=0.2", "alg1: eps given twice"),  # was the last one, silently
        ("mpc:seqs=8/32:seqs=64", "mpc: seqs given twice"),
    ],
)
def test_bad_specs_name_the_problem(spec: str, message: str) -> None:
    with pytest.raises(ControllerSpecError, match=message.replace("(", r"\(")):
        make_controller(spec)


class Fixed:
    def __init__(self, name: str, limits: Limits) -> None:
        self.name, self.limits, self.engine = name, limits, None

    def reset(self, engine) -> None:
        self.engine = engine

    def decide(self, telemetry) -> Limits:
        return self.limits


def test_min_combination_takes_the_smaller_of_each_limit() -> None:
    a, b = Fixed("a", Limits(50, 2048)), Fixed("b", Limits(80))
    c = MinController([a, b])
    c.reset("engine")
    assert (a.engine, b.engine) == ("engine", "engine")
    assert c.decide(make_telemetry()) == Limits(50, 2048)
    c = MinController(
        [Fixed("a", Limits(90)), Fixed("b", Limits(80, 4096)), Fixed("c", Limits(85, 1024))]
    )
    assert c.decide(make_telemetry()) == Limits(80, 1024)


def test_peak_blocks_is_just_before_the_first_finishes() -> None:
    # block size 4. A holds 4 tokens with 2 to go: 5 tokens (2 blocks) one step on, then
    # leaves; B holds 1 with 10 to go: 2 tokens then, 10 (3 blocks) at its end. Peak 3.
    assert peak_blocks(np.array([4, 1]), np.array([2, 10]), 4) == 3
    assert peak_blocks(np.array([8, 8]), np.array([5, 5]), 4) == 6  # 12 tokens each = 3 blocks
    assert peak_blocks(np.array([], dtype=np.int64), np.array([], dtype=np.int64), 4) == 0


def test_oracle_needs_a_clairvoyant_engine() -> None:
    with pytest.raises(TypeError, match="lacks remaining_output_tokens, waiting_output_tokens"):
        OracleController().reset(SimpleNamespace(max_num_seqs=8))


def test_oracle_packs_without_preemption() -> None:
    profile = get_profile("llama-7b-a100")
    workload = make_workload("embedded:azure-conv", "all-at-once", num_requests=300, seed=1)
    oracle = run(workload, SimEngine(profile), OracleController()).metrics()
    static = run(workload, SimEngine(profile), StaticController(256)).metrics()
    assert oracle["num_preemptions"] == 0 < static["num_preemptions"]
    assert oracle["mean_kv_usage"] > 0.8
    assert oracle["output_throughput"] > static["output_throughput"]


def test_fixed_source_gives_every_request_the_same_lengths() -> None:
    w = make_workload("fixed:128:64", "poisson:2", num_requests=50, seed=3)
    prompt, output = w.prompt_tokens, w.output_tokens
    assert len(w) == 50 and set(prompt) == {128} and set(output) == {64}
    assert w.name == "128/64 tokens (poisson 2/s)"
    for bad in ("fixed:128", "fixed:a:1", "fixed:0:5"):
        with pytest.raises(WorkloadError, match="fixed"):
            make_workload(bad, "all-at-once")


def test_an_exponents_plus_is_no_combination() -> None:
    """``5e+1`` was split at its ``+`` into ``alg2:sla_ms=5e`` and ``1``."""
    c = make_controller("alg2:sla_ms=5e+1+alg1")
    assert isinstance(c, MinController) and c.name == "alg2:sla_ms=5e+1+alg1"
    assert c.parts[0].sla_ms == 50.0
    assert given_twice(["static:16", "static:1_6"]) == ""  # left to the spec's own error


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("alg2:sla_ms=nan", "sla_ms='nan' is not a finite number"),
        ("alg2:sla_ms=inf", "sla_ms='inf' is not a finite number"),
        ("alg1:prior_output_mean=nan", "prior_output_mean='nan' is not a finite number"),
        ("alg1:eps=-inf", "eps='-inf' is not a finite number"),
        ("alg1:prior_output_std=1e400", "is not a finite number"),
        ("alg2:sla_ms=-5", r"sla_ms must be in \[0.001, 1e\+09\] ms, got -5"),
        ("alg2:eps_ms=-1", "eps_ms must be >= 0, got -1.0"),
        ("alg1:prior_output_mean=-3", "prior_output_mean must be in \\(0, 2147483647\\] tokens"),
        ("alg1:prior_output_std=1e200", "prior_output_std must be in"),  # squared: OverflowError
        ("alg2:window_ms=-1", "window_ms must be >= 0"),
        ("alg2:chunk=1:chunk_min=-5", r"alg2: chunk_min must be in \[1, 2,147,483,647\], got -5"),
        ("alg2:chunk=1:chunk_alpha=-1", r"alg2: chunk_alpha must be in \[0, 2,147,483,647\], got -1"),  # was 'alpha'
        ("alg1:refresh=0", "alg1: refresh must be >= 1, got 0"),  # named three settings, no value
        ("mpc:recompute=-1", "mpc: recompute must be a finite number >= 0, got -1.0"),
        ("mpc:rounds=0", "mpc: rounds must be >= 1, got 0"),
        # were accepted and clamped to the engine's cap, or pinned the limit at 1
        ("alg1:b_min=100000000000000000000000", r"alg1: b_min must be in \[1, 2,147,483,647\]"),
        ("alg2:b_max=100000000000000000000000", "alg2: b_max must be at most 2,147,483,647"),
        ("alg2:b_min=100000000000000000000000", "alg2: b_min must be at most 2,147,483,647"),
        ("oracle:slack_blocks=100000000000000000000000", r"oracle: slack_blocks must be in \[0, 2,147,483,647\]"),
        ("alg2:sla_ms=1e-320:eps_ms=0", r"alg2: sla_ms must be in \[0.001, 1e\+09\] ms, got 1e-320"),
        ("mpc:future=sampled:draws=0", "mpc: draws must be 1 to 16, got 0"),
        ("mpc:future=sampled:draws=17", "mpc: draws must be 1 to 16, got 17"),
        ("mpc:draws=2", r"mpc: draws must be 1 with future=true \(one true future\)"),
        # read by nothing, silently
        ("mpc:rate=lower", r"mpc: rate=lower is read by a drawn future with future=true"),
        ("alg2:chunk_alpha=7", r"alg2: chunk_alpha: only the token-budget search reads it"),
        ("alg2:chunk=0:chunk_min=5", r"alg2: chunk_min: only the token-budget search reads it"),
        # vLLM refuses a budget below max_num_seqs; the run was all TTFT misses
        ("static:8:1", "static:8:1: max_num_batched_tokens 1 is less than max_num_seqs 8"),
        ("oracle:slack_blocks=-1", r"slack_blocks must be in \[0, 2,147,483,647\], got -1"),
        ("alg1:b_max=0", "b_max 0 is below b_min"),
        ("", "empty controller spec"),
        ("alg1+", "empty controller spec"),
        ("alg1:", "empty argument"),
        ("policy:", "empty argument"),
    ],
)
def test_non_finite_negative_and_empty_spec_values_are_refused(spec: str, message: str) -> None:
    with pytest.raises(ControllerSpecError, match=message):
        make_controller(spec)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("ttft:nan", r"ttft value 'nan' must lie within \[0.001, 1e\+09\] ms"),
        ("ttft:-5", "ttft value '-5' must lie within"),
        ("tpot:inf", "tpot value 'inf' must lie within"),
        ("e2el:0", "e2el value '0' must lie within"),
        ("ttft:1e-320", "ttft value '1e-320' must lie within"),  # was printed as 9.99989e-321
        ("ttft:1_000", "ttft value '1_000' is not a number"),  # Python's float reads 1000
        ("ttft:+1000", r"ttft value '\+1000' is not a number"),  # float() reads 1000
        ("ttft:\u0661\u0660\u0660", "is not a number"),  # Arabic-Indic digits: 100 to float()
        ("tpot:", "tpot value '' is not a number"),
        ("ttft: 100", r"SLO 'ttft: 100': ttft value '' is not a number \(write ttft:MS, no space around ':'\)"),
        ("ttft:100,ttft:200", "ttft given twice"),
        ("ttft:100,,tpot:50", "an empty item between commas"),  # was dropped, as no other list does
        ("ttft:100,", "an empty item between commas"),
    ],
)
def test_bad_slo_values_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SLO.parse(text)


def test_default_slo_is_one_object_and_parses_back() -> None:
    assert SLO.parse(str(DEFAULT_SLO)) == DEFAULT_SLO
    assert DEFAULT_SLO.tpot_ms is not None and DEFAULT_SLO.ttft_ms is not None


@pytest.mark.parametrize("spec", ["oracle", "alg1+oracle", "oracle+alg2:sla_ms=40", "alg1+alg2"])
def test_simulator_only_is_any_part(spec: str) -> None:
    assert simulator_only(make_controller(spec)) == ("oracle" in spec)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_simulator_only_names_the_simulators_controllers(name: str) -> None:
    spec = {"static": "static:8"}.get(name, name)
    assert simulator_only(make_controller(spec)) == (name in SIMULATOR_ONLY)


@pytest.mark.parametrize(("spec", "hint"), [("orcale", ""), ("alg1+statik:8", "did you mean 'static'")])
def test_serve_lists_the_controllers_that_can_serve(spec: str, hint: str) -> None:
    from batchpilot.serving.config import serving_controller

    with pytest.raises(ValueError, match="serve takes: alg1, alg2, policy, static,") as info:
        serving_controller(spec)
    assert hint in str(info.value) and "mpc" not in str(info.value)


@pytest.mark.parametrize("spec", ["oracle", "alg1+oracle", "alg2+oracle:slack_blocks=2"])
def test_serve_refuses_any_simulator_only_part(spec: str) -> None:
    from batchpilot.serving.config import serving_controller  # imports no vLLM

    with pytest.raises(ValueError, match="cannot serve"):
        serving_controller(spec)
    assert serving_controller("alg1+alg2").name == "alg1+alg2"


@pytest.mark.parametrize(
    ("specs", "twice"),
    [
        (["static:8", "alg1", "static:08"], "static:8 and static:08"),
        (["alg1+alg2", "alg2+alg1"], "alg1+alg2 and alg2+alg1"),
        (["mpc:horizon_s=4:future=sampled", "mpc:future=sampled:horizon_s=4.0"], "mpc:horizon_s=4"),
        (["alg1", "alg1"], "alg1"),
        (["static:8", "static:8:8", "alg1", "alg1:eps=0.01", "alg2", "mpc", "static:x", "static:x2"], ""),
    ],
)
def test_one_controller_spelled_twice_is_found(specs: list[str], twice: str) -> None:
    """static:8 and static:08 ran the same controller twice: the check compared spellings."""
    assert given_twice(specs).startswith(twice) and bool(given_twice(specs)) == bool(twice)


def test_one_policy_by_two_paths_is_one_controller(tmp_path) -> None:
    """A policy's path is resolved (by the agents layer, which knows ``policy:``); a path
    that cannot be (a symlink loop) is kept as written, not a traceback."""
    from batchpilot.agents.specs import spec_key

    assert given_twice(["policy:a/p.onnx", "alg1", "policy:./a/p.onnx"], key=spec_key) == (
        "policy:a/p.onnx and policy:./a/p.onnx"
    )
    assert given_twice(["policy:a/p.onnx", "policy:./a/p.onnx"]) == ""  # the rules' key alone
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    loop = f"policy:{tmp_path / 'loop' / 'p.onnx'}"
    assert given_twice([loop, "alg1"], key=spec_key) == ""
    assert given_twice([loop, loop], key=spec_key) == loop


@pytest.mark.parametrize(
    "spec, learned",
    [
        ("policy:p.onnx", True),
        ("alg1 + policy:p.onnx", True),
        ("mpc:horizon_s=16", False),
        ("static:8:2048", False),
        ("alg2:sla_ms=5e+1", False),
    ],
)
def test_a_learned_policy_is_found_in_any_part_of_a_spec(spec: str, learned: bool) -> None:
    from batchpilot.agents.specs import is_learned

    assert is_learned(spec) is learned


def test_a_static_limit_over_the_engines_cap_is_named_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine = SimEngine(get_profile("llama-2-7b-a100"))
    caplog.set_level("WARNING", logger="batchpilot.static")
    make_controller("static:64:4096").reset(engine)
    assert not caplog.records
    over = make_controller(f"static:{engine.max_num_seqs + 1}:{engine.max_num_batched_tokens * 2}")
    over.reset(engine)
    over.reset(engine)
    assert len(caplog.records) == 1
    assert f"max_num_seqs {engine.max_num_seqs + 1:,} is over the engine's cap" in caplog.text
    assert "max_num_batched_tokens" in caplog.text


def test_a_name_typed_in_another_case_is_offered_its_own() -> None:
    """llama-2-7b-A100 was offered llama-2-7b-h100, another GPU; ALG1 was offered nothing."""
    with pytest.raises(ValueError, match="did you mean 'llama-2-7b-a100'"):
        get_profile("llama-2-7b-A100")
    with pytest.raises(ControllerSpecError, match="did you mean 'alg1'"):
        make_controller("ALG1")


def test_a_controller_compare_resolves_per_workload_is_refused_inside_a_combination() -> None:
    """default+alg1 was "unknown controller 'default' ... (compare also takes default)"."""
    with pytest.raises(ControllerSpecError, match=r"'default\+alg1': default is resolved per workload .* --controllers default,alg1$"):
        make_controller("default+alg1")
    with pytest.raises(ControllerSpecError, match=r"--controllers best-static,alg1\+alg2$"):
        make_controller("best-static+alg1+alg2")
