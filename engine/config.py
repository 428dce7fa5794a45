"""The run configuration: one frozen, typed record, validated once.

`bin/train` turns flags into a `RunConfig`; library code and tests build one
directly. Range checks happen here, at construction; checks that need the
machine or the file system (devices, data files, `model_dir`) happen in
`engine.assembly.run` before anything is created.
"""

from __future__ import annotations

import dataclasses
import math
import textwrap
import numbers
import os

from tfloop.engine.errors import ConfigError
from tfloop.launch import platforms  # the cluster sources (standard library only)

MODES = ("train", "evaluate", "train_and_evaluate")
#: Every mode a run can be in: --mode's values, and the evaluator task's own
#: (chosen by its TF_CONFIG role, never by --mode). engine.run has one function each.
RUN_MODES = MODES + ("continuous_evaluate",)
SHARD_POLICIES = ("auto", "file", "data", "off")
PRECISIONS = ("float32", "mixed_float16", "mixed_bfloat16")
LR_SCHEDULES = ("constant", "cosine", "step", "polynomial")
LR_SCALING = ("none", "linear")
BEST_MODES = ("auto", "max", "min")
NAN_POLICIES = ("stop", "skip_step")
#: The largest step count, interval or batch: compiled loops count steps in int32
#: (`Trainer.train`), so a larger value would wrap and loop forever at step 0.
INT32_MAX = 2**31 - 1
#: `--seed` feeds NumPy's and Python's generators (`keras.utils.set_random_seed`),
#: which take at most 32 bits.
SEED_MAX = 2**32 - 1
#: The intra-op pool TensorFlow creates at start-up has this many threads at
#: most: threads beyond the cores only time-slice one op's work, and each
#: costs a stack (100000 hung start-up and grew to 7 GB here); 1024 is above
#: the hardware threads of any CPU TensorFlow runs on (two 192-core sockets: 768).
MAX_THREADS = 1024
#: Larger square images are refused: one 8192x8192 RGB float image is 800 MB.
MAX_IMAGE_SIZE = 8192
#: --num_classes at most (a logits layer wider than this is a typo).
MAX_CLASSES = 1_000_000
#: --virtual_gpus: logical GPUs per physical GPU (each takes its share of the memory).
MAX_VIRTUAL_GPUS = 64
#: A packing bucket above 1 TiB is no bucket at all.
MAX_PACK_BYTES = 2**40
#: Timeouts above a week are a typo for 0 (no limit); Python's waits raise
#: OverflowError from about 9.2e9 s (`threading.TIMEOUT_MAX`).
MAX_TIMEOUT = 7 * 24 * 3600.0
#: --weight_decay_exclude's keyword: every variable of at most one dimension.
BIASES_AND_NORMS = "biases_and_norms"


def parse_profile_steps(text: str):
    """`"A,B"` → `(A, B)`: profile the steps that take the global step from A to B.

    Empty means no profiling. Raises the one-line ConfigError otherwise.
    """
    if not text:
        return None
    parts = [p.strip() for p in text.split(",")]
    try:
        first, last = (int(p) for p in parts)
    except ValueError:
        raise ConfigError(
            f"--profile_steps={text!r} is not two integers A,B; e.g. --profile_steps=100,110"
        ) from None
    if not 0 <= first < last <= INT32_MAX:
        raise ConfigError(
            f"--profile_steps={text!r} needs 0 <= A < B <= {INT32_MAX} (the trace covers "
            "steps A to B); e.g. --profile_steps=100,110"
        )
    return first, last


def parse_steps(flag: str, text: str) -> tuple[int, ...]:
    """`"30000,60000"` → `(30000, 60000)`: positive, increasing global steps."""
    if not text:
        return ()
    try:
        steps = tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(f"--{flag}={text!r} is not comma-separated integers; "
                          f"e.g. --{flag}=30000,60000") from None
    if any(not 1 <= s <= INT32_MAX for s in steps) or list(steps) != sorted(set(steps)):
        raise ConfigError(f"--{flag}={text!r} must be positive global steps (at most "
                          f"{INT32_MAX}) in increasing order; e.g. --{flag}=30000,60000")
    return steps


#: The `RunConfig` fields that name a file or folder: each value given is
#: checked by `check_path_text` (`check_field`), as `--model_dir` always was.
PATH_FIELDS = ("model_dir", "summaries_dir", "init_from", "data_dir")


