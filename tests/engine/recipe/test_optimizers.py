"""`--fused_optimizer`: one TensorFlow training kernel per variable, Keras's
formulas and slots, so fused and Keras updates agree to float32 rounding."""

import keras
import numpy as np
import pytest

from tfloop.engine.recipe import optimizers


def _train(optimizer, steps=3):
    variables = [keras.Variable(np.linspace(-1, 1, 6, dtype="float32").reshape(2, 3)),
                 keras.Variable(np.full([4], 0.5, dtype="float32"))]
    optimizer.build(variables)
    rng = np.random.default_rng(0)
    for _ in range(steps):
        grads = [rng.normal(size=v.shape).astype("float32") for v in variables]
        optimizer.apply_gradients(zip(grads, variables))
    return [v.numpy() for v in variables], [v.numpy() for v in optimizer.variables]


@pytest.mark.parametrize("name", optimizers.available())
def test_fused_updates_equal_the_keras_updates(name):
    weights, slots = _train(optimizers.build(name, 0.1))
    fused_weights, fused_slots = _train(optimizers.build_fused(name, 0.1))
    assert len(fused_slots) == len(slots)
    for want, got in zip(weights + slots, fused_weights + fused_slots):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("prebuilt", [False, True])
def test_the_trainer_builds_the_optimizer_once(prebuilt):
    """`engine.assembly.run` builds the optimizer before restoring a checkpoint; the
    Trainer must not build it again (a LossScaleOptimizer would make a second
    loss scale and step counter, unrestored)."""
    import tensorflow as tf

    from tfloop import collectives
    from tfloop.engine.loop.trainer import Trainer

    strategy = tf.distribute.get_strategy()
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    built_once = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    built_once.build(model.trainable_variables)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    if prebuilt:
        optimizer.build(model.trainable_variables)
    data = tf.data.Dataset.from_tensors((tf.zeros([4, 3]), tf.zeros([4], tf.int64))).repeat()
    Trainer(strategy=strategy, model=model, optimizer=optimizer,
            collective=collectives.create("reduce_to_one_device", devices=["/cpu:0"]),
            train_dataset=data, global_batch_size=4, global_step=tf.Variable(0, dtype=tf.int64))
    assert optimizer.built
    assert len(optimizer.variables) == len(built_once.variables)


def _replicated_adam(build, devices, steps=3):
    """Adam built by `build` over 5 variables on a 2-replica MirroredStrategy,
    after `steps` updates from `tf.function` steps (the engine's way: the
    gradients already summed, so Keras's own reduction is off)."""
    import tensorflow as tf

    from tfloop.engine.recipe import keras_bridge

    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        variables = [tf.Variable(np.linspace(-1, 1, 3, dtype="float32") * (i + 1)) for i in range(5)]
        optimizer = build("adam", 0.1)
        optimizer.build(variables)
    keras_bridge.disable_implicit_gradient_reduction(optimizer)

    @tf.function
    def step(scale):
        def replica():
            grads = [tf.sin(v * scale) for v in variables]
            optimizer.apply_gradients(zip(grads, variables))
        strategy.run(replica)

    for i in range(steps):
        step(tf.constant(float(i + 1)))
    return step.get_concrete_function(tf.constant(1.0)).graph, [v.numpy() for v in variables]


def _ops(graph, op_type: str) -> int:
    """`op_type` ops in `graph` and every function it calls (a cond's branches)."""
    graph_def = graph.as_graph_def()
    nodes = list(graph_def.node) + [n for f in graph_def.library.function for n in f.node_def]
    return sum(node.op == op_type for node in nodes)


def test_fused_adam_computes_the_steps_scalars_once_per_device_not_per_variable(cpu_devices):
    """Keras's Adam raises β₁ and β₂ to the step for every variable (two `Pow`
    per variable and replica: 322 kernel launches a step for a ResNet-50);
    the fused one once per update and device, and its weights are Keras's."""
    devices = cpu_devices[:2]
    graph, weights = _replicated_adam(optimizers.build, devices)
    fused_graph, fused_weights = _replicated_adam(optimizers.build_fused, devices)
    assert _ops(graph, "Pow") == 2 * 5 * len(devices)  # what the fused one saves
    assert _ops(fused_graph, "Pow") == 2 * len(devices)
    assert _ops(fused_graph, "ResourceApplyAdam") == 5 * len(devices)
    for want, got in zip(weights, fused_weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def _embedding_adam(build, densify: bool):
    """Weights after 3 Adam steps of a model whose first gradient is an
    Embedding's `IndexedSlices`, with row 1 looked up twice in the batch."""
    import tensorflow as tf

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                              keras.layers.Flatten(), keras.layers.Dense(2)])
    model.set_weights([np.linspace(-1, 1, w.size, dtype="float32").reshape(w.shape)
                       for w in model.get_weights()])
    optimizer = build("adam", 0.1)
    x, y = tf.constant([[1, 2, 3], [4, 5, 1]]), tf.constant([0, 1])

    @tf.function
    def step():
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(keras.losses.sparse_categorical_crossentropy(
                y, model(x), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        assert isinstance(grads[0], tf.IndexedSlices)
        if densify:
            grads = [tf.convert_to_tensor(g) for g in grads]
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    for _ in range(3):
        step()
    return model.get_weights()


def test_fused_adam_on_a_sparse_gradient_is_adam_on_the_summed_gradient():
    """An Embedding's gradient arrives as `IndexedSlices`. The fused kernel
    applies Adam to it as one dense gradient, rows repeated in the batch
    summed first: Keras's Adam on the densified gradient, and what one
    device and N replicas agree on. Keras 3's own Adam squares each slice
    before repeated rows are summed, so on such a batch it differs
    (docs/performance.md, the speed flags)."""
    fused = _embedding_adam(optimizers.build_fused, densify=False)
    dense = _embedding_adam(optimizers.build, densify=True)
    for want, got in zip(dense, fused):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    keras_sparse = _embedding_adam(optimizers.build, densify=False)
    assert np.max(np.abs(keras_sparse[0] - fused[0])) > 1e-3  # the difference is real
