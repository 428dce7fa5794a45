"""Shared test helpers: running binaries in subprocesses, and real digit data.

Binaries run in their own process because logical devices can be configured
only once per process, and because that is how users run them. Each is a
fork of the binary server (tests/bin_server.py), which has imported
TensorFlow once, unless a test asks for a fresh interpreter (`fresh=True`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np

import bin_server  # standard library only until a binary is started

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: Real handwritten digits, 1797 of them, 8x8 (tests/data/README.md says whose).
DIGITS = os.path.join(REPO, "tests", "data", "digits_8x8.npz")

#: Set to 1 to let the suite see the machine's GPUs (for `pytest -m gpu`).
SHOW_GPUS = "TFLOOP_TEST_GPUS"


def hide_gpus(environ) -> None:
    """The CPU suite sees no GPU, on any machine: its assertions assume none
    (`parse_devices("")` is cpu:0, gpu:0 does not exist) and its parallel
    processes would otherwise share the GPUs. Must run before TensorFlow
    starts; `TFLOOP_TEST_GPUS=1` leaves the GPUs visible."""
    if environ.get(SHOW_GPUS) != "1":
        environ["CUDA_VISIBLE_DEVICES"] = ""


#: The intra-op threads every run of the suite computes with, in-process
#: (tests/conftest.py) and in every binary (`bin_env`), whatever its replicas:
#: the tests compare runs' weights, and TensorFlow's float32 CPU kernels round
#: sums differently with different thread counts on some CPUs (an AMD EPYC
#: host: 1 and 2 threads part at step 21), so both sides of every comparison
#: must use the same threads per replica. `TF_NUM_INTRAOP_THREADS` is the
#: engine's per-process budget (`launch.threads`), which bin/launch passes on.
COMPARED_THREADS = {"TF_NUM_INTRAOP_THREADS": "1"}


def bin_env(env: dict | None = None, **extra: str) -> dict:
    """A binary's environment: this one, GPUs hidden (`hide_gpus`), quiet
    TensorFlow, `COMPARED_THREADS`, then `env` (a value of None removes that
    variable)."""
    full_env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", **COMPARED_THREADS, **extra)
    hide_gpus(full_env)
    for key, value in (env or {}).items():
        if value is None:
            full_env.pop(key, None)
        else:
            full_env[key] = value
    return full_env


#: Set to 1 to run every binary of the suite in a fresh interpreter instead of
#: a fork of the binary server (tests/bin_server.py says what that changes).
FRESH = "TFLOOP_TEST_FRESH"

_SERVER = None


def _served(env: dict, fresh: bool) -> bool:
    """Whether a binary may be a fork of the server: not when the test (or its
    environment's `TFLOOP_TEST_FRESH=1`) asks for a fresh interpreter, nor when
    the environment changes what an interpreter reads at start (`PYTHONHASHSEED`,
    ...), which the server read long ago; the server's child reads `PYTHONPATH`
    (and `PYTHONUNBUFFERED`) as a fresh interpreter would."""
    if fresh or "1" in (os.environ.get(FRESH), env.get(FRESH)):
        return False
    keys = {key for key in (*env, *os.environ) if key.startswith("PYTHON")}
    return all(env.get(key) == os.environ.get(key)
               for key in keys - {"PYTHONUNBUFFERED", "PYTHONPATH"})


def _server():
    global _SERVER
    if _SERVER is None:
        _SERVER = bin_server.BinServer(bin_env(), REPO)
    return _SERVER


#: Binaries that import no TensorFlow (`bin/launch`; `bin/data_service`'s
#: supervisor, whose dispatcher and workers it starts fresh itself): a fresh
#: interpreter starts them for 0.1-0.3 s of CPU, what a fork of the binary server
#: costs, and is how a user runs them, so `run_bin`/`start_bin` always start them fresh.
WITHOUT_TENSORFLOW = ("launch", "data_service")


def run_bin(name: str, *args: str, timeout: float = 240, env: dict | None = None,
            fresh: bool = False):
    """Runs `bin/<name> args...`; returns CompletedProcess. A fork of the binary
    server (tests/bin_server.py) unless `fresh` or the binary imports no
    TensorFlow (`WITHOUT_TENSORFLOW`): then this interpreter, started anew, for
    what happens before TensorFlow is imported."""
    return run_python([os.path.join(REPO, "bin", name), *args], env=bin_env(env),
                      timeout=timeout, fresh=fresh or name in WITHOUT_TENSORFLOW)


def _completed(process, timeout: float) -> subprocess.CompletedProcess:
    """`subprocess.run`'s ending for a started process (a `Popen` or a served
    fork): its output, or on a timeout the process killed and `TimeoutExpired` raised."""
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        raise
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def without_tensorflow(tmp_path) -> dict:
    """An environment whose `tensorflow` fails on import: a binary run with it
    proves a refusal comes before TensorFlow's seconds of start-up."""
    stub = tmp_path / "no_tensorflow" / "tensorflow"
    stub.mkdir(parents=True, exist_ok=True)
    (stub / "__init__.py").write_text("raise ImportError('tensorflow was imported')\n")
    return {"PYTHONPATH": str(stub.parent), FRESH: "1"}


