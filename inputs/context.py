"""What a dataset builder is told about the run it feeds.

A task's `train_dataset(context)` and `eval_dataset(context)` (see
`engine.task`) receive one `InputContext`. It lives here, below the engine, so
input helpers (`inputs.arrays`, `inputs.records`) can take it without importing
the engine.

Batches are *global*: a dataset yields batches of `global_batch_size`
examples and the engine splits each one across the replicas
(`strategy.experimental_distribute_dataset`), so one device and N replicas see
the same examples in the same steps. In a cluster every worker builds its own
pipeline (`input_pipeline_id` of `num_input_pipelines`) and the engine shards
it by `shard_policy` (`--auto_shard_policy` resolved; set on the dataset by the
engine, so a builder need not).

Exact resume: a restored run starts at `start_step`, and its train stream must
begin where the interrupted one stopped (after the examples its steps
consumed, each at the global batch size it trained with: a resumed run may
change `--global_batch_size`). A builder that reads
`context.start_step` takes that on itself (cheapest before decoding:
`ds.skip(context.examples_to_skip)` on the shuffled, repeated examples, as
`inputs.pipeline` does); one that never reads it gets its first
`start_step` batches skipped by the engine, which says so in the log.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


def examples_per_step(global_batch_size: int, shard_policy: str, num_pipelines: int) -> int:
    """Examples of one pipeline's stream a train step consumes.

    `data`: every worker reads the whole stream and keeps its part of each
    global batch, so it consumes one global batch a step. `file` and `off`:
    a worker's own stream is cut into `workers × replicas` pieces, so it
    feeds the step `global_batch_size / workers` of its examples.
    """
    if num_pipelines > 1 and shard_policy in ("file", "off"):
        return global_batch_size // num_pipelines
    return global_batch_size


@dataclasses.dataclass(frozen=True)
class InputContext:
    """The run as a dataset builder sees it.

    Attributes:
      global_batch_size: examples per batch the dataset must yield (every
        train batch exactly this many; eval batches at most this many).
      num_replicas: replicas in sync; each gets `per_replica_batch_size`.
      num_input_pipelines: processes building this input (cluster workers; 1
        outside a cluster).
      input_pipeline_id: this process's index among them.
      seed: the run's seed; shuffle with it so a resumed run sees the same order
        (None where each worker must draw its own: parameter-server workers).
      shard_policy: how the engine shards this dataset between workers
        (`data`, `file`, `off`); irrelevant outside a cluster.
      deterministic: whether stages that do not decide which batch a step
        sees may yield out of order (`--deterministic=false` is faster).
    """

    global_batch_size: int
    num_replicas: int = 1
    num_input_pipelines: int = 1
    input_pipeline_id: int = 0
    seed: Optional[int] = 0
    shard_policy: str = "data"
    deterministic: bool = True
    _start_step: int = dataclasses.field(default=0, repr=False)
    _examples_trained: Optional[int] = dataclasses.field(default=None, repr=False)
    _read: list = dataclasses.field(default_factory=list, repr=False, compare=False)

    @classmethod
    def create(cls, *, start_step: int = 0, examples_trained: Optional[int] = None,
               **fields) -> "InputContext":
        """An `InputContext` resuming at `start_step` (the field itself is private
        so that reading it can be noticed). `examples_trained`: the examples
        of the global stream the steps before `start_step` consumed, when the
        global batch size changed on the way (default: `start_step` global
        batches of today's size)."""
        return cls(_start_step=start_step, _examples_trained=examples_trained, **fields)

    @property
    def start_step(self) -> int:
        """The global step training resumes from (0 for a new run). Reading it
        tells the engine this dataset already starts there."""
        self._read.append(True)
        return self._start_step

    @property
    def start_step_read(self) -> bool:
        """Whether the builder read `start_step` (so skips by itself)."""
        return bool(self._read)

    @property
    def examples_to_skip(self) -> int:
        """Examples of this pipeline's (shuffled, repeated, unbatched) stream a
        resumed run has trained on, each earlier step at the batch size it
        trained with: skip them before batching. Reads `start_step`."""
        self._read.append(True)
        return self._pipeline_examples()

    @property
    def unread_examples_to_skip(self) -> int:
        """`examples_to_skip` if the builder never read `start_step` (the
        engine must skip them), else 0; reading this is not reading it."""
        return 0 if self._read else self._pipeline_examples()

    def _pipeline_examples(self) -> int:
        if self._examples_trained is None:
            return self._start_step * examples_per_step(
                self.global_batch_size, self.shard_policy, self.num_input_pipelines)
        # Every earlier global batch divided by the pipelines too (the batch
        # must divide by the replicas, of which each pipeline feeds a share).
        return examples_per_step(self._examples_trained, self.shard_policy,
                                 self.num_input_pipelines)

    @property
    def per_replica_batch_size(self) -> int:
        return self.global_batch_size // self.num_replicas
