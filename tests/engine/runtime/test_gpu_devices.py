"""The GPU set-up of a process, on a machine without a GPU.

What TensorFlow reports is faked (`FakeGPUs`: physical GPUs, their compute
capability, what is visible), so the real code paths run: a process sees only
the GPUs its `--devices` names, memory growth on request, the reason when
`nvidia-smi` sees GPUs TensorFlow does not, the first-start PTX JIT line, and
the CPU suite's own GPU hiding (tests/conftest.py, tests/helpers.py).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import tensorflow as tf

from tfloop.engine.runtime import devices
from tfloop.engine.config import RunConfig
from tfloop.engine.assembly.plan import spec_sections
from tfloop.engine import strategies
from tfloop.engine.errors import ConfigError
from helpers import REPO, bin_env, run_bin


class FakeGPUs:
    """`n` physical GPUs as TensorFlow would list them, all visible until
    `set_visible_devices`; `started` makes changes fail as after TF's start."""

    def __init__(self, monkeypatch, n: int, capability=(9, 0), started: bool = False):
        self.physical = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU")
                         for i in range(n)]
        self.visible = list(self.physical)
        self.growth: dict[str, bool] = {}
        self.capability, self.started = capability, started
        real_list = tf.config.list_physical_devices

        def list_physical_devices(device_type=None):
            return list(self.physical) if device_type == "GPU" else real_list(device_type)

        monkeypatch.setattr(tf.config, "list_physical_devices", list_physical_devices)
        monkeypatch.setattr(tf.config, "get_visible_devices", self._get_visible)
        monkeypatch.setattr(tf.config, "set_visible_devices", self._set_visible)
        monkeypatch.setattr(tf.config.experimental, "set_memory_growth", self._set_growth)
        monkeypatch.setattr(tf.config.experimental, "get_device_details",
                            lambda device: {"device_name": "NVIDIA H100 80GB HBM3",
                                            "compute_capability": self.capability})

    def _get_visible(self, device_type=None):
        assert device_type == "GPU"
        return list(self.visible)

    def _set_visible(self, visible, device_type=None):
        assert device_type == "GPU"
        if self.started:
            raise RuntimeError("Visible devices cannot be modified after being initialized")
        self.visible = list(visible)

    def _set_growth(self, device, enable):
        if self.started:
            raise RuntimeError("Physical devices cannot be modified after being initialized")
        self.growth[device.name] = enable

    @property
    def visible_ids(self) -> list[int]:
        return [int(d.name.rsplit(":", 1)[1]) for d in self.visible]


