"""tfloop.bench.report: tables and files read back (no timing involved)."""

import json

from tfloop.bench import report


def _train_result(num_devices, median):
    return {
        "config": {"model": "mlp", "global_batch_size": 32, "optimizer": "adam",
                   "collective": "auto", "devices": [f"/cpu:{i}" for i in range(num_devices)]},
        "machine": "cpu, 2 cores, intra-op threads 1",
        "num_devices": num_devices, "matmul_gflops": 10.0,
        "rows": [{"variant": "engine", "description": "engine (steps_per_loop=3)",
                  "median": median, "low": median - 1, "high": median + 1,
                  "peak_fraction": 0.25}],
        "ratios": {"engine": {}},
    }


def test_training_table_and_sweep_files(tmp_path):
    results = [_train_result(1, 1000.0), _train_result(2, 1800.0)]
    table = report.training_table(results)
    assert "| 2 | engine (steps_per_loop=3) | 1,800 | 1,799 – 1,801 | – | – | – | 25.0% |" in table
    assert "2 device(s): float32 matmul rate 10.0 GFLOP/s, intra-op threads 1" in table
    json_path, png_path = report.write_training_sweep(results, str(tmp_path / "out"))
    assert json.loads(open(json_path).read()) == results
    assert open(png_path, "rb").read()[:4] == b"\x89PNG"


def test_write_csv_and_json(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Row:
        size: int
        ok: bool

    path = report.write_csv(str(tmp_path / "rows.csv"), [Row(1, True), Row(2, False)])
    assert open(path).read().splitlines() == ["size,ok", "1,True", "2,False"]
    path = report.write_json(str(tmp_path / "sub" / "a.json"), {"a": [1]})
    assert json.loads(open(path).read()) == {"a": [1]}


def test_without_matplotlib_the_json_is_still_written(tmp_path, monkeypatch):
    """A plain `pip install .` has no matplotlib: the sweep's files come, the PNG does not."""
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name == "matplotlib" or name.startswith("matplotlib."):
            raise ImportError("No module named 'matplotlib'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    assert not report.can_plot()
    results = [_train_result(1, 1000.0), _train_result(2, 1800.0)]
    files = report.write_training_sweep(results, str(tmp_path / "out"))
    assert [path.rsplit("/", 1)[-1] for path in files] == ["bench_train.json"]
    assert not (tmp_path / "out" / "bench_train.png").exists()
    assert "pip install 'tfloop[bench]'" in report.NO_PLOT
