"""The tf.data service's checks, in process: what a data worker cannot run,
the address, the refusals of `--data_service` with what cannot use it, and
the job names that keep runs apart (engine.loop.served_input)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError
from tfloop.engine.loop import served_input, task_inputs
from tfloop.inputs import InputError
from tfloop.inputs import service
from tfloop.launch import data_service


def _batches(ds):
    return ds.batch(4, drop_remainder=True)


@pytest.mark.parametrize("build, says", [
    (lambda: tf.data.Dataset.range(8).map(lambda x: tf.py_function(lambda v: v, [x], tf.int64)),
     "tf.py_function"),
    (lambda: tf.data.Dataset.range(8).map(lambda x: tf.numpy_function(np.copy, [x], tf.int64)),
     "tf.numpy_function"),
    (lambda: tf.data.Dataset.from_generator(lambda: iter(range(8)), output_signature=tf.TensorSpec(
        [], tf.int64)), "from_generator"),
    (lambda: tf.data.Dataset.range(8).cache(), ".cache()"),
])
def test_a_pipeline_a_data_worker_cannot_run_is_refused(build, says):
    with pytest.raises(InputError, match="data_service") as raised:
        service.check_servable(_batches(build().repeat()), "Task.train_dataset")
    assert says in str(raised.value) and "\n" not in str(raised.value)


def test_a_pipeline_of_tensorflow_ops_is_servable():
    ds = tf.data.Dataset.from_tensor_slices(np.arange(8)).shuffle(8, seed=1).repeat()
    service.check_servable(_batches(ds.map(lambda x: x * 2, num_parallel_calls=2)), "t")


@pytest.mark.parametrize("address, says", [
    ("localhost:5050", "has no scheme"), ("http://h:1", "has http://"),
    ("grpc://h", "is not grpc://host:port"), ("grpc://h:1/x", "is not grpc://host:port"),
    ("grpc://:1", "is not grpc://host:port"), ("grpc://h:0", "port 0 is not between"),
])
def test_wrong_addresses_are_one_line(address, says):
    with pytest.raises(ConfigError, match=says):
        RunConfig(data_service=address)


def test_right_addresses():
    for address in ("grpc://localhost:5050", "grpc://10.0.0.7:1", "grpc://[::1]:5050",
                    "grpc://tfdata-dispatcher-0.tfdata.default.svc:5050"):
        assert data_service.address_error(address) is None
        RunConfig(data_service=address)


@pytest.mark.parametrize("fields, says", [
    (dict(strategy="parameter_server"), "--strategy=parameter_server"),
    (dict(synthetic_on_device=True), "--synthetic_on_device"),
    (dict(mode="evaluate"), "--mode=evaluate trains nothing"),
    (dict(epochs=2), "give --steps_per_epoch"),
])
def test_what_cannot_use_the_service_is_refused(fields, says):
    with pytest.raises(ConfigError, match=says):
        RunConfig(data_service="grpc://localhost:5050", **fields)
    RunConfig(**fields)  # fine without it


def test_epochs_of_steps_are_served():
    RunConfig(data_service="grpc://localhost:5050", epochs=2, steps_per_epoch=10)


def test_job_names_keep_runs_apart_and_a_cluster_together(tmp_path):
    cluster = {"worker": ("host-a:2222", "host-b:2222")}
    same = served_input.job_prefix("gs://b/run", cluster)
    assert served_input.job_prefix("gs://b/run", dict(cluster)) == same
    assert served_input.job_prefix("gs://b/other", cluster) != same
    assert served_input.job_prefix("gs://b/run", {"worker": ("host-c:2222",)}) != same
    alone = served_input.job_prefix(str(tmp_path / "a"), {})
    assert alone != served_input.job_prefix(str(tmp_path / "b"), {})
    name = served_input.job_name(alone, start_step=300, global_batch_size=64)
    assert name != served_input.job_name(alone, start_step=0, global_batch_size=64)
    assert name != served_input.job_name(alone, start_step=300, global_batch_size=32)


def test_a_served_context_starts_at_step_zero_unsharded():
    placement = task_inputs.InputPlacement(
        global_batch_size=8, replicas=2, input_workers=2, pipeline_index=1, shard_policy="data",
        seed=0, deterministic=False, data_service="grpc://localhost:5050", service_job="j")
    served = task_inputs.context_for(placement, start_step=50, served=True)
    assert (served.start_step, served.shard_policy, served.examples_to_skip) == (0, "off", 0)
    local = task_inputs.context_for(placement, start_step=50)
    assert (local.start_step, local.shard_policy) == (50, "data")


def test_a_served_dataset_is_not_sharded_again():
    dispatcher = service.dispatcher(0)  # in process: distribute registers the dataset there
    ds = service.distribute(tf.data.Dataset.range(4).batch(2), dispatcher.target, "j")
    assert ds.options().experimental_distribute.auto_shard_policy == \
        tf.data.experimental.AutoShardPolicy.OFF
