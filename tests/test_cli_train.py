"""A training config is checked whole before anything runs: every bad key is named with
the file, and a refused config leaves no run directory behind."""

from __future__ import annotations

import json
import os
import re
from importlib.resources import files
from pathlib import Path

import pytest
import yaml

pytest.importorskip("stable_baselines3")

from helpers import train_configs

from batchpilot.envs.observation import checked_fields
from batchpilot.training.cli import main
from batchpilot.training.train import load_config, make_env

BASE = {
    "n_envs": 1,
    "n_timesteps": 64,
    "env_kwargs": {"profile": ["llama-7b-a100"], "slo": "ttft:2000,tpot:50"},
    "n_steps": 32,
}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"n_timestep": 100}, "n_timestep: unknown key 'n_timestep' .*did you mean 'n_timesteps'"),
        ({"lerning_rate": 0.1}, "did you mean 'learning_rate'"),
        ({"device": "cuda"}, "device: unknown key 'device' \\(batchpilot sets it\\)"),
        ({"env_kwargs": {"profil": "llama-7b-a100"}}, "env_kwargs.profil: unknown key"),
        ({"env_kwargs": 3}, "env_kwargs: 3 is not a mapping"),
        ({"env_kwargs": {"profile": 5}}, "env_kwargs.profile: 5 is not of type"),
        ({"n_timesteps": [256]}, r"n_timesteps: \[256\] is not of type int"),
        ({"n_timesteps": 0}, r"n_timesteps: 0 is outside \[1, "),
        ({"seed": "abc"}, "seed: 'abc' is not of type int"),
        ({"seed": -1}, r"seed: -1 is outside \[0, 4294967295\]"),  # was 4.29497e+09
        ({"learning_rate": "fast"}, "learning_rate: 'fast' is not of type float"),
        ({"report": {}}, "report.suites: needs at least one suite"),  # was no report, silently
        ({"learning_rate": float("nan")}, "learning_rate: nan is not finite"),
        ({"batch_size": 0}, r"batch_size: 0 is outside \[1, "),
        ({"gamma": 2}, "gamma: 2 is outside"),
        ({"use_sde": True}, r"PPO refused the config \(generalized State-Dependent Exploration"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {}, "seeds": 7}}, "eval.seeds: 7 is not a list"),
        ({"eval": {"profile": 5, "workload": {}}}, "eval.profile: 5 is not of type str"),
        ({"eval": {"freq": 0, "profile": "llama-7b-a100", "workload": {}}}, "eval.freq: 0 is outside"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"arrival": "replay"}}}, "eval.workload: needs a source"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:gsm8k", "num_request": 5}}}, "eval.workload.num_request: unknown key"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:gsm8k", "num_requests": 0}}}, "eval.workload.num_requests: 0 is outside"),
        ({"env_kwargs": {"workload": [{"sorce": "embedded:gsm8k"}]}}, "env_kwargs: workload spec: unknown key"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "arrival": 5}}}, r"env_kwargs: workload spec: arrival must be a string, got 5 \(int\)"),
        ({"env_kwargs": {"workload": {"source": ["embedded:gsm8k", "embedded:sharegpt"]}}}, r"workload spec: source must be a string, got \['embedded:gsm8k', 'embedded:sharegpt'\] \(list\)"),
        ({"eval": {"profile": ["llama-7b-a100", "llama-2-7b-a100"], "workload": {"source": "embedded:azure-conv", "profiles": ["llama-7b-a100"]}}}, "eval.profile 'llama-2-7b-a100': no eval workload applies to it"),
        ({"eval": {"profile": ["llama-7b-a100"], "workload": {"source": "embedded:azure-conv", "profiles": ["llama-7b-a100", "llama-7b-a10O"]}}}, "eval.workload embedded:azure-conv: profiles names 'llama-7b-a10O', which is not one of eval.profile"),
        ({"eval": {"profile": ["llama-7b-a100", "llama-7b-a100"], "workload": {"source": "embedded:azure-conv"}}}, "eval.profile: a profile named twice"),
        ({"policy_kwargs": {"net_arch": {"pi": [8], "qf": [8]}}}, r"policy_kwargs.net_arch: unknown key\(s\) \['qf'\]; PPO reads pi"),
        ({"env_kwargs": {"profile": "no-such-gpu"}}, "env_kwargs: .*no-such-gpu"),
        ({"env_kwargs": {"observation_fields": ["waiting", "queue_mood"]}}, r"env_kwargs: observation fields .*unknown: \['queue_mood'\]"),
        ({"env_kwargs": {"observation_fields": ["waiting", "waiting"]}}, "env_kwargs: observation fields .*once"),
        ({"env_kwargs": {"observation_fields": "waiting"}}, "env_kwargs.observation_fields: 'waiting' is not"),
        ({"env_kwargs": {"profile": {"llama-7b-a100": "high"}}}, "env_kwargs.profile: llama-7b-a100: 'high' is not of type float"),
        ({"env_kwargs": {"profile": {"llama-7b-a100": -1}}}, "env_kwargs: profile 'llama-7b-a100': weight must be a number > 0, got -1"),
        ({"eval": {"profile": "no-such-gpu", "workload": {"source": "embedded:gsm8k"}}}, "eval.profile: .*no-such-gpu"),
        ({"eval": {"profile": ["llama-7b-a100"], "workload": [{"source": "embedded:gsm8k"}, {"arrival": "replay"}]}}, r"eval.workload\[1\]: needs a source"),
        ({"eval": {"profile": ["llama-7b-a100"], "workload": [{"source": "embedded:gsm8k", "profiles": ["llama-2-70b-a100x4"]}]}}, r"eval.workload embedded:gsm8k: its profiles \['llama-2-70b-a100x4'\] name none of eval.profile"),
        ({"eval": {"profile": [], "workload": {"source": "embedded:gsm8k"}}}, "eval.profile: needs a profile name"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:gsm8k"}}}, r"eval.workload \{'source': 'embedded:gsm8k'\} on llama-7b-a100: embedded:gsm8k has no timestamps"),
        ({"env_kwargs": {"workload": [{"source": "embedded:sharegpt", "profiles": "llama-3-8b-a100"}]}}, r"workload 0 \(embedded:sharegpt\): profiles names 'llama-3-8b-a100', which is not one of the env's profiles \['llama-7b-a100'\]"),
        ({"n_envs": "two"}, "n_envs: 'two' is not of type int"),
        ({"n_envs": 100_000}, r"n_envs: 100000 is outside \[1, 64\]"),
        ({"normalize": "maybe"}, "normalize: 'maybe' is not true or false"),
        ({"env_kwargs": {"control_interval_iters": 2.5}}, "env_kwargs.control_interval_iters: 2.5 is not of type int"),
        ({"env_kwargs": {"slo": 5}}, "env_kwargs.slo: 5 is not of type str"),
        ({"max_episode_steps": float("inf")}, "max_episode_steps: inf is not of type int"),
        ({"n_timesteps": 1e16}, r"n_timesteps: 1e\+16 is too large for a count \(past 2\^53\)"),  # 'not of type int'
        ({"n_timesteps": 2.5}, "n_timesteps: 2.5 is not of type int"),
        (
            {"env_kwargs": {"workload": {"source": "embedded:azure-conv", "num_requests": 1e16}}},
            r"num_requests: 1e\+16 is outside \[1, ",  # was 'not a whole number'
        ),
        ({"policy_kwargs": {"net_arch": ["a"]}}, "policy_kwargs.net_arch"),
        ({"policy_kwargs": {"activation_fn": "nn.ReLU"}}, "policy_kwargs.activation_fn: 'nn.ReLU'"),
        ({"policy_kwargs": {"netarch": [8]}}, "did you mean 'net_arch'"),
        ({"n_steps": 1}, "n_steps x n_envs is 1"),
        ({"batch_size": 100_000}, r"batch_size: 100000 is more than a rollout \(n_steps x n_envs = 32\)"),
        ({"n_timesteps": 1}, r"n_timesteps: 1 is less than a rollout \(n_steps x n_envs = 32\)"),
        ({"env_kwargs": {"control_interval_s": 0}}, "env_kwargs: control_interval_s must be a number of seconds in \\[0.001, 3600\\], got 0"),
        ({"env_kwargs": {"control_interval_s": -1}}, "env_kwargs: control_interval_s must be a number of seconds in \\[0.001, 3600\\], got -1"),
        ({"env_kwargs": {"control_interval_s": float("inf")}}, "env_kwargs.control_interval_s: inf is not finite"),  # was "not of type float | None"
        ({"env_kwargs": {"control_interval_s": float("nan")}}, "env_kwargs.control_interval_s: nan is not finite"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:gsm8k"}, "seeds": list(range(1001))}},
         "eval.seeds: 1,001 seeds; at most 1,000"),  # blamed on YAML anchors past 100,000
        ({"eval": {}}, "eval: an empty block"),  # was read as no evaluation, unsaid
        ({"imitation": {"teacher": "mpc", "stakes_knobs": ["budget", "budget"]}},
         r"stakes_knobs: a knob given twice in \['budget', 'budget'\]"),  # kept twice
        ({"env_kwargs": {"control_interval_s": None, "control_interval_iters": 0}}, "env_kwargs: control_interval_iters must be a whole number in \\[1, 1,000,000\\], got 0"),
        ({"env_kwargs": {"control_interval_iters": 0}}, "env_kwargs: control_interval_iters must be a whole number in \\[1, 1,000,000\\], got 0"),
        ({"env_kwargs": {"control_interval_s": 0.5, "control_interval_iters": 4}}, r"env_kwargs: set one of control_interval_s \(0.5\) and control_interval_iters \(4\), not both"),
        ({1: 2}, r"1: unknown key 1 \(not a batchpilot setting nor a PPO argument\)"),
        ({"env_kwargs": {None: 2}}, r"env_kwargs.None: unknown key None \(a keyword of"),
        ({"policy_kwargs": {True: 2}}, r"policy_kwargs.True: unknown key True \(a policy keyword\)"),
        ({"eval": {"profile": "llama-7b-a100", "workload": ["embedded:gsm8k"]}}, "eval.workload: an entry: 'embedded:gsm8k' is not a mapping"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:azure-conv"}, "seeds": []}}, "eval.seeds: needs at least one seed"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:azure-conv"}, "seeds": [1000, -1]}}, "eval.seeds: an entry: -1 is outside"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:azure-conv"}, "seeds": [1, 2, 1]}}, r"eval.seeds: a seed given twice in \[1, 2, 1\]"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": "embedded:azure-conv"}, "seeds": [True]}}, "eval.seeds: an entry: True is not of type int"),
        ({"env_kwargs": {"engine_kwargs": {"foo": 1}}}, "env_kwargs: engine_kwargs: .*unexpected keyword argument 'foo'"),
        ({"env_kwargs": {"engine_kwargs": {"scheduler": "v9"}}}, "env_kwargs: engine_kwargs: scheduler must be one of"),
        # an unpacking error once training had begun; the others were taken silently
        ({"env_kwargs": {"engine_kwargs": {"length_prior": [1, 2]}}}, r"length_prior \[1, 2\]: need 4 numbers"),
        ({"env_kwargs": {"engine_kwargs": {"length_prior": [1, 1, -5, 1]}}}, "the means must be finite and > 0"),
        ({"env_kwargs": {"engine_kwargs": {"fast_forward": "no"}}}, "fast_forward must be true or false, got 'no'"),
        # an empty list meant every profile; an empty source, the working directory
        ({"env_kwargs": {"workload": {"source": "embedded:azure-conv", "profiles": []}}}, "workload spec: profiles is empty"),
        ({"env_kwargs": {"workload": {"source": " "}}}, "workload 0 .* the source is empty"),
        ({"env_kwargs": {"workload": ""}}, "workload 0 .* the source is empty"),
        ({"eval": {"profile": "llama-7b-a100", "workload": {"source": ""}}}, "the source is empty"),
        (
            {"eval": {"profile": "llama-7b-a100", "workload": [
                {"source": "embedded:sharegpt", "arrival": "poisson:2"},
                {"source": "embedded:sharegpt", "arrival": "poisson:2.0", "bad_rows": "error"},
            ]}},
            "eval.workload: entries 0 and 1 are the same workload; it would count twice",
        ),
        # given and read by nothing
        ({"imitation": {"teacher": "alg1", "regret_weight": 2.0}}, "imitation.regret_weight: it weighs the regret labels"),
        ({"imitation": {"teacher": "alg1", "rounds": 1, "beta": 0.9}}, "imitation.beta: only DAgger rounds read it"),
        # a traceback in the first fit, after the teacher's episodes were collected
        (
            {"env_kwargs": {"action_mode": "step"}, "imitation": {"teacher": "alg1", "rounds": 1}},
            "imitation clones a teacher's grid choices: it needs action_mode grid, not 'step'",
        ),
        ({"imitation": {"teacher": "foo"}}, "imitation.teacher: unknown controller 'foo'"),
        ({"imitation": {"teacher": "mpc:horizon=8"}}, "imitation.teacher: mpc: bad argument 'horizon=8'"),
        ({"report": {"suites": ["nonexistent-suite"]}}, "report.suites: unknown suite .*nonexistent-suite.* taken from the config's folder"),
        ({"report": {"suites": ["steady", "missing.yml"]}}, "report.suites: .*missing.yml: no such suite file"),
        ({"report": {"suites": ["steady", "other/steady.yml"]}}, r"report.suites: two suites share a name \(steady, steady\)"),
        ({"report": {"seeds": 3}}, "report.suites: needs at least one suite"),
        ({"report": {"suites": ["steady"], "controllers": "foo"}}, "report.controllers: unknown controller 'foo'"),
        ({"report": {"suites": ["steady"], "controllers": " , "}}, "report.controllers: an empty controller spec between commas"),
        ({"report": {"suites": ["steady"], "controllers": "alg1,,alg2"}}, "report.controllers: an empty controller spec between commas"),
        ({"env_kwargs": {"engine": "vllm", "model": "no/such/dir"}}, "env_kwargs: no/such/dir: not a model directory"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "num_requests": 10**12}}}, r"env_kwargs.workload.num_requests: 1000000000000 is outside \[1, 10000000\]"),
        ({"env_kwargs": {"workload": ["embedded:gsm8k", {"source": "embedded:gsm8k", "num_requests": "600"}]}}, r"env_kwargs.workload\[1\].num_requests: '600' is not a whole number"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "num_requests": 60.5}}}, "env_kwargs.workload.num_requests: 60.5 is not a whole number"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "arrival": "poisson:2", "rate_scale": "15"}}}, r"env_kwargs: workload spec: rate_scale must be \[lo, hi\] \(two numbers\), got '15'"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "arrival": "poisson:2", "length_scale": [True, True]}}}, r"workload spec: length_scale must be \[lo, hi\] \(two numbers\)"),
        ({"env_kwargs": {"workload": {"source": "embedded:gsm8k", "arrival": "poisson:1e-300"}}}, r"env_kwargs: workload 0 .*poisson arrivals: rate \(req/s\) must be in"),
    ],
)
def test_bad_config_is_refused_by_key_and_file(tmp_path: Path, capsys, change, message) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | change}))
    out = tmp_path / "run"
    assert main(["train", "--config", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err
    assert re.search(message, err), err
    assert "Traceback" not in err
    assert not out.exists()  # nothing written: a corrected config starts cleanly


def test_a_real_engine_config_is_checked_before_the_engine_starts(tmp_path: Path) -> None:
    """vLLM starts at the first reset; its config's workloads are drawn at load all the same."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    env = {"engine": "vllm", "model": str(tmp_path / "model")}
    path = tmp_path / "real.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"env_kwargs": env}}))
    assert load_config(path).env_kwargs["engine"] == "vllm"
    env["workload"] = {"source": "embedded:gsm8k"}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"env_kwargs": env}}))
    with pytest.raises(ValueError, match=r"workload 0 \(embedded:gsm8k @ replay\) .*no timestamps"):
        load_config(path)


def test_an_interval_in_iterations_needs_no_null_seconds(tmp_path: Path) -> None:
    """control_interval_iters alone sets the interval: the seconds' default gives way."""
    path = tmp_path / "iters.yml"
    env = BASE["env_kwargs"] | {"control_interval_iters": 4}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"env_kwargs": env}}))
    cfg = load_config(path)
    assert cfg.control_interval == "4it"
    env = make_env(cfg).unwrapped
    assert (env.control_interval_s, env.control_interval_iters) == (None, 4)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("9" * 5000, "a number has over 4,300 digits"),
        ("2001-13-45", "month must be in 1..12"),
        # a float() or math.isfinite() of it raised OverflowError: a traceback
        ("9" * 400, "line 2: a 400-digit integer, past a float's range"),
        (f"!!int 0x{'f' * 300}", "line 2: a 362-digit integer, past a float's range"),
    ],
)
def test_a_value_yaml_cannot_convert_is_named_with_the_file(
    tmp_path: Path, value: str, message: str
) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(f"batchpilot/Batching-v0:\n  seed: {value}\n")
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: a value YAML cannot convert .*{message}"):
        load_config(path)


