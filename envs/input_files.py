"""The one check of a path handed in as an input file (a trace, profile, suite, config or
policy): a directory, or a pipe, device or socket (which a read would block on or misread),
is an error naming the path (`regular_file`); and the one expansion of its ``~``
(`user_path`), which no shell does inside a spec or a config, nor after ``--out=``
(`path_arg`, every command's path options)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path


def user_path(text: str | Path, error: type[Exception] = ValueError) -> Path:
    """`text` as a path with ``~`` and ``~user`` expanded; a user without a home directory is
    an `error` naming the path (pathlib raises RuntimeError)."""
    try:
        return Path(text).expanduser()
    except RuntimeError:
        raise error(f"{text}: no home directory to expand its '~' to (an unknown user?)") from None


def path_arg(text: str) -> Path:
    """An argparse ``type=`` for a file or directory, ``~`` expanded (no shell does after
    ``--json=``): an empty or blank one is refused, where ``Path("")`` would be the current
    directory (an unset shell variable wrote a whole run into the working tree)."""
    if not text.strip():
        raise argparse.ArgumentTypeError(
            f"{text!r} is an empty or blank path; name a file or directory (an unset variable?)"
        )
    return user_path(text, argparse.ArgumentTypeError)


def regular_file(path: Path, what: str, error: type[Exception] = ValueError) -> bool:
    """Whether `path` exists; a directory (not `what`: "a trace file") or a path that is not
    a regular file raises `error` naming it. The caller says what a missing file means."""
    if path.is_dir():
        raise error(f"{path}: a directory, not {what}")
    if path.exists() and not path.is_file():
        raise error(f"{path}: not a regular file (a pipe, device or socket?)")
    if not path.exists() and path.is_symlink():  # what it points to is missing, or a loop
        raise error(f"{path}: a symbolic link to {os.readlink(path)}, which leads to no file")
    return path.exists()
