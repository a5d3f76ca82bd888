"""The one way racecheck writes a file: atomically, so readers never see half of it; and where
the caches it keeps between runs live.

Traces, reports, baselines and repro records all go through `atomic_open`: a temp file in the
same folder, renamed over the target once complete. A file that cannot be written is a one-line
UsageError (a bad path is the user's input, not a racecheck bug).
"""
from __future__ import annotations

import contextlib
import os
import tempfile

from racecheck.core.errors import UsageError


@contextlib.contextmanager
def atomic_open(path):
    """Text file to write `path` through; replaces `path` only when the block completes."""
    path = os.fspath(path)
    folder = os.path.dirname(os.path.abspath(path))
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".racecheck-", suffix=".tmp", dir=folder)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
            yield fh
        os.chmod(tmp, _file_mode(path))
        os.replace(tmp, path)
    except OSError as exc:
        _unlink(tmp)
        raise UsageError(f"cannot write {path}: {exc.strerror or exc}") from None
    except BaseException:
        _unlink(tmp)
        raise


def write_atomic(path, text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def _unlink(tmp: str) -> None:
    try:
        os.unlink(tmp)
    except OSError:
        pass


def _file_mode(path: str) -> int:
    """Keep an existing file's mode, else what open() would give (mkstemp makes 0600)."""
    try:
        return os.stat(path).st_mode & 0o777
    except OSError:
        mask = os.umask(0)
        os.umask(mask)
        return 0o666 & ~mask


def cache_dir(*parts: str) -> str:
    """A folder under the user's cache (XDG_CACHE_HOME, else ~/.cache) for racecheck's records
    kept between runs; not created here."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "racecheck", *parts)