def test_the_recorded_interval_is_the_envs_default(tmp_path: Path) -> None:
    """A config that leaves the control interval to the env records the one it trains at."""
    from batchpilot.envs.batching_env import BatchingEnv

    path = tmp_path / "default.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE}))
    assert load_config(path).control_interval == f"{BatchingEnv().control_interval_s * 1e3:g}ms"


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"seed": "x", "n_envs": 0}}))
    with pytest.raises(ValueError) as err:
        load_config(path)
    assert "seed: 'x'" in str(err.value) and "n_envs: 0" in str(err.value)


def test_a_config_that_is_no_file_is_named(tmp_path: Path, capsys) -> None:
    os.mkfifo(tmp_path / "pipe.yml")  # opening it to read would block
    for config, message in (
        (tmp_path / "pipe.yml", "not a regular file (a pipe"),
        (tmp_path, "a directory, not a YAML config"),
    ):
        argv = ["train", "--config", str(config), "--out", str(tmp_path / "run"), "--no-progress"]
        assert main(argv) == 2
        assert f"{config}: {message}" in capsys.readouterr().err


def test_config_not_utf8_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.yml"
    path.write_bytes(b"\xff\xfe\x00batchpilot")
    with pytest.raises(ValueError, match="not UTF-8 text"):
        load_config(path)


