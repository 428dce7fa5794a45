"""`bench.no_exchange`: the collective that moves nothing, for timing the step without the exchange."""

import tensorflow as tf

from helpers import replica_values
from tfloop import collectives
from tfloop.bench import no_exchange


def test_each_replica_keeps_its_own_gradient_on_its_own_device(cpu_devices):
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    values = replica_values(strategy)
    with strategy.scope():
        variables = [tf.Variable(tf.zeros([3, 2])), tf.Variable(tf.zeros([5]))]
        collective = collectives.create(no_exchange.NAME, devices=cpu_devices[:2])
        results = collective.batch_all_reduce(values, variables)
    for result, fill in zip(results, (1.0, 10.0)):
        parts = collectives.components(result)
        assert [p.device for p in parts] == [v.device for v in collectives.components(
            values[0])]
        # replica r holds (r + 1) x fill: its own, not the sum 3 x fill
        assert [float(tf.reduce_max(p)) for p in parts] == [fill, 2 * fill]


def test_a_run_trains_with_it(tmp_path):
    """bin/bench_train runs the engine with it: the run ends, nothing exchanged."""
    from tfloop.engine import RunConfig, run

    result = run(RunConfig(model_dir=str(tmp_path / "run"), devices="cpu:0,cpu:1",
                           collective=no_exchange.NAME, train_steps=4, steps_per_loop=2,
                           global_batch_size=16, export=False, mode="train"))
    assert result["step"] == 4
