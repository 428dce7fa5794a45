"""The Launcher's two hooks for `bin/launch --spec` (launch/rehearsal.py): each
task's own variables from `environments`, and `peer_exit_wait_s`, which lets
the survivors of a failed task exit on their own and reports their statuses.
Tiny Python tasks, no TensorFlow: a second or two."""

import io
import re
import sys

import pytest

from helpers import launcher_endings
from tfloop.launch import launcher

#: worker:1 fails at once (status 137, as if killed); worker:0 notices a moment
#: later and exits 138 on its own; its variables say who it is.
_TASK = """
import os, sys, time
import pytest
print("ROLE=" + os.environ["ROLE"], "TF_CONFIG" in os.environ, flush=True)
if os.environ["ROLE"] == "worker:1":
    sys.exit(137)
time.sleep(0.5)
sys.exit(138)
"""


@pytest.mark.process  # the Launcher, in this process, starts the tasks
def test_own_variables_and_the_survivors_statuses():
    seen = []

    def environments(tasks, cluster):
        seen.append(cluster)
        return {task.label: {"ROLE": task.label} for task in tasks}

    config = launcher.LaunchConfig(command=(sys.executable, "-c", _TASK), num_workers=2,
                                   grace_period_s=5, peer_exit_wait_s=30)
    out, err = io.StringIO(), io.StringIO()
    status = launcher.Launcher(config, stdout=out, stderr=err, environments=environments).run()
    # Which of the two the launcher saw end first depends on the scheduler
    # (a stalled poll sees both gone): each task's status is the contract,
    # and the launcher's is that of the one it names first.
    endings = launcher_endings(err.getvalue())
    assert endings == {"worker:1": 137, "worker:0": 138}, err.getvalue()
    first = re.search(r"^launch: after (worker:\d) ", err.getvalue(), re.M)
    assert first and status == endings[first.group(1)], err.getvalue()
    assert len(seen) == 1 and len(seen[0]["worker"]) == 2
    # The hook's variables replace the TF_CONFIG the launcher would write.
    assert "[worker:0] ROLE=worker:0 False" in out.getvalue().splitlines()
    # The survivor's status is reported with its meaning after the first failure's.
    assert re.search(r"^launch: after worker:\d exited with status 13[78]: worker:\d exited with "
                     r"status 13[78] \((restart every task|killed)", err.getvalue(), re.M), \
        err.getvalue()
