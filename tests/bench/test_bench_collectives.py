"""bin/bench_collectives end to end (subprocess), and its library (bench.collectives) in-process.

Nothing here checks a timing: only that the benchmark runs, reduces
correctly, and writes what it says. Numbers live in docs/collectives.md.
"""

import csv
import os
import json
import pytest

from tfloop.bench import collectives as collective_bench
from tfloop.collectives import CollectiveError
from helpers import assert_one_line_error, run_bin

COLLECTIVES = ["ring", "hierarchical_copy", "reduce_to_one_device", "auto"]


def test_sweep_writes_table_csv_json_png(tmp_path):
    out = tmp_path / "bench"
    result = run_bin(
        "bench_collectives", "--devices=cpu:0,cpu:1", "--sizes=4K,64K", "--iters=2",
        "--warmup=1", "--repeats=1", "--rounds=2", "--min_sample_ms=0", f"--output_dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "[2/2] 64K: timing" in result.stdout  # progress while it runs
    assert "busbw(GB/s)" in result.stdout and "plug-in overhead" in result.stdout
    assert "auto vs the fastest" in result.stdout

    with open(out / "bench_collectives_sweep.csv") as f:
        rows = list(csv.DictReader(f))
    assert sorted({(int(r["size"]), r["collective"]) for r in rows}) == sorted(
        (size, name) for size in (4096, 65536) for name in COLLECTIVES
    )
    assert all(r["correct"] == "True" for r in rows), rows
    assert all(float(r["busbw_gbs"]) == pytest.approx(float(r["algbw_gbs"])) for r in rows)

    report = json.loads((out / "bench_collectives.json").read_text())
    assert report["config"]["devices"] == ["/cpu:0", "/cpu:1"]
    assert len(report["sweep"]) == 8 and len(report["auto_vs_fastest"]) == 2
    overhead = report["overhead"]
    assert {r["collective"] for r in overhead} == set(COLLECTIVES)
    # Our layer adds nothing to the traced graph: the same ops as TF direct.
    assert all(r["direct_graph_ops"] == r["layer_graph_ops"] for r in overhead), overhead
    assert (out / "bench_collectives_overhead.csv").exists()
    assert (out / "bench_collectives_busbw.png").read_bytes()[:4] == b"\x89PNG"


def test_model_mode_compares_packed_and_unpacked(tmp_path):
    out = tmp_path / "bench"
    result = run_bin(
        "bench_collectives", "--devices=cpu:0,cpu:1", "--sizes=", "--model=mlp",
        "--collectives=ring,hierarchical_copy", "--iters=1", "--warmup=1", "--repeats=1",
        "--rounds=1", "--min_sample_ms=0", f"--output_dir={out}",
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "packed/unpacked" in result.stdout
    rows = json.loads((out / "bench_collectives.json").read_text())["model"]
    assert [r["collective"] for r in rows] == ["ring", "hierarchical_copy"]
    assert all(r["correct"] and r["tensors"] == 6 for r in rows), rows
    # Default packing: pack_bytes=256K (the mlp's kernels of 256K and more travel alone).
    assert rows[0]["packed"] == "ring+packing(pack_bytes=262144)"
    assert all(r["largest_alone_us"] > 0 and r["median_ratio"] > 0 for r in rows), rows


# One subprocess proves the binary's one-line error path; the checks behind
# other bad values (sizes, names, config ranges) are tested in process above/below.
@pytest.mark.parametrize(
    "flag, expected",
    [("--collectives=ring,nccl", "--collective=nccl needs GPUs, but the devices are cpu:0,cpu:1")],
)
def test_bad_flags_fail_in_one_line(flag, expected, tmp_path):
    result = run_bin("bench_collectives", "--devices=cpu:0,cpu:1", flag,
                     f"--output_dir={tmp_path / 'never'}", timeout=120)
    assert_one_line_error(result, contains=expected)
    assert not (tmp_path / "never").exists()


def tiny_model(name):
    """Stands in for models.registry.build: conv + dense, odd shapes."""
    import keras

    assert name == "tiny"
    return keras.Sequential([
        keras.Input((6, 6, 1)),
        keras.layers.Conv2D(3, 3),
        keras.layers.Flatten(),
        keras.layers.Dense(5),
    ])


def test_library_model_mode_with_a_local_model(cpu_devices):
    config = collective_bench.CollectiveBenchConfig(
        devices=tuple(cpu_devices), collectives=("reduce_to_one_device", "ring"),
        model="tiny", iters=1, warmup=1, repeats=1, rounds=1, min_sample_ms=0, pack_bytes=64,
        overhead=False,
    )
    lines = []
    results = collective_bench.run(config, build_model=tiny_model, progress=lines.append)
    assert [r.collective for r in results.model] == ["reduce_to_one_device", "ring"]
    assert all(r.correct and r.tensors == 4 for r in results.model)
    assert results.model[1].packed == "ring+packing(pack_bytes=64)"
    assert results.model[1].unpacked == "ring"
    assert any("packed/unpacked" in line for line in lines)


def test_parse_sizes():
    assert collective_bench.parse_sizes("4K:256K") == [4096, 16384, 65536, 262144]
    assert collective_bench.parse_sizes("1M:4M:2") == [1 << 20, 2 << 20, 4 << 20]
    assert collective_bench.parse_sizes("4K, 64KiB,1mb,100") == [4096, 65536, 1 << 20, 100]
    assert collective_bench.parse_sizes("") == []
    assert [collective_bench.format_size(s) for s in (4096, 1 << 20, 1 << 30, 100)] == [
        "4K", "1M", "1G", "100"]
    for bad in ("4X", "64K:4K", "4K:64K:1", "0", "1:2:3:4", "4K,,8K"):
        with pytest.raises(CollectiveError) as raised:
            collective_bench.parse_sizes(bad)
        assert f"--sizes={bad!r}" in str(raised.value)


@pytest.mark.parametrize(
    "kwargs, expected",
    [
        (dict(iters=0), "--iters=0 must be an integer >= 1"),
        (dict(warmup=-1), "--warmup=-1 must be an integer >= 0"),
        (dict(rounds=0), "--rounds=0 must be an integer >= 1"),
        (dict(min_sample_ms=-1), "--min_sample_ms=-1 must be a number >= 0"),
        (dict(dtype="int8"), "--dtype='int8' is not supported"),
        (dict(sizes=()), "--sizes is empty and no --model given"),
        (dict(sizes=(1,), dtype="float32"), "--sizes: 1 bytes holds no float32 element"),
        (dict(collectives=()), "--collectives is empty"),
    ],
)
def test_config_validation(kwargs, expected):
    kwargs = {"devices": ("/cpu:0", "/cpu:1"), "sizes": (4096,), **kwargs}
    with pytest.raises(CollectiveError) as raised:
        collective_bench.CollectiveBenchConfig(**kwargs)
    assert expected in str(raised.value)


PLUGINS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "collectives")
QUICK = ("--devices=cpu:0,cpu:1", "--sizes=4K", "--iters=1", "--warmup=1", "--repeats=1",
         "--rounds=1", "--min_sample_ms=0")


def _pythonpath(*folders):
    return {"PYTHONPATH": os.pathsep.join([*folders, os.environ.get("PYTHONPATH", "")])}


def test_a_wrong_sum_exits_1_after_writing_the_files(tmp_path):
    """A plug-in of the right shape that averages instead of summing: the table
    and files say WRONG, and the benchmark fails (exit 1), naming it."""
    out = tmp_path / "bench"
    result = run_bin("bench_collectives", *QUICK, "--noplot", f"--output_dir={out}",
                     "--collectives=ring,faulty_collective_plugins:Averages",
                     env=_pythonpath(PLUGINS))
    assert result.returncode == 1, result.stderr[-3000:]
    error = assert_one_line_error(result, contains="wrong all-reduce sums: "
                                  "faulty_collective_plugins:Averages at 4K (max relative error")
    assert error.startswith("bench_collectives: error: ") and "ring" not in error
    rows = json.loads((out / "bench_collectives.json").read_text())["sweep"]
    assert {r["collective"]: r["correct"] for r in rows} == {
        "ring": True, "faulty_collective_plugins:Averages": False}


@pytest.fixture
def no_matplotlib(tmp_path):
    """A PYTHONPATH on which `import matplotlib` fails, as after a plain `pip install .`."""
    fake = tmp_path / "no_matplotlib" / "matplotlib"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError(\"No module named 'matplotlib'\")\n")
    return str(fake.parent)


def test_without_matplotlib_it_runs_and_skips_the_png_in_one_line(tmp_path, no_matplotlib):
    """A plain `pip install .` (issue 25): the benchmark runs, writes its CSV and
    JSON, and says in one line that it skipped the PNG, instead of refusing."""
    out = tmp_path / "bench"
    result = run_bin("bench_collectives", *QUICK, "--collectives=ring", f"--output_dir={out}",
                     env=_pythonpath(no_matplotlib))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    skipped = [line for line in result.stdout.splitlines() if "matplotlib is not" in line]
    assert skipped == ["skipping bench_collectives_busbw.png: matplotlib is not installed "
                       "(pip install '.[plot]' or 'tfloop[plot]' to draw it; --noplot says not "
                       "to)"], result.stdout
    assert sorted(p.name for p in out.iterdir()) == [
        "bench_collectives.json", "bench_collectives_overhead.csv", "bench_collectives_sweep.csv"]


def test_bench_train_sweep_without_matplotlib_is_refused_before_it_starts(tmp_path,
                                                                         no_matplotlib):
    out = tmp_path / "bench"
    result = run_bin("bench_train", "--device_counts=1,2", f"--output_dir={out}",
                     env=_pythonpath(no_matplotlib), timeout=120)
    assert result.returncode == 2
    assert_one_line_error(result, contains="pip install '.[plot]'")
    assert "=== 1 device(s)" not in result.stdout and not out.exists()


def test_the_default_sweep_is_short_and_full_is_a_flag():
    assert collective_bench.parse_sizes(collective_bench.DEFAULT_SIZES)[-1] == 4 << 20
    assert collective_bench.parse_sizes(collective_bench.FULL_SIZES)[-1] == 256 << 20
    with pytest.raises(CollectiveError, match="--full sweeps 4K:256M and --sizes='64K' asks"):
        collective_bench.main(devices="cpu:0,cpu:1", collectives=["ring"], sizes="64K",
                              full=True)