def check_path_text(flag: str, path: str) -> None:
    """Refuses, in one line, a path spelling that cannot mean what the user
    meant, wherever a path comes from (`flag`: `--model_dir`, `--init_from`,
    `$AIP_CHECKPOINT_DIR`, `--local_model_dir`, ...; the one check of them all):

    - blank (spaces only): would name a folder of spaces, or (where blank
      means unset) silently fall back to a default;
    - a control character (a newline from a script's `$(...)`, a tab, NUL):
      a folder no one can type, or a `ValueError` traceback for NUL;
    - a leading `~` nothing expanded (the shell does not after `--flag=`),
      which would create a folder named `~` in the working directory;
    - a name that is not UTF-8 (bytes the shell passed through), which
      TensorFlow's file functions encode strictly and fail on with a
      `UnicodeEncodeError` traceback at the first file check.
    """
    if not path.strip():
        raise ConfigError(f"{flag}={path!r} is blank; name a directory{_or_unset(flag)}")
    bad = next((c for c in path if ord(c) < 32 or ord(c) == 127), None)
    if bad is not None:
        raise ConfigError(f"{flag}={path!r} holds the control character {bad!r}; remove it (a "
                          "newline often comes from a command substitution or a copied line)")
    if path.startswith("~") and os.path.expanduser(path) != path:
        raise ConfigError(
            f"{flag}={path} starts with ~, which nothing expanded (the shell does not "
            f"after {flag}=); write {os.path.expanduser(path)}"
            + (f", or {flag} {path} (with a space)" if flag.startswith("--") else ""))
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(path).decode("utf-8", "backslashreplace")
        raise ConfigError(
            f"{flag}={shown} is not valid UTF-8, and TensorFlow's file functions take "
            "UTF-8 names only; rename the directory, or choose another") from None


def _or_unset(flag: str) -> str:
    return ", or unset it" if flag.startswith("$") else ""


def check_model_dir_text(path: str) -> None:
    """`check_path_text` for `--model_dir` (`run_identity.load`'s first touch)."""
    check_path_text("--model_dir", path)


#: Integer fields and their ranges (`check_field`): a step count past int32
#: would wrap inside the compiled loop, a seed past 32 bits fails deep in NumPy.
_POSITIVE = ("global_batch_size", "steps_per_loop", "max_checkpoints",
             "accumulation_steps", "nan_max_skips")
_NON_NEGATIVE = ("image_size", "num_classes", "train_steps", "checkpoint_interval",
                 "summary_interval", "eval_interval",
                 "seed", "epochs", "steps_per_epoch", "per_replica_batch_size", "warmup_steps",
                 "max_per_replica_batch_size", "local_checkpoint_interval",
                 "early_stopping_patience", "check_collective", "virtual_gpus")
_CEILINGS = {"seed": SEED_MAX, "image_size": MAX_IMAGE_SIZE, "virtual_gpus": MAX_VIRTUAL_GPUS,
             "num_classes": MAX_CLASSES}
#: Fields that take one of a few words: (the words, what the error calls one).
_CHOICES = {"auto_shard_policy": (SHARD_POLICIES, "policy"),
            "cluster_from": (platforms.SOURCES, "cluster source"),
            "mode": (MODES, "mode"), "mixed_precision": (PRECISIONS, "policy"),
            "lr_schedule": (LR_SCHEDULES, "schedule"), "scale_learning_rate": (LR_SCALING, "rule"),
            "nan_policy": (NAN_POLICIES, "policy"), "best_mode": (BEST_MODES, "mode")}


