"""Stops a launcher's tasks when the launcher dies without stopping them itself.

`bin/launch` stops every task on its way out, whatever ends it, except what
it cannot see coming: `kill -9`, the OOM killer, a crash of the interpreter.
Its tasks would then train on, unsupervised, into the chief's `--model_dir`.
Two things make them die with it:

- each task's process asks the kernel for SIGKILL when the launcher dies
  (`die_with_parent`: Linux's `PR_SET_PDEATHSIG`, set between fork and exec;
  the kernel sends it when the *thread* that started the task ends, which is
  the thread running `Launcher.run`, alive until every task is stopped);
- this guardian, a small process of its own (own session, so a signal to the
  launcher's process group does not reach it), reads the process groups of the
  running tasks from a pipe whose only writer is the launcher. The pipe's end
  (EOF) without a final `done` means the launcher is gone: the guardian
  SIGKILLs every group it was told about and not yet told is stopped, so a
  task's own children (a shell's command, data loaders) go too, and exits.
  Pipes close when their owner dies on every POSIX system, so this half also
  works where `PR_SET_PDEATHSIG` does not exist (macOS).

Protocol, one line each on the guardian's stdin: `+PGID` (a task started, in
its own group), `-PGID` (that group was stopped and reaped), `done` (the
launcher is leaving normally: nothing to kill).

Standard library only, run by path (`python -I -S guardian.py`), so it starts
in milliseconds.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from typing import Callable, Optional

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> Optional[Callable[[], None]]:
    """A `preexec_fn` that makes the child get SIGKILL when its parent dies
    (Linux); None where the kernel has no such request.

    `prctl` is looked up here, in the parent, so that the child, between fork
    and exec, only calls it. A parent that died before the request was made
    is caught by comparing the parent's pid afterwards.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                      ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    parent = os.getpid()

    def request() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the request: do it now
            os._exit(128 + signal.SIGKILL)

    return request


def watch(lines) -> list[int]:
    """Reads the protocol from `lines` until EOF; returns the groups to kill
    (none after `done`)."""
    groups: list[int] = []
    for line in lines:
        line = line.strip()
        if line == "done":
            return []
        if line[:1] == "+" and line[1:].isdigit():
            groups.append(int(line[1:]))
        elif line[:1] == "-" and line[1:].isdigit() and int(line[1:]) in groups:
            groups.remove(int(line[1:]))
    return groups


def main() -> None:
    # A terminal's Ctrl-C is the launcher's to handle (it stops the tasks in
    # order); the guardian only acts on the launcher's disappearance.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for group in watch(sys.stdin):
        try:
            os.killpg(group, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


if __name__ == "__main__":
    main()
