"""The Launcher's two hooks for `bin/launch --spec` (launch/rehearsal.py): each
task's own variables from `environments`, and `peer_exit_wait_s`, which lets
the survivors of a failed task exit on their own and reports their statuses.
Tiny Python tasks, no TensorFlow: a second or two."""

import io
import sys

from tfloop.launch import launcher

#: worker:1 fails at once (status 137, as if killed); worker:0 notices a moment
#: later and exits 138 on its own; its variables say who it is.
_TASK = """
import os, sys, time
print("ROLE=" + os.environ["ROLE"], "TF_CONFIG" in os.environ, flush=True)
if os.environ["ROLE"] == "worker:1":
    sys.exit(137)
time.sleep(0.5)
sys.exit(138)
"""


def test_own_variables_and_the_survivors_statuses():
    seen = []

    def environments(tasks, cluster):
        seen.append(cluster)
        return {task.label: {"ROLE": task.label} for task in tasks}

    config = launcher.LaunchConfig(command=(sys.executable, "-c", _TASK), num_workers=2,
                                   grace_period_s=5, peer_exit_wait_s=30)
    out, err = io.StringIO(), io.StringIO()
    status = launcher.Launcher(config, stdout=out, stderr=err, environments=environments).run()
    assert status == 137, err.getvalue()
    assert len(seen) == 1 and len(seen[0]["worker"]) == 2
    # The hook's variables replace the TF_CONFIG the launcher would write.
    assert "[worker:0] ROLE=worker:0 False" in out.getvalue().splitlines()
    assert ("launch: after worker:1 exited with status 137: worker:0 exited with status 138 "
            "(restart every task from the last checkpoint)") in err.getvalue().splitlines()
