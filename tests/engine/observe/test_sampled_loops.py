"""Per-step stamps only in sampled loops (issue 30), proven on GPU device names without a GPU.

The train loop is traced (never run) under a MirroredStrategy over
"/gpu:0", "/gpu:1", which TensorFlow accepts without placing anything (as
tests/collectives/test_gpu_paths.py traces the collectives). An unsampled
loop must hold no `Timestamp`, no `held_until` identity, and no control
dependency from the step's tensors (anything computed from the weights:
forward, backward, all-reduce, update) to a host op: such an edge makes the
host wait for the device every step. The sampled loop holds all three, and
on the CPU it still gives the breakdown.
"""

import dataclasses
import logging
import types

import keras
import pytest
import tensorflow as tf

from tfloop import collectives
from tfloop.engine.loop.actions import LoopEnd
from tfloop.engine.loop.contracts import LoopClock
from tfloop.engine.loop.settings import Step
from tfloop.engine.loop.trainer import Trainer
from tfloop.engine.observe import clock as clock_lib
from tfloop.engine.observe import step_time
from tfloop.engine.recipe import schedules

GPUS = ["/gpu:0", "/gpu:1"]
#: Ops that run on the host whatever the machine: the clock, the input
#: iterators, Python. (Device strings are no test here: without a GPU the
#: variables, and what is colocated with them, were created on the CPU.)
HOST_ONLY = {"Timestamp", "IteratorGetNext", "IteratorGetNextAsOptional",
             "MultiDeviceIteratorGetNextFromShard", "EagerPyFunc", "PyFunc", "PrintV2"}


