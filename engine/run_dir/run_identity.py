"""What trained a `model_dir`, remembered in `model_dir/run.json`.

A checkpoint holds numbers, not what they mean: resuming, evaluating or
exporting a run with another `--model` or `--dataset` than trained it fails
deep inside a restore. So the chief writes the flags that decide what the
variables are (the task, model and data) next to the checkpoints, and every
later use of the directory

- takes them from there when they are not given (`fill`, used by `bin/`),
- refuses a contradiction in one line naming the stored value (`check`).

A resumed run may change how it trains, explicitly: run.json also holds
`ranges`, one entry per stretch of steps trained with the same recipe::

    "ranges": [{"from_step": 0,   "global_batch_size": 64,  "learning_rate": 0.001,
                "optimizer": "adam", ...},
               {"from_step": 200, "global_batch_size": 128, "learning_rate": 0.0005, ...}]

A resume on another replica count keeps the global batch where the run
asked for a per-replica batch (`engine.assembly.batching.decide_batch`); each range
records its `replicas` (and the micro-batches, `accumulation_steps`), and
`replica_changes` lists every such change: `{"step": 150, "from": 3, "to": 2,
"accumulation_steps": [1, 2], "global_batch_size": 12}`.

Each entry also records the run's `numerics` (threads per replica, the CPU
kernels' instruction set: `engine.runtime.devices.numerics`), and a resumed
`--deterministic` run whose numerics differ says so in one line
(`numerics_differ`): it resumes, but not bit-identically.

A run appends an entry when it starts at a step with other per-range flags
(or numerics) than the entry before (dropping entries from that step on: a run that died
before its first checkpoint trained nothing that counts). What each change
does:

- `--learning_rate` (and the schedule flags) take effect at the resumed step,
  with a log line (`engine.recipe.schedules.announce`);
- `--global_batch_size` takes effect, and the data resumes after the examples
  the earlier ranges actually consumed (`examples_trained`), not the resumed
  step times the new batch;
- `--optimizer` is refused (`check`): the checkpoints hold the old
  optimizer's state (Adam's moments, its step count for bias correction),
  which another optimizer would silently drop (`sgd` over `adam`) or fail to
  read (`momentum`). Changing optimizers is a new run from the weights:
  `--init_from=<model_dir> --model_dir=<a new directory>`, which the message
  says. Like the identity flags, `bin/` takes `--optimizer` from run.json
  when it is not given.

run.json also holds the run's `run_id`: a random id written when the run is
created and kept by every resume. A path says where a run is, not which run
it is: a `model_dir` removed and made again at the same path is another run,
and what the old one left outside it (its local checkpoints,
`engine.run_dir.local_checkpoints`) is adopted only by the run whose id it
carries.

Through `tf.io.gfile`, like everything under `model_dir`.
"""

from __future__ import annotations

import logging
import uuid
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Optional

from tfloop.engine.run_dir import checkpoint_files, layout, storage
from tfloop.engine.runtime import files
from tfloop.engine.option import check_model_dir_text, flagged
from tfloop.engine.task.settings import ModelAndData
if TYPE_CHECKING:  # annotations only: engine.config and the loop's room sit above this one
    from tfloop.engine.config import RunConfig
    from tfloop.engine.loop.settings import Loop
from tfloop.engine.errors import ConfigError

logger = logging.getLogger(__name__)


#: The flags that decide what a checkpoint's variables are and what they were
#: trained on: the task's, each declared in engine/task/settings.py with
#: `option(..., identity=True)` (`engine.config.IDENTITY`, the same names).
IDENTITY = flagged(ModelAndData, "identity")
# The flags a resumed run may change, recorded per range of steps: each
# declared in its room with `option(..., per_range=True)`; `write` reads
# them from the config it records (`RunConfig.PER_RANGE`), which composes
# the rooms above this one.
#: What `fill` takes from run.json when not given: the identity, and the
#: optimizer whose state the checkpoints hold (another is refused).
REMEMBERED = IDENTITY + ("optimizer",)
RANGES = "ranges"
#: Each range also records what its float32 sums depended on (`numerics_differ`).
NUMERICS = "numerics"
NUMERICS_COMPARED = ("threads_per_replica", "cpu_isa")
#: Each range records the replicas it trained on, and the replica count
#: `--scale_learning_rate=linear` multiplied by (kept across an elastic resume).
REPLICAS = "replicas"
SCHEDULE_REPLICAS = "schedule_replicas"
#: Every resume on another replica count: {"step", "from", "to", ...}.
REPLICA_CHANGES = "replica_changes"
#: The run's own random id (32 hex digits), kept across resumes.
RUN_ID = "run_id"


