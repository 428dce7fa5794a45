"""Which checkpoint of `model_dir` to resume from: the newest one that reads.

The `checkpoint` state file that `tf.train.CheckpointManager` keeps is a hint,
not the truth: a kill -9 between `ckpt-N.index` appearing and the state file
naming it leaves a complete checkpoint the state file does not know; a state
file can be deleted, emptied or garbled; the files it names can be gone or
damaged. `tf.train.latest_checkpoint` then answers None (and the run starts
again from step 0 over good checkpoints) or raises. So::

    candidates = the state file's entries (if it reads at all)
               | every ckpt-<N>.index / ckpt-<N>.data-* on disk
    for each, newest step first:
        read it: the index, then every tensor     # the only way to see a
                                                  # truncated or garbled .data
        the first that reads is the one; those before it are damaged

A read of every tensor costs one more read of the checkpoint at start-up (its
size: 3.2 MB for the mlp with Adam, read in 13 ms here; ~300 MB for resnet50
with Adam). It is the price of certainty: the index records each
tensor's offset, size and checksum, and only reading the bytes checks them;
trying the restore itself and falling back on DataLossError would leave the
model half restored from the damaged checkpoint, and Keras defers part of a
restore until variables are built, so the failure could come too late to fall
back. Only the newest candidates are read, down to the first that reads.

`survey` only reads. `set_aside` (the chief, after it holds the run's lock)
moves a damaged checkpoint's files into `model_dir/damaged/` (never deleting
or overwriting anything) and rewrites the state file so that the manager's
rotation and `tf.train.latest_checkpoint` agree with what is on disk.
"""

from __future__ import annotations

import dataclasses
import logging
import posixpath
import re
import time
from typing import Iterator, Optional

import tensorflow as tf

from tfloop.engine.run_dir import layout
from tfloop.engine.runtime import files
from tfloop.engine.errors import ConfigError, one_line

logger = logging.getLogger(__name__)

#: What `tf.train.CheckpointManager` calls its checkpoints (`ckpt-<step>`).
PREFIX = layout.CHECKPOINT_PREFIX
#: Where `set_aside` moves damaged checkpoints' files, inside `model_dir`.
STATE_FILE = layout.CHECKPOINT_STATE

_FILE, _TEMP = layout.CHECKPOINT_FILE, layout.CHECKPOINT_TEMP
_STEP = re.compile(r"-\d+$")


@dataclasses.dataclass(frozen=True)
class Damaged:
    """A checkpoint that does not read, and why, in a few words."""

    prefix: str
    reason: str

    @property
    def name(self) -> str:
        return posixpath.basename(self.prefix)


@dataclasses.dataclass(frozen=True)
class Survey:
    """What `survey` found in `model_dir`.

    Attributes:
      model_dir: the directory surveyed.
      newest: the newest checkpoint that reads (a `model_dir/ckpt-N` prefix), or None.
      damaged: the newer candidates skipped for it, newest first.
      kept: what the state file should list, oldest first, `newest` last:
        the state file's entries that are not damaged, and every checkpoint on
        disk newer than its latest (all of them when it does not read).
      timestamps: each of `kept`'s save time (the state file's, or the index file's).
      last_preserved: the state file's `last_preserved_timestamp` to write.
      state_problem: why the state file must be rewritten (it does not read,
        or does not name `kept`), or None.
    """

    model_dir: str
    newest: Optional[str] = None
    damaged: tuple[Damaged, ...] = ()
    kept: tuple[str, ...] = ()
    timestamps: tuple[float, ...] = ()
    last_preserved: float = 0.0
    state_problem: Optional[str] = None

    def skip_line(self, doing: str, instead: Optional[str] = None) -> Optional[str]:
        """`"ckpt-200 is damaged (...); resuming from ckpt-150"` (`doing`:
        "resuming from", "evaluating", ...), or None when nothing was skipped.
        `instead`: what is taken in their place, when not `newest` (a newer
        local checkpoint, named by its path: it is not in `model_dir`)."""
        taken = instead or self.newest
        if not self.damaged or not taken:
            return None
        skipped = "; ".join(f"{d.name} is damaged ({d.reason})" for d in self.damaged)
        name = posixpath.basename(taken) if taken == self.newest else taken
        return f"{skipped}; {doing} {name}"


