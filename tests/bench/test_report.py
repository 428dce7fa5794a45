"""tfloop.bench.report: tables and files read back (no timing involved)."""

import json

import pytest

from tfloop.bench import report


def _train_result(num_devices, median):
    return {
        "config": {"model": "mlp", "global_batch_size": 32, "optimizer": "adam",
                   "collective": "auto", "devices": [f"/cpu:{i}" for i in range(num_devices)]},
        "machine": "cpu, 2 cores, intra-op threads 1",
        "num_devices": num_devices, "matmul_gflops": 10.0,
        "rows": [{"variant": "engine", "description": "engine (steps_per_loop=3)",
                  "median": median, "low": median - 1, "high": median + 1,
                  "mfu": 0.125, "peak_fraction": 0.25}],
        "ratios": {"engine": {}},
        "peaks": {"float32": {"flops_per_second": 8e10, "source": "measured float32 matmul rate "
                                                                  "of 1 cpu device(s)"}},
    }


def test_training_table_and_sweep_files(tmp_path):
    results = [_train_result(1, 1000.0), _train_result(2, 1800.0)]
    table = report.training_table(results)
    assert ("| 2 | engine (steps_per_loop=3) | 1,800 | 1,799 – 1,801 | – | – | – | 12.5% | 25.0% |"
            in table)
    assert ("2 device(s): mfu is of the peak the engine uses (float32 0.08 TFLOP/s (measured "
            "float32 matmul rate of 1 cpu device(s))); measured float32 matmul rate 10.0 GFLOP/s, "
            "intra-op threads 1") in table
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
    files = report.write_training_sweep(results, str(tmp_path / "out"), plot=False)
    assert [path.rsplit("/", 1)[-1] for path in files] == ["bench_train.json"]
    assert not (tmp_path / "out" / "bench_train.png").exists()
    assert "pip install '.[plot]'" in report.NO_PLOT and "--noplot" in report.NO_PLOT
    assert "CSV" not in report.NO_PLOT  # bench_train and predict_scaling write none


def test_the_plot_extra_is_declared():
    import pathlib
    import tomllib

    pyproject = pathlib.Path(__file__).resolve().parents[2] / "pyproject.toml"
    extras = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]
    assert extras["plot"] == ["matplotlib"]


@pytest.mark.process  # bench.sweep runs the benchmark per device count
def test_a_training_sweep_without_the_plot_writes_its_json(tmp_path):
    """bench.sweep after its device counts, with --noplot (a plain `pip install .`):
    the JSON and the table, no unpacking of a plot that was never drawn."""
    import sys

    from tfloop.bench import sweep

    script = tmp_path / "fake_bench_train.py"
    script.write_text(
        "import json, os, sys\n"
        "args = dict(a[2:].split('=', 1) for a in sys.argv[1:] if '=' in a)\n"
        "n = len(args['devices'].split(','))\n"
        "os.makedirs(args['output_dir'], exist_ok=True)\n"
        f"result = {_train_result(1, 1000.0)!r}\n"
        "result['num_devices'] = n\n"
        "result['python'] = sys.executable\n"
        "json.dump(result, open(os.path.join(args['output_dir'], f'r{n}.json'), 'w'))\n")
    lines = []
    results = sweep.sweep([1, 2], "cpu", [], str(tmp_path / "out"), script=str(script),
                          progress=lines.append, plot=False)
    assert [r["num_devices"] for r in results] == [1, 2]
    assert lines[-1] == f"wrote {tmp_path / 'out' / 'bench_train.json'}"
    assert not (tmp_path / "out" / "bench_train.png").exists()
    assert {r["python"] for r in results} == {sys.executable}  # the children's interpreter
