"""The suite's two tiers: tests that start a process, and the fast tier.

A test *starts a process* when it, a fixture it uses, or any function or
class of the suite's own code (`tests/`) they name, directly or through each
other, names `subprocess`, `multiprocessing`, `os.fork`/`os.system`/... (so
`helpers.run_bin`, `helpers.start_bin` and every test-module helper built on
them count). `tests/conftest.py` marks those tests `process` at collection,
so no test file carries the mark by hand unless the process starts inside the
project's own code (the start-up watchdog of `engine/runtime/watchdog.py`,
bench's sweeps): the static reading cannot see there, and the guard below
names such a test the first time the fast tier runs it.

The fast tier (`./dev test --fast`, `pytest --fast`) runs only the tests not
marked: in-process, no binary, no cluster, and none of the in-process tests
that train whole runs to compare them (`compares`, by module: COMPARING_MODULES,
or by the test's own mark). While it runs, starting a process
fails the test with a line naming the missing mark (`guard`): the tier checks
itself, so a new test cannot slip a subprocess into it unseen.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import multiprocessing.process
import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Callable, Iterator

PROCESS = "process"
#: The mark of the in-process tests that train whole runs to compare them.
COMPARES = "compares"

#: Test modules whose tests train whole runs in process to compare them with
#: another run (Keras's fit, one device, an uninterrupted run): each test is
#: seconds to a minute of training, and together they are most of the
#: in-process tier's time. Marked `compares` at collection; the fast tier
#: leaves them out, the whole suite (CI) runs them. A module is listed whole:
#: its cheap tests are few, and a list by module stays readable. A comparing
#: test in a module of mostly cheap ones carries the mark itself
#: (`@pytest.mark.compares`, with a comment saying what it compares).
COMPARING_MODULES = (
    "tests/engine/keras_fit/test_fit.py",
    "tests/engine/keras_fit/test_fit_callbacks.py",
    "tests/engine/keras_fit/test_fit_keras_state.py",
    "tests/engine/keras_fit/test_parity_basics.py",
    "tests/engine/keras_fit/test_parity_keras_objects.py",
    "tests/engine/keras_fit/test_parity_inputs.py",
    "tests/engine/keras_fit/test_parity_matrix.py",
    "tests/engine/keras_fit/test_parity_metrics_and_steps.py",
    "tests/engine/loop/test_distributed_equivalence.py",
    "tests/engine/loop/test_nan_guard.py",
    "tests/engine/loop/test_step_options.py",
    "tests/engine/recipe/test_ema.py",
    "tests/engine/recipe/test_weight_decay.py",
    "tests/engine/run_dir/test_checkpoint_recovery.py",
    "tests/engine/run_dir/test_resume_changes.py",
    "tests/engine/assembly/test_elastic_resume.py",
    "tests/engine/assembly/test_exact_resume.py",
    "tests/engine/assembly/test_run_and_resume.py",
    "tests/examples/test_example_tasks.py",
    "tests/inputs/test_device_cast.py",
    "tests/inputs/test_tfrecord.py",
    "tests/models/test_vision_models.py",
)


def compares(item) -> bool:
    """Whether a collected test is in one of COMPARING_MODULES."""
    return item.nodeid.split("::")[0] in COMPARING_MODULES
TESTS = str(Path(__file__).resolve().parent) + os.sep

#: Modules whose use starts (or manages) processes.
_PROCESS_MODULES = ("subprocess", "multiprocessing", "concurrent.futures.process", "pty")
#: `os` functions that start a process.
_OS_STARTERS = frozenset({
    "fork", "forkpty", "system", "popen", "posix_spawn", "posix_spawnp",
    "spawnl", "spawnle", "spawnlp", "spawnlpe", "spawnv", "spawnve", "spawnvp", "spawnvpe",
    "execl", "execle", "execlp", "execlpe", "execv", "execve", "execvp", "execvpe"})


def _suite_code(function: types.FunctionType) -> bool:
    """Code of the suite's own (this module's guard names what it patches,
    and starts nothing)."""
    filename = function.__code__.co_filename
    return filename.startswith(TESTS) and filename != __file__


def _suite_module(module) -> bool:
    return (getattr(module, "__file__", None) or "").startswith(TESTS)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    """`code` and every code object nested in it (inner functions, lambdas,
    comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _starter(value, names: set[str]) -> bool:
    """Whether `value`, a global a code object names (with `names`, the other
    names it uses, for `os.fork`), starts a process."""
    if value is os:
        return bool(names & _OS_STARTERS)
    try:
        module = value.__name__ if isinstance(value, types.ModuleType) else getattr(
            value, "__module__", None)
    except Exception:  # a lazy module that fails to load, a proxy
        return False
    return isinstance(module, str) and any(
        module == name or module.startswith(name + ".") for name in _PROCESS_MODULES)


def reaches_a_process(value, seen: set[int] | None = None) -> bool:
    """Whether `value` (a test, a fixture, a helper: a function or class of
    the suite's own code) names something that starts a process, directly or
    through the suite's own functions and classes it names."""
    seen = set() if seen is None else seen
    try:
        value = inspect.unwrap(value) if callable(value) else value
    except Exception:  # an object that answers every attribute (a mock)
        return False
    if isinstance(value, (staticmethod, classmethod)):
        value = value.__func__
    if id(value) in seen:
        return False
    seen.add(id(value))
    if isinstance(value, type):  # the suite's own methods only (`_suite_code`)
        return any(
            reaches_a_process(member, seen) for member in vars(value).values()
            if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)))
    if isinstance(value, property):
        return any(reaches_a_process(f, seen) for f in (value.fget, value.fset) if f)
    if isinstance(value, functools.partial):
        return _starter(value.func, set()) or reaches_a_process(value.func, seen)
    if not isinstance(value, types.FunctionType) or not _suite_code(value):
        return False
    scope = value.__globals__
    for code in _codes(value.__code__):
        names = set(code.co_names)
        for name in names:
            found = scope.get(name)
            if found is None:
                # A function's own import (`import subprocess`, `from helpers import run_bin`):
                # the module's name is among the names its code uses.
                found = sys.modules.get(name)
                if found is None or not (_suite_module(found) or _starter(found, names)):
                    continue
            if _starter(found, names):
                return True
            if isinstance(found, types.ModuleType):
                # `helpers.run_bin(...)`: the suite's module, then the names used on it.
                if _suite_module(found) and any(
                        reaches_a_process(getattr(found, attr), seen)
                        for attr in names if hasattr(found, attr)):
                    return True
            elif reaches_a_process(found, seen):
                return True
    return any(reaches_a_process(cell.cell_contents, seen)
               for cell in value.__closure__ or () if _filled(cell))