def test_every_committed_config_is_found() -> None:
    """The configs the two tests below take: the shipped recipes and the experiments."""
    names = train_configs()
    assert {"quick.yml", "mix-drsb.yml", "mix-drsw.yml", "cpu-tiny.yml"} <= set(names)
    assert "experiments/mix-drsk.yml" in names and "heldout.yml" not in names  # a suite


@pytest.mark.parametrize("name", train_configs())
def test_shipped_configs_pass(name: str) -> None:
    cfg = load_config(Path(str(files("batchpilot.training") / "configs" / name)))
    assert cfg.n_timesteps >= 1 and json.dumps(cfg.env_kwargs)


def test_the_shipped_policys_members_are_what_their_configs_train() -> None:
    """The learned README names the recipes of the shipped policy's four members (two runs of
    mix-drsb.yml, two of mix-drsw.yml): each member (its sidecar entry) observed the entries
    one of them names and trained on its profiles and workloads."""
    root = Path(__file__).resolve().parents[1] / "training"
    sidecar = json.loads((root / "reports/learned/policy.onnx.json").read_text())
    configs = [load_config(root / "configs" / n) for n in ("mix-drsb.yml", "mix-drsw.yml")]
    recipes = [
        (
            list(checked_fields(cfg.env_kwargs.get("observation_fields"))),
            {"profile": cfg.env_kwargs["profile"], "workload": cfg.env_kwargs["workload"]},
        )
        for cfg in configs
    ]
    made_by = []
    for member in sidecar["members"]:
        recipe = (member["observation_fields"], member["trained_on"])
        assert recipe in recipes, member["checkpoint"]
        made_by.append(recipes.index(recipe))
    assert [made_by.count(i) for i in range(len(recipes))] == [2, 2]  # as the README says


