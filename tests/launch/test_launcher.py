"""bin/launch and launch.launcher, with tiny stand-in tasks instead of training.

Each stand-in is a short Python script (see `_script`) that reads its
TF_CONFIG and writes what the test needs into a folder: its pid, the pids of
children it started, markers. Every wait is bounded; a launcher that hangs
fails the test through the subprocess timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tfloop.launch import launcher, tf_config
from tfloop.launch.launcher import LaunchConfig, LaunchError
from tfloop.launch.tf_config import Role
from helpers import REPO, assert_one_line_error, process_alive, run_bin

_PREAMBLE = """\
import json, os, signal, subprocess, sys, time
CONFIG = json.loads(os.environ["TF_CONFIG"])
TYPE, INDEX = CONFIG["task"]["type"], CONFIG["task"]["index"]
NAME = TYPE if TYPE == "evaluator" else f"{TYPE}{INDEX}"
OUT = sys.argv[1]

def record(name, text):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        f.write(str(text))
    os.replace(path + ".tmp", path)

def wait_for(*names, timeout=20):
    deadline = time.monotonic() + timeout
    while not all(os.path.exists(os.path.join(OUT, n)) for n in names):
        if time.monotonic() > deadline:
            sys.exit(f"{NAME}: timed out waiting for {names}")
        time.sleep(0.02)
"""


_LINE = re.compile(r"^\[([a-z]+(?::\d+)?)\] (.*)$")


def _script(tmp_path, body: str) -> list[str]:
    """The command after `--`: this interpreter on a stand-in task script."""
    path = tmp_path / "task.py"
    path.write_text(_PREAMBLE + textwrap.dedent(body))
    return [sys.executable, str(path), str(tmp_path)]


def _launch(*args: str, timeout: float = 60, env: dict | None = None):
    """`bin/launch args...` run to its end (a fresh interpreter: helpers.WITHOUT_TENSORFLOW)."""
    return run_bin("launch", *args, timeout=timeout, env=env)


def _pids(tmp_path) -> dict[str, int]:
    return {p.stem: int(p.read_text()) for p in tmp_path.glob("*.pid")}


def _wait_for_pids(tmp_path, *names: str) -> dict[str, int]:
    """The pids the stand-ins record, once each of `names` has (at most 20 s)."""
    deadline = time.monotonic() + 20
    while len(_pids(tmp_path)) < len(names) and time.monotonic() < deadline:
        time.sleep(0.05)
    pids = _pids(tmp_path)
    assert sorted(pids) == sorted(names)
    return pids


@contextlib.contextmanager
def _started(command: list[str], **popen_args):
    """`command` running with piped output; killed on the way out if the test
    left it running."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, **popen_args)
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)


def _assert_all_gone(pids: dict[str, int], timeout: float = 5) -> None:
    # Orphaned grandchildren are reaped by init, which may take a moment.
    deadline = time.monotonic() + timeout
    while any(process_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert {name: pid for name, pid in pids.items() if process_alive(pid)} == {}


def _prefixed(stream: str) -> list[tuple[str, str]]:
    return [m.groups() for m in map(_LINE.match, stream.splitlines()) if m]


# -- the library: plans, ports, TF_CONFIG ------------------------------------------------


def test_plan_cluster_orders_and_names_tasks():
    assert launcher.plan_cluster(num_workers=2) == [Role("worker", 0), Role("worker", 1)]
    tasks = launcher.plan_cluster(num_workers=2, chief=True, num_ps=1, evaluator=True)
    assert [t.label for t in tasks] == ["chief:0", "worker:0", "worker:1", "ps:0", "evaluator"]
    assert [t.is_training for t in tasks] == [True, True, True, False, False]
    assert [t.is_member for t in tasks] == [True, True, True, True, False]


def test_tf_configs_pass_the_engines_own_parser():
    for chief in (False, True):
        tasks = launcher.plan_cluster(num_workers=2, chief=chief, num_ps=1, evaluator=True)
        members = [task for task in tasks if task.is_member]
        cluster = tf_config.cluster_spec(tasks, range(2000, 2000 + len(members)))
        for task in tasks:
            role = tf_config.parse(json.dumps(tf_config.tf_config_for(task, cluster)))
            assert (role.task_type, role.task_index) == (task.task_type, task.task_index)
            assert role.is_chief == (task == (Role("chief") if chief else Role("worker", 0)))


def test_pick_free_ports_are_distinct_and_free():
    import socket

    ports = launcher.pick_free_ports(5)
    assert len(set(ports)) == 5
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))


