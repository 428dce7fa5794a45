"""The bodies of `bin/gpu_check`'s checks, each run in a process of its own.

Why a process each: TensorFlow configures devices once per process (logical
CPUs, virtual GPUs, the visible GPUs), a check may crash the process (a CUDA
or NCCL failure) or hang, and one check's failure must not stop the others.
`bench.gpu_check` starts

    python -m tfloop.bench.gpu_checks NAME PARAMS_JSON RESULT_PATH

and reads RESULT_PATH back: `{"status", "reason", "numbers"}`. A missing
file means the process died; its log says how.

Each body takes the parameters the plan gives (`devices`, `dry_run`,
`work_dir`, ...) and returns `(status, reason, numbers)`. On a machine
without a GPU the plan names logical CPUs instead of GPUs (the CPU dry run):
the bodies do not ask which.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
import time
from typing import Any, Callable, Sequence

import numpy as np
import tensorflow as tf

from tfloop.bench.check_report import FAIL, PASS, SKIPPED
from tfloop.collectives import CollectiveError
from tfloop.engine.runtime import devices as engine_devices
from tfloop.engine.runtime.devices import max_relative_difference
from tfloop.engine.run_dir import layout
from tfloop.engine.config import RunConfig
from tfloop.engine.errors import ConfigError

Outcome = tuple[str, str, dict]

#: The equivalence checks' bound, as in tests/engine/loop/test_distributed_equivalence.py.
EQUIVALENCE_TOLERANCE = 1e-5


# --- 1. What TensorFlow sees. ---


def environment(*, dry_run: bool, **_: Any) -> Outcome:
    """TensorFlow's build (CUDA, cuDNN), the GPUs it registers against those
    nvidia-smi lists, and a matmul on each device equal to NumPy's (the first
    kernel on a GPU TF has no native code for waits for the PTX JIT: timed)."""
    build = tf.sysconfig.get_build_info()
    gpus = tf.config.list_physical_devices("GPU")
    numbers: dict[str, Any] = {
        "tensorflow": tf.__version__,
        "is_cuda_build": bool(build.get("is_cuda_build", False)),
        "cuda_version": build.get("cuda_version", ""),
        "cudnn_version": build.get("cudnn_version", ""),
        "cuda_compute_capabilities": list(build.get("cuda_compute_capabilities") or []),
        "tensorflow_gpus": [g.name for g in gpus],
        "nvidia_smi": engine_devices.nvidia_smi_details(),
        "CUDA_VISIBLE_DEVICES": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    reason = engine_devices.missing_gpu_reason()
    if reason:
        numbers["missing_gpu_reason"] = reason
    details = {g.name: tf.config.experimental.get_device_details(g) for g in gpus}
    numbers["compute_capability"] = {n: ".".join(map(str, d.get("compute_capability", ())))
                                     for n, d in details.items()}
    numbers["ptx_jit"] = [f"{name} ({cc})" for name, cc in engine_devices.ptx_jit_gpus()]
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 256))
    expected = a @ b
    matmul = {}
    for index, _ in enumerate(gpus or [None]):
        device = f"/gpu:{index}" if gpus else "/cpu:0"
        start = time.perf_counter()
        with tf.device(device):
            got = tf.linalg.matmul(tf.constant(a), tf.constant(b)).numpy()  # float64: no TF32
        matmul[device] = {"seconds": round(time.perf_counter() - start, 3),
                          "max_abs_error": float(np.max(np.abs(got - expected)))}
    numbers["first_matmul"] = matmul
    wrong = [d for d, m in matmul.items() if not m["max_abs_error"] < 1e-9]
    if wrong:
        return FAIL, f"a float64 matmul on {', '.join(wrong)} differs from NumPy's", numbers
    if dry_run:
        return PASS, ("CPU dry run: TensorFlow registers no GPU" + (f" ({reason})" if reason else "")
                      + "; the matmul ran on cpu:0"), numbers
    if not gpus:
        return FAIL, reason or "TensorFlow registers no GPU", numbers
    return PASS, f"TensorFlow registers {len(gpus)} GPU(s) and runs a matmul on each", numbers


# --- 2. One device trains. ---


def _train_config(work_dir: str, **fields: Any) -> RunConfig:
    base = dict(model="mlp", dataset="synthetic", model_dir=work_dir, global_batch_size=64,
                checkpoint_interval=0, export=False, mode="train", optimizer="sgd",
                learning_rate=0.1, seed=7)
    base.update(fields)
    return RunConfig(**base)


def training(*, devices: Sequence[str], work_dir: str, steps: int, steps_per_loop: int,
             variant: dict, **_: Any) -> Outcome:
    """One device trains `steps` steps of the mlp on synthetic data with the
    `variant` flags (none, --jit_compile, --mixed_precision=mixed_float16):
    every loop's loss finite, the last loop's below the first's."""
    from tfloop.engine.assembly.run import run

    losses: list[float] = []
    record = run(_train_config(work_dir, strategy="one_device", devices=devices[0],
                               train_steps=steps, steps_per_loop=steps_per_loop, **variant),
                 on_loop_end=lambda step, metrics: losses.append(float(metrics["loss"])))
    numbers = {"device": devices[0], "flags": variant, "steps": record["step"],
               "loop_losses": [round(x, 5) for x in losses],
               "examples_per_second": record.get("examples_per_second"),
               "collective": record.get("collective")}
    if "train/skipped_steps" in record:
        numbers["skipped_steps"] = record["train/skipped_steps"]
    if not losses or not all(math.isfinite(x) for x in losses):
        return FAIL, f"a loop's loss is not finite: {losses}", numbers
    if not losses[-1] < losses[0]:
        return FAIL, f"the loss did not fall: first loop {losses[0]:.4f}, last {losses[-1]:.4f}", \
            numbers
    return PASS, f"loss {losses[0]:.4f} -> {losses[-1]:.4f} over {record['step']} steps", numbers


