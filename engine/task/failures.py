"""A task's own failures, said in one line that names the task's method.

The engine runs the user's code in two ways, and each fails its own way:

- it *calls* the task's methods in Python (`build_model`, `train_dataset`,
  `eval_dataset`, `build_optimizer`, `objectives`, `from_config`) before
  training: an exception there is the task's, and a traceback through the
  engine hides which method raised. `calling(task, "build_model")` turns it
  into a `TaskError` (exit 2, nothing written) whose one line names the
  method and the exception, keeping the frames of the user's own code
  (`user_frames`, printed by the binaries after the line) and the original
  as `__cause__`;
- it *runs* the task's pipeline and loss inside compiled loops: what fails
  there arrives as a TensorFlow `OpError` mid-run, after checkpoints were
  written. `explain` reads which of the task's parts it came from (the
  dataset: an iterator's `GetNext` node, or `OutOfRangeError` in training;
  strings cast to numbers; the user's own frame in the node's "defined at"
  stack) and returns the `TaskFailure` (exit 1, checkpoints kept) naming the
  task's dataset or method, the step reached, the last checkpoint and the
  fix. An error it cannot trace to the task is left alone: it may be a bug,
  and keeps its traceback.

Damaged files that a pipeline registered explainers for (`inputs.data_errors`)
are that module's business: `explain` leaves them to it.

`exit_class` is the one place a failure of the run (the task's, the
cluster's, the collectives') becomes its exit class: `engine.assembly.run` runs every
stage under it. A cluster error (a peer lost: `UnavailableError`, ...) is
the lost-cluster class wherever it surfaces, a task method included: a peer
lost while `build_model` runs is not the task's mistake.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import sysconfig
import traceback
from typing import Any, Callable, Iterator, Optional

import tensorflow as tf

from tfloop.collectives import CollectiveError
from tfloop.engine.errors import (ClusterFailure, ConfigError, RunFailure, TaskError,
                                  TaskFailure, UnrecoverableFailure, one_line, steps_text)
from tfloop.inputs import InputError, data_errors
from tfloop.models import ModelError

#: What a task's method may raise on purpose: already one line (a
#: ClassificationTask's InputError for a missing file, say).
_ALREADY_SAID = (ConfigError, RunFailure, InputError, ModelError, CollectiveError)

#: The folders whose frames are not the user's: tfloop's packages (in a
#: checkout, their folders side by side), installed packages, the standard library.
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_NOT_USER = tuple(os.path.join(_ROOT, name) + os.sep for name in (
    "engine", "collectives", "models", "inputs", "bin", "launch", "bench")) + tuple(
    {os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "platstdlib",
                                                               "purelib", "platlib")})


def is_user_file(path: str) -> bool:
    """Whether `path` is the user's code (not tfloop, an installed package,
    Python's, or a file autograph generated from the user's function)."""
    path = os.path.abspath(path)
    return not (path.startswith(_NOT_USER) or "site-packages" in path or "dist-packages" in path
                or path.startswith("<") or "__autograph_generated_file" in path)


def user_frames(error: BaseException) -> str:
    """The traceback lines of `error` that are in the user's own files; for
    an error autograph reports (`in user code:` and the frames of the
    function it was converting, in the message), those frames."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if is_user_file(f.filename)]
    text = "".join(traceback.format_list(frames))
    lines = str(error).splitlines()
    if lines and lines[0].startswith("in user code:"):
        for line, code in zip(lines, lines[1:] + [""]):
            found = re.match(r'\s*File "([^"]+)", line \d+, in \S+', line)
            if found and is_user_file(found.group(1)):
                text += f"  {line.strip().rstrip(' *')}\n    {code.strip()}\n"
    return text.rstrip("\n")


