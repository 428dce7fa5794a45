"""Device specs, threads and strategies, and their checks: each mistake is one clear line
(each config field's own range: tests/engine/config/test_config_checks.py)."""

import pytest
import tensorflow as tf

from tfloop.engine.runtime import devices
from tfloop.engine import strategies
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError


def test_parse_devices_canonicalizes():
    assert devices.parse_devices("gpu:0,GPU:1") == ["/gpu:0", "/gpu:1"]
    assert devices.parse_devices(" cpu:0 , /cpu:3") == ["/cpu:0", "/cpu:3"]
    assert devices.parse_devices("") == ["/cpu:0"]  # no GPU on the test machines


def test_parse_devices_accepts_tensorflows_own_spellings():
    """What tf.config and tensor.device print can be pasted into --devices."""
    spec = "/job:localhost/replica:0/task:0/device:GPU:0,/device:GPU:1,GPU:2,/device:CPU:0"
    assert devices.parse_devices(spec) == ["/gpu:0", "/gpu:1", "/gpu:2", "/cpu:0"]
    with pytest.raises(ConfigError, match="/device:GPU:0.* listed more than once|gpu:0 listed"):
        devices.parse_devices("gpu:0,/device:GPU:0")
    with pytest.raises(ConfigError) as error:
        devices.parse_devices("/job:worker/replica:0/task:1/device:GPU:0")
    assert "is not a device of this process" in str(error.value)


@pytest.mark.parametrize("spec, message", [
    ("tpu:0", "is not a device"),
    ("gpu0", "is not a device"),
    ("cpu:0,cpu:0", "more than once"),
    ("cpu:0,cpu:100000", "cpu:100000 is beyond the 64 logical CPU devices"),
    ("cpu:64", "cpu:64 is beyond the 64 logical CPU devices"),
])
def test_parse_devices_rejects(spec, message):
    with pytest.raises(ConfigError) as error:
        devices.parse_devices(spec)
    assert message in str(error.value)


def test_the_last_logical_cpu_and_an_absurd_gpu_index():
    assert devices.parse_devices("cpu:63") == ["/cpu:63"]
    with pytest.raises(ConfigError, match="gpu:100000 does not exist"):
        devices.prepare_devices(devices.parse_devices("gpu:100000"))


def test_missing_gpu_is_refused_with_a_cpu_hint():
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/gpu:0"])
    assert "gpu:0 does not exist" in str(error.value)
    assert "cpu:N" in str(error.value)


def test_more_cpus_than_the_process_started_with_is_refused():
    tf.config.list_logical_devices("CPU")  # TensorFlow has started (alone, this test starts it)
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/cpu:7"])
    assert "already started with 4" in str(error.value)


def test_intra_op_threads_give_each_cpu_replica_its_share_of_the_cores(monkeypatch):
    monkeypatch.setattr(devices, "usable_cores", lambda: 8)
    cpus = [f"/cpu:{i}" for i in range(4)]
    unset = {}  # no TF_NUM_INTRAOP_THREADS: the process has every core

    def threads(names, requested=devices.AUTO_THREADS, environ=unset):
        return devices.intra_op_threads_for(names, requested, environ)

    assert threads(cpus) == 2          # 8 cores / 4 replicas
    assert threads(cpus * 4) == 1      # never below one
    assert threads(["/cpu:0"]) is None  # one replica: TF's default
    assert threads(["/gpu:0", "/gpu:1"]) is None
    assert threads(cpus, devices.TF_DEFAULT_THREADS) is None
    assert threads(["/cpu:0"], 3) == 3  # explicit wins
    # bin/launch's share of the host (TF_NUM_INTRAOP_THREADS) is the budget instead.
    budget = {"TF_NUM_INTRAOP_THREADS": "4"}
    assert threads(["/cpu:0"], environ=budget) == 4
    assert threads(["/cpu:0", "/cpu:1"], environ=budget) == 2
    assert threads(cpus * 2, environ=budget) == 1
    assert threads(["/gpu:0"], environ=budget) == 4
    assert threads(cpus, 3, environ=budget) == 3  # --intra_op_threads=N still wins
    for bad in ("0", "-2", "two", "100000"):
        with pytest.raises(ConfigError, match="TF_NUM_INTRAOP_THREADS=.* must be a whole"):
            threads(cpus, environ={"TF_NUM_INTRAOP_THREADS": bad})


