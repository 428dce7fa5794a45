"""The GPU paths of the collectives, proven without a GPU.

Nothing here runs a GPU kernel: graphs are built (traced) with "/gpu:N"
device names, which TensorFlow accepts without placing anything, and the
dtypes NCCL takes come from TF's op registry. What they prove: NCCL is never
handed bfloat16 or two replicas of one physical GPU, `auto` on GPUs packs
unless told otherwise (fewer NcclAllReduce launches in the traced graph), and
float16 compression does not overflow where the sum of the replicas would.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop.collectives import _tf_private, _values, auto, gpus, nccl

GPUS = ["/gpu:0", "/gpu:1"]


def traced_ops(collective, dtypes, devices=GPUS):
    """The op types a batch of per-replica gradients (one per dtype, each on
    every device of `devices`) traces to through `collective`, in a graph."""
    return [op.type for op in traced_graph(collective, dtypes, devices).get_operations()]


def traced_graph(collective, dtypes, devices=GPUS) -> tf.Graph:
    """The graph `traced_ops` lists."""
    graph = tf.Graph()
    with graph.as_default():
        values = []
        for k, dtype in enumerate(dtypes):
            parts = []
            for device in devices:
                with tf.device(device):
                    parts.append(tf.ones([3 + k], dtype))
            values.append(_tf_private.per_replica(parts))
        collective.batch_all_reduce(values, values)
    return graph


def test_nccl_dtypes_come_from_tensorflows_op_registry():
    assert set(nccl.supported_dtypes()) == {
        d.name for d in _tf_private.op_dtypes("NcclAllReduce")}
    assert "float16" in nccl.supported_dtypes()
    assert "bfloat16" not in nccl.supported_dtypes()


@pytest.mark.parametrize("name, given", [
    ("nccl", "--collective=nccl with"), ("auto", "--collective=auto (NCCL on GPUs) with")])
def test_bfloat16_through_nccl_is_refused_in_one_line(name, given):
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create(name, devices=GPUS, gradient_dtype="bfloat16")
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith(f"{given} --gradient_dtype=bfloat16")
    assert "--gradient_dtype=float16" in message and "--collective=ring" in message


def test_float16_through_nccl_traces_to_float16_nccl_ops():
    collective = collectives.create("nccl", devices=GPUS, gradient_dtype="float16")
    graph = traced_graph(collective, [tf.float32, tf.float32])
    reductions = [op for op in graph.get_operations() if op.type == "NcclAllReduce"]
    assert len(reductions) == 4  # unpacked: 2 gradients x 2 GPUs
    assert {op.get_attr("T") for op in reductions} == {tf.float16}


def test_a_bfloat16_gradient_reaching_nccl_is_one_line_at_trace_time():
    """A model with bfloat16 weights has bfloat16 gradients without any
    --gradient_dtype: TF would raise a TypeError from inside NcclAllReduce."""
    collective = collectives.create("nccl", devices=GPUS)
    with pytest.raises(collectives.CollectiveError, match="got a bfloat16 gradient.*float32"):
        traced_ops(collective, [tf.float32, tf.bfloat16])


def test_bfloat16_on_virtual_gpus_goes_through_the_ring(monkeypatch):
    monkeypatch.setattr(gpus, "logical_split", lambda physical=None: [2])
    collective = collectives.create("auto", devices=GPUS, gradient_dtype="bfloat16")
    assert collective.describe().startswith("auto->ring")
    assert "CollectiveReduceV2" in traced_ops(collective, [tf.float32])


def test_logical_gpus_map_to_their_physical_gpu():
    assert gpus.physical_gpu_of([2, 1, 3]) == [0, 0, 1, 2, 2, 2]
    assert gpus.logical_gpu_count([2, 1, 3]) == 6
    assert gpus.sharing(["/gpu:0", "/gpu:1"], [2, 2]) == ["/gpu:0", "/gpu:1"]
    assert gpus.sharing(["/gpu:0", "/gpu:2"], [2, 2]) == []
    assert gpus.sharing(["/gpu:1", "/gpu:2", "/gpu:3"], [2, 2]) == ["/gpu:2", "/gpu:3"]
    assert gpus.sharing(["/cpu:0", "/cpu:1"], []) == []
    assert gpus.logical_split() == []  # no GPU here


def test_auto_picks_ring_on_virtual_gpus_and_nccl_on_physical_ones():
    assert auto.choose(GPUS, split=[2]).large == "ring"
    assert "virtual GPUs" in auto.choose(GPUS, split=[2]).why
    assert auto.choose(GPUS, split=[1, 1]).large == "nccl"
    assert auto.choose(["/gpu:0", "/gpu:2"], split=[2, 2]).large == "nccl"


def test_nccl_on_virtual_gpus_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(gpus, "logical_split", lambda physical=None: [2, 2])
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create("nccl", devices=GPUS)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("--collective=nccl: gpu:0,gpu:1 are virtual GPUs on one physical")
    assert "--collective=ring" in message
    collectives.create("nccl", devices=["/gpu:0", "/gpu:2"])  # one per physical GPU: fine


def test_auto_on_gpus_packs_unless_packing_flags_are_given(caplog):
    with caplog.at_level("INFO", logger="tfloop.collectives.auto"):
        packed = collectives.create("auto", devices=GPUS)
    assert packed.describe() == "auto->nccl(num_packs=1), packed by default on GPUs"
    assert any("packed into one all-reduce per dtype" in r.getMessage() for r in caplog.records)
    unpacked = collectives.create("nccl", devices=GPUS)
    three = [tf.float32, tf.float32, tf.float32]
    assert traced_ops(unpacked, three).count("NcclAllReduce") == 6  # one per gradient and GPU
    assert traced_ops(packed, three).count("NcclAllReduce") == 2  # one pack per GPU
    asked = collectives.create("auto", devices=GPUS, num_packs=2)
    assert asked.describe() == "auto->nccl(num_packs=2)" and not asked.packed_by_default
    by_bytes = collectives.create("auto", devices=GPUS, pack_bytes=1 << 20)
    assert by_bytes.describe() == "auto->nccl(num_packs=0)+packing(pack_bytes=1048576)"
    # CPUs keep their measured choice, unpacked.
    assert not collectives.create("auto", devices=["/cpu:0", "/cpu:1"]).packed_by_default


@pytest.fixture(scope="module")
def strategy(cpu_devices):
    return tf.distribute.MirroredStrategy(cpu_devices)


@pytest.mark.parametrize("name", ["reduce_to_one_device", "ring", "hierarchical_copy"])
def test_float16_compression_does_not_overflow_a_sum_past_65504(strategy, cpu_devices, name):
    """Each replica's value fits float16, their sum over 4 replicas does not:
    unguarded, the all-reduce in float16 would return inf."""
    rng = np.random.default_rng(0)
    per_replica = [np.concatenate([[65504.0, -65504.0, 60000.0],
                                   rng.uniform(1000, 65000, size=29)]).astype(np.float32)
                   for _ in cpu_devices]

    def value_fn(ctx):
        with tf.device(cpu_devices[ctx.replica_id_in_sync_group]):
            return tf.constant(per_replica[ctx.replica_id_in_sync_group])

    value = strategy.experimental_distribute_values_from_function(value_fn)
    want = np.sum(np.asarray(per_replica, np.float64), axis=0)
    collective = collectives.create(name, devices=cpu_devices, gradient_dtype="float16")
    with strategy.scope():
        (result,) = collective.batch_all_reduce([value], [value])
    for part in _values.components(result):
        got = part.numpy().astype(np.float64)
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, want, rtol=2 * 4 * 2.0**-11)
