"""docs/reliability.md's inventory of the suite is the one pytest collects
(tests/inventory.py), as docs/flags.md is the table `RunConfig` generates."""

import subprocess
import sys

import inventory
from helpers import REPO, bin_env


def test_the_inventory_in_reliability_md_is_the_suites():
    """The whole suite collected in a process of its own (collection imports
    every test module): a few seconds."""
    result = subprocess.run([sys.executable, "tests/inventory.py"], cwd=REPO, env=bin_env(),
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert inventory.written() == result.stdout, (
        f"docs/reliability.md's inventory differs from the suite; regenerate it: "
        f"{inventory.REGENERATE}")


def test_the_inventory_counts_each_folders_files_tests_and_tiers():
    tests = [("tests/bin/test_a.py::test_1", True, False, False),
             ("tests/bin/test_a.py::test_2", False, False, False),
             ("tests/bin/test_b.py::test_3[x]", False, False, True),
             ("tests/bin/test_b.py::test_5", False, True, False),
             ("tests/test_c.py::test_4", False, False, False)]
    text = inventory.section(tests)
    assert text.startswith(inventory.BEGIN) and text.endswith(inventory.END + "\n")
    # files, tests, start a process, train runs to compare, fast tier, GPU only
    assert "| `tests/bin/` | 2 | 4 | 1 | 1 | 1 | 1 |" in text
    assert "| `tests/` | 1 | 1 | 0 | 0 | 1 | 0 |" in text
    assert "| all | 3 | 5 | 1 | 1 | 2 | 1 |" in text
    assert inventory.REGENERATE in text
