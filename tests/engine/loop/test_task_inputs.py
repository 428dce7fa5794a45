"""engine.loop.task_inputs.context_for: an `InputContext` from the plain
values of an `InputPlacement` (no plan), the examples a resume skips counted
from the run.json the plan read, and each worker's pipeline index."""

from tfloop.engine.loop import task_inputs
from tfloop.launch import tf_config


def _placement(**overrides):
    values = dict(global_batch_size=16, replicas=2, input_workers=1, pipeline_index=0,
                  shard_policy="data", seed=7, deterministic=True, run_json=None)
    values.update(overrides)
    return task_inputs.InputPlacement(**values)


def test_a_new_runs_context_takes_the_placements_values():
    context = task_inputs.context_for(_placement())
    assert (context.global_batch_size, context.num_replicas, context.num_input_pipelines,
            context.input_pipeline_id, context.seed, context.shard_policy,
            context.deterministic) == (16, 2, 1, 0, 7, "data", True)
    assert context.examples_to_skip == 0
    # A parameter-server worker's: its own batch, no seed (each draws its own order).
    other = task_inputs.context_for(_placement(), global_batch_size=4, seeded=False)
    assert (other.global_batch_size, other.seed) == (4, None)


def test_a_resumed_context_skips_what_the_recorded_ranges_trained_on():
    recorded = {"ranges": [{"from_step": 0, "global_batch_size": 8},
                           {"from_step": 4, "global_batch_size": 16}]}
    context = task_inputs.context_for(_placement(run_json=recorded), start_step=6)
    assert context.examples_to_skip == 4 * 8 + 2 * 16
    # Nothing recorded: every step at the run's batch.
    assert task_inputs.context_for(_placement(), start_step=6).examples_to_skip == 6 * 16


def test_the_pipeline_index_counts_a_chief_job_first_and_applies_to_several_workers():
    cluster = {"chief": ("h:1",), "worker": ("h:2", "h:3")}
    chief = tf_config.Role(task_type="chief", task_index=0, cluster=cluster)
    second = tf_config.Role(task_type="worker", task_index=1, cluster=cluster)
    alone = tf_config.Role(task_type="worker", task_index=1, cluster={"worker": ("a", "b")})
    assert [task_inputs.pipeline_index(r) for r in (chief, second, alone)] == [0, 2, 1]
    placed = task_inputs.context_for(_placement(input_workers=3, pipeline_index=2))
    assert (placed.num_input_pipelines, placed.input_pipeline_id) == (3, 2)
    # One pipeline: index 0, whatever the role said.
    assert task_inputs.context_for(_placement(pipeline_index=2)).input_pipeline_id == 0