def _trainer(devices, clock=None, optimizer=lambda: keras.optimizers.SGD(0.1), **options):
    strategy = tf.distribute.MirroredStrategy(devices)
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                                  keras.layers.Dense(4)])
        step = tf.Variable(0, dtype=tf.int64,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    dataset = tf.data.Dataset.from_tensors(
        (tf.zeros([8, 8]), tf.zeros([8], tf.int64))).repeat()
    return Trainer(strategy=strategy, model=model, global_step=step,
                   collective=collectives.create("ring", devices=devices),
                   train_dataset=dataset, global_batch_size=8,
                   optimizer=optimizer(), clock=clock, **options)


#: The tests that read (trace, never train) the module's one GPU trainer with a
#: sampled clock: one xdist group, so that one worker builds and traces it once.
SHARED = pytest.mark.xdist_group("sampled_loops_gpu_trainer")


@pytest.fixture(scope="module")
def gpu_trainer():
    """`_trainer(GPUS, clock_lib.SampledClock())`, built once: its loop is
    only traced (its concrete functions for `sampled` False and True, which
    `tf.function` keeps), its model only cloned."""
    return _trainer(GPUS, clock_lib.SampledClock())


def _functions(trainer, sampled: bool):
    """Every function body of the traced loop (the while loop's body among
    them), as {name: [NodeDef]}, from its public GraphDef."""
    graph_def = trainer._loop.get_concrete_function(
        trainer._iterator, tf.constant(2), sampled).graph.as_graph_def()
    bodies = {"<top>": list(graph_def.node)}
    bodies.update({f.signature.name: list(f.node_def) for f in graph_def.library.function})
    return bodies


def _is_host(node) -> bool:
    return node.op in HOST_ONLY


def _step_nodes(nodes) -> set:
    """The nodes computed on a GPU and everything computed from them (data
    edges): the step's tensors."""
    consumers = {}
    for node in nodes:
        for name in node.input:
            if not name.startswith("^"):
                consumers.setdefault(name.split(":")[0], []).append(node.name)
    by_name = {node.name: node for node in nodes}
    frontier = [n.name for n in nodes if "GPU" in n.device.upper()]
    seen = set(frontier)
    while frontier:
        for consumer in consumers.get(frontier.pop(), ()):
            if consumer not in seen:
                seen.add(consumer)
                frontier.append(consumer)
    return {name for name in seen if name in by_name}


def _findings(trainer, sampled: bool) -> dict:
    found = {"timestamps": 0, "held_until": 0, "host_waits": []}
    for function, nodes in _functions(trainer, sampled).items():
        step = _step_nodes(nodes)
        found["timestamps"] += sum(n.op == "Timestamp" for n in nodes)
        found["held_until"] += sum("held_until" in n.name for n in nodes)
        for node in nodes:
            waits = [name[1:] for name in node.input if name.startswith("^") and name[1:] in step]
            if waits and _is_host(node):
                found["host_waits"].append(f"{function}: {node.op} {node.name} after {waits[:3]}")
    return found


@SHARED
def test_an_unsampled_gpu_loop_holds_no_stamp_and_no_host_wait(gpu_trainer):
    trainer = gpu_trainer
    quiet = _findings(trainer, sampled=False)
    assert quiet == {"timestamps": 0, "held_until": 0, "host_waits": []}, quiet
    # The same trainer's sampled loop has them: the check sees what it looks for.
    stamped = _findings(trainer, sampled=True)
    assert stamped["timestamps"] >= 4 and stamped["held_until"] >= 2, stamped
    assert stamped["host_waits"], stamped
    # Two traced loop functions at most, whatever the number of loops.
    trainer._loop.get_concrete_function(trainer._iterator, tf.constant(5), False)
    assert trainer._loop.experimental_get_tracing_count() == 2


def _loop_graph(trainer, sampled: bool):
    return trainer._loop.get_concrete_function(
        trainer._iterator, tf.constant(2), sampled).graph.as_graph_def()


def _condition_ops(graph_def) -> list:
    """The op types of the one `tf.range` loop's condition."""
    (loop,) = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    (cond,) = [f for f in graph_def.library.function
               if f.signature.name == loop.attr["cond"].func.name]
    return sorted(node.op for node in cond.node_def)


def _carried(graph_def) -> list:
    """The dtypes the loop carries from step to step, resources left out."""
    (loop,) = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    return [tf.as_dtype(t).name for t in loop.attr["T"].list.type if t != tf.resource.as_datatype_enum]


#: The loop's condition where a signal can end it after any step: `i < num_steps`
#: and (`i == 0` or not the stop flag), every op of it on the host CPU.
STOPPABLE = ["Const", "Equal", "Identity", "Identity", "Less", "LogicalAnd", "LogicalNot",
             "LogicalOr", "NoOp", "ReadVariableOp"]


def _condition_devices(graph_def) -> set:
    (loop,) = [n for n in graph_def.node if n.op in ("While", "StatelessWhile")]
    (cond,) = [f for f in graph_def.library.function
               if f.signature.name == loop.attr["cond"].func.name]
    return {node.device for node in cond.node_def if node.op not in ("Less", "Identity", "NoOp")}


@SHARED
def test_the_loop_condition_reads_the_step_counter_and_the_host_stop_flag_alone(gpu_trainer):
    """The loop's condition is a hand loop's, `i < num_steps` on host integers,
    plus the stop flag a signal sets (`Trainer.request_stop`), a variable in
    host memory; the loop carries the counters and the running sums, nothing
    else. A `break` anywhere in the loop's body (it was there for `max_skips`) made
    autograph carry a flag and test it in a `tf.cond` every step, and the
    loop carried the skip counts even where nothing skips: on an H200 the
    Trainer with its per-step bookkeeping removed still ran at 0.75x the hand
    loop, the host waiting for the flag each step. Only `max_skips`, which
    stops on a count the device computes, keeps a condition on it."""
    trainer = gpu_trainer
    for sampled in (False, True):
        graph_def = _loop_graph(trainer, sampled)
        assert _condition_ops(graph_def) == STOPPABLE, sampled
        devices = _condition_devices(graph_def)
        assert len(devices) == 1 and devices.pop().endswith("CPU:0"), sampled
    # A cluster's workers stop at a loop's end: their condition is the counter alone.
    in_a_cluster = _trainer(GPUS, clock_lib.SampledClock(),
                            stops_at_any_step=False)
    assert _condition_ops(_loop_graph(in_a_cluster, False)) == ["Identity", "Less"]
    # One running-sum vector per replica; no flag (bool), no skip count (int64).
    carried = _carried(_loop_graph(trainer, False))
    assert carried.count("float32") == len(GPUS) and not {"bool", "int64"} & set(carried), carried

    skipping = _trainer(GPUS, clock_lib.SampledClock(),
                        options=Step(nan_policy="skip_step", nan_max_skips=3))
    condition = _condition_ops(_loop_graph(skipping, False))
    assert condition != STOPPABLE and "LogicalNot" in condition, condition  # it sees a break
    assert "int64" in _carried(_loop_graph(skipping, False))  # and the skip counts
    # mixed_float16's optimizer skips steps and the loop counts them, without a stop.
    scaled = _trainer(GPUS, clock_lib.SampledClock(), optimizer=lambda: (
        keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))))
    assert _condition_ops(_loop_graph(scaled, False)) == STOPPABLE


