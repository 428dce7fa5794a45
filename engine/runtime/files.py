"""Files the engine makes and removes: never through a link it did not make,
with modes that do not depend on the umask alone.

Anyone who can write into a shared `--model_dir` can plant a symbolic link
where the run keeps a file or a folder (`best -> ~/thesis`, `ckpt-7_temp ->
/data`, `metrics.json.tmp -> ~/.bashrc`). A run that removes or writes
through it empties or overwrites the link's target, outside the run. So
every removal and every write of the engine's own files goes through here:

    remove(path, within=model_dir)
        opens each folder from `within` down to path's parent without following
        a link (O_NOFOLLOW|O_DIRECTORY, one descriptor at a time: nothing can be
        swapped in between), then, in that folder:
          a link, a file   -> unlinked (a link is removed as a link: its target stays)
          a folder         -> shutil.rmtree on the descriptor, which unlinks the
                              links inside and never descends through one
        a link on the way  -> ConfigError, one line (remove the link, run again)
        an OSError         -> RemovalFailure (a RunFailure), one line: what could
                              not be removed and why, never "free some space"
    write_atomically(path, text)
        a temporary file with a random name beside `path`, created exclusively
        (O_CREAT|O_EXCL|O_NOFOLLOW, mode 0644), written, renamed over `path`;
        rename(2) replaces a link at `path` itself, never its target
    create_exclusively(path)   a new file (a hang dump), never one that exists or a link
    make_dirs(path)            each missing folder made with mode 0755
    private_dir(path)          a per-user folder in a shared place: 0700, ours, not a link
    umask_at_least(0o022)      what TensorFlow writes meanwhile (checkpoints, event
                               files, SavedModels) is at most 0644 / 0755

Modes: `os.open(..., 0o644)` and `os.mkdir(..., 0o755)` give at most those
modes whatever the umask (it only takes bits away); TensorFlow's own files
are created 0666 / 0777 less the umask, so the process that writes a
`model_dir` (the holder of its lock, `engine.run_dir.run_lock`) runs with
the umask masking at least group and other write.

A URL (`gs://`, `ram://`, any filesystem TensorFlow registers) has no
symbolic links and no modes: there the same calls go through `tf.io.gfile`
(a temporary name random as well). The launcher and the dataset converter
(`launch`, `inputs`: libraries that may not import the engine) remove only
folders they made themselves in the same call, and never follow a link to
a stale one (their own few lines say so where they do it).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shlex
import shutil
import stat
from typing import IO, Iterator

from tfloop.engine.errors import ConfigError, RunFailure, one_line

#: What a file and a folder the engine creates may be at most.
FILE_MODE = 0o644
DIR_MODE = 0o755
#: The bits the umask always masks while a process writes a model_dir.
UMASK_AT_LEAST = 0o022
#: `<name>.tmp-<16 hex>`: a temporary file of `write_atomically`.
TEMPORARY_INFIX = ".tmp-"

_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)


def is_local(path: str) -> bool:
    """A path of the operating system's (links, modes), not a TensorFlow URL."""
    return "://" not in path


def temporary_name(path: str) -> str:
    """A fresh name beside `path` to write it under first: `<path>.tmp-<16 hex>`."""
    return f"{path}{TEMPORARY_INFIX}{secrets.token_hex(8)}"


# --- Removing what the run left. ---


def remove(path: str, *, within: str) -> bool:
    """Removes `path` (a file, a folder and all it holds, or a link: the link
    itself), which lies under the folder `within` (`model_dir`), without
    following any link below `within`; returns whether anything was there.
    See the module docstring.

    Raises:
      ConfigError: a folder between `within` and `path` is a symbolic link.
      RemovalFailure: `path` is there and could not be removed (one line).
      ValueError: `path` is not under `within` (a bug of the caller).
    """
    if not is_local(path):
        return _remove_url(path)
    root, target = os.path.abspath(within), os.path.abspath(path)
    names = os.path.relpath(target, root).split(os.sep)
    if names[0] in (os.curdir, os.pardir):
        raise ValueError(f"{path} is not under {within}: the engine removes only what is in it")
    try:
        folder = _open_folder(root, names[:-1])
    except FileNotFoundError:
        return False
    except OSError as error:
        raise RemovalFailure(path, error.strerror or str(error)) from None
    if folder is None:
        return False
    try:
        try:
            mode = os.stat(names[-1], dir_fd=folder, follow_symlinks=False).st_mode
        except FileNotFoundError:
            return False
        if stat.S_ISDIR(mode):
            shutil.rmtree(names[-1], dir_fd=folder)
        else:
            os.unlink(names[-1], dir_fd=folder)
        return True
    except FileNotFoundError:
        return True  # gone meanwhile
    except OSError as error:
        raise RemovalFailure(path, error.strerror or str(error)) from None
    finally:
        os.close(folder)


def remove_quietly(path: str, *, within: str) -> None:
    """`remove`, for the clean-up after a failure already being reported: a
    failure of its own (or a link on the way) is not raised over it."""
    try:
        remove(path, within=within)
    except (ConfigError, RunFailure):
        pass


def _remove_url(path: str) -> bool:
    """`remove` on a TensorFlow filesystem (no links there)."""
    tf = _tensorflow()
    try:
        if not tf.io.gfile.exists(path):
            return False
        if tf.io.gfile.isdir(path):
            tf.io.gfile.rmtree(path)
        else:
            tf.io.gfile.remove(path)
    except tf.errors.NotFoundError:
        return False
    except tf.errors.OpError as error:
        raise RemovalFailure(path, error.message) from None
    return True


