"""`engine.run_dir.run_record`: metrics.json's final record from a plain
`Outcome` (what the loops did), never from a controller or trainer."""

import types

from tfloop.engine.run_dir import run_record
from tfloop.engine.runtime.hardware import Peak


def test_mfu_is_reported_from_the_outcomes_flops_speed_and_peak():
    record = run_record.utilization(run_record.Outcome(
        step=10, steps_per_second=5.0, flops_per_step=2e6, peak=Peak(1e9, "measured")))
    assert record["mfu"] == 0.01 and record["flops_per_step"] == 2e6
    assert (record["peak_flops_per_second"], record["peak_source"]) == (1e9, "measured")
    assert record["peak_memory"]["host_peak_mb"] > 0


def test_no_mfu_without_counted_flops_or_a_timed_loop():
    for outcome in (run_record.Outcome(step=10, steps_per_second=5.0, peak=Peak(1e9, "x")),
                    run_record.Outcome(step=10, flops_per_step=2e6, peak=Peak(1e9, "x"))):
        assert set(run_record.utilization(outcome)) == {"peak_memory"}


def test_an_interrupted_run_is_recorded_at_its_last_checkpoint():
    plan = types.SimpleNamespace(
        mode="train", collective=types.SimpleNamespace(describe=lambda: "ring"),
        config=types.SimpleNamespace(global_batch_size=8, ema_decay=0.0,
                                     as_dict=lambda: {"train_steps": 10}))
    outcome = run_record.Outcome(step=6, steps_per_second=2.0, train_metrics={"loss": 0.5})
    summary = run_record.summarize(
        plan, outcome, num_replicas=2, restored=None, start_step=0, status="interrupted",
        saved_step=4, checkpoint="ckpt-4", wall_seconds=1.234)
    assert (summary["step"], summary["unsaved_step"], summary["checkpoint"]) == (4, 6, "ckpt-4")
    assert summary["interrupted"] and summary["examples_per_second"] == 16.0
    assert summary["train/loss"] == 0.5 and summary["stopped_early"] is None
    assert summary["export"] is None and summary["wall_seconds"] == 1.23