def path(model_dir: str) -> str:
    return layout.RunDir(model_dir).run_json


def load(model_dir: str) -> Optional[dict]:
    """The stored identity of `model_dir`, or None for a new (or pre-run.json) run.

    Read once per run, by `engine.assembly.plan.make_plan` (`Plan.run_json`,
    which every later use takes), and by `bin/` before its flags are final
    (`fill`).

    Raises:
      ConfigError: `model_dir` is spelled so that it cannot be read
        (`config.check_model_dir_text`): the first place a binary touches it;
        or its storage refused access (`storage.check_reachable`); or
        run.json is a symbolic link (`files.refuse_links`), refused unread.
      StorageUnavailable: its storage (`gs://...`) did not answer.
    """
    check_model_dir_text(model_dir)
    storage.check_reachable(model_dir)
    # A link is refused before anything is read through it (bin/train reads
    # run.json before the run's own link check: a link to a file that is not
    # JSON was reported as a damaged run.json).
    files.refuse_links([path(model_dir)])
    return layout.read_json(path(model_dir))


def run_id(stored: Optional[Mapping[str, Any]]) -> Optional[str]:
    """The run id a stored record holds; None for a new run, or a run.json
    written before run ids (or with a malformed one)."""
    value = (stored or {}).get(RUN_ID)
    if isinstance(value, str) and len(value) == 32 and all(c in "0123456789abcdef" for c in value):
        return value
    return None


def new_run_id() -> str:
    """A fresh run id, for the run `write` creates (or first gives one)."""
    return uuid.uuid4().hex


def ranges(stored: Optional[dict]) -> list[dict]:
    """The step ranges of a stored record; a run.json written before ranges
    existed counts as one range of its global batch size from step 0."""
    if not stored:
        return []
    if isinstance(stored.get(RANGES), list):
        return [dict(r) for r in stored[RANGES] if isinstance(r, dict) and "from_step" in r]
    if stored.get("global_batch_size"):
        return [{"from_step": 0, "global_batch_size": stored["global_batch_size"]}]
    return []


def _last(stored: Optional[dict], name: str) -> Any:
    """`name` as the newest range (or the record itself) has it; None: not recorded."""
    for entry in reversed(ranges(stored)):
        if name in entry:
            return entry[name]
    return (stored or {}).get(name)


def fill(values: Mapping[str, Any], given: Iterable[str], stored: Optional[dict]) -> dict:
    """`values` with every remembered flag not in `given` taken from `stored`."""
    values, given = dict(values), set(given)
    for name in REMEMBERED:
        if name in given:
            continue
        remembered = _last(stored, name) if name == "optimizer" else (stored or {}).get(name)
        if remembered is not None:
            values[name] = remembered
    return values


def check(data: ModelAndData, loop: Loop, optimizer: str,
          stored: Optional[Mapping[str, Any]], *, task_object: bool = False) -> None:
    """Refuses a run that contradicts what trained `loop.model_dir`: its
    identity (`data`, the task's section: `IDENTITY`), and `optimizer` (the
    recipe's) where checkpoints hold another's state; `loop`: its folder,
    mode and decided global batch.

    `task_object`: the task came as a Python object (`run(task=...)`), which
    `--task` cannot name; it is not compared.
    """
    if not stored:
        return
    for name in IDENTITY:
        if name == "task" and task_object:
            continue
        if name in stored and stored[name] != getattr(data, name):
            raise ConfigError(
                f"--{name}={getattr(data, name)!r} contradicts --model_dir={loop.model_dir}, "
                f"which was trained with --{name}={stored[name]!r}; drop --{name} (bin/ takes it "
                "from the run) or use a new --model_dir")
    before = _last(stored, "optimizer")
    if (before and before != optimizer and loop.mode != "evaluate"
            and checkpoint_files.on_disk(loop.model_dir)):  # whatever the state file says
        raise ConfigError(
            f"--optimizer={optimizer} cannot resume --model_dir={loop.model_dir}: its "
            f"checkpoints hold the state of --optimizer={before}, which another optimizer would "
            f"drop or misread; resume with --optimizer={before}, or start a new run from these "
            f"weights: --init_from={loop.model_dir} --model_dir=<a new directory> "
            f"--optimizer={optimizer}")
    batch = _last(stored, "global_batch_size")
    if batch and batch != loop.global_batch_size:
        logger.info("--global_batch_size=%d differs from the %d this run was trained with last: "
                    "the resumed steps take %d examples each, and the data resumes after the "
                    "examples already trained on", loop.global_batch_size, batch,
                    loop.global_batch_size)