def _said(error: BaseException) -> str:
    """`ValueError: message` in one line; for an autograph report, its last
    line (which names the original error) instead of `in user code:`."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if lines and lines[0].startswith("in user code:") and len(lines) > 1:
        return one_line(lines[-1], 240)
    reason = one_line(str(error), 200)
    return f"{type(error).__name__}{': ' + reason if reason else ''}"


@contextlib.contextmanager
def calling(task: Any, method: str) -> Iterator[None]:
    """Runs a call of `task`'s (an instance's or a class's) `method`: what it
    raises (other than the packages' own one-line errors) leaves as a
    `TaskError` naming it."""
    try:
        yield
    except _ALREADY_SAID:
        raise
    except SystemExit as exiting:
        name = task.__name__ if isinstance(task, type) else type(task).__name__
        raise exit_error(f"{name}.{method}", exiting) from None
    except Exception as error:
        name = task.__name__ if isinstance(task, type) else type(task).__name__
        raise hook_error(f"{name}.{method}", error) from error


def exit_error(where: str, exiting: SystemExit) -> TaskError:
    """The `TaskError` for the user's `where` calling `sys.exit` (or raising
    `SystemExit`): left alone, `sys.exit(0)` ends the run with status 0,
    nothing trained and nothing said, which a platform takes for success."""
    return TaskError(f"{where} called sys.exit({exiting.code!r}), which would end the run "
                     "as if it had succeeded; return from it instead (a task's code, and the "
                     "module it is in, must not end the process)", user_frames(exiting))


def hook_error(where: str, error: BaseException) -> TaskError:
    """The `TaskError` for `error` raised by the user's `where` (`Tiny.loss`)."""
    return TaskError(f"{where} raised {_said(error)}", user_frames(error))


_ROOT_ERROR = re.compile(r"\(\d+\) (?!CANCELLED)[A-Z_]+:\s*(.+)")
_NOISE = ("Graph execution error", "Detected at node", "<stack traces", "File ", "[[",
          "0 successful operations", "0 derived errors")
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')
_CAST_STRING = re.compile(r"Cast string to \w+ is not supported")


def _reason(message: str) -> str:
    """What went wrong, out of TensorFlow's report: the first root error's
    text (a py_function's `OSError: ...` included), without node markers."""
    found = _ROOT_ERROR.search(message)
    if found:
        text = found.group(1)
    else:
        lines = [line.strip() for line in message.splitlines()]
        lines = [line for line in lines if line and not line.startswith(_NOISE)]
        text = lines[0] if lines else message
    text = re.sub(r"\s*\[Op:[^\]]*\]", "", text)
    # A map's Python error, as tf.data words it with one intra-op thread.
    text = re.sub(r"^Error in user-defined function passed to \S+ transformation with "
                  r"iterator: \S+: ", "", text)
    return one_line(text, 200)


def _from_pipeline(message: str) -> bool:
    """The error was raised while a batch was read: a node it names is an
    iterator's `GetNext` (the loop's own, or a device's shard of it), and
    none is inside a replica's step."""
    nodes = re.findall(r"\[\[(.*?)\]\]", message)
    return (any("IteratorGetNext" in node for node in nodes)
            and not any(re.search(r"\{\{node [^}]*replica", node) for node in nodes))


def _user_frame(message: str) -> Optional[str]:
    """`file.py:12 in loss`: the innermost frame of the user's code in the
    failing node's "defined at" stack, or None (the stack is not available,
    or holds only tfloop's, TensorFlow's and Keras's code)."""
    frames = [f for f in _FRAME.findall(message) if is_user_file(f[0])]
    if not frames:
        return None
    path, line, function = frames[-1]
    return f"{posixpath.basename(path)}:{line} in {function}"


def explain(error: tf.errors.OpError, *, task: Any, running: Optional[str],
            steps: tuple[int, int], model_dir: str) -> Optional[TaskFailure]:
    """The `TaskFailure` that `error` stands for, raised while the Controller
    ran `running` ("train" or "evaluate") over `steps` (the global step it
    began after and the one it was to end at); None when nothing traces it
    to the task."""
    if running not in ("train", "evaluate") or data_errors.explain(error) is not None:
        return None
    message = error.message or str(error)
    name = type(task).__name__
    dataset = f"{name}.{'train_dataset' if running == 'train' else 'eval_dataset'}"
    when = (f"in {steps_text(*steps)}" if running == "train"
            else f"evaluating at step {steps[1]}")
    latest = tf.train.latest_checkpoint(model_dir) if model_dir else None
    resume = (f"the last checkpoint is {posixpath.basename(latest)}, and the same command "
              "resumes from it" if latest else "no checkpoint was saved yet")
    reason = _reason(message)
    # TensorFlow may raise OutOfRangeError for a pipeline that failed (a
    # generator's OSError shows as another root error): ran out only if none.
    if running == "train" and isinstance(error, tf.errors.OutOfRangeError) and not re.search(
            r"\(\d+\) (?!OUT_OF_RANGE|CANCELLED)[A-Z_]+:", message):
        return TaskFailure(
            f"{dataset} stopped yielding batches {when} ({reason}), and training runs by "
            "steps: make it endless with .repeat() (a .filter() or a generator hides its end "
            "from the start-up check), or find what ended it early (over several devices a "
            f"generator's exception can arrive as this end); {resume}")
    if _CAST_STRING.search(message):
        return TaskFailure(
            f"{dataset}'s batches reach the model as strings ({reason}) {when}: turn them into "
            "numbers in the pipeline (tf.strings.to_number) or in the model "
            f"(keras.layers.StringLookup); {resume}")
    if _from_pipeline(message):
        return TaskFailure(
            f"{dataset} failed {when}: {reason}; fix the pipeline or the files it reads; {resume}")
    frame = _user_frame(message)
    step = "train" if running == "train" else "eval"
    node = re.search(r"Detected at node (\S+)", message)
    if frame is None and isinstance(error, tf.errors.InvalidArgumentError) and node:
        # A value the step's ops refuse (a label out of range, say) met by a
        # node TensorFlow built for the task's loss, such as its gradient,
        # whose stack does not reach the user's code: which node meets it
        # first is a race between replicas and threads, so it is said the same.
        return TaskFailure(
            f"{name}'s {step} step failed {when} with InvalidArgumentError: {reason} (at "
            f"{node.group(1)}): a value the task's data or loss gives is outside what the op "
            f"takes; {resume}")
    if frame is None:
        return None
    return TaskFailure(
        f"{name}'s code ({frame}) failed in the {step} step {when} with {type(error).__name__}: {reason}; {resume}")


