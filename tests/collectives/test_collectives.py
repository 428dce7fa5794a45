"""Every CPU collective, alone and wrapped, sums PerReplica values exactly.

Runs on the session's four logical CPUs (tests/conftest.py). Inputs are
uniform in [0.5, 1.5): with no cancellation, the relative error of a sum of N
values rounded to a dtype is at most about N x (unit roundoff) whatever the
order of the additions, which gives the tolerances below:

* float32: rtol 1e-6 (N=4: bound 4 x 2^-24 = 2.4e-7);
* bfloat16 compression: rtol 2 x N x 2^-8 = 3.1e-2 (one rounding of each
  input, one per addition, unit roundoff 2^-8);
* float16 compression: rtol 2 x N x 2^-11 = 3.9e-3.
"""

import numpy as np
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop.collectives import _values
from tfloop.collectives.base import CrossDeviceOpsCollective

CPU_COLLECTIVES = ["ring", "hierarchical_copy", "reduce_to_one_device", "auto"]
PACKING = [dict(), dict(num_packs=2), dict(pack_bytes=64)]
UNIT_ROUNDOFF = {"float32": 2.0**-24, "bfloat16": 2.0**-8, "float16": 2.0**-11}

ODD_SHAPES = [(), (0,), (1,), (3, 5, 7), (17,), (2, 1, 3), (1, 0, 4), (33, 2)]


@pytest.fixture(scope="module")
def strategy(cpu_devices):
    return tf.distribute.MirroredStrategy(cpu_devices)


def make_values(strategy, shapes, dtypes=None, seed=0):
    """PerReplica values (one per shape) placed on each replica's device, and
    the float64 numpy sums they should reduce to."""
    rng = np.random.default_rng(seed)
    dtypes = dtypes or ["float32"] * len(shapes)
    devices = strategy.extended.worker_devices
    arrays = [
        [rng.uniform(0.5, 1.5, size=shape).astype(dtype) for _ in devices]
        for shape, dtype in zip(shapes, dtypes)
    ]

    def value_fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(devices[r]):
            return [tf.constant(per_replica[r]) for per_replica in arrays]

    values = strategy.experimental_distribute_values_from_function(value_fn)
    sums = [np.sum([a.astype(np.float64) for a in per_replica], axis=0) for per_replica in arrays]
    return list(values), sums


def assert_sums(results, sums, rtol, devices=None):
    assert len(results) == len(sums)
    for result, want in zip(results, sums):
        parts = _values.components(result)
        assert len(parts) == 4
        if devices is not None:
            assert [tf.DeviceSpec.from_string(p.device).device_index for p in parts] == [
                tf.DeviceSpec.from_string(d).device_index for d in devices
            ]
        for part in parts:
            got = np.asarray(part.numpy(), np.float64)
            assert got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=rtol, atol=0)


@pytest.mark.parametrize("packing", PACKING, ids=["unpacked", "num_packs2", "pack_bytes64"])
@pytest.mark.parametrize("name", CPU_COLLECTIVES)
def test_float32_sums_are_exact(strategy, cpu_devices, name, packing):
    collective = collectives.create(name, devices=cpu_devices, **packing)
    shapes = ODD_SHAPES + [(3,)] * 20  # odd shapes, then many small tensors
    values, sums = make_values(strategy, shapes)
    with strategy.scope():
        results = collective.batch_all_reduce(values, values)
    assert_sums(results, sums, rtol=1e-6, devices=cpu_devices)


