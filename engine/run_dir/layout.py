"""Every file and folder under `--model_dir`, named here and nowhere else,
and the atomic reads and writes of the run's records.

    <model_dir>/
      run.json               what trained it and with which recipe (run_dir.run_identity)
      metrics.json           how the training run went, rewritten as it goes (run_dir.run_record)
      evaluations.json       evaluations made afterwards (--mode=evaluate, the evaluator task)
      checkpoint             TensorFlow's checkpoint state file (run_dir.checkpoint_files)
      ckpt-<step>.index, ckpt-<step>.data-*   the checkpoints (tf.train.CheckpointManager)
      ckpt-<step>_temp/      a save in progress; a kill leaves it, the next run removes it
      damaged/               checkpoints that do not read, set aside, never deleted
      train.lock, evaluate.lock   one writer each (run_dir.run_lock)
      summaries/train/, summaries/eval/   TensorBoard event files (and profiler traces)
      export/<step>/         SavedModel + model.keras (run_dir.export);
      export/.<step>.tmp-*/  one being written
      best/                  the best evaluation (loop.best): best.json, state.json,
                             ckpt-<step>, export/<step>/
      fit_epochs.json        the last epoch whose end `fit` told its Keras callbacks
                             (keras_fit.callbacks: told once, across kills)
      diagnostics/           hang-<task>-<pid>-<n>.txt: what a task was doing when no
                             loop ended in --hang_timeout, or when asked (runtime.hang)

`RunDir(model_dir)` gives each path. Paths are joined with `posixpath`: every
TensorFlow filesystem (a local path, gs://, ram://) takes `/`, and one joiner
keeps `os.path` and `posixpath` from mixing. The records are written through
`engine.runtime.files` atomically (`write_text`: a temporary file renamed over
the old one, so a reader sees all of one version or the other; never
through a symbolic link) and read back with one-line errors (`read_json`).
`RunDir.kept_paths` lists the names the run keeps, where a symbolic link is
refused before anything is written.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import posixpath
import re
import uuid
from typing import Optional

import tensorflow as tf

from tfloop.engine.errors import ConfigError, RunFailure, one_line
from tfloop.engine.runtime import disk, files

logger = logging.getLogger(__name__)

RUN_JSON = "run.json"
METRICS_JSON = "metrics.json"
EVALUATIONS_JSON = "evaluations.json"
#: TensorFlow's checkpoint state file, and the prefix of each checkpoint.
CHECKPOINT_STATE = "checkpoint"
CHECKPOINT_PREFIX = "ckpt"
DAMAGED = "damaged"
SUMMARIES = "summaries"
EXPORT = "export"
BEST = "best"
BEST_JSON = "best.json"
BEST_STATE = "state.json"
DIAGNOSTICS = "diagnostics"
FIT_EPOCHS = "fit_epochs.json"
#: A file `write_text` is writing: `<name>.tmp-<16 hex>` (`engine.runtime.files`).
RECORD_TEMP = re.compile(rf"^.+{re.escape(files.TEMPORARY_INFIX)}[0-9a-f]{{16}}$")
#: A checkpoint's files; a save in progress (TensorFlow names it); an export
#: being written (`export/.<step>.tmp-<8 hex>`, renamed into place when done).
CHECKPOINT_FILE = re.compile(rf"^{CHECKPOINT_PREFIX}-(\d+)\.(index|data-\d+-of-\d+)$")
CHECKPOINT_TEMP = re.compile(rf"^{CHECKPOINT_PREFIX}-\d+_temp$")
EXPORT_STAGING = re.compile(r"^\.\d+\.tmp-[0-9a-f]{8}$")



def run_digest(model_dir: str) -> str:
    """A short name for one run, from where its `model_dir` is: folders the run
    keeps outside `model_dir` (a worker's share of saving in the temporary
    directory, local checkpoints) carry it, so a restart of the same run
    finds them and another run's are left alone."""
    where = model_dir if "://" in model_dir else os.path.abspath(model_dir)
    return hashlib.sha1(where.encode()).hexdigest()[:10]

