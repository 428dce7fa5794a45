"""The free space of a directory, for the one line a failed write prints.

A write that fails on a full disk (a checkpoint save, `metrics.json`) says
where and how much room is left there, so the user knows what to free. Only a
local path can be asked (`shutil.disk_usage`); a URL's free space is unknown.
`advice` says what to do, and says "free some space" only when the disk is
full: a write refused for its permissions, or a removal that failed
(`engine.runtime.files`), is not helped by freeing space.
"""

from __future__ import annotations

import errno
import shutil
from typing import Optional

#: TensorFlow's class name for a full disk (its errors are not imported here).
_EXHAUSTED = "ResourceExhaustedError"


def is_full(error: BaseException, reason: str = "") -> bool:
    """Whether `error` (an OSError or a TensorFlow error) says the disk is full."""
    return (getattr(error, "errno", None) in (errno.ENOSPC, errno.EDQUOT)
            or type(error).__name__ == _EXHAUSTED
            or "No space left" in (reason or str(error))
            or "quota exceeded" in (reason or str(error)).lower())


def advice(error: BaseException, directory: str, reason: str = "") -> str:
    """What to do about a failed write in `directory`: `free some space`
    for a full disk, `make <directory> writable` otherwise (permissions, a
    read-only filesystem, ...)."""
    return "free some space" if is_full(error, reason) else f"make {directory} writable"


def free_space(directory: str) -> Optional[str]:
    """`"12.3 GiB"` free in `directory`; None for a URL or a path that
    cannot be asked (it does not exist)."""
    if "://" in directory:
        return None
    try:
        return size(shutil.disk_usage(directory).free)
    except OSError:
        return None


def free_there(directory: str) -> str:
    """`12.3 GiB free there`, or `free space unknown`: the phrase of a failed
    checkpoint save or export."""
    free = free_space(directory)
    return f"{free} free there" if free else "free space unknown"


def size(count: float) -> str:
    """`count` bytes in the largest unit up to GiB: `512 bytes`, `1.5 MiB`."""
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return str(count)
