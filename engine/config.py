"""The run configuration: one frozen, typed record, validated once.

`bin/train` turns flags into a `RunConfig`; library code and tests build one
directly. Each field is declared once, with everything known about it::

    eval_fraction: float = MODEL_AND_DATA.option(
        0.2, "image_folder without ...", check=fraction, identity=True)

its flag's default and help (`bin/flag_defs.py`, docs/flags.md), its section
(`SECTIONS`, and the typed view `config.model_and_data` a module is handed),
its own check (`check_field`), whether run.json remembers it (`IDENTITY`)
and whether it records it per range of a resumed run (`PER_RANGE`):
adding a flag is that one edit, plus its use. Checks of one field and of
fields together happen here, at construction; checks that need the machine
or the file system (devices, data files, `model_dir`) and the batch
arithmetic happen in `engine.assembly.plan` before anything is created.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
import textwrap
from typing import Any, Callable, Optional, Union

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


#: What a field holds (and its flag parses to).
Value = Union[bool, int, float, str]
#: A field's own check: `check(name, value)` raises the one-line ConfigError
#: for a value wrong whatever the other fields say (`option(check=...)`).
#: `name` is the field's (and flag's) name, so one check serves many fields.
Check = Callable[[str, Any], None]  # Any: each check takes its fields' type


def count(low: int, high: int = INT32_MAX) -> Check:
    """An integer from `low` (0 or 1) to `high`: a step count past int32
    would wrap inside the compiled loop, a seed past 32 bits fails deep in NumPy."""
    what = "a positive integer" if low else "0 or more"

    def check(name: str, value: object) -> None:
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ConfigError(f"--{name}={value!r} must be an integer")
        if not low <= value <= high:
            raise ConfigError(f"--{name}={value} must be {what}, at most {high}")
    return check


POSITIVE = count(1)
NON_NEGATIVE = count(0)


def one_of(words: tuple[str, ...], noun: str, *, empty_allowed: bool = False) -> Check:
    """One of a few words (`empty_allowed`: "" too, the field's default meaning)."""
    def check(name: str, value: str) -> None:
        if value not in words and not (empty_allowed and not value):
            raise ConfigError(f"--{name}={value!r} is not a {noun}; choose one of: "
                              f"{', '.join(words)}")
    return check


def positive_number(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise ConfigError(f"--{name}={value} must be a positive number")


def non_negative_number(name: str, value: float) -> None:
    if not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"--{name}={value} must be 0 or a positive number")


def seconds(name: str, value: float) -> None:
    """A timeout: 0 (none) up to a week; beyond is a typo for 0."""
    if not (math.isfinite(value) and 0 <= value <= MAX_TIMEOUT):
        raise ConfigError(f"--{name}={value} must be 0 or more seconds, at most "
                          f"{MAX_TIMEOUT:.0f} (a week)")


def fraction(name: str, value: float) -> None:
    if not 0 <= value < 1:
        raise ConfigError(f"--{name}={value} must be at least 0 and below 1")


def decay(name: str, value: float) -> None:
    """A moving average's decay: 0 (off) or a fraction below 1."""
    if not 0 <= value < 1:
        raise ConfigError(f"--{name}={value} must be at least 0 and below 1 "
                          "(e.g. 0.999; 0: off)")


def optional_path(name: str, value: str) -> None:
    """A file or folder; empty is the field's default (none, or a folder
    under model_dir). The text as `check_path_text` checks it."""
    if value:
        check_path_text(f"--{name}", value)


def required_path(name: str, value: str) -> None:
    """`optional_path` that must be given (`--model_dir`)."""
    if not value:
        raise ConfigError(f"--{name} is empty; name the directory for checkpoints and "
                          "summaries")
    check_path_text(f"--{name}", value)


def batches_or_all(name: str, value: int) -> None:
    if not (value == -1 or 1 <= value <= INT32_MAX):
        raise ConfigError(
            f"--{name}={value} must be a positive number of batches "
            f"(at most {INT32_MAX}), or -1 for the whole eval split")


def threads(name: str, value: int) -> None:
    if not -1 <= value <= MAX_THREADS:
        raise ConfigError(
            f"--{name}={value} must be -1 (a share of the cores "
            "per CPU replica), 0 (TensorFlow's default) or a count up to "
            f"{MAX_THREADS}")


def factor_or_off(name: str, value: float) -> None:
    if not (value == 0 or 1 < value <= 1000):
        raise ConfigError(f"--{name}={value} must be 0 (off) "
                          "or a factor above 1 (at most 1000), e.g. 3")


def service_address(name: str, value: str) -> None:
    """`grpc://host:port`, or empty (`inputs.service.parse_address`, without TensorFlow)."""
    if value:
        from tfloop.launch import data_service  # the standard library only

        message = data_service.address_error(value, f"--{name}")
        if message:
            raise ConfigError(message)


def step_range(name: str, value: str) -> None:
    parse_profile_steps(value)


def step_list(name: str, value: str) -> None:
    parse_steps(name, value)


def eval_metric(name: str, value: str) -> None:
    if value and not value.startswith("eval/"):
        raise ConfigError(f"--{name}={value!r} is not an evaluation metric; "
                          "name one as eval/<metric>, e.g. eval/accuracy or eval/loss")


def option(default: Value, help: str, *, section: str, check: Optional[Check] = None,
           identity: bool = False, per_range: bool = False) -> Any:
    """A `RunConfig` field, written once with everything known about it:

    - `default` and `help`: `bin/train` defines `--<field name>` from them
      (`bin/flag_defs.py`), docs/flags.md lists them (tests/test_docs.py);
    - `section`: the group docs/flags.md and `help(RunConfig)` list it in
      (`SECTIONS`), and the typed view a module is handed (`RunConfig.recipe`, ...);
    - `check`: its own range or choice (`check_field`), run by `RunConfig` and
      by `bin/train` on the given flag before TensorFlow loads;
    - `identity`: it decides what the checkpoints' variables are and what they
      were trained on, so run.json remembers it (`IDENTITY`, `run_identity`);
    - `per_range`: it is part of how a run trains, which a resumed run may
      change, so run.json records it for each range of steps trained with one
      value (`PER_RANGE`, `run_identity.RECIPE`; `--optimizer` is recorded
      too, and a change of it refused by `run_identity.check`).
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "section": section, "check": check, "identity": identity,
        "per_range": per_range})


@dataclasses.dataclass(frozen=True)
class Section:
    """One group of `RunConfig` fields: its title (docs/flags.md, `help`)
    and the name of its typed view on a config (`config.recipe`)."""

    title: str
    view: str

    def option(self, default: Value, help: str, *, check: Optional[Check] = None,
               identity: bool = False, per_range: bool = False) -> Any:
        """`option(...)` in this section."""
        return option(default, help, section=self.title, check=check, identity=identity,
                      per_range=per_range)


DISTRIBUTION = Section("Distribution", "distribution")
MODEL_AND_DATA = Section("Model and data", "model_and_data")
LOOP = Section("The loop", "loop")
RECIPE = Section("The recipe", "recipe")
KEEPING = Section("Keeping and stopping", "keeping")
CLUSTER = Section("Cluster", "cluster")
SPEED = Section("Speed and reproducibility", "speed")


class _SectionView:
    """`config.<view>`: the section's fields as their own frozen record
    (`VIEWS`), so a module can be handed the part of the run it reads."""

    def __init__(self, section: Section):
        self.section = section

    def __get__(self, config: Optional["RunConfig"], owner: type) -> Any:
        if config is None:
            return self
        view = VIEWS[self.section.title]
        return view(**{name: getattr(config, name) for name in SECTIONS[self.section.title]})


@dataclasses.dataclass(frozen=True)
class RunConfig:
    """Everything one training or evaluation run needs.

    Each field's help (`dataclasses.fields(RunConfig)[i].metadata["help"]`)
    is also the help of its flag (`bin/flag_defs.py` defines them), and is
    listed below by section (`help(RunConfig)`; written by `_document`).
    `config.<section>` (`distribution`, `model_and_data`, `loop`, `recipe`,
    `keeping`, `cluster`, `speed`) is that section's fields as a frozen record.
    """

    strategy: str = DISTRIBUTION.option(
        "mirrored", "default | one_device | mirrored | central_storage | multi_worker | "
        "parameter_server (both read TF_CONFIG) | tpu.")
    tpu: str = DISTRIBUTION.option(
        "", "--strategy=tpu: a Cloud TPU name, grpc://host:port, or local on a TPU VM "
        "(empty: $TPU_NAME).")
    devices: str = DISTRIBUTION.option(
        "", "Comma-separated gpu:N / cpu:N. Empty: every GPU, or cpu:0 without one. "
        "CPU ids beyond the physical CPUs create logical CPU devices.")
    virtual_gpus: int = DISTRIBUTION.option(
        0, "Split each GPU into N logical GPUs (0: off), so that one GPU runs N replicas and "
        "tests every collective but NCCL (which needs one physical GPU per replica); "
        "refused on a machine without a GPU.", check=count(0, MAX_VIRTUAL_GPUS))
    gpu_memory_growth: bool = DISTRIBUTION.option(
        False, "Allocate GPU memory as needed instead of nearly all of each visible GPU at "
        "start (lets processes share a GPU; same as TF_FORCE_GPU_ALLOW_GROWTH=true).")
    collective: str = DISTRIBUTION.option(
        "auto", "Gradient all-reduce: auto | nccl | ring | hierarchical_copy | "
        "reduce_to_one_device, or module:Class for your own (imported from sys.path and run "
        "inside every step: trusted code only; its results are checked).")
    num_packs: int = DISTRIBUTION.option(
        0, "Pack gradients into this many buckets per all-reduce (0: off).")
    pack_bytes: int = DISTRIBUTION.option(
        0, "Pack gradients into buckets of about this many bytes (0: off).")
    gradient_dtype: str = DISTRIBUTION.option(
        "float32", "Dtype gradients travel in: float32 | bfloat16 | float16 (compression).")
    reduce_device: str = DISTRIBUTION.option(
        "", "Where --collective=reduce_to_one_device sums, e.g. cpu:0 (default: first device).")
    collective_timeout: float = DISTRIBUTION.option(
        0.0, "multi_worker: seconds a collective waits for its peers before failing (0: none).",
        check=seconds)
    check_collective: int = DISTRIBUTION.option(
        0, "Debug: compare the first N all-reduces with the plain sum of the replicas and stop "
        "at a difference, naming the gradient (0: off; e.g. 3 to test a --collective=module:Class).",
        check=NON_NEGATIVE)
    task: str = MODEL_AND_DATA.option(
        "", "Your own task, module:Class (a tfloop.engine.task.Task subclass, imported from the "
        "working directory or PYTHONPATH); it supplies the model, data and loss. Or "
        "module:function, a function that builds and compiles a Keras model: its loss, metrics "
        "and optimizer train it on --dataset (docs/keras.md).", identity=True)
    model: str = MODEL_AND_DATA.option(
        "mlp", "Model name: mlp | cnn | resnet_small | mobilenet_v2 | resnet50.",
        identity=True)
    dataset: str = MODEL_AND_DATA.option(
        "synthetic", "Dataset name: synthetic | mnist | tfrecord | image_folder | imagenet "
        "(the standard ImageNet TFRecords: train-*-of-*, validation-*-of-*; docs/data.md).",
        identity=True)
    data_dir: str = MODEL_AND_DATA.option(
        "", "Folder with the dataset's files (mnist: mnist.npz; tfrecord: "
        "bin/convert_to_tfrecord's output; image_folder: one sub-folder of JPEG/PNG images "
        "per class; imagenet: local, gs:// or ram://).", check=optional_path, identity=True)
    image_size: int = MODEL_AND_DATA.option(
        0, "Square image size. image_folder and imagenet: images are cropped/resized to it "
        "(0: 224). synthetic: "
        "0 is MNIST-shaped 28x28x1; N makes NxNx3 images (e.g. 224 with --num_classes=1000: "
        "ImageNet-sized, generated as uint8). Others ignore it.",
        check=count(0, MAX_IMAGE_SIZE), identity=True)
    num_classes: int = MODEL_AND_DATA.option(
        0, "synthetic: the number of classes (0: 10). Other datasets have their own labels.",
        check=count(0, MAX_CLASSES))
    synthetic_on_device: bool = MODEL_AND_DATA.option(
        False, "Measure compute alone, the way tf_cnn_benchmarks does: take one batch of the "
        "training data once, keep it on the devices and train every step on it (no input "
        "pipeline runs per step; the model sees the same batch every step). For benchmarks.")
    eval_fraction: float = MODEL_AND_DATA.option(
        0.2, "image_folder without a validation/ folder: fraction of images kept for eval.",
        check=fraction, identity=True)
    augment: str = MODEL_AND_DATA.option(
        "", "Train-time augmentation of image_folder and imagenet: inception (the standard "
        "ImageNet recipe: a random crop of 8-100% of the area, aspect 3/4-4/3, a random "
        "flip, resized; eval on the central 224/256 crop; random per example yet exact on "
        "resume) or none (image_folder: resized whole; imagenet: central crop). Empty: the "
        "dataset's default, none for image_folder, inception for imagenet.",
        check=one_of(("none", "inception"), "known augmentation", empty_allowed=True),
        identity=True)
    model_dir: str = LOOP.option(
        "runs/default", "Checkpoints, summaries/ and metrics.json; reusing it resumes the run. "
        "On a cluster: gs://... or a volume every task shares. Default on Vertex AI: "
        "$AIP_CHECKPOINT_DIR (else $AIP_MODEL_DIR).", check=required_path)
    summaries_dir: str = LOOP.option(
        "", "TensorBoard summaries (train/, eval/ under it); empty: <model_dir>/summaries, or "
        "$AIP_TENSORBOARD_LOG_DIR on Vertex AI.", check=optional_path)
    global_batch_size: int = LOOP.option(
        256, "Examples per step (one optimizer update) over all replicas and, with "
        "--accumulation_steps, all its micro-batches; must divide by the replica count times "
        "--accumulation_steps.", check=POSITIVE, per_range=True)
    per_replica_batch_size: int = LOOP.option(
        0, "Instead of --global_batch_size: examples per replica per step; the global batch "
        "is this times the replica count (times --accumulation_steps) (0: use "
        "--global_batch_size).", check=NON_NEGATIVE)
    max_per_replica_batch_size: int = LOOP.option(
        0, "The most examples one replica may take at once (memory): the engine picks the "
        "fewest micro-batches (--accumulation_steps) that keep each replica's share of the "
        "global batch at or below it, on whatever replica count the run starts or resumes "
        "on; a resume keeps the global batch it recorded (0: off; docs/reliability.md).",
        check=NON_NEGATIVE)
    train_steps: int = LOOP.option(1000, "Global step to train to.", check=NON_NEGATIVE)
    epochs: int = LOOP.option(
        0, "Instead of --train_steps: passes over the train split, each one pass with every "
        "example once, its last batch partial and trained as Keras's fit trains it (steps per "
        "epoch: its examples / the global batch, rounded up; or --steps_per_epoch, whose epochs "
        "are step counts over a stream that runs on) (0: use --train_steps).", check=NON_NEGATIVE)
    steps_per_epoch: int = LOOP.option(
        0, "Steps in one epoch for --epochs, for data whose size the engine does not know "
        "(0: the train split's examples / the global batch).", check=NON_NEGATIVE)
    steps_per_loop: int = LOOP.option(
        100, "Steps per compiled loop (one tf.function call, one Python round trip, one "
        "progress line); not an epoch.", check=POSITIVE)
    checkpoint_interval: int = LOOP.option(
        500, "Steps between checkpoints (0: only at the end).",
        check=NON_NEGATIVE)
    local_checkpoint_dir: str = LOOP.option(
        "", "A fast local folder (a RAM disk such as /dev/shm, a local SSD) for extra "
        "checkpoints every --local_checkpoint_interval steps beside the durable ones in "
        "--model_dir: a restart on this machine resumes from the newest that reads (in a "
        "multi_worker cluster: the newest step every worker holds), else from --model_dir "
        "(empty: off; docs/reliability.md).", check=optional_path)
    local_checkpoint_interval: int = LOOP.option(
        0, "Steps between local checkpoints in --local_checkpoint_dir (0: off), e.g. 10 "
        "with --checkpoint_interval=100.", check=NON_NEGATIVE)
    summary_interval: int = LOOP.option(
        100, "Steps between TensorBoard train summaries (0: none).", check=NON_NEGATIVE)
    mode: str = LOOP.option(
        "", "train | evaluate | train_and_evaluate. "
        "Default: train_and_evaluate when the dataset has an eval split.",
        check=one_of(MODES, "mode", empty_allowed=True))
    eval_interval: int = LOOP.option(
        0, "Steps between evaluations (0: only at the end).",
        check=NON_NEGATIVE)
    eval_steps: int = LOOP.option(
        -1, "Eval batches per evaluation (-1: the whole eval split).",
        check=batches_or_all)
    optimizer: str = RECIPE.option(
        "adam", "sgd | momentum (0.9) | adam | adamw (adam with --weight_decay, 0.004 when "
        "that is 0).", per_range=True)
    learning_rate: float = RECIPE.option(
        0.001, "Peak learning rate: reached after --warmup_steps, before any decay; times the "
        "replica count with --scale_learning_rate=linear.", check=positive_number,
        per_range=True)
    lr_schedule: str = RECIPE.option(
        "constant", "constant | cosine (decays to --end_learning_rate at the last step) | "
        "step (times --lr_decay_rate at each of --lr_decay_steps) | polynomial (to "
        "--end_learning_rate, power --lr_power); a function of the global step, after "
        "--warmup_steps.", check=one_of(LR_SCHEDULES, "schedule"), per_range=True)
    warmup_steps: int = RECIPE.option(
        0, "Steps of linear warmup from 0 to --learning_rate before the schedule starts.",
        check=NON_NEGATIVE, per_range=True)
    lr_decay_steps: str = RECIPE.option(
        "", "--lr_schedule=step: comma-separated global steps where the rate is multiplied by "
        "--lr_decay_rate, e.g. 30000,60000.", check=step_list)
    lr_decay_rate: float = RECIPE.option(
        0.1, "--lr_schedule=step: the factor at each decay step.",
        check=positive_number)
    lr_power: float = RECIPE.option(
        1.0, "--lr_schedule=polynomial: the power (1: linear decay).",
        check=positive_number)
    end_learning_rate: float = RECIPE.option(
        0.0, "--lr_schedule=cosine|polynomial: the rate at the last step.",
        check=non_negative_number, per_range=True)
    scale_learning_rate: str = RECIPE.option(
        "none", "none | linear: multiply --learning_rate (and --end_learning_rate) by the "
        "replica count (the linear scaling rule), logged at start.",
        check=one_of(LR_SCALING, "rule"))
    weight_decay: float = RECIPE.option(
        0.0, "Decoupled weight decay (AdamW's, for every optimizer): each step subtracts "
        "learning rate x weight_decay x weight (0: off).", check=non_negative_number,
        per_range=True)
    weight_decay_exclude: str = RECIPE.option(
        BIASES_AND_NORMS, "Variables weight decay leaves alone: biases_and_norms (every "
        "variable of at most one dimension: biases, normalization scales and offsets), none, "
        "or comma-separated substrings of variable paths, e.g. bias,gamma,beta.")
    clip_norm: float = RECIPE.option(
        0.0, "Clip the all-reduced gradients to this global norm, identically on every "
        "replica (0: off); the norm before clipping is the train metric grad_norm.",
        check=non_negative_number, per_range=True)
    accumulation_steps: int = RECIPE.option(
        1, "Micro-batches per step: each replica's share of the global batch is split in "
        "this many, their gradients summed, then one all-reduce and one update (1: off).",
        check=POSITIVE, per_range=True)
    ema_decay: float = RECIPE.option(
        0.0, "Keep an exponential moving average of the trained weights with this decay, "
        "e.g. 0.999; evaluation and export use the average (0: off).", check=decay)
    seed: int = RECIPE.option(
        0, "Seed for initial weights and data order; the same seed gives the same initial "
        "weights on any strategy.", check=count(0, SEED_MAX))
    init_from: str = RECIPE.option(
        "", "Start a new run from these model weights (fine-tuning): another run's --model_dir "
        "or ckpt-N, an export/<step> folder, a .keras or .weights.h5 file. Step 0, fresh "
        "optimizer; ignored when --model_dir already has checkpoints (it resumes).",
        check=optional_path)
    init_from_skip_mismatch: bool = RECIPE.option(
        False, "--init_from: load the variables that fit (same name, shape and dtype) and "
        "skip the rest (a new head: 10 classes -> 5), logging each variable loaded and "
        "skipped; without it any mismatch is refused.")
    nan_policy: str = KEEPING.option(
        "stop", "What a step with a non-finite loss or gradient norm does: stop (the run "
        "stops at the end of its loop with one line naming the steps, exit 1, and saves "
        "nothing, so the last checkpoint stays finite) | skip_step (skip that step's update, "
        "count it in the train metric skipped_steps, stop after --nan_max_skips in a row).",
        check=one_of(NAN_POLICIES, "policy"), per_range=True)
    nan_max_skips: int = KEEPING.option(
        10, "--nan_policy=skip_step: stop (as --nan_policy=stop does) after this many steps "
        "in a row had non-finite gradients.", check=POSITIVE)
    best_metric: str = KEEPING.option(
        "", "Keep the checkpoint (and export) of the best evaluation by this metric in "
        "model_dir/best/, apart from the rolling ones, e.g. eval/accuracy (empty: off).",
        check=eval_metric)
    best_mode: str = KEEPING.option(
        "auto", "max | min | auto (max for accuracy-like names, else min): which way "
        "--best_metric improves.", check=one_of(BEST_MODES, "mode"))
    early_stopping_patience: int = KEEPING.option(
        0, "Stop after this many evaluations in a row without a better --best_metric "
        "(0: never).", check=NON_NEGATIVE)
    export: bool = KEEPING.option(
        True, "Write model_dir/export/<step>/ (a SavedModel with a serving_default signature, "
        "and model.keras for a Keras model) when training finishes.")
    max_checkpoints: int = KEEPING.option(
        5, "How many ckpt-<step> checkpoints to keep.",
        check=POSITIVE)
    eval_timeout: float = CLUSTER.option(
        600.0, "Evaluator task: seconds to wait for a new checkpoint before stopping.",
        check=seconds)
    startup_timeout: float = CLUSTER.option(
        300.0, "multi_worker: seconds to wait for every task of TF_CONFIG's cluster to come "
        "up before giving up, and --data_service: for its dispatcher (0: forever).",
        check=seconds)
    auto_shard_policy: str = CLUSTER.option(
        "auto", "multi_worker input sharding: auto | file | data | off.",
        check=one_of(SHARD_POLICIES, "policy"))
    data_service: str = CLUSTER.option(
        "", "grpc://host:port of a tf.data service dispatcher (bin/data_service starts one with "
        "its data workers): the train pipeline runs on those workers, dealt out with dynamic "
        "sharding (each example once per pass, in the order the workers finish; a resumed run "
        "starts a new pass); evaluation stays here. Empty: the pipeline runs here "
        "(docs/data.md).", check=service_address)
    cluster_from: str = CLUSTER.option(
        "auto", "Where the cluster comes from: auto (TF_CONFIG, else Vertex AI's CLUSTER_SPEC, "
        "else a JobSet / Indexed Job pod's JOB_COMPLETION_INDEX with TFLOOP_NUM_WORKERS) | "
        "tf_config | vertex | jobset (that one only; see docs/clusters.md).",
        check=one_of(platforms.SOURCES, "cluster source"))
    hang_timeout: float = CLUSTER.option(
        1800.0, "Seconds without a train loop ending before each task dumps its threads' "
        "stacks, phase and last step to <model_dir>/diagnostics/ and goes on (0: never).",
        check=seconds)
    straggler_threshold: float = CLUSTER.option(
        3.0, "multi_worker: name a worker whose own time per step (outside the all-reduce) is "
        "over this many times the other workers' median for 3 loops in a row (0: off).",
        check=factor_or_off)
    deterministic: bool = SPEED.option(
        False, "Deterministic TensorFlow ops and tf.data stages in order: reruns and resumed "
        "runs give the same weights.")
    jit_compile: bool = SPEED.option(
        False, "Compile each replica's forward and backward pass with XLA.")
    mixed_precision: str = SPEED.option(
        "float32", "float32 | mixed_float16 (with a dynamic loss scale) | mixed_bfloat16; "
        "weights stay float32. Left at float32: Keras's global dtype policy (float32 unless the "
        "script or --task module set one).", check=one_of(PRECISIONS, "policy"), per_range=True)
    fused_optimizer: bool = SPEED.option(
        True, "Update with TensorFlow's fused kernels (one op per variable; Keras's formulas "
        "and slots): --nofused_optimizer for Keras's own element-wise update.")
    profile_steps: str = SPEED.option(
        "", "A,B: TensorBoard profiler trace of global steps A to B into "
        "<model_dir>/summaries/train (empty: none).", check=step_range)
    intra_op_threads: int = SPEED.option(
        -1, "Threads one TensorFlow op may use: -1 = cores / CPU replicas when there are "
        "several CPU replicas (else TF's default), 0 = TF's default (all cores), N = N.",
        check=threads)

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
        if self.num_classes and self.dataset != "synthetic":
            raise ConfigError(f"--num_classes={self.num_classes} applies to --dataset=synthetic "
                              f"only; --dataset={self.dataset} has its own labels: drop it")
        if self.synthetic_on_device and self.strategy == "parameter_server":
            raise ConfigError("--synthetic_on_device keeps one batch on the devices of a loop "
                              "that runs in this process; --strategy=parameter_server's steps "
                              "run on its workers: drop it, or use --strategy=multi_worker")
        self._check_together()
        self._check_gpu_options()
        self._check_data_service()

    def changed(self, *names: str) -> list[str]:
        """`--name=value` for each of `names` not at its default: the flags a
        user set, for a refusal to name."""
        defaults = {field.name: field.default for field in dataclasses.fields(self)}
        return [f"--{name}={getattr(self, name)}" for name in names
                if getattr(self, name) != defaults[name]]

    def _check_data_service(self) -> None:
        """What `--data_service` cannot serve: one line each, with why."""
        if not self.data_service:
            return
        given = f"--data_service={self.data_service}"
        if self.strategy == "parameter_server":
            raise ConfigError(
                f"{given} serves the train pipeline this process distributes, and "
                "--strategy=parameter_server's workers each build theirs from a function the "
                "coordinator sends them, which this engine does not hand to the service; use "
                "--strategy=multi_worker, or drop --data_service")
        if self.synthetic_on_device:
            raise ConfigError(f"{given} runs an input pipeline every step, and "
                              "--synthetic_on_device trains on one batch kept on the devices; "
                              "give one")
        if self.mode == "evaluate":
            raise ConfigError(f"{given} serves the train pipeline, and --mode=evaluate trains "
                              "nothing (evaluation always reads its data here); drop it")
        if self.epochs and not self.steps_per_epoch:
            raise ConfigError(
                f"{given} with --epochs={self.epochs}: an exact epoch is one pass whose last "
                "batch is partial, and the service's data workers each end a pass with a "
                "partial batch of their own; give --steps_per_epoch (epochs as step counts "
                "over a stream that runs on) or --train_steps")

    def _check_gpu_options(self) -> None:
        if not self.gpu_memory_growth:
            return
        from tfloop.collectives import device_names  # TensorFlow: see __post_init__

        named = [device_names.canonical(d) for d in self.devices.split(",") if d.strip()]
        if named and not any(d and device_names.kind(d) == "gpu" for d in named):
            raise ConfigError(f"--gpu_memory_growth applies to GPUs, and --devices={self.devices} "
                              "names none; drop it or name GPUs, e.g. --devices=gpu:0,gpu:1")

    def _check_together(self) -> None:
        """The flags that only mean something together (each one alone: its
        option's check), by what they decide."""
        self._check_length()
        self._check_batch_request()
        self._check_schedule()
        self._check_keeping()

    def _check_length(self) -> None:
        """How long to train: --train_steps, or --epochs (of --steps_per_epoch)."""
        if self.epochs and self.steps_per_epoch and \
                self.epochs * self.steps_per_epoch > INT32_MAX:
            raise ConfigError(f"--epochs={self.epochs} x --steps_per_epoch={self.steps_per_epoch} "
                              f"is beyond the last step a run can reach ({INT32_MAX})")
        resolved = self.steps_per_epoch and self.train_steps == self.epochs * self.steps_per_epoch
        if self.epochs and self.changed("train_steps") and not resolved:
            raise ConfigError(f"--epochs={self.epochs} and --train_steps={self.train_steps} both "
                              "say how long to train; give one")
        if self.steps_per_epoch and not self.epochs:
            raise ConfigError(f"--steps_per_epoch={self.steps_per_epoch} is the length of an "
                              "epoch for --epochs; give --epochs too, or use --train_steps")

    def _check_batch_request(self) -> None:
        """Which flags ask for the batch: one of --global_batch_size,
        --per_replica_batch_size, --max_per_replica_batch_size. What the batch
        then is, on how many replicas (the arithmetic, and its refusals), is
        decided once, in `engine.assembly.plan.decide_batch`."""
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
        if self.max_per_replica_batch_size and self.changed("accumulation_steps"):
            raise ConfigError(
                f"--max_per_replica_batch_size={self.max_per_replica_batch_size} lets the engine "
                f"choose the micro-batches, and --accumulation_steps={self.accumulation_steps} "
                "fixes them; give one")

    def _check_schedule(self) -> None:
        """The learning-rate schedule's flags."""
        steps = self.lr_decay_boundaries
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

    def _check_keeping(self) -> None:
        """What a run keeps and when it stops: local checkpoints, the warm
        start, the NaN policy, early stopping."""
        if bool(self.local_checkpoint_dir) != bool(self.local_checkpoint_interval):
            given = (f"--local_checkpoint_dir={self.local_checkpoint_dir}"
                     if self.local_checkpoint_dir
                     else f"--local_checkpoint_interval={self.local_checkpoint_interval}")
            raise ConfigError(f"{given} needs its partner: give both --local_checkpoint_dir "
                              "(where) and --local_checkpoint_interval (every how many steps), "
                              "or neither")
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
        return self.recipe.lr_decay_boundaries

    @property
    def profile_range(self):
        """`profile_steps` as `(A, B)`, or None."""
        return parse_profile_steps(self.profile_steps)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section(self, name: str) -> dict:
        """The fields of one of `SECTIONS`, by title: `config.section("Distribution")`."""
        return {field: getattr(self, field) for field in SECTIONS[name]}

    # Each section's fields as a typed frozen record (`VIEWS`): hand a module
    # `config.recipe`, not the whole run.
    distribution = _SectionView(DISTRIBUTION)
    model_and_data = _SectionView(MODEL_AND_DATA)
    loop = _SectionView(LOOP)
    recipe = _SectionView(RECIPE)
    keeping = _SectionView(KEEPING)
    cluster = _SectionView(CLUSTER)
    speed = _SectionView(SPEED)


_FIELDS = {field.name: field for field in dataclasses.fields(RunConfig)}


def check_field(name: str, value: object) -> None:
    """Raises the one-line ConfigError for a value of `RunConfig` field `name`
    that is wrong whatever the other fields say: the field's own
    `option(check=...)`; fields without one (and unknown names) pass.

    `RunConfig` runs it over every field before its checks of fields
    together; `bin/train` runs it over the flags given on the command line
    right after parsing them, before TensorFlow's import (seconds) and before
    a resumed run's remembered values are read: a typo is answered at once.
    Imports no TensorFlow.
    """
    field = _FIELDS.get(name)
    check = field.metadata["check"] if field is not None else None
    if check is not None:
        check(name, value)


def _sections() -> dict[str, tuple[str, ...]]:
    sections: dict[str, list[str]] = {}
    for field in _FIELDS.values():
        sections.setdefault(field.metadata["section"], []).append(field.name)
    return {title: tuple(names) for title, names in sections.items()}


#: RunConfig's fields by section title, in flag order, from each field's
#: `option(section=...)`: how docs/flags.md, `help(RunConfig)` and a reader
#: group them (tests/engine/config/test_config_sections.py: every field in exactly
#: one). The flags themselves stay flat (--learning_rate, not
#: --recipe.learning_rate), as do `RunConfig(...)`'s arguments.
SECTIONS = _sections()

#: The fields that decide what a checkpoint's variables are and what they were
#: trained on (`option(identity=True)`): run.json remembers them (`run_identity`).
IDENTITY = tuple(name for name, field in _FIELDS.items() if field.metadata["identity"])

#: The fields a resumed run may change (`option(per_range=True)`), in flag
#: order: run.json records them per range of steps (`run_identity.RECIPE`).
PER_RANGE = tuple(name for name, field in _FIELDS.items() if field.metadata["per_range"])


def _view(section: Section, doc: str, **extra: property) -> type:
    """The frozen record of `section`'s fields (their names, types and
    defaults as `RunConfig` declares them), plus `extra` properties."""
    fields = [(name, _FIELDS[name].type, dataclasses.field(default=_FIELDS[name].default))
              for name in SECTIONS[section.title]]
    name = "".join(word.capitalize() for word in section.view.split("_"))
    view = dataclasses.make_dataclass(name, fields, frozen=True, namespace=extra)
    view.__doc__ = doc
    view.__module__ = __name__
    return view


Distribution = _view(DISTRIBUTION, "Where the replicas run and how their gradients travel.")
ModelAndData = _view(MODEL_AND_DATA, "What is trained, on what data.")
Loop = _view(LOOP, "The run directory, the batch, how long, and every interval of the loop.")
Recipe = _view(RECIPE, "What a step does with the gradients: optimizer, schedule, decay, EMA.",
               lr_decay_boundaries=property(
                   lambda recipe: parse_steps("lr_decay_steps", recipe.lr_decay_steps),
                   doc="`lr_decay_steps` as global steps."))
Keeping = _view(KEEPING, "What a run keeps and when it stops: NaN policy, best, export.")
Cluster = _view(CLUSTER, "A multi-worker cluster's waits, sharding and stragglers.")
Speed = _view(SPEED, "Speed and reproducibility: determinism, XLA, precision, threads.")
#: Section title -> its view class (`config.<Section.view>` builds one).
VIEWS = {section.title: view for section, view in (
    (DISTRIBUTION, Distribution), (MODEL_AND_DATA, ModelAndData), (LOOP, Loop),
    (RECIPE, Recipe), (KEEPING, Keeping), (CLUSTER, Cluster), (SPEED, Speed))}


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
