"""`regular_file`, the one check of an input file's path: a directory, a pipe or a device is
an error naming the path; otherwise it says whether the file exists."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from batchpilot.envs.input_files import regular_file
from batchpilot.envs.json_objects import read_json


class Refused(Exception):
    pass


def test_a_regular_file_exists_and_a_missing_one_does_not(tmp_path: Path) -> None:
    (tmp_path / "trace.csv").write_text("x\n")
    assert regular_file(tmp_path / "trace.csv", "a trace file") is True
    assert regular_file(tmp_path / "nope.csv", "a trace file") is False


@pytest.mark.parametrize("target", ["gone.csv", "loop.csv"])
def test_a_link_to_nothing_is_named_as_a_link(tmp_path: Path, target: str) -> None:
    """A broken link or a loop was 'no such trace file; the embedded workloads need no file'."""
    link = tmp_path / "loop.csv"
    link.symlink_to(tmp_path / target)
    with pytest.raises(Refused, match=rf"^{link}: a symbolic link to {tmp_path / target}, which leads to no file$"):
        regular_file(link, "a trace file", Refused)


def test_a_directory_is_named_with_what_was_wanted(tmp_path: Path) -> None:
    with pytest.raises(Refused, match=rf"^{tmp_path}: a directory, not a trace file$"):
        regular_file(tmp_path, "a trace file", Refused)


@pytest.mark.parametrize("kind", ["pipe", "device"])
def test_a_pipe_or_a_device_is_refused_before_anything_reads_it(tmp_path: Path, kind: str) -> None:
    if kind == "pipe":
        path = tmp_path / "pipe.csv"
        os.mkfifo(path)  # opening it to read would block
    else:
        path = Path(os.devnull)  # a character device: reads as empty
    with pytest.raises(ValueError, match=r": not a regular file \(a pipe, device or socket\?\)"):
        regular_file(path, "a trace file")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"a": {"b": [1, NaN]}}', "a.b[1] is NaN, not a number JSON allows"),
        ('{"a": -Infinity}', "a is -Infinity, not a number JSON allows"),
        ('[{"x": Infinity}]', "[0].x is Infinity, not a number JSON allows"),
        ('{"t": 1' + "0" * 400 + "}", "t is a 401-digit integer, past a float's range"),
        ("NaN", "the value is NaN, not a number JSON allows"),
    ],
)
def test_a_json_file_with_a_number_json_does_not_allow_names_the_field(
    tmp_path: Path, text: str, message: str
) -> None:
    """Python's json reads NaN, Infinity and integers past a float's range; the checks after
    it raised OverflowError (a traceback) or a message naming no field."""
    path = tmp_path / "f.json"
    path.write_text(text)
    with pytest.raises(ValueError) as err:
        read_json(path, "the file")
    assert str(err.value) == f"{path}: the file: {message}"
    path.write_text('{"a": [1.5, -2, 1e308, true, null]}')
    assert read_json(path, "the file") == {"a": [1.5, -2, 1e308, True, None]}


def test_a_model_given_with_a_tilde_is_read_from_the_home_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`profiles build --model=~/x.json` and `compare --engine vllm --model=~/DIR` took '~'
    literally (no shell expands it after '='), where every path option expands it."""
    from test_profiles_measured import LLAMA_2_7B_CONFIG

    from batchpilot.envs.profiles import architecture
    from batchpilot.envs.vllm_engine import check_model_dir

    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps(LLAMA_2_7B_CONFIG))
    assert architecture("~/m/config.json").layers == architecture("~/m").layers == 32
    assert check_model_dir("~/m") == tmp_path / "m"


@pytest.mark.parametrize("kind", ["policy", "sidecar", "profile", "yaml"])
def test_a_file_too_large_to_be_ours_is_refused_before_it_is_read(tmp_path: Path, kind: str) -> None:
    """A 3 GB policy.onnx was read whole (a MemoryError traceback under a memory limit) before
    its checksum refused it."""
    import shutil

    from batchpilot.agents.policy import load_policy
    from batchpilot.envs.json_objects import MAX_FILE_BYTES
    from batchpilot.envs.profiles import get_profile
    from batchpilot.training.yaml_files import load_yaml

    shipped = Path(__file__).parents[1] / "training/reports/learned/policy.onnx"
    policy = tmp_path / "policy.onnx"
    shutil.copy(shipped, policy)
    shutil.copy(shipped.with_name("policy.onnx.json"), tmp_path / "policy.onnx.json")
    big = {"policy": policy, "sidecar": tmp_path / "policy.onnx.json"}.get(kind, tmp_path / f"big.{kind}")
    with big.open("ab") as fh:
        fh.truncate(MAX_FILE_BYTES + 1)  # sparse: no disk written
    read = {"policy": lambda: load_policy(policy), "sidecar": lambda: load_policy(policy),
            "profile": lambda: get_profile(str(big)), "yaml": lambda: load_yaml(big)}[kind]  # fmt: skip
    with pytest.raises(ValueError, match=rf"^{big}: .* is 268,435,457 bytes, over the 268,435,456"):
        read()


def test_an_empty_policy_file_is_named_empty(tmp_path: Path) -> None:
    """A zero-byte policy whose sidecar was re-sealed for it: onnx said 'The model does not
    have an ir_version set properly'."""
    import json

    from batchpilot.agents.policy import PolicyFileError, load_policy, seal, sha256

    shipped = Path(__file__).parents[1] / "training/reports/learned/policy.onnx.json"
    policy = tmp_path / "policy.onnx"
    policy.write_bytes(b"")
    meta = json.loads(shipped.read_text())
    del meta["sidecar_sha256"]
    (tmp_path / "policy.onnx.json").write_text(json.dumps(seal(meta | {"sha256": sha256(policy)})))
    with pytest.raises(PolicyFileError, match=rf"^{policy}: the policy file is empty"):
        load_policy(policy)