def step_of(path: str) -> int:
    """The step of a `.../ckpt-<step>` prefix."""
    return int(path.rsplit("-", 1)[1])


def damage(prefix: str) -> Optional[str]:
    """Why checkpoint `prefix` does not read (a few words), or None when every
    tensor of it reads back with its checksum; see the module docstring."""
    name = posixpath.basename(prefix)
    if not tf.io.gfile.exists(prefix + ".index"):
        return f"{name}.index is missing"
    if not tf.io.gfile.glob(prefix + ".data-*"):
        return f"{name}.data-* is missing"
    try:
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        for key in reader.get_variable_to_shape_map():
            reader.get_tensor(key)
    except IndexError as error:  # what TensorFlow raises for a short .data file
        return f"a file is shorter than its index says: {error}"
    except (tf.errors.OpError, ValueError, RuntimeError, UnicodeDecodeError) as error:
        return one_line(str(error).replace(posixpath.dirname(prefix) + "/", ""))
    return None


def _state(model_dir: str) -> tuple[Optional[list[str]], Optional[list[float]], float,
                                    Optional[str]]:
    """The state file's entries (oldest first, the latest last), their
    timestamps, its `last_preserved_timestamp`, and what is wrong with it."""
    path = layout.RunDir(model_dir).checkpoint_state
    if not tf.io.gfile.exists(path):
        return None, None, 0.0, f"{STATE_FILE} is missing"
    if tf.io.gfile.isdir(path):  # not a damaged file: nothing can be written over it
        raise ConfigError(f"{path} is a directory, where the checkpoints' state file belongs; "
                          "move it away and run again")
    with tf.io.gfile.GFile(path, "rb") as f:
        raw = f.read()
    # Checked here first: TensorFlow's reader raises on either.
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return None, None, 0.0, f"{STATE_FILE} is not text"
    if not text.strip():
        return None, None, 0.0, f"{STATE_FILE} is empty"
    try:
        state = tf.train.get_checkpoint_state(model_dir)
    except (ValueError, tf.errors.OpError) as error:
        return None, None, 0.0, f"{STATE_FILE} does not read ({one_line(str(error), 60)})"
    if state is None or not state.model_checkpoint_path:
        return None, None, 0.0, f"{STATE_FILE} does not read"
    paths = [layout.RunDir(model_dir).path(posixpath.basename(p))
             for p in state.all_model_checkpoint_paths]
    latest = layout.RunDir(model_dir).path(posixpath.basename(state.model_checkpoint_path))
    stepless = [p for p in [*paths, latest] if not _STEP.search(p)]
    if stepless:  # not a CheckpointManager's: `step_of` has no step to read
        name = posixpath.basename(stepless[0])
        return None, None, 0.0, f"{STATE_FILE} names {name}, which has no -<step>"
    stamps = list(state.all_model_checkpoint_timestamps)
    if len(stamps) != len(paths):
        stamps = [state.last_preserved_timestamp] * len(paths)
    if latest in paths:
        index = paths.index(latest)
        paths.append(paths.pop(index))
        stamps.append(stamps.pop(index))
    else:
        paths.append(latest)
        stamps.append(state.last_preserved_timestamp)
    return paths, stamps, state.last_preserved_timestamp, None


def on_disk(model_dir: str) -> dict[int, str]:
    """`{step: model_dir/ckpt-<step>}` for every checkpoint file in `model_dir`."""
    found = {}
    for path in tf.io.gfile.glob(layout.RunDir(model_dir).checkpoints_glob):
        match = _FILE.match(posixpath.basename(path))
        if match:
            step = int(match.group(1))
            found[step] = layout.RunDir(model_dir).checkpoint(step)
    return found