def test_exit_status_of_signals():
    assert launcher.exit_status(3) == 3
    assert launcher.exit_status(-9) == 137
    assert launcher.describe_exit(-9) == "died with signal 9 (SIGKILL)"
    assert launcher.describe_exit(3) == "exited with status 3"


@pytest.mark.parametrize("kwargs, message", [
    ({"num_workers": 0}, r"--num_workers \(0\) must be an integer from 1 to 256"),
    ({"num_workers": 100000}, r"--num_workers \(100000\) must be an integer from 1 to 256"),
    ({"num_workers": 200, "num_ps": 100}, "300 tasks is more than the 256"),
    ({"max_restarts": -1}, r"--max_restarts \(-1\) must be an integer from 0 to 1000"),
    ({"max_restarts": 10**9}, r"--max_restarts \(1000000000\)"),
    ({"num_ps": -2}, r"--num_ps \(-2\)"),
    ({"grace_period_s": -1.0}, r"--grace_period \(-1.0\)"),
    ({"evaluator_timeout_s": 1e12}, r"--evaluator_timeout \(1000000000000.0\) must be a number "
                                    "of seconds from 0 to 604800"),
    ({"command": ()}, "missing command"),
    ({"command": ("no-such-program-xyz",)}, "'no-such-program-xyz' not found on PATH"),
])
def test_launch_config_rejects_bad_input(kwargs, message):
    with pytest.raises(LaunchError, match=message):
        LaunchConfig(**{"command": (sys.executable,), **kwargs})


# -- bin/launch end to end --------------------------------------------------------------


def test_every_task_gets_its_own_tf_config(tmp_path):
    command = _script(tmp_path, """
        print(json.dumps({"config": CONFIG, "stdin": sys.stdin.read(),
                          "unbuffered": os.environ.get("PYTHONUNBUFFERED"),
                          "own_group": os.getpgid(0) == os.getpid()}))
        print("to stderr", file=sys.stderr)
        record(NAME + ".done", 1)
        # Like real training, the chief and workers finish only after their ps has
        # served (the launcher stops ps tasks as soon as training ends), and with
        # ps tasks the chief's exit ends training (it coordinates the workers).
        if TYPE in ("chief", "worker"):
            wait_for("ps0.done")
        if TYPE == "chief":
            wait_for("worker0.done", "worker1.done")
    """)
    result = _launch("--num_workers=2", "--chief", "--num_ps=1", "--evaluator", "--", *command)
    assert result.returncode == 0, result.stderr
    seen = {role: json.loads(text) for role, text in _prefixed(result.stdout)}
    assert sorted(seen) == ["chief:0", "evaluator", "ps:0", "worker:0", "worker:1"]
    assert sorted(role for role, _ in _prefixed(result.stderr)) == sorted(seen)

    cluster = seen["chief:0"]["config"]["cluster"]
    assert sorted(cluster) == ["chief", "ps", "worker"]  # no evaluator job
    assert [len(cluster[job]) for job in ("chief", "worker", "ps")] == [1, 2, 1]
    addresses = [a for job in cluster.values() for a in job]
    assert all(re.fullmatch(r"localhost:\d+", a) for a in addresses), addresses
    assert len(set(addresses)) == len(addresses)
    for role, report in seen.items():
        task_type, _, index = role.partition(":")
        assert report["config"] == {"cluster": cluster,
                                    "task": {"type": task_type, "index": int(index or 0)}}
        assert report["stdin"] == "" and report["unbuffered"] == "1" and report["own_group"]


def test_failing_worker_stops_the_others(tmp_path):
    command = _script(tmp_path, """
        record(NAME + ".pid", os.getpid())
        if NAME == "worker1":
            wait_for("worker0.pid", "chief0.pid")
            print("worker 1 gives up", file=sys.stderr)
            sys.exit(3)
        time.sleep(60)
    """)
    start = time.monotonic()
    result = _launch("--num_workers=2", "--chief", "--", *command)
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - start < 20
    assert "[worker:1] worker 1 gives up" in result.stderr
    assert ("launch: worker:1 exited with status 3 (exit 3: trained, but its product was lost): "
            "a failure a restart cannot fix; stopping the cluster") in result.stderr
    assert "Traceback" not in result.stderr
    _assert_all_gone(_pids(tmp_path))