def test_the_cpu_instruction_set_is_the_cpus_newest_capped_by_onednn(monkeypatch):
    """What run.json records as `cpu_isa`: oneDNN dispatches to the newest
    set the CPU has, or the one `ONEDNN_MAX_CPU_ISA` caps it at."""
    flags = "fpu sse4_1 avx avx2 fma avx512f avx512bw avx512vl avx512dq avx512_vnni"
    monkeypatch.setattr(devices, "_cpuinfo", lambda field: flags if field == "flags" else "")
    assert devices.cpu_isa({}) == "avx512_core_vnni"
    assert devices.cpu_isa({"ONEDNN_MAX_CPU_ISA": "AVX2"}) == "avx2"
    assert devices.cpu_isa({"ONEDNN_MAX_CPU_ISA": "avx2_vnni"}) == "avx2"
    assert devices.cpu_isa({"ONEDNN_MAX_CPU_ISA": "ALL"}) == "avx512_core_vnni"
    assert devices.cpu_isa({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_AMX"}) == "avx512_core_vnni"
    assert devices.cpu_isa({"TF_ENABLE_ONEDNN_OPTS": "0"}) == "avx512_core_vnni (oneDNN off)"
    monkeypatch.setattr(devices, "_cpuinfo", lambda field: "fpu sse4_1 avx avx2 fma")
    assert devices.cpu_isa({}) == "avx2"


def test_intra_op_threads_set_too_late():
    """This process started TensorFlow long ago (conftest): an explicit size
    is refused in one line, the automatic one leaves TF's pool alone."""
    import tensorflow as tf

    tf.constant(1.0)  # the runtime is up
    current = tf.config.threading.get_intra_op_parallelism_threads()
    with pytest.raises(ConfigError) as error:
        devices.configure_threads(["/cpu:0"], current + 3)
    assert "--intra_op_threads=" in str(error.value) and "comes too late" in str(error.value)
    devices.configure_threads(["/cpu:0", "/cpu:1"])  # auto: no error
    assert tf.config.threading.get_intra_op_parallelism_threads() == current
    with pytest.raises(ConfigError, match="must be -1"):
        RunConfig(intra_op_threads=-2)


@pytest.mark.parametrize("name, devs, message", [
    ("mirored", ["/cpu:0"], "is not a strategy"),
    ("parameter_server", ["/cpu:0", "/cpu:1"], "one CPU or the local GPUs"),
    ("multi_worker", ["/cpu:0", "/cpu:1"], "one CPU or the local GPUs"),
    ("one_device", ["/cpu:0", "/cpu:1"], "exactly one device"),
])
def test_strategy_mistakes(name, devs, message):
    with pytest.raises(ConfigError) as error:
        strategies.get(name).num_replicas(devs)
    assert message in str(error.value)
    assert "\n" not in str(error.value)


def test_virtual_gpus_are_refused_without_a_gpu():
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/cpu:0"], virtual_gpus=2)
    message = str(error.value)
    assert message.startswith("--virtual_gpus=2 splits each GPU, but TensorFlow sees no GPU")
    assert "\n" not in message


def test_bin_train_virtual_gpus_here_is_one_line_and_writes_nothing(tmp_path):
    from helpers import assert_one_line_error, run_bin

    result = run_bin("train", "--virtual_gpus=2", "--devices=gpu:0,gpu:1",
                     f"--model_dir={tmp_path / 'run'}")
    assert_one_line_error(result, contains="--virtual_gpus=2 splits each GPU, but TensorFlow "
                                           "sees no GPU on this machine")
    assert not (tmp_path / "run").exists()


def test_virtual_gpus_share_the_memory_of_the_smallest_gpu():
    assert devices.virtual_gpu_memory_mb(2, 81559) == 36701  # an H100 80GB in two
    assert devices.virtual_gpu_memory_mb(4, 16384) == 3686
    assert devices.virtual_gpu_memory_mb(2, None) == devices.FALLBACK_VIRTUAL_GPU_MB


def test_logical_gpus_are_counted_where_they_are_configured(monkeypatch):
    """gpu:3 exists on two physical GPUs split in two; the check counts logical GPUs."""
    from tfloop.collectives import gpus

    monkeypatch.setattr(gpus, "logical_split", lambda physical=None: [2, 2])
    devices.prepare_devices(["/gpu:3"])
    with pytest.raises(ConfigError, match="gpu:4 does not exist; this machine has 4 GPU"):
        devices.prepare_devices(["/gpu:4"])
    assert devices.parse_devices("") == ["/gpu:0", "/gpu:1", "/gpu:2", "/gpu:3"]


def test_virtual_gpus_keep_their_physical_gpu_visible_and_are_renumbered(monkeypatch):
    """Two physical GPUs split in two: gpu:2 and gpu:3 are physical GPU 1's
    halves, so only GPU 1 stays visible and they become /gpu:0 and /gpu:1."""
    from test_gpu_devices import FakeGPUs

    fake = FakeGPUs(monkeypatch, 2)
    halves = [tf.config.LogicalDeviceConfiguration(memory_limit=1024)] * 2
    monkeypatch.setattr(tf.config, "get_logical_device_configuration", lambda gpu: halves)
    assert devices.prepare_devices(["/gpu:3", "/gpu:2"]) == ["/gpu:1", "/gpu:0"]
    assert fake.visible_ids == [1]
    assert devices.prepare_devices(["/gpu:1", "/gpu:2"]) == ["/gpu:1", "/gpu:2"]
    assert fake.visible_ids == [0, 1]


def test_exact_float32_turns_tf32_off_and_restores_it():
    before = tf.config.experimental.tensor_float_32_execution_enabled()
    with devices.exact_float32():
        assert not tf.config.experimental.tensor_float_32_execution_enabled()
    assert tf.config.experimental.tensor_float_32_execution_enabled() == before