def survey(model_dir: str, *, strict: bool = True) -> Survey:
    """Finds the newest checkpoint of `model_dir` that reads; only reads.

    Raises:
      ConfigError (`strict`): `model_dir` holds checkpoints and none of them reads;
        (always) its state file is a directory.
    """
    if not tf.io.gfile.isdir(model_dir):
        return Survey(model_dir)
    listed, stamps, last_preserved, problem = _state(model_dir)
    disk = on_disk(model_dir)
    candidates = {step_of(p): p for p in listed or ()} | disk
    if not candidates:
        return Survey(model_dir, state_problem=problem if listed else None)
    damaged, newest = [], None
    for step in sorted(candidates, reverse=True):
        reason = damage(candidates[step])
        if reason is None:
            newest = candidates[step]
            break
        damaged.append(Damaged(candidates[step], reason))
    if newest is None:
        found = Survey(model_dir, damaged=tuple(damaged))
        if strict:
            raise none_reads(found)
        return found
    bad = {d.prefix for d in damaged}
    # The state file's entries still there, and what a save cut short (or a
    # lost state file) left on disk newer than the newest of them.
    kept = {p: t for p, t in zip(listed or (), stamps or ()) if p not in bad and p in disk.values()}
    newest_kept = max((step_of(p) for p in kept), default=-1)
    for step, prefix in disk.items():
        if step > newest_kept and prefix not in bad:
            kept[prefix] = _saved_at(prefix)
    kept = dict(sorted(kept.items(), key=lambda item: step_of(item[0])))
    if problem is None and list(kept) != listed:
        problem = (f"{STATE_FILE} names {', '.join(posixpath.basename(p) for p in listed)}, "
                   f"and {', '.join(posixpath.basename(p) for p in kept)} are there")
    stamps_kept = tuple(kept.values())
    if problem and stamps_kept:
        last_preserved = min(last_preserved or stamps_kept[0], min(stamps_kept) - 1)
    return Survey(model_dir, newest=newest, damaged=tuple(damaged), kept=tuple(kept),
                  timestamps=stamps_kept, last_preserved=last_preserved, state_problem=problem)


def none_reads(found: Survey) -> ConfigError:
    """The one line for a `model_dir` that holds checkpoints none of which
    reads (`found.damaged`), and nothing else to resume from."""
    reasons = "; ".join(f"{d.name}: {d.reason}" for d in found.damaged[:3])
    return ConfigError(
        f"--model_dir={found.model_dir} holds checkpoints and none of them reads ({reasons}); "
        "put back intact copies, or move them away to start from step 0")


def _saved_at(prefix: str) -> float:
    try:
        return tf.io.gfile.stat(prefix + ".index").mtime_nsec / 1e9
    except tf.errors.NotFoundError:  # moved aside by the chief meanwhile (another worker)
        return time.time()


def set_aside(found: Survey) -> None:
    """Moves the damaged checkpoints' files into `model_dir/damaged/` and
    rewrites the state file when it disagrees with `found.kept`; for the
    process that holds the run's lock (`engine.run_dir.run_lock`), before its
    `CheckpointManager` reads the state file."""
    model_dir = found.model_dir
    for bad in found.damaged:
        moved = tf.io.gfile.glob(bad.prefix + ".*")
        if not moved:
            continue
        target_dir = layout.RunDir(model_dir).damaged
        files.make_dirs(target_dir)
        for path in moved:
            target = posixpath.join(target_dir, posixpath.basename(path))
            tf.io.gfile.rename(path, _free_name(target))
        logger.info("moved %s into %s", ", ".join(posixpath.basename(f) for f in moved), target_dir)
    if found.state_problem and found.newest:
        _write_state(model_dir, found)
        logger.info("rewrote %s: %s", layout.RunDir(model_dir).checkpoint_state, found.state_problem)
    elif found.damaged and not found.newest:
        # Every one was damaged (the run resumes from a local checkpoint): the
        # state file names only what was moved, and the manager would take it as the latest.
        state = layout.RunDir(model_dir).checkpoint_state
        if files.remove(state, within=model_dir):
            logger.info("removed %s: it named only damaged checkpoints", state)


