"""What the tutorial-script tests share: running a script as its user does (a
fresh process, in its own folder) and reading the lines it changed.

A tutorial's script marks every line changed to run it under tfloop with a
trailing `# tfloop` (issue 31: at most two per tutorial section); lines that
differ only because nothing downloads here are marked otherwise and say so.
"""

import os
import sys

from helpers import REPO, bin_env, run_python

#: Runs the script as `python script.py` would (sys.path[0] its folder,
#: `__main__`), with the engine's INFO lines (the strategy and its replicas)
#: on stderr: the test reads what fit trained on.
_RUNNER = ("import logging, os, runpy, sys; script = sys.argv[1]; sys.argv = sys.argv[1:]; "
           "sys.path.insert(0, os.path.dirname(os.path.abspath(script))); "
           "logging.basicConfig(level=logging.WARNING); "
           "logging.getLogger('tfloop.engine.assembly.run').setLevel(logging.INFO); "
           "runpy.run_path(script, run_name='__main__')")


def run_script(script: str, cwd, *, env: dict | None = None, timeout: float = 400,
               launch: tuple[str, ...] = (), args: tuple[str, ...] = ()):
    """Runs `script` (with its command-line `args`) in `cwd` in a process of
    its own, or with `launch` (bin/launch's flags) once per task of a local
    cluster; returns the CompletedProcess. The process (the launcher, with
    `launch`) is a fork of the binary server (`helpers.run_python`): a
    `python -c` whose TensorFlow is imported but whose runtime has not started,
    as in a fresh interpreter, so the script still sets its devices before
    anything runs (`TFLOOP_TEST_FRESH=1` runs it fresh). The launcher starts
    its workers as a user's launch does, each a fresh `python -c`."""
    if launch:
        command = [os.path.join(REPO, "bin", "launch"), *launch, "--",
                   sys.executable, "-c", _RUNNER, script, *args]
    else:
        command = ["-c", _RUNNER, script, *args]
    return run_python(command, cwd=str(cwd), timeout=timeout, env=bin_env(env or {}))


def changed_lines(script: str) -> list[str]:
    """The lines of `script` marked `# tfloop`: those changed to run it under tfloop."""
    with open(script) as f:
        return [line for line in f.read().splitlines() if line.rstrip().endswith("# tfloop")]


def _without_docstring(text: str) -> list[str]:
    """The script's lines after its module docstring (the example's own
    explanation, which the document it copies does not have)."""
    lines = text.splitlines()
    if lines and lines[0].startswith('"""'):
        one_line = len(lines[0].strip()) > 3 and lines[0].rstrip().endswith('"""')
        end = 0 if one_line else next(i for i in range(1, len(lines))
                                      if lines[i].rstrip().endswith('"""'))
        lines = lines[end + 1:]
        while lines and not lines[0].strip():
            lines = lines[1:]
    return lines


#: The comments that mark a line changed for another reason than tfloop (the
#: document's data downloads, a model made smaller for the test): not counted.
NOT_TFLOOP = ("# local data", "# smaller")


def diff_lines(original: str, script: str) -> list[str]:
    """The lines `script` changed or added against `original` (the
    document's own code, kept in tests/examples/originals/), as `diff` counts
    them: a line replaced, a line added, a line removed (given as `- line`)
    each count once; the script's docstring and the lines marked `NOT_TFLOOP`
    are not counted."""
    import difflib
    with open(original) as f:
        theirs = f.read().splitlines()
    with open(script) as f:
        ours = _without_docstring(f.read())
    changed = []
    for tag, a0, a1, b0, b1 in difflib.SequenceMatcher(None, theirs, ours,
                                                       autojunk=False).get_opcodes():
        if tag in ("replace", "insert"):
            changed += ours[b0:b1]
            changed += [f"- {line}" for line in theirs[a0 + (b1 - b0):a1]]
        elif tag == "delete":
            changed += [f"- {line}" for line in theirs[a0:a1]]
    return [line for line in changed if not line.rstrip().endswith(NOT_TFLOOP)]
