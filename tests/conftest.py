"""Session-wide test set-up: four logical CPU devices, configured once.

TensorFlow fixes its device list the first time anything touches a device, and
never again in that process. Every in-process multi-device test therefore
shares these four logical CPUs; tests that need another layout run a binary in
a subprocess (see `tests/helpers.py`).

The suite runs on CPUs whatever the machine: GPUs are hidden from it (and from
the binaries it starts) before TensorFlow imports. Tests that need a GPU carry
`@pytest.mark.gpu`; pyproject.toml deselects them by default, and
`TFLOOP_TEST_GPUS=1 pytest -m gpu` runs them with the GPUs visible.
"""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The measured peak FLOP rate (engine.runtime.hardware) is kept in a folder
# of the suite's own, not the user's ~/.cache, for this process and the binaries it runs.
os.environ.setdefault("TFLOOP_CACHE_DIR", tempfile.mkdtemp(prefix="tfloop-test-cache-"))

from helpers import COMPARED_THREADS, hide_gpus  # noqa: E402  (imports no TensorFlow)

hide_gpus(os.environ)
# One thread per op in this process too, like every binary the suite runs
# (helpers.COMPARED_THREADS says why); set before TensorFlow sizes its pool.
os.environ.update(COMPARED_THREADS)

import pytest  # noqa: E402

from tfloop.engine.runtime import devices as engine_devices  # noqa: E402

NUM_LOGICAL_CPUS = 4

engine_devices.ensure_logical_cpus(NUM_LOGICAL_CPUS)
engine_devices.configure_threads([f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)])


@pytest.fixture(scope="session")
def cpu_devices():
    """The canonical names of the session's logical CPU devices."""
    return [f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)]
