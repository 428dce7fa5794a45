"""bin/bench_train end to end on a tiny configuration: table, JSON, ratios.

No timing assertions: the numbers are the benchmark's business, not a test's.
"""

import json

import pytest

from helpers import run_bin


def test_bench_train_prints_a_table_and_writes_json(tmp_path):
    result = run_bin(
        "bench_train", "--devices=cpu:0,cpu:1", "--global_batch_size=32", "--steps=3",
        "--repetitions=2", "--rounds=2", "--steps_per_execution=3",
        "--variants=engine,fit_tuned,hand_loop,input,step", f"--output_dir={tmp_path}",
        timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    table = [line for line in result.stdout.splitlines() if line.startswith("| 2 |")]
    assert len(table) == 5, result.stdout
    assert "| mfu | of measured matmul |" in result.stdout
    assert "2 warm-up + 2 x 3 steps" in result.stdout
    with open(tmp_path / "bench_train_mlp_2dev.json") as f:
        written = json.load(f)
    assert written["num_devices"] == 2 and written["matmul_gflops"] > 0
    assert [row["variant"] for row in written["rows"]] == ["engine", "fit_tuned", "hand_loop",
                                                           "input", "step"]
    assert "[round 2/2] hand-written loop" in result.stdout  # rotated: engine is not first
    for row in written["rows"]:
        assert len(row["seconds"]) == 4 and row["low"] <= row["median"] <= row["high"]
        if row["variant"] == "input":  # no step: no mfu, no ratio to a loop
            assert row["mfu"] is None and row["peak_fraction"] is None
            assert written["ratios"]["input"] == {}
        else:
            assert 0 < row["peak_fraction"] and 0 < row["mfu"]
    # Which one bounds the run: the input row against the step row, said in one line.
    bound = written["bound"]
    rates = {row["variant"]: row["median"] for row in written["rows"]}
    assert (bound["input_rate"], bound["step_rate"]) == (rates["input"], rates["step"])
    assert bound["bound"] in ("input", "step", "neither")
    assert f"2 device(s): {bound['line']}" in result.stdout
    engine = written["rows"][0]
    assert written["ratios"]["engine"]["hand_loop"] == engine["median"] / written["rows"][2]["median"]
    # The engine's own count (engine.observe.step_flops): 784·256 + 256·256 + 256·10
    # multiply-adds, ×2 FLOPs, ×2 for the weight gradients, ×1 for the input
    # gradients of every layer but the first.
    assert written["train_flops_per_example"] >= 2 * (
        2 * 784 * 256 + 3 * (256 * 256 + 256 * 10))
    # mfu divides by the peak the engine uses (measured on CPUs, and said so).
    assert "matmul rate" in written["peaks"]["float32"]["source"]
    # The same quotient computed in another order: equal but for the last bits.
    assert engine["mfu"] == pytest.approx(engine["median"] * written["train_flops_per_example"]
                                          / written["peaks"]["float32"]["flops_per_second"],
                                          rel=1e-12)


def test_the_tiny_step_times_one_device_at_batch_8(tmp_path):
    result = run_bin(
        "bench_train", "--tiny_step", "--steps=2", "--repetitions=1", "--warmup=2",
        "--variants=engine,hand_loop", f"--output_dir={tmp_path}", timeout=240)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "tiny step: 1 device (cpu:0), global batch 8" in result.stdout
    with open(tmp_path / "bench_train_mlp_1dev.json") as f:
        written = json.load(f)
    assert written["config"]["global_batch_size"] == 8 and written["num_devices"] == 1
    assert [len(row["seconds"]) for row in written["rows"]] == [1, 1]