def test_cluster_restarts_with_fresh_ports_after_a_retryable_failure(tmp_path):
    """138 (exit_codes.RESTART: bin/train's status for a lost peer) restarts
    the cluster, with fresh ports."""
    command = _script(tmp_path, """
        print(json.dumps(CONFIG["cluster"]))
        if NAME == "worker1" and not os.path.exists(os.path.join(OUT, "failed-once")):
            record("failed-once", "")
            sys.exit(138)
    """)
    result = _launch("--num_workers=2", "--max_restarts=1", "--", *command)
    assert result.returncode == 0, result.stderr
    assert ("worker:1 exited with status 138 (exit 138: restart every task from the last "
            "checkpoint): retryable; restarting the cluster (1/1)") in result.stderr
    clusters = [text for role, text in _prefixed(result.stdout) if role == "worker:1"]
    assert len(clusters) == 2 and clusters[0] != clusters[1]


@pytest.mark.parametrize("status, meaning", [
    (1, "failed: a restart cannot fix it"),  # a NaN stop, a full disk, an InternalError, a bug
    (2, "a mistake in the request"),
    (3, "trained, but its product was lost"),
])
def test_a_permanent_status_is_not_restarted(tmp_path, status, meaning):
    """Below 128 (exit_codes.retryable): the cluster stops at once with that
    status, whatever --max_restarts says. (Before, only 3 was; a NaN stop's 1
    restarted the cluster into the same NaN.)"""
    command = _script(tmp_path, f"""
        record(f"started-{{NAME}}-{{time.time()}}", "")
        if NAME == "worker1":
            sys.exit({status})
        time.sleep(60)
    """)
    result = _launch("--num_workers=2", "--max_restarts=2", "--", *command)
    assert result.returncode == status, result.stderr
    assert (f"worker:1 exited with status {status} (exit {status}: {meaning}): a failure a "
            f"restart cannot fix; stopping the cluster (not restarting); exit status {status}"
            ) in result.stderr
    assert "restarting" not in result.stderr.replace("not restarting", "")
    assert len([p for p in os.listdir(tmp_path) if p.startswith("started-worker1")]) == 1


def test_signal_death_is_retryable_until_restarts_run_out(tmp_path):
    command = _script(tmp_path, """
        if NAME == "worker1":
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)
    """)
    result = _launch("--num_workers=2", "--max_restarts=1", "--", *command)
    assert result.returncode == 128 + 9, result.stderr
    said = ("worker:1 died with signal 9 (SIGKILL) (exit 137: killed by SIGKILL; restart every "
            "task from the last checkpoint): retryable")
    assert result.stderr.count(f"{said}; restarting the cluster (1/1)") == 1
    assert (f"{said}, but stopping the cluster (after 1 restart(s)); exit status 137"
            in result.stderr)


class _Ended:
    """A stand-in for launcher._Proc that has ended with `returncode`."""

    def __init__(self, label: str, returncode):
        task_type, index = label.split(":")
        self.task = Role(task_type, int(index))
        self.returncode = returncode

    def poll(self):
        return self.returncode

    def drain(self, timeout):
        pass


def test_the_permanent_failure_decides_whichever_was_seen_first(tmp_path):
    """A task that fails for good makes its peers exit 138 ("lost the cluster")
    a moment later; if the launcher's poll saw a peer's 138 first, the cause's
    status still decides: no restart into the same failure."""
    run = launcher.Launcher(LaunchConfig(command=(sys.executable,), num_workers=3),
                            env={"TF_NUM_INTRAOP_THREADS": "1"})
    lost, cause, running = _Ended("worker:0", 138), _Ended("worker:1", 1), _Ended("worker:2", None)
    run._procs = [lost, cause, running]
    assert run._deciding(lost) is cause
    run._procs = [lost, _Ended("worker:1", -9), running]
    assert run._deciding(lost) is lost  # every ended one retryable: the first seen