def explainer(task: Any, phase: Callable[[], tuple], model_dir: str
              ) -> Callable[[tf.errors.OpError], Optional[TaskFailure]]:
    """`explain` for `exit_class`, bound to `task` and `phase()`, the
    Controller's `(running, running_steps)` when the error arrives."""
    def explain_now(error: tf.errors.OpError) -> Optional[TaskFailure]:
        running, steps = phase()
        return explain(error, task=task, running=running, steps=steps, model_dir=model_dir)
    return explain_now


def lost_peer(error: BaseException, lost_peer_errors: tuple) -> Optional[BaseException]:
    """The error of `lost_peer_errors` that `error` is, or that a task method
    raised (`calling` wrapped it in a `TaskError` whose cause it is); None."""
    if not lost_peer_errors:
        return None
    if isinstance(error, lost_peer_errors):
        return error
    if isinstance(error, TaskError) and isinstance(error.__cause__, lost_peer_errors):
        return error
    return None


@contextlib.contextmanager
def exit_class(role: str, *, step: Optional[Callable[[], int]] = None,
               checkpoint: Callable[[], Optional[str]], lost_peer_errors: tuple = (),
               unrecoverable_errors: tuple = (),
               explain_task: Optional[Callable[[tf.errors.OpError], Optional[TaskFailure]]] = None
               ) -> Iterator[None]:
    """Runs a stage of a run; what fails in it leaves in its exit class, in one line:

    - `unrecoverable_errors` (the strategy's: an NCCL `InternalError`) ->
      `UnrecoverableFailure` (exit 1: a restart would fail the same way);
    - `lost_peer_errors` (the strategy's: a peer that died or went silent),
      raised by the engine's code or inside one of the task's methods ->
      `ClusterFailure` (exit 138: restart every task from the last checkpoint);
    - another `OpError` that `explain_task` traces to the task -> its
      `TaskFailure` (exit 1);
    - anything else as it was.

    `role` names this process (`worker:1`); `step()` the step reached (None:
    training has not begun); `checkpoint()` the last checkpoint, asked only
    when something failed.
    """
    try:
        yield
    except unrecoverable_errors as error:
        raise UnrecoverableFailure(
            f"{role} failed {_when(step, 'at')} with {type(error).__name__}: "
            f"{one_line(str(error), 160)}; not a lost peer: a restart would fail the same way "
            f"(the last checkpoint is {checkpoint() or 'none'})") from None
    except BaseException as error:
        lost = lost_peer(error, lost_peer_errors)
        if lost is not None:
            raise ClusterFailure(
                f"{role} lost the cluster {_when(step, 'after')} ({one_line(str(lost), 160)}); "
                f"the last checkpoint is {checkpoint() or 'none'}: restart every task to resume "
                "from it (bin/launch --max_restarts does)") from None
        if isinstance(error, tf.errors.OpError) and explain_task is not None:
            failure = explain_task(error)
            if failure is not None:
                raise failure from None
        raise


def _when(step: Optional[Callable[[], int]], preposition: str) -> str:
    return "before training began" if step is None else f"{preposition} step {step()}"
