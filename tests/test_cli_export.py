"""No code runs from a file a user was handed: run directories hold data only (JSON and
safetensors), export and --resume never unpickle, and a policy sidecar is sealed and
range-checked."""

from __future__ import annotations

import json
import logging
import math
import os
import pickle
import re
import shutil
import stat
from pathlib import Path

import pytest
import yaml

pytest.importorskip("stable_baselines3")
pytest.importorskip("onnx")

from batchpilot.agents.checkpoint import CheckpointError, normalisation
from batchpilot.agents.policy import (
    PolicyFileError,
    action_layout,
    load_policy,
    seal,
    sidecar_path,
)
from batchpilot.envs.observation import OBSERVATION_FIELDS
from batchpilot.training.cli import main

CONFIG = {
    "batchpilot/Batching-v0": {
        "n_envs": 1,
        "n_timesteps": 64,
        "env_kwargs": {
            "profile": ["llama-7b-a100"],
            "workload": [{"source": "embedded:azure-conv", "num_requests": 30}],
            "slo": "ttft:2000,tpot:50",
            "control_interval_s": None,
            "control_interval_iters": 1,
        },
        "checkpoint_freq": 32,
        "n_steps": 32,
        "batch_size": 32,
        "n_epochs": 1,
        "policy_kwargs": {"net_arch": [8]},
    }
}