@pytest.mark.parametrize("chief_job", [False, True], ids=["worker0", "chief"])
def test_the_chiefs_own_failure_never_shrinks_the_cluster(chief_job):
    """`--min_workers` called the chief's full disk (exit 1, `RunFailure`) a
    lost machine and retrained on fewer workers into the same full disk
    (issue 38); the chief's failure is the run's: no worker is left out."""
    config = LaunchConfig(command=(sys.executable,), num_workers=3, chief=chief_job,
                          min_workers=2, max_restarts=2)
    run = launcher.Launcher(config, env={"TF_NUM_INTRAOP_THREADS": "1"})
    chief = _Ended("chief:0" if chief_job else "worker:0", 1)
    workers = [_Ended(f"worker:{i}", None) for i in range(0 if chief_job else 1, 3)]
    run._procs = [chief, *workers]
    assert run.lost_worker(chief) is None
    # Another worker alone failing so is still a machine that is gone.
    gone = _Ended("worker:2", 1)
    run._procs = [_Ended(chief.task.label, None), _Ended("worker:1", None), gone]
    assert run.lost_worker(gone) == "worker:2"

def test_exit_classes_of_the_one_table():
    from tfloop.launch import exit_codes

    assert [s for s in (0, 1, 2, 3, 130, 137, 138, 143) if exit_codes.retryable(s)] == [
        130, 137, 138, 143]
    assert exit_codes.shell_status(-10) == exit_codes.RESTART  # SIGUSR1: the watchdog's
    assert exit_codes.describe(138) == "exit 138: restart every task from the last checkpoint"
    assert exit_codes.describe(137) == ("exit 137: killed by SIGKILL; restart every task from "
                                        "the last checkpoint")
    assert exit_codes.describe(1) == "exit 1: failed: a restart cannot fix it"


def test_ps_tasks_are_stopped_once_training_succeeds(tmp_path):
    command = _script(tmp_path, """
        record(NAME + ".pid", os.getpid())
        if TYPE == "ps":
            time.sleep(60)  # a server: never exits on its own
        wait_for("ps0.pid", "ps1.pid")
    """)
    start = time.monotonic()
    result = _launch("--num_workers=2", "--num_ps=2", "--", *command)
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - start < 20
    assert "stopping the ps tasks" in result.stderr
    _assert_all_gone(_pids(tmp_path))


def test_launcher_waits_for_the_evaluator(tmp_path):
    command = _script(tmp_path, """
        if TYPE == "evaluator":
            time.sleep(0.5)
            print("evaluated the last checkpoint")
    """)
    result = _launch("--num_workers=1", "--evaluator", "--", *command)
    assert result.returncode == 0, result.stderr
    assert "[evaluator] evaluated the last checkpoint" in result.stdout


def test_evaluator_that_outlives_its_timeout_is_stopped(tmp_path):
    command = _script(tmp_path, """
        record(NAME + ".pid", os.getpid())
        if TYPE == "evaluator":
            time.sleep(60)
    """)
    result = _launch("--num_workers=1", "--evaluator", "--evaluator_timeout=0.5", "--", *command)
    assert result.returncode == launcher.EXIT_TIMEOUT, result.stderr
    assert "evaluator still running" in result.stderr
    _assert_all_gone(_pids(tmp_path))


def test_ctrl_c_stops_every_task_and_its_children(tmp_path):
    command = _script(tmp_path, """
        if NAME == "worker0":
            # Deaf to SIGINT and SIGTERM: only the launcher's SIGKILL ends it.
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            record("grandchild.pid", child.pid)
        record(NAME + ".pid", os.getpid())
        time.sleep(60)
    """)
    with _started([sys.executable, os.path.join(REPO, "bin", "launch"), "--num_workers=2",
                   "--grace_period=1", "--", *command]) as proc:
        pids = _wait_for_pids(tmp_path, "grandchild", "worker0", "worker1")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stderr
    assert "launch: got SIGINT; stopping every task" in stderr
    assert "[worker:1] KeyboardInterrupt" in stderr  # the SIGINT was forwarded
    assert not [line for line in stderr.splitlines() if line.startswith("Traceback")], stderr
    _assert_all_gone(pids)


@pytest.mark.parametrize("args, message", [
    ((), "missing command after '--'"),
    (("--",), "missing command after '--'"),
    (("--num_workers=0", "--", "true"), "--num_workers (0) must be an integer from 1 to 256"),
    (("--num_workers=100000", "--", "true"), "--num_workers (100000) must be an integer from 1"),
    (("--max_restarts=-1", "--", "true"), "--max_restarts (-1) must be an integer from 0"),
    (("--", "no-such-program-xyz"), "'no-such-program-xyz' not found on PATH"),
    (("--", "./no/such/file"), "'./no/such/file' does not exist"),
    (("--num_wrkers=2", "--", "true"), "Unknown command line flag 'num_wrkers'"),
    (("bin/train", "--", "true"), "unexpected argument 'bin/train' before '--'"),
])
def test_bad_input_is_one_line_and_exit_2(args, message):
    result = _launch(*args, timeout=30)
    assert result.returncode == 2
    assert result.stderr.startswith("launch: error:"), result.stderr
    assert_one_line_error(result, contains=message)


