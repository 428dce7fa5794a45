"""A local tf.data service: one dispatcher and N data workers, each its own
process, supervised (`bin/data_service`). Standard library only: the
servers themselves are `inputs.service`'s, run by the children
(`bin/data_service --role=dispatcher|worker`).

The supervisor's promises: the address it prints (`grpc://host:port`, the
one line on stdout) works when it is printed; start-up is bounded; a port
in use is one line and exit 2 before anything starts; SIGINT or SIGTERM
stops every child (SIGTERM, then SIGKILL after a grace period) and exits
0; a child never outlives it (each dies with its parent, `PR_SET_PDEATHSIG`).
A data worker that dies is reported in one line and the others serve on (the
dispatcher gives its share to them); the dispatcher dying ends the service
(exit 1): every trainer's job lived there.

Fault tolerance: with `work_dir` the dispatcher journals its state there and
a restarted one recovers its jobs (tf.data's fault-tolerant mode); without,
a restart forgets them. Locally the supervisor restarts nothing (the
dispatcher's death is the end); on Kubernetes the dispatcher pod's
container is restarted in place and reads its journal from a volume
(deploy/, docs/clusters.md).
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import signal
import socket
import subprocess
import threading
import time
from typing import Callable, Optional, Sequence

SCHEME = "grpc://"
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(?P<port>[0-9]{1,5})$")
_EXAMPLE = "e.g. grpc://localhost:5050 (bin/data_service prints it)"
#: What a child prints on stdout once its server is up.
READY = "ready"
#: Most data workers one supervisor starts (each is a TensorFlow process).
MAX_WORKERS = 256


class ServiceError(ValueError):
    """A request `bin/data_service` cannot carry out; the message says how to fix it."""


def address_error(text: str, flag: str = "--data_service") -> Optional[str]:
    """The one line saying what is wrong with `grpc://host:port` (the scheme,
    the host, the port), or None when it is right."""
    if not text.startswith(SCHEME):
        scheme = text.split("://")[0] + "://" if "://" in text else "no scheme"
        return (f"{flag}={text!r} has {scheme}; the tf.data service is reached over gRPC: "
                f"write {SCHEME}host:port, {_EXAMPLE}")
    match = _ADDRESS.match(text[len(SCHEME):])
    if match is None:
        return (f"{flag}={text!r} is not {SCHEME}host:port (a host name, a port number, "
                f"nothing after them); {_EXAMPLE}")
    port = int(match.group("port"))
    if not 1 <= port <= 65535:
        return f"{flag}={text!r}: port {port} is not between 1 and 65535; {_EXAMPLE}"
    return None


def host_port(text: str, flag: str) -> str:
    """`host:port` from `grpc://host:port` or `host:port`, checked."""
    address = text if "://" in text else SCHEME + text
    message = address_error(address, flag)
    if message:
        raise ServiceError(message)
    return address[len(SCHEME):]


def check_port_free(port: int, flag: str = "--port") -> None:
    """Refuses a port another process listens on, before a server fails on it."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("", port))
        except OSError as error:
            raise ServiceError(f"{flag}={port}: the port is in use ({error.strerror}); stop "
                               "what listens there or choose another port") from None


def free_ports(n: int) -> list[int]:
    """`n` distinct ports free a moment ago (each bound until all are chosen)."""
    sockets = []
    try:
        for _ in range(n):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sockets.append(sock)
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def wait_reachable(address: str, timeout_s: float, *, on_wait: Callable[[], None] = lambda: None,
                   poll_s: float = 1.0) -> bool:
    """Whether something accepts connections at `grpc://host:port` within
    `timeout_s` (0: for ever): a trainer pointed at nothing would otherwise
    wait for the dispatcher forever. `on_wait` runs once, at the first miss."""
    host, _, port = host_port(address, "--data_service").rpartition(":")
    host = host.strip("[]")
    deadline, waited = time.monotonic() + (timeout_s or float("inf")), False
    while True:
        try:
            with socket.create_connection((host, int(port)), timeout=min(poll_s, 5.0)):
                return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            if not waited:
                on_wait()
                waited = True
            time.sleep(poll_s)


