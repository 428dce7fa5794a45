"""What the tutorial-script tests share: running a script as its user does (a
fresh process, in its own folder) and reading the lines it changed.

A tutorial's script marks every line changed to run it under tfloop with a
trailing `# tfloop` (issue 31: at most two per tutorial section); lines that
differ only because nothing downloads here are marked otherwise and say so.
"""

import os
import subprocess
import sys

from helpers import REPO, bin_env

#: Runs the script as `python script.py` would (sys.path[0] its folder,
#: `__main__`), with the engine's INFO lines (the strategy and its replicas)
#: on stderr: the test reads what fit trained on.
_RUNNER = ("import logging, os, runpy, sys; script = sys.argv[1]; sys.argv = sys.argv[1:]; "
           "sys.path.insert(0, os.path.dirname(os.path.abspath(script))); "
           "logging.basicConfig(level=logging.WARNING); "
           "logging.getLogger('tfloop.engine.assembly.run').setLevel(logging.INFO); "
           "runpy.run_path(script, run_name='__main__')")


def run_script(script: str, cwd, *, env: dict | None = None, timeout: float = 400,
               launch: tuple[str, ...] = ()):
    """Runs `script` in `cwd` in a fresh process, or with `launch` (bin/launch's
    flags) once per task of a local cluster; returns the CompletedProcess."""
    command = [sys.executable, "-c", _RUNNER, script]
    if launch:
        command = [sys.executable, os.path.join(REPO, "bin", "launch"), *launch, "--", *command]
    return subprocess.run(command, cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env=bin_env(env or {}))


def changed_lines(script: str) -> list[str]:
    """The lines of `script` marked `# tfloop`: those changed to run it under tfloop."""
    with open(script) as f:
        return [line for line in f.read().splitlines() if line.rstrip().endswith("# tfloop")]