#: Ops that write a variable.
WRITES = ("AssignVariableOp", "AssignAddVariableOp", "AssignSubVariableOp")


def _loop_body(graph_def) -> list:
    """The nodes of the one `tf.range` loop's body (a loop's step)."""
    bodies = [f for f in graph_def.library.function if f.signature.name.startswith("while_body")]
    assert len(bodies) == 1, [f.signature.name for f in bodies]
    return list(bodies[0].node_def)


def _writes(nodes) -> int:
    return sum(n.op in WRITES or n.op.startswith("ResourceApply") for n in nodes)


def _hand_loop_body(trainer) -> list:
    """The body of a hand-written loop over the same model and optimizer
    kind (forward, backward, Keras's apply: the optimizer's own writes)."""
    strategy = tf.distribute.MirroredStrategy(
        GPUS, cross_device_ops=tf.distribute.ReductionToOneDevice())
    with strategy.scope():
        model = keras.models.clone_model(trainer.model)
        optimizer = keras.optimizers.SGD(0.1)
    iterator = iter(strategy.experimental_distribute_dataset(trainer.train_dataset))

    def step(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(
                y, model(x, training=True), from_logits=True))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))

    @tf.function
    def loop(iterator, steps):
        for _ in tf.range(steps):
            strategy.run(step, args=(next(iterator),))

    return _loop_body(loop.get_concrete_function(iterator, tf.constant(2)).graph.as_graph_def())


def _engine_loop_body(trainer, sampled=False) -> list:
    return _loop_body(trainer._loop.get_concrete_function(
        trainer._iterator, tf.constant(2), sampled).graph.as_graph_def())


@SHARED
def test_an_unsampled_gpu_step_writes_no_variable_beyond_the_update_and_its_counts(gpu_trainer):
    """Issue 30's per-step cost: the loop's running sums are loop-carried
    tensors (written once, after the loop) and a constant learning rate is
    set once per loop, so a step writes only what the optimizer's update
    writes, the global step, and the hang dump's two marks (its batch
    arrived, its all-reduce started)."""
    trainer = gpu_trainer
    engine, hand = _engine_loop_body(trainer), _hand_loop_body(trainer)
    assert _writes(hand) >= 2 * len(trainer.model.trainable_variables)  # it sees the update
    # The global step: one write per device's copy (a mirrored variable); the marks: two.
    assert _writes(engine) == _writes(hand) + len(GPUS) + 2, sorted(
        n.name for n in engine if n.op in WRITES)


def _scheduled_trainer(schedule, devices=GPUS):
    trainer = _trainer(devices)
    if schedule is not None:
        trainer.objectives = [dataclasses.replace(o, learning_rate=schedule)
                              for o in trainer.objectives]
        trainer._loop = tf.function(trainer._train_loop)
    return trainer


def test_a_constant_learning_rate_adds_no_op_to_a_step_and_a_schedule_does(cpu_devices):
    plain = _engine_loop_body(_scheduled_trainer(None))
    constant = _scheduled_trainer(schedules.LearningRate(peak=0.1))
    assert sorted(n.op for n in _engine_loop_body(constant)) == sorted(n.op for n in plain)
    cosine = _engine_loop_body(_scheduled_trainer(
        schedules.LearningRate(schedule="cosine", peak=0.1, total_steps=10)))
    assert _writes(cosine) == _writes(plain) + 1 and "Cos" in {n.op for n in cosine}
    # The constant rate is set nonetheless: once per loop, before its steps
    # (a resumed run whose --learning_rate changed trains on the new one).
    running = _scheduled_trainer(schedules.LearningRate(peak=0.1), cpu_devices[:2])
    running.objectives[0].optimizer.learning_rate = 0.5
    running.train(1)
    assert float(running.objectives[0].optimizer.learning_rate) == pytest.approx(0.1)


