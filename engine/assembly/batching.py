"""The batch arithmetic of a run: one step's examples, decided once::

    global batch = per-replica batch x replicas x micro-batches

`decide_batch` is the one place the global batch and the micro-batches are
decided and every refusal of the batch made; `Batching` is what it decided,
which the plan carries (`Plan.batching`) and run.json records per range
(`run_identity.write`).

Apart from `engine.assembly.plan` because it is arithmetic, not a check of
the machine or the file system: it reads the request, the replica count and
the range a resumed run recorded (run.json, as the plan read it), and
nothing else, so it is tested without devices, a task or a `model_dir`
(tests/engine/assembly/test_elastic_resume.py), and the plan's decision stays
readable apart from the integers of its three batch requests.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Optional

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.task import failures as task_failures
from tfloop.engine.task import Task

logger = logging.getLogger(__name__)

#: What a --deterministic run says when it resumes on another replica count.
REPLICAS_DIFFER = (
    "--deterministic: resuming on %d -> %d replicas trains the same examples in the same "
    "steps, but the gradients' float32 sums add up in another order (per replica, across "
    "replicas, over micro-batches), so the weights cannot be bit-identical to an "
    "uninterrupted run's; they agree within 1e-5 relative (docs/reliability.md, Losing a "
    "machine)")
#: Replica counts a refusal offers, at most (the divisors of the global batch up to it).
_OFFERED_REPLICAS = 64


@dataclasses.dataclass(frozen=True)
class Batching:
    """One step's examples, decided once (`decide_batch`)::

        global batch = per-replica batch x replicas x micro-batches

    Attributes:
      global_batch_size: examples per optimizer update, over every replica and micro-batch.
      replicas: replicas in sync this run trains on.
      accumulation_steps: micro-batches per step.
      schedule_replicas: what `--scale_learning_rate=linear` multiplies by.
      resumed: the run.json range the run resumes after (None: a new run),
        for `change` and the log line.
    """

    global_batch_size: int
    replicas: int
    accumulation_steps: int
    schedule_replicas: int
    resumed: Optional[dict] = None

    @property
    def per_replica_batch_size(self) -> int:
        """Examples one replica computes at once (one micro-batch)."""
        return self.global_batch_size // (self.replicas * self.accumulation_steps)

    @property
    def change(self) -> Optional[dict]:
        """`{"from": R, "to": R', ...}` when the run resumes on another replica
        count than its last range recorded (for the log lines; run.json's
        `replica_changes` is `run_identity.write`'s); else None."""
        before = (self.resumed or {}).get("replicas")
        if not before or before == self.replicas:
            return None
        return {"from": before, "to": self.replicas,
                "accumulation_steps": [self.resumed.get("accumulation_steps", 1),
                                       self.accumulation_steps],
                "global_batch_size": self.global_batch_size}

    def describe(self) -> str:
        """`global batch 32 (8 per replica)`, or `... (8 per replica in 2
        micro-batches of 4)`: the start-up line's part (`Plan.describe`)."""
        per_replica = self.global_batch_size // self.replicas
        return "".join([
            f"global batch {self.global_batch_size} ({per_replica} per replica",
            f" in {self.accumulation_steps} micro-batches of {self.per_replica_batch_size})"
            if self.accumulation_steps > 1 else ")"])

    def apply(self, config: RunConfig) -> RunConfig:
        """`config` with the batch as decided: the global batch and the
        micro-batches set, the per-replica requests spent."""
        return dataclasses.replace(config, global_batch_size=self.global_batch_size,
                                   accumulation_steps=self.accumulation_steps,
                                   per_replica_batch_size=0, max_per_replica_batch_size=0)


def decide_batch(config: RunConfig, replicas: int, *, resumed: Optional[dict] = None,
                 task: Optional[Task] = None) -> Batching:
    """The one place the global batch and the micro-batches are decided, and
    every refusal of the batch made (each flag's own range: its option in
    `engine.config`; which flags ask for it: `RunConfig._check_batch_request`).

    `resumed` is the newest range of the run's run.json when it resumes from
    a checkpoint (`run_identity.last_range`), else None. Three requests:

    - `--global_batch_size=B` (`--accumulation_steps=A`): B and A as given;
      each replica takes B / (replicas x A), however many replicas there are.
    - `--per_replica_batch_size=P`: a new run trains B = P x replicas x A; a
      resumed one keeps the B it recorded and takes A = B / (P x replicas),
      so P stays what the run asked for on any replica count.
    - `--max_per_replica_batch_size=M`: B as given (a resume without
      --global_batch_size keeps the recorded one), and the fewest A that
      divide it into shares of at most M per replica.

    A batch that cannot be cut so is refused in one line naming the replica
    counts (or the flag) that would work; so is one larger than `task`'s
    train split, where its size is known (every step would repeat examples).
    The learning rate's linear scaling keeps the replica count of the
    recorded range while the global batch is the same: an elastic resume
    changes how a step is computed, not the step.
    """
    recorded = int((resumed or {}).get("global_batch_size") or 0)
    if config.per_replica_batch_size:
        batch, micro = _from_per_replica(config, replicas, recorded)
    elif config.max_per_replica_batch_size:
        batch, micro = _within_max_per_replica(config, replicas, recorded)
    else:
        batch, micro = config.global_batch_size, config.accumulation_steps
        _check_divides(batch, replicas, micro)
    if task is not None:
        _check_batch_fits(batch, task)
    scaled = replicas
    if resumed and resumed.get("schedule_replicas") and recorded == batch:
        scaled = int(resumed["schedule_replicas"])
    batching = Batching(global_batch_size=batch, replicas=replicas, accumulation_steps=micro,
                        schedule_replicas=scaled, resumed=resumed)
    if batching.change:
        logger.info("resuming on %d replica(s) after %d: global batch %d, %d per replica in "
                    "%d micro-batch(es) of %d", replicas, batching.change["from"], batch,
                    batch // replicas, micro, batching.per_replica_batch_size)
        if config.deterministic:
            logger.warning(REPLICAS_DIFFER, batching.change["from"], replicas)
    return batching


def _from_per_replica(config: RunConfig, replicas: int, recorded: int) -> tuple[int, int]:
    """`--per_replica_batch_size=P`: (global batch, micro-batches) of a new run
    (P x replicas x `--accumulation_steps`), or of a resumed one that keeps
    its `recorded` global batch (the micro-batches that make it)."""
    per_replica, micro = config.per_replica_batch_size, config.accumulation_steps
    if recorded:
        batch = recorded
        micro, rest = divmod(batch, per_replica * replicas)
        if rest or not micro:
            raise ConfigError(
                f"--per_replica_batch_size={per_replica} on {replicas} replica(s) cannot "
                f"make the global batch {batch} this run trained with: {batch} is not "
                f"{per_replica} x {replicas} x a whole number of micro-batches; resume on "
                f"{_replica_counts(batch // per_replica if batch % per_replica == 0 else 0)}"
                f" replica(s), or use --max_per_replica_batch_size={per_replica} to let "
                "the per-replica batch shrink")
    else:
        batch = per_replica * replicas * micro
    logger.info("global batch %d: --per_replica_batch_size=%d x %d replicas%s%s", batch,
                per_replica, replicas, f" x {micro} micro-batches" if micro > 1 else "",
                " (the global batch the run recorded)" if recorded else "")
    return batch, micro


def _within_max_per_replica(config: RunConfig, replicas: int,
                            recorded: int) -> tuple[int, int]:
    """`--max_per_replica_batch_size=M`: the global batch as given (a resume
    without --global_batch_size keeps the `recorded` one), and the fewest
    micro-batches that cut it into shares of at most M per replica."""
    most, batch = config.max_per_replica_batch_size, config.global_batch_size
    if recorded and not config.changed("global_batch_size"):
        batch = recorded
    micro = next((a for a in range(1, batch // replicas + 1)
                  if batch % (replicas * a) == 0 and batch // (replicas * a) <= most), 0)
    if not micro:
        raise ConfigError(
            f"--max_per_replica_batch_size={most} cannot cut the global batch {batch} "
            f"over {replicas} replica(s): {batch} does not divide by {replicas}; use "
            f"{_replica_counts(batch)} replica(s), or a global batch that divides by "
            f"{replicas}")
    logger.info("global batch %d over %d replica(s): %d micro-batch(es) of %d per "
                "replica (--max_per_replica_batch_size=%d)", batch, replicas, micro,
                batch // (replicas * micro), most)
    return batch, micro


def _check_divides(batch: int, replicas: int, micro: int) -> None:
    """`--global_batch_size` (with `--accumulation_steps`) as given: it must
    cut into equal shares, one per replica and micro-batch."""
    if batch % (replicas * micro):
        parts = replicas * micro
        into = (f"the {replicas} replicas" if micro == 1
                else f"{replicas} replicas x {micro} micro-batches (--accumulation_steps)")
        raise ConfigError(
            f"--global_batch_size={batch} does not divide by {into}; use a multiple of "
            f"{parts}, e.g. {max(parts, batch // parts * parts)}")


def _replica_counts(total: int) -> str:
    """`1, 2, 4 or 8`: the replica counts `total` divides by (up to a few)."""
    counts = [n for n in range(1, min(total, _OFFERED_REPLICAS) + 1) if total % n == 0]
    if not counts:
        return "no"
    return str(counts[0]) if len(counts) == 1 else ", ".join(map(str, counts[:-1])) + f" or {counts[-1]}"


def _check_batch_fits(batch: int, task: Task) -> None:
    """Refuses a global batch larger than the train split (where its size is
    known): every step would hold some examples twice."""
    with task_failures.calling(task, "train_examples"):
        examples = task.train_examples
    if examples and batch > examples:
        raise ConfigError(
            f"--global_batch_size={batch} is larger than the {examples} "
            f"examples {type(task).__name__} trains on: each step would repeat examples; "
            f"use a batch of at most {examples}")