# --- 3 and 4. Replicas equal one device; NCCL refused where it cannot run. ---


def _prepare(devices: Sequence[str], virtual_gpus: int) -> None:
    """Every device of the check (and the virtual GPUs) made once, before any
    run: TensorFlow fixes them when it starts, so the one-device run first
    would leave the others missing (or hidden: its run would make only its GPU
    visible). Listing the logical devices starts TensorFlow with all of them."""
    engine_devices.prepare_devices(list(devices), virtual_gpus=virtual_gpus)
    tf.config.list_logical_devices()


def equivalence(*, devices: Sequence[str], work_dir: str, collectives: Sequence[str],
                models: Sequence[str], virtual_gpus: int = 0, steps: int = 6,
                **_: Any) -> Outcome:
    """For each model and collective: `mirrored` over `devices` on global
    batch B gives the weights of one device on B (SGD, TF32 off), relative
    difference below 1e-5 (the suite's tests/engine/loop/test_distributed_equivalence.py
    shows the same runs move the weights by more than 1e-2)."""
    from tfloop.engine.assembly.run import run

    _prepare(devices, virtual_gpus)
    batch = 16 * len(devices)
    numbers: dict[str, Any] = {"devices": list(devices), "global_batch_size": batch,
                               "steps": steps, "tolerance": EQUIVALENCE_TOLERANCE}
    wrong = []
    with engine_devices.exact_float32():
        for model in models:
            def weights(name: str, **fields: Any) -> list[np.ndarray]:
                result = run(_train_config(os.path.join(work_dir, f"{model}-{name}"), model=model,
                                           global_batch_size=batch, train_steps=steps,
                                           steps_per_loop=max(1, steps // 2), **fields))
                return [np.array(w) for w in result.model.get_weights()]

            one = weights("one_device", strategy="one_device", devices=devices[0])
            for collective in collectives:
                difference = max_relative_difference(one, weights(
                    collective, strategy="mirrored", devices=",".join(devices),
                    collective=collective))
                numbers[f"{model}/{collective}"] = difference
                if not difference < EQUIVALENCE_TOLERANCE:
                    wrong.append(f"{model} with {collective}: {difference:.3g}")
    if wrong:
        return FAIL, "replicas differ from one device: " + "; ".join(wrong), numbers
    worst = max(v for k, v in numbers.items() if "/" in k)
    return PASS, (f"{len(devices)} replicas equal one device with {', '.join(collectives)} "
                  f"(largest relative difference {worst:.2g} < {EQUIVALENCE_TOLERANCE:g})"), numbers


def nccl_refused(*, devices: Sequence[str], work_dir: str, virtual_gpus: int = 0,
                 **_: Any) -> Outcome:
    """`--collective=nccl` where NCCL cannot run (virtual GPUs sharing one
    card; CPUs in the dry run) is one line from the engine, before any
    training and with nothing written."""
    from tfloop.engine.assembly.run import run

    _prepare(devices, virtual_gpus)
    try:
        run(_train_config(work_dir, strategy="mirrored", devices=",".join(devices),
                          collective="nccl", train_steps=2, steps_per_loop=1))
    except (ConfigError, CollectiveError) as error:
        message = str(error)
        numbers = {"devices": list(devices), "error": type(error).__name__, "message": message,
                   "model_dir_created": os.path.exists(work_dir)}
        if "\n" in message or numbers["model_dir_created"]:
            return FAIL, "the refusal is not one line, or it wrote model_dir", numbers
        return PASS, f"refused in one line ({type(error).__name__})", numbers
    return FAIL, f"--collective=nccl trained on {','.join(devices)} instead of being refused", \
        {"devices": list(devices)}


# --- 3. Bus bandwidth. ---


def busbw(*, devices: Sequence[str], work_dir: str, collectives: Sequence[str], sizes: str,
          not_run: str = "", **_: Any) -> Outcome:
    """Each collective's all-reduce at a few sizes through the collective
    benchmark (`bench.collectives`): time, algbw, busbw, and its sum checked."""
    from tfloop.bench import collectives as bench

    results = bench.main(devices=",".join(devices), collectives=list(collectives), sizes=sizes,
                         iters=5, min_sample_ms=5.0, warmup=2, repeats=3, rounds=1,
                         overhead=False, plot=False, output_dir=work_dir,
                         progress=lambda line: print(line, flush=True))
    rows = [{"collective": r.collective, "size": bench.format_size(r.size),
             "time_us": round(r.time_us, 1), "busbw_gbs": round(r.busbw_gbs, 3),
             "correct": r.correct} for r in results.sweep]
    numbers = {"devices": list(devices), "rows": rows}
    if not_run:
        numbers["not_run"] = not_run
    wrong = bench.wrong_sums(results)
    if wrong:
        return FAIL, wrong, numbers
    best = {}
    for row in rows:
        best[row["collective"]] = max(best.get(row["collective"], 0.0), row["busbw_gbs"])
    summary = ", ".join(f"{name} {gbs:g} GB/s" for name, gbs in best.items())
    return PASS, f"sums right; best busbw {summary}" + (f"; {not_run}" if not_run else ""), \
        numbers


# --- 5. Two workers through bin/launch. ---

#: The start-up line of each worker: `worker:0: multi_worker over 2 replica(s) [gpu:0],
#: collective ... implementation NCCL (auto: every local device is a GPU), global batch ...`.
_IMPLEMENTATION = re.compile(r"(worker:\d+): multi_worker over .*?implementation "
                            r"(.+?)(?:, bytes_per_pack|, gradients in|, timeout|, global batch|$)",
                            re.MULTILINE)


def multi_worker(*, devices: Sequence[str], work_dir: str, bin_dir: str, steps: int,
                 gpus_per_task: int, expected: str, timeout: float, **_: Any) -> Outcome:
    """Two workers (`bin/launch --num_workers=2`, each its own GPU through
    `--gpus_per_task=1` on a GPU host) train with `--collective=auto`; the
    start-up line of each says which implementation really ran."""
    model_dir = os.path.join(work_dir, "model")
    command = [sys.executable, os.path.join(bin_dir, "launch"), "--num_workers=2",
               "--grace_period=5"]
    if gpus_per_task:
        command.append(f"--gpus_per_task={gpus_per_task}")
    command += ["--", sys.executable, os.path.join(bin_dir, "train"),
                "--strategy=multi_worker", "--collective=auto", f"--devices={devices[0]}",
                f"--model_dir={model_dir}", "--global_batch_size=32", f"--train_steps={steps}",
                f"--steps_per_loop={max(1, steps // 4)}", "--checkpoint_interval=0",
                "--noexport", "--mode=train", "--optimizer=sgd", "--learning_rate=0.1"]
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    print(done.stdout, flush=True)
    print(done.stderr, file=sys.stderr, flush=True)
    found = dict(_IMPLEMENTATION.findall(done.stdout))
    numbers: dict[str, Any] = {"command": " ".join(command[1:]), "exit_status": done.returncode,
                               "seconds": round(time.perf_counter() - start, 1),
                               "implementation": found}
    metrics = layout.read_json(layout.RunDir(model_dir).metrics_json)
    if metrics is not None:
        numbers.update({k: metrics.get(k) for k in ("step", "num_replicas", "train/loss")})
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return FAIL, f"bin/launch exited with status {done.returncode}: {last}", numbers
    if sorted(found) != ["worker:0", "worker:1"] or not all(
            expected in text.lower() for text in found.values()):
        return FAIL, f"expected {expected} on both workers, the start-up lines say {found}", \
            numbers
    if numbers.get("step") != steps or numbers.get("num_replicas") != 2:
        return FAIL, f"metrics.json says step {numbers.get('step')} over " \
            f"{numbers.get('num_replicas')} replicas, not {steps} over 2", numbers
    return PASS, f"2 workers trained {steps} steps with collective {expected}", numbers


# --- The suite's GPU tests (`@pytest.mark.gpu`). ---

#: What the gpu tests' command needs besides the project: pip name -> module.
#: (`-n 0` is pytest-xdist's option, the `timeout` setting pytest-timeout's.)
TEST_PACKAGES = {"pytest": "pytest", "pytest-xdist": "xdist", "pytest-timeout": "pytest_timeout"}


def missing_test_packages() -> list[str]:
    """The test packages this Python lacks: a checkout installed without the
    test extra (`pip install .`) has none of them."""
    return [name for name, module in TEST_PACKAGES.items()
            if importlib.util.find_spec(module) is None]


_PYTEST_COUNTS = re.compile(r"(\d+) (passed|failed|errors?|skipped|deselected|selected)")


def gpu_tests(*, dry_run: bool, repo: str, timeout: float, **_: Any) -> Outcome:
    """The tests marked `gpu` (deselected from the CPU suite), run with the
    GPUs visible (`TFLOOP_TEST_GPUS=1`); in the dry run only collected, which
    proves the marker selects them."""
    tests = os.path.join(repo, "tests")
    if not os.path.isdir(tests):
        return SKIPPED, f"no tests/ beside bin/ in {repo}: not a checkout", {}
    missing = missing_test_packages()
    if missing:  # else pytest's own exit status would be the only reason given
        return SKIPPED, (f"{', '.join(missing)} not installed in {sys.executable}: pip install "
                         f"'.[test]' (or run ./dev gpu-check) to run the suite's gpu tests"), \
            {"missing": missing}
    command = [sys.executable, "-m", "pytest", "-m", "gpu", "-n", "0", "-q",
               "-p", "no:cacheprovider", tests]
    if dry_run:
        command.append("--collect-only")
    env = dict(os.environ)
    if not dry_run:
        env["TFLOOP_TEST_GPUS"] = "1"
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=repo,
                          env=env)
    print(done.stdout[-20000:], flush=True)
    print(done.stderr[-20000:], file=sys.stderr, flush=True)
    summary = (done.stdout.strip().splitlines() or [""])[-1]
    counts = {kind: int(n) for n, kind in _PYTEST_COUNTS.findall(summary)}
    numbers = {"command": " ".join(command[1:]), "exit_status": done.returncode,
               "summary": summary, **counts}
    if dry_run:
        collected = re.search(r"(\d+)(?:/\d+)? tests? collected", summary)
        ran = int(collected.group(1)) if collected else 0
        if done.returncode != 0 or not ran:
            return FAIL, f"collecting the gpu tests failed: {summary or done.returncode}", numbers
        return PASS, f"{ran} gpu test(s) collected (not run: they need a GPU)", numbers
    if done.returncode != 0 or not counts.get("passed"):
        return FAIL, f"pytest -m gpu: {summary or done.returncode}", numbers
    return PASS, f"pytest -m gpu: {summary}", numbers


BODIES: dict[str, Callable[..., Outcome]] = {
    "gpu_tests": gpu_tests,
    "environment": environment, "training": training, "equivalence": equivalence,
    "nccl_refused": nccl_refused, "busbw": busbw, "multi_worker": multi_worker,
}


def child_main(argv: Sequence[str]) -> int:
    """`NAME PARAMS_JSON RESULT_PATH`: runs the body, writes its outcome.

    A user error (a refusal) is a failed check with its one line; anything
    else, too, with its type, after printing the traceback to the log."""
    from tfloop.engine.runtime import logs

    logs.configure_logging()
    tf.get_logger().setLevel("ERROR")
    body, params, result_path = BODIES[argv[0]], json.loads(argv[1]), argv[2]
    try:
        status, reason, numbers = body(**params)
    except (ConfigError, CollectiveError) as error:
        status, reason, numbers = FAIL, str(error), {}
    except Exception as error:  # noqa: BLE001 -- the report says what broke; the log has the rest
        import traceback

        traceback.print_exc()
        status, reason, numbers = FAIL, f"{type(error).__name__}: {error}".splitlines()[0], {}
    with open(result_path, "w") as file:
        json.dump({"status": status, "reason": reason, "numbers": numbers}, file, default=str)
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = child_main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no TensorFlow teardown (see bin/cli.py: skip_teardown)