def test_the_do_nothing_clock_never_samples():
    clock = LoopClock()
    assert clock.begin(0) is False
    assert clock.end(None, start=0, steps=1, stamped={}) == {}


def test_the_schedule_samples_the_second_loop_then_one_in_n_and_on_request():
    assert [n for n in range(1, 25) if clock_lib.SampledClock().scheduled(n)] == [2, 12, 22]
    clock = clock_lib.SampledClock(sample_every=3, first_samples=3)  # a cluster's
    assert [n for n in range(1, 12) if clock.scheduled(n)] == [2, 3, 4, 7, 10]
    fake = types.SimpleNamespace()  # no trainer to probe: no peak, no warm
    sampled = []
    for loop in range(1, 8):
        if loop == 5:
            clock.ask()
        sampled.append(clock.begin(0))
        clock.end(fake, start=0, steps=1, stamped={})
    assert sampled == [False, True, True, True, True, False, True]
    untimed = clock_lib.SampledClock(timed=False)
    assert not any(untimed.begin(0) or untimed.end(fake, start=0, steps=1, stamped={})
                   for _ in range(4))


def test_the_sampled_loop_is_warmed_before_the_first_sampled_loop_and_only_if_one_comes(
        monkeypatch):
    """Tracing the sampled loop function costs seconds for a model with many
    ops: a run of one loop never samples and never pays it; a longer run pays
    it once, before the second loop's timer starts."""
    events = []
    trainer = types.SimpleNamespace(warm=lambda with_stamps: events.append(("warm", with_stamps)))
    clock = clock_lib.SampledClock()
    clock.begin(0)
    clock.end(trainer, start=0, steps=1, stamped={})
    assert events == []  # one loop: nothing traced for a loop that never comes
    with monkeypatch.context() as patch:
        patch.setattr(clock_lib.time, "perf_counter", lambda: events.append("timer") or 0.0)
        assert clock.begin(1) is True
    assert events == [("warm", True), "timer"]  # warmed, then the loop's timer starts
    clock.end(trainer, start=1, steps=1, stamped={})
    for loop in range(3, 30):
        clock.begin(loop)
        clock.end(trainer, start=loop, steps=1, stamped={})
    assert events.count(("warm", True)) == 1 and len(events) == 2
    untimed = clock_lib.SampledClock(timed=False)
    for loop in range(3):
        untimed.begin(loop)
        untimed.end(trainer, start=loop, steps=1, stamped={})
    assert len(events) == 2  # an untimed clock never samples, never warms


def test_the_peak_and_the_flops_are_had_once_when_the_first_mfu_is_due(monkeypatch):
    """The matmul probe (about half a second on CPUs) and the FLOP count (a
    second trace of the replica's step: seconds for a big model) serve `mfu`
    alone, which the first loop never reports: a run's first step does not
    wait for them, a run of one loop never pays for them, a longer one pays
    once, at the end of loop 2, after its timer."""
    events = []
    peak = clock_lib.hardware.Peak(1e9, "probe")
    monkeypatch.setattr(clock_lib.step_flops, "of_trainer",
                        lambda trainer: events.append(("count", trainer)) or 1e6)
    monkeypatch.setattr(clock_lib.time, "perf_counter", lambda: events.append("timer") or 0.0)
    trainer = object()
    clock = clock_lib.SampledClock(peak_of=lambda: events.append("peak") or peak)
    clock.begin(0)
    assert clock.end(trainer, start=0, steps=1, stamped={}) == {}
    assert events == ["timer", "timer"] and (clock.peak, clock.flops) == (None, None)
    events.clear()
    clock.begin(1)
    clock.end(trainer, start=1, steps=1, stamped={})
    # The loop's timer stopped, then the peak is measured and the step counted.
    assert events == ["timer", "timer", "peak", ("count", trainer)]
    assert (clock.peak, clock.flops) == (peak, 1e6)
    events.clear()
    for loop in range(2, 5):
        clock.begin(loop)
        clock.end(trainer, start=loop, steps=1, stamped={})
    assert "peak" not in events and not [e for e in events if e[0] == "count"]
    unknown = clock_lib.SampledClock(peak_of=lambda: None)  # no peak: nothing to count
    for loop in range(3):
        unknown.begin(loop)
        unknown.end(trainer, start=loop, steps=1, stamped={})
    assert not [e for e in events if e[0] == "count"] and unknown.flops is None


