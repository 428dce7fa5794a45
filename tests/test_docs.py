"""The docs cannot drift from the code: `docs/flags.md` is generated from
`RunConfig`, and every link, path and test name the docs cite exists.

`bin/train` defines one flag per `RunConfig` field, with the field's default
and help (`engine.config.option`, `bin/flag_defs.py`), so the flag table is
built from the same fields here and compared with the file. After changing a
field, regenerate it:

    ./dev python tests/test_docs.py > docs/flags.md

No TensorFlow is imported: `engine.config` and `bin.flag_defs` load without it.
"""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FLAGS_DOC = REPO / "docs" / "flags.md"
REGENERATE = "./dev python tests/test_docs.py > docs/flags.md"

#: The guide that explains each section of fields (`engine.config.SECTIONS`);
#: a section not named here gets no link.
GUIDES = {
    "Distribution": "[clusters.md](clusters.md), [collectives.md](collectives.md), [gpu.md](gpu.md)",
    "Model and data": "[data.md](data.md), [your_task.md](your_task.md)",
    "The loop": "[model_dir.md](model_dir.md), [recipes.md](recipes.md)",
    "The recipe": "[recipes.md](recipes.md)",
    "The step": "[recipes.md](recipes.md), [reliability.md](reliability.md#numbers-nan-and-inf-never-reach-a-checkpoint), [performance.md](performance.md#the-speed-flags-bintrain)",
    "Keeping and stopping": "[reliability.md](reliability.md#numbers-nan-and-inf-never-reach-a-checkpoint), [model_dir.md](model_dir.md)",
    "Cluster": "[clusters.md](clusters.md)",
    "Speed and reproducibility": "[performance.md](performance.md#the-speed-flags-bintrain)",
    "Every binary": "[reliability.md](reliability.md)",
}


def _cell(text: str) -> str:
    """Help text as one Markdown table cell: the characters Markdown would
    read as a column, a tag, emphasis or a link are escaped."""
    return re.sub(r"([\\|<>*\[\]`])", r"\\\1", " ".join(str(text).split()))


def _default(value) -> str:
    if isinstance(value, bool):
        return "`true`" if value else "`false`"
    if value == "":
        return '`""`'
    return f"`{value}`"


def _groups() -> dict[str, str]:
    """field name -> its section (`engine.config.SECTIONS`)."""
    from tfloop.engine.config import SECTIONS

    return {name: section for section, names in SECTIONS.items() for name in names}


def flag_rows() -> list[tuple[str, str, object, str]]:
    """(group, name, default, help) of every flag `bin/train` defines: the
    `RunConfig` fields, then the flags `bin/flag_defs.py` defines for every
    binary (`--verbose`)."""
    from absl import flags

    from tfloop.bin import flag_defs
    from tfloop.engine.config import RunConfig

    fields = dataclasses.fields(RunConfig)
    groups = _groups()
    rows = [(groups.get(f.name, "Other"), f.name, f.default, f.metadata["help"]) for f in fields]
    names = {f.name for f in fields}
    shared = flags.FLAGS.flags_by_module_dict().get(flag_defs.__name__, [])
    rows += [("Every binary", f.name, f.default, f.help)
             for f in sorted(shared, key=lambda f: f.name) if f.name not in names]
    return rows


def flags_markdown() -> str:
    """The text of docs/flags.md."""
    lines = [
        "# `bin/train` flags",
        "",
        "<!-- Generated from engine/config.py (RunConfig) by tests/test_docs.py; do not edit.",
        f"     After changing a field: {REGENERATE} -->",
        "",
        "Every flag of `bin/train` is a field of `tfloop.engine.config.RunConfig`",
        "(`run(RunConfig(...))` in Python) with the same name, default and help;",
        "`bin/train --help` prints the same text. A boolean flag is `--name` or",
        "`--noname`. The guides named under each group explain what the flags do",
        "together; [BUILD.md](../BUILD.md) indexes them.",
    ]
    group = None
    for row_group, name, default, help_text in flag_rows():
        if row_group != group:
            group = row_group
            lines += ["", f"## {group}", ""]
            if group in GUIDES:
                lines += [f"Explained in {GUIDES[group]}.", ""]
            lines += ["| flag | default | help |", "|---|---|---|"]
        lines.append(f"| `--{name}` | {_default(default)} | {_cell(help_text)} |")
    return "\n".join(lines) + "\n"


