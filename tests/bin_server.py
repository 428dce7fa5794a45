"""A resident interpreter that imports TensorFlow once and forks each binary the suite runs.

About 200 tests run `bin/*` in a process of its own (logical devices are
configured once per process, and that is how users run them). Each such
process spent 4-8 s of this 2-core machine importing TensorFlow, Keras and
the engine before its first line of its own: most of the suite's time. Here
one server per pytest worker pays that import once; each binary is then a
`fork` of it that runs `bin/<name>` as `__main__` with the caller's argv,
environment, working directory and standard streams, in a process of its
own (its own pid, signals, exit status, devices, nothing shared after the
fork). TensorFlow allows this: the server imports it and never creates a
context, so the child starts TensorFlow's runtime itself, as a fresh
process would (`tests/test_bin_server.py`).

What a forked binary cannot show, a test asks a fresh interpreter for
(`helpers.run_bin(..., fresh=True)`, `helpers.start_bin(..., fresh=True)`):
what happens before or during the import (a refusal before TensorFlow loads,
a signal during the import, the import's own chatter), an environment read
at interpreter start (`PYTHONPATH`, which `helpers` sends fresh by itself),
and who the parent is (`PR_SET_PDEATHSIG`, orphans). `TFLOOP_TEST_FRESH=1`
runs every binary of the suite fresh, as it ran before this server.

Protocol, one Unix-socket connection per binary: the client sends one JSON
line (argv, environment, working directory) with its three standard streams
as file descriptors (`socket.send_fds`); the server forks and answers
`{"pid": N}`, then `{"returncode": R}` when the child ends (R as
`subprocess.Popen.returncode`: -N for a signal). The server is one thread
(a fork copies only the forking thread; no lock may be held by another).
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import random
import select
import shutil
import signal
import socket
import sys
import tempfile

#: Imported once by the server; what every binary imports before its first step.
PRELOADED = (
    "numpy", "absl.app", "absl.flags", "absl.logging", "tensorflow", "keras",
    "tfloop.collectives", "tfloop.models", "tfloop.inputs", "tfloop.engine",
    "tfloop.engine.assembly.run", "tfloop.engine.config",
)

_PR_SET_PDEATHSIG = 1


def _preload() -> None:
    """Imports `PRELOADED`, and nothing runs: TensorFlow's runtime (devices,
    thread pools) must not start here, since each child configures its own,
    which TensorFlow allows once per process (`tests/test_bin_server.py`
    proves a child still can)."""
    import importlib

    for name in PRELOADED:
        importlib.import_module(name)


def _die_with(parent: int) -> None:
    """A child never outlives the server (nor the server its pytest worker)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:
        os._exit(1)


def _receive(connection: socket.socket) -> tuple[dict, list[int]]:
    data, fds = b"", []
    while not data.endswith(b"\n"):
        chunk, new_fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
        if not chunk:
            raise ConnectionError("the client went away before its request ended")
        data += chunk
        fds += new_fds
    return json.loads(data), fds