@dataclasses.dataclass(frozen=True)
class RunDir:
    """The paths of one `model_dir` (a local path or a TensorFlow URL).

    `summaries_root`: where the TensorBoard summaries go when not under
    `model_dir` (`--summaries_dir`, e.g. Vertex AI's `AIP_TENSORBOARD_LOG_DIR`).
    """

    root: str
    summaries_root: Optional[str] = None

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    @property
    def run_json(self) -> str:
        return self.path(RUN_JSON)

    @property
    def metrics_json(self) -> str:
        return self.path(METRICS_JSON)

    @property
    def evaluations_json(self) -> str:
        return self.path(EVALUATIONS_JSON)

    @property
    def checkpoint_state(self) -> str:
        return self.path(CHECKPOINT_STATE)

    def checkpoint(self, step: int) -> str:
        """The prefix of `ckpt-<step>` (its `.index` and `.data-*` files)."""
        return self.path(f"{CHECKPOINT_PREFIX}-{step}")

    @property
    def checkpoints_glob(self) -> str:
        return self.path(f"{CHECKPOINT_PREFIX}-*")

    @property
    def damaged(self) -> str:
        return self.path(DAMAGED)

    def lock(self, name: str) -> str:
        """`train.lock` or `evaluate.lock` (run_dir.run_lock)."""
        return self.path(f"{name}.lock")

    def summaries(self, kind: str = "") -> str:
        """`summaries/` or `summaries/<kind>` (train, eval), or `summaries_root`'s."""
        base = self.summaries_root or self.path(SUMMARIES)
        return posixpath.join(base, kind) if kind else base

    @property
    def exports(self) -> str:
        return self.path(EXPORT)

    def export(self, step: int) -> str:
        return self.path(EXPORT, str(step))

    def export_staging(self, step: int) -> str:
        """A fresh folder to write the export of `step` in, beside its final place."""
        return self.path(EXPORT, f".{step}.tmp-{uuid.uuid4().hex[:8]}")

    def checkpoint_temp(self, step: int) -> str:
        """Where TensorFlow writes `ckpt-<step>` before it renames it into place."""
        return self.checkpoint(step) + "_temp"

    @property
    def best(self) -> "RunDir":
        """`best/`, itself laid out like a run: its own checkpoints and exports."""
        return RunDir(self.path(BEST))

    @property
    def best_json(self) -> str:
        return self.path(BEST_JSON)

    @property
    def best_state(self) -> str:
        return self.path(BEST_STATE)

    @property
    def fit_epochs_json(self) -> str:
        return self.path(FIT_EPOCHS)

    @property
    def diagnostics(self) -> str:
        return self.path(DIAGNOSTICS)

    def hang_dump(self, task: str, pid: int, number: int) -> str:
        """`diagnostics/hang-worker_1-<pid>-<n>.txt`: a task's n-th dump."""
        return self.path(DIAGNOSTICS, hang_dump_name(task, pid, number))

    def directories(self, *, export: bool, best: bool) -> list[str]:
        """The folders a run keeps here (for the check that no file is in their way)."""
        names = [self.summaries(), self.summaries("train"), self.summaries("eval")]
        return names + ([self.exports] if export else []) + ([self.path(BEST)] if best else [])

    def kept_paths(self) -> list[str]:
        """Every fixed name the engine keeps a file or a folder under (the
        locks aside: `run_dir.run_lock` refuses a link there itself), where a
        symbolic link is refused: the run would write or remove through it."""
        best = self.best
        records = [self.run_json, self.metrics_json, self.evaluations_json,
                   self.checkpoint_state, self.damaged, self.exports, self.diagnostics,
                   self.fit_epochs_json]
        kept = [*records, best.root, best.best_json, best.best_state, best.exports]
        summaries = [self.summaries("train"), self.summaries("eval")]
        return kept + ([self.summaries()] if self.summaries_root is None else []) + summaries

    def refuse_links(self) -> None:
        """Refuses, in one line, a symbolic link at any of `kept_paths`:
        checked with the run's other directories, before anything is written.

        Raises:
          ConfigError: one of them is a link.
        """
        files.refuse_links(self.kept_paths())


