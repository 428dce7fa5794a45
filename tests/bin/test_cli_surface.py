"""bin/train's command line, held: every flag it takes, written out below.

A flag is one `option(...)` line in its room's settings (issue 41), which
makes adding one cheap; the flag count went 62 -> 67 -> 72 over three rounds
with nothing holding it. As torchtitan's `test_no_new_cli_options.py` does,
this test fails when a flag appears or disappears until `TRAIN_FLAGS` is
edited in the same change: a new flag is a decision someone writes down,
not a side effect.
"""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

#: Every flag of bin/train (absl's own --help, --flagfile, logging flags
#: aside), by section as docs/flags.md lists them. Edit deliberately.
TRAIN_FLAGS = frozenset({
    # Distribution
    "strategy", "tpu", "devices", "virtual_gpus", "gpu_memory_growth", "collective",
    "num_packs", "pack_bytes", "gradient_dtype", "reduce_device", "collective_timeout",
    "check_collective",
    # Model and data
    "task", "model", "dataset", "data_dir", "image_size", "num_classes", "eval_fraction",
    "augment",
    # The loop
    "model_dir", "summaries_dir", "global_batch_size", "per_replica_batch_size",
    "max_per_replica_batch_size", "train_steps", "epochs", "steps_per_epoch", "steps_per_loop",
    "checkpoint_interval", "local_checkpoint_dir", "local_checkpoint_interval",
    "summary_interval", "mode", "eval_interval", "eval_steps",
    # The recipe
    "optimizer", "learning_rate", "lr_schedule", "warmup_steps", "lr_decay_steps",
    "lr_decay_rate", "lr_power", "end_learning_rate", "scale_learning_rate", "weight_decay",
    "weight_decay_exclude", "ema_decay", "seed", "init_from", "init_from_skip_mismatch",
    # The step
    "clip_norm", "accumulation_steps", "nan_policy", "nan_max_skips", "jit_compile",
    "synthetic_on_device",
    # Keeping and stopping
    "best_metric", "best_mode", "early_stopping_patience", "export", "max_checkpoints",
    # Cluster
    "eval_timeout", "startup_timeout", "auto_shard_policy", "data_service", "cluster_from",
    "hang_timeout", "straggler_threshold",
    # Speed and reproducibility
    "deterministic", "mixed_precision", "fused_optimizer", "profile_steps", "intra_op_threads",
    # Every binary
    "verbose",
})

#: Defines bin/train's flags (its module runs, not its main) and prints them.
_LIST_FLAGS = """
import runpy, sys
from absl import flags
runpy.run_path("bin/train", run_name="train_flags")
for module, defined in flags.FLAGS.flags_by_module_dict().items():
    if not module.startswith("absl."):
        print("\\n".join(f.name for f in defined))
print("TF=" + ("loaded" if "tensorflow" in sys.modules else "no"))
"""


def test_bin_train_takes_exactly_the_flags_listed_here():
    result = subprocess.run([sys.executable, "-c", _LIST_FLAGS], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    *names, tensorflow = result.stdout.split()
    defined = set(names)
    assert len(names) == len(defined)
    added, removed = sorted(defined - TRAIN_FLAGS), sorted(TRAIN_FLAGS - defined)
    assert not added and not removed, (
        f"bin/train's flags changed: added {added}, removed {removed}. If that is meant, edit "
        "TRAIN_FLAGS in tests/bin/test_cli_surface.py in the same change (and say why in it)")
    # The flags are defined before TensorFlow loads (a typo is answered at once).
    assert tensorflow == "TF=no", tensorflow


def test_the_listed_flags_are_the_run_configs_fields_and_verbose():
    """The list is RunConfig's fields and --verbose: no flag of bin/train
    escapes RunConfig (and so docs/flags.md)."""
    import dataclasses

    from tfloop.engine.config import RunConfig

    assert TRAIN_FLAGS == {field.name for field in dataclasses.fields(RunConfig)} | {"verbose"}
