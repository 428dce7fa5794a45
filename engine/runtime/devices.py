"""Device specs (`gpu:0,gpu:1`, `cpu:0,...,cpu:3`) and logical CPU devices.

TensorFlow lets a process split its CPU into logical devices only before the
runtime initializes, and only once. That is how every multi-device run on a
CPU-only machine works, so this module is the single place that does it and
the single place that says, in one line, when it can no longer be done. The
size of TF's intra-op thread pool is fixed at the same moment, so it is set
here too (`configure_threads`).

GPUs are set up at the same moment (`restrict_gpus`): a process sees only the
GPUs its `--devices` names (TensorFlow would otherwise reserve memory on every
GPU of the machine), optionally with memory growth, and when TensorFlow sees
no GPU while `nvidia-smi` does, the reason is given (`missing_gpu_reason`).
So is splitting each GPU into virtual GPUs (`--virtual_gpus`, `split_gpus`),
which lets one GPU run several replicas and test every collective except NCCL
(one physical GPU per replica; `collectives.gpus` tells the collectives which
devices share one). `--devices` then names logical GPUs.

`exact_float32()` turns TF32 off for comparisons of float32 results: on
Ampere and later GPUs TensorFlow runs float32 matmuls and convolutions in
TF32 by default (10-bit mantissa), which differs from one device to the next
far more than the 1e-5 the equivalence checks allow.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Mapping, Optional, Sequence

import tensorflow as tf

from tfloop.collectives import device_names, gpus as logical_gpus
from tfloop.engine.errors import ConfigError
from tfloop.launch import gpus as machine_gpus, threads

logger = logging.getLogger(__name__)


#: The most CPU devices `--devices` may name (`cpu:0..cpu:63`). Each logical
#: CPU is a whole TensorFlow device (its executor, allocator and a replica's
#: copy of every variable) sharing the same cores: they exist to test
#: multi-device code on one machine, which 64 covers many times over, while
#: `cpu:100000` spent minutes and gigabytes creating 100001 of them.
MAX_LOGICAL_CPUS = 64


def parse_devices(spec: str, *, virtual_gpus: int = 0) -> list[str]:
    """Parses `gpu:0,gpu:1` into canonical names `["/gpu:0", "/gpu:1"]`;
    TensorFlow's own spellings of this process's devices (`/device:GPU:0`,
    `/job:localhost/replica:0/task:0/device:GPU:0`) are accepted too.

    An empty spec means "every GPU, or cpu:0 when there is none": every
    logical GPU, `virtual_gpus` per physical GPU when that is set.
    """
    spec = spec.strip()
    if not spec:
        gpus = tf.config.list_physical_devices("GPU")
        if not gpus:
            reason = missing_gpu_reason()
            if reason:
                logger.warning("training on cpu:0: %s", reason)
        count = (len(gpus) * virtual_gpus if virtual_gpus
                 else logical_gpus.logical_gpu_count(logical_gpus.logical_split(gpus)))
        return [f"/gpu:{i}" for i in range(count)] or ["/cpu:0"]
    names = []
    for item in spec.split(","):
        name = device_names.canonical(item)
        if name is None:
            raise ConfigError(
                f"--devices: {item.strip()!r} is not a device of this process; write a "
                "comma-separated list of gpu:N or cpu:N (or TensorFlow's /device:GPU:N), e.g. "
                "--devices=gpu:0,gpu:1 or --devices=cpu:0,cpu:1"
            )
        names.append(name)
    too_high = [n for n in names if device_names.kind(n) == "cpu"
                and device_names.index(n) >= MAX_LOGICAL_CPUS]
    if too_high:
        raise ConfigError(
            f"--devices: {device_names.short_list(too_high[:1])} is beyond the "
            f"{MAX_LOGICAL_CPUS} logical CPU devices one process may create "
            f"(cpu:0..cpu:{MAX_LOGICAL_CPUS - 1}); name fewer CPU devices")
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ConfigError(
            f"--devices: {device_names.short_list(duplicates, ', ')} listed more than once; "
            "name each device once"
        )
    return names


def ensure_logical_cpus(count: int) -> None:
    """Makes at least `count` CPU devices visible, splitting the physical CPU
    into logical devices if needed.

    Safe to call repeatedly; fails with a `ConfigError` if TensorFlow already
    initialized its devices with fewer CPUs (a process-lifetime limitation).
    """
    cpus = tf.config.list_physical_devices("CPU")
    if count <= len(cpus):
        return
    configured = tf.config.get_logical_device_configuration(cpus[0])
    if configured is not None and len(configured) >= count:
        return
    try:
        tf.config.set_logical_device_configuration(
            cpus[0], [tf.config.LogicalDeviceConfiguration()] * count
        )
    except RuntimeError:
        have = len(tf.config.list_logical_devices("CPU"))
        raise ConfigError(
            f"--devices asks for {count} CPU devices but TensorFlow already started with "
            f"{have}; logical CPU devices must be configured before anything else runs "
            "(start a new process)"
        ) from None


#: The devices `use_devices` set up in this process ("" until it is called).
_CHOSEN = ""


def use_devices(devices: str, *, intra_op_threads: int = -1) -> None:
    """Sets up `devices` ("cpu:0,cpu:1", "gpu:0,gpu:1") now, before a script
    builds its data, and makes them what `fit` trains on by default.

    A tutorial's `strategy = tf.distribute.MirroredStrategy()` comes before
    its dataset for this reason: TensorFlow fixes its device list (and the
    logical CPU devices the CPU is split into) the first time anything
    touches it, and a `tf.data.Dataset` does. Call this at the top of the
    script (`tfloop.use_devices("cpu:0,cpu:1")`); one after TensorFlow
    started with fewer devices is a `ConfigError` (one line).
    `intra_op_threads` is `RunConfig.intra_op_threads` (-1: the engine's choice).
    """
    global _CHOSEN
    names = prepare_devices(parse_devices(devices))
    configure_threads(names, intra_op_threads)
    _CHOSEN = devices


def chosen() -> str:
    """What `use_devices` named ("" when it was not called)."""
    return _CHOSEN


#: Memory of each virtual GPU when the GPUs' own cannot be read (nvidia-smi).
FALLBACK_VIRTUAL_GPU_MB = 2048


def virtual_gpu_memory_mb(count: int, total_mb: Optional[int]) -> int:
    """Memory limit of each of `count` virtual GPUs on a GPU of `total_mb`:
    an equal share of 90% of it (the rest stays for CUDA's own context), or
    `FALLBACK_VIRTUAL_GPU_MB` when the size is unknown."""
    if not total_mb:
        return FALLBACK_VIRTUAL_GPU_MB
    return max(1, int(total_mb * 0.9) // count)


def _smallest_gpu_mb() -> Optional[int]:
    """The memory of the smallest GPU nvidia-smi lists, in MiB (None: unknown).
    Read without TensorFlow, which could only tell after it has started."""
    lines = machine_gpus.nvidia_smi("--query-gpu=memory.total", "--format=csv,noheader,nounits")
    try:
        return min(int(line) for line in lines) if lines else None
    except ValueError:
        return None


def nvidia_smi_details() -> list[str]:
    """One line per GPU nvidia-smi lists (index, name, memory, driver, compute
    capability); [] without nvidia-smi."""
    return machine_gpus.nvidia_smi(
        "--query-gpu=index,name,memory.total,driver_version,compute_cap",
        "--format=csv,noheader") or []


def split_gpus(count: int) -> int:
    """`--virtual_gpus=count`: splits every GPU into `count` logical GPUs
    (`tf.config.set_logical_device_configuration`); returns each one's
    memory limit in MiB. Must run before TensorFlow initializes.

    Raises:
      ConfigError: no GPU, or TensorFlow already started with another layout.
    """
    physical = tf.config.list_physical_devices("GPU")
    if not physical:
        raise ConfigError(
            f"--virtual_gpus={count} splits each GPU, but TensorFlow sees no GPU on this "
            "machine; drop it (on CPUs, --devices=cpu:0,cpu:1,... makes logical CPU devices)")
    memory_mb = virtual_gpu_memory_mb(count, _smallest_gpu_mb())
    layout = [tf.config.LogicalDeviceConfiguration(memory_limit=memory_mb)] * count
    try:
        for gpu in physical:
            tf.config.set_logical_device_configuration(gpu, layout)
    except RuntimeError:
        raise ConfigError(
            f"--virtual_gpus={count} comes too late: TensorFlow already started with "
            f"{len(tf.config.list_logical_devices('GPU'))} GPU(s); virtual GPUs must be "
            "configured before anything else runs (start a new process)") from None
    logger.info("--virtual_gpus=%d: each of %d GPU(s) split into %d logical GPUs of %d MiB "
                "(NCCL cannot run on them; auto picks ring)", count, len(physical), count,
                memory_mb)
    return memory_mb


def prepare_devices(names: Sequence[str], *, memory_growth: bool = False,
                    virtual_gpus: int = 0) -> list[str]:
    """Checks that every named device exists, creating logical CPUs on demand,
    splitting the GPUs when `virtual_gpus` is set, and makes only the named
    GPUs visible (`restrict_gpus`).

    Returns the names to build the strategy on: the GPUs renumbered as
    TensorFlow numbers the visible ones (`--devices=gpu:2,gpu:3` trains on
    `/gpu:0,/gpu:1`, which *are* physical GPUs 2 and 3; the mapping is logged).
    Must run before any other TensorFlow work in the process.
    """
    if virtual_gpus:
        split_gpus(virtual_gpus)
    cpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "cpu"]
    gpu_ids = [device_names.index(n) for n in names if device_names.kind(n) == "gpu"]
    if gpu_ids:
        num_gpus = logical_gpus.logical_gpu_count(
            logical_gpus.logical_split(tf.config.list_physical_devices("GPU")))
        missing = [i for i in gpu_ids if i >= num_gpus]
        if missing and not num_gpus:
            reason = missing_gpu_reason() or (
                "TensorFlow sees no GPU on this machine; for an NVIDIA GPU install GPU support "
                "with pip install '.[gpu]' (TensorFlow's CUDA wheels, Linux) and check that "
                "nvidia-smi lists it")
            raise ConfigError(f"--devices: gpu:{missing[0]} does not exist: {reason}; or use "
                              "cpu:N devices, e.g. --devices=cpu:0,cpu:1")
        if missing:
            raise ConfigError(
                f"--devices: gpu:{missing[0]} does not exist; this machine has {num_gpus} GPU(s) "
                f"(gpu:0..gpu:{num_gpus - 1})")
    if cpu_ids:
        ensure_logical_cpus(max(cpu_ids) + 1)
    names = restrict_gpus(names)
    if memory_growth:
        enable_memory_growth()
    warn_ptx_jit()
    return names


# --- GPUs: visibility, memory, and what to say when there are none. ---


def restrict_gpus(names: Sequence[str]) -> list[str]:
    """Makes this process see only the GPUs in `names` (none when `names` has
    only CPUs) and returns `names` renumbered the way TensorFlow numbers the
    visible GPUs: in physical order, from 0.

    Without it every process reserves memory on every GPU of the machine, and
    a `bin/launch` worker told `--devices=gpu:1` still holds gpu:0 of its
    neighbour. Too late (TensorFlow already initialized its GPUs, e.g. a
    notebook that touched a tensor first): with every GPU still visible the
    names are kept as they are (logged); a process already restricted to
    other GPUs is a `ConfigError`.
    """
    physical = tf.config.list_physical_devices("GPU")
    if not physical or not names:
        return list(names)
    # With virtual GPUs a name is a logical GPU: keep its physical GPU visible,
    # and number it as TensorFlow will, among the logical GPUs of the visible ones.
    split = logical_gpus.logical_split(physical)
    owner = logical_gpus.physical_gpu_of(split)
    first = [sum(split[:p]) for p in range(len(split))]
    wanted = sorted({owner[device_names.index(n)] for n in names
                     if device_names.kind(n) == "gpu"})

    def visible_index(name: str) -> int:
        p = owner[device_names.index(name)]
        before = sum(split[q] for q in wanted if q < p)
        return before + device_names.index(name) - first[p]

    renumbered = [f"/gpu:{visible_index(n)}" if device_names.kind(n) == "gpu" else n
                  for n in names]
    visible = tf.config.get_visible_devices("GPU")
    target = [physical[i] for i in wanted]
    if [d.name for d in visible] == [d.name for d in target]:
        return renumbered
    try:
        tf.config.set_visible_devices(target, "GPU")
    except RuntimeError:
        if len(visible) == len(physical):
            logger.info("GPUs: TensorFlow already started with all %d GPUs visible in this "
                        "process; using %s as named", len(physical),
                        device_names.short_list(names))
            return list(names)
        raise ConfigError(
            f"--devices={device_names.short_list(names, ',')} comes too late: TensorFlow "
            f"already started in this process with {len(visible)} of the {len(physical)} GPUs "
            "visible; choose the GPUs before anything else runs (start a new process)"
        ) from None
    mapping = ", ".join(f"{device_names.short(n)} -> {r}" for n, r in sorted(
        ((n, r) for n, r in zip(names, renumbered) if device_names.kind(n) == "gpu"),
        key=lambda pair: device_names.index(pair[0])))
    logger.info("GPUs visible to this process: %s (of %d; the others are hidden)",
                mapping or "none", len(physical))
    return renumbered


def enable_memory_growth() -> None:
    """`--gpu_memory_growth`: each visible GPU's memory is allocated as it is
    needed instead of (nearly) all of it at start, so several processes can
    share a GPU; the same as `TF_FORCE_GPU_ALLOW_GROWTH=true`, which TensorFlow
    lets override this setting."""
    for gpu in tf.config.get_visible_devices("GPU"):
        try:
            tf.config.experimental.set_memory_growth(gpu, True)
        except RuntimeError:
            raise ConfigError(
                "--gpu_memory_growth comes too late: TensorFlow already started in this process "
                "with its GPU memory reserved; set it before anything else runs (start a new "
                "process), or set TF_FORCE_GPU_ALLOW_GROWTH=true") from None
    forced = os.environ.get("TF_FORCE_GPU_ALLOW_GROWTH")
    if forced is not None and forced.lower() != "true":
        logger.warning("--gpu_memory_growth: TF_FORCE_GPU_ALLOW_GROWTH=%s overrides it", forced)


def missing_gpu_reason() -> Optional[str]:
    """Why TensorFlow registers no GPU although `nvidia-smi` lists some, in one
    clause, or None (no `nvidia-smi`, it lists none, or TF sees GPUs).

    TensorFlow logs its own reason ("Cannot dlopen some GPU libraries") in C++
    lines that the binaries' quiet logging hides; the usual cause is the plain
    `tensorflow` wheel, which has no CUDA libraries of its own.
    """
    listed = machine_gpus.nvidia_smi_gpus()
    if not listed or tf.config.list_physical_devices("GPU"):
        return None
    seen = f"nvidia-smi lists {len(listed)} GPU(s) but TensorFlow registers none"
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and not hidden.strip():
        return f"{seen}: CUDA_VISIBLE_DEVICES is empty, which hides them; unset it"
    if not tf.sysconfig.get_build_info().get("is_cuda_build", False):
        return (f"{seen}: this TensorFlow build has no CUDA support; install the Linux "
                "x86_64 wheel with pip install '.[gpu]'")
    return (f"{seen}: the CUDA libraries are not installed (the plain tensorflow wheel has "
            "none); install them with pip install '.[gpu]' (tensorflow[and-cuda]), or run "
            "with --verbose to see TensorFlow's own reason")


def ptx_jit_gpus() -> list[tuple[str, str]]:
    """`(device, "9.0")` for each visible GPU this TensorFlow build has no
    native kernels for: its CUDA kernels are then compiled from PTX by the
    driver when first used (TF 2.21 ships sm_60..sm_89 and compute_90 PTX, so
    an H100, compute capability 9.0, JIT-compiles).

    A native kernel (`sm_XY`) runs on a GPU of the same major version and a
    minor version of at least Y.
    """
    built = tf.sysconfig.get_build_info().get("cuda_compute_capabilities") or []
    native = {(int(c[3:-1]), int(c[-1])) for c in built if c.startswith("sm_") and c[3:].isdigit()}
    found = []
    for gpu in tf.config.get_visible_devices("GPU"):
        capability = tf.config.experimental.get_device_details(gpu).get("compute_capability")
        if not capability:
            continue
        major, minor = capability
        if not any(m == major and n <= minor for m, n in native):
            found.append((gpu.name, f"{major}.{minor}"))
    return found


def warn_ptx_jit() -> None:
    """One line when the first start will JIT-compile TensorFlow's kernels
    (`ptx_jit_gpus`): minutes on the first run, cached for the next ones in
    the driver's compute cache (`CUDA_CACHE_MAXSIZE`, default 256 MiB, too
    small for TensorFlow's kernels: raise it, e.g. to 4 GiB)."""
    jit = ptx_jit_gpus()
    if not jit:
        return
    capability = jit[0][1]
    built = ", ".join(tf.sysconfig.get_build_info().get("cuda_compute_capabilities") or [])
    cache = os.environ.get("CUDA_CACHE_MAXSIZE")
    advice = (f"CUDA_CACHE_MAXSIZE={cache}" if cache else "set CUDA_CACHE_MAXSIZE=4294967296: "
              "the default 256 MiB is too small to keep them")
    logger.warning(
        "%d GPU(s) of compute capability %s have no native kernels in this TensorFlow build "
        "(%s): the CUDA driver compiles them from PTX on first use, which can take several "
        "minutes on the first start; later starts read the driver's cache (%s)", len(jit),
        capability, built, advice)


def support_task_devices(names: Sequence[str], role_name: str) -> list[str]:
    """The one device of a task that trains no replica (the evaluator, a ps
    task): the first of `names`, or cpu:0 when that is a GPU and this task was
    given none (`bin/launch --gpus_per_task` gives ps tasks and the evaluator
    no GPU unless asked, and runs the same command as the workers)."""
    first = list(names[:1]) or ["/cpu:0"]
    if device_names.kind(first[0]) == "gpu" and not tf.config.list_physical_devices("GPU"):
        logger.info("%s: no GPU visible to this task; it runs on cpu:0", role_name)
        return ["/cpu:0"]
    return first


#: `configure_threads`: TF's own default (one intra-op thread per core).
TF_DEFAULT_THREADS = 0
#: `configure_threads`: one core's share per CPU replica when there are several.
AUTO_THREADS = -1

usable_cores = threads.usable_cores


def intra_op_threads_for(names: Sequence[str], requested: int = AUTO_THREADS,
                         environ: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The intra-op pool size to use, or None for TensorFlow's default.

    Auto gives each CPU replica its share of the process's cores: the
    replicas already run side by side (one inter-op task each), so also
    splitting every op across all cores makes them hand work between threads
    for nothing. On this 2-core machine with 4 logical CPUs (bin/bench_collectives)
    a 256 KiB reduce-to-one-device all-reduce took 76 us with one intra-op
    thread against 180-360 us with TF's default of two, 1 MiB 154 us against
    190-340 us, and the mlp trained 26k examples/s against 19k
    (docs/collectives.md, docs/performance.md). The process's cores are
    `TF_NUM_INTRAOP_THREADS` when set (bin/launch sets it to each task's share
    of the host, `launch.threads`), else every usable core; one CPU replica
    (or GPUs) without that variable keeps TF's default.
    """
    if requested > 0:
        return requested
    if requested == TF_DEFAULT_THREADS:
        return None
    try:
        given = threads.budget(os.environ if environ is None else environ)
    except threads.ThreadsError as error:
        raise ConfigError(str(error)) from None
    cpu_replicas = sum(1 for n in names if device_names.kind(n) == "cpu")
    if given is not None:
        return max(1, given // max(1, cpu_replicas))
    if cpu_replicas < 2:
        return None
    return max(1, usable_cores() // cpu_replicas)


def configure_threads(names: Sequence[str], requested: int = AUTO_THREADS) -> Optional[int]:
    """Sets TF's intra-op pool for `names` (see `intra_op_threads_for`);
    returns the size in force when it is not TF's default.

    Like logical devices, this only works before TensorFlow initializes: an
    explicit size that comes too late is a `ConfigError`; the automatic one
    quietly leaves TF's default (tests that share one process do that).
    """
    threads = intra_op_threads_for(names, requested)
    current = tf.config.threading.get_intra_op_parallelism_threads()
    if threads is None or threads == current:
        return current or None
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
    except RuntimeError:
        if requested > 0:
            raise ConfigError(
                f"--intra_op_threads={requested} comes too late: TensorFlow already started in "
                "this process with its thread pools sized; set it before anything else runs "
                "(start a new process)"
            ) from None
        return current or None
    return threads


#: oneDNN's CPU instruction sets (its `ONEDNN_MAX_CPU_ISA` names), oldest
#: first, each with the /proc/cpuinfo flags it adds to the one before.
_ISAS = (("sse41", {"sse4_1"}), ("avx", {"avx"}), ("avx2", {"avx2", "fma"}),
         ("avx512_core", {"avx512f", "avx512bw", "avx512vl", "avx512dq"}),
         ("avx512_core_vnni", {"avx512_vnni"}), ("avx512_core_bf16", {"avx512_bf16"}),
         ("avx512_core_amx", {"amx_tile", "amx_int8", "amx_bf16"}))


def _cpuinfo(field: str) -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                name, _, value = line.partition(":")
                if name.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return ""


def cpu_isa(environ: Optional[Mapping[str, str]] = None) -> str:
    """The instruction set TensorFlow's oneDNN CPU kernels dispatch to here:
    the newest this CPU has, capped by `ONEDNN_MAX_CPU_ISA` (which TF 2.21's
    oneDNN honours: with `AVX2` an AVX-512 host runs the kernels of an
    AVX2-only one). Kernels of different instruction sets may round float32
    sums differently; "unknown" where /proc/cpuinfo is not readable."""
    environ = os.environ if environ is None else environ
    flags, best = set(_cpuinfo("flags").split()), "unknown" if not _cpuinfo("flags") else "sse"
    for name, needs in _ISAS:
        if not needs <= flags:
            break
        best = name
    cap = environ.get("ONEDNN_MAX_CPU_ISA", "").strip().lower()
    names = [name for name, _ in _ISAS]
    if best in names and cap and cap not in ("all", "default"):
        capped = [name for name in names if cap == name or cap.startswith(name + "_")]
        if capped and names.index(capped[-1]) < names.index(best):
            best = capped[-1]
    if environ.get("TF_ENABLE_ONEDNN_OPTS", "").strip() == "0":
        best += " (oneDNN off)"
    return best


def numerics(pool: Optional[int]) -> dict:
    """What a float32 CPU sum depends on besides the numbers summed: the
    threads each op splits over (`pool`, the intra-op pool in force; None:
    TF's default, every usable core) and the kernels' instruction set. Two
    runs give bit-identical weights only when both agree (run.json records
    them; docs/reliability.md, "What "the same weights" needs"). The CPU's name is kept too,
    for the reader."""
    return {"threads_per_replica": pool or usable_cores(), "cpu_isa": cpu_isa(),
            "cpu": _cpuinfo("model name") or "unknown"}


def max_relative_difference(a: Sequence, b: Sequence) -> float:
    """Largest |a - b| relative to the largest |a| of the same variable, over
    two lists of weights: the measure every replicas-equal-one-device check of
    this project uses (the tests, bin/gpu_check), with its bound 1e-5."""
    import numpy as np

    return max(float(np.max(np.abs(np.asarray(x) - np.asarray(y)))
                     / max(float(np.max(np.abs(np.asarray(x)))), 1e-30))
               for x, y in zip(a, b))


@contextlib.contextmanager
def exact_float32() -> Iterator[None]:
    """TF32 off inside the block, restored after: float32 matmuls and
    convolutions in full float32 on GPUs (a no-op on CPUs), for checks that
    compare replicas with one device."""
    previous = tf.config.experimental.tensor_float_32_execution_enabled()
    tf.config.experimental.enable_tensor_float_32_execution(False)
    try:
        yield
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(previous)
