"""Files the suite writes: atomically (a reader sees the old file or the new one, never a torn write).

:func:`atomic_write_text` writes to a temporary file in the destination directory and
``os.replace``-s it over the old one (on any error the temporary file is removed and the old
file is left untouched); :func:`check_out_dir` checks an output directory argument.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from specverify.core.errors import InvalidArgument

__all__ = ["atomic_write_text", "check_out_dir"]


def atomic_write_text(path: Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` via a temporary file in the same directory + ``os.replace``.

    A character UTF-8 cannot hold (a lone surrogate, which a string from a server or a user's code
    may carry) is written as its backslash escape rather than failing the write.
    """
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", errors="backslashreplace", newline="\n") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path


def check_out_dir(out_dir) -> Path:
    """``out_dir`` as a Path that is a directory or does not exist yet (InvalidArgument otherwise)."""
    try:
        out = Path(out_dir)
    except TypeError:
        raise InvalidArgument(f"out_dir must be a path, got {out_dir!r}") from None
    if out.exists() and not out.is_dir():
        raise InvalidArgument(f"out_dir {str(out)!r} exists and is not a directory")
    return out