def test_help_is_not_an_error_and_ignores_the_commands_flags():
    result = _launch("--help", timeout=30)
    assert result.returncode == 0 and "--num_workers" in result.stdout
    # After `--`, --help belongs to the command (here: python -c ... --help).
    result = _launch("--num_workers=1", "--", sys.executable, "-c",
                     "import sys; print(sys.argv[1:])", "--help", timeout=30)
    assert result.returncode == 0, result.stderr
    assert "[worker:0] ['--help']" in result.stdout


def test_kill_9_of_the_launcher_takes_every_task_and_its_children_with_it(tmp_path):
    """Nothing outlives the launcher: kill -9 leaves it no chance to stop its
    tasks, so each task dies by PR_SET_PDEATHSIG (Linux) and the guardian kills
    their process groups (a task's own children too)."""
    command = _script(tmp_path, """
        if NAME == "worker0":
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
            child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            record("grandchild.pid", child.pid)
        record(NAME + ".pid", os.getpid())
        time.sleep(60)
    """)
    with _started([sys.executable, os.path.join(REPO, "bin", "launch"), "--num_workers=2",
                   "--", *command]) as proc:
        pids = _wait_for_pids(tmp_path, "grandchild", "worker0", "worker1")
        proc.kill()
        proc.communicate(timeout=10)
    _assert_all_gone(pids, timeout=10)


def test_a_task_dies_with_the_launcher_without_the_guardian(tmp_path):
    """The kernel's half alone (PR_SET_PDEATHSIG, Linux): a Launcher whose
    guardian never started still takes its tasks with it."""
    command = _script(tmp_path, """
        record(NAME + ".pid", os.getpid())
        time.sleep(60)
    """)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    script = tmp_path / "drive.py"
    script.write_text(textwrap.dedent(f"""
        import os, sys
        from tfloop.launch import launcher
        launcher._Guardian.__init__ = lambda self: setattr(self, "_popen", None)
        config = launcher.LaunchConfig(command={command!r}, num_workers=2)
        sys.exit(launcher.Launcher(config).run())
    """))
    with _started([sys.executable, str(script)], env=env) as proc:
        pids = _wait_for_pids(tmp_path, "worker0", "worker1")
        proc.kill()
        proc.communicate(timeout=10)
    _assert_all_gone(pids, timeout=10)


# -- the cores dealt out ---------------------------------------------------------------


def _threads_seen(tmp_path, *launch_args: str, env: dict, command_args=()):
    command = _script(tmp_path, """
        print("threads", os.environ.get("TF_NUM_INTRAOP_THREADS"))
    """)
    result = _launch(*launch_args, "--", *command, *command_args, env=env, timeout=60)
    assert result.returncode == 0, result.stderr
    return result, {role: text.split()[1] for role, text in _prefixed(result.stdout)
                    if text.startswith("threads ")}


