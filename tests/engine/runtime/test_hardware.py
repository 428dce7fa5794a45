"""engine.runtime.hardware: the GPU table, the measured and cached CPU peak, peak memory."""

import json

import pytest

from tfloop.engine.runtime import hardware


@pytest.mark.parametrize("name, precision, tf32, expected", [
    ("NVIDIA H100 80GB HBM3", "mixed_bfloat16", True, ("H100 SXM", "bf16", 989.4e12)),
    ("NVIDIA H100 PCIe", "mixed_float16", True, ("H100 PCIe", "fp16", 756e12)),
    ("NVIDIA H100 NVL", "float32", True, ("H100 NVL", "tf32", 417.5e12)),
    ("NVIDIA H200", "float32", False, ("H200 SXM", "fp32", 67e12)),
    ("NVIDIA A100-SXM4-80GB", "mixed_bfloat16", True, ("A100", "bf16", 312e12)),
    ("NVIDIA L4", "float32", True, ("L4", "tf32", 60e12)),
    ("Tesla T4", "float32", True, ("T4", "fp32", 8.1e12)),
    ("Tesla V100-SXM2-16GB", "mixed_float16", True, ("V100 SXM2", "fp16", 125e12)),
    ("Tesla T4", "mixed_bfloat16", True, None),  # no bf16 tensor cores: measured instead
    ("NVIDIA L40S", "float32", True, None),  # not an L4
])
def test_known_gpus_have_their_datasheet_peak(name, precision, tf32, expected):
    found = hardware.gpu_peak(name, precision, tf32=tf32)
    if expected is None:
        assert found is None
    else:
        assert found[:2] == expected[:2] and found[2] == pytest.approx(expected[2])


def test_a_cpu_peak_is_the_best_rate_of_the_machines_first_probes(tmp_path, monkeypatch):
    """A probe on a busy machine reads low: a CPU's peak is the best of its
    first `CPU_PROBES` probes, kept on disk; after those no run probes again
    (about half a second of its start), and every run divides by one peak."""
    monkeypatch.setenv("TFLOOP_CACHE_DIR", str(tmp_path))
    cache = tmp_path / "cpu_peaks.json"
    monkeypatch.setattr(hardware, "_MEASURED", {})
    peak = hardware.peak(["/cpu:0"])
    assert peak.flops_per_second > 1e8 and "measured float32 matmul rate" in peak.source
    kept = json.loads(cache.read_text())
    assert list(kept.values()) == [{"best": peak.flops_per_second, "probes": 1}]
    assert hardware.peak(["/cpu:0"]) is peak  # this process: no second probe
    (key,) = kept
    rates = iter([5e9, 9e9])  # the next processes' probes: one reads low, one higher
    monkeypatch.setattr(hardware, "matmul_flops_per_second",
                        lambda devices, dtype="float32": next(rates))
    cache.write_text(json.dumps({key: {"best": 7e9, "probes": 1}}))
    monkeypatch.setattr(hardware, "_MEASURED", {})
    again = hardware.peak(["/cpu:0"])  # reads low: the best is kept
    assert again.flops_per_second == 7e9 and "best measured" in again.source
    assert json.loads(cache.read_text()) == {key: {"best": 7e9, "probes": 2}}
    monkeypatch.setattr(hardware, "_MEASURED", {})
    assert hardware.peak(["/cpu:0"]).flops_per_second == 9e9  # reads higher: raised
    assert json.loads(cache.read_text()) == {key: {"best": 9e9, "probes": hardware.CPU_PROBES}}
    # From then on no probe: the kept best, said so.
    monkeypatch.setattr(hardware, "matmul_flops_per_second", lambda *a, **k: 1 / 0)
    monkeypatch.setattr(hardware, "_MEASURED", {})
    kept_peak = hardware.peak(["/cpu:0"])
    assert kept_peak.flops_per_second == 9e9
    assert kept_peak.source == (f"best measured float32 matmul rate of 1 cpu device(s) in "
                                f"{hardware.CPU_PROBES} runs, kept in {cache}")
    # An entry of another shape is measured again. The file of versions before
    # this one (peak_flops.json: key -> rate, which they fail to read in
    # this shape) is neither read nor written.
    monkeypatch.setattr(hardware, "matmul_flops_per_second",
                        lambda devices, dtype="float32": 1e9)
    cache.write_text(json.dumps({key: 3e9, "bad": {"best": -1, "probes": 5}}))
    (tmp_path / "peak_flops.json").write_text(json.dumps({key: 5e9}))
    monkeypatch.setattr(hardware, "_MEASURED", {})
    assert hardware.peak(["/cpu:0"]).flops_per_second == 1e9
    assert json.loads(cache.read_text()) == {key: {"best": 1e9, "probes": 1}}
    assert json.loads((tmp_path / "peak_flops.json").read_text()) == {key: 5e9}


def test_a_cpus_bfloat16_peak_is_at_least_its_float32_rate(tmp_path, monkeypatch):
    """The bfloat16 probe of a CPU without bfloat16 arithmetic reads far below
    its float32 rate (28 against 160 GFLOP/s): that is no peak."""
    rates = {"float32": 160e9, "bfloat16": 28e9}
    monkeypatch.setenv("TFLOOP_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(hardware, "_MEASURED", {})
    monkeypatch.setattr(hardware, "matmul_flops_per_second",
                        lambda devices, dtype="float32": rates[dtype])
    peak = hardware.peak(["/cpu:0"], "mixed_bfloat16")
    assert peak.flops_per_second == 160e9
    assert peak.source == ("measured float32 matmul rate of 1 cpu device(s) (its bfloat16 "
                           "rate, 28.0 GFLOP/s, is lower)")
    rates["bfloat16"] = 400e9  # a CPU with bfloat16 units (AMX): its own rate
    monkeypatch.setattr(hardware, "_MEASURED", {})
    assert hardware.peak(["/cpu:0"], "mixed_bfloat16").flops_per_second == 400e9


def test_peak_memory_is_the_host_rss_without_a_gpu():
    memory = hardware.peak_memory(["/cpu:0"])
    assert list(memory) == ["host_peak_mb"] and memory["host_peak_mb"] > 10
