"""Session-wide test set-up: four logical CPU devices, configured once.

TensorFlow fixes its device list the first time anything touches a device, and
never again in that process. Every in-process multi-device test therefore
shares these four logical CPUs; tests that need another layout run a binary in
a subprocess (see `tests/helpers.py`). Under pytest-xdist (`-n 2`, the
default) each worker sets them up in `pytest_configure`; the controller, which
only hands out tests, never imports TensorFlow.

The suite runs on CPUs whatever the machine: GPUs are hidden from it (and from
the binaries it starts) before TensorFlow imports. Tests that need a GPU carry
`@pytest.mark.gpu`; pyproject.toml deselects them by default, and
`TFLOOP_TEST_GPUS=1 pytest -m gpu` runs them with the GPUs visible.

Two tiers (tests/tiers.py): every test that starts a process (a binary, a
cluster, a helper script) is marked `process` at collection, found by reading
the test, its fixtures and the suite's helpers they use; `pytest --fast`
(`./dev test --fast`) runs only the others, and fails any of them that starts
a process, naming the missing mark. It also leaves out the in-process tests
that train whole runs to compare them (marked `compares`, by module:
`tiers.COMPARING_MODULES`).
"""

import os
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# The measured peak FLOP rate (engine.runtime.hardware) is kept in a folder
# of the suite's own, not the user's ~/.cache, for this process and the binaries it runs.
os.environ.setdefault("TFLOOP_CACHE_DIR", tempfile.mkdtemp(prefix="tfloop-test-cache-"))

import tiers  # noqa: E402  (imports no TensorFlow)
from helpers import COMPARED_THREADS, hide_gpus  # noqa: E402  (imports no TensorFlow)

hide_gpus(os.environ)
# One thread per op in this process too, like every binary the suite runs
# (helpers.COMPARED_THREADS says why); set before TensorFlow sizes its pool.
os.environ.update(COMPARED_THREADS)

import pytest  # noqa: E402

NUM_LOGICAL_CPUS = 4


def _runs_tests(config) -> bool:
    """Whether this process runs or collects tests itself: not pytest-xdist's
    controller, which hands them to its workers. The controller never imports
    TensorFlow (about 5 s of CPU, taken from the workers while they start)."""
    if hasattr(config, "workerinput") or config.getvalue("collectonly"):
        return True
    try:
        return not config.getoption("numprocesses")  # -n 0, or no -n
    except ValueError:  # pytest-xdist not loaded (-p no:xdist)
        return True


def pytest_configure(config):
    if not _runs_tests(config):
        return
    from tfloop.engine.runtime import devices as engine_devices

    engine_devices.ensure_logical_cpus(NUM_LOGICAL_CPUS)
    engine_devices.configure_threads([f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)])

    import quiet_teardown

    # Dropping hundreds of distributed iterators in one process waits out their
    # autotune threads (up to 60 s each); tests/quiet_teardown.py says why and how.
    quiet_teardown.install()


@pytest.fixture(autouse=True, scope="module")
def _isolated_module():
    """What a module's shared runs change (its module-scoped fixtures), put
    back after its last test (tests/isolation.py)."""
    import isolation  # TensorFlow's: imported where tests run (`_runs_tests`)

    with isolation.restored():
        yield


@pytest.fixture(autouse=True)
def _isolated():
    """What a test changes for its worker (the `tfloop` logger, op
    determinism) is put back after it (tests/isolation.py)."""
    import isolation

    with isolation.restored():
        yield


@pytest.fixture(scope="session")
def cpu_devices():
    """The canonical names of the session's logical CPU devices."""
    return [f"/cpu:{i}" for i in range(NUM_LOGICAL_CPUS)]


# -- the two tiers (tests/tiers.py) ----------------------------------------------------------


def pytest_addoption(parser):
    parser.addoption(
        "--fast", action="store_true",
        help="the fast tier: only the tests that start no process (not marked "
             f"`{tiers.PROCESS}`) and train no whole runs to compare (not marked "
             f"`{tiers.COMPARES}`); one that starts a process anyway fails, naming the mark")


def _fast(config) -> bool:
    """The fast tier: `--fast`, or a `-m` expression that leaves out `process`."""
    return config.getoption("--fast") or f"not {tiers.PROCESS}" in (config.option.markexpr or "")


@pytest.hookimpl(tryfirst=True)  # before `-m` selects by marks
def pytest_collection_modifyitems(config, items):
    for item in items:
        if not item.get_closest_marker(tiers.PROCESS) and tiers.starts_a_process(item):
            item.add_marker(tiers.PROCESS)
        if tiers.compares(item):
            item.add_marker(tiers.COMPARES)
    if config.getoption("--fast"):
        slow = [item for item in items if item.get_closest_marker(tiers.PROCESS)
                or item.get_closest_marker(tiers.COMPARES)]
        if slow:
            config.hook.pytest_deselected(items=slow)
            left_out = set(map(id, slow))
            items[:] = [item for item in items if id(item) not in left_out]


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """In the fast tier, a test (its fixtures' set-up and tear-down included)
    cannot start a process unseen: `tiers.guard`."""
    if not _fast(item.config) or item.get_closest_marker(tiers.PROCESS):
        return (yield)
    item.stash[_REFUSED] = []
    with tiers.guard(item.nodeid, item.stash[_REFUSED]):
        return (yield)


_REFUSED = pytest.StashKey[list]()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A refused process fails its test even where the test's code caught the error."""
    report = yield
    refused = item.stash.get(_REFUSED, None)
    if refused:
        if report.passed:
            report.outcome = "failed"
            report.longrepr = refused[0]
        refused.clear()  # reported once, in the phase it happened in
    return report
