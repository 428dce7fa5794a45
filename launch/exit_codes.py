"""The one exit-code contract: what each status of a tfloop binary means, and
which ones a restart can fix.

Platforms that restart jobs decide from the exit status alone. Kubeflow's
TFJob with `restartPolicy: ExitCode` treats 1-127 as permanent and 128-255 as
retryable (training-operator release-1.9, `pkg/util/train/train_util.go`:
`exitCode >= 128`), a JobSet's `podFailurePolicy` matches codes, and
`bin/launch` restarts on the same set, so a run and its supervisor agree on
one question: would running the same command again, on every task, help?

    0    DONE           the run did its work
    1    FAILED         a failure a restart cannot fix: a NaN stop, a full disk,
                        an InternalError, a bug, a task's data that ran out
    2    USAGE          a mistake in the request (flags, TF_CONFIG, the task);
                        nothing was written
    3    UNRECOVERABLE  the training finished but its product was lost (the
                        export failed): fix the cause, rerun to export
    130  INTERRUPTED    Ctrl-C; saved, not finished
    138  RESTART        restart every task from the last checkpoint: a peer was
                        lost, the cluster never formed, storage could not be
                        reached (138 is the conventional user-defined retryable
                        code; Kubeflow's docs list it so)
    143  PREEMPTED      SIGTERM; saved, not finished

Standard library only: the launcher, the engine and the binaries all read it.
"""

import signal

DONE = 0
FAILED = 1
USAGE = 2
UNRECOVERABLE = 3
INTERRUPTED = 130
RESTART = 138
PREEMPTED = 143

MEANINGS = {
    DONE: "done",
    FAILED: "failed: a restart cannot fix it",
    USAGE: "a mistake in the request",
    UNRECOVERABLE: "trained, but its product was lost",
    INTERRUPTED: "interrupted (Ctrl-C), saved",
    RESTART: "restart every task from the last checkpoint",
    PREEMPTED: "terminated (SIGTERM), saved",
}


def shell_status(returncode: int) -> int:
    """The status a shell (and Kubernetes) reports for a `subprocess.Popen`
    return code: 128+N for a process killed by signal N (Popen says -N)."""
    return 128 - returncode if returncode < 0 else returncode


def meaning(status: int) -> str:
    """What an exit status means: `restart every task from the last checkpoint`.

    A status above 128 that no row of the table holds is 128+N for a process
    killed by signal N only where N is a signal (129..128+NSIG-1); 200 or 255
    is a status a program chose, retryable by the platforms' rule."""
    known = MEANINGS.get(status)
    if known is not None:
        return known
    if 128 < status < 128 + signal.NSIG:
        return f"killed by {signal_name(status - 128)}; restart every task from the last checkpoint"
    if retryable(status):
        return "retryable (128 or above): restart every task from the last checkpoint"
    return "a restart cannot fix it"


def signal_name(signum: int) -> str:
    """`SIGTERM` for 15; `signal 40` for a number without a name."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def returncode_meaning(returncode: int) -> str:
    """What a `subprocess.Popen` return code means. A negative one is a
    process killed by a signal it did not handle. For SIGTERM and SIGINT
    that is not the table's `143: terminated (SIGTERM), saved`: a tfloop
    binary that handles them saves first, then exits 143 or 130 itself; one
    killed by them saved nothing at the signal."""
    if -returncode in (signal.SIGTERM, signal.SIGINT):
        return (f"killed by {signal_name(-returncode)}, which it did not handle: nothing was "
                "saved at the signal; restart every task from the last checkpoint")
    return meaning(shell_status(returncode))


def describe_returncode(returncode: int) -> str:
    """`describe` for a `subprocess.Popen` return code: `exit 143: killed by
    SIGTERM, which it did not handle: ...` for -15, `describe(143)` for 143,
    `describe(137)` for -9."""
    return f"exit {shell_status(returncode)}: {returncode_meaning(returncode)}"


def describe(status: int) -> str:
    """The class of an exit status, as the last line of a failed run names it:
    `exit 138: restart every task from the last checkpoint`. The one wording,
    used by the binaries (`bin/cli`), the cluster watchdog and `bin/launch`."""
    return f"exit {status}: {meaning(status)}"


def with_class(message: str, status: int) -> str:
    """`message (exit 138: restart every task from the last checkpoint)`: a
    failed run's last line names its exit class (`describe`), so a person
    reading a platform's log knows at once whether the job will be restarted.
    Left as they are: a usage mistake (2: its `error:` line says what to fix,
    and nothing ran) and a signal's line (130, 143: `preempted (SIGTERM) at
    step N; saved ...` names its class already). Used by the binaries
    (`bin/cli`) and by a script's excepthook (`engine.runtime.script_exit`)."""
    if status in (DONE, USAGE, INTERRUPTED, PREEMPTED):
        return message
    return f"{message} ({describe(status)})"


def retryable(status: int) -> bool:
    """Whether a restart of every task can fix a run that ended with `status`:
    the platforms' rule (128 and above), which also covers a task killed by a
    signal (128+N)."""
    return status >= 128
