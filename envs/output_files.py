"""The one way a command writes a text file a user named (metrics, a profile, step samples):
whole or not at all, through a symlink to its target, keeping the target's permissions; an open
descriptor or device (``/dev/stdout``) as a stream. (`batchpilot export` and checkpoints write
beside and rename on their own: a policy is checked before it is put in place.)"""

from __future__ import annotations

import os
import re
import tempfile
from contextlib import suppress
from pathlib import Path

DESCRIPTOR = re.compile(r"/dev/(std(in|out|err)|fd/\d+)|/proc/[^/]+/fd/\d+")
"""Paths that name an open file of this process (``/dev/stdout`` redirected to a file): a
rename would not reach what they point to."""


def streamed(path: Path) -> bool:
    """Whether `path` is written as a stream, not replaced: an open descriptor's name, or a
    target that exists and is not a regular file (a terminal, a pipe, ``/dev/null``)."""
    if DESCRIPTOR.fullmatch(os.path.abspath(path)):
        return True
    target = written(path)
    return target.exists() and not target.is_file()


def written(path: Path) -> Path:
    """The file a write to `path` lands in: a symlink's target; an `OSError` for a loop."""
    target = Path(os.path.realpath(path))
    if target.is_symlink():  # realpath stops where the links go round
        raise OSError("a symlink loop")
    return target


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` (a symlink's target), made whole beside it and renamed over it,
    so no reader sees half a file; an existing file keeps its permissions, a new one gets the
    umask's. A `streamed` path is appended to. An `OSError` names `path` as given."""
    try:
        if streamed(path):
            with path.open("a", encoding="utf-8") as stream:  # "w" would cut what it holds
                stream.write(text)
            return
        target = written(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, partial = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".partial")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as handle:
                handle.write(text)
            os.chmod(partial, target.stat().st_mode if target.exists() else _new_file_mode())
            os.replace(partial, target)
        except BaseException:
            with suppress(OSError):
                os.unlink(partial)
            raise
    except OSError as exc:  # a full disk names no file; the partial one is not the user's
        raise OSError(f"cannot write {path}: {exc.strerror or exc}") from None


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the umask (read by setting
    it and back: process-wide for that instant; the commands that write files run one
    thread)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
