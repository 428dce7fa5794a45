"""The fence around private TensorFlow and Keras APIs, for every package.

The project prefers public APIs; where a private one is the only way, it lives
in one module that says why, with a canary test that fails loudly when
TensorFlow moves it. This test keeps it that way everywhere: no other module of
any package (engine, collectives, inputs, models, launch, bench, bin, examples)
imports `tensorflow.python` or Keras's private `keras.src`.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("engine", "collectives", "inputs", "models", "launch", "bench", "bin", "examples")
PRIVATE = ("tensorflow.python", "keras.src")

#: The modules allowed to import private APIs, each with its canary test.
FENCED = {
    "collectives/_tf_private.py": "tests/collectives/test_collectives_tf_private.py",
    "engine/loop/iterators.py": "tests/engine/loop/test_iterators.py",
    "engine/task/user_code.py": "tests/engine/task/test_user_code.py",
}


def _sources():
    for package in PACKAGES:
        for path in sorted((REPO / package).rglob("*")):
            if path.is_file() and (path.suffix == ".py" or package == "bin" and "." not in path.name):
                yield path


def _private_imports(path: Path) -> list[str]:
    try:
        tree = ast.parse(path.read_text(), str(path))
    except SyntaxError:  # a shell script in bin/
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [n for n in names if any(n == p or n.startswith(p + ".") for p in PRIVATE)]


def test_only_the_fenced_modules_import_private_apis():
    offenders = {}
    for path in _sources():
        relative = path.relative_to(REPO).as_posix()
        found = _private_imports(path)
        if found and relative not in FENCED:
            offenders[relative] = found
    assert offenders == {}, ("import private TensorFlow/Keras only in a fenced module "
                             f"(FENCED above, with a canary test): {offenders}")


def test_each_fenced_module_imports_private_apis_and_has_its_canary():
    for module, canary in FENCED.items():
        assert _private_imports(REPO / module), f"{module} no longer needs the fence: drop it"
        assert (REPO / canary).is_file(), f"{module}'s canary {canary} is missing"
