"""The error users see: one line, no traceback.

Library code raises `ConfigError` for a mistake in what the user asked for
(unknown name, missing file, impossible device layout). The binaries print its
message on stderr and exit with status 2, as they do the other packages' own
user-error types (`collectives.CollectiveError`, ...); a `RunFailure` is one
line and the status it means (`exit_status`, from the one table,
`launch.exit_codes`): 1 for a failure a restart cannot fix (a full disk, a NaN
stop, an `InternalError`), 3 for a lost product (the export), 138 for
"restart every task" (a lost peer, storage out of reach); anything else is a
bug and keeps its traceback. Importing this module imports no TensorFlow
(`re` and the standard-library `launch` aside), so the binaries can define
their flags from `engine.config` before TensorFlow loads.
"""

import re

from tfloop.launch import exit_codes


class ConfigError(ValueError):
    """What the user asked for cannot be done; the message says how to fix it."""


class RunFailure(RuntimeError):
    """The run failed for a reason outside the program and the request (a
    full disk, a lost peer): not the user's mistake, and nothing to debug in
    a traceback. The binaries print one line and exit with `exit_status`
    (1 here: a restart alone does not fix a full disk); the last checkpoint
    is intact, and the same command resumes from it once the cause is fixed.
    """

    exit_status = exit_codes.FAILED


class ClusterFailure(RunFailure):
    """A multi-worker run lost a peer: mid-training, or after the cluster
    formed but before step 1.

    Not the user's mistake, and nothing to debug in a traceback: the binaries
    print one line and exit with status 138 (`exit_codes.RESTART`), the
    retryable class: restarting every task resumes from the last checkpoint
    (`bin/launch --max_restarts` does it, as do TFJob's `ExitCode` policy and
    a JobSet's `failurePolicy`). The survivors' status is what a platform
    that recreates only the failed pod decides on, so it must be retryable.
    """

    exit_status = exit_codes.RESTART


class StorageUnavailable(RunFailure):
    """`--model_dir` could not be reached (`gs://` with no network, a storage
    outage): one line naming the path and the reason, status 138, since the
    same command works once the storage answers. (Access refused is a
    `ConfigError`: a restart cannot grant it.) Raised where the engine first
    touches `model_dir` (`engine.run_dir.storage`), before anything is written.
    """

    exit_status = exit_codes.RESTART


class NonFinite(RunFailure):
    """Training produced a non-finite loss, gradient norm or weight.

    The run stops at the end of the loop it happened in, before anything is
    saved or exported, so the newest checkpoint is still the last good one;
    the message names the steps. A `RunFailure`: one line, exit status 1
    (permanent: a restart would resume at the same step and fail the same way).
    """


class TaskFailure(RunFailure):
    """The task's data or step failed mid-run: its train dataset ran out or
    raised, its batches reached the model as strings, its own code in the
    step raised (`engine.task.failures`). Found only after training began,
    so the checkpoints it wrote stay (exit 2 promises nothing written): one
    line naming the task's method, the step reached, the last checkpoint and
    the fix; exit status 1; once fixed, the same command resumes from the
    last checkpoint.
    """


class TaskError(ConfigError):
    """One of the task's own methods (`build_model`, `train_dataset`, ...)
    raised before training began: a mistake in the task, exit status 2,
    nothing written. The message is one line naming the method and the
    exception; `user_frames` holds the traceback of the user's own code
    (frames of tfloop, TensorFlow and Keras left out), which the binaries
    print after that line; the original exception is the `__cause__`.
    """

    def __init__(self, message: str, user_frames: str = ""):
        super().__init__(message)
        self.user_frames = user_frames


class UnrecoverableFailure(RunFailure):
    """The run failed in a way no restart can fix (TensorFlow's `InternalError`
    from an NCCL set-up or a dtype it lacks): the error is named as itself,
    in one line, and the binaries exit with `exit_status` (1, `FAILED`, as
    the table has it: not the retryable class), which `bin/launch
    --max_restarts` does not restart (nor any status below 128).
    """

    exit_status = exit_codes.FAILED


class ExportFailure(UnrecoverableFailure):
    """Writing an export failed (a full disk, a folder without write
    permission): one line naming the folder and its free space; the
    checkpoints are intact and no temporary export folder is left.

    Exit status 3, as a failure a restart cannot fix: a restart (`bin/launch
    --max_restarts`) would resume at the same step, train nothing, and write
    the same export to the same disk; someone must free space first, then
    the same command writes the missing export. (3 rather than 1: the
    training itself is done, only its product is missing.)

    `fix`: what to do before the same command writes it ("free some space"
    for a full disk only; a folder that may not be written, or an old export
    that cannot be removed, is not fixed by space).
    """

    exit_status = exit_codes.UNRECOVERABLE

    def __init__(self, message: str, fix: str = "free some space"):
        super().__init__(message)
        self.fix = fix


class Terminated(BaseException):
    """SIGTERM reached a script (`tfloop.run` or `tfloop.fit` without
    `bin/`) outside the training loop, where no checkpoint is saved at the
    signal (while the task's `build_model` runs, say): one line, exit 143,
    the run's lock released and a `model_dir` it created and never trained
    in removed (`engine.runtime.script_exit.signals_of_a_script`). A
    BaseException, so that no `except Exception` on its way (the task's own
    code, TensorFlow's) stops it."""

    exit_status = exit_codes.PREEMPTED

    def __init__(self, message: str = "terminated (SIGTERM) outside the training loop; nothing "
                 "was saved at the signal: run the same command (it resumes from the last "
                 "checkpoint)"):
        super().__init__(message)


def one_line(text: str, limit: int = 120) -> str:
    """The first line of `text` (an error's message quoted inside one of
    ours), at most about `limit` characters, cut at a word boundary with an
    ellipsis; TensorFlow's `{{node ...}}` markers dropped."""
    line = re.sub(r"\{\{[^}]*\}\}\s*", "", text.strip()).split("\n", 1)[0].strip()
    if len(line) <= limit:
        return line
    cut = line.rfind(" ", 0, limit)
    return line[:cut if cut > 0 else limit].rstrip(" ,;:(") + "..."


def steps_text(start: int, end: int) -> str:
    """`step 7` for a loop of one step, `steps 101..200` for a longer one
    (a step is numbered by the global step it ends at, as the progress lines
    and `ckpt-<step>` are)."""
    return f"step {end}" if end - start <= 1 else f"steps {start + 1}..{end}"