def check_field(name: str, value) -> None:
    """Raises the one-line ConfigError for a value of `RunConfig` field `name`
    that is wrong whatever the other fields say (a bound, a choice, a finite
    number, the text of a path: `check_path_text`); fields with no such check pass.

    `RunConfig` runs it over every field before its checks of fields
    together; `bin/train` runs it over the flags given on the command line
    right after parsing them, before TensorFlow's import (seconds) and before
    a resumed run's remembered values are read: a typo is answered at once.
    Imports no TensorFlow.
    """
    if name in _POSITIVE or name in _NON_NEGATIVE:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"--{name}={value!r} must be an integer")
        low = 1 if name in _POSITIVE else 0
        high = _CEILINGS.get(name, INT32_MAX)
        if not low <= value <= high:
            what = "a positive integer" if low else "0 or more"
            raise ConfigError(f"--{name}={value} must be {what}, at most {high}")
    elif name == "eval_steps":
        if not (value == -1 or 1 <= value <= INT32_MAX):
            raise ConfigError(
                f"--eval_steps={value} must be a positive number of batches "
                f"(at most {INT32_MAX}), or -1 for the whole eval split")
    elif name == "intra_op_threads":
        if not -1 <= value <= MAX_THREADS:
            raise ConfigError(
                f"--intra_op_threads={value} must be -1 (a share of the cores "
                "per CPU replica), 0 (TensorFlow's default) or a count up to "
                f"{MAX_THREADS}")
    elif name == "straggler_threshold":
        if not (value == 0 or 1 < value <= 1000):
            raise ConfigError(f"--straggler_threshold={value} must be 0 (off) "
                              "or a factor above 1 (at most 1000), e.g. 3")
    elif name in ("collective_timeout", "eval_timeout", "startup_timeout", "hang_timeout"):
        if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT):
            raise ConfigError(f"--{name}={value} must be 0 or more seconds, at most "
                              f"{MAX_TIMEOUT:.0f} (a week)")
    elif name == "eval_fraction":
        if not 0 <= value < 1:
            raise ConfigError(f"--eval_fraction={value} must be at least 0 and below 1")
    elif name in _CHOICES:
        choices, noun = _CHOICES[name]
        if value not in choices and not (name == "mode" and not value):  # "": the default mode
            raise ConfigError(f"--{name}={value!r} is not a {noun}; choose one of: "
                              f"{', '.join(choices)}")
    elif name in PATH_FIELDS:
        if name == "model_dir" and not value:
            raise ConfigError("--model_dir is empty; name the directory for checkpoints and "
                              "summaries")
        if value:  # empty: the field's default (none, or <model_dir>/summaries)
            check_path_text(f"--{name}", value)
    elif name == "profile_steps":
        parse_profile_steps(value)
    elif name in ("learning_rate", "lr_decay_rate", "lr_power"):
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"--{name}={value} must be a positive number")
    elif name in ("end_learning_rate", "weight_decay", "clip_norm"):
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{name}={value} must be 0 or a positive number")
    elif name == "lr_decay_steps":
        parse_steps("lr_decay_steps", value)
    elif name == "ema_decay":
        if not 0 <= value < 1:
            raise ConfigError(f"--ema_decay={value} must be at least 0 and below 1 "
                              "(e.g. 0.999; 0: off)")
    elif name == "best_metric":
        if value and not value.startswith("eval/"):
            raise ConfigError(f"--best_metric={value!r} is not an evaluation metric; "
                              "name one as eval/<metric>, e.g. eval/accuracy or eval/loss")