class Boom:
    """A pickle that, when loaded, writes `marker` (stands for any command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "code ran"))


def plant(directory: Path, marker: Path) -> None:
    """The pickles SB3 would write, crafted to run code when unpickled."""
    directory.mkdir(parents=True, exist_ok=True)
    for name in ("vecnormalize.pkl", "model.zip"):
        (directory / name).write_bytes(pickle.dumps(Boom(marker)))


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("run")
    config = root / "c.yml"
    config.write_text(yaml.safe_dump(CONFIG))
    assert (
        main(["train", "--config", str(config), "--out", str(root / "run"), "--seed", "7",
              "--no-progress"]) == 0
    )
    return root / "run"


def test_the_seed_option_is_the_runs_seed(run_dir: Path, capsys) -> None:
    assert json.loads((run_dir / "run.json").read_text())["seed"] == 7
    with pytest.raises(SystemExit):
        main(["train", "--config", "c.yml", "--out", "x", "--seed", "-1"])
    assert "-1 is out of range" in capsys.readouterr().err


def test_the_run_names_the_entries_it_observed(run_dir: Path) -> None:
    """A config that leaves the observation to its default (which grows as entries are
    added) still records the entries its run observed, where export reads them."""
    assert "observation_fields" not in CONFIG["batchpilot/Batching-v0"]["env_kwargs"]
    env = json.loads((run_dir / "run.json").read_text())["env_kwargs"]
    assert env["observation_fields"] == list(OBSERVATION_FIELDS)


@pytest.fixture(scope="module")
def policy(run_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("policy") / "p.onnx"
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", str(out)]) == 0
    return out


def test_a_run_directory_holds_no_pickle(run_dir: Path) -> None:
    assert not [p for p in run_dir.rglob("*") if p.suffix in (".pkl", ".zip", ".pth")]
    assert (run_dir / "final" / "vecnormalize.json").is_file()


def test_export_never_unpickles_a_planted_file(run_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    marker = tmp_path / "pwned"
    plant(run / "final", marker)
    assert (
        main(["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]) == 0
    )
    assert not marker.exists()


def test_resume_never_unpickles_a_planted_file(run_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    marker = tmp_path / "pwned"
    for ckpt in (run / "checkpoints").iterdir():
        plant(ckpt, marker)
    data = json.loads(json.dumps(CONFIG))
    data["batchpilot/Batching-v0"]["n_timesteps"] = 96
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump(data))
    argv = ["train", "--config", str(config), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 0
    assert not marker.exists()
    state = json.loads((run / "final" / "checkpoint.json").read_text())
    assert state["num_timesteps"] >= 96


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"env_kwargs": {"slo": "ttft:500,tpot:20"}}, "env_kwargs.slo"),
        ({"env_kwargs": {"observation_fields": ["kv_usage_trend", "kv_cache_usage"]}},
         "env_kwargs.observation_fields"),
        ({"normalize": False}, "normalize"),
    ],
)
def test_resume_refuses_a_config_other_than_the_runs(
    run_dir: Path, tmp_path: Path, capsys, change: dict, named: str
) -> None:
    """A resume with another config rewrote run.json from it: the trained network was then
    exported with its inputs in another order and another SLO, and a resume that trained went
    on in another environment: the network, its inputs, environment and warm start stay."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    before = (run / "run.json").read_bytes()
    body = json.loads(json.dumps(CONFIG))["batchpilot/Batching-v0"]
    for key, value in change.items():
        body[key] = body[key] | value if isinstance(value, dict) else value
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"n_timesteps": 96}}))
    argv = ["train", "--config", str(config), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"--resume: {config} differs from the run's {run}/config.yml in {named}" in err, err
    assert (run / "run.json").read_bytes() == before


def test_resume_takes_defaults_written_out_and_other_settings_and_keeps_the_seed(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A default written out, keys in another order, PPO's settings and the evaluation may
    change on a resume (the last with a note); a resume without --seed keeps the run's seed
    (it took the config's, and run.json said so)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    body = json.loads(json.dumps(CONFIG))["batchpilot/Batching-v0"]
    body = dict(reversed(list(body.items()))) | {"normalize": True, "n_timesteps": 96}
    body["env_kwargs"] = body["env_kwargs"] | {"w_recompute": 0.5}  # the env's default
    body |= {"learning_rate": 1e-4, "eval": {"profile": "llama-7b-a100", "freq": 32,
             "workload": {"source": "embedded:gsm8k", "arrival": "poisson:2", "num_requests": 10}}}  # fmt: skip
    config = tmp_path / "c.yml"
    config.write_text("# reordered, with defaults\n" + yaml.safe_dump({"batchpilot/Batching-v0": body}))
    argv = ["train", "--config", str(config), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "evaluates otherwise than the run's" in capsys.readouterr().out
    assert json.loads((run / "run.json").read_text())["seed"] == 7  # run_dir's --seed 7


def test_resume_with_a_kept_config_that_is_no_config_is_named(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """An empty config.yml in the run was an AttributeError traceback."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "config.yml").write_text("")
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump(CONFIG))
    argv = ["train", "--config", str(config), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 2
    assert f"{run}/config.yml: expected one top-level key" in capsys.readouterr().err


def test_resume_says_which_cut_short_checkpoints_it_passes_over(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A newest checkpoint without its weights (a save cut short) was passed over, and the
    run trained again from an older one without a word."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    newest = max((run / "checkpoints").glob("step_*"), key=lambda p: int(p.name[5:]))
    (newest / "policy.safetensors").unlink()
    (run / "final" / "policy.safetensors").unlink()  # its final save cut short too
    (run / "checkpoints" / "step_99999").mkdir()
    argv = ["train", "--config", str(run / "config.yml"), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "passed over (no checkpoint.json or policy.safetensors" in out
    assert f"{newest.name}, step_99999 passed over" in out


def test_resume_goes_on_from_a_final_state_newer_than_any_checkpoint(
    tmp_path: Path, capsys
) -> None:
    """A run ended between periodic checkpoints was trained again from the last one and its
    final state replaced; one that ended before its first could be neither resumed nor
    started again (two errors, each sending to the other)."""
    from batchpilot.agents.checkpoint import read_state

    body = CONFIG["batchpilot/Batching-v0"]
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"n_timesteps": 48}}))
    run = tmp_path / "run"
    argv = ["train", "--config", str(config), "--out", str(run), "--no-progress"]
    assert main(argv) == 0  # rollouts of 32 steps: checkpoints at 32 and 64, final at 64
    shutil.rmtree(run / "checkpoints" / "step_64")  # as a run ended between checkpoints
    weights = (run / "final" / "policy.safetensors").read_bytes()
    assert main([*argv, "--resume"]) == 0
    assert "already at 64 steps, n_timesteps is 48: nothing to train" in capsys.readouterr().out
    assert (run / "final" / "policy.safetensors").read_bytes() == weights
    shutil.rmtree(run / "checkpoints")  # as a run shorter than its checkpoint_freq leaves it
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"n_timesteps": 80}}))
    assert main([*argv, "--resume"]) == 0
    assert read_state(run / "final")["num_timesteps"] == 96


def test_an_old_pickle_only_run_is_refused_by_name(tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    marker = tmp_path / "pwned"
    plant(run / "best", marker)
    (run / "run.json").write_text(json.dumps({"env_kwargs": {}}))
    assert main(["export", str(run), "--out", str(tmp_path / "p.onnx")]) == 2
    assert "checkpoint.json does not exist" in capsys.readouterr().err
    assert not marker.exists()


def test_a_normalisation_file_that_is_a_directory_is_named_so(tmp_path: Path) -> None:
    """It was taken for no normalisation at all."""
    (tmp_path / "vecnormalize.json").mkdir()
    with pytest.raises(CheckpointError, match=r"vecnormalize\.json: a directory, not a file of"):
        normalisation(tmp_path, 3)
    assert normalisation(tmp_path / "none", 3)[3] == math.inf  # a missing file: none
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "vecnormalize.json").symlink_to(tmp_path / "gone.json")
    with pytest.raises(CheckpointError, match=r"vecnormalize\.json: a broken symlink"):
        normalisation(tmp_path / "broken", 3)


def test_a_checkpoint_file_that_is_a_directory_is_named_so(tmp_path: Path) -> None:
    """It was reported as missing ("does not exist")."""
    from batchpilot.agents.checkpoint import CheckpointError, read_state

    (tmp_path / "checkpoint.json").mkdir()
    with pytest.raises(CheckpointError, match=r"checkpoint\.json: a directory, not a file of"):
        read_state(tmp_path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"obs_var": "abc"}, "obs_var is missing or not a list of numbers"),
        ({"obs_mean": [0.0]}, "obs_mean must be"),
        ({"clip_obs": -1}, "clip_obs"),
        ({"norm_obs": "yes"}, "norm_obs must be true or false"),
        ({"norm_obs": True, "clip_obs": 0}, "clip_obs is 0 with norm_obs on"),
        # exported, a policy that saw one constant observation (one action for every state)
        ({"norm_obs": True, "clip_obs": 1e-300}, "clip_obs is 1e-300 with norm_obs on"),
        # past float32's range: the export's clamp was a torch traceback
        ({"norm_obs": True, "clip_obs": 1e300}, "clip_obs is 1e\\+300 with norm_obs on; need 0.001 to 3.4e\\+38"),
        # exported, weights the loader then named in a temporary file ('std' is NaN or inf)
        ({"norm_obs": True, "epsilon": 1e300}, r"entry 0's sqrt\(obs_var \+ epsilon\) is 1e\+150, outside float32's range"),
        ({"norm_obs": True, "obs_mean": [1e308] * 23}, "entry 0's obs_mean is 1e\\+308, outside float32's range"),
        ({"norm_obs": True, "obs_var": [1e308] * 23, "epsilon": 1e308}, "outside float32's range"),
        # a std that float32 rounds to 0: the exported graph divided by it (NaN actions)
        ({"norm_obs": True, "obs_var": [0.0] * 23, "epsilon": 1e-100}, r"is 1e-50, outside float32's range"),
    ],
)
def test_bad_normalisation_file_is_named(run_dir: Path, tmp_path: Path, edit, message) -> None:
    ckpt = tmp_path / "final"
    shutil.copytree(run_dir / "final", ckpt)
    path = ckpt / "vecnormalize.json"
    data = json.loads(path.read_text())
    n_obs = len(data["obs_mean"])
    path.write_text(json.dumps(data | edit))
    with pytest.raises(CheckpointError, match=message) as err:
        normalisation(ckpt, n_obs)
    assert "vecnormalize.json" in str(err.value)


def test_normalisation_dividing_by_zero_is_refused(run_dir: Path, tmp_path: Path) -> None:
    """A zero variance with epsilon 0 would divide the observation by 0: NaN actions."""
    ckpt = tmp_path / "final"
    shutil.copytree(run_dir / "final", ckpt)
    path = ckpt / "vecnormalize.json"
    data = json.loads(path.read_text())
    n_obs = len(data["obs_mean"])
    path.write_text(json.dumps(data | {"norm_obs": True, "epsilon": 0, "obs_var": [0.0] * n_obs}))
    with pytest.raises(CheckpointError, match=r"entry 0's sqrt\(obs_var \+ epsilon\) is 0, outside"):
        normalisation(ckpt, n_obs)
    path.write_text(json.dumps(data | {"norm_obs": True, "obs_var": [0.0] * n_obs}))
    assert normalisation(ckpt, n_obs)[2] > 0  # SB3's epsilon: the division stays finite


def test_corrupt_weights_are_named(run_dir: Path, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    (run / "final" / "policy.safetensors").write_bytes(b"\x00" * 64)
    assert (
        main(["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]) == 2
    )
    assert "policy.safetensors: not a readable safetensors file" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ("shape", r"1 of another shape, the first: action_net.bias is \(3,\), the model's \(\d+,\)"),
        ("extra", r"1 extra, the first: surplus"),
        ("missing", r"1 missing, the first: action_net.bias"),
    ],
)
def test_weights_that_do_not_fit_name_the_tensor(run_dir: Path, tmp_path: Path, capsys, edit, message) -> None:
    """Only torch's empty first line was shown ("Error(s) in loading state_dict for
    ActorCriticPolicy:"): no tensor, no shape."""
    import torch
    from safetensors.torch import load_file, save_file

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    path = run / "final" / "policy.safetensors"
    tensors = load_file(str(path))
    if edit == "shape":
        tensors["action_net.bias"] = torch.zeros(3)
    elif edit == "extra":
        tensors["surplus"] = torch.zeros(2)
    else:
        del tensors["action_net.bias"]
    save_file(tensors, str(path))
    assert main(["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]) == 2
    assert re.search(rf"policy.safetensors: weights do not fit this model \({message}\);", capsys.readouterr().err)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        ({"action_nvec": [10**9, 8]}, "policy sizes over 65,536 (23 observations, 1e+09 action outputs)"),
        # was "over 65,536" of a layer of 0; a stray key was accepted as the config refuses it
        ({"policy_kwargs": {"net_arch": [0]}}, "policy_kwargs.net_arch: layer sizes [0] outside [1, 65536]"),
        ({"policy_kwargs": {"net_arch": {"pi": [8], "vf": [8], "x": [1]}}}, "policy_kwargs.net_arch: unknown key(s) ['x']"),
        # an unshared extractor was a traceback in the export's forward (a (pi, vf) tuple)
        ({"policy_kwargs": {"share_features_extractor": False}}, "policy_kwargs.share_features_extractor: false is not supported"),
        ({"policy": "CnnPolicy"}, "policy 'CnnPolicy'; batchpilot's observations need MlpPolicy"),
        ({"policy": "MultiInputPolicy"}, "policy 'MultiInputPolicy'; batchpilot's observations"),
        ({"policy": "Nope"}, "policy 'Nope'; batchpilot's observations need MlpPolicy"),
        (
            {"policy_kwargs": {"net_arch": [65536, 65536]}},
            "policy_kwargs.net_arch: a policy of 8.59e+09 parameters, over the 100,000,000 limit",
        ),
        ({"action_nvec": [17.5, 8]}, "action_nvec: 17.5 is not a whole number"),
        ({"action_nvec": [0, 8]}, "action_nvec: 0 is outside [1, inf]"),
        ({"action_nvec": [10**400, 8]}, "the checkpoint state: action_nvec[0] is a 401-digit integer, past a float's range"),
        ({"observation_low": [-(10**400)] * 23}, "the checkpoint state: observation_low[0] is a 401-digit"),
        # SB3's own assertion was a traceback; a string was read as true
        ({"policy_kwargs": {"squash_output": True}}, "cannot build the policy (squash_output=True is only"),
        ({"policy_kwargs": {"share_features_extractor": "no"}}, "policy_kwargs.share_features_extractor: 'no' is not true or false"),
        ({"policy_kwargs": {"net_arch": "32"}}, "policy_kwargs.net_arch: '32' is not of type"),
    ],
)
def test_bad_checkpoint_state_is_named(
    run_dir: Path, tmp_path: Path, capsys, edit: dict, message: str
) -> None:
    """checkpoint.json's fields size and shape the network export rebuilds: refused by name,
    before the network is built (an action of a billion choices once asked torch for 256 GB;
    layers each within MAX_LAYER once asked for 32 GiB in all; a knob of 17.5 choices was
    truncated to 17)."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    path = run / "final" / "checkpoint.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | edit))
    argv = ["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{path}: {message}" in err, err


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("run.json", "[" * 100_000 + "]" * 100_000, "the run description nests too deeply"),
        ("run.json", '{"seed": 1, "seed": 2}', "the run description gives a key twice in one object (seed)"),
        ("run.json", "[]", "the run description must be a JSON object, not an array"),
        ("run.json", '{"action_mode": "grid", "env_kwargs": {}}', "not a run description (control_interval missing)"),
        ("run.json", '{"action_mode": "nope", "env_kwargs": {}, "control_interval": "1it"}', "action_mode 'nope' is none of grid, step"),
        ("final/checkpoint.json", '{"a": ' + "9" * 5000 + "}", "the checkpoint state holds an integer of over 4300 digits"),
        ("final/checkpoint.json", '{"a": 1, "a": 1}', "the checkpoint state gives a key twice in one object (a)"),
        ("final/vecnormalize.json", '{"a": ' + "9" * 5000 + "}", "the VecNormalize statistics holds an integer of over 4300 digits"),
        ("final/vecnormalize.json", b"\xff\xfe{", "the VecNormalize statistics is not UTF-8 text"),
        ("final/vecnormalize.json", '{"a": {"b": 1, "b": 2}}', "the VecNormalize statistics gives a key twice in one object (b)"),
    ],
)
def test_unreadable_run_json_is_named(
    run_dir: Path, tmp_path: Path, capsys, name: str, text: str | bytes, message: str
) -> None:
    """A run's JSON files that json.loads fails on (RecursionError, a bare ValueError for an
    integer of over 4,300 digits, bytes that are not UTF-8), that give a key twice (json
    would keep the last silently) or that are not a run's are named, file and problem."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    if isinstance(text, bytes):
        (run / name).write_bytes(text)
    else:
        (run / name).write_text(text)
    argv = ["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run / name}: {message}" in err, err


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda m: m.pop("versions"), "algo must be a name and versions an object naming the batchpilot version, got algo 'ppo', versions None"),
        (lambda m: m.update(algo=["ppo"]), "algo must be a name and versions an object naming the batchpilot version, got algo ['ppo']"),
        (lambda m: m["env_kwargs"].update(slo=5), "env_kwargs: slo must be a string like ttft:2000,tpot:50, got 5"),
        (lambda m: m["env_kwargs"].update(slo="ttft:0"), "env_kwargs: SLO 'ttft:0': ttft value '0' must lie within [0.001, 1e+09] ms"),
        (lambda m: m["env_kwargs"].update(slo=""), "env_kwargs: slo names no objective"),
        (lambda m: m["env_kwargs"].update(slo_scale=[0, 1]), "env_kwargs: slo_scale must map ttft and/or tpot to [lo, hi], got [0, 1]"),
    ],
)
def test_a_bad_run_description_is_named(
    run_dir: Path, tmp_path: Path, capsys, edit, message: str
) -> None:
    """run.json entries the sidecar copies (the SLO, the algorithm, the versions) are checked
    with the file named, not met as a KeyError or an error naming no file."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    meta = json.loads((run / "run.json").read_text())
    edit(meta)
    (run / "run.json").write_text(json.dumps(meta))
    argv = ["export", str(run), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"{run / 'run.json'}: {message}" in err, err
    assert not (tmp_path / "p.onnx").exists()


def test_an_export_that_would_not_load_replaces_nothing(
    run_dir: Path, policy: Path, tmp_path: Path, capsys
) -> None:
    """A run.json whose control interval serving would refuse: the policy already at --out
    stays as it was, and no partial file is left beside it."""
    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    meta = json.loads((run / "run.json").read_text())
    (run / "run.json").write_text(json.dumps(meta | {"control_interval": "-1000ms"}))
    out = tmp_path / "p.onnx"
    shutil.copy(policy, out)
    shutil.copy(sidecar_path(policy), sidecar_path(out))
    before = out.read_bytes(), sidecar_path(out).read_bytes()
    assert main(["export", str(run), "--checkpoint", "final", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "the export would not load" in err and "-1000ms" in err
    assert (out.read_bytes(), sidecar_path(out).read_bytes()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["p.onnx", "p.onnx.json", "run"]


def test_export_onto_a_sidecar_name_replaces_nothing(
    run_dir: Path, policy: Path, tmp_path: Path, capsys
) -> None:
    """`--out p.onnx.json` beside a policy p.onnx wrote ONNX bytes over p.onnx.json and a stray
    p.onnx.json.json, then refused the name: p.onnx no longer loaded. Now the name is refused
    before anything is written."""
    out = copy(policy, tmp_path)
    before = sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir())
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", f"{out}.json"]) == 2
    assert f"{out}.json is a policy's JSON sidecar; name its .onnx file" in capsys.readouterr().err
    assert sorted((p.name, p.read_bytes()) for p in tmp_path.iterdir()) == before
    load_policy(out)


@pytest.mark.parametrize("name", ["policy.txt", "policy", "policy.v2"])
def test_export_refuses_a_name_that_is_not_onnx(
    run_dir: Path, tmp_path: Path, capsys, name: str
) -> None:
    """`--out policy.txt` wrote ONNX bytes to policy.txt and a sidecar policy.txt.json; a name
    that does not end in .onnx is refused before anything is written."""
    out = tmp_path / "out" / name
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert f"{out}: a policy file's name ends in .onnx" in err
    assert f"e.g. {out}.onnx" in err
    assert not out.parent.exists() or not any(out.parent.iterdir())


def test_an_export_a_spec_cannot_name_says_so(run_dir: Path, tmp_path: Path, capsys) -> None:
    """An --out holding ',' or '+' was written without a word, then refused by every spec."""
    out = tmp_path / "a,b" / "p.onnx"
    out.parent.mkdir()
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", str(out)]) == 0
    assert "; `simulate` or `compare` cannot name it as policy:PATH" in capsys.readouterr().out
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]) == 0
    assert "note:" not in capsys.readouterr().out


def test_export_writes_a_policy_that_loads(policy: Path) -> None:
    meta = json.loads(sidecar_path(policy).read_text())
    assert meta["sidecar_sha256"] == seal(meta)["sidecar_sha256"]
    assert load_policy(policy).name == f"policy:{policy}"


def test_a_policy_run_under_another_slo_says_so(policy: Path, caplog) -> None:
    from batchpilot.envs.metrics import SLO
    from batchpilot.envs.profiles import get_profile
    from batchpilot.envs.sim_engine import SimEngine

    controller = load_policy(policy)
    with caplog.at_level(logging.WARNING, logger="batchpilot.policy"):
        controller.reset(SimEngine(get_profile("llama-7b-a100"), slo=controller.slo))
        assert not caplog.records
        controller.reset(SimEngine(get_profile("llama-7b-a100"), slo=SLO.parse("tpot:100")))
    message = caplog.records[-1].getMessage()
    assert "trained for the SLO ttft:2000,tpot:50; this run is scored on tpot:100" in message
    assert "ttft unset; tpot 100 ms, not 50" in message
    assert controller.observer.tpot_s == 0.1  # the run's target: the entries are ratios to it


def copy(policy: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "p.onnx"
    dst.write_bytes(policy.read_bytes())
    sidecar_path(dst).write_text(sidecar_path(policy).read_text())
    return dst


def edit(path: Path, reseal: bool = False, **changes) -> None:
    meta = json.loads(sidecar_path(path).read_text()) | changes
    sidecar_path(path).write_text(json.dumps(seal(meta) if reseal else meta))


@pytest.mark.parametrize(
    "change",
    [{"slo": "ttft:9e9"}, {"control_interval": "5it"}, {"timesteps": 1}, {"extra": 1}],
    ids=["slo", "control_interval", "timesteps", "new-field"],
)
def test_an_edited_sidecar_is_refused(policy: Path, tmp_path: Path, change: dict) -> None:
    p = copy(policy, tmp_path)
    edit(p, **change)
    with pytest.raises(PolicyFileError, match="sidecar_sha256 does not match"):
        load_policy(p)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"timesteps": 1e308}, r"timesteps: 1e\+308 is outside \[0, 1e\+15\]"),
        ({"timesteps": 2.5}, "timesteps: 2.5 is not a whole number"),
        ({"timesteps": -1}, "timesteps: -1 is outside"),
        ({"timesteps": True}, "timesteps: True is not a whole number"),
        ({"sha256": "zz"}, "sha256: 'zz' is not a sha256 hex digest"),
        ({"slo": 5}, "slo: 5 is not a string"),
        ({"action": "grid"}, "action is missing or not a mapping"),  # "string indices must be"
    ],
)
def test_out_of_range_sidecar_values_are_refused(
    policy: Path, tmp_path: Path, change, message
) -> None:
    """Re-sealed (as a forger could): the declared checks still refuse the values."""
    p = copy(policy, tmp_path)
    edit(p, reseal=True, **change)
    with pytest.raises(PolicyFileError, match=message):
        load_policy(p)


def test_a_resealed_sidecar_without_the_files_sha256_says_so(policy: Path, tmp_path: Path) -> None:
    """It said "sha256 does not match its sidecar: the file was modified"."""
    p = copy(policy, tmp_path)
    meta = json.loads(sidecar_path(p).read_text())
    del meta["sha256"]
    sidecar_path(p).write_text(json.dumps(seal(meta)))
    with pytest.raises(PolicyFileError, match="no sha256 of the policy file"):
        load_policy(p)


def test_a_resealed_action_mode_the_graph_does_not_choose_is_refused(
    policy: Path, tmp_path: Path
) -> None:
    """A grid policy's sidecar re-sealed to say `step` moves: the graph's knobs choose among
    the grid's points, not 3 moves, and the load says so."""
    p = copy(policy, tmp_path)
    edit(p, reseal=True, action=action_layout("step"))
    with pytest.raises(PolicyFileError, match=r"chooses among \(\d+, \d+\) values per knob"):
        load_policy(p)


def test_non_finite_sidecar_values_are_refused(policy: Path, tmp_path: Path) -> None:
    p = copy(policy, tmp_path)
    meta = json.loads(sidecar_path(p).read_text()) | {"extra": float("nan")}
    sidecar_path(p).write_text(json.dumps(meta))  # Python writes NaN; the seal cannot cover it
    with pytest.raises(PolicyFileError, match="the policy sidecar: extra is NaN, not a number JSON allows"):
        load_policy(p)


def test_a_failed_train_leaves_nothing_that_blocks_a_fresh_run(tmp_path: Path, capsys) -> None:
    data = json.loads(json.dumps(CONFIG))
    data["batchpilot/Batching-v0"]["policy_kwargs"]["optimizer_kwargs"] = {"bogus": 1}
    bad = tmp_path / "bad.yml"
    bad.write_text(yaml.safe_dump(data))
    out = tmp_path / "run"
    assert main(["train", "--config", str(bad), "--out", str(out), "--no-progress"]) == 2
    assert "optimizer_kwargs: torch's Adam refused it" in capsys.readouterr().err
    assert not (out / "run.json").exists()
    # a run.json from an older failure (no checkpoint) does not block a fresh start either
    out.mkdir(exist_ok=True)
    (out / "run.json").write_text("{}")
    good = tmp_path / "good.yml"
    good.write_text(yaml.safe_dump(CONFIG))
    err = main(["train", "--config", str(good), "--out", str(out), "--resume", "--no-progress"])
    assert err == 2 and "started again without --resume" in capsys.readouterr().err


def test_export_names_a_checkpoint_given_for_its_run_and_says_a_run_given_twice_counts_twice(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    out = str(tmp_path / "p.onnx")
    assert main(["export", str(run_dir / "final"), "--out", out]) == 2
    err = capsys.readouterr().err
    assert f"it is a checkpoint of {run_dir}: export that run (--checkpoint final)" in err
    assert main(["export", str(tmp_path / "nowhere"), "--out", out]) == 2
    assert f"{tmp_path / 'nowhere'} does not exist" in capsys.readouterr().err  # not "no run.json"
    twice = [str(run_dir), str(run_dir / ".." / run_dir.name)]
    assert main(["export", *twice, "--checkpoint", "final", "--out", out]) == 0
    assert f"note: {run_dir.resolve()} is 2 members: it counts that often in the vote" in (
        capsys.readouterr().out
    )


@pytest.mark.parametrize("taken", ["p.onnx", "p.onnx.json"])
def test_export_onto_a_directory_names_it_before_exporting(
    run_dir: Path, tmp_path: Path, capsys, taken: str
) -> None:
    (tmp_path / taken).mkdir()
    assert main(["export", str(run_dir), "--out", str(tmp_path / "p.onnx")]) == 2
    assert f"{tmp_path / taken}: is a directory, not a file" in capsys.readouterr().err
    assert not list(tmp_path.glob(".p.onnx*"))  # nothing begun


def test_export_onto_a_pipe_names_it_before_exporting(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A FIFO at --out was replaced by a regular file."""
    os.mkfifo(tmp_path / "p.onnx")
    assert main(["export", str(run_dir), "--out", str(tmp_path / "p.onnx")]) == 2
    assert f"{tmp_path / 'p.onnx'}: is not a regular file" in capsys.readouterr().err
    assert stat.S_ISFIFO((tmp_path / "p.onnx").stat().st_mode)


@pytest.mark.parametrize(
    ("tamper", "message"),
    [
        (
            "shape",
            r"policy\.safetensors: optimizer tensor optimizer\.\d+\.exp_avg has shape \(3,\), "
            r"the parameter \(\d+, \d+\)",
        ),
        (
            "step",
            r"policy\.safetensors: optimizer tensor optimizer\.\d+\.step has shape \(3,\), "
            r"a step count \(\)",
        ),
        (
            "index",
            r"policy\.safetensors: tensor 'optimizer\.abc\.exp_avg' is not "
            r"optimizer\.<index>\.<state> with an index below \d+",
        ),
        (
            "beyond",
            r"policy\.safetensors: tensor 'optimizer\.999\.exp_avg' is not "
            r"optimizer\.<index>\.<state> with an index below \d+",
        ),
        (
            "groups",
            r"checkpoint\.json: optimizer_param_groups do not number the model's \d+ "
            r"parameters 0 to \d+ in order",
        ),
    ],
)
def test_resume_refuses_optimizer_state_that_does_not_fit(
    run_dir: Path, tmp_path: Path, capsys, tamper: str, message: str
) -> None:
    """torch loads optimizer tensors of any shape (and maps them to parameters by the saved
    groups' numbering): a wrong one failed only in the first PPO update, with a traceback,
    and a malformed key with int()'s error. All are refused at resume, naming the file and
    the tensor."""
    import torch
    from safetensors.torch import load_file, save_file

    from batchpilot.agents.checkpoint import resume_point

    run = tmp_path / "run"
    shutil.copytree(run_dir, run)
    ckpt = resume_point(run)
    tensors = load_file(str(ckpt / "policy.safetensors"))
    kept = "step" if tamper == "step" else "exp_avg"
    key = next(k for k in tensors if k.startswith("optimizer.") and k.endswith(f".{kept}"))
    if tamper in ("shape", "step"):
        tensors[key] = torch.zeros(3)
    elif tamper in ("index", "beyond"):
        tensors[f"optimizer.{'abc' if tamper == 'index' else 999}.exp_avg"] = tensors.pop(key)
    else:  # the saved state maps to the parameters in reverse
        state = json.loads((ckpt / "checkpoint.json").read_text())
        state["optimizer_param_groups"][0]["params"].reverse()
        (ckpt / "checkpoint.json").write_text(json.dumps(state))
    save_file(tensors, str(ckpt / "policy.safetensors"))
    data = json.loads(json.dumps(CONFIG))
    data["batchpilot/Batching-v0"]["n_timesteps"] = 96  # an update follows the resume
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump(data))
    argv = ["train", "--config", str(config), "--out", str(run), "--resume", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert re.search(f"{re.escape(str(ckpt))}/{message}", err), err


@pytest.mark.skipif(not Path("/proc/self").exists(), reason="needs Linux's /proc")
def test_an_out_the_file_system_refuses_is_named_by_its_option(tmp_path: Path, capsys) -> None:
    """/proc looks writable to root, and the run directory's mkdir failed with an error that
    named no option."""
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump(CONFIG))
    argv = ["train", "--config", str(config), "--out", "/proc/batchpilot-run", "--no-progress"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--out /proc/batchpilot-run" in err and "Traceback" not in err


def test_a_run_without_a_best_checkpoint_says_which_it_keeps(
    run_dir: Path, tmp_path: Path, capsys
) -> None:
    """A run without an eval: block keeps no best checkpoint, and the message listed it as
    there ("checkpoints: best, final")."""
    assert main(["export", str(run_dir), "--out", str(tmp_path / "p.onnx")]) == 2
    err = capsys.readouterr().err
    assert "best/checkpoint.json does not exist; the run keeps final (best once an evaluation ran" in err
    assert err.rstrip().endswith("--checkpoint final")
    assert main(["export", str(run_dir), "--checkpoint", "final", "--out", str(tmp_path / "p.onnx")]) == 0


def test_a_resume_with_another_gamma_discounts_the_reward_scale_by_it_too(tmp_path: Path) -> None:
    """PPO took the new gamma while the reward normalisation kept the checkpoint's."""
    body = CONFIG["batchpilot/Batching-v0"] | {"normalize": True}
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"n_timesteps": 32}}))
    run = tmp_path / "run"
    argv = ["train", "--config", str(config), "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"n_timesteps": 64, "gamma": 0.5}}))
    assert main([*argv, "--resume"]) == 0
    assert json.loads((run / "final" / "vecnormalize.json").read_text())["gamma"] == 0.5


def test_resume_takes_a_config_that_spells_the_same_network_otherwise(tmp_path: Path) -> None:
    """policy_kwargs {} (SB3's defaults, as none given is) and an imitation default written
    out were refused as changes."""
    from batchpilot.training.train import _check_same_config

    body = {k: v for k, v in CONFIG["batchpilot/Batching-v0"].items() if k != "policy_kwargs"}
    kept, new = tmp_path / "kept.yml", tmp_path / "new.yml"
    kept.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body | {"imitation": {"teacher": "alg1"}}}))
    same = body | {"policy_kwargs": {}, "imitation": {"teacher": "alg1", "rounds": 3}}
    new.write_text(yaml.safe_dump({"batchpilot/Batching-v0": same}))
    _check_same_config(new, kept)
    new.write_text(yaml.safe_dump({"batchpilot/Batching-v0": same | {"policy_kwargs": {"net_arch": [8]}}}))
    with pytest.raises(ValueError, match="policy_kwargs"):
        _check_same_config(new, kept)


def test_a_run_whose_final_state_is_unreadable_is_not_overwritten(tmp_path: Path, capsys) -> None:
    """A run with only a final state of another version stopped counting as a run: a fresh
    train replaced it, and --resume passed it over without a word."""
    body = CONFIG["batchpilot/Batching-v0"] | {"n_timesteps": 32}
    config = tmp_path / "c.yml"
    config.write_text(yaml.safe_dump({"batchpilot/Batching-v0": body}))
    run = tmp_path / "run"
    argv = ["train", "--config", str(config), "--out", str(run), "--no-progress"]
    assert main(argv) == 0
    shutil.rmtree(run / "checkpoints", ignore_errors=True)
    state = json.loads((run / "final" / "checkpoint.json").read_text()) | {"format_version": 0}
    (run / "final" / "checkpoint.json").write_text(json.dumps(state))
    assert main(argv) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert main([*argv, "--resume"]) == 2
    assert "final/checkpoint.json: not a" in capsys.readouterr().err
