"""What trained a `model_dir`, remembered in `model_dir/run.json`.

A checkpoint holds numbers, not what they mean: resuming, evaluating or
exporting a run with another `--model` or `--dataset` than trained it fails
deep inside a restore. So the chief writes the flags that decide what the
variables are (the task, model and data) next to the checkpoints, and every
later use of the directory

- takes them from there when they are not given (`fill`, used by `bin/`),
- refuses a contradiction in one line naming the stored value (`check`),
- and says so when a resumed run changes the global batch size.

Through `tf.io.gfile`, like everything under `model_dir`.
"""

from __future__ import annotations

import logging
import posixpath
from typing import Any, Iterable, Mapping, Optional

from tfloop.engine import run_record
from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)

FILENAME = "run.json"

#: The flags that decide what a checkpoint's variables are and what they were trained on.
IDENTITY = ("task", "model", "dataset", "data_dir", "image_size", "eval_fraction")


def path(model_dir: str) -> str:
    return posixpath.join(model_dir, FILENAME)  # gs://, ram:// and local paths alike


def load(model_dir: str) -> Optional[dict]:
    """The stored identity of `model_dir`, or None for a new (or pre-run.json) run."""
    return run_record.read(path(model_dir))


def fill(values: Mapping[str, Any], given: Iterable[str], stored: Optional[dict]) -> dict:
    """`values` with every identity flag not in `given` taken from `stored`."""
    values, given = dict(values), set(given)
    for name in IDENTITY:
        if stored and name in stored and name not in given:
            values[name] = stored[name]
    return values


def check(config: Any, stored: Optional[dict], *, task_object: bool = False) -> None:
    """Refuses a config that contradicts what trained `config.model_dir`.

    `task_object`: the task came as a Python object (`run(task=...)`), which
    `--task` cannot name; it is not compared.
    """
    if not stored:
        return
    for name in IDENTITY:
        if name == "task" and task_object:
            continue
        if name in stored and stored[name] != getattr(config, name):
            raise ConfigError(
                f"--{name}={getattr(config, name)!r} contradicts --model_dir={config.model_dir}, "
                f"which was trained with --{name}={stored[name]!r}; drop --{name} (bin/ takes it "
                "from the run) or use a new --model_dir")
    before = stored.get("global_batch_size")
    if before and before != config.global_batch_size:
        logger.info("--global_batch_size=%d differs from the %d this run was trained with: "
                    "the resumed steps are larger or smaller and the data position is "
                    "counted in the new batches", config.global_batch_size, before)


def write(config: Any) -> None:
    """Records the identity (and the global batch size) of the run in `config.model_dir`."""
    record = {name: getattr(config, name) for name in IDENTITY}
    record["global_batch_size"] = config.global_batch_size
    run_record.write(path(config.model_dir), record)
