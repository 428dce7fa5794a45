"""A test's stand-in for a machine that dies once (tests/bin/test_lost_worker.py).

    python kill_once.py MARKER INDEX WAIT_FOR -- COMMAND...

Runs COMMAND (as bin/launch's task). Worker INDEX, the first time (no MARKER
yet), writes MARKER, runs COMMAND until the file WAIT_FOR exists, then
SIGKILLs it and exits 137, as a task whose machine died (retryable: bin/launch
restarts the cluster). Every other start just runs COMMAND. Bounded: 180 s.
"""

import json
import os
import signal
import subprocess
import sys
import time

marker, index, wait_for = sys.argv[1], int(sys.argv[2]), sys.argv[3]
command = sys.argv[sys.argv.index("--") + 1:]
task = json.loads(os.environ["TF_CONFIG"])["task"]
if task["type"] != "worker" or task["index"] != index or os.path.exists(marker):
    os.execv(sys.executable, [sys.executable, *command])
open(marker, "w").close()
child = subprocess.Popen([sys.executable, *command])
deadline = time.monotonic() + 180
while not os.path.exists(wait_for) and child.poll() is None and time.monotonic() < deadline:
    time.sleep(0.005)
child.send_signal(signal.SIGKILL)
child.wait(timeout=30)
sys.exit(128 + signal.SIGKILL)
