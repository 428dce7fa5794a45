"""The layer rules (BUILD.md, "Layout") as assertions, read from the source (no imports).

    collectives, models, inputs  ->  nothing of the project (each owns its error type)
    launch                       ->  nothing of the project, and the standard library only
    engine                       ->  collectives, models, inputs, launch
      inside it, rooms on floors (each imports only the floors below it):
        base (option, errors, task/) < runtime < recipe, run_dir < loop
        < observe, strategies (neither imports the other) < config
        (RunConfig: every room's settings composed) < assembly/ < keras_fit/
        (Keras's front door, a user of the assembly) < the public face
        (tfloop/__init__.py, which engine/__init__.py answers for)
    bench                        ->  engine, collectives, models, inputs
    bin                          ->  imported by no one

and no import circle between the modules of one package, nor between any
two of engine's rooms (its top-level entries: config, task/, loop/, ...),
whatever modules carry it: a circle between rooms on one floor (config and
task/ in the base) is not a floor violation, and is still a tangle. Every import
statement counts, including those inside functions: a lazy import is how a
circle hides (`inputs/registry.py` <-> `inputs/tfrecord.py` was one). Names
may be flat (`engine.errors`), under the install namespace
(`tfloop.engine.errors`) or relative (`from .errors import ...`).
"""

from __future__ import annotations

import ast
import sys
import textwrap
from pathlib import Path
from typing import Iterator, Mapping

import pytest

REPO = Path(__file__).resolve().parent.parent
NAMESPACE = "tfloop"

#: package -> the project packages it may import (besides itself).
ALLOWED: Mapping[str, frozenset[str]] = {
    "collectives": frozenset(),
    "models": frozenset(),
    "inputs": frozenset(),
    "launch": frozenset(),
    "engine": frozenset({"collectives", "models", "inputs", "launch"}),
    "bench": frozenset({"engine", "collectives", "models", "inputs"}),
}
#: Packages that may import nothing outside the standard library.
STDLIB_ONLY = frozenset({"launch"})
#: Project top-level names that no package may import.
NEVER_IMPORTED = frozenset({"bin"})


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _without_namespace(name: str) -> str:
    if name == NAMESPACE:
        return ""
    return name[len(NAMESPACE) + 1:] if name.startswith(NAMESPACE + ".") else name


