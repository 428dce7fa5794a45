"""One run, end to end: the library function behind `bin/train`.

The order is the point. Everything that can be wrong with the request is
checked before anything is built or written (names, devices, batch
divisibility, data files, `model_dir`), so a mistake costs one line and
leaves no directory behind::

    check names, devices, data, model_dir        # fails fast, writes nothing
    strategy = build(...)                        # logical CPUs made first
    with strategy.scope(): model, optimizer, global_step
    restore the latest checkpoint in model_dir   # "resuming from ckpt-N"
    distribute datasets (skipping the batches already trained on)
    Controller(...).train / .evaluate
    write metrics.json
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

import collectives
import inputs
import models
from engine import checkpointing, devices, optimizers, strategies
from engine.config import RunConfig
from engine.controller import Controller
from engine.errors import ConfigError
from engine.evaluator import Evaluator
from engine.summaries import SummaryWriter
from engine.task import LossFn
from engine.trainer import Trainer

logger = logging.getLogger("engine")

#: Builds the model(s) inside `strategy.scope()`: (input_shape, num_classes) → model.
ModelFn = Callable[[tuple, int], Any]


def _check_model_dir(path: str) -> None:
    """Refuses a `model_dir` that cannot be written, before anything is created."""
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"--model_dir={path} is a file; name a directory")
    existing = path
    while not os.path.exists(existing):
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing) or not os.access(existing, os.W_OK | os.X_OK):
        raise ConfigError(
            f"--model_dir={path} cannot be written ({existing} is not a writable directory); "
            "choose a directory you can write to"
        )


def _resolve_mode(config: RunConfig, has_eval: bool) -> str:
    mode = config.mode or ("train_and_evaluate" if has_eval else "train")
    if mode != "train" and not has_eval:
        raise ConfigError(
            f"--mode={mode} needs an eval split, and --dataset={config.dataset} has none; "
            "use --mode=train"
        )
    return mode


def _write_metrics(path: str, payload: dict) -> None:
    temporary = path + ".tmp"
    with open(temporary, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=True)
        f.write("\n")
    os.replace(temporary, path)


def run(
    config: RunConfig,
    *,
    loss_fn: Optional[LossFn] = None,
    model_fn: Optional[ModelFn] = None,
) -> dict:
    """Trains and/or evaluates as `config` says; returns what metrics.json holds.

    `loss_fn` and `model_fn` replace the default classification loss and the
    `--model` registry lookup, for custom steps (see `examples/`).

    Raises:
      ConfigError: the request cannot be carried out (nothing was written).
      KeyboardInterrupt: after saving a checkpoint at the step reached.
    """
    # --- Checks: nothing is built or written until they all pass. ---
    device_names = devices.parse_devices(config.devices)
    replicas = strategies.num_replicas(config.strategy, device_names)
    if config.global_batch_size % replicas:
        raise ConfigError(
            f"--global_batch_size={config.global_batch_size} does not divide by the "
            f"{replicas} replicas; use a multiple of {replicas}, e.g. "
            f"{max(replicas, config.global_batch_size // replicas * replicas)}"
        )
    # Logical CPU devices must exist before anything else touches TensorFlow.
    devices.prepare_devices(device_names)
    collective = collectives.create(
        config.collective,
        devices=device_names,
        num_packs=config.num_packs,
        pack_bytes=config.pack_bytes,
        gradient_dtype=config.gradient_dtype,
    )
    if model_fn is None:
        models.check(config.model)
    optimizers.check(config.optimizer)
    splits = inputs.load(config.dataset, data_dir=config.data_dir, seed=config.seed)
    mode = _resolve_mode(config, splits.eval is not None)
    _check_model_dir(config.model_dir)
    latest = tf.train.latest_checkpoint(config.model_dir) if os.path.isdir(config.model_dir) else None
    if mode == "evaluate" and not latest:
        raise ConfigError(
            f"--mode=evaluate found no checkpoint in --model_dir={config.model_dir}; "
            "train first or point --model_dir at a trained run"
        )

    # --- Build. ---
    strategy = strategies.build(config.strategy, device_names)
    logger.info(
        "%s over %d replica(s) [%s], collective %s, global batch %d (%d per replica)",
        config.strategy, strategy.num_replicas_in_sync, ",".join(d.lstrip("/") for d in device_names),
        collective.describe(), config.global_batch_size,
        config.global_batch_size // strategy.num_replicas_in_sync,
    )
    keras.utils.set_random_seed(config.seed)
    with strategy.scope():
        if model_fn is not None:
            model = model_fn(splits.input_shape, splits.num_classes)
        else:
            model = models.build(
                config.model, input_shape=splits.input_shape, num_classes=splits.num_classes
            )
        optimizer = optimizers.build(config.optimizer, config.learning_rate)
        global_step = tf.Variable(
            0, dtype=tf.int64, trainable=False, name="global_step",
            aggregation=tf.VariableAggregation.ONLY_FIRST_REPLICA,
        )
        # Slots exist before the restore, so it restores them at once.
        optimizer.build(model.trainable_variables)

    checkpoint, manager = checkpointing.create(
        model=model, optimizer=optimizer, global_step=global_step,
        directory=config.model_dir, max_to_keep=config.max_checkpoints,
    )
    restored = checkpointing.restore_latest(checkpoint, manager)
    start_step = int(global_step.numpy())
    if restored:
        logger.info("resuming from %s at step %d", restored, start_step)

    trainer = None
    if mode != "evaluate":
        trainer = Trainer(
            strategy=strategy, model=model, optimizer=optimizer, collective=collective,
            train_dataset=inputs.train_batches(
                splits.train, global_batch_size=config.global_batch_size,
                seed=config.seed, start_step=start_step,
            ),
            global_batch_size=config.global_batch_size, global_step=global_step, loss_fn=loss_fn,
        )
    evaluator = None
    if mode != "train":
        evaluator = Evaluator(
            strategy=strategy, model=model, loss_fn=loss_fn,
            eval_dataset=inputs.eval_batches(splits.eval, global_batch_size=config.global_batch_size),
        )

    # --- Run: only now does model_dir come into being. ---
    os.makedirs(config.model_dir, exist_ok=True)
    train_summaries = SummaryWriter(config.train_summary_dir)
    eval_summaries = SummaryWriter(config.eval_summary_dir)
    controller = Controller(
        global_step=global_step, trainer=trainer, evaluator=evaluator,
        steps_per_loop=config.steps_per_loop, checkpoint_manager=manager,
        checkpoint_interval=config.checkpoint_interval,
        summary_interval=config.summary_interval,
        train_summaries=train_summaries, eval_summaries=eval_summaries,
        global_batch_size=config.global_batch_size,
    )
    began = time.time()
    interrupted = False
    try:
        if mode == "evaluate":
            controller.evaluate(config.eval_steps)
        else:
            if start_step >= config.train_steps:
                logger.info("already at step %d (--train_steps=%d): nothing to train",
                            start_step, config.train_steps)
            controller.train(
                config.train_steps,
                eval_interval=(config.eval_interval or config.train_steps)
                if mode == "train_and_evaluate" else 0,
                eval_steps=config.eval_steps,
            )
    except KeyboardInterrupt:
        interrupted = True
        if trainer is not None:
            path = controller.save_checkpoint()
            logger.info("interrupted at step %d; saved %s; run the same command to resume",
                        controller.step, path)
        raise
    finally:
        train_summaries.close()
        eval_summaries.close()
        summary = {
            "step": controller.step,
            "start_step": start_step,
            "resumed_from": restored,
            "mode": mode,
            "interrupted": interrupted,
            "examples_per_second": round(controller.examples_per_second, 1),
            "num_replicas": strategy.num_replicas_in_sync,
            "collective": collective.describe(),
            "wall_seconds": round(time.time() - began, 2),
            "config": config.as_dict(),
        }
        summary.update({f"train/{k}": v for k, v in controller.last_train_metrics.items()})
        summary.update({f"eval/{k}": v for k, v in controller.last_eval_metrics.items()})
        _write_metrics(config.metrics_path, summary)
    return summary