def test_a_key_given_twice_is_named(tmp_path: Path) -> None:
    path = tmp_path / "twice.yml"
    path.write_text("batchpilot/Batching-v0:\n  n_envs: 1\n  seed: 1\n  n_envs: 8\n")
    with pytest.raises(ValueError, match=r"duplicate key 'n_envs'"):
        load_config(path)


def test_yaml_merge_keys_read_as_yaml_says(tmp_path: Path) -> None:
    """``<<: *anchor`` takes in the anchor's pairs, as `yaml.safe_load` reads them; a key
    given over a merged one overrides it, one given twice in the mapping itself is refused."""
    path = tmp_path / "merge.yml"
    path.write_text(
        "batchpilot/Batching-v0:\n"
        "  n_envs: 1\n  n_timesteps: 64\n  n_steps: 32\n"
        "  env_kwargs:\n"
        "    profile: llama-7b-a100\n"
        "    workload:\n"
        "      - &w {source: embedded:gsm8k, num_requests: 20, arrival: 'poisson:1'}\n"
        "      - {<<: *w, source: embedded:sharegpt}\n"
    )
    gsm8k = {"source": "embedded:gsm8k", "num_requests": 20, "arrival": "poisson:1"}
    assert load_config(path).env_kwargs["workload"] == [
        gsm8k,
        gsm8k | {"source": "embedded:sharegpt"},
    ]
    path.write_text("base: &b {n_envs: 1}\nbatchpilot/Batching-v0: {<<: *b, seed: 1, seed: 2}\n")
    with pytest.raises(
        ValueError, match=re.escape(f"{path}:2:43: not valid YAML (duplicate key 'seed')")
    ):
        load_config(path)


