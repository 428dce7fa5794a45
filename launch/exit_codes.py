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
    """What an exit status means: `restart every task from the last checkpoint`."""
    known = MEANINGS.get(status)
    if known is not None:
        return known
    if status > 128:
        try:
            name = signal.Signals(status - 128).name
        except ValueError:
            name = f"signal {status - 128}"
        return f"killed by {name}; restart every task from the last checkpoint"
    return "retryable" if retryable(status) else "a restart cannot fix it"


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
