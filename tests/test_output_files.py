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


def test_a_file_under_dev_shm_is_replaced_not_appended_to() -> None:
    """Every path under /dev was taken for a descriptor: a rerun appended a second JSON
    document to /dev/shm/... (an ordinary directory)."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not os.access(shm, os.W_OK):
        pytest.skip("no writable /dev/shm")
    path = shm / f"batchpilot-test-{os.getpid()}.json"
    try:
        replace_file(path, "{}\n")
        replace_file(path, "{}\n")
        assert path.read_text() == "{}\n"
    finally:
        path.unlink(missing_ok=True)


def test_descriptors_and_devices_are_streamed(tmp_path: Path) -> None:
    from batchpilot.envs.output_files import streamed

    assert streamed(Path("/dev/stdout")) and streamed(Path("/proc/self/fd/1"))
    assert streamed(Path("/dev/null"))
    assert not streamed(tmp_path / "x.json") and not streamed(Path("/dev/shm/x.json"))


def test_a_symlink_loop_is_an_error_naming_the_path(tmp_path: Path) -> None:
    """It escaped as a RuntimeError traceback (Path.resolve), after the run."""
    (tmp_path / "a").symlink_to(tmp_path / "b")
    (tmp_path / "b").symlink_to(tmp_path / "a")
    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'a'}"):
        replace_file(tmp_path / "a", "{}")


def test_an_output_is_checked_where_the_rename_writes_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A renamed file needs a writable directory, the symlink's target's, not a writable
    file; a stream needs a writable file (the suite runs as root: access is faked)."""
    from batchpilot.training.commands.common import check_output

    ro, rw = tmp_path / "ro", tmp_path / "rw"
    ro.mkdir()
    rw.mkdir()
    (ro / "m.json").write_text("{}")
    (rw / "link.json").symlink_to(ro / "m.json")
    real_access = os.access
    monkeypatch.setattr(os, "access", lambda p, mode: Path(p) != ro and real_access(p, mode))
    for path in (ro / "m.json", rw / "link.json"):
        with pytest.raises(ValueError, match=f"--json {path}: {ro} is not writable"):
            check_output(path, "--json", directory=False)
    check_output(rw / "m.json", "--json", directory=False)
    with pytest.raises(ValueError, match="is not a regular file"):
        check_output(Path("/dev/stdout"), "--out", directory=False, replaced=True)
    check_output(Path("/dev/stdout"), "--json", directory=False)