def _filled(cell) -> bool:
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def starts_a_process(item) -> bool:
    """Whether the collected test `item` starts a process: its function, the
    fixtures it uses, its module's and class's set-up, its parameters."""
    function = getattr(item, "function", None)
    if function is None:
        return False
    parts = [function]
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        parts += [definition.func for definition in definitions]
    for owner in (getattr(item, "module", None), getattr(item, "cls", None)):
        parts += [getattr(owner, name) for name in
                  ("setup_module", "teardown_module", "setup_class", "teardown_class",
                   "setup_method", "teardown_method") if hasattr(owner, name)]
    callspec = getattr(item, "callspec", None)
    if callspec is not None:
        parts += [value for value in callspec.params.values() if callable(value)]
    seen: set[int] = set()
    return any(reaches_a_process(part, seen) for part in parts)


class UnmarkedProcess(AssertionError):
    """A test of the fast tier started a process."""


def _refusal(test: str, what: str) -> str:
    return (f"{test} starts a process ({what}) but is not marked `{PROCESS}`, so the fast tier "
            f"ran it: mark it @pytest.mark.{PROCESS} (the process starts inside the project's "
            f"own code, where tests/tiers.py cannot see), or start it through the suite's own "
            f"helpers (tests/helpers.py run_bin, start_bin), which are marked automatically")


@contextlib.contextmanager
def guard(test: str, refused: list[str]) -> Iterator[None]:
    """While the fast tier runs `test`: anything that would start a process
    raises `UnmarkedProcess` instead, and its message is added to `refused`
    (so the test fails even if its code catches the exception)."""
    def refuse(what: str) -> Callable:
        def refused_call(*args, **kwargs):
            shown = repr(args[1] if what == "subprocess.Popen" and len(args) > 1 else
                         (args[0] if args else ""))[:120]
            message = _refusal(test, f"{what}({shown})")
            refused.append(message)
            raise UnmarkedProcess(message)
        return refused_call

    patched = [(subprocess.Popen, "__init__", "subprocess.Popen"),
               (multiprocessing.process.BaseProcess, "start", "multiprocessing.Process.start")]
    patched += [(os, name, f"os.{name}") for name in sorted(_OS_STARTERS) if hasattr(os, name)]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patched]
    for owner, name, what in patched:
        setattr(owner, name, refuse(what))
    try:
        yield
    finally:
        for owner, name, original in saved:
            setattr(owner, name, original)