@pytest.mark.parametrize("gradient_dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("packing", [dict(), dict(pack_bytes=256)], ids=["unpacked", "packed"])
@pytest.mark.parametrize("name", CPU_COLLECTIVES)
def test_compressed_sums_within_rounding(strategy, cpu_devices, name, packing, gradient_dtype):
    collective = collectives.create(
        name, devices=cpu_devices, gradient_dtype=gradient_dtype, **packing
    )
    values, sums = make_values(strategy, ODD_SHAPES + [(5,)] * 10, seed=1)
    with strategy.scope():
        results = collective.batch_all_reduce(values, values)
    for result in results:
        assert all(p.dtype == tf.float32 for p in _values.components(result))
    rtol = 2 * len(cpu_devices) * UNIT_ROUNDOFF[gradient_dtype]
    assert_sums(results, sums, rtol=rtol)


@pytest.mark.parametrize("name", CPU_COLLECTIVES)
def test_inside_tf_function_with_mixed_dtypes(strategy, cpu_devices, name):
    """The trainer's setting: traced, and gradients of several dtypes in one
    batch (TF's concat packer alone would fail to concatenate them)."""
    collective = collectives.create(name, devices=cpu_devices, num_packs=1)
    shapes = [(4, 3), (7,), (2, 2), (5,), ()]
    dtypes = ["float32", "float64", "float32", "int32", "float64"]
    values, sums = make_values(strategy, shapes, dtypes)

    @tf.function
    def reduce(values):
        reduced = collective.batch_all_reduce(values, values)
        return [list(_values.components(r)) for r in reduced]

    with strategy.scope():
        outputs = reduce(values)
    for per_device, want, dtype in zip(outputs, sums, dtypes):
        for got in per_device:
            assert got.dtype == tf.as_dtype(dtype)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-6)


@pytest.mark.parametrize("name", ["ring", "hierarchical_copy+packing", "auto+bfloat16"])
def test_merge_call_with_mirrored_variables_as_destinations(strategy, cpu_devices, name):
    """As the trainer calls it: in `strategy.run`, via `merge_call`, with the
    variables (Keras 3: `.value`) as destinations; the result is Mirrored."""
    import keras

    base, _, option = name.partition("+")
    options = {"packing": dict(pack_bytes=1024), "bfloat16": dict(gradient_dtype="bfloat16")}
    collective = collectives.create(base, devices=cpu_devices, **options.get(option, {}))
    with strategy.scope():
        layer = keras.layers.Dense(3)
        layer.build((None, 5))
    variables = layer.trainable_variables

    @tf.function
    def step():
        def replica_fn():
            r = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group, tf.float32)
            grads = [tf.ones(v.shape) * (r + 1.0) for v in variables]
            return tf.distribute.get_replica_context().merge_call(
                lambda _, g: collective.batch_all_reduce(g, variables), args=(grads,)
            )

        return strategy.run(replica_fn)

    results = step()
    expected = sum(range(1, len(cpu_devices) + 1))  # 1 + 2 + 3 + 4
    for result in results:
        for part in strategy.experimental_local_results(result):
            np.testing.assert_allclose(part.numpy(), expected, rtol=1e-2 if option else 0)


def test_packing_plan_buckets_whole_tensors_by_dtype(strategy, cpu_devices):
    inner = collectives.create("reduce_to_one_device", devices=cpu_devices)
    values, _ = make_values(
        strategy, [(4,), (4,), (4,), (64,), (4,), (4,)],
        ["float32", "float32", "float64", "float32", "float32", "float32"],
    )
    by_bytes = collectives.Packing(inner, pack_bytes=32)
    buckets, passthrough = by_bytes.plan(values, values)
    # float32: 16+16 -> full; 256 alone; 16+16 -> full; float64 alone; in gradient order.
    assert buckets == [[0, 1], [2], [3], [4, 5]]
    assert passthrough == []
    by_count = collectives.Packing(inner, num_packs=2)
    buckets, _ = by_count.plan(values, values)
    # float32 total 320 bytes, target 160: the 256-byte tensor travels alone
    # (never copied into a bucket); the small ones around it share one.
    assert buckets == [[0, 1, 4, 5], [2], [3]]


