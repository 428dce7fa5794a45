"""`engine.run_dir.layout`: every path under `--model_dir` is named there.

The names of the files under `model_dir` used to be defined in seven modules,
joined with `os.path` in some and `posixpath` in others. One `RunDir` now names
them; the scan below fails when a module of the engine spells one itself.
"""

import ast
from pathlib import Path

import pytest

from tfloop.engine.run_dir import layout

ENGINE = Path(__file__).resolve().parents[3] / "engine"
NAMES = {"run.json", "metrics.json", "evaluations.json", "best.json", "state.json", "summaries",
         "damaged", "train.lock", "evaluate.lock", "diagnostics"}


@pytest.mark.parametrize("root", ["/runs/a", "gs://bucket/runs/a", "ram://runs/a"])
def test_run_dir_names_every_path_with_slashes_for_any_filesystem(root):
    run_dir = layout.RunDir(root)
    assert run_dir.run_json == f"{root}/run.json"
    assert run_dir.metrics_json == f"{root}/metrics.json"
    assert run_dir.evaluations_json == f"{root}/evaluations.json"
    assert run_dir.checkpoint_state == f"{root}/checkpoint"
    assert run_dir.checkpoint(300) == f"{root}/ckpt-300"
    assert run_dir.checkpoint_temp(300) == f"{root}/ckpt-300_temp"
    assert run_dir.checkpoints_glob == f"{root}/ckpt-*"
    assert run_dir.damaged == f"{root}/damaged"
    assert run_dir.lock("train") == f"{root}/train.lock"
    assert run_dir.summaries() == f"{root}/summaries"
    assert run_dir.diagnostics == f"{root}/diagnostics"
    assert run_dir.hang_dump("worker:1", 42, 3) == f"{root}/diagnostics/hang-worker_1-42-3.txt"
    assert run_dir.summaries("eval") == f"{root}/summaries/eval"
    assert run_dir.export(7) == f"{root}/export/7"
    staging = run_dir.export_staging(7)
    assert staging.startswith(f"{root}/export/.7.tmp-")
    assert layout.EXPORT_STAGING.match(staging.rsplit("/", 1)[1])
    assert run_dir.best.root == f"{root}/best"
    assert run_dir.best.best_json == f"{root}/best/best.json"
    assert run_dir.best.checkpoint(5) == f"{root}/best/ckpt-5"
    assert run_dir.directories(export=True, best=True)[-2:] == [f"{root}/export", f"{root}/best"]


def test_the_patterns_match_what_the_engine_and_tensorflow_write():
    assert layout.CHECKPOINT_FILE.match("ckpt-12.index").group(1) == "12"
    assert layout.CHECKPOINT_FILE.match("ckpt-12.data-00000-of-00001")
    assert not layout.CHECKPOINT_FILE.match("ckpt-12_temp")
    assert layout.CHECKPOINT_TEMP.match("ckpt-12_temp")
    assert not layout.EXPORT_STAGING.match("12")


def _spelled_paths(path: Path) -> list[str]:
    """String constants that are a model_dir name, and f-strings that build `ckpt-<n>`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in NAMES:
            found.append(f"{node.lineno}: {node.value!r}")
        elif isinstance(node, ast.JoinedStr):
            text = "".join(str(v.value) for v in node.values if isinstance(v, ast.Constant))
            if "ckpt-" in text and " " not in text:  # a path, not a message that names one
                found.append(f"{node.lineno}: an f-string building ckpt-<step>")
    return found


def test_no_engine_module_but_the_layout_spells_a_model_dir_path():
    offenders = {}
    for path in sorted(ENGINE.rglob("*.py")):
        if path.name == "layout.py":
            continue
        found = _spelled_paths(path)
        if found:
            offenders[path.relative_to(ENGINE.parent).as_posix()] = found
    assert offenders == {}, f"name these through engine.run_dir.layout.RunDir: {offenders}"
