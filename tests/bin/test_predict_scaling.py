"""bin/predict_scaling end to end: the table, the JSON and the plot from link
presets, from this machine's fitted sweep and one-device measurement, and a
mistake refused in one line. The model's formulas: tests/bench/test_scaling.py."""

import json

from helpers import run_bin


def test_presets_print_the_table_and_write_json_without_a_plot(tmp_path):
    result = run_bin(
        "predict_scaling", "--parameters=25.6e6", "--tensors=160", "--per_device_batch=256",
        "--step_ms=282", "--device_counts=1,8,64", "--gpus_per_host=8", "--nics_per_host=8",
        "--intra_link=nvlink3", "--inter_link=ib_hdr", "--noplot", f"--output_dir={tmp_path}",
        timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [line for line in result.stdout.splitlines() if line.startswith(("| 8 |", "| 64 |"))]
    assert len(rows) == 2, result.stdout
    assert "| 64 | 8 |" in rows[1] and "link presets nvlink3+8xib_hdr" in rows[1]
    assert "n/a" in rows[1]  # hierarchical copy and reduce to one device: one host only
    packed = [row for row in rows if "num_packs=1 (" in row]  # one pack: one all-reduce
    assert packed and all(" 1 all-reduce)" in row for row in packed), rows
    assert "the all-reduce does not overlap the backward pass" in result.stdout
    written = json.loads((tmp_path / "predict_scaling.json").read_text())
    assert [p["devices"] for p in written["predictions"]] == [1, 8, 64]
    assert sum(written["gradient_sizes"]) == 4 * 25_600_000
    assert written["predictions"][0]["efficiency"] == 1.0
    assert 0 < written["predictions"][2]["efficiency"] < 1
    assert not (tmp_path / "predict_scaling.png").exists()


def test_a_fitted_sweep_and_a_measured_step_give_the_plot(tmp_path):
    sizes = (4 << 10, 1 << 20, 16 << 20)
    sweep = [dict(size=s, collective=c, devices=2, correct=True, time_us=t, median_us=t)
             for c, scale in (("reduce_to_one_device", 1.0), ("ring", 3.0)) for s in sizes
             for t in [scale * (80 + s / 2e3)]]
    (tmp_path / "sweep.json").write_text(json.dumps(dict(sweep=sweep)))
    (tmp_path / "train.json").write_text(json.dumps(dict(
        num_devices=1, config=dict(global_batch_size=256),
        rows=[dict(variant="engine", median=40_000.0)])))
    result = run_bin(
        "predict_scaling", "--model=mlp", "--global_batch_size=256", "--device_kind=cpu",
        f"--bench_train_json={tmp_path / 'train.json'}", f"--sweep={tmp_path / 'sweep.json'}",
        "--collectives=ring,reduce_to_one_device", "--device_counts=1,2,4",
        "--gpus_per_host=4", f"--output_dir={tmp_path / 'out'}", timeout=180)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "fitted reduce_to_one_device on 2 devices: latency 80.0 us" in result.stdout
    two = next(line for line in result.stdout.splitlines() if line.startswith("| 2 |"))
    assert "reduce_to_one_device" in two and "fitted on 2 devices" in two
    four = next(line for line in result.stdout.splitlines() if line.startswith("| 4 |"))
    assert "links fitted on 2 devices" in four
    assert "measured: train.json" in result.stdout
    png = (tmp_path / "out" / "predict_scaling.png").read_bytes()
    assert png.startswith(b"\x89PNG")
    written = json.loads((tmp_path / "out" / "predict_scaling.json").read_text())
    assert written["gradient_sizes"] == [4 * 784 * 256, 4 * 256, 4 * 256 * 256, 4 * 256,
                                         4 * 256 * 10, 4 * 10]


def test_a_mistake_is_one_line_and_exit_2(tmp_path):
    result = run_bin("predict_scaling", "--model=mlp", "--parameters=1e6",
                     "--global_batch_size=64", "--step_ms=5", f"--output_dir={tmp_path}",
                     timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert "exactly one of --model" in lines[-1] and "Traceback" not in result.stderr
    assert not list(tmp_path.iterdir())