def die_with_parent() -> None:
    """`preexec_fn` of a child: SIGKILL when the supervisor dies (Linux; a
    no-op elsewhere), so no data worker outlives a killed supervisor."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclasses.dataclass(frozen=True)
class ServiceConfig:
    """One local service: `workers` data workers behind a dispatcher on `port`
    (0: a free one), reachable as `host`, started within `startup_timeout_s`."""

    port: int = 5050
    workers: int = 2
    host: str = "localhost"
    work_dir: str = ""
    startup_timeout_s: float = 120.0
    grace_period_s: float = 10.0

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ServiceError(f"--port={self.port} must be 0 (a free port) or 1 to 65535")
        if not 1 <= self.workers <= MAX_WORKERS:
            raise ServiceError(f"--workers={self.workers} must be 1 to {MAX_WORKERS}")
        if not self.startup_timeout_s > 0:
            raise ServiceError(f"--startup_timeout={self.startup_timeout_s} must be positive")
        host_port(f"{self.host}:1", "--host")


class _Child:
    """One server process (its own session: a Ctrl-C reaches the supervisor only)."""

    def __init__(self, name: str, argv: Sequence[str], log: Callable[[str], None]):
        self.name = name
        self.ready = threading.Event()
        self.popen = subprocess.Popen(list(argv), stdout=subprocess.PIPE, stdin=subprocess.DEVNULL,
                                      text=True, start_new_session=True,
                                      preexec_fn=die_with_parent)
        self._pump = threading.Thread(target=self._read, args=(log,), daemon=True)
        self._pump.start()

    def _read(self, log: Callable[[str], None]) -> None:
        for line in self.popen.stdout:
            if line.strip() == READY:
                self.ready.set()
            else:
                log(f"[{self.name}] {line.rstrip()}")

    def stop(self, grace_s: float) -> None:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._pump.join(1.0)


class Service:
    """Starts, watches and stops one local service (`run` is the binary's life).

    `child_argv(role, port, dispatcher)` is the command of one server process
    (`bin/data_service --role=...`)."""

    def __init__(self, config: ServiceConfig, child_argv: Callable[..., list[str]],
                 log: Callable[[str], None], out: Callable[[str], None]):
        self.config, self._argv, self._log, self._out = config, child_argv, log, out
        self.children: list[_Child] = []
        self._stop = threading.Event()

    def run(self) -> int:
        """0 after SIGINT/SIGTERM; 1 when a server fails to start or the dispatcher dies."""
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, lambda signum, frame: self._stop.set())
        try:
            return self._serve()
        finally:
            for child in reversed(self.children):
                child.stop(self.config.grace_period_s)

    def _serve(self) -> int:
        config = self.config
        if config.port:
            check_port_free(config.port)
        port, *worker_ports = free_ports(config.workers + 1)
        port = config.port or port
        dispatcher = _Child("dispatcher", self._argv("dispatcher", port, ""), self._log)
        self.children.append(dispatcher)
        if not self._wait_ready([dispatcher]):
            return 1
        for index, worker_port in enumerate(worker_ports):
            self.children.append(_Child(f"worker:{index}", self._argv(
                "worker", worker_port, f"localhost:{port}"), self._log))
        if not self._wait_ready(self.children[1:]):
            return 1
        for index, child in enumerate(self.children[1:]):
            self._log(f"data worker {index} (pid {child.popen.pid}) on localhost:{worker_ports[index]}")
        self._log(f"dispatcher (pid {dispatcher.popen.pid}) and {config.workers} data worker(s) "
                  f"serve; pass --data_service={SCHEME}{config.host}:{port}; Ctrl-C or SIGTERM "
                  "stops them")
        self._out(f"{SCHEME}{config.host}:{port}")
        return self._watch()

    def _wait_ready(self, children: Sequence[_Child]) -> bool:
        deadline = time.monotonic() + self.config.startup_timeout_s
        while not all(child.ready.is_set() for child in children):
            failed = next((c for c in children if c.popen.poll() is not None), None)
            if failed is not None:
                self._log(f"error: the {failed.name} exited with status {failed.popen.returncode} "
                          "while starting (its output is above)")
                return False
            if self._stop.is_set():
                return False
            if time.monotonic() > deadline:
                self._log(f"error: not every server was up within --startup_timeout="
                          f"{self.config.startup_timeout_s:g}s; a slow machine may need more")
                return False
            time.sleep(0.1)
        return True

    def _watch(self) -> int:
        lost: set[str] = set()
        while not self._stop.wait(0.2):
            for child in self.children:
                status = child.popen.poll()
                if status is None or child.name in lost:
                    continue
                if child.name == "dispatcher":
                    self._log(f"error: the dispatcher exited with status {status}; the service "
                              "is gone (the trainers' jobs lived there)")
                    return 1
                lost.add(child.name)
                self._log(f"data {child.name} (pid {child.popen.pid}) exited with status "
                          f"{status}; {len(self.children) - 1 - len(lost)} data worker(s) serve on")
        self._log("stopping the data workers and the dispatcher")
        return 0


def wait_for_signal() -> int:
    """A child server's life after start-up: until SIGTERM or SIGINT (blocked
    by `block_signals` before the server's threads started, so only this
    wait takes them); the signal's number."""
    return signal.sigwait({signal.SIGTERM, signal.SIGINT})


def block_signals() -> None:
    """Blocks SIGTERM and SIGINT in this thread and every thread started after."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