def test_the_runs_clock_samples_every_loop_only_where_the_workers_are_compared(monkeypatch):
    """`for_run`, the clock the assembly builds and hands to the trainer: the
    peak rate of the strategy's devices in the run's precision (measured
    when the first `mfu` is due, not when the clock is built), and every
    loop sampled where the straggler table compares workers."""
    asked = []
    peak = clock_lib.hardware.Peak(1e9, "probe")
    monkeypatch.setattr(clock_lib.hardware, "peak",
                        lambda devices, precision: asked.append((devices, precision)) or peak)
    monkeypatch.setattr(clock_lib.step_flops, "of_trainer", lambda trainer: None)
    strategy = tf.distribute.get_strategy()
    compared = clock_lib.for_run(strategy, precision="mixed_bfloat16", compares_every_loop=True)
    alone = clock_lib.for_run(strategy, precision="float32", compares_every_loop=False)
    assert (compared.sample_every, alone.sample_every) == (1, clock_lib.SAMPLE_EVERY)
    assert (compared.peak, compared.timed) == (None, step_time.timestamps_allowed())
    assert asked == []
    for clock in (compared, alone):
        for loop in range(2):
            clock.begin(loop)
            clock.end(None, start=loop, steps=1, stamped={})
    assert compared.peak is peak and alone.peak is peak
    devices = clock_lib.hardware.local_devices(strategy)
    assert asked == [(devices, "mixed_bfloat16"), (devices, "float32")]
    # A short run on CPUs stamps every loop; not on GPUs, nor in a cluster (whose
    # workers must run the same loop functions), nor while the benchmark times loops.
    assert alone.short_runs_stamped and alone.target_step is None
    assert clock_lib.for_run(strategy, precision="float32", compares_every_loop=False,
                             target_step=600).target_step == 600
    assert not clock_lib.for_run(strategy, precision="float32", compares_every_loop=False,
                                 in_cluster=True).short_runs_stamped
    on_gpus = clock_lib.for_run(tf.distribute.MirroredStrategy(GPUS), precision="float32",
                                compares_every_loop=False)
    assert not on_gpus.short_runs_stamped
    monkeypatch.setattr(clock_lib, "SHORT_RUNS_STAMPED", False)
    assert not clock_lib.for_run(strategy, precision="float32",
                                 compares_every_loop=False).short_runs_stamped


def test_a_sampled_cpu_loop_gives_the_breakdown(cpu_devices, caplog):
    clock = clock_lib.SampledClock(first_samples=2)
    trainer = _trainer(cpu_devices[:2], clock)
    report = step_time.Report(clock=clock, writer=None, interval=0)
    report.train_begin(0)
    try:
        with caplog.at_level(logging.INFO, logger="tfloop.engine.observe.step_time"):
            for loop in range(3):
                start = loop * 4
                trainer.train(4)
                report(LoopEnd(start=start, step=start + 4, target=12, num_steps=4,
                               seconds=clock.last.seconds, metrics={}))
                assert clock.last.sampled == (loop >= 1), loop
    finally:
        report.close()
    assert trainer._loop.experimental_get_tracing_count() == 2
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step time")]
    assert len(said) == 1 and said[0].startswith("step time, steps 5-8: "), said
    sample = report.sample
    assert sample.stamped > 0 and sample.input >= 0 and sample.all_reduce > 0
    assert sum(sample.shares().values()) == pytest.approx(1.0)


def _run_loops(trainer, clock, report, loops, steps=4):
    """`loops` loops of `steps` steps, each reported; whether each was sampled."""
    sampled = []
    for _ in range(loops):
        start = int(trainer.global_step.numpy())
        trainer.train(steps)
        report(LoopEnd(start=start, step=start + steps, target=10**6, num_steps=steps,
                       seconds=clock.last.seconds, metrics={}))
        sampled.append(clock.last.sampled)
    return sampled


