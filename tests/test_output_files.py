"""`replace_file`: a file a user named is written whole, through a symlink, keeping its mode."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from batchpilot.envs.output_files import replace_file


def test_a_file_is_replaced_whole_keeping_its_mode(tmp_path: Path) -> None:
    path = tmp_path / "out.json"
    path.write_text("old")
    path.chmod(0o600)
    replace_file(path, "new")
    assert path.read_text() == "new" and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no partial file left


def test_a_symlink_is_written_through_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "real.json"
    target.write_text("old")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    replace_file(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_name_at_the_longest_the_system_takes_is_written(tmp_path: Path) -> None:
    """The partial file's name does not grow with the target's (a '.NAME.partial' did)."""
    longest = os.pathconf(tmp_path, "PC_NAME_MAX")
    path = tmp_path / ("x" * (longest - 5) + ".json")
    replace_file(path, "{}")
    assert path.read_text() == "{}"


def test_a_failed_write_names_the_path_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fail(*_: object) -> None:
        raise OSError(28, "No space left on device")  # as a full disk: no file named

    monkeypatch.setattr(os, "replace", fail)
    path = tmp_path / "m.json"
    with pytest.raises(OSError, match=f"cannot write {path}: No space left on device"):
        replace_file(path, "{}")
    assert list(tmp_path.iterdir()) == []


def test_a_new_file_gets_the_umask_mode(tmp_path: Path) -> None:
    umask = os.umask(0o022)
    try:
        replace_file(tmp_path / "new.json", "{}")
    finally:
        os.umask(umask)
    assert stat.S_IMODE((tmp_path / "new.json").stat().st_mode) == 0o644