@pytest.fixture
def log_lines():
    """The engine's device log lines (the tfloop logger may not propagate)."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger, handler = logging.getLogger("tfloop.engine.runtime.devices"), Collect()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield lambda: list(lines)
    logger.removeHandler(handler)
    logger.setLevel(level)


def _fake_nvidia_smi(tmp_path, monkeypatch, count: int) -> None:
    folder = tmp_path / "fakebin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + "".join(
        f"echo 'GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})'\n" for i in range(count)))
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")


# -- visible devices and memory growth (issue 15, item 2) --------------------------------


def test_a_process_sees_only_the_gpus_it_was_given(monkeypatch, log_lines):
    gpus = FakeGPUs(monkeypatch, 4)
    names = devices.prepare_devices(["/gpu:3", "/gpu:1"])
    assert gpus.visible_ids == [1, 3]
    # TensorFlow numbers the visible GPUs from 0 in physical order.
    assert names == ["/gpu:1", "/gpu:0"]
    assert any("GPUs visible to this process: gpu:1 -> /gpu:0, gpu:3 -> /gpu:1 (of 4" in line
               for line in log_lines()), log_lines()
    assert gpus.growth == {}  # memory growth only on request
    # Idempotent: asked again (the same process), nothing changes.
    assert devices.prepare_devices(["/gpu:3", "/gpu:1"]) == ["/gpu:1", "/gpu:0"]


def test_a_cpu_run_on_a_gpu_host_hides_every_gpu(monkeypatch):
    gpus = FakeGPUs(monkeypatch, 2)
    assert devices.prepare_devices(["/cpu:0", "/cpu:1"]) == ["/cpu:0", "/cpu:1"]
    assert gpus.visible_ids == []


def test_every_gpu_named_keeps_the_names(monkeypatch):
    gpus = FakeGPUs(monkeypatch, 2)
    assert devices.prepare_devices(["/gpu:0", "/gpu:1"]) == ["/gpu:0", "/gpu:1"]
    assert gpus.visible_ids == [0, 1]


def test_memory_growth_on_the_visible_gpus_only(monkeypatch):
    gpus = FakeGPUs(monkeypatch, 3)
    devices.prepare_devices(["/gpu:2"], memory_growth=True)
    assert gpus.growth == {"/physical_device:GPU:2": True}


def test_too_late_to_restrict(monkeypatch, log_lines):
    """TensorFlow already started: with every GPU visible the names stand
    (logged); a process already restricted to other GPUs is one line."""
    gpus = FakeGPUs(monkeypatch, 2, started=True)
    assert devices.prepare_devices(["/gpu:1"]) == ["/gpu:1"]
    assert any("already started with all 2 GPUs visible" in line for line in log_lines())
    gpus.visible = gpus.physical[:1]
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/gpu:1"])
    assert "comes too late" in str(error.value) and "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--gpu_memory_growth comes too late"):
        devices.prepare_devices(["/gpu:0"], memory_growth=True)


def test_gpu_memory_growth_flag_is_checked_at_construction():
    assert RunConfig(gpu_memory_growth=True, devices="gpu:0,gpu:1").gpu_memory_growth
    # TensorFlow's own spellings, which --devices accepts, name GPUs too.
    assert RunConfig(gpu_memory_growth=True, devices="/device:GPU:0").gpu_memory_growth
    assert RunConfig(gpu_memory_growth=True).gpu_memory_growth  # every GPU
    with pytest.raises(ConfigError, match="--devices=cpu:0,cpu:1 names none"):
        RunConfig(gpu_memory_growth=True, devices="cpu:0,cpu:1")
    # A strategy's own rule is its spec's (checked by the plan, before anything is built).
    with pytest.raises(ConfigError, match="--strategy=tpu runs on TPU cores"):
        strategies.get("tpu").check(
            spec_sections(RunConfig(gpu_memory_growth=True, strategy="tpu")),
            strategies.NO_CLUSTER)


def test_a_task_without_gpus_evaluates_or_serves_on_cpu(monkeypatch):
    """bin/launch gives the evaluator and ps tasks no GPU but the workers'
    command (`--devices=gpu:0,...`): they fall back to cpu:0."""
    assert devices.support_task_devices(["/gpu:0", "/gpu:1"], "evaluator:0") == ["/cpu:0"]
    FakeGPUs(monkeypatch, 2)
    assert devices.support_task_devices(["/gpu:0", "/gpu:1"], "evaluator:0") == ["/gpu:0"]
    assert devices.support_task_devices(["/cpu:1"], "ps:0") == ["/cpu:1"]


# -- no GPU in TensorFlow, one in nvidia-smi; the PTX JIT (item 3) -------------------------


def test_no_nvidia_smi_no_reason(monkeypatch):
    monkeypatch.setattr(devices.machine_gpus.shutil, "which", lambda name: None)
    assert devices.missing_gpu_reason() is None


@pytest.mark.process  # the engine runs the stand-in nvidia-smi
def test_nvidia_smi_sees_gpus_tensorflow_does_not(tmp_path, monkeypatch, log_lines):
    _fake_nvidia_smi(tmp_path, monkeypatch, 2)
    # This suite hides the GPUs itself: said so first.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert "CUDA_VISIBLE_DEVICES is empty" in devices.missing_gpu_reason()
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    reason = devices.missing_gpu_reason()
    assert reason.startswith("nvidia-smi lists 2 GPU(s) but TensorFlow registers none")
    assert "pip install '.[gpu]'" in reason
    with pytest.raises(ConfigError) as error:
        devices.prepare_devices(["/gpu:0"])
    message = str(error.value)
    assert "gpu:0 does not exist: nvidia-smi lists 2 GPU(s)" in message
    assert "pip install '.[gpu]'" in message and "cpu:N" in message and "\n" not in message
    assert devices.parse_devices("") == ["/cpu:0"]  # the CPU fallback still runs, and says why
    assert any(line.startswith("training on cpu:0: nvidia-smi lists 2 GPU(s)")
               for line in log_lines()), log_lines()


@pytest.mark.parametrize("capability, jit", [
    ((9, 0), True),    # H100: TF 2.21 ships compute_90 PTX only
    ((12, 0), True),
    ((8, 0), False),   # A100: sm_80
    ((8, 6), False),   # sm_80 kernels run on 8.6
    ((8, 9), False),
    ((7, 5), False),   # sm_70
])
def test_ptx_jit_is_told_in_one_line(monkeypatch, log_lines, capability, jit):
    monkeypatch.setattr(tf.sysconfig, "get_build_info", lambda: {
        "cuda_compute_capabilities": ["sm_60", "sm_70", "sm_80", "sm_89", "compute_90"],
        "is_cuda_build": True})
    monkeypatch.delenv("CUDA_CACHE_MAXSIZE", raising=False)
    FakeGPUs(monkeypatch, 2, capability=capability)
    devices.prepare_devices(["/gpu:0"])
    lines = [line for line in log_lines() if "PTX" in line]
    assert len(lines) == (1 if jit else 0), lines
    if jit:
        assert f"1 GPU(s) of compute capability {capability[0]}.{capability[1]}" in lines[0]
        assert "CUDA_CACHE_MAXSIZE=4294967296" in lines[0] and "\n" not in lines[0]


def _dev_extras(path: str) -> str:
    result = subprocess.run([os.path.join(REPO, "dev"), "extras"], capture_output=True,
                            text=True, timeout=30, env=bin_env({"PATH": path,
                                                                "TFLOOP_EXTRAS": None}))
    assert result.returncode == 0, result.stderr
    return result.stdout.strip()


def test_dev_installs_the_gpu_extra_where_nvidia_smi_lists_a_gpu(tmp_path, monkeypatch):
    system_path = "/usr/bin:/bin"
    assert _dev_extras(system_path) == "test"  # a CPU machine: unchanged
    _fake_nvidia_smi(tmp_path, monkeypatch, 1)
    assert _dev_extras(f"{tmp_path / 'fakebin'}{os.pathsep}{system_path}") == "test,gpu"
    broken = tmp_path / "nodriver"  # nvidia-smi without a driver fails: no GPU
    broken.mkdir()
    (broken / "nvidia-smi").write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    (broken / "nvidia-smi").chmod(0o755)
    assert _dev_extras(f"{broken}{os.pathsep}{system_path}") == "test"


# -- the CPU suite hides GPUs (item 10) ------------------------------------------------------


def test_the_suite_and_its_binaries_see_no_gpu():
    assert os.environ["CUDA_VISIBLE_DEVICES"] == ""
    assert tf.config.get_visible_devices("GPU") == []
    result = run_bin("launch", "--num_workers=1", "--", sys.executable, "-c",
                     "import os; print(repr(os.environ.get('CUDA_VISIBLE_DEVICES')))",
                     timeout=60)
    assert result.returncode == 0, result.stderr
    assert "[worker:0] ''" in result.stdout


def test_gpu_tests_are_not_collected_in_the_cpu_run(tmp_path):
    """`@pytest.mark.gpu` is registered and deselected by the default options:
    not skipped, not run (the house rule: no skipped tests)."""
    (tmp_path / "test_marked.py").write_text(
        "import pytest\n\n@pytest.mark.gpu\ndef test_needs_a_gpu():\n    pass\n\n"
        "def test_runs_anywhere():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", os.path.join(REPO, "pyproject.toml"),
         "--rootdir", str(tmp_path), "-n", "0", "-p", "no:cacheprovider", "--strict-markers",
         str(tmp_path / "test_marked.py")],
        capture_output=True, text=True, timeout=120, cwd=str(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed, 1 deselected" in result.stdout, result.stdout


@pytest.mark.gpu
def test_on_a_gpu_host_a_process_sees_only_the_gpu_it_names():
    """Run by `TFLOOP_TEST_GPUS=1 pytest -m gpu` (.ci/run on a GPU host): the
    real `set_visible_devices` and memory growth, in a fresh process."""
    code = ("import tensorflow as tf; from tfloop.engine.runtime import devices\n"
            "last = len(tf.config.list_physical_devices('GPU')) - 1\n"
            "names = devices.prepare_devices([f'/gpu:{last}'], memory_growth=True)\n"
            "visible = tf.config.get_visible_devices('GPU')\n"
            "print(names, len(tf.config.list_logical_devices('GPU')),\n"
            "      tf.config.experimental.get_memory_growth(visible[0]))\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=300, env=bin_env(), cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert "['/gpu:0'] 1 True" in result.stdout, result.stdout + result.stderr


def test_the_reduce_device_is_renumbered_with_the_gpus_and_a_hidden_one_refused(tmp_path):
    from tfloop.engine.config import RunConfig
    from tfloop.engine.errors import ConfigError
    from tfloop.engine.assembly.plan import renumber_reduce_device

    renamed = {"/gpu:2": "/gpu:0", "/gpu:3": "/gpu:1"}  # --devices=gpu:2,gpu:3
    config = RunConfig(model_dir=str(tmp_path), collective="reduce_to_one_device",
                       reduce_device="gpu:3")
    assert renumber_reduce_device(config, renamed).reduce_device == "gpu:1"
    on_cpu = RunConfig(model_dir=str(tmp_path), collective="reduce_to_one_device",
                       reduce_device="cpu:0")
    assert renumber_reduce_device(on_cpu, renamed) is on_cpu
    hidden = RunConfig(model_dir=str(tmp_path), collective="reduce_to_one_device",
                       reduce_device="gpu:0")
    with pytest.raises(ConfigError, match=r"^--reduce_device=gpu:0 is not one of "
                                          r"--devices=gpu:2,gpu:3: a process sees only"):
        renumber_reduce_device(hidden, renamed)


@pytest.mark.process  # the engine runs the stand-in nvidia-smi
def test_the_gpus_memory_and_details_are_read_through_the_one_nvidia_smi_runner(
        tmp_path, monkeypatch):
    folder = tmp_path / "querybin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text('#!/bin/sh\ncase "$1" in\n'
                      '  --query-gpu=memory.total) printf "81559\\n40960\\n" ;;\n'
                      '  --query-gpu=index*) echo "0, NVIDIA H100, 81559 MiB, 550.54, 9.0" ;;\n'
                      '  *) exit 9 ;;\nesac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}{os.pathsep}{os.environ['PATH']}")
    assert devices._smallest_gpu_mb() == 40960
    assert devices.nvidia_smi_details() == ["0, NVIDIA H100, 81559 MiB, 550.54, 9.0"]
    script.write_text("#!/bin/sh\nexit 9\n")  # no driver: nothing known
    assert devices._smallest_gpu_mb() is None and devices.nvidia_smi_details() == []