def examples_trained(stored: Optional[dict], start_step: int, global_batch_size: int) -> int:
    """Examples (of the global stream) the steps before `start_step` consumed,
    each range at its own batch size; steps no range covers (a run.json
    older than its checkpoints) at `global_batch_size`."""
    entries = ranges(stored)
    total = covered = 0
    for index, entry in enumerate(entries):
        begin = entry["from_step"]
        end = entries[index + 1]["from_step"] if index + 1 < len(entries) else start_step
        end = min(end, start_step)
        if end > begin:
            total += (end - begin) * int(entry.get("global_batch_size") or global_batch_size)
            covered += end - begin
    return total + (start_step - covered) * global_batch_size


def numerics_differ(stored: Optional[dict], numerics: Mapping[str, Any]) -> Optional[str]:
    """The line a resumed `--deterministic` run logs when it computes with
    other threads per replica or another CPU instruction set than the steps
    before it (`engine.runtime.devices.numerics`): float32 sums may round differently,
    so its weights need not be bit-identical to an uninterrupted run's. None
    when they agree, or when run.json recorded neither."""
    before = _last(stored, NUMERICS)
    if not isinstance(before, dict):
        return None
    changed = [f"{name} {before[name]} -> {numerics[name]}" for name in NUMERICS_COMPARED
               if name in before and before[name] != numerics.get(name)]
    if not changed:
        return None
    return ("--deterministic: this run computes with " + ", ".join(changed) + " compared with "
            "the steps before it; float32 sums can round differently, so the weights may not be "
            "bit-identical to an uninterrupted run's (resuming anyway; set --intra_op_threads "
            "or TF_NUM_INTRAOP_THREADS and ONEDNN_MAX_CPU_ISA as before to match)")


def last_range(stored: Optional[dict]) -> Optional[dict]:
    """The newest range of a stored record (what a resumed run continues), or None."""
    entries = ranges(stored)
    return entries[-1] if entries else None


def write(config: RunConfig, stored: Optional[Mapping[str, Any]], *, start_step: int = 0,
          numerics: Optional[Mapping[str, Any]] = None, batching: Any = None,
          run_id_if_new: Optional[str] = None) -> None:
    """Records the identity of the run in `config.model_dir`, and the recipe
    (and `numerics`, `engine.runtime.devices.numerics`; and the `replicas`
    and `schedule_replicas` of `batching`, `engine.assembly.batching.Batching`) it trains
    with from `start_step` on: a new range when any changed. A resume on
    another replica count is also appended to `replica_changes` (`step`,
    `from`, `to`, the micro-batches before and after).

    `stored`: the record as the run read it (`Plan.run_json`; None for a new
    run): what the new record continues, not read again. Its `run_id` is
    kept; a record without one gets `run_id_if_new` (`Plan.run_id`), or a fresh one."""
    kept = [r for r in ranges(stored) if r["from_step"] < start_step]
    recipe = {name: getattr(config, name) for name in config.PER_RANGE}
    if numerics is not None:
        recipe[NUMERICS] = dict(numerics)
    if batching is not None:
        recipe[REPLICAS] = batching.replicas
        recipe[SCHEDULE_REPLICAS] = batching.schedule_replicas
    # Against the range the resumed steps continue (a later one trained nothing that counts).
    before = kept[-1] if kept else {}
    change = None
    if batching is not None and before.get(REPLICAS) not in (None, batching.replicas):
        change = {"step": start_step, "from": before[REPLICAS], "to": batching.replicas,
                  "accumulation_steps": [before.get("accumulation_steps", 1),
                                         batching.accumulation_steps],
                  "global_batch_size": batching.global_batch_size}
    if not kept or {name: kept[-1].get(name) for name in recipe} != recipe:
        kept.append({"from_step": start_step, **recipe})
    record = {name: getattr(config, name) for name in IDENTITY}
    record["global_batch_size"] = config.global_batch_size
    record["optimizer"] = config.optimizer
    record[RANGES] = kept
    record[RUN_ID] = run_id(stored) or run_id_if_new or new_run_id()
    changes = [c for c in (stored or {}).get(REPLICA_CHANGES, [])
               if isinstance(c, dict) and c.get("step", 0) < start_step]
    if change:
        changes.append(change)
    if changes:
        record[REPLICA_CHANGES] = changes
    layout.write_json(path(config.model_dir), record)