def _tensorflow():
    """TensorFlow, for a URL only: a local path needs none (so `bench`'s
    reports, written by a process that has not loaded it, need none either)."""
    import tensorflow as tf

    return tf


def _open_folder(root: str, names: list[str]) -> int | None:
    """A descriptor of `root/names...`, each step opened without following a
    link; None where a step is a file.

    Raises:
      ConfigError: a step is a symbolic link.
      FileNotFoundError: a step does not exist.
    """
    fd = os.open(root, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    walked = root
    for name in names:
        walked = os.path.join(walked, name)
        try:
            next_fd = os.open(name, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=fd)
        except OSError as error:
            os.close(fd)
            if error.errno == errno.ELOOP or (error.errno == errno.ENOTDIR
                                              and os.path.islink(walked)):
                raise ConfigError(link_refused(walked)) from None
            if error.errno == errno.ENOTDIR:
                return None
            raise
        os.close(fd)
        fd = next_fd
    return fd


def link_refused(path: str) -> str:
    """The one line for a symbolic link where the run keeps a file or folder of its own."""
    return (f"{path} is a symbolic link, where the run keeps a file or folder of its own, and "
            "it never writes or removes through a link it did not make: remove the link "
            f"(rm {shlex.quote(path)}) and run again")


class RemovalFailure(RunFailure):
    """`remove` could not remove `path` (`reason`, a few words): one line
    saying so and what to do (`fix`), never blaming the free space; exit
    status 1, as a failure a restart alone cannot fix."""

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, one_line(reason, 80)
        parent = os.path.dirname(path.rstrip("/")) or "."
        self.fix = f"make {parent} writable, or remove {path} yourself,"
        super().__init__(f"could not remove {path} ({self.reason}), which the run left and "
                         f"removes: {self.fix} and run the same command")


def refuse_links(paths: list[str]) -> None:
    """Refuses, in one line, a symbolic link at any of `paths` (the names the
    run keeps under `model_dir`); URLs have none.

    Raises:
      ConfigError: one of them is a link (dangling or not).
    """
    for path in paths:
        if is_local(path) and os.path.islink(path):
            raise ConfigError(link_refused(path))


# --- Writing. ---


def write_atomically(path: str, text: str, *, mode: int = FILE_MODE) -> None:
    """`text` into `path`, all of it or nothing: written under a
    `temporary_name` created exclusively (never through a link, mode at most
    `mode`, 0644, whatever the umask), then renamed over `path`; however it
    fails, the temporary file is removed and `path` keeps what it held.

    Raises:
      OSError, tf.errors.OpError: the write or the rename failed.
    """
    temporary = temporary_name(path)
    if not is_local(path):
        tf = _tensorflow()
        try:
            with tf.io.gfile.GFile(temporary, "w") as f:
                f.write(text)
            tf.io.gfile.rename(temporary, path, overwrite=True)
        except BaseException:  # a signal too: no temporary file left behind
            with contextlib.suppress(tf.errors.OpError, OSError):
                if tf.io.gfile.exists(temporary):
                    tf.io.gfile.remove(temporary)
            raise
        return
    try:
        with create_exclusively(temporary, mode) as f:
            f.write(text)
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)  # ours: created exclusively above, or never there
        raise


def create_exclusively(path: str, mode: int = FILE_MODE) -> IO[str]:
    """A new text file at `path` to write (UTF-8), mode at most `mode`.

    Raises:
      FileExistsError: something is there already (a symbolic link too,
        dangling or not: O_EXCL never follows one).
      OSError, tf.errors.OpError: it could not be created.
    """
    if not is_local(path):
        tf = _tensorflow()
        if tf.io.gfile.exists(path):
            raise FileExistsError(errno.EEXIST, "exists", path)
        return tf.io.gfile.GFile(path, "w")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC, mode)
    return os.fdopen(fd, "w", encoding="utf-8")


def make_dirs(path: str) -> None:
    """Creates `path` and the folders above it that are missing, each with
    mode at most 0755 (`os.makedirs` gives the ones above 0777 less the umask)."""
    if not is_local(path):
        _tensorflow().io.gfile.makedirs(path)
        return
    missing = []
    path = os.path.abspath(path)
    while not os.path.isdir(path):
        missing.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, DIR_MODE)
        except FileExistsError:
            if not os.path.isdir(folder):
                raise


def private_dir(path: str) -> str:
    """`path`, a folder of this user's alone (mode 0700) in a shared place
    (the temporary directory): created so, or taken only if it is a real
    folder (not a link) owned by this user, its mode narrowed to 0700.

    Raises:
      OSError: it is a link, not a folder, or another user's.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise OSError(errno.EEXIST, "not a folder of its own (a link, or a file)", path)
    if info.st_uid != os.getuid():
        raise OSError(errno.EPERM, f"owned by user {info.st_uid}, not this one", path)
    if stat.S_IMODE(info.st_mode) != 0o700:
        os.chmod(path, 0o700)
    return path


@contextlib.contextmanager
def umask_at_least(mask: int = UMASK_AT_LEAST) -> Iterator[None]:
    """The process's umask masks at least `mask` inside; restored after."""
    before = narrow_umask(mask)
    try:
        yield
    finally:
        os.umask(before)


def narrow_umask(mask: int = UMASK_AT_LEAST) -> int:
    """Makes the umask mask at least `mask`; returns the one before, for
    `os.umask(before)` (the run lock holds it from acquire to release)."""
    before = os.umask(0o077)  # the strictest meanwhile: never a window at 0
    os.umask(before | mask)
    return before
