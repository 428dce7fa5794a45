"""A test's stand-in for a machine that is gone for good (tests/bin/test_lost_worker.py).

    python lost_worker.py MARKER LOST_INDEX MODEL_DIR -- COMMAND...

Runs COMMAND (as bin/launch's task: its TF_CONFIG says which worker it is).
Worker LOST_INDEX, the first time (no MARKER yet), writes MARKER, runs
COMMAND until MODEL_DIR's first checkpoint exists, then SIGKILLs it and exits
137, as a task whose machine died (retryable: bin/launch restarts the
cluster). Every later start of that worker exits 1 at once with one line,
as a task that cannot come back: bin/launch --min_workers goes on without it.
Every other worker just runs COMMAND. Bounded: 180 s for the checkpoint.
"""

import json
import os
import signal
import subprocess
import sys
import time

marker, lost_index, model_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
command = sys.argv[sys.argv.index("--") + 1:]
task = json.loads(os.environ["TF_CONFIG"])["task"]
if task["type"] != "worker" or task["index"] != lost_index:
    os.execv(sys.executable, [sys.executable, *command])
if os.path.exists(marker):
    print(f"worker {lost_index}: its machine is gone (the test's stand-in)", file=sys.stderr)
    sys.exit(1)
open(marker, "w").close()
child = subprocess.Popen([sys.executable, *command])
deadline = time.monotonic() + 180
while not os.path.exists(os.path.join(model_dir, "checkpoint")) and child.poll() is None:
    if time.monotonic() > deadline:
        break
    time.sleep(0.01)
child.send_signal(signal.SIGKILL)
child.wait(timeout=30)
sys.exit(128 + signal.SIGKILL)
