"""The trust rules of a run's local checkpoint folder (`--local_checkpoint_dir`).

The folder is `<local_checkpoint_dir>/tfloop-<digest of model_dir>`: a name
anyone can compute, in a place the docs recommend and anyone may write
(`/dev/shm`). A run that took whatever it found there would resume from a
planted checkpoint, delete what a planted `checkpoint` state file names,
write through a link planted at the folder's name or at a file in it, and
adopt the checkpoints a removed run left at the same `model_dir`. So:

    usable?   lstat, never followed: a real folder (not a link), this
              user's, writable by no one else (`problem`); read-only
              probes (`problem`, `checkpoints`) change nothing
    made      os.mkdir(path, 0o700); a folder of ours that others may only
              read (an older tfloop's 0755) is narrowed to 0700 (`open_folder`)
    whose     a `run_id` file (0600, written by the engine) holds the run id
              of model_dir/run.json; a folder with another id (or none) holds
              another run's checkpoints: never resumed from, emptied when
              this run claims it (`claim`)
    read      only regular files named ckpt-<N>.index / .data-* inside it,
              by basename; a step with a link among its files is skipped;
              the `checkpoint` state file is never read, and removed before
              TensorFlow's CheckpointManager (which reads it) is built
    written   before each save: a link at a name the run writes (ckpt-*,
              ckpt-*_temp, checkpoint, run_id) is removed as a link, its
              target untouched (`unlink_links`); rotation removes only
              ckpt-<N>.* files of this folder (`rotate`)
    removed   stale ckpt-<N>_temp/ at start (`claim`); the whole folder when
              the run finished training (`remove_folder`)

A folder that fails the checks is ignored, not refused: refusing would let
anyone who can write to `/dev/shm` stop every run of a `model_dir` by
planting a folder at its name; ignoring costs only the local checkpoints
(the durable ones in `model_dir` still hold the run). Only this user (or
root) can write into a folder that passed, so what is checked stays true
while the run writes; and where `local_checkpoint_dir` itself may be
written by anyone, it must have the sticky bit (as /dev/shm and /tmp do),
or anyone could rename the folder away and put another in its place.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
from typing import Optional

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import files

logger = logging.getLogger(__name__)

#: The file holding the run id of the run whose checkpoints the folder holds.
RUN_ID_FILE = "run_id"
#: A run id as `engine.run_dir.run_identity` makes it.
RUN_ID = re.compile(r"^[0-9a-f]{32}$")
#: At most what the folder and its run_id file may be.
FOLDER_MODE, RUN_ID_MODE = 0o700, 0o600


def problem(path: str) -> Optional[str]:
    """Why `path` (which exists) is not a folder this run may use, in a few
    words ("is a symbolic link to /x"), or None; follows no link."""
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        return f"is a symbolic link (to {os.readlink(path)})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if info.st_uid != os.getuid():
        return f"belongs to user {info.st_uid}, not to this one ({os.getuid()})"
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        return f"can be written by other users (mode {mode:04o})"
    parent = os.stat(os.path.dirname(os.path.abspath(path)))
    if parent.st_mode & stat.S_IWOTH and not parent.st_mode & stat.S_ISVTX:
        return ("is in a folder anyone can write that has no sticky bit, where anyone could "
                "put another folder in its place")
    return None


def open_folder(path: str) -> Optional[str]:
    """Makes `path` this user's 0700 folder (its parents at most 0755), or
    finds it so; returns why it cannot be used (`problem`), or None."""
    try:
        files.make_dirs(os.path.dirname(os.path.abspath(path)))
        os.mkdir(path, FOLDER_MODE)
    except FileExistsError:
        pass
    except OSError as error:
        return f"could not be made ({error.strerror or error})"
    reason = problem(path)
    if reason is None and stat.S_IMODE(os.lstat(path).st_mode) & ~FOLDER_MODE:
        os.chmod(path, FOLDER_MODE, follow_symlinks=False)  # ours, readable by others: narrowed
    return reason


def run_id_of(path: str) -> Optional[str]:
    """The run id the folder `path` holds its checkpoints for, or None (no
    `run_id` file, a link there, not an id)."""
    try:
        fd = os.open(os.path.join(path, RUN_ID_FILE),
                     os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            return None
        text = f.read(64).decode("ascii", "replace").strip()
    return text if RUN_ID.match(text) else None


def checkpoints(path: str) -> dict[int, str]:
    """`{step: path/ckpt-<step>}` for every checkpoint in the folder `path`
    whose files are all regular files (a step with a link among them is left
    out); listed from the folder itself, never from its state file."""
    found: dict[int, bool] = {}
    for entry in _entries(path):
        match = layout.CHECKPOINT_FILE.match(entry.name)
        if match:
            step = int(match.group(1))
            regular = entry.is_file(follow_symlinks=False)
            found[step] = found.get(step, True) and regular
    return {step: layout.RunDir(path).checkpoint(step) for step, ok in found.items() if ok}


def claim(path: str, run_id: str) -> None:
    """Makes the folder `path` (which passed `open_folder`) this run's: one
    that holds another run's checkpoints (another `run_id`, or none) is
    emptied of what the engine keeps there first; stale `ckpt-<N>_temp/`
    (a save a kill cut short) and the state file are removed; then the run
    id is written."""
    theirs = run_id_of(path) != run_id
    if theirs and checkpoints(path):
        logger.info("removing the local checkpoints in %s: another run's (its run id is not "
                    "%s's)", path, layout.RUN_JSON)
    for entry in _entries(path):
        name = entry.name
        stale = layout.CHECKPOINT_TEMP.match(name) or layout.RECORD_TEMP.match(name)
        if stale and not entry.is_symlink():
            logger.info("removing %s, left by a save that did not finish", entry.path)
        if (stale or name == layout.CHECKPOINT_STATE
                or (theirs and (layout.CHECKPOINT_FILE.match(name) or name == RUN_ID_FILE))):
            files.remove(entry.path, within=path)
    unlink_links(path)
    if theirs:
        files.write_atomically(os.path.join(path, RUN_ID_FILE), run_id + "\n", mode=RUN_ID_MODE)


def unlink_links(path: str) -> None:
    """Removes, as links, the symbolic links in the folder `path` at names
    the run writes (TensorFlow writes `ckpt-<N>.index` and the
    `ckpt-<N>_temp/` folder by following them); their targets stay as they are."""
    for entry in _entries(path):
        if entry.is_symlink() and _engine_name(entry.name):
            logger.warning("removing %s, a symbolic link where the run writes a file of its "
                           "own (to %s, which stays as it is)", entry.path,
                           os.readlink(entry.path))
            files.remove(entry.path, within=path)


def rotate(path: str, keep: int, newest: int) -> None:
    """Keeps the `keep` newest checkpoints of the folder `path` up to step
    `newest` (the one just saved), and removes the others' files: older
    ones, and newer ones a resume from an earlier step left behind (a
    history training no longer follows). Only `ckpt-<N>.*` files of this
    folder, each by name, a link as a link."""
    steps: dict[int, list[str]] = {}
    for entry in _entries(path):
        match = layout.CHECKPOINT_FILE.match(entry.name)
        if match:
            steps.setdefault(int(match.group(1)), []).append(entry.path)
    kept = sorted((s for s in steps if s <= newest), reverse=True)[:keep]
    for step, names in steps.items():
        if step not in kept:
            for name in names:
                files.remove(name, within=path)


def remove_folder(path: str) -> bool:
    """Removes the folder `path` and all in it (never through a link) when it
    is still this run's (`problem`); returns whether it did."""
    try:
        if problem(path) is not None:
            return False
    except FileNotFoundError:
        return False
    return files.remove(path, within=os.path.dirname(os.path.abspath(path)))


def _engine_name(name: str) -> bool:
    """Whether the run writes (or removes) a file of that name in its folder."""
    return bool(layout.CHECKPOINT_FILE.match(name) or layout.CHECKPOINT_TEMP.match(name)
                or layout.RECORD_TEMP.match(name)
                or name in (layout.CHECKPOINT_STATE, RUN_ID_FILE))


def _entries(path: str) -> list[os.DirEntry]:
    try:
        with os.scandir(path) as found:
            return list(found)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.ENOTDIR):
            return []
        raise
