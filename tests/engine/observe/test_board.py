"""TensorBoard after a kill and a resume: each train step once; HParams and the graph."""

import errno
import re

import pytest
import tensorflow as tf
from tensorboard.backend.event_processing import plugin_event_accumulator as accumulator

from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.run import run
from tfloop.engine.errors import RunFailure
from tfloop.engine.loop.summaries import SummaryWriter
from tfloop.engine.observe import board


class _Killed(Exception):
    pass


def _config(model_dir, **overrides):
    settings = dict(
        strategy="mirrored", devices="cpu:0,cpu:1", collective="reduce_to_one_device",
        model="mlp", dataset="synthetic", model_dir=str(model_dir), global_batch_size=32,
        train_steps=40, steps_per_loop=5, checkpoint_interval=10, summary_interval=5,
        eval_interval=10, mode="train_and_evaluate", eval_steps=2, export=False,
        optimizer="sgd", learning_rate=0.01, seed=5)
    settings.update(overrides)
    return RunConfig(**settings)


def _reader(directory):
    reader = accumulator.EventAccumulator(str(directory), size_guidance={accumulator.TENSORS: 0})
    reader.Reload()
    return reader


def test_after_a_kill_and_a_resume_tensorboard_sees_each_step_once(tmp_path):
    """The run dies after step 25's summaries (its last checkpoint: 20), as a
    kill -9 would leave it (every summary is flushed as written; here the
    process survives, killed by an exception from the loop's hook, to keep
    the test in-process); the resumed run writes 21..40 again. TensorBoard's
    reader (the plugin accumulator its server uses) sees each step once."""
    model_dir = tmp_path / "run"

    def die_after_25(step, metrics):
        if step == 25:
            raise _Killed

    with pytest.raises(_Killed):
        run(_config(model_dir), on_loop_end=die_after_25)
    run(_config(model_dir))
    train = _reader(model_dir / "summaries" / "train")
    assert [event.step for event in train.Tensors("loss")] == [5, 10, 15, 20, 25, 30, 35, 40]
    # The evaluation of the checkpoint's step (20) stays, once.
    evaluations = _reader(model_dir / "summaries" / "eval")
    assert [event.step for event in evaluations.Tensors("loss")] == [10, 20, 30, 40]
    # The train loop's graph, traced once per process.
    # (TF2 writes it as run metadata: the Graphs tab's "train_loop" tag.)
    assert "train_loop" in train.PluginTagToContent("graph_run_metadata_graph")
    # HParams: the flags at the root of summaries/, and the final metrics beside them.
    root = _reader(model_dir / "summaries")
    assert "_hparams_/session_start_info" in root.PluginTagToContent("hparams")
    # The killed run's final metrics (step 25) are orphans too.
    assert [event.step for event in root.Tensors("final/train/loss")] == [40]
    assert "final/eval/loss" in root.Tags()["tensors"]


# -- a full disk at start-up (issue 38 item 3) ----------------------------------------------

@pytest.mark.parametrize("error", [
    tf.errors.ResourceExhaustedError(None, None, "No space left on device"),
    OSError(errno.ENOSPC, "No space left on device"),
], ids=["tf", "os"])
def test_a_full_disk_at_the_first_summary_is_one_run_failure_line(tmp_path, monkeypatch, error):
    """The writer's creation at start-up (`board.mark_start`, the chief's first
    write) on a full disk was TensorFlow's traceback ending "a bug"; now one
    `RunFailure` line (exit 1) naming the folder and its free space."""
    def full(*args, **kwargs):
        raise error

    monkeypatch.setattr(tf.summary, "create_file_writer", full)
    logdir = tmp_path / "run" / "summaries" / "train"
    with pytest.raises(RunFailure) as failure:
        board.mark_start(SummaryWriter(str(logdir)), 0)
    message = str(failure.value)
    assert type(failure.value) is RunFailure and failure.value.exit_status == 1
    assert "\n" not in message
    assert message.startswith(f"could not write the TensorBoard summaries in {logdir} (No space "
                              "left on device); ")
    assert re.search(r"; [\d.]+ (bytes|KiB|MiB|GiB) free there: free some space and run the "
                     r"same command \(it resumes from the last checkpoint\)$", message), message