def option(default, help: str):
    """A `RunConfig` field and its flag's help, written once: `bin/train`
    defines `--<field name>` from the default, type and this help."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training or evaluation run needs.

    Each field's help (`dataclasses.fields(RunConfig)[i].metadata["help"]`)
    is also the help of its flag (`bin/flag_defs.py` defines them), and is
    listed below by section (`help(RunConfig)`; written by `_document`).
    """

    # Distribution (SECTIONS).
    strategy: str = option(
        "mirrored", "default | one_device | mirrored | central_storage | multi_worker | "
        "parameter_server (both read TF_CONFIG) | tpu.")
    tpu: str = option(
        "", "--strategy=tpu: a Cloud TPU name, grpc://host:port, or local on a TPU VM "
        "(empty: $TPU_NAME).")
    devices: str = option(
        "", "Comma-separated gpu:N / cpu:N. Empty: every GPU, or cpu:0 without one. "
        "CPU ids beyond the physical CPUs create logical CPU devices.")
    virtual_gpus: int = option(
        0, "Split each GPU into N logical GPUs (0: off), so that one GPU runs N replicas and "
        "tests every collective but NCCL (which needs one physical GPU per replica); "
        "refused on a machine without a GPU.")
    gpu_memory_growth: bool = option(
        False, "Allocate GPU memory as needed instead of nearly all of each visible GPU at "
        "start (lets processes share a GPU; same as TF_FORCE_GPU_ALLOW_GROWTH=true).")
    collective: str = option(
        "auto", "Gradient all-reduce: auto | nccl | ring | hierarchical_copy | "
        "reduce_to_one_device, or module:Class for your own (imported from sys.path and run "
        "inside every step: trusted code only; its results are checked).")
    num_packs: int = option(0, "Pack gradients into this many buckets per all-reduce (0: off).")
    pack_bytes: int = option(0, "Pack gradients into buckets of about this many bytes (0: off).")
    gradient_dtype: str = option(
        "float32", "Dtype gradients travel in: float32 | bfloat16 | float16 (compression).")
    reduce_device: str = option(
        "", "Where --collective=reduce_to_one_device sums, e.g. cpu:0 (default: first device).")
    collective_timeout: float = option(
        0.0, "multi_worker: seconds a collective waits for its peers before failing (0: none).")
    check_collective: int = option(
        0, "Debug: compare the first N all-reduces with the plain sum of the replicas and stop "
        "at a difference, naming the gradient (0: off; e.g. 3 to test a --collective=module:Class).")
    # Model and data (SECTIONS).
    task: str = option(
        "", "Your own task, module:Class (a tfloop.engine.task.Task subclass, imported from the "
        "working directory or PYTHONPATH); it supplies the model, data and loss. Or "
        "module:function, a function that builds and compiles a Keras model: its loss, metrics "
        "and optimizer train it on --dataset (docs/keras.md).")
    model: str = option("mlp", "Model name: mlp | cnn | resnet_small | mobilenet_v2 | resnet50.")
    dataset: str = option("synthetic", "Dataset name: synthetic | mnist | tfrecord | image_folder.")
    data_dir: str = option(
        "", "Folder with the dataset's files (mnist: mnist.npz; tfrecord: "
        "bin/convert_to_tfrecord's output; image_folder: one sub-folder of JPEG/PNG images "
        "per class).")
    image_size: int = option(
        0, "Square image size. image_folder: images are resized to it (0: 224). synthetic: "
        "0 is MNIST-shaped 28x28x1; N makes NxNx3 images (e.g. 224 with --num_classes=1000: "
        "ImageNet-sized, generated as uint8). Others ignore it.")
    num_classes: int = option(
        0, "synthetic: the number of classes (0: 10). Other datasets have their own labels.")
    synthetic_on_device: bool = option(
        False, "Measure compute alone, the way tf_cnn_benchmarks does: take one batch of the "
        "training data once, keep it on the devices and train every step on it (no input "
        "pipeline runs per step; the model sees the same batch every step). For benchmarks.")
    eval_fraction: float = option(
        0.2, "image_folder without a validation/ folder: fraction of images kept for eval.")
    # The loop (SECTIONS).
    model_dir: str = option(
        "runs/default", "Checkpoints, summaries/ and metrics.json; reusing it resumes the run. "
        "On a cluster: gs://... or a volume every task shares. Default on Vertex AI: "
        "$AIP_CHECKPOINT_DIR (else $AIP_MODEL_DIR).")
    summaries_dir: str = option(
        "", "TensorBoard summaries (train/, eval/ under it); empty: <model_dir>/summaries, or "
        "$AIP_TENSORBOARD_LOG_DIR on Vertex AI.")
    global_batch_size: int = option(
        256, "Examples per step (one optimizer update) over all replicas and, with "
        "--accumulation_steps, all its micro-batches; must divide by the replica count times "
        "--accumulation_steps.")
    per_replica_batch_size: int = option(
        0, "Instead of --global_batch_size: examples per replica per step; the global batch "
        "is this times the replica count (times --accumulation_steps) (0: use "
        "--global_batch_size).")
    max_per_replica_batch_size: int = option(
        0, "The most examples one replica may take at once (memory): the engine picks the "
        "fewest micro-batches (--accumulation_steps) that keep each replica's share of the "
        "global batch at or below it, on whatever replica count the run starts or resumes "
        "on; a resume keeps the global batch it recorded (0: off; docs/reliability.md).")
    train_steps: int = option(1000, "Global step to train to.")
    epochs: int = option(
        0, "Instead of --train_steps: passes over the train split, each one pass with every "
        "example once, its last batch partial and trained as Keras's fit trains it (steps per "
        "epoch: its examples / the global batch, rounded up; or --steps_per_epoch, whose epochs "
        "are step counts over a stream that runs on) (0: use --train_steps).")
    steps_per_epoch: int = option(
        0, "Steps in one epoch for --epochs, for data whose size the engine does not know "
        "(0: the train split's examples / the global batch).")
    steps_per_loop: int = option(
        100, "Steps per compiled loop (one tf.function call, one Python round trip, one "
        "progress line); not an epoch.")
    checkpoint_interval: int = option(500, "Steps between checkpoints (0: only at the end).")
    local_checkpoint_dir: str = option(
        "", "A fast local folder (a RAM disk such as /dev/shm, a local SSD) for extra "
        "checkpoints every --local_checkpoint_interval steps beside the durable ones in "
        "--model_dir: a restart on this machine resumes from the newest that reads (in a "
        "multi_worker cluster: the newest step every worker holds), else from --model_dir "
        "(empty: off; docs/reliability.md).")
    local_checkpoint_interval: int = option(
        0, "Steps between local checkpoints in --local_checkpoint_dir (0: off), e.g. 10 "
        "with --checkpoint_interval=100.")
    summary_interval: int = option(
        100, "Steps between TensorBoard train summaries (0: none).")
    mode: str = option(
        "", "train | evaluate | train_and_evaluate. "
        "Default: train_and_evaluate when the dataset has an eval split.")
    eval_interval: int = option(0, "Steps between evaluations (0: only at the end).")
    eval_steps: int = option(-1, "Eval batches per evaluation (-1: the whole eval split).")
    # The recipe (SECTIONS).
    optimizer: str = option(
        "adam", "sgd | momentum (0.9) | adam | adamw (adam with --weight_decay, 0.004 when "
        "that is 0).")
    learning_rate: float = option(
        0.001, "Peak learning rate: reached after --warmup_steps, before any decay; times the "
        "replica count with --scale_learning_rate=linear.")
    lr_schedule: str = option(
        "constant", "constant | cosine (decays to --end_learning_rate at the last step) | "
        "step (times --lr_decay_rate at each of --lr_decay_steps) | polynomial (to "
        "--end_learning_rate, power --lr_power); a function of the global step, after "
        "--warmup_steps.")
    warmup_steps: int = option(
        0, "Steps of linear warmup from 0 to --learning_rate before the schedule starts.")
    lr_decay_steps: str = option(
        "", "--lr_schedule=step: comma-separated global steps where the rate is multiplied by "
        "--lr_decay_rate, e.g. 30000,60000.")
    lr_decay_rate: float = option(0.1, "--lr_schedule=step: the factor at each decay step.")
    lr_power: float = option(1.0, "--lr_schedule=polynomial: the power (1: linear decay).")
    end_learning_rate: float = option(
        0.0, "--lr_schedule=cosine|polynomial: the rate at the last step.")
    scale_learning_rate: str = option(
        "none", "none | linear: multiply --learning_rate (and --end_learning_rate) by the "
        "replica count (the linear scaling rule), logged at start.")
    weight_decay: float = option(
        0.0, "Decoupled weight decay (AdamW's, for every optimizer): each step subtracts "
        "learning rate x weight_decay x weight (0: off).")
    weight_decay_exclude: str = option(
        BIASES_AND_NORMS, "Variables weight decay leaves alone: biases_and_norms (every "
        "variable of at most one dimension: biases, normalization scales and offsets), none, "
        "or comma-separated substrings of variable paths, e.g. bias,gamma,beta.")
    clip_norm: float = option(
        0.0, "Clip the all-reduced gradients to this global norm, identically on every "
        "replica (0: off); the norm before clipping is the train metric grad_norm.")
    accumulation_steps: int = option(
        1, "Micro-batches per step: each replica's share of the global batch is split in "
        "this many, their gradients summed, then one all-reduce and one update (1: off).")
    ema_decay: float = option(
        0.0, "Keep an exponential moving average of the trained weights with this decay, "
        "e.g. 0.999; evaluation and export use the average (0: off).")
    seed: int = option(
        0, "Seed for initial weights and data order; the same seed gives the same initial "
        "weights on any strategy.")
    init_from: str = option(
        "", "Start a new run from these model weights (fine-tuning): another run's --model_dir "
        "or ckpt-N, an export/<step> folder, a .keras or .weights.h5 file. Step 0, fresh "
        "optimizer; ignored when --model_dir already has checkpoints (it resumes).")
    init_from_skip_mismatch: bool = option(
        False, "--init_from: load the variables that fit (same name, shape and dtype) and "
        "skip the rest (a new head: 10 classes -> 5), logging each variable loaded and "
        "skipped; without it any mismatch is refused.")
    # Keeping and stopping (SECTIONS).
    nan_policy: str = option(
        "stop", "What a step with a non-finite loss or gradient norm does: stop (the run "
        "stops at the end of its loop with one line naming the steps, exit 1, and saves "
        "nothing, so the last checkpoint stays finite) | skip_step (skip that step's update, "
        "count it in the train metric skipped_steps, stop after --nan_max_skips in a row).")
    nan_max_skips: int = option(
        10, "--nan_policy=skip_step: stop (as --nan_policy=stop does) after this many steps "
        "in a row had non-finite gradients.")
    best_metric: str = option(
        "", "Keep the checkpoint (and export) of the best evaluation by this metric in "
        "model_dir/best/, apart from the rolling ones, e.g. eval/accuracy (empty: off).")
    best_mode: str = option(
        "auto", "max | min | auto (max for accuracy-like names, else min): which way "
        "--best_metric improves.")
    early_stopping_patience: int = option(
        0, "Stop after this many evaluations in a row without a better --best_metric "
        "(0: never).")
    export: bool = option(
        True, "Write model_dir/export/<step>/ (a SavedModel with a serving_default signature, "
        "and model.keras for a Keras model) when training finishes.")
    max_checkpoints: int = option(5, "How many ckpt-<step> checkpoints to keep.")
    # Cluster (SECTIONS).
    eval_timeout: float = option(
        600.0, "Evaluator task: seconds to wait for a new checkpoint before stopping.")
    startup_timeout: float = option(
        300.0, "multi_worker: seconds to wait for every task of TF_CONFIG's cluster to come "
        "up before giving up (0: forever).")
    auto_shard_policy: str = option(
        "auto", "multi_worker input sharding: auto | file | data | off.")
    cluster_from: str = option(
        "auto", "Where the cluster comes from: auto (TF_CONFIG, else Vertex AI's CLUSTER_SPEC, "
        "else a JobSet / Indexed Job pod's JOB_COMPLETION_INDEX with TFLOOP_NUM_WORKERS) | "
        "tf_config | vertex | jobset (that one only; see docs/clusters.md).")
    hang_timeout: float = option(
        1800.0, "Seconds without a train loop ending before each task dumps its threads' "
        "stacks, phase and last step to <model_dir>/diagnostics/ and goes on (0: never).")
    straggler_threshold: float = option(
        3.0, "multi_worker: name a worker whose own time per step (outside the all-reduce) is "
        "over this many times the other workers' median for 3 loops in a row (0: off).")
    # Speed and reproducibility (SECTIONS).
    deterministic: bool = option(
        False, "Deterministic TensorFlow ops and tf.data stages in order: reruns and resumed "
        "runs give the same weights.")
    jit_compile: bool = option(
        False, "Compile each replica's forward and backward pass with XLA.")
    mixed_precision: str = option(
        "float32", "float32 | mixed_float16 (with a dynamic loss scale) | mixed_bfloat16; "
        "weights stay float32.")
    fused_optimizer: bool = option(
        False, "Update with TensorFlow's fused kernels (one op per variable), same formulas.")
    profile_steps: str = option(
        "", "A,B: TensorBoard profiler trace of global steps A to B into "
        "<model_dir>/summaries/train (empty: none).")
    intra_op_threads: int = option(
        -1, "Threads one TensorFlow op may use: -1 = cores / CPU replicas when there are "
        "several CPU replicas (else TF's default), 0 = TF's default (all cores), N = N.")

    def __post_init__(self):
        # Each field on its own first, in field order: the same checks, in the
        # same order, as `check_field` makes over the flags given to bin/train
        # before TensorFlow loads, so both report the same first mistake.
        for field in dataclasses.fields(self):
            check_field(field.name, getattr(self, field.name))
        # Imported here, not at the top: bin/train defines its flags from this
        # module before TensorFlow (which `collectives` imports) loads.
        from tfloop import collectives

        collectives.check_options(num_packs=self.num_packs, pack_bytes=self.pack_bytes,
                                  gradient_dtype=self.gradient_dtype)
        for name, high in (("num_packs", INT32_MAX), ("pack_bytes", MAX_PACK_BYTES)):
            if getattr(self, name) > high:
                raise ConfigError(f"--{name}={getattr(self, name)} must be at most {high}")
        if self.epochs and self.steps_per_epoch and \
                self.epochs * self.steps_per_epoch > INT32_MAX:
            raise ConfigError(f"--epochs={self.epochs} x --steps_per_epoch={self.steps_per_epoch} "
                              f"is beyond the last step a run can reach ({INT32_MAX})")
        if self.num_classes and self.dataset != "synthetic":
            raise ConfigError(f"--num_classes={self.num_classes} applies to --dataset=synthetic "
                              f"only; --dataset={self.dataset} has its own labels: drop it")
        if self.synthetic_on_device and self.strategy == "parameter_server":
            raise ConfigError("--synthetic_on_device keeps one batch on the devices of a loop "
                              "that runs in this process; --strategy=parameter_server's steps "
                              "run on its workers: drop it, or use --strategy=multi_worker")
        self._check_recipe()
        self._check_gpu_options()

    def changed(self, *names: str) -> list[str]:
        """`--name=value` for each of `names` not at its default: the flags a
        user set, for a refusal to name."""
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        return [f"--{name}={getattr(self, name)}" for name in names
                if getattr(self, name) != defaults[name]]

    def _check_gpu_options(self) -> None:
        if not self.gpu_memory_growth:
            return
        from tfloop.collectives import device_names  # TensorFlow: see __post_init__

        named = [device_names.canonical(d) for d in self.devices.split(",") if d.strip()]
        if named and not any(d and device_names.kind(d) == "gpu" for d in named):
            raise ConfigError(f"--gpu_memory_growth applies to GPUs, and --devices={self.devices} "
                              "names none; drop it or name GPUs, e.g. --devices=gpu:0,gpu:1")

    def _check_recipe(self) -> None:
        """The recipe flags that only mean something together (each one alone:
        `check_field`)."""
        resolved = self.steps_per_epoch and self.train_steps == self.epochs * self.steps_per_epoch
        if self.epochs and self.changed("train_steps") and not resolved:
            raise ConfigError(f"--epochs={self.epochs} and --train_steps={self.train_steps} both "
                              "say how long to train; give one")
        if self.steps_per_epoch and not self.epochs:
            raise ConfigError(f"--steps_per_epoch={self.steps_per_epoch} is the length of an "
                              "epoch for --epochs; give --epochs too, or use --train_steps")
        if self.per_replica_batch_size and self.changed("global_batch_size"):
            raise ConfigError(
                f"--per_replica_batch_size={self.per_replica_batch_size} and "
                f"--global_batch_size={self.global_batch_size} both set the batch; give one")
        if self.max_per_replica_batch_size and self.per_replica_batch_size:
            raise ConfigError(
                f"--max_per_replica_batch_size={self.max_per_replica_batch_size} and "
                f"--per_replica_batch_size={self.per_replica_batch_size} both set the "
                "per-replica batch; give one (--per_replica_batch_size: exactly that many, "
                "--max_per_replica_batch_size: at most)")
        if bool(self.local_checkpoint_dir) != bool(self.local_checkpoint_interval):
            given = (f"--local_checkpoint_dir={self.local_checkpoint_dir}"
                     if self.local_checkpoint_dir
                     else f"--local_checkpoint_interval={self.local_checkpoint_interval}")
            raise ConfigError(f"{given} needs its partner: give both --local_checkpoint_dir "
                              "(where) and --local_checkpoint_interval (every how many steps), "
                              "or neither")
        if self.max_per_replica_batch_size and self.changed("accumulation_steps"):
            raise ConfigError(
                f"--max_per_replica_batch_size={self.max_per_replica_batch_size} lets the engine "
                f"choose the micro-batches, and --accumulation_steps={self.accumulation_steps} "
                "fixes them; give one")
        steps = parse_steps("lr_decay_steps", self.lr_decay_steps)
        if self.lr_schedule == "step" and not steps:
            raise ConfigError("--lr_schedule=step needs --lr_decay_steps, the global steps where "
                              "the rate drops; e.g. --lr_decay_steps=30000,60000")
        if steps and self.lr_schedule != "step":
            raise ConfigError(f"--lr_decay_steps={self.lr_decay_steps} applies to "
                              f"--lr_schedule=step, not {self.lr_schedule}; drop it or use step")
        if self.lr_schedule in ("cosine", "polynomial") and \
                self.end_learning_rate >= self.learning_rate:
            raise ConfigError(
                f"--end_learning_rate={self.end_learning_rate} must be below "
                f"--learning_rate={self.learning_rate} for --lr_schedule={self.lr_schedule}")
        if self.init_from_skip_mismatch and not self.init_from:
            raise ConfigError("--init_from_skip_mismatch says what --init_from skips; give "
                              "--init_from too, or drop it")
        if self.nan_policy != "skip_step" and self.changed("nan_max_skips"):
            raise ConfigError(f"--nan_max_skips={self.nan_max_skips} applies to "
                              "--nan_policy=skip_step; drop it or add --nan_policy=skip_step")
        if self.early_stopping_patience and not self.best_metric:
            raise ConfigError(
                f"--early_stopping_patience={self.early_stopping_patience} needs --best_metric, "
                "the metric that must improve; e.g. --best_metric=eval/accuracy")

    @property
    def lr_decay_boundaries(self) -> tuple[int, ...]:
        """`lr_decay_steps` as global steps."""
        return parse_steps("lr_decay_steps", self.lr_decay_steps)

    @property
    def profile_range(self):
        """`profile_steps` as `(A, B)`, or None."""
        return parse_profile_steps(self.profile_steps)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section(self, name: str) -> dict:
        """The fields of one of `SECTIONS`, by name: `config.section("Distribution")`."""
        return {field: getattr(self, field) for field in SECTIONS[name]}