def test_the_flag_table_is_the_one_the_code_generates():
    written = FLAGS_DOC.read_text() if FLAGS_DOC.exists() else ""
    assert written == flags_markdown(), (
        f"docs/flags.md differs from RunConfig's fields; regenerate it: {REGENERATE}")


def test_every_run_config_field_is_in_the_flag_table():
    from tfloop.engine.config import RunConfig

    table = flags_markdown()
    for field in dataclasses.fields(RunConfig):
        assert f"| `--{field.name}` |" in table


# --- links, paths and test names ---------------------------------------------------------

def _documents() -> list[Path]:
    return sorted([REPO / "BUILD.md", REPO / "README.md", REPO / "examples" / "README.md",
                   *(REPO / "docs").glob("*.md")])


def _prose(path: Path) -> str:
    """The file without its fenced code blocks (commands, not links)."""
    return re.sub(r"^```.*?^```", "", path.read_text(), flags=re.M | re.S)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation but - and _
    dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    anchors, seen = set(), {}
    for line in _prose(path).splitlines():
        match = re.match(r"#{1,6} (.+)", line)
        if match:
            slug = _slug(match.group(1))
            count = seen.get(slug, 0)
            seen[slug] = count + 1
            anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _links(path: Path):
    for match in re.finditer(r"\]\(([^)\s]+)\)", _prose(path)):
        target = match.group(1)
        if not re.match(r"[a-z]+:", target):
            yield target


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_reaches_a_file_and_heading(document):
    broken = []
    for target in _links(document):
        file_part, _, anchor = target.partition("#")
        linked = (document.parent / file_part).resolve() if file_part else document
        if not linked.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(f"{target} (no heading #{anchor} in {linked.relative_to(REPO)})")
    assert not broken, f"{document.relative_to(REPO)}: broken links: {broken}"


#: What a checkout makes as it is used (.gitignore): the docs name files in
#: `runs/` that a command writes, not files the repository holds.
_MADE_HERE = {"runs", "build", "tfloop.egg-info", "__pycache__"}


def _top_level() -> set[str]:
    return {p.name for p in REPO.iterdir() if not p.name.startswith((".venv", ".git"))
            and p.name not in _MADE_HERE}


def _test_names() -> set[str]:
    names = set()
    for path in (REPO / "tests").rglob("*.py"):
        names.update(re.findall(r"^\s*(?:async )?def (test_\w+)", path.read_text(), re.M))
    return names


@pytest.mark.parametrize("document", _documents(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_cited_path_and_test_exists(document):
    """`engine/loop/iterators.py`, `tests/engine/...py::test_x`, `test_best.py` or
    `test_x` in backquotes names something that is there: a moved module or a
    renamed test shows here, not in a reader's shell."""
    top, tests, test_files = _top_level(), _test_names(), {
        p.name for p in (REPO / "tests").rglob("test_*.py")}
    missing = []
    for span in re.findall(r"`([^`\s]+)`", _prose(document)):
        path, _, test = span.partition("::")
        if any(c in path for c in "<>*{}$"):
            continue  # a pattern, not a path
        if "/" in path and path.split("/")[0] in top:
            module, _, attribute = path.partition(".")  # tests/helpers.run_bin: a module's name
            if not (REPO / path.rstrip("/")).exists() and not (
                    attribute.isidentifier() and (REPO / f"{module}.py").exists()):
                missing.append(span)
        elif re.fullmatch(r"test_\w+\.py", path) and path not in test_files:
            missing.append(span)
        if re.fullmatch(r"test_\w+", test or path) and (test or path) not in tests:
            missing.append(span)
    assert not missing, f"{document.relative_to(REPO)} cites what is not there: {missing}"


if __name__ == "__main__":
    sys.stdout.write(flags_markdown())