def test_on_cpus_a_short_run_stamps_every_loop_and_reads_only_the_sampled_ones(
        cpu_devices, caplog):
    """Where the replicas are CPUs a stamp makes no host wait. A run whose
    rest, at loop 2's rate, is shorter than its first loop (which traced and
    compiled) keeps the stamps in every loop, from one loop function, and the
    schedule still decides which are read: the same line, after loop 2 only,
    as with two functions."""
    clock = clock_lib.SampledClock(short_runs_stamped=True, target_step=20)
    trainer = _trainer(cpu_devices[:2], clock)
    report = step_time.Report(clock=clock, writer=None, interval=0)
    report.train_begin(0)
    try:
        with caplog.at_level(logging.INFO, logger="tfloop.engine.observe.step_time"):
            assert _run_loops(trainer, clock, report, 4) == [False, True, False, False]
            clock.ask()  # a SIGUSR1: the next loop is sampled, from the same function
            assert _run_loops(trainer, clock, report, 1) == [True]
    finally:
        report.close()
    assert clock.last.asked and not clock.last.scheduled
    assert trainer._loop.experimental_get_tracing_count() == 1
    said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("step time")]
    assert len(said) == 2 and said[0].startswith("step time, steps 5-8: "), said
    assert said[1].startswith("step time, steps 17-20: "), said
    sample = report.sample
    assert sample.stamped > 0 and sample.input >= 0 and sample.all_reduce > 0
    assert sum(sample.shares().values()) == pytest.approx(1.0)


@pytest.mark.parametrize("target_step", [10**6, None])
def test_on_cpus_a_long_run_traces_the_unstamped_loop_after_loop_2(
        cpu_devices, monkeypatch, target_step):
    """A run whose rest takes longer than its first loop (or of unknown
    length) traces the unstamped function once, at the end of loop 2, after
    that loop's timer: from loop 3 on the unsampled loops run it, the
    sampled loops the stamped one, as on GPUs."""
    clock = clock_lib.SampledClock(short_runs_stamped=True, target_step=target_step)
    trainer = _trainer(cpu_devices[:2], clock)
    report = step_time.Report(clock=clock, writer=None, interval=0)
    seconds = iter(range(0, 10**6, 5))  # every loop takes 5 s by the clock
    events = []
    warm = trainer.warm
    monkeypatch.setattr(trainer, "warm", lambda with_stamps: (
        events.append(("warm", with_stamps, int(trainer.global_step.numpy()))),
        warm(with_stamps)))
    monkeypatch.setattr(clock_lib, "time", types.SimpleNamespace(  # the clock's alone
        perf_counter=lambda: float(next(seconds))))
    traced = []
    monkeypatch.setattr(clock, "stamps", lambda with_stamps: (
        traced.append(with_stamps), clock_lib.SampledClock.stamps(clock, with_stamps))[1])
    assert _run_loops(trainer, clock, report, 13, steps=1) == (
        [False, True] + [False] * 9 + [True, False])
    assert events == [("warm", False, 2)]  # once, after loop 2 (step 2)
    assert traced == [True, False] and trainer._loop.experimental_get_tracing_count() == 2
    assert report.sample.start == 11 and report.sample.scheduled


def test_synthetic_on_device_trains_every_step_on_one_batch_taken_once(cpu_devices):
    """The dataset holds one batch and no more: a trainer that took a batch
    per step would run out at the second; this one takes it once."""
    strategy = tf.distribute.MirroredStrategy(cpu_devices[:2])
    with strategy.scope():
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(4)])
        step = tf.Variable(0, dtype=tf.int64,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    one_batch = tf.data.Dataset.from_tensors(
        (tf.random.stateless_normal([8, 8], seed=[1, 2]), tf.zeros([8], tf.int64)))
    trainer = Trainer(strategy=strategy, model=model, global_step=step,
                      collective=collectives.create("ring", devices=cpu_devices[:2]),
                      train_dataset=one_batch, global_batch_size=8,
                      optimizer=keras.optimizers.SGD(0.1),
                      options=Step(synthetic_on_device=True))
    losses = [trainer.train(3)["loss"] for _ in range(2)]
    assert int(step.numpy()) == 6
    assert losses[1] < losses[0]  # the same batch, learned