def _write_state(model_dir: str, found: Survey) -> None:
    """The state file as `CheckpointManager` writes it (a text
    `CheckpointState` proto, relative paths), atomically. By hand: TensorFlow's
    `update_checkpoint_state` is deprecated (it logs a warning) and the
    manager has no public way to write it but a save."""
    lines = [f'model_checkpoint_path: "{posixpath.basename(found.newest)}"']
    lines += [f'all_model_checkpoint_paths: "{posixpath.basename(p)}"' for p in found.kept]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in found.timestamps]
    lines.append(f"last_preserved_timestamp: {found.last_preserved!r}")
    layout.write_text(layout.RunDir(model_dir).checkpoint_state, "\n".join(lines) + "\n")


def _free_name(path: str) -> str:
    """`path`, or `path.1`, `path.2`, ...: the first that does not exist."""
    candidate, number = path, 0
    while tf.io.gfile.exists(candidate):
        number += 1
        candidate = f"{path}.{number}"
    return candidate


def remove_stale_temp(model_dir: str) -> None:
    """Removes the `ckpt-<N>_temp/` directories a kill during a save left
    behind (TensorFlow writes a checkpoint there, then moves it into place),
    and the temporary files of the records this process writes
    (`run.json.tmp-<hex>`, ...: a kill inside `layout.write_text`); for the
    process that holds the run's lock. Through `engine.runtime.files.remove`:
    a link of that name goes as a link, its target untouched."""
    if not tf.io.gfile.isdir(model_dir):
        return
    records = {layout.RUN_JSON, layout.METRICS_JSON, layout.CHECKPOINT_STATE}
    for name in tf.io.gfile.listdir(model_dir):
        name = name.rstrip("/")
        record = layout.RECORD_TEMP.match(name) and name.rsplit(files.TEMPORARY_INFIX, 1)[0]
        if _TEMP.match(name) or record in records:
            path = layout.RunDir(model_dir).path(name)
            logger.info("removing %s, left by a %s that did not finish", path,
                        "save" if _TEMP.match(name) else "write")
            files.remove(path, within=model_dir)


def as_they_appear(model_dir: str, *, poll_seconds: float, timeout: float) -> Iterator[str]:
    """Yields the newest readable checkpoint of `model_dir` each time a newer
    one reads, until none has for `timeout` seconds: the evaluator task's
    `tf.train.checkpoints_iterator`, by the same rule as `survey` (read-only).

    A newer candidate that does not read (perhaps a save in progress) is read
    again only once its files change, and reported once."""
    last_step, deadline = -1, time.monotonic() + timeout
    verdicts: dict[str, tuple] = {}
    while True:
        found = _newer_readable(model_dir, last_step, verdicts)
        if found:
            last_step = step_of(found)
            yield found
            deadline = time.monotonic() + timeout
        elif time.monotonic() > deadline:
            return
        else:
            time.sleep(poll_seconds)


def _newer_readable(model_dir: str, after: int, verdicts: dict) -> Optional[str]:
    """The newest checkpoint after step `after` that reads; `verdicts`
    remembers each damaged one's files (names and sizes) so that it is read
    again only when they change."""
    if not tf.io.gfile.isdir(model_dir):
        return None
    listed, _, _, _ = _state(model_dir)
    candidates = {step_of(p): p for p in listed or ()} | on_disk(model_dir)
    for step in sorted((s for s in candidates if s > after), reverse=True):
        prefix = candidates[step]
        try:
            found = tuple(sorted((p, tf.io.gfile.stat(p).length)
                                 for p in tf.io.gfile.glob(prefix + ".*")))
        except tf.errors.NotFoundError:  # removed by the chief's rotation meanwhile
            continue
        if verdicts.get(prefix) == found:
            continue
        reason = damage(prefix)
        if reason is None:
            return prefix
        if prefix not in verdicts:
            logger.info("%s does not read (%s); looking at older ones", prefix, reason)
        verdicts[prefix] = found
    return None