def test_counts_written_as_rl_zoo3_floats_are_read_as_ints(tmp_path: Path) -> None:
    """rl-zoo3 writes ``n_timesteps: !!float 1e6``, and YAML reads ``1e6`` as a float: a
    count was refused as "not a whole number". A whole float is now that int, a fraction
    still refused by name."""
    path = tmp_path / "zoo.yml"
    body = (
        "batchpilot/Batching-v0:\n"
        "  n_timesteps: !!float 2048\n  n_steps: 6.4e1\n  batch_size: {batch}\n  seed: 3.0\n"
        "  n_envs: 2\n"
        "  env_kwargs: {{profile: llama-7b-a100, workload: {{source: embedded:gsm8k, "
        "num_requests: 20, arrival: 'poisson:1'}}}}\n"
    )
    path.write_text(body.format(batch="1.28e2"))
    cfg = load_config(path)
    assert (cfg.n_timesteps, cfg.seed, cfg.hyperparams) == (2048, 3, {"n_steps": 64, "batch_size": 128})
    assert all(type(v) is int for v in (cfg.n_timesteps, cfg.seed, *cfg.hyperparams.values()))
    path.write_text(body.format(batch="64.5"))
    with pytest.raises(ValueError, match=r"batch_size: 64\.5 is not of type int"):
        load_config(path)
    path.write_text(body.format(batch="1e300"))  # past 2^53: not turned into 301 digits
    with pytest.raises(ValueError, match=r"batch_size: 1e\+300 is too large for a count \(past 2\^53\)"):
        load_config(path)


def test_nested_counts_written_as_floats_are_read_as_ints(tmp_path: Path) -> None:
    """Only top-level counts were read as ints: ``imitation.rounds: 2.0``, ``eval.freq: 1e4``
    or a workload's ``num_requests: 2e1`` was refused. Whole floats under `imitation`, `eval`
    and `env_kwargs` (lists of ints and workloads' request counts too) are now ints; a
    fraction there is still refused by name."""
    path = tmp_path / "zoo.yml"
    body = (
        "batchpilot/Batching-v0:\n  n_envs: 1\n"
        "  imitation: {{teacher: alg1, rounds: {rounds}, episodes: 1.0, epochs: 3e0}}\n"
        "  eval: {{freq: 1e4, profile: llama-2-7b-a100, seeds: [1.0, 2],\n"
        "         workload: [{{source: embedded:gsm8k, num_requests: 2e1, arrival: 'poisson:1'}}]}}\n"
        "  env_kwargs: {{control_interval_iters: 4.0, workload: {{source: embedded:gsm8k, "
        "num_requests: 2.0e1, arrival: 'poisson:1'}}}}\n"
    )
    path.write_text(body.format(rounds="2.0"))
    cfg = load_config(path)
    assert (cfg.imitation.rounds, cfg.imitation.episodes, cfg.imitation.epochs) == (2, 1, 3)
    assert type(cfg.imitation.rounds) is int and type(cfg.eval["freq"]) is int
    assert cfg.eval["freq"] == 10_000 and cfg.env_kwargs["control_interval_iters"] == 4
    assert cfg.eval["seeds"] == [1, 2] and type(cfg.eval["seeds"][0]) is int
    assert cfg.eval["workload"][0]["num_requests"] == 20 == cfg.env_kwargs["workload"]["num_requests"]
    assert type(cfg.env_kwargs["workload"]["num_requests"]) is int
    path.write_text(body.format(rounds="2.5"))
    with pytest.raises(ValueError, match=r"imitation\.rounds: 2\.5 is not of type int"):
        load_config(path)


def test_yaml_reads_exponents_as_floats_as_yaml_1_2_does(tmp_path: Path) -> None:
    """``1e-4`` and ``1.0e300`` were text (YAML 1.1): a float field refused them and a range
    of two numbers said only that one was not a number. Quoted, they stay text."""
    from batchpilot.training.yaml_files import load_yaml

    path = tmp_path / "f.yml"
    path.write_text("a: 1e-4\nb: [1.0, 1.0e300]\nc: -2E+3\nd: 10\ne: '1e-4'\nf: 1e3ms\ng: .5e3\nh: 1_0e3\n")
    assert load_yaml(path) == {
        "a": 1e-4, "b": [1.0, 1e300], "c": -2000.0, "d": 10, "e": "1e-4", "f": "1e3ms", "g": 500.0, "h": "1_0e3"
    }  # fmt: skip
    assert yaml.safe_load("a: 1e-4") == {"a": "1e-4"}  # PyYAML's own loader is left as it was


def test_yaml_reads_booleans_as_yaml_1_2_does(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML) read ``yes``, ``no``, ``on`` and ``off`` as booleans: ``normalize:
    yes`` was true and ``source: no`` False. Now they are text, which a switch refuses by
    name; true and false are booleans in any case YAML 1.2 allows."""
    from batchpilot.training.yaml_files import load_yaml

    path = tmp_path / "b.yml"
    path.write_text("a: yes\nb: no\nc: true\nd: False\ne: on\nf: TRUE\ng: !!bool yes\n")
    assert load_yaml(path) == {"a": "yes", "b": "no", "c": True, "d": False, "e": "on", "f": True, "g": True}
    path.write_text("batchpilot/Batching-v0:\n  n_envs: 1\n  normalize: yes\n")
    with pytest.raises(ValueError, match=r"normalize: 'yes' is not true or false"):
        load_config(path)


def test_a_yaml_file_that_cannot_be_read_is_named(tmp_path: Path, monkeypatch) -> None:
    """A read that fails past the file checks (a disk error, EIO) said only "[Errno 5]
    Input/output error"."""
    import errno

    from batchpilot.training.yaml_files import load_yaml

    def fail(*args, **kwargs):
        raise OSError(errno.EIO, "Input/output error")

    path = tmp_path / "c.yml"
    path.write_text("a: 1\n")
    monkeypatch.setattr(Path, "read_text", fail)
    with pytest.raises(ValueError, match=r"c\.yml: cannot be read \(Input/output error\)$"):
        load_yaml(path)