#: RunConfig's fields by section, in flag order: how --help, docs/flags.md and
#: a reader group them (tests/engine/test_config_sections.py: every field in
#: exactly one). The flags themselves stay flat (--learning_rate, not
#: --recipe.learning_rate), as do `RunConfig(...)`'s arguments.
SECTIONS = {
    "Distribution": ("strategy", "tpu", "devices", "virtual_gpus", "gpu_memory_growth",
                     "collective", "num_packs", "pack_bytes", "gradient_dtype", "reduce_device",
                     "collective_timeout", "check_collective"),
    "Model and data": ("task", "model", "dataset", "data_dir", "image_size", "num_classes",
                       "synthetic_on_device", "eval_fraction"),
    "The loop": ("model_dir", "summaries_dir", "global_batch_size", "per_replica_batch_size",
                 "max_per_replica_batch_size", "train_steps", "epochs", "steps_per_epoch",
                 "steps_per_loop", "checkpoint_interval", "local_checkpoint_dir",
                 "local_checkpoint_interval", "summary_interval", "mode",
                 "eval_interval", "eval_steps"),
    "The recipe": ("optimizer", "learning_rate", "lr_schedule", "warmup_steps", "lr_decay_steps",
                   "lr_decay_rate", "lr_power", "end_learning_rate", "scale_learning_rate",
                   "weight_decay", "weight_decay_exclude", "clip_norm", "accumulation_steps",
                   "ema_decay", "seed", "init_from", "init_from_skip_mismatch"),
    "Keeping and stopping": ("nan_policy", "nan_max_skips", "best_metric", "best_mode",
                             "early_stopping_patience", "export", "max_checkpoints"),
    "Cluster": ("eval_timeout", "startup_timeout", "auto_shard_policy", "cluster_from",
                "hang_timeout", "straggler_threshold"),
    "Speed and reproducibility": ("deterministic", "jit_compile", "mixed_precision",
                                  "fused_optimizer", "profile_steps", "intra_op_threads"),
}


def _document(cls: type) -> None:
    """Appends every field, its default and its help to `cls.__doc__`, by
    section: `help(tfloop.RunConfig)` shows the same text as `bin/train
    --help`, from the one source (`option(default, help)`)."""
    fields = {field.name: field for field in dataclasses.fields(cls)}
    lines = ["", "Fields, by section (each is also the flag --<name> of bin/train):"]
    for section, names in SECTIONS.items():
        lines += ["", f"{section}:"]
        for name in names:
            field = fields[name]
            lines.append(f"  {name}: {field.type} = {field.default!r}")
            lines += textwrap.wrap(field.metadata["help"], 76, initial_indent=" " * 6,
                                   subsequent_indent=" " * 6, break_on_hyphens=False)
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n" + "\n".join(lines) + "\n"


_document(RunConfig)