def _become(request: dict, fds: list[int], sockets: list[socket.socket]) -> None:
    """In the forked child: turn the server into the requested binary's process."""
    for sock in sockets:
        sock.close()
    os.setpgid(0, 0)  # a group of its own, as the server's signals are not the binary's
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    for signum in (signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(signum, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    _python_path(os.environ.get("PYTHONPATH", ""), request["env"].get("PYTHONPATH", ""))
    os.environ.clear()
    os.environ.update(request["env"])
    tempfile.tempdir = None  # TMPDIR is read again, as in a fresh interpreter
    random.seed()
    import numpy as np

    np.random.seed()
    unbuffered = bool(request["env"].get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(write_through=unbuffered)
    sys.orig_argv = [sys.executable, *request["argv"]]
    if request["argv"][0] == "-c":  # `python -c code args`: argv[0] is "-c", path[0] the cwd
        sys.argv = ["-c", *request["argv"][2:]]
        sys.path[0] = ""
    else:
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(request["argv"][0]))


def _python_path(server_path: str, child_path: str) -> None:
    """`PYTHONPATH` as an interpreter reads it at start: its entries right
    after the script's folder (`sys.path[0]`), the server's own taken out."""
    for entry in reversed(server_path.split(os.pathsep) if server_path else []):
        if os.path.abspath(entry) in sys.path[1:]:
            sys.path.remove(os.path.abspath(entry))
    for entry in reversed(child_path.split(os.pathsep) if child_path else []):
        sys.path.insert(1, os.path.abspath(entry))


def _shadowed(child_path: str) -> list[str]:
    """The modules the server has imported that `PYTHONPATH`'s folders hold a
    copy of (a stand-in `matplotlib` that fails, say): a fresh interpreter
    would import that copy, a fork has the server's."""
    names = []
    for entry in child_path.split(os.pathsep) if child_path else []:
        try:
            listed = os.listdir(entry)
        except OSError:
            continue
        names += [name.removesuffix(".py") for name in listed
                  if name.removesuffix(".py") in sys.modules]
    return sorted(set(names))


def serve(path: str) -> dict:
    """Accepts requests on the Unix socket `path` until the parent dies.
    Returns only in a forked child: the request it is to run."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(64)
    print("ready", flush=True)
    waiting: dict[int, socket.socket] = {}  # pid -> its client's connection
    while True:
        readable, _, _ = select.select([server], [], [], 0.02)
        if readable:
            connection, _ = server.accept()
            try:
                request, fds = _receive(connection)
            except (ConnectionError, ValueError, OSError):
                connection.close()
                continue
            shadowed = _shadowed(request["env"].get("PYTHONPATH", ""))
            if shadowed:  # the child would run with the server's copy of them
                _send(connection, {"fresh": f"PYTHONPATH shadows {', '.join(shadowed)}, "
                                            "already imported"})
                for fd in fds:
                    os.close(fd)
                connection.close()
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            parent = os.getpid()
            pid = os.fork()
            if pid == 0:
                _die_with(parent)
                _become(request, fds, [server, connection, *waiting.values()])
                return request
            for fd in fds:
                os.close(fd)
            print(f"forked {pid}: {' '.join(request['argv'][:1])}", file=sys.stderr, flush=True)
            _send(connection, {"pid": pid})
            waiting[pid] = connection
        _reap(waiting)


def _send(connection: socket.socket, message: dict) -> None:
    try:
        connection.sendall((json.dumps(message) + "\n").encode())
    except OSError:  # the client is gone; the child runs on, as a Popen child would
        pass


def _reap(waiting: dict[int, socket.socket]) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            _send(connection, {"returncode": os.waitstatus_to_exitcode(status)})
            connection.close()


def main() -> None:
    import runpy

    _die_with(int(sys.argv[2]))
    _preload()
    # What the preload made is permanent: a child's garbage collections (the
    # last one at its exit above all) would otherwise walk the whole
    # TensorFlow heap, touching each object and so copying every page of it
    # (copy-on-write): a forked `print(1)` took 1.06 s of CPU, `bin/train --help`
    # 0.96 s; frozen 0.27 s and 0.33 s (/proc/stat, 8 and 3 runs, 2026-11-29).
    gc.collect()
    gc.freeze()
    request = serve(sys.argv[1])
    # The child: run the binary as `python bin/<name>` (or `python -c`) would,
    # and end as that interpreter would (SystemExit's status, a traceback and 1, atexit).
    if request["argv"][0] == "-c":
        import types

        main_module = types.ModuleType("__main__")
        sys.modules["__main__"] = main_module
        exec(compile(request["argv"][1], "<string>", "exec"), main_module.__dict__)
    else:
        runpy.run_path(request["argv"][0], run_name="__main__")


if __name__ == "__main__":
    main()


# -- the client: what the suite's helpers use ---------------------------------------------------


class NotServed(Exception):
    """The server cannot run this request as a fresh interpreter would: the
    caller starts one."""


class ServedProcess:
    """A binary the server forked, answering as `subprocess.Popen` does for the
    parts the suite uses: `pid`, `stdout`/`stderr` (text pipes), `returncode`,
    `poll`, `wait`, `communicate`, `send_signal`, `terminate`, `kill`."""

    def __init__(self, args: list[str], connection: socket.socket, stdout, stderr):
        self.args = args
        self.stdout, self.stderr, self.stdin = stdout, stderr, None
        self.returncode: int | None = None
        self._connection = connection
        self._received = b""
        first = self._message(timeout=None)
        if "fresh" in first:
            connection.close()
            for stream in (stdout, stderr):
                if stream is not None:
                    stream.close()
            raise NotServed(first["fresh"])
        self.pid = first["pid"]

    def _message(self, timeout: float | None) -> dict | None:
        """The server's next line, or None if none came within `timeout`."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._received:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not select.select([self._connection], [], [], left)[0]:
                return None
            chunk = self._connection.recv(4096)
            if not chunk:
                raise ConnectionError(f"the binary server went away while running {self.args}")
            self._received += chunk
        line, self._received = self._received.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            message = self._message(timeout=0)
            if message is not None:
                self._ended(message)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        import subprocess

        if self.returncode is None:
            message = self._message(timeout)
            if message is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
            self._ended(message)
        return self.returncode

    def _ended(self, message: dict) -> None:
        self.returncode = message["returncode"]
        self._connection.close()

    def communicate(self, input=None, timeout: float | None = None) -> tuple:
        """Reads both pipes to their end and waits, as Popen.communicate does
        (on a timeout, what was read so far is kept for the next call)."""
        import subprocess
        import threading
        import time

        if input is not None:
            raise ValueError("a served binary reads no input")
        if not hasattr(self, "_read"):
            self._read = {"stdout": [], "stderr": []}
            self._readers = [threading.Thread(target=self._drain, args=(name,), daemon=True)
                             for name in self._read if getattr(self, name) is not None]
            for reader in self._readers:
                reader.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return tuple("".join(self._read[name]) if getattr(self, name) is not None else None
                     for name in ("stdout", "stderr"))

    def _drain(self, name: str) -> None:
        stream = getattr(self, name)
        for chunk in iter(lambda: stream.read(8192), ""):
            self._read[name].append(chunk)
        stream.close()

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        self.wait()


class BinServer:
    """The client's handle on one server, started on first use (and again if it
    died) with the environment and folder given here, the suite's own: never a
    request's, whose `PYTHONPATH` could put a stand-in under the preload."""

    def __init__(self, env: dict, cwd: str):
        import atexit

        self._env, self._cwd = dict(env), cwd
        self._process = None
        self._path = ""
        atexit.register(self.close)

    def _start(self) -> None:
        import subprocess

        self.close()  # a server that died: its folder goes
        directory = tempfile.mkdtemp(prefix="tfloop-bin-server-")
        self._path = os.path.join(directory, "socket")
        log = open(os.path.join(directory, "server.log"), "w+")
        self._process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), self._path, str(os.getpid())],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, text=True,
            env=self._env, cwd=self._cwd)
        ready, _, _ = select.select([self._process.stdout], [], [], 180)
        if not ready or self._process.stdout.readline().strip() != "ready":
            log.seek(0)
            said = log.read()
            self.close()
            raise RuntimeError(f"the binary server did not start:\n{said}")

    def close(self) -> None:
        """Stops the server and removes its folder (socket, server.log): each
        pytest worker's was left in the temporary folder after every run."""
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait()
        if self._path:
            shutil.rmtree(os.path.dirname(self._path), ignore_errors=True)

    def spawn(self, argv: list[str], *, env: dict, cwd: str, stdout=-1, stderr=-1) -> ServedProcess:
        """Forks `argv` (what would follow `python`: a script or `-c code`, and
        its arguments) in the server. `stdout`, `stderr`: as `subprocess.Popen`
        takes them (PIPE, DEVNULL, a file, or STDOUT for stderr)."""
        import subprocess

        if self._process is None or self._process.poll() is not None:
            self._start()
        ours, theirs, opened = {}, [], []
        for name, given in (("stdout", stdout), ("stderr", stderr)):
            if given == subprocess.PIPE:
                read, write = os.pipe()
                ours[name] = os.fdopen(read, "r")
                opened.append(write)
            elif given == subprocess.STDOUT:
                write = theirs[0]
            elif given == subprocess.DEVNULL or given is None:
                write = os.open(os.devnull, os.O_WRONLY)
                opened.append(write)
            else:
                write = given if isinstance(given, int) else given.fileno()
            theirs.append(write)
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(self._path)
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd}) + "\n"
            with open(os.devnull, "rb") as stdin:
                socket.send_fds(connection, [request.encode()], [stdin.fileno(), *theirs])
        finally:
            for fd in opened:
                os.close(fd)
        return ServedProcess([sys.executable, *argv], connection,
                             ours.get("stdout"), ours.get("stderr"))
