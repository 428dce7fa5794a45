"""The tf.data service: a training pipeline run by a pool of data workers.

When one host's cores cannot prepare batches as fast as its accelerators take
them, `tf.data.experimental.service` moves the pipeline to a dispatcher and
a pool of CPU workers (other processes, other machines) that stream finished
batches back. This module is the TensorFlow end of it: the servers
(`dispatcher`, `worker`, started by `bin/data_service`) and the client side
(`distribute`, which the engine applies to a run's train pipeline).

How a served pipeline is split (measured on loopback, TF 2.21;
docs/data.md): with `ShardingPolicy.DYNAMIC` the dispatcher hands out the
pipeline's *source* (the elements of `from_tensor_slices`/`range`, the file
names of a file list) in small splits to whichever worker asks next, each
worker runs the rest of the pipeline (shuffle, decode, batch) on its splits,
and `repeat()` starts a new pass when every split of the last one was handed
out. So each example is trained on once per pass, with no duplicates across
workers (at most once: the splits a worker held when it died are lost), and
a dead worker stops nothing: its peers take the splits that remain. The
other mode, `parallel_epochs`, runs the whole pipeline on every worker; a
seeded pipeline then yields the same batches on each, so N workers would
train on every batch N times. DYNAMIC is therefore the one used.

What DYNAMIC costs: the order of batches depends on which worker finishes
first (with one worker it is the local order), so a `skip` inside the
pipeline skips in every worker's own share and cannot resume a run exactly,
and a `cache()` makes each worker replay only the share it saw in its first
pass (measured: a few elements repeated many times per pass). And a
pipeline's graph is serialized and run in the workers' processes, where the
Python behind a `tf.py_function`, `tf.numpy_function` or
`Dataset.from_generator` does not exist: the worker fails every element with
`Could not find callback with key=pyfunc_0 in the registry`.
`check_servable` refuses both before the run starts.
"""

from __future__ import annotations

from typing import Optional

import tensorflow as tf

from tfloop.inputs.errors import InputError

#: Ops whose Python function lives only in the process that built the graph.
_PYTHON_OPS = {"EagerPyFunc": "tf.py_function", "PyFunc": "tf.numpy_function (or "
               "Dataset.from_generator)", "PyFuncStateless": "tf.numpy_function"}
#: Ops that make each worker replay its own first share of the data.
_CACHE_OPS = ("CacheDataset", "CacheDatasetV2")


def _op_types(dataset: tf.data.Dataset) -> set[str]:
    """Every op type in the dataset's graph and in the functions it calls."""
    graph = tf.compat.v1.GraphDef()
    graph.ParseFromString(dataset._as_serialized_graph().numpy())  # noqa: SLF001 (public twin: none)
    ops = {node.op for node in graph.node}
    for function in graph.library.function:
        ops.update(node.op for node in function.node_def)
    return ops


def check_servable(dataset: tf.data.Dataset, where: str) -> None:
    """Refuses, in one line, a pipeline the service's workers cannot run as
    the local process would (the module docstring says what was measured)."""
    ops = _op_types(dataset)
    python = sorted(name for op, name in _PYTHON_OPS.items() if op in ops)
    if python:
        raise InputError(
            f"{where} calls {', '.join(python)}, whose Python runs only in the process that "
            "built the pipeline, and --data_service runs it in the data workers' processes "
            "(they fail every element); write that step in TensorFlow ops, or drop "
            "--data_service")
    if ops.intersection(_CACHE_OPS):
        raise InputError(
            f"{where} calls .cache(), and under --data_service each data worker would cache "
            "only the share of the data it reads first and replay it every pass; drop the "
            ".cache() (the workers' own cores make it unneeded), or drop --data_service")


def distribute(dataset: tf.data.Dataset, address: str, job_name: str, *,
               max_outstanding_requests: Optional[int] = None) -> tf.data.Dataset:
    """`dataset`, produced by the service at `address` (`grpc://host:port`,
    checked by the caller: `launch.data_service.address_error`)
    under the shared job `job_name`: every consumer that names the same job
    takes its batches from the same pool (each batch to one of them), one
    with another name gets a pass of its own. DYNAMIC sharding: see the
    module docstring."""
    served = dataset.apply(tf.data.experimental.service.distribute(
        processing_mode=tf.data.experimental.service.ShardingPolicy.DYNAMIC,
        service=address, job_name=job_name,
        max_outstanding_requests=max_outstanding_requests))
    # The service has sharded it: a multi-worker strategy must not shard the
    # served batches again (AUTO would fall back to DATA, and each worker
    # would throw away all but its share of what the pool made for it).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return served.with_options(options)


def dispatcher(port: int, *, work_dir: str = "", worker_timeout_s: float = 10.0,
               job_gc_timeout_s: float = 300.0):
    """A started dispatcher on `port` (every interface). `work_dir`: its
    journal, so a restarted dispatcher recovers its jobs (fault-tolerant
    mode; empty: a restart forgets them and the trainers must restart too).
    `worker_timeout_s`: how long a worker may miss heartbeats before its
    splits go to the others. `job_gc_timeout_s`: how long a job outlives
    its last consumer (a restarted trainer within it continues that job)."""
    config = tf.data.experimental.service.DispatcherConfig(
        port=port, protocol="grpc", work_dir=work_dir or None,
        fault_tolerant_mode=bool(work_dir),
        worker_timeout_ms=int(worker_timeout_s * 1000),
        job_gc_timeout_ms=int(job_gc_timeout_s * 1000))
    return tf.data.experimental.service.DispatchServer(config, start=True)


def worker(port: int, dispatcher_address: str, *, worker_address: str = "",
           heartbeat_s: float = 1.0):
    """A started data worker on `port`, registered with the dispatcher at
    `dispatcher_address` (`host:port`). `worker_address`: how trainers reach
    it (`host:port`; empty: `localhost:<port>`, right only on one machine: in
    a cluster give the pod's IP or stable DNS name)."""
    config = tf.data.experimental.service.WorkerConfig(
        dispatcher_address=dispatcher_address, port=port, protocol="grpc",
        worker_address=worker_address or None,
        heartbeat_interval_ms=int(heartbeat_s * 1000))
    return tf.data.experimental.service.WorkerServer(config, start=True)