def test_each_task_gets_its_share_of_the_cores_unless_the_user_chose(tmp_path):
    """As torchrun does with OMP_NUM_THREADS: without a thread count of the
    user's, each of N local tasks gets cores // N (at least 1) intra-op
    threads, said at start; a count the user set is passed on untouched."""
    unset = {"TF_NUM_INTRAOP_THREADS": None}
    result, seen = _threads_seen(tmp_path, "--num_workers=2", "--evaluator", env=unset)
    share = max(1, launcher.threads.usable_cores() // 3)
    assert seen == {"worker:0": str(share), "worker:1": str(share), "evaluator": str(share)}
    line = f"TF_NUM_INTRAOP_THREADS={share} for each task ({launcher.threads.usable_cores()} " \
           "core(s) / 3 task(s)"
    assert line in result.stdout + result.stderr, result.stdout + result.stderr

    result, seen = _threads_seen(tmp_path, "--num_workers=2",
                                 env={"TF_NUM_INTRAOP_THREADS": "3"})
    assert seen == {"worker:0": "3", "worker:1": "3"}
    assert "for each task" not in result.stdout + result.stderr
    # --intra_op_threads in the command chooses too: the launcher sets nothing.
    _, seen = _threads_seen(tmp_path, "--num_workers=2", env=unset,
                            command_args=["--intra_op_threads=2"])
    assert seen == {"worker:0": "None", "worker:1": "None"}


def test_a_bad_thread_count_in_the_environment_is_one_line(tmp_path):
    result = _launch("--num_workers=2", "--", sys.executable, "-c", "pass",
                     env={"TF_NUM_INTRAOP_THREADS": "many"}, timeout=30)
    assert result.returncode == 2
    assert_one_line_error(result, contains="TF_NUM_INTRAOP_THREADS='many' must be a whole number")


def test_thread_helpers():
    threads = launcher.threads
    assert threads.share(2, cores=2) == 1 and threads.share(3, cores=2) == 1
    assert threads.share(2, cores=16) == 8 and threads.share(0, cores=4) == 4
    assert threads.budget({}) is None and threads.budget({"TF_NUM_INTRAOP_THREADS": " 2 "}) == 2
    assert threads.chosen_in(["bin/train", "--intra_op_threads=1"])
    assert threads.chosen_in(["bin/train", "--intra_op_threads", "1"])
    assert not threads.chosen_in(["bin/train", "--intra_op_threads_x=1"])


def test_launch_timeout_asks_every_task_for_a_dump_and_gathers_them(tmp_path):
    """--timeout: SIGUSR2 to each task (bin/train's hang watch dumps on it:
    tests/engine/runtime/test_hang.py), the dumps gathered in the one folder
    $TFLOOP_DIAGNOSTICS_DIR named, the tasks stopped, exit status 124. A launch
    that ends with no dump leaves no temporary folder behind."""
    temp = tmp_path / "tmp"
    temp.mkdir()
    command = _script(tmp_path, """
        def dump(signum, frame):
            folder = os.environ["TFLOOP_DIAGNOSTICS_DIR"]
            with open(os.path.join(folder, f"hang-{NAME}.txt"), "w") as f:
                f.write(f"hang dump: {NAME}")
        signal.signal(signal.SIGUSR2, dump)
        record(NAME + ".pid", os.getpid())
        if len(sys.argv) > 2:
            sys.exit(0)
        time.sleep(60)
    """)
    result = _launch("--num_workers=2", "--timeout=2", "--grace_period=2", "--",
                     *command, env={"TMPDIR": str(temp)}, timeout=60)
    assert result.returncode == 124, result.stderr
    assert "launch: --timeout: still running after 2 s; asked every task" in result.stderr
    gathered = re.search(r"launch: diagnostics: 2 hang dump\(s\) of the tasks in (\S+): "
                         r"hang-worker0\.txt, hang-worker1\.txt", result.stderr)
    assert gathered, result.stderr
    folder = gathered.group(1)
    assert os.path.dirname(folder) == str(temp)
    assert open(os.path.join(folder, "hang-worker1.txt")).read() == "hang dump: worker1"
    _assert_all_gone(_pids(tmp_path))

    for name in os.listdir(temp):
        shutil.rmtree(temp / name)
    finished = _launch("--num_workers=1", "--", *command, "done",
                       env={"TMPDIR": str(temp)}, timeout=60)
    assert finished.returncode == 0, finished.stderr
    assert os.listdir(temp) == [] and "diagnostics" not in finished.stderr


def test_statuses_that_are_not_signals_and_signals_that_saved_nothing():
    """Issue 29 item 17: 200 and 255 were described as "killed by signal 72 /
    127"; a task killed by an unhandled SIGTERM (Popen's -15) as "terminated
    (SIGTERM), saved", the line of a binary that saved and exited 143 itself."""
    from tfloop.launch import exit_codes

    for status in (200, 255):
        said = exit_codes.describe(status)
        assert "signal" not in said and "killed" not in said, said
        assert said == (f"exit {status}: retryable (128 or above): restart every task from the "
                        "last checkpoint")
    assert exit_codes.describe(128 + 34) .startswith("exit 162: killed by")  # a real-time signal
    killed = exit_codes.describe_returncode(-15)
    assert killed.startswith("exit 143: killed by SIGTERM, which it did not handle: nothing "
                             "was saved at the signal"), killed
    assert "saved" not in exit_codes.describe_returncode(-2).replace("nothing was saved", "")
    assert exit_codes.describe_returncode(143) == exit_codes.describe(143)  # exited 143 itself
    assert exit_codes.describe_returncode(-9) == exit_codes.describe(137)
