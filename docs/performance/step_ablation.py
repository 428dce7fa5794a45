"""Where the engine's per-step cost goes: a diagnosis, not a benchmark the docs rely on alone.

bin/bench_train's hand loop against the engine's Trainer on the same model,
data, strategy and Keras (unfused) Adam, then the Trainer with one piece of
its per-step bookkeeping removed at a time (by overriding its private
methods: it breaks when they move), then with the fused Adam. Median of 5
loops of 100 steps after 2 warm-up ones, as examples/s and ratios to the
hand loop (the mean of its two runs, first and last).

    ./dev python docs/performance/step_ablation.py /gpu:0 256 cnn   # device, global batch, model

Run on one H200 before the loop's condition was fixed (docs/performance.md,
"The fused update by default"): without any of the four pieces the Trainer
was still 0.75x the hand loop, which is how the condition was found.
"""
import statistics
import sys
import time

import tensorflow as tf

from tfloop import collectives
from tfloop.bench import training as B
from tfloop.engine.loop import trainer as T
from tfloop.engine.recipe import keras_bridge, optimizers
from tfloop.engine.task.losses import classification_loss

DEV = sys.argv[1] if len(sys.argv) > 1 else "/gpu:0"
BATCH = int(sys.argv[2]) if len(sys.argv) > 2 else 256
MODEL = sys.argv[3] if len(sys.argv) > 3 else "cnn"
STEPS, REPS, WARM = 100, 5, 2
config = B.TrainBenchConfig(model=MODEL, devices=(DEV,), global_batch_size=BATCH, steps=STEPS,
                            repetitions=REPS, warmup=WARM)


def loss_fn(model, batch, *, training):
    images, labels = batch
    return classification_loss(model, (B._to_float(images), labels), training=training)


class Lean(T.Trainer):
    """The Trainer with pieces removed (names in `off`)."""
    off = frozenset()

    def _norm_and_clip(self, optimizer, reduced):
        if "grad_norm" in self.off:
            return tf.constant(0.0), reduced
        return super()._norm_and_clip(optimizer, reduced)

    def _step(self, batch, totals, stamps, state):
        if "count_deps" not in self.off:
            return super()._step(batch, totals, stamps, state)
        totals = list(totals)
        for index, objective in enumerate(self.objectives):
            _, _, totals[index] = self._run_objective(index, objective, batch, totals[index], stamps)
        self.global_step.assign_add(1)
        return None, totals, state


def time_trainer(off=(), fused=False):
    splits, dataset = B._train_dataset(config, image_dtype="uint8")
    strategy = B.baseline_strategy(config)
    with strategy.scope():
        model, _ = B._build(config, splits)
        optimizer = (optimizers.build_fused if fused else optimizers.build)("adam", 1e-3)
        step = tf.Variable(0, dtype=tf.int64, trainable=False,
                           aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA)
    keras_bridge.disable_implicit_gradient_reduction(optimizer)
    cls = type("LeanX", (Lean,), {"off": frozenset(off)})
    trainer = cls(strategy=strategy, model=model, collective=collectives.create("auto", devices=[DEV]),
                  train_dataset=dataset, global_batch_size=BATCH, global_step=step,
                  optimizer=optimizer, loss_fn=loss_fn)
    if "phase" in off:
        trainer.step_phase.next = lambda iterator: next(iterator)
    if "sums" in off:
        for sums in trainer._sums:
            sums.step_totals = lambda count, values: 0.0  # totals + 0: no sums computed
    seconds = []
    for rep in range(REPS + WARM):
        began = time.perf_counter()
        trainer.train(STEPS)
        if rep >= WARM:
            seconds.append(time.perf_counter() - began)
    return seconds


rows = {}


def row(name, seconds):
    rows[name] = BATCH * STEPS / statistics.median(seconds)
    print(f"{name:44s} {rows[name]:>10,.0f} ex/s  ({BATCH * STEPS / max(seconds):,.0f}-{BATCH * STEPS / min(seconds):,.0f})", flush=True)

row("hand loop (Keras Adam)", B.time_hand_loop(config))
row("trainer (Keras Adam)", time_trainer())
for off in (["phase"], ["grad_norm"], ["sums"], ["count_deps"], ["phase", "grad_norm", "sums", "count_deps"]):
    row("trainer without " + "+".join(off), time_trainer(off))
row("trainer, fused Adam", time_trainer(fused=True))
row("hand loop again", B.time_hand_loop(config))
base = (rows["hand loop (Keras Adam)"] + rows["hand loop again"]) / 2
print("ratios to the hand loop:", {k: round(v / base, 3) for k, v in rows.items()})
