"""The best checkpoint of a run, kept apart from the rolling ones, and early stopping.

`--best_metric=eval/accuracy` keeps, beside the rolling `ckpt-*` (which
`max_checkpoints` deletes in turn), the checkpoint of the best evaluation so
far in `model_dir/best/`::

    best/best.json        {"metric", "mode", "value", "step",
                           "checkpoint": "best/ckpt-300", "export": "best/export/300" | null}
    best/ckpt-300.index, best/ckpt-300.data-*   the run's whole checkpoint (checkpoint.write)
    best/export/300/      its export, with --export
    best/state.json       {"since_best": [400, 500]}: evaluations since the best, for patience

`KeepBest` is the last eval action; after each evaluation at step s (one of
no example is no result: skipped, and an evaluation dataset that is empty is
refused at start-up, `check_evaluation_not_empty`)::

    if metric strictly better than best.json's value (finite; never the step best.json names):
        checkpoint.write(best/ckpt-s); export_fn(best/) -> best/export/s/
        write best.json (tmp + rename)          # the commit point
        since = []
        remove what best.json does not name      # the previous best
    elif s is after best.json's step: since.append(s)
    write state.json
    if len(since) >= patience: raise StopTraining(...)   # Controller saves ckpt-s, returns

Why this order: whatever moment a kill -9 strikes, best.json names a
checkpoint that was complete before best.json was written, and its value is
that checkpoint's metric; the previous best's files go only after the new
best.json is in place. At start-up everything in `best/` that best.json does
not name (a save killed midway) is removed.

Patience survives a resume exactly because the Controller evaluates before it
saves the rolling checkpoint of the same step: a run resumed from `ckpt-N`
has evaluated every step up to N, and evaluations after N (recorded before a
kill, but not covered by a checkpoint) are dropped from the count, to be made
again. A resumed run whose count already reached the patience trains nothing.

In a multi-worker cluster every worker evaluates the same metrics and decides
the same; `checkpoint.write` is collective there, so the workers other than
the chief write into their own temporary directory and nothing else.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Callable, Optional, Sequence

import tensorflow as tf

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import files
from tfloop.engine.loop.actions import Action, LoopEnd, StopTraining
from tfloop.engine.errors import ConfigError
from tfloop.engine.loop.settings import Loop
from tfloop.engine.run_dir.settings import Keeping

logger = logging.getLogger(__name__)

BEST_DIR, RECORD, STATE = layout.BEST, layout.BEST_JSON, layout.BEST_STATE
MODES = ("max", "min")
#: Metric names that improve upward, as Keras's ModelCheckpoint decides `auto`.
_UPWARD = ("acc", "auc", "precision", "recall", "f1")
#: Modes in which the run evaluates while it trains, or evaluates checkpoints.
_EVALUATING = ("train_and_evaluate", "continuous_evaluate")

#: Exports the model as it stands under `<export_root>/export/<step>/`;
#: returns that path, or None where this process writes none.
ExportFn = Callable[[str], Optional[str]]


def best_dir(model_dir: str) -> str:
    return layout.RunDir(model_dir).best.root


def resolve_mode(metric: str, best_mode: str) -> str:
    """`max` or `min`; `auto` is max for accuracy-like names (acc, auc,
    precision, recall, f1), else min (losses, errors)."""
    if best_mode != "auto":
        return best_mode
    name = metric.split("/", 1)[-1].lower()
    return "max" if any(word in name for word in _UPWARD) else "min"


def load_record(model_dir: str) -> Optional[dict]:
    """`model_dir/best/best.json`, or None before any best was kept."""
    return layout.read_json(layout.RunDir(model_dir).best.best_json)


def check_request(keeping: Keeping, loop: Loop, *, mode: str, in_cluster: bool,
                  available: Optional[Sequence[str]]) -> None:
    """Refuses, in one line, a `--best_metric` / `--early_stopping_patience`
    that cannot work; reads `model_dir` at most, writes nothing.

    Args:
      keeping: the run's `Keeping` section (`--best_metric`, `--best_mode`,
        `--early_stopping_patience`).
      loop: the run's `Loop` section (`--eval_interval`, `--model_dir`).
      mode: the plan's mode (`continuous_evaluate`: the evaluator task).
      in_cluster: a `TF_CONFIG` task, where `--mode=train` leaves the
        evaluating to the evaluator task.
      available: the metric names the evaluator reports (`loss`, ...), or
        None where this process does not evaluate.
    """
    metric, patience = keeping.best_metric, keeping.early_stopping_patience
    if not metric:
        return
    if patience and mode == "continuous_evaluate":
        raise ConfigError(
            f"--early_stopping_patience={patience} cannot be kept by the evaluator task, which "
            "reads the chief's checkpoints and cannot stop it; drop it there, or use "
            "--mode=train_and_evaluate on the training tasks")
    if patience and in_cluster and mode == "train":
        raise ConfigError(
            f"--early_stopping_patience={patience} needs the training tasks to evaluate, and "
            "--mode=train leaves that to the evaluator task, which cannot stop them; use "
            "--mode=train_and_evaluate")
    if mode not in _EVALUATING and not (in_cluster and mode == "train"):
        raise ConfigError(
            f"--best_metric={metric} keeps the best of the evaluations made while training, "
            f"and --mode={mode} makes none; use --mode=train_and_evaluate")
    if patience and mode == "train_and_evaluate" and not loop.eval_interval:
        raise ConfigError(
            f"--early_stopping_patience={patience} counts evaluations, and --eval_interval=0 "
            "evaluates once, at the end; set --eval_interval (steps between evaluations)")
    name = metric[len("eval/"):]
    if available is not None and name not in available:
        raise ConfigError(
            f"--best_metric={metric} is not a metric the evaluation reports; choose one of: "
            + ", ".join(f"eval/{n}" for n in available))
    stored = load_record(loop.model_dir) if tf.io.gfile.isdir(loop.model_dir) else None
    wanted = resolve_mode(metric, keeping.best_mode)
    if stored and (stored.get("metric"), stored.get("mode")) != (metric, wanted):
        raise ConfigError(
            f"--model_dir={loop.model_dir} keeps its best checkpoint by {stored.get('metric')} "
            f"({stored.get('mode')}) in {BEST_DIR}/, not {metric} ({wanted}); use "
            f"--best_metric={stored.get('metric')} --best_mode={stored.get('mode')}, or move "
            f"{BEST_DIR}/ away to start a new one")


def check_evaluation_not_empty(keeping: Keeping, evaluator) -> None:
    """Refuses `--best_metric` (and so `--early_stopping_patience`) in one
    line when the evaluation dataset is empty: an evaluation of no example is
    no result, so none would ever be compared.

    Asked once at start-up, before anything is written, by evaluating one
    batch: every evaluation reads the same dataset afresh, so if its first
    batch holds no example, every evaluation is empty (waiting for the first
    evaluation would refuse after training and saving had begun).
    """
    if not keeping.best_metric or evaluator.evaluate(1).get("examples", 1) > 0:
        return
    patience = keeping.early_stopping_patience
    raise ConfigError(
        f"--best_metric={keeping.best_metric}"
        + (f" and --early_stopping_patience={patience} compare" if patience else " compares")
        + " evaluations, and the evaluation dataset is empty (0 examples): give the run "
        "evaluation data (the task's eval_dataset), or drop --best_metric"
        + (" and --early_stopping_patience" if patience else ""))


class KeepBest(Action):
    """Keeps the best evaluation's checkpoint in `model_dir/best/`; with
    `patience`, raises `StopTraining` after that many evaluations in a row
    without improvement. See the module docstring.

    Args:
      metric: `eval/<name>`, a metric the evaluator reports.
      mode: `max` or `min` (`resolve_mode`).
      checkpoint: the run's checkpoint, the one its CheckpointManager saves.
      model_dir: where `best/` is (read by every process, written by the chief).
      write_dir: where this process writes its checkpoints (a worker's
        temporary directory; default `model_dir`).
      is_chief: writes best.json, state.json, the export, and removes files.
      export_fn: exports the model into `<export_root>/export/<step>/`
        (None: no export).
      patience: evaluations in a row without improvement before stopping (0: never).
      start_step: the step the run resumed from: evaluations recorded after it
        are forgotten (they will be made again). None: keep them all.
    """

    def __init__(self, *, metric: str, mode: str, checkpoint: tf.train.Checkpoint,
                 model_dir: str, write_dir: Optional[str] = None, is_chief: bool = True,
                 export_fn: Optional[ExportFn] = None, patience: int = 0,
                 start_step: Optional[int] = None):
        _check_arguments(metric=metric, mode=mode, checkpoint=checkpoint,
                         export_fn=export_fn, patience=patience)
        self.metric, self.mode = metric, mode
        self.name = metric[len("eval/"):]
        self.checkpoint = checkpoint
        self.model_dir = model_dir
        self.write_root = write_dir or model_dir
        self.directory = best_dir(model_dir)
        self.write_directory = best_dir(write_dir or model_dir)
        self.is_chief = is_chief
        self.export_fn = export_fn
        self.patience = patience
        #: best.json's content; None before the first finite evaluation.
        self.record: Optional[dict] = load_record(model_dir)
        if self.record is not None and self.record.get("metric") != metric:
            raise ValueError(f"{self.directory} keeps the best by {self.record.get('metric')}, "
                             f"not {metric}")
        #: Steps evaluated since the best, none of them better.
        self.since: list[int] = _since_best(self.directory, self.record, start_step)
        if is_chief:
            left = self._remove_unnamed()
            if left:
                logger.info("removed %s from %s: not named by %s (a save that did not finish)",
                            ", ".join(left), self.directory, RECORD)

    @property
    def reason(self) -> str:
        """Why training stops: `eval/accuracy has not improved for 3 evaluations (...)`."""
        best = (f"best {self.record['value']:.4f} at step {self.record['step']}"
                if self.record else "no finite value yet")
        return f"{self.metric} has not improved for {len(self.since)} evaluations ({best})"

    def train_begin(self, step: int) -> None:
        if self._exhausted():
            raise StopTraining(self.reason)

    def __call__(self, loop: LoopEnd) -> None:
        if loop.metrics.get("examples", 1) == 0:
            return  # no example, no result: neither compared nor counted (EvalProgress warns)
        if self.name not in loop.metrics:
            raise ValueError(f"the evaluation reported no {self.name!r} (it reported "
                             f"{', '.join(sorted(loop.metrics))}); --best_metric={self.metric}")
        value, step = float(loop.metrics[self.name]), loop.step
        # An evaluation of a step already counted (the end of a resumed run
        # that had finished) replaces the earlier one.
        self.since = [s for s in self.since if s < step]
        if self._improves(value, step):
            self._keep(step, value)
        elif self.record is None or step > self.record["step"]:
            self.since.append(step)
        if self.is_chief:
            files.make_dirs(self.directory)
            layout.write_json(layout.RunDir(self.directory).best_state, {"since_best": self.since})
        if self._exhausted():
            raise StopTraining(self.reason)

    def _exhausted(self) -> bool:
        return bool(self.patience) and len(self.since) >= self.patience

    def _improves(self, value: float, step: int) -> bool:
        if not math.isfinite(value):
            return False  # a non-finite model never replaces a finite one
        if self.record is None:
            return True
        if step == self.record["step"]:
            return False  # the same step again: its checkpoint is already kept
        best = self.record["value"]
        return value > best if self.mode == "max" else value < best

    def _keep(self, step: int, value: float) -> None:
        files.make_dirs(self.write_directory)
        self.checkpoint.write(layout.RunDir(self.write_directory).checkpoint(step))
        exported = self.export_fn(self.directory) if self.export_fn is not None else None
        record = {
            "metric": self.metric, "mode": self.mode, "value": value, "step": step,
            "checkpoint": f"{BEST_DIR}/{layout.CHECKPOINT_PREFIX}-{step}",
            "export": f"{BEST_DIR}/{layout.EXPORT}/{step}" if exported else None,
        }
        self.record, self.since = record, []
        if not self.is_chief:
            _remove_except(self.write_directory, _checkpoint_names(step), within=self.write_root)
            return
        layout.write_json(layout.RunDir(self.directory).best_json, record)  # the commit point
        self._remove_unnamed()
        logger.info("new best %s %.4f at step %d: kept %s%s", self.metric, value, step,
                    record["checkpoint"], f" and {record['export']}" if exported else "")

    def _remove_unnamed(self) -> list[str]:
        """Removes from `best/` what best.json does not name; returns the names removed."""
        keep, removed = {RECORD, STATE}, []
        if self.record is not None:
            keep |= _checkpoint_names(self.record["step"])
        if self.record is not None and self.record.get("export"):
            keep.add(layout.EXPORT)
            removed = [f"{layout.EXPORT}/{name}" for name in _remove_except(
                layout.RunDir(self.directory).exports, {str(self.record["step"])},
                within=self.model_dir)]
        return removed + _remove_except(self.directory, keep, within=self.model_dir)


def _check_arguments(*, metric: str, mode: str, checkpoint: tf.train.Checkpoint,
                     export_fn: Optional[ExportFn], patience: int) -> None:
    """`KeepBest`'s arguments, refused at construction, each naming itself and its value."""
    if not isinstance(metric, str) or not metric.startswith("eval/"):
        raise ValueError(f"`metric` ({metric!r}) must name an evaluation metric, eval/<name>")
    if mode not in MODES:
        raise ValueError(f"`mode` ({mode!r}) must be one of {MODES}")
    if not isinstance(checkpoint, tf.train.Checkpoint):
        raise ValueError(f"`checkpoint` ({checkpoint!r}) must be a tf.train.Checkpoint")
    if export_fn is not None and not callable(export_fn):
        raise ValueError(f"`export_fn` ({export_fn!r}) must be callable as "
                         "export_fn(export_root) or None")
    if isinstance(patience, bool) or not isinstance(patience, int) or patience < 0:
        raise ValueError(f"`patience` ({patience!r}) must be an integer >= 0 (0: never stop)")