def _from_source(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` statement reads from, namespace stripped."""
    if not node.level:
        return _without_namespace(node.module or "")
    package = module.split(".") if is_package else module.split(".")[:-1]
    base = package[:len(package) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _type_checking_only(tree: ast.AST) -> set[int]:
    """ids of the nodes under `if TYPE_CHECKING:`: imports for annotations only,
    which never run, so they make no circle (and may name a module that
    imports this one)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and (
                isinstance(test, ast.Name) and test.id == "TYPE_CHECKING"
                or isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"):
            skipped.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return skipped


def _imports(path: Path, module: str) -> Iterator[tuple[int, list[str]]]:
    """(line, candidate names) for every import statement in the file, nested
    ones too, except those under `if TYPE_CHECKING:`; `from pkg import x`
    gives `pkg.x` (x may be a submodule) and `pkg`."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    type_checking_only = _type_checking_only(tree)
    for node in ast.walk(tree):
        if id(node) in type_checking_only:
            continue
        if isinstance(node, ast.Import):
            for alias in node.names:
                name = _without_namespace(alias.name)
                if name:
                    yield node.lineno, [name]
        elif isinstance(node, ast.ImportFrom):
            source = _from_source(node, module, is_package)
            for alias in node.names:
                yield node.lineno, [n for n in (
                    f"{source}.{alias.name}" if source else alias.name, source) if n]


def _resolve(candidates: list[str], modules: set[str]) -> str:
    """The most specific project module among `candidates` (or their longest
    known prefix), else the first candidate as written (a third-party name)."""
    for name in candidates:
        parts = name.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in modules:
                return ".".join(parts[:end])
    return candidates[0]


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_violations(root: Path, allowed: Mapping[str, frozenset[str]] = ALLOWED) -> list[str]:
    """Every import under `root`'s packages that breaks a layer rule, and every
    import circle inside one package, as lines naming file, line and module.
    Packages missing under `root` are skipped."""
    root = Path(root)
    files = {
        _module_name(path, root): path
        for package in allowed if (root / package).is_dir()
        for path in sorted((root / package).rglob("*.py"))
    }
    modules = set(files)
    project = set(allowed) | NEVER_IMPORTED
    problems: list[str] = []
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], str] = {}
    for module, path in files.items():
        package = module.split(".")[0]
        rel = path.relative_to(root).as_posix()
        for line, candidates in _imports(path, module):
            target = _resolve(candidates, modules)
            top = target.split(".")[0]
            if top in project and top != package and top not in allowed[package]:
                may = ", ".join(sorted(allowed[package])) or "nothing of the project"
                problems.append(f"{rel}:{line} imports {target}: {package} may import {may}")
            elif (package in STDLIB_ONLY and top not in project and top != "__future__"
                  and top not in sys.stdlib_module_names):
                problems.append(f"{rel}:{line} imports {target}: {package} uses the standard "
                                "library only")
            elif top == package and target in modules and target != module:
                graph.setdefault(module, set()).add(target)
                where.setdefault((module, target), f"{rel}:{line}")
    for cycle in _cycles(graph):
        edges = [where[(a, b)] for a in cycle for b in cycle if (a, b) in where]
        problems.append(f"import circle {' <-> '.join(cycle)} ({', '.join(edges)})")
    return problems


# --- The repository. ---


def test_the_packages_keep_their_layers_and_have_no_import_circles():
    problems = layer_violations(REPO)
    assert not problems, "layer rules broken (see tests/test_layers.py):\n" + "\n".join(problems)


def test_the_repository_check_sees_every_library():
    """Guards the guard: an empty scan would pass any rule."""
    for package in ("engine", "collectives", "models", "inputs"):
        assert (REPO / package / "__init__.py").is_file(), package


#: engine's rooms, bottom up: each may import its own room and those listed.
ENGINE_BASE = frozenset({"option", "errors", "task"})
ENGINE_FLOORS: Mapping[str, frozenset[str]] = {
    "base": frozenset(),
    "runtime": frozenset({"base"}),
    "recipe": frozenset({"base", "runtime"}),
    "run_dir": frozenset({"base", "runtime"}),
    "loop": frozenset({"base", "runtime", "recipe", "run_dir"}),
    "observe": frozenset({"base", "runtime", "recipe", "run_dir", "loop"}),
    # Beside observe, not above it: the assembly builds the clock the trainer
    # times its loops with (issue 41), so a strategy reads nothing of observe.
    "strategies": frozenset({"base", "runtime", "recipe", "run_dir", "loop"}),
    "config": frozenset({"base", "runtime", "recipe", "run_dir", "loop", "observe",
                         "strategies"}),
    "assembly": frozenset({"base", "runtime", "recipe", "run_dir", "loop", "observe",
                           "strategies", "config"}),
    "keras_fit": frozenset({"base", "runtime", "recipe", "run_dir", "loop", "observe",
                            "strategies", "config", "assembly"}),
    "face": frozenset({"base", "runtime", "recipe", "run_dir", "loop", "observe",
                       "strategies", "config", "assembly", "keras_fit"}),
}


def _room(module: str) -> str:
    """engine.loop.trainer -> loop; engine.option, engine.task.plugin -> base;
    engine.assembly.run -> assembly; engine.keras_fit.fit -> keras_fit."""
    parts = module.split(".")
    if len(parts) < 2:
        return "face"  # engine/__init__.py: the public face
    if parts[1] in ENGINE_FLOORS:
        return parts[1]
    return "base" if parts[1] in ENGINE_BASE else "assembly"


def room_violations(root: Path) -> list[str]:
    """Every import inside `root/engine` that reaches a room above its own."""
    engine = Path(root) / "engine"
    files = {_module_name(path, root): path for path in sorted(engine.rglob("*.py"))}
    modules = set(files)
    problems = []
    for module, path in files.items():
        room = _room(module)
        for line, candidates in _imports(path, module):
            target = _resolve(candidates, modules)
            if target not in modules or target == "engine":
                continue
            other = _room(target)
            if other != room and other not in ENGINE_FLOORS[room]:
                problems.append(f"{path.relative_to(root).as_posix()}:{line} imports {target}: "
                                f"{room} may import {', '.join(sorted(ENGINE_FLOORS[room])) or 'only itself'}")
    return problems


def _entry(module: str) -> str:
    """engine's top-level entry a module belongs to: engine.task.plugin -> task,
    engine.config -> config, engine -> engine (the public face)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def room_circles(root: Path) -> list[str]:
    """Every import circle between engine's top-level entries (rooms), each
    with the import lines that close it."""
    engine = Path(root) / "engine"
    files = {_module_name(path, root): path for path in sorted(engine.rglob("*.py"))}
    modules = set(files)
    graph: dict[str, set[str]] = {}
    where: dict[tuple[str, str], list[str]] = {}
    for module, path in files.items():
        for line, candidates in _imports(path, module):
            target = _resolve(candidates, modules)
            if target not in modules or _entry(target) == _entry(module):
                continue
            edge = (_entry(module), _entry(target))
            graph.setdefault(edge[0], set()).add(edge[1])
            where.setdefault(edge, []).append(
                f"{path.relative_to(root).as_posix()}:{line} imports {target}")
    return [f"import circle between rooms {' <-> '.join(cycle)} ("
            + "; ".join(where[(a, b)][0] for a in cycle for b in cycle if (a, b) in where) + ")"
            for cycle in _cycles(graph)]


def test_no_import_circle_between_the_engine_rooms():
    circles = room_circles(REPO)
    assert not circles, "import circles between engine rooms (see tests/test_layers.py):\n" + \
        "\n".join(circles)


def test_a_circle_between_two_rooms_on_one_floor_fails(tmp_path):
    """option and task/ share the base floor, so no floor rule sees a circle
    between them; the room rule does, even through a lazy import and
    modules that make no circle of their own."""
    root = _tree(tmp_path, {
        "engine/option.py": "def load():\n    from engine.task import losses\n",
        "engine/task/losses.py": "",
        "engine/task/plugin.py": "from engine import option\n",
        "engine/loop/trainer.py": "from engine.task import plugin\n",
    })
    assert room_violations(root) == [] and layer_violations(root) == []
    circles = room_circles(root)
    assert circles == ["import circle between rooms option <-> task (engine/option.py:2 imports "
                       "engine.task.losses; engine/task/plugin.py:1 imports engine.option)"], circles


def test_keras_fit_stands_above_the_assembly(tmp_path):
    """fit uses run(); the assembly never imports keras_fit (issue 32: the
    circle they made was invisible while both were filed as one room)."""
    root = _tree(tmp_path, {
        "engine/assembly/run.py": "from engine.keras_fit import fit_task\n",
        "engine/keras_fit/fit_task.py": "",
        "engine/keras_fit/fit.py": "from engine.assembly.run import run\n",
    })
    problems = room_violations(root)
    assert len(problems) == 1 and problems[0].startswith(
        "engine/assembly/run.py:1 imports engine.keras_fit.fit_task: assembly may import"), problems
    assert room_circles(root) == [
        "import circle between rooms assembly <-> keras_fit (engine/assembly/run.py:1 imports "
        "engine.keras_fit.fit_task; engine/keras_fit/fit.py:1 imports engine.assembly.run)"]


def test_the_engine_rooms_keep_their_floors():
    problems = room_violations(REPO)
    assert not problems, "engine room floors broken (see tests/test_layers.py):\n" + "\n".join(
        problems)


def test_the_engine_has_its_rooms_and_a_short_top_level():
    """A newcomer finds the room for a change from the tree: at most 13
    entries at engine/'s top: the six rooms, the base (option, errors and
    task/: how a setting is declared, the errors, the user's plug-in),
    config (every room's settings composed: RunConfig), the assembly (plan,
    parts, runner, run, serving) and keras_fit/ above it (Keras's front door)."""
    entries = sorted(p.name for p in (REPO / "engine").iterdir() if p.name != "__pycache__")
    assert len(entries) <= 13, entries
    for room in ENGINE_FLOORS:
        if room not in ("base", "config", "face"):
            assert (REPO / "engine" / room / "__init__.py").is_file(), room


def test_engine_tests_do_not_import_the_bench_tool():
    offenders = []
    for path in sorted((REPO / "tests" / "engine").rglob("*.py")):
        for line, candidates in _imports(path, "tests"):
            if any(c.split(".")[0] == "bench" for c in candidates):
                offenders.append(f"{path.relative_to(REPO).as_posix()}:{line}")
    assert offenders == [], offenders


def test_a_room_that_imports_a_room_above_it_fails(tmp_path):
    root = _tree(tmp_path, {
        "engine/errors.py": "",
        "engine/assembly/run.py": "from engine.loop import trainer\n",
        "engine/loop/trainer.py": "from engine.recipe import ema\nfrom engine import errors\n",
        "engine/recipe/ema.py": "from engine.loop import contracts\n",
        "engine/loop/contracts.py": "",
    })
    problems = room_violations(root)
    assert len(problems) == 1 and problems[0].startswith("engine/recipe/ema.py:1 imports "
                                                         "engine.loop.contracts: recipe may import"), problems


def test_a_strategy_that_imports_observe_fails(tmp_path):
    """The assembly builds the clock and hands it to the trainer: a strategy
    that builds one (imports observe) breaks the rule."""
    root = _tree(tmp_path, {
        "engine/errors.py": "",
        "engine/strategies/spec.py": "from engine.observe import clock\nfrom engine.loop import trainer\n",
        "engine/observe/clock.py": "from engine.loop import contracts\n",
        "engine/loop/trainer.py": "",
        "engine/loop/contracts.py": "",
    })
    problems = room_violations(root)
    assert len(problems) == 1 and problems[0].startswith(
        "engine/strategies/spec.py:1 imports engine.observe.clock: strategies may import"), problems


# --- The checker, on synthetic trees. ---


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
        for parent in path.relative_to(root).parents:
            if str(parent) != "." and not (root / parent / "__init__.py").exists():
                (root / parent / "__init__.py").write_text("")
    return root


CLEAN = {
    "engine/errors.py": "from inputs.errors import InputError\nimport collectives\n",
    "engine/assembly/run.py": "from engine import errors\nimport launch.tf_config\n",
    "inputs/errors.py": "class InputError(ValueError):\n    pass\n",
    "inputs/pipeline.py": "import tensorflow as tf\nfrom inputs.errors import InputError\n",
    "collectives/interface.py": "import abc\n",
    "launch/tf_config.py": "import json\nimport os\nfrom launch import errors\n",
    "launch/errors.py": "",
    "bench/timing.py": "import numpy\nfrom engine import run\nimport collectives\n",
}


def test_a_tree_that_keeps_the_rules_passes(tmp_path):
    assert layer_violations(_tree(tmp_path, CLEAN)) == []


def test_absent_packages_are_skipped(tmp_path):
    only = {k: v for k, v in CLEAN.items() if k.startswith(("engine/", "inputs/", "collectives/"))}
    assert layer_violations(_tree(tmp_path, only)) == []


@pytest.mark.parametrize("statement", [
    "from engine.errors import ConfigError",
    "import engine.errors",
    "from engine import errors",
    "import engine",
    "from tfloop.engine.errors import ConfigError",
    "import tfloop.engine.errors",
    "from tfloop import engine",
    "def lazy():\n    from engine.errors import ConfigError",
])
def test_an_upward_import_from_inputs_fails(tmp_path, statement):
    tree = _tree(tmp_path, {**CLEAN, "inputs/pipeline.py": "import tensorflow\n" + statement + "\n"})
    problems = layer_violations(tree)
    assert len(problems) == 1, problems
    assert problems[0].startswith("inputs/pipeline.py:") and " imports engine" in problems[0]
    assert "inputs may import nothing of the project" in problems[0]


@pytest.mark.parametrize("path, statement, says", [
    ("models/registry.py", "from inputs import splits", "models may import nothing"),
    ("collectives/auto.py", "import models", "collectives may import nothing"),
    ("collectives/auto.py", "from bench import timing", "collectives may import nothing"),
    ("engine/assembly/run.py", "from bench import timing", "engine may import collectives, inputs, "
                                                  "launch, models"),
    ("bench/timing.py", "import launch", "bench may import collectives, engine, inputs, models"),
    ("launch/tf_config.py", "from engine import run", "launch may import nothing"),
    ("launch/tf_config.py", "import tensorflow as tf", "launch uses the standard library only"),
    ("launch/tf_config.py", "def f():\n    import keras", "launch uses the standard library only"),
    ("inputs/pipeline.py", "import bin", "inputs may import nothing"),
])
def test_sideways_and_upward_imports_fail(tmp_path, path, statement, says):
    tree = _tree(tmp_path, {**CLEAN, path: statement + "\n"})
    problems = layer_violations(tree)
    assert len(problems) == 1 and path in problems[0] and says in problems[0], problems


def test_a_relative_import_is_resolved(tmp_path):
    tree = _tree(tmp_path, {**CLEAN, "inputs/sub/reader.py": "from ...engine import errors\n",
                            "inputs/sub/ok.py": "from .. import errors\nfrom . import reader\n"})
    problems = layer_violations(tree)
    assert len(problems) == 1 and problems[0].startswith("inputs/sub/reader.py:1 imports engine")


def test_an_import_circle_inside_a_package_fails_even_when_lazy(tmp_path):
    tree = _tree(tmp_path, {
        **CLEAN,
        "inputs/registry.py": "from inputs import tfrecord\n",
        "inputs/tfrecord.py": "import os\n\ndef convert():\n    from inputs import registry\n",
    })
    problems = layer_violations(tree)
    assert problems == ["import circle inputs.registry <-> inputs.tfrecord "
                        "(inputs/registry.py:1, inputs/tfrecord.py:4)"]


def test_a_longer_circle_under_the_namespace_fails(tmp_path):
    tree = _tree(tmp_path, {
        **CLEAN,
        "engine/a.py": "from tfloop.engine import b\n",
        "engine/b.py": "import tfloop.engine.c\n",
        "engine/c.py": "from .a import thing\n",
    })
    problems = layer_violations(tree)
    assert len(problems) == 1 and problems[0].startswith(
        "import circle engine.a <-> engine.b <-> engine.c"), problems


def test_imports_for_annotations_only_make_no_circle(tmp_path):
    root = _tree(tmp_path, {
        "bench/report.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n"
                           "    from bench.training import Result\n",
        "bench/training.py": "from bench import report\n",
    })
    assert layer_violations(root) == []

