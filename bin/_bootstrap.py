"""Run first by every binary: make `tfloop` importable, or say how in one line.

`bin/train` started by a Python that lacks the project (a plain shell's
`python3`) hands over to the repository's `.venv`, which `./dev` creates.
Standard library only: this runs before anything else can be imported.
"""

import importlib.util
import os
import sys


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:  # a parent package is missing
        return False


if not (_importable("tfloop.engine") and _importable("absl")):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    venv = os.path.join(repo, ".venv")
    venv_python = os.path.join(venv, "bin", "python")
    if os.path.exists(venv_python) and os.path.realpath(sys.prefix) != os.path.realpath(venv):
        # orig_argv: the interpreter's own arguments and the script as started
        # (runpy.run_path has put this file's path in sys.argv[0]).
        os.execv(venv_python, [venv_python, *sys.orig_argv[1:]])
    script = next((arg for arg in sys.orig_argv[1:] if not arg.startswith("-")), "tfloop")
    print(f"{os.path.basename(script)}: error: tfloop and its dependencies are not "
          "installed for this Python; run ./dev train once (it creates .venv), or pip install .",
          file=sys.stderr)
    sys.exit(2)