def _since_best(directory: str, record: Optional[dict], start_step: Optional[int]) -> list[int]:
    """The evaluations state.json counts since best.json's step, without those
    after `start_step` (not covered by the checkpoint the run resumed from:
    they will be made again; None keeps them all)."""
    state = layout.read_json(layout.RunDir(directory).best_state) or {}
    after = record["step"] if record else -1
    return sorted(step for step in state.get("since_best", [])
                  if step > after and (start_step is None or step <= start_step))


def _checkpoint_names(step: int) -> set:
    """A matcher for `ckpt-<step>.index` and `ckpt-<step>.data-*` (see `_remove_except`)."""
    return {re.compile(rf"{layout.CHECKPOINT_PREFIX}-{step}\.(index|data-\d+-of-\d+)")}


def _remove_except(directory: str, keep: set, *, within: str) -> list[str]:
    """Removes every entry of `directory` not in `keep` (names, or compiled
    patterns matched in full); returns the names removed. Through
    `engine.runtime.files.remove`, never following a link below `within`
    (the run's folder): an entry that is a link goes as a link, and a
    `best/` that is one is refused in one line."""
    if not tf.io.gfile.isdir(directory):
        return []
    removed = []
    for entry in sorted(tf.io.gfile.listdir(directory)):
        name = entry.rstrip("/")
        if name in keep or any(isinstance(k, re.Pattern) and k.fullmatch(name) for k in keep):
            continue
        files.remove(layout.RunDir(directory).path(name), within=within)
        removed.append(name)
    return removed
