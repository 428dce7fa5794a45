"""One writer per `--model_dir`: a lock that dies with its holder.

Two runs writing one `model_dir` lose one run's weights (each saves over the
other's checkpoints, and both exit 0) or crash in each other's temporary save
directories. So the process that writes `model_dir` holds, for its whole run,
an `fcntl.flock` on a file inside it: `train.lock` for training (only the
chief of a cluster; the other workers save elsewhere), `evaluate.lock` for
`--mode=evaluate` and the evaluator task (which writes `evaluations.json`,
`summaries/eval` and `best/` beside a running chief). The file names the
holder (`pid host`); a second taker is refused in one line naming them.

The kernel releases a flock when its holder dies, however it dies (kill -9
included), so nothing is ever stale; the file itself stays (removing it
would let a third process lock a fresh file while a second one still locks
the old). On a network filesystem flock is as good as the filesystem's
locking: Linux NFS maps it onto NFS byte-range locks, which work across
machines with a working lock manager; FUSE mounts of object stores usually
do not lock at all. A `model_dir` URL (`gs://...`, `ram://...`) is not locked:
there, one writer per directory is the user's job.

While it holds the lock, the process's umask masks at least group and other
write (`engine.runtime.files.umask_at_least`): what TensorFlow writes under
`model_dir` (checkpoints, event files, exports) is then at most 0644, its
folders 0755, whatever umask the run was started with; `release` restores
the umask. `model_dir` itself, if the lock creates it, is made 0755.

The lock file is opened without following a symbolic link (`O_NOFOLLOW`) and
without blocking (`O_NONBLOCK`), and must be a regular file: taking the lock
truncates the file and writes the holder into it, so a `train.lock` symlinked
to any file the user can write would replace that file's content, and a FIFO
in its place would hang the read-only probe in `open`. Either is one line.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import shlex
import socket
import stat
from typing import Optional

from tfloop.engine.errors import ConfigError
from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import files

logger = logging.getLogger(__name__)

TRAIN = "train"
EVALUATE = "evaluate"


def lock_path(model_dir: str, name: str) -> str:
    return layout.RunDir(model_dir).lock(name)


def lockable(model_dir: str) -> bool:
    """A local path; a URL (`gs://...`) is not locked (module docstring)."""
    return "://" not in model_dir


class RunLock:
    """A held lock on `model_dir`; `release()` (or the holder's death) frees it.

    Attributes:
      path: the lock file.
      created: the outermost directory `acquire` created for `model_dir`
        (None when it existed): what `discard` removes if the run fails
        before it has written anything worth keeping.
    """

    def __init__(self, path: str, fd: int, created: Optional[str], umask: Optional[int] = None):
        self.path = path
        self.created = created
        self._fd: Optional[int] = fd
        self._umask = umask

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing the last descriptor releases the flock
            self._fd = None
        if self._umask is not None:
            os.umask(self._umask)
            self._umask = None

    def keep(self) -> None:
        """From now on `model_dir` holds the run's work: `discard` leaves it."""
        self.created = None

    def discard(self) -> None:
        """Releases the lock and removes the `model_dir` this run created:
        for a run that failed before training (a user error after the lock),
        so that a mistake leaves no half-written directory behind."""
        self.release()
        if self.created:
            files.remove_quietly(self.created, within=os.path.dirname(self.created))
            self.created = None


def acquire(model_dir: str, name: str = TRAIN) -> Optional[RunLock]:
    """Takes `model_dir`'s `name` lock, creating `model_dir` if needed; None
    for a URL `model_dir`.

    Raises:
      ConfigError: another live process holds it (one line naming it).
    """
    if not lockable(model_dir):
        logger.info("--model_dir=%s is not a local path: not locked; make sure one run "
                    "writes it at a time", model_dir)
        return None
    where = os.path.abspath(model_dir)
    created = _outermost_missing(where)
    files.make_dirs(where)
    path = lock_path(where, name)
    fd = _open(path, os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise
        raise ConfigError(_in_use(model_dir, path)) from None
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()} {socket.gethostname()}\n".encode())
    return RunLock(path, fd, created, umask=files.narrow_umask())


def check_free(model_dir: str, name: str = TRAIN) -> None:
    """Refuses, in one line, a `model_dir` whose `name` lock another process
    holds; writes nothing (a shared lock taken and dropped at once), so the
    plan can say it before any work.

    Raises:
      ConfigError: the lock is held.
    """
    if not lockable(model_dir):
        return
    path = lock_path(os.path.abspath(model_dir), name)
    try:
        fd = _open(path, os.O_RDONLY)
    except OSError:
        return  # no lock file: nobody ever locked it
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except OSError as error:
        if error.errno not in (errno.EAGAIN, errno.EWOULDBLOCK, errno.EACCES):
            raise
        raise ConfigError(_in_use(model_dir, path)) from None
    finally:
        os.close(fd)


def _open(path: str, flags: int) -> int:
    """The lock file `path`, opened with `flags`: never through a symbolic
    link, never blocking, and only if it is a regular file (module docstring).

    Raises:
      ConfigError: `path` is a link, a directory, a FIFO, ..., or may not be
        opened (one line).
    """
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.EISDIR):
            raise ConfigError(_not_a_lock_file(path)) from None
        if error.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise ConfigError(f"{path} cannot be opened to take the lock ({error.strerror}); "
                              "make it writable (chmod u+w) or remove it, and run again") from None
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ConfigError(_not_a_lock_file(path))
    return fd


def _not_a_lock_file(path: str) -> str:
    if os.path.islink(path):
        return (f"{path} is a symbolic link, not a lock file: remove it "
                f"(rm {shlex.quote(path)}) and run again")
    try:
        mode = os.lstat(path).st_mode
    except OSError:
        mode = 0
    kind = ("directory" if stat.S_ISDIR(mode) else "fifo" if stat.S_ISFIFO(mode)
            else "special file")
    return f"{path} is a {kind}, not a lock file: move it away and run again"


def holder(path: str) -> tuple[str, str]:
    """(pid, host) the lock file names; "?" for what it does not say (a
    holder that has not written it yet)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            words = f.read().split()
    except OSError:
        words = []
    return (words[0] if words else "?"), (words[1] if len(words) > 1 else "?")


def _in_use(model_dir: str, path: str) -> str:
    pid, host = holder(path)
    return (f"--model_dir={model_dir} is in use by process {pid} on host {host}; "
            "wait for it to end or use another --model_dir")


def _outermost_missing(path: str) -> Optional[str]:
    missing = None
    while not os.path.exists(path):
        missing, path = path, os.path.dirname(path)
    return missing
