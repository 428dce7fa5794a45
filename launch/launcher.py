"""A local TF_CONFIG cluster on loopback: one process per task, supervised.

`bin/launch` runs one command once per task of a cluster it makes up on this
machine, each copy with its own `TF_CONFIG`, which is how multi-worker
training is developed and tested without more machines::

    bin/launch --num_workers=2 --chief --evaluator -- \\
        bin/train --strategy=multi_worker --model_dir=runs/mw

The supervision loop, for one launch::

    for attempt in 1 .. 1 + max_restarts:
        ports = pick_free_ports(...)            # fresh every attempt
        start every task (own process group, prefixed output)
        wait until
          - a cluster task (chief/worker/ps) fails -> stop all; then, by the one
            exit-code table (`launch.exit_codes`): a retryable status (>= 128:
            138 a lost peer, a death by signal) -> restart, while restarts
            last; a permanent one (1, 2, 3) -> give up at once, with it
          - with --min_workers: a worker that cannot come back (it exits with
            a permanent status, 1 or 3, on its own while its peers run or wait
            for it: its machine is gone; never the chief, whose own failure, a
            full --model_dir for one, every restart meets again) -> restart
            with one worker fewer,
            down to min_workers; the run resumes from the last checkpoint on
            fewer replicas with the same global batch (bin/train
            --max_per_replica_batch_size; docs/reliability.md)
          - every chief/worker exited 0          -> stop ps, wait for evaluator; done
            (with a chief and ps tasks, parameter-server training: the chief's
            exit 0 is the end, the workers are stopped with the ps tasks, and
            a worker's death is reported, not fatal; see `Launcher.coordinated`)
          - SIGINT/SIGTERM/SIGHUP to the launcher -> stop all; exit 128+signal
          - --timeout passed -> SIGUSR2 to every task (each dumps its threads,
            phase and step), then stop all; exit 124
          - the launcher killed (kill -9, a crash)  -> every task gets SIGKILL
            (`launch.guardian`: PR_SET_PDEATHSIG on Linux, and a guardian
            process that kills the tasks' process groups on any POSIX system)

Diagnostics: every task gets `$TFLOOP_DIAGNOSTICS_DIR`, one folder
(`--diagnostics_dir`, else a temporary one, removed when it stays empty) where
`bin/train` writes its hang dumps (`engine.runtime.hang`: no loop ended in
`--hang_timeout`, or SIGUSR2). The launcher names each dump as it appears
and lists them all at the end: the dumps of every task, gathered in one place.

A restart runs the *same* command, so training resumes from the chief's last
checkpoint in `--model_dir`. The evaluator is a sidecar: it is outside the
training cluster (TF's convention: its `TF_CONFIG` names the training cluster
and `task: {type: evaluator, index: 0}`, and no other task's `cluster` lists
it), its failure neither stops nor restarts training, but it is reported and
decides the exit status of an otherwise successful launch.

The TF_CONFIG values come from `launch.tf_config`, the same model the engine
parses them with. Pure standard library and no TensorFlow, so the launcher
starts at once.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from typing import IO, Callable, Mapping, Optional, Sequence

from tfloop.launch import exit_codes, gpus, guardian, threads
from tfloop.launch.environment import DIAGNOSTICS_ENV
from tfloop.launch.tf_config import (CHIEF, CLUSTER_JOBS, EVALUATOR, PS, WORKER, Role, cluster_spec,
                              tf_config_for)

#: Exit status when the evaluator outlives `evaluator_timeout_s`, or the
#: launch its `timeout_s` (as timeout(1)).
EXIT_TIMEOUT = 124
#: Seconds the tasks get to write their dumps after SIGUSR2, before they are stopped.
DUMP_WAIT_S = 10.0

_POLL_S = 0.05
#: Bound on waiting for killed processes to be reaped and their pipes to drain.
_REAP_S = 5.0


class LaunchError(ValueError):
    """What the user asked the launcher for cannot be done; the message says why."""


def plan_cluster(*, num_workers: int, chief: bool = False, num_ps: int = 0,
                 evaluator: bool = False) -> list[Role]:
    """The tasks of a cluster: [chief], workers, ps tasks, [evaluator], in that order.

    Without `chief`, worker 0 is the chief (TF's convention). The roles have no
    `cluster` yet: their ports are picked afresh at every start.
    """
    _check_int("num_workers", num_workers, minimum=1)
    _check_int("num_ps", num_ps, minimum=0)
    tasks = [Role(CHIEF, 0)] if chief else []
    tasks += [Role(WORKER, i) for i in range(num_workers)]
    tasks += [Role(PS, i) for i in range(num_ps)]
    if evaluator:
        tasks.append(Role(EVALUATOR, 0))
    return tasks


def pick_free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct ports that were free on `host` a moment ago.

    All sockets stay bound until every port is chosen, so the ports differ;
    another process may still take one before the task binds it (then that
    task fails to start its server, and a restart picks new ports).
    """
    sockets = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


#: A shell's exit status for a Popen return code: 128+N when killed by signal N.
exit_status = exit_codes.shell_status


def describe_exit(returncode: int) -> str:
    """`exited with status 3` or `died with signal 9 (SIGKILL)`."""
    if returncode >= 0:
        return f"exited with status {returncode}"
    try:
        name = f" ({signal.Signals(-returncode).name})"
    except ValueError:
        name = ""
    return f"died with signal {-returncode}{name}"


def check_command(command: Sequence[str]) -> None:
    """Raises LaunchError unless `command[0]` names an executable program."""
    if not command:
        raise LaunchError("missing command after '--'; usage: launch [flags] -- COMMAND [ARGS...]")
    program = command[0]
    if os.sep in program:
        if not os.path.isfile(program):
            raise LaunchError(f"command {program!r} does not exist")
        if not os.access(program, os.X_OK):
            raise LaunchError(f"command {program!r} is not executable; chmod +x it, "
                              f"or run it through an interpreter")
    elif shutil.which(program) is None:
        raise LaunchError(f"command {program!r} not found on PATH")


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """What to launch and how to supervise it; validated at construction.

    Attributes:
      command: the program and its arguments, run once per task.
      num_workers: tasks of the `worker` job (worker 0 is the chief unless `chief`).
      chief: add a separate `chief` job with one task.
      num_ps: tasks of the `ps` job; they serve until training ends, then are stopped.
      evaluator: add a sidecar `evaluator` task outside the training cluster.
      max_restarts: times the whole cluster is restarted after a task fails.
      grace_period_s: after SIGTERM (or a forwarded SIGINT), seconds before SIGKILL.
      evaluator_timeout_s: seconds the evaluator may run on after training ends.
      gpus_per_task: GPUs each task of `gpu_jobs` gets through its own
        `CUDA_VISIBLE_DEVICES` (`launch.gpus`); 0: every task inherits the
        launcher's view of the GPUs (all of them).
      gpu_jobs: the jobs whose tasks get GPUs; the others get none.
      num_gpus: the GPUs to deal out, 0..num_gpus-1; 0: `$CUDA_VISIBLE_DEVICES`
        if set, else as many as `nvidia-smi -L` lists.
      peer_exit_wait_s: after a task fails, seconds the other chief/worker
        tasks get to exit on their own before they are stopped, each one's
        status then reported. 0: stop them at once. A platform that recreates
        only the failed pod (Kubeflow's TFJob) leaves the survivors' own exit
        status to decide whether the job lives; `bin/launch --spec` shows it.
      timeout_s: seconds the whole launch may run; then every task is asked
        to dump what it is doing (SIGUSR2), stopped, and the exit status is
        124. 0: no limit.
      diagnostics_dir: the folder of the tasks' hang dumps; empty: a
        temporary one, removed at the end when no dump was written.
      min_workers: the fewest workers training may go on with: a worker that
        cannot come back (`Launcher.lost_worker`) is left out of the next
        restart while at least this many remain. 0: never go on without one.
    """

    command: tuple[str, ...]
    num_workers: int = 2
    chief: bool = False
    num_ps: int = 0
    evaluator: bool = False
    max_restarts: int = 0
    grace_period_s: float = 10.0
    evaluator_timeout_s: float = 300.0
    gpus_per_task: int = 0
    gpu_jobs: tuple[str, ...] = gpus.DEFAULT_GPU_JOBS
    num_gpus: int = 0
    peer_exit_wait_s: float = 0.0
    timeout_s: float = 0.0
    diagnostics_dir: str = ""
    min_workers: int = 0

    def __post_init__(self):
        object.__setattr__(self, "command", tuple(self.command))
        _check_int("gpus_per_task", self.gpus_per_task, minimum=0)
        _check_int("num_gpus", self.num_gpus, minimum=0)
        try:
            object.__setattr__(self, "gpu_jobs", gpus.check_jobs(self.gpu_jobs))
        except gpus.GPUAssignmentError as error:
            raise LaunchError(str(error)) from None
        _check_int("num_workers", self.num_workers, minimum=1)
        _check_int("num_ps", self.num_ps, minimum=0)
        _check_int("max_restarts", self.max_restarts, minimum=0, maximum=MAX_RESTARTS)
        _check_int("min_workers", self.min_workers, minimum=0)
        if self.min_workers > self.num_workers:
            raise LaunchError(f"--min_workers={self.min_workers} is more than --num_workers="
                              f"{self.num_workers}; give at most {self.num_workers}")
        if self.min_workers and self.num_ps:
            raise LaunchError(f"--min_workers={self.min_workers} is for synchronous "
                              "multi-worker clusters; with ps tasks the chief's coordinator "
                              "already goes on without a lost worker: drop --min_workers")
        if self.min_workers and not self.max_restarts:
            raise LaunchError(f"--min_workers={self.min_workers} restarts the cluster without "
                              "a lost worker, and --max_restarts is 0; give --max_restarts "
                              "(e.g. 3)")
        _check_seconds("grace_period", self.grace_period_s)
        _check_seconds("evaluator_timeout", self.evaluator_timeout_s)
        _check_seconds("peer_exit_wait", self.peer_exit_wait_s)
        _check_seconds("timeout", self.timeout_s)
        if len(self.tasks) > MAX_TASKS:
            raise LaunchError(f"{len(self.tasks)} tasks is more than the {MAX_TASKS} one launcher "
                              f"starts on one machine; rehearse the cluster with fewer workers")
        check_command(self.command)

    @property
    def tasks(self) -> list[Role]:
        return self.tasks_with(self.num_workers)

    def tasks_with(self, num_workers: int) -> list[Role]:
        """The cluster's tasks with `num_workers` workers (fewer after a loss)."""
        return plan_cluster(num_workers=num_workers, chief=self.chief,
                            num_ps=self.num_ps, evaluator=self.evaluator)


#: Tasks one launcher starts on this machine: each is a TensorFlow process
#: (hundreds of MB, four pipes), so 100,000 of them ran 46 s into "Too many
#: open files". A cluster that large is rehearsed smaller (fewer workers).
MAX_TASKS = 256
#: More restarts than any real job wants; a typo otherwise loops for days.
MAX_RESTARTS = 1000
#: A week: a longer grace period or evaluator timeout is a typo.
MAX_SECONDS = 7 * 24 * 3600.0


def _check_int(name: str, value: int, *, minimum: int, maximum: int = MAX_TASKS) -> None:
    if (isinstance(value, bool) or not isinstance(value, int)
            or not minimum <= value <= maximum):
        raise LaunchError(f"--{name} ({value!r}) must be an integer from {minimum} to {maximum}")


def _check_seconds(name: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0 <= value <= MAX_SECONDS:
        raise LaunchError(f"--{name} ({value!r}) must be a number of seconds from 0 to "
                          f"{MAX_SECONDS:.0f} (a week)")


class _Interrupted(Exception):
    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class _TimedOut(Exception):
    """The launch ran past `timeout_s`."""


class _Proc:
    """One running task: its process (leader of its own group) and output pumps."""

    def __init__(self, task: Role, popen: subprocess.Popen, pumps: list[threading.Thread]):
        self.task = task
        self.popen = popen
        self.pumps = pumps

    def poll(self) -> int | None:
        return self.popen.poll()

    def signal_group(self, signum: int) -> None:
        # The whole group: a task's own children (data loaders, shells) go too.
        try:
            os.killpg(self.popen.pid, signum)
        except (ProcessLookupError, PermissionError):
            pass

    def drain(self, timeout: float) -> None:
        """Lets the pumps print what the task wrote before it exited (bounded)."""
        deadline = time.monotonic() + timeout
        for pump in self.pumps:
            pump.join(max(0.0, deadline - time.monotonic()))


class _Guardian:
    """The launcher's end of `launch.guardian`: tells it which task groups
    run; if the launcher dies, the guardian kills them. Writes never fail the
    launch: without a guardian the tasks still die with it on Linux."""

    def __init__(self):
        try:
            self._popen: subprocess.Popen | None = subprocess.Popen(
                [sys.executable, "-I", "-S", guardian.__file__], stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL, start_new_session=True, text=True)
        except OSError:
            self._popen = None

    def _send(self, line: str) -> None:
        if self._popen is not None:
            try:
                self._popen.stdin.write(line + "\n")
                self._popen.stdin.flush()
            except (OSError, ValueError):
                pass

    def watch(self, pgid: int) -> None:
        self._send(f"+{pgid}")

    def release(self, pgid: int) -> None:
        self._send(f"-{pgid}")

    def close(self) -> None:
        """Every task is stopped: the guardian leaves without killing anything."""
        if self._popen is None:
            return
        self._send("done")
        try:
            self._popen.stdin.close()
        except OSError:
            pass
        try:
            self._popen.wait(timeout=_REAP_S)
        except subprocess.TimeoutExpired:
            self._popen.kill()
        self._popen = None


class Launcher:
    """Runs `config.command` once per task of a local cluster and supervises it.

    `run()` returns the exit status: 0 when every chief/worker exited 0 (and the
    evaluator, if any, too); the failing task's status (128+N for signal N)
    at once when it is permanent (`exit_codes.retryable`), else when restarts
    are exhausted; 128+N when the launcher got signal N (130 for
    Ctrl-C); `EXIT_TIMEOUT` when the evaluator outlived its timeout.
    Every task is gone when `run()` returns, whatever happened, and if the
    launcher dies before it returns (`kill -9`), its tasks die with it
    (`launch.guardian`). Call `run()` from a thread that lives until it returns
    (it does not return before its tasks are stopped): on Linux the tasks are
    bound to the life of the thread that started them.

    `environments(tasks, cluster)`, where given, says what each task's own
    variables are at each start (task label -> variables, a value of None
    removing one the launcher inherited; `cluster` holds this start's loopback
    ports): what a platform would give that pod (`launch.rehearsal`). Without
    it, each task gets its `TF_CONFIG`.
    """

    def __init__(self, config: LaunchConfig, *, env: Mapping[str, str] | None = None,
                 stdout: IO[str] | None = None, stderr: IO[str] | None = None,
                 program: str = "launch",
                 environments: Optional[Callable[[list[Role], dict], Mapping[str, Mapping[
                     str, str]]]] = None):
        self.config = config
        self._environments = environments
        self._env = dict(os.environ if env is None else env)
        self._stdout = stdout or sys.stdout
        self._stderr = stderr or sys.stderr
        self._program = program
        self._write_lock = threading.Lock()
        self._procs: list[_Proc] = []
        self._signal: int | None = None  # the last SIGINT/SIGTERM/SIGHUP the launcher got
        self._signals_seen = 0
        self._guardian: _Guardian | None = None
        self._gpus = self._assign_gpus()
        self._threads = self._deal_threads()
        self._diagnostics = ""  # made by run()
        self._dumps_seen: set[str] = set()
        self._deadline: float | None = None
        #: Workers this launch starts: `num_workers`, fewer after `lost_worker`.
        self.workers = config.num_workers

    def _assign_gpus(self) -> dict[str, str]:
        """Task label → its `CUDA_VISIBLE_DEVICES` (empty without `gpus_per_task`)."""
        if not self.config.gpus_per_task:
            return {}
        try:
            available = gpus.visible_gpu_ids(self._env, self.config.num_gpus)
            return gpus.assign(self.config.tasks, gpus_per_task=self.config.gpus_per_task,
                               gpus=available, gpu_jobs=self.config.gpu_jobs)
        except gpus.GPUAssignmentError as error:
            raise LaunchError(str(error)) from None

    def _deal_threads(self) -> int | None:
        """Each task's `TF_NUM_INTRAOP_THREADS`: its share of this machine's
        cores (`launch.threads`), or None when the user chose the threads."""
        try:
            chosen = threads.budget(self._env)
        except threads.ThreadsError as error:
            raise LaunchError(str(error)) from None
        if chosen is not None or threads.chosen_in(self.config.command):
            return None
        return threads.share(len(self.config.tasks))

    @property
    def coordinated(self) -> bool:
        """A parameter-server cluster (a chief and ps tasks): the chief coordinates.

        Its workers and ps tasks are servers that never exit on their own, so
        the chief's exit 0 ends training (the convention of Kubeflow's TFJob),
        and a worker that dies does not stop the cluster: TensorFlow's
        `ClusterCoordinator` re-runs its work on the others. Only when every
        worker is gone does the cluster count as failed.
        """
        return self.config.chief and self.config.num_ps > 0

    # -- the outer loop ---------------------------------------------------------

    def run(self) -> int:
        if self._gpus:
            self._say("GPUs: " + gpus.describe(self._gpus))
        if self._threads:
            self._say(f"threads: {threads.THREADS_ENV}={self._threads} for each task "
                      f"({threads.usable_cores()} core(s) / {len(self.config.tasks)} task(s); "
                      f"set {threads.THREADS_ENV}, or {threads.THREADS_FLAG} in the command, "
                      f"to choose)")
        self._open_diagnostics()
        if self.config.timeout_s:
            self._deadline = time.monotonic() + self.config.timeout_s
        previous = self._install_signal_handlers()
        self._guardian = _Guardian()
        try:
            return self._run_attempts()
        except _Interrupted as interrupt:
            self._say(f"got {signal.Signals(interrupt.signum).name}; stopping every task")
            self._stop_all(first_signal=interrupt.signum)
            return 128 + interrupt.signum
        except _TimedOut:
            self._say(f"--timeout: still running after {self.config.timeout_s:g} s; asked "
                      "every task to dump what it is doing (SIGUSR2); stopping every task; "
                      f"exit status {EXIT_TIMEOUT}")
            self._ask_for_dumps()
            self._stop_all(first_signal=signal.SIGTERM)
            return EXIT_TIMEOUT
        finally:
            # Whatever went wrong (a bug included), leave no task behind.
            self._stop_all(first_signal=signal.SIGTERM)
            self._guardian.close()
            self._restore_signal_handlers(previous)
            self._gather_diagnostics()

    # -- diagnostics ------------------------------------------------------------------

    def _open_diagnostics(self) -> None:
        if self.config.diagnostics_dir:
            self._diagnostics = os.path.abspath(self.config.diagnostics_dir)
            try:
                os.makedirs(self._diagnostics, exist_ok=True)
            except OSError as error:
                raise LaunchError(f"--diagnostics_dir={self.config.diagnostics_dir}: cannot "
                                  f"create it: {error.strerror}") from None
        else:
            self._diagnostics = tempfile.mkdtemp(prefix="launch-diagnostics-")

    def _dumps(self) -> list[str]:
        try:
            return sorted(name for name in os.listdir(self._diagnostics)
                          if not name.startswith("."))
        except OSError:
            return []

    def _report_new_dumps(self) -> int:
        """Names each dump that appeared since the last look; how many did."""
        new = [name for name in self._dumps() if name not in self._dumps_seen]
        for name in new:
            self._dumps_seen.add(name)
            self._say(f"a task wrote a hang dump: {os.path.join(self._diagnostics, name)}")
        return len(new)

    def _ask_for_dumps(self) -> None:
        """SIGUSR2 to each running task's own process (not its group: its
        children may die of it), then a bounded wait for their dumps."""
        asked = [proc for proc in self._procs if proc.poll() is None]
        for proc in asked:
            try:
                os.kill(proc.popen.pid, signal.SIGUSR2)
            except (ProcessLookupError, PermissionError):
                pass
        deadline, written = time.monotonic() + DUMP_WAIT_S, 0
        while written < len(asked) and time.monotonic() < deadline:
            time.sleep(0.2)
            written += self._report_new_dumps()

    def _gather_diagnostics(self) -> None:
        """Lists every dump of the launch, or removes the empty temporary folder."""
        if not self._diagnostics:
            return
        self._report_new_dumps()
        dumps = self._dumps()
        if dumps:
            self._say(f"diagnostics: {len(dumps)} hang dump(s) of the tasks in "
                      f"{self._diagnostics}: {', '.join(dumps)}")
        elif not self.config.diagnostics_dir:
            shutil.rmtree(self._diagnostics, ignore_errors=True)

    def _run_attempts(self) -> int:
        attempts = 1 + self.config.max_restarts
        for attempt in range(1, attempts + 1):
            self._check_signal()
            self._start_cluster(attempt, attempts)
            failed = self._wait_for_training()
            if failed is None:
                return self._finish()
            self._let_peers_exit(failed)
            failed = self._deciding(failed)
            status = exit_status(failed.poll())
            what = (f"{failed.task.label} {describe_exit(failed.poll())} "
                    f"({exit_codes.describe_returncode(failed.poll())})")
            lost = self.lost_worker(failed)
            if lost and attempt < attempts:
                if self.workers - 1 < self.config.min_workers:
                    self._say(f"{what}: {lost} cannot come back, and --min_workers="
                              f"{self.config.min_workers} allows no fewer than "
                              f"{self.config.min_workers} workers; stopping the cluster; "
                              f"exit status {status}")
                    self._stop_all(first_signal=signal.SIGTERM)
                    return status
                self._say(f"{what}: {lost} cannot come back; restarting the cluster with "
                          f"{self.workers - 1} workers instead of {self.workers} "
                          f"(--min_workers={self.config.min_workers}; "
                          f"{attempt}/{self.config.max_restarts}): training resumes from the "
                          "last checkpoint on fewer replicas")
                self.workers -= 1
                self._stop_all(first_signal=signal.SIGTERM)
                continue
            if not exit_codes.retryable(status):
                self._say(f"{what}: a failure a restart cannot fix; stopping the cluster "
                          f"(not restarting); exit status {status}")
                self._stop_all(first_signal=signal.SIGTERM)
                return status
            if attempt < attempts:
                self._say(f"{what}: retryable; restarting the cluster "
                          f"({attempt}/{self.config.max_restarts})")
            else:
                restarts = (f"after {self.config.max_restarts} restart(s)"
                            if self.config.max_restarts else "no restarts allowed")
                self._say(f"{what}: retryable, but stopping the cluster ({restarts}); "
                          f"exit status {status}")
            self._stop_all(first_signal=signal.SIGTERM)
            if attempt == attempts:
                return status
        raise AssertionError("unreachable")

    def lost_worker(self, failed: _Proc) -> Optional[str]:
        """The label of the worker whose machine is gone, or None (with
        `min_workers` only).

        A worker cannot come back when it fails on its own with a permanent
        status a restart of the same task would meet again (1 or 3; not 2, a
        mistake in the request every task shares) while every other cluster
        task is still running (waiting for it) or ended retryably (a lost
        peer): the others can train, that one cannot. The local stand-in for
        a reclaimed machine is a worker that exits 1 at its restart (the
        tests' hook: a wrapper command that does so for one worker index).
        Which index leaves does not matter: a restart numbers the remaining
        workers 0..n-1, and worker 0 is the chief unless a chief job is.

        Never the chief (the chief job's task, else worker 0): it alone
        writes `--model_dir`, its summaries and `run.json`, so its own
        permanent failure (a full disk, a `RunFailure` of the run's storage)
        is the run's, which a cluster of fewer workers would meet again in
        the same storage; the cluster ends with its status."""
        if not self.config.min_workers or failed.task.task_type != WORKER:
            return None
        if not self.config.chief and failed.task.task_index == 0:
            return None  # the chief: its failure is the run's
        status = exit_status(failed.poll())
        if exit_codes.retryable(status) or status in (exit_codes.DONE, exit_codes.USAGE):
            return None
        others = [proc.poll() for proc in self._procs
                  if proc.task.is_member and proc is not failed]
        if any(code is not None and not exit_codes.retryable(exit_status(code))
               for code in others):
            return None  # they failed too: a failure of the run, not of a machine
        return failed.task.label

    def _deciding(self, failed: _Proc) -> _Proc:
        """The failed cluster task whose status decides: a permanent failure
        among those already ended, else `failed`. A task that fails for good
        (a NaN stop, a bug) makes its peers fail with "lost the cluster" (138)
        a moment later; whichever the poll saw first, the cause decides."""
        ended = [proc for proc in self._procs
                 if proc.task.is_member and proc.poll() not in (None, 0)]
        permanent = [proc for proc in ended if not exit_codes.retryable(exit_status(proc.poll()))]
        if permanent and permanent[0] is not failed:
            permanent[0].drain(timeout=1.0)
            return permanent[0]
        return failed

    def _start_cluster(self, attempt: int, attempts: int) -> None:
        tasks = self.config.tasks_with(self.workers)
        members = [task for task in tasks if task.is_member]
        cluster = cluster_spec(tasks, pick_free_ports(len(members)))
        addresses = iter(address for job in CLUSTER_JOBS for address in cluster.get(job, []))
        layout = ", ".join(
            f"{task.label}={next(addresses)}" if task.is_member else f"{task.label} (sidecar)"
            for task in tasks)
        self._say(f"attempt {attempt}/{attempts}: {layout}")
        self._procs = []
        own = self._environments(tasks, cluster) if self._environments else {}
        for task in tasks:
            self._procs.append(self._start(task, own.get(task.label) or {
                "TF_CONFIG": json.dumps(tf_config_for(task, cluster))}))
        self._say("pids: " + ", ".join(f"{p.task.label}={p.popen.pid}" for p in self._procs))

    def _wait_for_training(self) -> _Proc | None:
        """Waits until a cluster task fails (returns it) or training succeeded (None)."""
        evaluator_reported = False
        lost_workers: set[str] = set()
        last_look = time.monotonic()
        while True:
            self._check_signal()
            if self._deadline is not None and time.monotonic() > self._deadline:
                raise _TimedOut
            if time.monotonic() - last_look > 1.0:
                self._report_new_dumps()
                last_look = time.monotonic()
            done = True
            for proc in self._procs:
                code = proc.poll()
                if self.coordinated and proc.task.task_type == WORKER:
                    # A server of the chief's coordinator, which re-runs its work elsewhere.
                    if code not in (None, 0) and proc.task.label not in lost_workers:
                        lost_workers.add(proc.task.label)
                        self._say(f"{proc.task.label} {describe_exit(code)}; the chief's "
                                  "coordinator carries on with the other workers")
                        if len(lost_workers) == self.workers:
                            return proc
                    continue
                if proc.task.is_member and code not in (None, 0):
                    proc.drain(timeout=1.0)
                    return proc
                if proc.task.is_training and code is None:
                    done = False
                if (proc.task.task_type == EVALUATOR and code not in (None, 0)
                        and not evaluator_reported):
                    # A sidecar: training goes on without it.
                    self._say(f"evaluator {describe_exit(code)}; training goes on")
                    evaluator_reported = True
            if done:
                return None
            time.sleep(_POLL_S)

    def _finish(self) -> int:
        """Training succeeded: stop the ps tasks (and, in a parameter-server
        cluster, the workers), wait (bounded) for the evaluator."""
        servers = [proc for proc in self._procs if proc.task.task_type == PS
                   or (self.coordinated and proc.task.task_type == WORKER)]
        if servers:
            self._say("training finished; stopping the "
                      + ("workers and ps tasks" if self.coordinated else "ps tasks"))
            self._stop(servers, first_signal=signal.SIGTERM)
        for proc in self._procs:
            if proc.task.task_type != EVALUATOR:
                continue
            deadline = time.monotonic() + self.config.evaluator_timeout_s
            if proc.poll() is None:
                self._say("training finished; waiting for the evaluator "
                          f"(at most {self.config.evaluator_timeout_s:g} s)")
            while proc.poll() is None and time.monotonic() < deadline:
                self._check_signal()
                time.sleep(_POLL_S)
            if proc.poll() is None:
                self._say(f"evaluator still running {self.config.evaluator_timeout_s:g} s "
                          "after training finished; stopping it")
                self._stop([proc], first_signal=signal.SIGTERM)
                return EXIT_TIMEOUT
            proc.drain(timeout=_REAP_S)
            if proc.poll() != 0:
                self._say(f"training succeeded but the evaluator {describe_exit(proc.poll())}")
                return exit_status(proc.poll())
        self._say("every task finished")
        return 0

    def _let_peers_exit(self, failed: _Proc) -> None:
        """With `peer_exit_wait_s`: waits (bounded) for the other chief/worker
        tasks to exit on their own, as survivors do on a platform that replaces
        only the failed pod, and says how each ended and what its status means."""
        if not self.config.peer_exit_wait_s:
            return
        peers = [proc for proc in self._procs if proc is not failed and proc.task.is_training]
        deadline = time.monotonic() + self.config.peer_exit_wait_s
        while any(p.poll() is None for p in peers) and time.monotonic() < deadline:
            self._check_signal()
            time.sleep(_POLL_S)
        ended = []
        for proc in peers:
            code = proc.poll()
            if code is None:
                ended.append(f"{proc.task.label} still running after "
                             f"{self.config.peer_exit_wait_s:g} s")
                continue
            proc.drain(timeout=1.0)
            ended.append(f"{proc.task.label} {describe_exit(code)} "
                         f"({exit_codes.returncode_meaning(code)})")
        self._say(f"after {failed.task.label} {describe_exit(failed.poll())}: "
                  + ("; ".join(ended) or "no other task"))

    # -- processes ----------------------------------------------------------------

    def _start(self, task: Role, own_env: Mapping[str, Optional[str]]) -> _Proc:
        env = {name: value for name, value in {**self._env, **own_env, "PYTHONUNBUFFERED": "1"}
               .items() if value is not None}
        env[DIAGNOSTICS_ENV] = self._diagnostics
        if task.label in self._gpus:
            env["CUDA_VISIBLE_DEVICES"] = self._gpus[task.label]
        if self._threads:
            env[threads.THREADS_ENV] = str(self._threads)
        try:
            popen = subprocess.Popen(
                self.config.command, env=env, stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                # Its own group: the launcher signals the task and its children
                # together, and a terminal's Ctrl-C reaches only the launcher,
                # which then stops the tasks in order.
                start_new_session=True,
                # SIGKILL when the launcher dies without stopping it (Linux).
                preexec_fn=guardian.die_with_parent())
        except OSError as error:
            raise LaunchError(f"cannot start {self.config.command[0]!r}: {error.strerror}") from None
        if self._guardian is not None:
            self._guardian.watch(popen.pid)  # its own session: the group's id is its pid
        prefix = f"[{task.label}] "
        pumps = [self._pump(popen.stdout, prefix, self._stdout),
                 self._pump(popen.stderr, prefix, self._stderr)]
        return _Proc(task, popen, pumps)

    def _pump(self, pipe: IO[bytes], prefix: str, out: IO[str]) -> threading.Thread:
        def copy_lines():
            with pipe:
                for raw in iter(pipe.readline, b""):
                    line = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    self._write(out, prefix + line)

        thread = threading.Thread(target=copy_lines, name=f"pump {prefix.strip()}", daemon=True)
        thread.start()
        return thread

    def _stop_all(self, *, first_signal: int) -> None:
        self._stop(self._procs, first_signal=first_signal)

    def _stop(self, procs: Sequence[_Proc], *, first_signal: int) -> None:
        """Stops `procs` and their process groups, escalating, every wait bounded.

        SIGINT (forwarded Ctrl-C) → SIGTERM → SIGKILL; SIGTERM → SIGKILL. Each
        step waits at most the grace period; a second Ctrl-C to the launcher
        skips straight to SIGKILL.
        """
        if not procs:
            return
        ladder = [signal.SIGINT, signal.SIGTERM] if first_signal == signal.SIGINT else [
            signal.SIGTERM]
        signals_seen = self._signals_seen
        for signum in ladder:
            if all(proc.poll() is not None for proc in procs):
                break
            for proc in procs:
                if proc.poll() is None:
                    proc.signal_group(signum)
            deadline = time.monotonic() + self.config.grace_period_s
            while (any(proc.poll() is None for proc in procs)
                   and time.monotonic() < deadline and self._signals_seen == signals_seen):
                time.sleep(_POLL_S)
            if self._signals_seen != signals_seen:
                self._say("interrupted again; killing every task now")
                break
        # SIGKILL every group, even where the leader is gone, so that nothing it
        # started outlives it.
        for proc in procs:
            proc.signal_group(signal.SIGKILL)
        for proc in procs:
            try:
                proc.popen.wait(timeout=_REAP_S)
            except subprocess.TimeoutExpired:
                self._say(f"{proc.task.label} (pid {proc.popen.pid}) survived SIGKILL")
            else:
                if self._guardian is not None:
                    self._guardian.release(proc.popen.pid)
            proc.drain(timeout=1.0)

    # -- signals and messages -------------------------------------------------------

    def _install_signal_handlers(self) -> dict:
        if threading.current_thread() is not threading.main_thread():
            return {}

        def handler(signum, frame):
            self._signal = signum
            self._signals_seen += 1

        return {signum: signal.signal(signum, handler)
                for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    @staticmethod
    def _restore_signal_handlers(previous: dict) -> None:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

    def _check_signal(self) -> None:
        if self._signal is not None:
            raise _Interrupted(self._signal)

    def _say(self, message: str) -> None:
        self._write(self._stderr, f"{self._program}: {message}")

    def _write(self, out: IO[str], line: str) -> None:
        with self._write_lock:
            try:
                out.write(line + "\n")
                out.flush()
            except (OSError, ValueError):
                pass  # the launcher's own output is gone; the tasks still run