def test_yaml_reads_whole_numbers_as_yaml_1_2_does(tmp_path: Path) -> None:
    """YAML 1.1 (PyYAML) read ``num_requests: 017`` as 15 (octal) and ``1:20`` as 80
    (base 60), and took ``1_000`` and ``0x10``: now 17, and text that a number field refuses
    by name."""
    from batchpilot.training.yaml_files import load_yaml

    path = tmp_path / "i.yml"
    path.write_text("a: 017\nb: 1:20\nc: 1_000\nd: 0x10\ne: -5\nf: +5\ng: 1:20.5\nh: !!int 0x10\n")
    assert load_yaml(path) == {
        "a": 17, "b": "1:20", "c": "1_000", "d": "0x10", "e": -5, "f": 5, "g": "1:20.5", "h": 16
    }  # fmt: skip
    assert yaml.safe_load("a: 017\nb: 1:20") == {"a": 15, "b": 80}  # PyYAML's own: as it was


@pytest.mark.parametrize(
    ("text", "duplicate"),
    [
        # a mapping merged into another is flattened first: its merged keys are not its own
        ("b: &b {x: 1}\nt: {a: &m {<<: *b, x: 2}, <<: *m}\n", None),
        ("t: {<<: {x: 1, x: 2}, y: 3}\n", "x"),  # an inline merge source is checked too
        ("t: {<<: [{x: 1}, {y: 2, y: 3}]}\n", "y"),
    ],
)
def test_merged_mappings_are_checked_for_their_own_keys(
    tmp_path: Path, text: str, duplicate: str | None
) -> None:
    from batchpilot.training.yaml_files import load_yaml

    path = tmp_path / "m.yml"
    path.write_text(text)
    if duplicate is None:
        assert load_yaml(path) == yaml.safe_load(text)
    else:
        with pytest.raises(ValueError, match=f"duplicate key '{duplicate}'"):
            load_yaml(path)


@pytest.mark.parametrize(
    ("text", "where", "problem"),
    [
        (
            "a: [1, 2\nb: 3\n",
            "2:2",
            "while parsing a flow sequence, expected ',' or ']', but got ':'",
        ),
        ("a: 1\n  b: 2\n", "2:4", "mapping values are not allowed here"),
        ("a: *nope\n", "1:4", "found undefined alias 'nope'"),
        ("a: 1\nb: \x07\n", "2:4", "character #x0007: special characters are not allowed"),
        (
            "a: {<<: 5}\n",
            "1:9",
            "while constructing a mapping, expected a mapping or list of mappings for merging, but found scalar",
        ),
        ("a: 1\na: 2\n", "2:1", "duplicate key 'a'"),
    ],
)
def test_a_yaml_error_is_one_line_naming_the_file(
    tmp_path: Path, text: str, where: str, problem: str
) -> None:
    path = tmp_path / "bad.yml"
    path.write_text(text)
    with pytest.raises(ValueError) as info:
        load_config(path)
    assert str(info.value) == f"{path}:{where}: not valid YAML ({problem})"


def test_a_chain_of_merge_keys_is_refused_before_it_expands(tmp_path: Path) -> None:
    """Each mapping that merges the one before copies its pairs: 3,000 lines would build
    4.5 million; the copying stops past the values any file may hold."""
    lines = ["m0: &m0 {k0: 0}"] + [
        f"m{i}: &m{i} {{<<: *m{i - 1}, k{i}: {i}}}" for i in range(1, 3000)
    ]
    path = tmp_path / "chain.yml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(
        ValueError,
        match=re.escape(f"{path}: holds more than 100,000 values once its aliases are expanded"),
    ):
        load_config(path)


def test_a_report_suites_unreadable_trace_is_refused_before_training(tmp_path: Path) -> None:
    """The report runs after training: its suites' trace files are read when the config is
    loaded, so a bad one costs no training run."""
    trace = tmp_path / "twice.csv"
    trace.write_text(
        "ContextTokens,GeneratedTokens,TIMESTAMP,ContextTokens\n1,2,2023-11-16 18:15:46,3\n"
    )
    suite = tmp_path / "bad-trace.yml"
    suite.write_text(
        f"scenarios:\n  - {{name: b, source: {trace}, arrival: replay, num_requests: 20}}\n"
    )
    path = tmp_path / "report.yml"
    path.write_text(
        yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"report": {"suites": [suite.name]}}})
    )
    message = (
        f"{path}: report.suites: {suite}: scenarios[0] (b): {trace}:1: the header names column(s)"
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        load_config(path)


def test_a_report_that_could_not_name_the_policy_is_refused_before_training(
    tmp_path: Path, capsys
) -> None:
    """The report names the exported policy in a controller spec, where '+' joins two: an
    output directory holding one fails at once, not after training."""
    path = tmp_path / "report.yml"
    path.write_text(
        yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"report": {"suites": ["steady"]}}})
    )
    out = tmp_path / "r+x"
    assert main(["train", "--config", str(path), "--out", str(out), "--no-progress"]) == 2
    assert f"policy path {out / 'policy.onnx'}: ',' separates" in capsys.readouterr().err
    assert not out.exists()