def test_single_replica_values_come_back_unchanged(cpu_devices):
    tensors = [tf.constant([1.0, 2.0]), tf.constant(3.0)]
    for name in CPU_COLLECTIVES:
        for options in (dict(), dict(num_packs=1), dict(gradient_dtype="bfloat16")):
            collective = collectives.create(name, devices=cpu_devices[:1], **options)
            results = collective.batch_all_reduce(tensors, tensors)
            assert all(r is t for r, t in zip(results, tensors))


def test_hierarchical_copy_refuses_odd_replica_counts_at_run_time(cpu_devices):
    """TF's tree silently drops the last of an odd count: never let it run."""
    three = tf.distribute.MirroredStrategy(cpu_devices[:3])
    collective = collectives.create("hierarchical_copy", devices=cpu_devices[:2])
    values, _ = make_values(three, [(3,)])
    with pytest.raises(collectives.CollectiveError) as raised:
        collective.batch_all_reduce(values, values)
    assert "even number of devices" in str(raised.value)


def test_mismatched_destinations_are_a_clear_error(strategy, cpu_devices):
    values, _ = make_values(strategy, [(3,), (3,)])
    with pytest.raises(ValueError) as raised:
        collectives.create("ring", devices=cpu_devices).batch_all_reduce(values, values[:1])
    assert "2 values but 1 destinations" in str(raised.value)


def test_ring_reduces_two_device_groups_in_one_process(cpu_devices):
    """Each ring owns its group keys: a 4-device and a 2-device group coexist
    (two MirroredStrategies alone would both use group key 1)."""
    for devices in (cpu_devices, cpu_devices[:2], cpu_devices):
        strategy = tf.distribute.MirroredStrategy(devices)
        values, sums = make_values(strategy, [(6,)])
        results = collectives.create("ring", devices=devices).batch_all_reduce(values, values)
        for part in _values.components(results[0]):
            np.testing.assert_allclose(part.numpy(), sums[0], rtol=1e-6)


def test_ring_asks_tf_for_the_ring_implementation(cpu_devices):
    ring = collectives.create("ring", devices=cpu_devices)
    assert ring.communication_options.implementation == (
        tf.distribute.experimental.CommunicationImplementation.RING
    )


def test_nccl_refuses_cpus_in_one_line(cpu_devices):
    with pytest.raises(collectives.CollectiveError) as raised:
        collectives.create("nccl", devices=cpu_devices)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("--collective=nccl needs GPUs, but the devices are cpu:0,cpu:1")
    assert "ring, hierarchical_copy or reduce_to_one_device" in message


def test_nccl_configuration_without_a_gpu():
    """What can be checked here without a GPU: the TF object and its packing."""
    gpus = ["/gpu:0", "/gpu:1"]
    nccl = collectives.create("nccl", devices=gpus, num_packs=3)
    assert isinstance(nccl, CrossDeviceOpsCollective)
    assert isinstance(nccl.cross_device_ops(()), tf.distribute.NcclAllReduce)
    assert nccl.num_packs == 3
    assert nccl.describe() == "nccl(num_packs=3)"
    by_bytes = collectives.create("nccl", devices=gpus, pack_bytes=1 << 20)
    assert isinstance(by_bytes, collectives.Packing)
    assert by_bytes.inner.num_packs == 0  # our buckets replace TF's packer
    compressed = collectives.create("nccl", devices=gpus, gradient_dtype="float16")
    assert compressed.describe() == "nccl(num_packs=0)+float16"