def start_bin(name: str, *args: str, fresh: bool = False, env: dict | None = None):
    """Starts `bin/<name>` without waiting (a `subprocess.Popen`, or the server's
    fork that answers as one: `run_bin` says when); the caller must bound its waits."""
    return start_python([os.path.join(REPO, "bin", name), *args],
                        fresh=fresh or name in WITHOUT_TENSORFLOW,
                        env=bin_env(env, PYTHONUNBUFFERED="1"))


def start_python(args: list[str], *, env: dict, cwd: str = REPO, stdout=subprocess.PIPE,
                 stderr=subprocess.PIPE, fresh: bool = False):
    """`subprocess.Popen([python, *args], text=True, ...)` for a script or `-c`
    code that imports TensorFlow: a fork of the binary server unless `fresh`
    (`run_bin` says when). `env` is the whole environment (`bin_env`)."""
    if _served(env, fresh):
        try:
            return _server().spawn(list(args), env=env, cwd=cwd, stdout=stdout, stderr=stderr)
        except bin_server.NotServed:
            pass
    return subprocess.Popen([sys.executable, *args], stdout=stdout, stderr=stderr,
                            text=True, env=env, cwd=cwd)


def run_python(args: list[str], *, env: dict, cwd: str = REPO, timeout: float = 240,
               fresh: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run([python, *args], capture_output=True, text=True, ...)`,
    served as `start_python` is."""
    return _completed(start_python(args, env=env, cwd=cwd, fresh=fresh), timeout)


def wait_for_output(process: subprocess.Popen, text: str, timeout: float = 120) -> str:
    """Reads `process` stdout until a line contains `text`; returns what it read."""
    import time

    deadline, seen = time.time() + timeout, ""
    while text not in seen and time.time() < deadline:
        line = process.stdout.readline()
        if not line:
            break
        seen += line
    assert text in seen, seen + process.stderr.read()
    return seen


def write_digits_npz(directory: str, *, seed: int = 0) -> str:
    """Writes real 8x8 handwritten digits (tests/data/README.md) as a Keras-layout mnist.npz.

    Each 8x8 image (values 0..16) becomes 24x24 by pixel repetition, padded to
    28x28 and scaled to 0..255; 80% train, 20% test, shuffled with `seed`.
    No download: the 1797 digits are a file of the suite's own.
    """
    with np.load(DIGITS) as digits:
        images, labels = digits["images"], digits["labels"]
    images = np.kron(images, np.ones((3, 3)))  # (N, 24, 24)
    images = np.pad(images, ((0, 0), (2, 2), (2, 2)))
    images = np.round(images * (255.0 / 16.0)).astype(np.uint8)
    order = np.random.default_rng(seed).permutation(len(labels))
    images, labels = images[order], labels[order]
    split = int(0.8 * len(labels))
    path = os.path.join(directory, "mnist.npz")
    np.savez(path, x_train=images[:split], y_train=labels[:split],
             x_test=images[split:], y_test=labels[split:])
    return path


def write_tfrecord_dir(directory: str, *, num_shards: int = 4, num_train: int = 512,
                       num_eval: int = 128, seed: int = 0) -> str:
    """Writes synthetic digits (28x28x1, 10 classes) as a `--dataset=tfrecord`
    folder of `num_shards` train and eval files; returns `directory`.

    `--auto_shard_policy=file` over W workers needs num_shards >= W.
    """
    from tfloop.inputs import convert, synthetic

    splits = synthetic.load(seed=seed, num_train=num_train, num_eval=num_eval)
    return convert.write(splits, directory, num_shards=num_shards, source="synthetic")


def write_image_folder(root, classes=("cats", "dogs", "fish"), per_class=4, shape=(40, 30)) -> str:
    """Writes `root/<class>/<class>.<i>.{png,jpg}` for `--dataset=image_folder`:
    PNG and JPEG files (alternating) of a class-specific colour plus noise."""
    import tensorflow as tf

    rng = np.random.default_rng(0)
    for label, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            image = np.clip(rng.normal(40 + 80 * label, 20, shape + (3,)), 0, 255).astype(np.uint8)
            encoded = tf.io.encode_png(image) if i % 2 == 0 else tf.io.encode_jpeg(image)
            suffix = "png" if i % 2 == 0 else "jpg"
            tf.io.write_file(os.path.join(root, name, f"{name}.{i}.{suffix}"), encoded)
    return str(root)


def worker_batches(ds, global_batch_size: int, workers: int, worker: int, steps: int) -> list:
    """What `experimental_distribute_dataset` feeds worker `worker` of a
    `workers`-worker cluster (one replica each) from `ds`, step by step, as
    NumPy: TF's rebatch and auto-shard rewrite applied as
    tensorflow/python/distribute/input_lib applies them (private API, used
    only to check the skip arithmetic and the sharding)."""
    from tensorflow.python.data.experimental.ops import distribute
    from tensorflow.python.distribute import input_ops

    ds = ds.rebatch(distribute.batch_sizes_for_worker(global_batch_size, workers, 1, worker))
    ds = input_ops.auto_shard_dataset(ds, workers, worker, workers)
    return [tuple(t.numpy() for t in batch) for batch in ds.take(steps)]


def write_jpeg_tree(root, classes=("n01", "n02", "n03"), per_class=4,
                    sizes=((40, 30), (90, 70), (64, 48), (33, 57))) -> str:
    """Writes `root/<class>/<class>_<i>.JPEG` of varied sizes (cycling through
    `sizes`, (height, width)), a class-specific colour plus noise; every
    fourth image a PNG, which the ImageNet converter re-encodes as JPEG."""
    import tensorflow as tf

    rng = np.random.default_rng(1)
    for label, name in enumerate(classes):
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for i in range(per_class):
            shape = tuple(sizes[(i + label) % len(sizes)]) + (3,)
            image = np.clip(rng.normal(40 + 80 * label, 30, shape), 0, 255).astype(np.uint8)
            png = i % 4 == 3
            encoded = tf.io.encode_png(image) if png else tf.io.encode_jpeg(image, quality=90)
            tf.io.write_file(os.path.join(root, name, f"{name}_{i}.{'png' if png else 'JPEG'}"),
                             encoded)
    return str(root)


def write_imagenet_dir(directory, *, num_shards: int = 4, per_class: int = 8,
                       classes=("n01", "n02", "n03"), eval_fraction: float = 0.25) -> str:
    """A small folder in the standard ImageNet TFRecord layout (`--dataset=imagenet`),
    converted from `write_jpeg_tree` by the project's converter."""
    from tfloop.inputs import imagenet_convert

    tree = write_jpeg_tree(f"{directory}.images", classes=classes, per_class=per_class)
    return imagenet_convert.write(tree, str(directory), num_shards=num_shards,
                                  eval_fraction=eval_fraction)


#: A watcher process (`python -c KILL_AFTER_FIRST_CHECKPOINT MODEL_DIR PID`):
#: SIGKILLs PID once MODEL_DIR's first checkpoint is written (exit 1 after 180 s without).
KILL_AFTER_FIRST_CHECKPOINT = """
import os, signal, sys, time
model_dir, pid = sys.argv[1], int(sys.argv[2])
deadline = time.monotonic() + 180
while not os.path.exists(os.path.join(model_dir, "checkpoint")):
    if time.monotonic() > deadline:
        sys.exit(1)
    time.sleep(0.02)
os.kill(pid, signal.SIGKILL)
"""


def fingerprint(folder) -> str:
    """A hash of everything under `folder`, never followed through a link:
    each entry's path, and a file's bytes and mtime, a folder's mtime (an
    entry added or removed changes it), a link's target. Equal before and
    after a run: the run touched nothing there."""
    import hashlib

    digest = hashlib.sha256()
    for root, folders, names in os.walk(folder):
        folders.sort()
        for name in sorted(folders + names):
            path = os.path.join(root, name)
            info = os.lstat(path)
            digest.update(os.path.relpath(path, folder).encode() + b"\0")
            if os.path.islink(path):
                digest.update(b"link " + os.readlink(path).encode())
            elif os.path.isdir(path):
                digest.update(b"dir %d" % info.st_mtime_ns)
            else:
                with open(path, "rb") as f:
                    digest.update(b"file %d " % info.st_mtime_ns + f.read())
    digest.update(b"top %d" % os.lstat(folder).st_mtime_ns)
    return digest.hexdigest()


def assert_one_line_error(result, *, contains: str = "") -> str:
    """A user mistake: non-zero exit, one `error:` line on stderr, no traceback."""
    assert result.returncode != 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr, result.stderr
    error_lines = [line for line in result.stderr.splitlines() if "error:" in line]
    assert len(error_lines) == 1, result.stderr
    assert contains in error_lines[0], error_lines[0]
    return error_lines[0]


#: One task's end as bin/launch reports it: "worker:0 died with signal 9
#: (SIGKILL)", "chief:0 exited with status 138" (`launcher.describe_exit`).
_TASK_ENDING = re.compile(r"\b((?:chief|worker|ps):\d+|evaluator) "
                          r"(?:exited with status (\d+)|died with signal (\d+))")


def launcher_endings(text: str) -> dict[str, int]:
    """How each task of a `bin/launch` cluster ended, read from the
    launcher's own lines (`launch: ...`, not the tasks' `[role] ...`), as
    `Popen.returncode` says it: the exit status, or -N for a death by signal N.

    Which task the launcher names first (`launch: X <ending> (...)`) and which
    after it (`launch: after X <ending>: Y <ending> (...)`) depends on which
    process the scheduler let end first: a survivor may notice a lost peer
    before the launcher's poll sees the kill. A test asserts each task's
    ending, never the order of the lines."""
    endings: dict[str, int] = {}
    for line in text.splitlines():
        if not line.startswith("launch: "):
            continue
        for label, status, signum in _TASK_ENDING.findall(line):
            code = int(status) if status else -int(signum)
            assert endings.setdefault(label, code) == code, (
                f"{label} reported ending two ways: {endings[label]} and {code}\n{text[-3000:]}")
    return endings


def process_alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie, dead but not yet reaped, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def replica_values(strategy) -> list:
    """Two per-replica tensors, shapes (3, 2) and (5,): replica r holds r + 1
    and 10 (r + 1), so their sums are known in closed form."""
    import tensorflow as tf

    def value_fn(ctx):
        r = ctx.replica_id_in_sync_group
        with tf.device(strategy.extended.worker_devices[r]):
            return [tf.fill([3, 2], float(r + 1)), tf.fill([5], 10.0 * (r + 1))]

    return list(strategy.experimental_distribute_values_from_function(value_fn))