def test_ppo_settings_off_by_null_are_accepted(tmp_path: Path) -> None:
    """SB3's own defaults for target_kl and clip_range_vf are None (off)."""
    path = tmp_path / "null.yml"
    path.write_text(
        yaml.safe_dump(
            {"batchpilot/Batching-v0": BASE | {"target_kl": None, "clip_range_vf": None}}
        )
    )
    cfg = load_config(path)
    assert cfg.hyperparams["target_kl"] is None and cfg.hyperparams["clip_range_vf"] is None


def test_huge_layers_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "wide.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"policy_kwargs": {"net_arch": [10**9]}}}))
    with pytest.raises(ValueError, match=r"policy_kwargs.net_arch: layer sizes \[1000000000\]"):
        load_config(path)


def test_an_unshared_features_extractor_is_refused_before_training(tmp_path: Path) -> None:
    """The export's forward read one extractor: a run trained so was a traceback at export
    (and at the config's report)."""
    path = tmp_path / "unshared.yml"
    kwargs = {"net_arch": [8], "share_features_extractor": False}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"policy_kwargs": kwargs}}))
    with pytest.raises(ValueError, match="share_features_extractor: false is not supported"):
        load_config(path)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        # a traceback building PPO
        ({"betas": [0.9]}, r"optimizer_kwargs: torch's Adam refused it \(\w+Error"),
        # tracebacks at the first PPO update, after the whole imitation phase; one trained
        # uphill in silence
        ({"capturable": True}, r"optimizer_kwargs.capturable: true is not supported"),
        ({"differentiable": True}, r"optimizer_kwargs.differentiable: true is not supported"),
        ({"maximize": True}, r"optimizer_kwargs.maximize: true is not supported"),
        ({"lr": 0.1}, r"optimizer_kwargs: lr: PPO.s to set"),
    ],
)
def test_optimizer_options_adam_or_ppo_would_refuse_are_named_up_front(
    tmp_path: Path, options: dict, message: str
) -> None:
    path = tmp_path / "adam.yml"
    kwargs = {"net_arch": [8], "optimizer_kwargs": options}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"policy_kwargs": kwargs}}))
    with pytest.raises(ValueError, match=message):
        load_config(path)
    kwargs["optimizer_kwargs"] = {"eps": 1e-5, "betas": [0.9, 0.99], "amsgrad": True}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"policy_kwargs": kwargs}}))
    assert load_config(path).hyperparams["policy_kwargs"]["optimizer_kwargs"]["amsgrad"] is True


@pytest.mark.parametrize(
    ("net_arch", "count"),
    [
        ([65536, 65536], "8.59e+09"),
        ([4096] * 200, "6.68e+09"),
        ({"pi": [8], "vf": [20000] * 2}, "4.01e+08"),
    ],
)
def test_a_policy_too_big_in_all_is_refused(tmp_path: Path, capsys, net_arch, count: str) -> None:
    """Layers each within MAX_LAYER can still ask for gigabytes in all: refused by the total
    count of parameters before anything is allocated (torch once raised a RuntimeError for
    16 GiB, or the machine ran out of memory)."""
    path = tmp_path / "big.yml"
    path.write_text(
        yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"policy_kwargs": {"net_arch": net_arch}}})
    )
    out = tmp_path / "run"
    assert main(["train", "--config", str(path), "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert (
        f"{path}: policy_kwargs.net_arch: a policy of {count} parameters, over the 100,000,000 limit"
        in err
    ), err
    assert not out.exists()


@pytest.mark.parametrize(
    ("action_space", "n_outputs"),
    [("grid", 25), ("box", 2)],
)
@pytest.mark.parametrize("net_arch", [None, [64, 64], [], {"pi": [32], "vf": [16, 8]}, {"pi": [5]}])
def test_the_parameter_count_is_sb3s(action_space: str, n_outputs: int, net_arch) -> None:
    """`policy_parameters` counts what SB3 builds: both networks and both heads (a Box
    action's log_std aside)."""
    import numpy as np
    from gymnasium import spaces
    from stable_baselines3 import PPO

    from batchpilot.agents.checkpoint import policy_parameters

    obs = spaces.Box(-1, 1, (21,), np.float32)
    act = (
        spaces.MultiDiscrete([17, 8])
        if action_space == "grid"
        else spaces.Box(-1, 1, (2,), np.float32)
    )
    kwargs = {} if net_arch is None else {"net_arch": net_arch}
    policy = PPO.policy_aliases["MlpPolicy"](obs, act, lambda _: 0.0, **kwargs)
    log_std = 0 if action_space == "grid" else n_outputs
    assert (
        policy_parameters(net_arch, 21, n_outputs)
        == sum(p.numel() for p in policy.parameters()) - log_std
    )


def test_an_slo_with_no_objective_is_refused(tmp_path: Path) -> None:
    """Goodput, the reward and the evaluation's score, needs an objective: `--slo ''` is
    refused, and so is a config's."""
    path = tmp_path / "slo.yml"
    path.write_text(
        yaml.safe_dump(
            {"batchpilot/Batching-v0": BASE | {"env_kwargs": BASE["env_kwargs"] | {"slo": ""}}}
        )
    )
    with pytest.raises(
        ValueError, match=f"{re.escape(str(path))}: env_kwargs: slo names no objective"
    ):
        load_config(path)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        (
            ["waiting", "running", "waiting", "running", "kv_fit"],
            r"observation fields name \['waiting', 'running'\] more than once; name each once",
        ),
        (
            [*checked_fields(None), "queue_mood"],
            r"observation fields name entries this version does not compute \(unknown: \['queue_mood'\]\); known: kv_cache_usage, ",
        ),
        ([], "observation fields name none; name at least one"),
    ],
)
def test_bad_observation_fields_are_named_briefly(
    tmp_path: Path, fields: list[str], message: str
) -> None:
    """The entries given twice or unknown are named, without repeating the whole list (a
    duplicate once gave 2 kB naming none)."""
    path = tmp_path / "fields.yml"
    env = BASE["env_kwargs"] | {"observation_fields": fields}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"env_kwargs": env}}))
    with pytest.raises(ValueError, match=f"{re.escape(str(path))}: env_kwargs: {message}") as err:
        load_config(path)
    assert len(str(err.value)) - len(str(path)) < 600


