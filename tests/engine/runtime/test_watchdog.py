"""engine/runtime/watchdog.py: a deadline that ends the process in the
retryable class (138 to a shell and to Kubernetes), even where a Python
handler would have swallowed the signal. Plain Python processes, no
TensorFlow: well under a second each. (The real case, a cluster that never
forms: tests/bin/test_multi_worker.py.)"""

import signal
import subprocess
import sys

from helpers import REPO
from tfloop.launch import exit_codes

_BLOCKED = """
import signal, sys, time
from tfloop.engine.runtime import watchdog
signal.signal(signal.SIGUSR1, lambda *a: print("a Python handler ran", flush=True))
with watchdog.deadline(float(sys.argv[1]), "train: error: worker:0 waited for the cluster"):
    time.sleep(float(sys.argv[2]))
print("handler restored:", signal.getsignal(signal.SIGUSR1) is not signal.SIG_DFL, flush=True)
"""


def _run(deadline_s: float, block_s: float):
    return subprocess.run([sys.executable, "-c", _BLOCKED, str(deadline_s), str(block_s)],
                          capture_output=True, text=True, timeout=60, cwd=REPO)


def test_past_the_deadline_the_process_ends_with_138_and_one_line():
    result = _run(0.3, 30)
    assert result.returncode == -signal.SIGUSR1, result.stderr
    assert exit_codes.shell_status(result.returncode) == exit_codes.RESTART == 138
    assert result.stderr.strip().splitlines() == [
        "train: error: worker:0 waited for the cluster "
        "(exit 138: restart every task from the last checkpoint)"]
    assert "a Python handler ran" not in result.stdout


def test_a_block_that_ends_in_time_leaves_the_process_as_it_was():
    result = _run(30, 0.01)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "handler restored: True" and result.stderr == ""
