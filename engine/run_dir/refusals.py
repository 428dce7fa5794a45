"""The file-system refusals of the folders a run writes, before anything is created.

`--model_dir`, `--summaries_dir` and `--local_checkpoint_dir` are folders a
run makes (with their parents) at its first save; a path that cannot be
made must cost one line at the start, not an `OSError` traceback after the
first loop. Each is checked by one walk (`writable_ancestor`)::

    existing = path
    while existing does not exist:
        a symbolic link there (dangling, or a loop) -> refused: makedirs fails on it
        existing = its parent
    existing must be a directory this user may write and enter

`--model_dir` and `--summaries_dir` add what only they need
(`check_directory`: a URL answers, not a file, names the filesystem allows),
and `check_run_directories` the folders kept inside `model_dir`;
`local_checkpoints.check` adds the local folder's own rules. Read-only:
nothing here makes, removes or writes anything.
"""

from __future__ import annotations

import errno
import os
from typing import TYPE_CHECKING, Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import layout, storage

if TYPE_CHECKING:  # annotations only: the loop's room sits above this one
    from tfloop.engine.loop.settings import Loop
    from tfloop.engine.run_dir.settings import Keeping


def writable_ancestor(path: str, flag: str, *, shown: Optional[str] = None) -> str:
    """The nearest existing folder at or above the local `path`, which the
    run's `makedirs` will make the rest under; refuses, in one line naming
    `flag`, a symbolic link on the way that leads nowhere, and an ancestor
    that is not a directory this user may write. `shown`: the path as the
    messages quote it (default: `path` made absolute)."""
    path = os.path.abspath(path)
    shown = path if shown is None else shown
    existing = path
    while not os.path.exists(existing):
        if os.path.islink(existing):  # os.makedirs would fail on it with a traceback
            raise ConfigError(_broken_link(shown, existing, flag))
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag}={shown} cannot be written ({existing} is not a writable directory); "
            "choose a directory you can write to")
    return existing


def check_model_dir(path: str) -> None:
    """`check_directory` for `--model_dir`."""
    check_directory(path, "--model_dir")


def check_directory(path: str, flag: str) -> None:
    """Refuses a directory the run writes (`flag`: `--model_dir`,
    `--summaries_dir`) that cannot be written, before anything is created.

    A URL (`gs://...`, `ram://...`: any filesystem TensorFlow has registered)
    is checked for answering (`storage.check_reachable`: one line, exit 138
    or 2) and for being a file; writability shows at the first save.
    """
    if storage.is_url(path):
        storage.check_reachable(path, flag)
        if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
            raise ConfigError(f"{flag}={path} is a file; name a directory")
        return
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"{flag}={path} is a file; name a directory")
    existing = writable_ancestor(path, flag)
    _check_name_lengths(path, existing, flag)


def _check_name_lengths(path: str, existing: str, flag: str) -> None:
    """Refuses a `model_dir` whose missing part has a name longer than the
    filesystem allows (an `OSError` traceback from `os.makedirs` otherwise),
    or that leaves no room under PATH_MAX for the run's own files."""
    try:
        name_max = os.pathconf(existing, "PC_NAME_MAX")
        path_max = os.pathconf(existing, "PC_PATH_MAX")
    except (OSError, ValueError):
        return
    for name in os.path.relpath(path, existing).split(os.sep):
        if len(os.fsencode(name)) > name_max:
            raise ConfigError(
                f"{flag}={path} cannot be created: the name {name[:24]}... is "
                f"{len(os.fsencode(name))} bytes, and names in {existing} may have at most "
                f"{name_max}; choose a shorter one")
    room = 256  # summaries/train/events.out.tfevents.<time>.<host>.<pid>.<n>.v2 and the like
    if len(os.fsencode(path)) + room > path_max:
        raise ConfigError(
            f"{flag}={path[:40]}... is {len(os.fsencode(path))} bytes long, which leaves "
            f"too little of the {path_max} a path may have for the files under it; choose a "
            "shorter path")


def check_run_directories(loop: Loop, keeping: Keeping) -> None:
    """Refuses a file where this run will keep a directory (`summaries`,
    `export` with --export, `best` with --best_metric): it would fail with a
    traceback at the first summary, or at the export after all of training;
    and a symbolic link where it keeps any file or folder (`RunDir.kept_paths`)."""
    run_dir = layout.RunDir(loop.model_dir, loop.summaries_dir or None)
    run_dir.refuse_links()  # a run never writes or removes through a link it did not make
    for where in run_dir.directories(export=keeping.export, best=bool(keeping.best_metric)):
        if tf.io.gfile.exists(where) and not tf.io.gfile.isdir(where):
            raise ConfigError(f"{where} is a file, where the run keeps a directory; move it "
                              "away and run again")


def _broken_link(model_dir: str, link: str, flag: str) -> str:
    """Why `model_dir` cannot be created through `link`, a symbolic link
    that leads nowhere (it dangles, or loops)."""
    try:
        os.stat(link)
    except OSError as error:
        if error.errno == errno.ELOOP:
            return (f"{flag}={model_dir} cannot be created: {link} is a symbolic link "
                    f"loop; point {flag} at a directory, or fix the link")
    target = os.path.join(os.path.dirname(link), os.readlink(link))
    return (f"{flag}={model_dir} cannot be created: {link} is a symbolic link to "
            f"{os.path.normpath(target)}, which does not exist; create that directory, or "
            "remove the link")