def test_auto_picks_and_logs(cpu_devices, caplog):
    with caplog.at_level("INFO", logger="tfloop.collectives.auto"):
        auto = collectives.create("auto", devices=cpu_devices)
    assert auto.chosen is not None and auto.chosen.name != "nccl"
    assert any("auto picked" in r.getMessage() for r in caplog.records)
    choose = collectives.auto.choose
    assert choose(["/gpu:0", "/gpu:1"]).large == "nccl"
    assert choose(["/gpu:0", "/gpu:1"]).small is None
    assert choose(["/cpu:0"]).large == "reduce_to_one_device"
    assert choose(["/cpu:0", "/gpu:0"]).large == "reduce_to_one_device"
    assert choose(["/cpu:0", "/cpu:1"]).small is None  # measured a tie on 2 devices
    assert choose(["/cpu:0", "/cpu:1", "/cpu:2"]).small is None  # hierarchical copy: even only
    four = choose(["/cpu:0", "/cpu:1", "/cpu:2", "/cpu:3"])
    assert (four.small, four.small_below, four.large) == (
        "hierarchical_copy", 256 << 10, "reduce_to_one_device")


def test_auto_sends_small_tensors_to_one_collective_and_the_rest_to_another(
        strategy, cpu_devices):
    """On 4 CPUs a batch is split by size, reduced by both, and put back in
    order, each sum on every device."""
    auto = collectives.create("auto", devices=cpu_devices)
    assert auto.describe() == (
        "auto->hierarchical_copy(num_packs=0)[<256K]+reduce_to_one_device")
    shapes = [(4,), (256 << 8,), (8, 8), (300, 300)]  # 16 B, 256 KiB, 256 B, 352 KiB
    values, expected = make_values(strategy, shapes, ["float32"] * 4)
    picked = [auto.collective_for(v).name for v in values]
    assert picked == ["hierarchical_copy", "reduce_to_one_device", "hierarchical_copy",
                      "reduce_to_one_device"]
    with strategy.scope():
        results = auto.batch_all_reduce(values, values)
    assert_sums(results, expected, rtol=1e-6, devices=cpu_devices)


def test_reduce_to_one_device_sums_where_asked(strategy, cpu_devices):
    collective = collectives.create(
        "reduce_to_one_device", devices=cpu_devices, reduce_device="cpu:3"
    )
    assert collective.describe() == "reduce_to_one_device(reduce_device=cpu:3)"
    values, sums = make_values(strategy, [(5,)])
    assert_sums(collective.batch_all_reduce(values, values), sums, rtol=1e-6)

    @tf.function
    def reduce(values):
        return [list(_values.components(r)) for r in collective.batch_all_reduce(values, values)]

    with strategy.scope():  # a traced function's inputs carry no device
        graph = reduce.get_concrete_function(values).graph
    sums_at = {tf.DeviceSpec.from_string(op.device).device_index
               for op in graph.get_operations() if op.type == "AddN"}
    assert sums_at == {3}


@pytest.mark.parametrize("name", ["reduce_to_one_device", "hierarchical_copy"])
def test_sparse_gradients_pass_through_the_wrappers(strategy, cpu_devices, name):
    """IndexedSlices (embedding gradients) are neither packed nor cast."""
    collective = collectives.create(name, devices=cpu_devices, pack_bytes=64,
                                    gradient_dtype="bfloat16")
    devices = strategy.extended.worker_devices

    def value_fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(devices[r]):
            sparse = tf.IndexedSlices(
                values=tf.fill([1, 3], float(r + 1)), indices=tf.constant([r % 2]),
                dense_shape=tf.constant([2, 3]))
            return [tf.fill([4], 1.0), sparse, tf.fill([2], 2.0)]

    values = list(strategy.experimental_distribute_values_from_function(value_fn))
    with strategy.scope():
        reduced = collective.batch_all_reduce(values, values)
    want_sparse = np.zeros((2, 3))
    for r in range(len(cpu_devices)):
        want_sparse[r % 2] += r + 1
    for part in _values.components(reduced[1]):
        assert part.dtype == tf.float32
        np.testing.assert_allclose(tf.convert_to_tensor(part).numpy(), want_sparse)
    for part, want in ((_values.components(reduced[0])[0], 4.0),
                       (_values.components(reduced[2])[0], 8.0)):
        np.testing.assert_allclose(part.numpy(), want)