def test_train_refuses_an_out_that_is_a_file_or_a_seed_given_twice(tmp_path: Path, capsys) -> None:
    """`--out FILE` said "[Errno 17] File exists" after the config was read; `--seed 1 1`
    trained one run, straight into OUT, and said nothing."""
    config = str(Path(__file__).parents[1] / "training/configs/quick.yml")
    taken = tmp_path / "taken"
    taken.write_text("")
    assert main(["train", "--config", config, "--out", str(taken)]) == 2
    assert f"--out {taken}: is a file, not a directory" in capsys.readouterr().err
    out = tmp_path / "run"
    assert main(["train", "--config", config, "--out", str(out), "--seed", "1", "2", "1"]) == 2
    assert "--seed: 1 given twice; give each seed once" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize(
    ("value", "annotation", "problem"),
    [
        (float("nan"), float | None, "nan is not finite"),  # was "is not of type float | None"
        ([1, "x"], tuple[float, float] | None, "an entry: 'x' is not of type float"),
        ({"a": "high"}, str | dict[str, float], "a: 'high' is not of type float"),
        ("a", int | None, "'a' is not of type int | None"),  # no member of its kind: the union
    ],
)
def test_a_union_names_the_problem_of_the_member_of_the_values_kind(
    value: object, annotation: object, problem: str
) -> None:
    from batchpilot.agents.schema import type_problem

    assert type_problem(value, annotation) == problem


def test_the_evaluation_runs_on_the_engine_trained_on(tmp_path: Path) -> None:
    """`eval:` scored every run on the default (V1) scheduler whatever engine_kwargs trained
    on: the best checkpoint was chosen, and its goodput reported, on another engine."""
    from batchpilot.baselines.specs import make_controller
    from batchpilot.envs.controller import ControlInterval
    from batchpilot.envs.metrics import SLO
    from batchpilot.envs.profiles import get_profile
    from batchpilot.envs.run import run
    from batchpilot.envs.sim_engine import SimEngine
    from batchpilot.training.train import _eval_scenario

    workload = {"source": "embedded:azure-conv", "arrival": "poisson:20", "num_requests": 60}
    body = BASE | {
        "env_kwargs": BASE["env_kwargs"] | {"engine_kwargs": {"scheduler": "v0"}},
        "eval": {"profile": "llama-7b-a100", "workload": workload, "seeds": [1000]},
    }
    path = tmp_path / "v0.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body}))
    ev = _eval_scenario(load_config(path), "ttft:2000,tpot:50")
    assert ev.engine_kwargs == {"scheduler": "v0"}
    scored = ev.score(lambda: make_controller("static:64"))["output_goodput"]
    profile = get_profile("llama-7b-a100")
    direct = {
        scheduler: run(
            ev._workload(workload, 1000, profile.max_model_len),
            SimEngine(profile, slo=SLO.parse("ttft:2000,tpot:50"), scheduler=scheduler),
            make_controller("static:64"),
            ControlInterval.parse(ev.interval),
        ).metrics()["output_goodput"]
        for scheduler in ("v0", "v1")
    }
    assert direct["v0"] != direct["v1"] and scored == pytest.approx(direct["v0"])
    # a vLLM run's engine keywords are vLLM's: its evaluation runs the default simulator
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text("{}")
    real = {"engine": "vllm", "model": str(tmp_path / "model"), "engine_kwargs": {"clock": "sim"}}
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"env_kwargs": real}}))
    assert _eval_scenario(load_config(path), "ttft:2000,tpot:50").engine_kwargs == {}


def test_a_reports_counts_and_all_are_read_as_the_command_line_reads_them(tmp_path: Path) -> None:
    """``report.seeds: 1e1`` was refused as a float (other counts are read as ints when whole)
    and ``report.suites: [all]`` as a file beside the config named 'all'."""
    from batchpilot.training.suite import suite_names
    from batchpilot.training.train import _report_suites

    path = tmp_path / "r.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": BASE | {"report": {"suites": ["all"], "seeds": 1e1}}}))
    cfg = load_config(path)
    assert cfg.report["seeds"] == 10 and isinstance(cfg.report["seeds"], int)
    assert _report_suites(cfg.report) == list(suite_names())


def test_a_trace_shorter_than_asked_is_noted(tmp_path: Path, traces: Path, capsys) -> None:
    """Every episode and evaluation run took the whole trace, silently (compare notes it)."""
    gsm8k = str(traces / "gsm8k" / "gsm8k_test_token_lengths.csv")
    workload = {"source": gsm8k, "arrival": "poisson:50", "num_requests": 5000}
    body = BASE | {
        "env_kwargs": BASE["env_kwargs"] | {"workload": workload},
        "eval": {"profile": "llama-7b-a100", "workload": workload, "seeds": [1000]},
    }
    path = tmp_path / "short.yml"
    path.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body}))
    load_config(path)
    out = capsys.readouterr().out
    assert f"note: workload 0 ({gsm8k}): the trace holds 1,319 requests, fewer than the 5,000" in out
    assert f"note: eval workload {gsm8k}: the trace holds 1,319 requests" in out
