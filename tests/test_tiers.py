"""The two tiers check themselves (tests/tiers.py): what the reading of a
test's code counts as starting a process, and the fast tier's guard.

The sample functions are compiled from text under a file name in `tests/`,
so the reading takes them for the suite's own code, while the tests here
name no process starter themselves and stay in the fast tier.
"""

import pytest

import tiers


def _sample(source: str):
    """`f` of `source`, compiled as if it were a helper of the suite."""
    namespace: dict = {}
    exec(compile(source, tiers.TESTS + "sample_helpers.py", "exec"), namespace)
    return namespace["f"]


@pytest.mark.parametrize("source", [
    "from helpers import run_bin\ndef f():\n    return run_bin('train', '--help')",
    "import helpers\ndef f():\n    return helpers.start_bin('launch')",
    "def f():\n    import subprocess\n    return subprocess.run(['true'])",
    "def f():\n    from helpers import run_bin\n    return run_bin('train')",
    "import os\ndef f():\n    return os.fork()",
    "import multiprocessing\ndef f():\n    multiprocessing.Process(target=print).start()",
    # Through the suite's own functions and classes, however deep.
    "import subprocess\ndef g(): return subprocess.Popen(['true'])\ndef h(): return g()\n"
    "def f():\n    return h()",
    "class Cluster:\n    def start(self):\n        import subprocess\n"
    "        return subprocess.Popen(['true'])\ndef f():\n    return Cluster().start()",
    "import subprocess, functools\ng = functools.partial(subprocess.run, ['true'])\n"
    "def f():\n    return g()",
], ids=["run_bin", "start_bin", "own_import", "own_from_import", "fork", "multiprocessing",
        "nested", "class", "partial"])
def test_what_starts_a_process_is_found(source):
    assert tiers.reaches_a_process(_sample(source))


@pytest.mark.parametrize("source", [
    "import os\ndef f():\n    return os.path.join('a', 'b')",
    "def g(): return 1\ndef f():\n    return [g() for _ in range(2)]",
    "import helpers\ndef f():\n    return helpers.bin_env()",
    "import json\ndef f():\n    return json.dumps({'subprocess_like': 1})",
])
def test_what_does_not_start_a_process_is_left_in_the_fast_tier(source):
    assert not tiers.reaches_a_process(_sample(source))


def test_the_guard_refuses_a_process_naming_the_test_and_the_mark():
    starters = [
        _sample("import subprocess\ndef f():\n    return subprocess.run(['true'])"),
        _sample("import os\ndef f():\n    return os.system('true')"),
        _sample("import multiprocessing\ndef f():\n"
                "    multiprocessing.Process(target=print).start()"),
    ]
    popen_init = _sample("import subprocess\ndef f():\n    return subprocess.Popen.__init__")()
    refused: list[str] = []
    with tiers.guard("tests/test_x.py::test_y", refused):
        for starter in starters:
            with pytest.raises(tiers.UnmarkedProcess) as error:
                starter()
            assert str(error.value).startswith(
                "tests/test_x.py::test_y starts a process (")
            assert "is not marked `process`" in str(error.value)
            assert "@pytest.mark.process" in str(error.value)
    # Recorded even where a test's code would catch the error: conftest fails the test.
    assert len(refused) == 3 and "subprocess.Popen(['true'])" in refused[0]
    # Everything is put back when the test ends.
    assert _sample("import subprocess\ndef f():\n    return subprocess.Popen.__init__")() \
        is popen_init


def test_every_comparing_module_exists_and_its_tests_are_marked(request):
    """The list names files that are there (a renamed module would silently
    come back into the fast tier), and collection marks their tests."""
    repo = tiers.Path(tiers.TESTS).parent
    missing = [name for name in tiers.COMPARING_MODULES if not (repo / name).is_file()]
    assert not missing, f"tests/tiers.py COMPARING_MODULES names files that are gone: {missing}"
    assert len(set(tiers.COMPARING_MODULES)) == len(tiers.COMPARING_MODULES)

    class Item:
        nodeid = "tests/engine/keras_fit/test_parity_matrix.py::test_x[2]"
    assert tiers.compares(Item())
    Item.nodeid = "tests/engine/keras_fit/test_fit_arguments.py::test_x"
    assert not tiers.compares(Item())
    assert not request.node.get_closest_marker(tiers.COMPARES)  # this module is fast
