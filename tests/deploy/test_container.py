"""The container recipes, checked without building them (no docker, no network here).

Each Dockerfile is parsed: its base's Python satisfies `requires-python`, its
install step is the README's own `pip install` with extras that pyproject.toml
defines, everything that step needs is copied and exists (and is not excluded
by .dockerignore), and its entry point is a [project.scripts] program, the one
the job specs under deploy/ run.
"""

import fnmatch
import json
import re
import shlex
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.specifiers import SpecifierSet

REPO = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
#: Dockerfile -> the extras it installs.
RECIPES = {"Dockerfile": set(), "Dockerfile.gpu": {"gpu"}}


def _instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) of a Dockerfile, continuation lines joined."""
    text = re.sub(r"\\\n", " ", "\n".join(
        line for line in path.read_text().splitlines() if not line.lstrip().startswith("#")))
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1].strip())
            for line in text.splitlines() if line.strip()]


def _pip_installs(instructions) -> list[list[str]]:
    """Each `pip install` of a RUN step, as words, up to the next shell operator."""
    installs = []
    for instruction, arguments in instructions:
        if instruction != "RUN":
            continue
        words = shlex.split(arguments)
        for i in range(len(words) - 1):
            if words[i].endswith("pip") and words[i + 1] == "install":
                end = next((j for j in range(i + 2, len(words))
                            if words[j] in ("&&", ";", "||", "|")), len(words))
                installs.append(words[i:end])
    return installs


def _readme_commands() -> set[str]:
    """The `pip install ...` commands the README gives, quoting as written."""
    prose = re.sub(r"```.*?```", "", (REPO / "README.md").read_text(), flags=re.S)
    return {" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)
            if span.startswith("pip install")}


@pytest.mark.parametrize("name", RECIPES)
def test_the_dockerfile_installs_as_the_readme_says(name):
    instructions = _instructions(REPO / name)
    base = next(arguments for instruction, arguments in instructions if instruction == "FROM")
    version = re.fullmatch(r"python:(\d+\.\d+)(?:\.\d+)?(?:-\w+)*", base)
    assert version, f"{name}: FROM {base}: a python:X.Y image"
    assert version.group(1) + ".0" in SpecifierSet(PYPROJECT["project"]["requires-python"])

    installs = _pip_installs(instructions)
    assert len(installs) == 1, installs
    words = [w for w in installs[0] if not w.startswith("-")]  # --no-cache-dir: no other meaning
    assert words[:2] == ["pip", "install"] and len(words) == 3, installs[0]
    target = re.fullmatch(r"\.(?:\[([\w,-]+)\])?", words[2])
    assert target, f"{name} installs {words[2]!r}, not the project (.)"
    extras = set(filter(None, (target.group(1) or "").split(",")))
    assert extras == RECIPES[name]
    assert extras <= set(PYPROJECT["project"]["optional-dependencies"])
    # The README's command, quoted the same way a shell needs it.
    written = "pip install " + (shlex.quote(words[2]) if extras else words[2])
    assert written in _readme_commands(), (written, _readme_commands())
    if "gpu" in extras:
        assert any(dependency.startswith("tensorflow[and-cuda]")
                   for dependency in PYPROJECT["project"]["optional-dependencies"]["gpu"])


@pytest.mark.parametrize("name", RECIPES)
def test_the_dockerfile_copies_what_the_install_needs(name):
    instructions = _instructions(REPO / name)
    copied = []
    for instruction, arguments in instructions:
        if instruction in ("COPY", "ADD"):
            sources = [w for w in shlex.split(arguments) if not w.startswith("--")][:-1]
            copied += [source.rstrip("/") for source in sources]
    for source in copied:
        assert (REPO / source).exists(), f"{name} copies {source}, which is not in the checkout"
    setuptools = PYPROJECT["tool"]["setuptools"]
    needed = {"pyproject.toml", PYPROJECT["project"]["readme"], *setuptools["package-dir"].values()}
    assert needed <= set(copied), f"{name} does not copy {sorted(needed - set(copied))}"
    ignored = [line.strip() for line in (REPO / ".dockerignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")]
    for source in copied:
        assert not any(fnmatch.fnmatch(source, pattern.rstrip("/")) for pattern in ignored), source


@pytest.mark.parametrize("name", RECIPES)
def test_the_entry_point_is_the_programs_the_specs_run(name):
    entry = next(json.loads(arguments) for instruction, arguments in _instructions(REPO / name)
                 if instruction == "ENTRYPOINT")
    scripts = PYPROJECT["project"]["scripts"]
    # PID 1 ignores the signals it has no handler for (the start-up watchdog's
    # exit 138 among them): the image's entry point is an init, then the program.
    assert entry[:2] == ["tini", "--"], entry
    assert entry[2] in scripts and scripts[entry[2]] == "tfloop.bin:train"
    # Each job spec runs a program of the image, under the same init.
    for spec in sorted((REPO / "deploy").glob("*.yaml")):
        commands = [json.loads(found) for found in
                    re.findall(r"command: (\[.*?\])", spec.read_text())]
        assert commands and all(command[:2] == ["tini", "--"] and command[2] in scripts
                                for command in commands), (spec.name, commands)
        documents = list(yaml.safe_load_all(spec.read_text()))  # and it is YAML
        assert documents and all(documents), spec.name  # (data_service.yaml holds several)