def hang_dump_name(task: str, pid: int, number: int) -> str:
    """The file name of a hang dump, also where `diagnostics/` is not under a model_dir."""
    return f"hang-{task.replace(':', '_')}-{pid}-{number}.txt"


# --- Atomic records. ---


def write_json(path: str, payload: dict) -> None:
    """`payload` as JSON, by `write_text`."""
    write_text(path, json.dumps(payload, indent=2, sort_keys=True) + "\n")


def write_text(path: str, text: str) -> None:
    """Atomically (a temporary file renamed over `path`: a reader never sees
    half a file), so `model_dir` may be on any TF filesystem (gs://, ...):
    `engine.runtime.files.write_atomically`, whose temporary file has a
    random name, is created exclusively and never through a symbolic link,
    with mode 0644 whatever the umask.

    However the write fails, the temporary file is removed and `path` keeps
    what it held before.

    Raises:
      RunFailure: the file could not be written (a full disk, a directory
        made read-only under the run): one line naming it, the reason and
        the free space there. Not `ConfigError`: nothing in the request is
        wrong, and the same failure can come at any step (after a
        checkpoint, at the end), where the checkpoint save's own full disk
        is a `RunFailure` too (exit status 1, which no launcher restarts
        into the same full disk).
    """
    try:
        files.write_atomically(path, text)
    except (tf.errors.OpError, OSError) as error:
        raise RunFailure(_write_failed(path, error)) from None


def _write_failed(path: str, error: Exception) -> str:
    """The one line of a failed `write_text`: what, why, the free space, what is left."""
    directory, name = posixpath.split(path)
    if isinstance(error, tf.errors.OpError):
        reason = error.message
    else:
        reason = error.strerror or str(error) or type(error).__name__
    # TensorFlow's messages start with the file's name (the temporary one's, perhaps)
    reason = re.sub(re.escape(path) + r"(" + re.escape(files.TEMPORARY_INFIX)
                    + r"[0-9a-f]+)?(; |: )", "", reason)
    reason = reason.replace(directory.rstrip("/") + "/", "")
    reason = one_line(reason or type(error).__name__, 100)
    free = disk.free_space(directory)
    free = f"{free} free in {directory}" if free else f"free space unknown in {directory}"
    kept = (f"the previous {name} is unchanged" if _exists(path) and not _isdir(path)
            else f"{name} was not written")
    fix = (f"move the directory {path} away" if _isdir(path)
           else disk.advice(error, directory, reason))
    return f"could not write {path} ({reason}); {free}; {kept}: {fix} and run the same command"


def _exists(path: str) -> bool:
    try:
        return tf.io.gfile.exists(path)
    except (tf.errors.OpError, OSError):
        return False


def _isdir(path: str) -> bool:
    try:
        return tf.io.gfile.isdir(path)
    except (tf.errors.OpError, OSError):
        return False


def write_final(path: str, payload: dict, *, failing: bool) -> None:
    """`write_json`; for a run that is `failing` already (a full disk), a failure
    to write is logged rather than raised over the run's own error."""
    try:
        write_json(path, payload)
    except RunFailure as error:
        if not failing:
            raise
        logger.warning("%s", error)


def read_json(path: str) -> Optional[dict]:
    """A JSON file `write_json` wrote (through `tf.io.gfile`), or None when there is none.

    Raises:
      ConfigError: the file is there but is not a JSON object (damaged, or
        edited by hand): one line naming it, rather than a decoder traceback.
    """
    if not tf.io.gfile.exists(path):
        return None
    try:
        with tf.io.gfile.GFile(path, "rb") as f:
            content = f.read()
        record = json.loads(content)
    except tf.errors.OpError as error:  # a directory of that name, an unreadable file
        record = ValueError(error.message.replace(path + "; ", ""))
    except ValueError as error:  # JSONDecodeError, UnicodeDecodeError
        record = error
    if not isinstance(record, dict):
        reason = str(record) if isinstance(record, ValueError) else "not a JSON object"
        raise ConfigError(f"{path} cannot be read ({reason[:120]}); restore it, or move it "
                          "away to start that record afresh")
    return record
