"""The one way a command writes a file a user named (a profile, metrics, step samples):
whole or not at all, through a symlink to its target, keeping the target's permissions."""

from __future__ import annotations

import os
import tempfile
from contextlib import suppress
from pathlib import Path


def replace_file(path: Path, text: str) -> None:
    """Write `text` to `path` (a symlink's target), made whole beside it and renamed over it,
    so no reader sees half a file; an existing file keeps its permissions, a new one gets the
    umask's. A target that exists and is not a regular file (a terminal, a pipe), or a path
    under /dev or /proc (``/dev/stdout`` redirected to a file), is written to as a stream
    (appended to). An `OSError` names `path` as given."""
    target = path.resolve() if path.is_symlink() else path
    try:
        if (target.exists() and not target.is_file()) or _descriptor(path):
            with path.open("a", encoding="utf-8") as stream:  # "w" would cut what it holds
                stream.write(text)
            return
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


def _descriptor(path: Path) -> bool:
    """Whether `path` names an open file or a device (/dev/stdout, /proc/self/fd/N), whose
    target a rename would not reach."""
    return path.absolute().parts[1:2] in (("dev",), ("proc",))


def _new_file_mode() -> int:
    """The mode ``open(path, "w")`` gives a new file: 0o666 less the umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask
