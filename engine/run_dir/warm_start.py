"""`--init_from=PATH`: a new run that starts from another model's weights.

The fine-tuning pattern of the transfer-learning tutorials: step 0, a fresh
optimizer, a fresh global step, and only the model's weights taken from
elsewhere. `load_initial_weights(model, path)` copies them into the model the
engine has just built under its strategy (variables may be MirroredVariables:
each is written with `variable.assign`, which updates every replica's copy).

What PATH may name, detected in this order (all through `tf.io.gfile`, so any
filesystem TensorFlow reads, `ram://` and `gs://` included, works):

  a. a run's `--model_dir` (it has a `checkpoint` file: its newest checkpoint)
     or a checkpoint prefix (`.../ckpt-400`: `ckpt-400.index` exists);
  b. an export: `.../export/<step>/` (its `model.keras`), or the export root
     `.../export/` (its highest step). An export without `model.keras` (a
     `tf.Module`'s) is refused: its SavedModel holds only the variables the
     serving signature reads, by position (`_all_variables/N`), which names no
     model variable; the run's checkpoints hold the same weights by name;
  c. a `.keras` file or a `.weights.h5` file (Keras models only).

How variables are matched, per source:

  * Checkpoint: by name. Every engine checkpoint lists the model's variables
    as `model_weights/<index>_<name>` (`checkpointing.named_weights`: the
    model's `variables`, which hold no optimizer state, in order), names that
    depend on the model alone; the model here is listed the same way and each
    of its variables takes the value listed under its name. The checkpoint's
    optimizer, global step and save counter are never read. This works for a
    `tf.Module` holding several Keras models (through its `variables`, or its
    `trainable_variables` where those list none) as well as for one model.
  * `.keras` / `.weights.h5`: Keras' own structure (`layers/dense_1/vars/0`,
    ...). The model's expected structure is written by Keras itself
    (`save_weights` into a temporary file) and compared entry by entry with the
    source; only then does `model.load_weights` copy the values. A compiled
    model's optimizer state (`optimizer/...`, in the source or in the model)
    is no weight: left out of the comparison, and never loaded (Keras loads
    the source's weights beside the model's own optimizer state, unchanged).

Mismatches (a variable with no value, a shape or dtype that differs, values
the model has no place for) are one line naming the first offending variable,
a `ConfigError`; everything is checked before the first variable is written,
so a refused source leaves the model as it was.

Partial warm start (`skip_mismatch=True`, `--init_from_skip_mismatch`): the
variables that fit are loaded and the others keep their fresh initial values
(fine-tuning a body into a new head: 10 classes -> 5); values the model has
no place for are left unread. Every variable is logged, one line each,
loaded or skipped and why, so a run never starts half-initialized unawares;
a source of which nothing fits is still refused.
"""

from __future__ import annotations

import io
import logging
import os
import posixpath
import re
import shutil
import tempfile
import zipfile
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine.run_dir import checkpoint_files, checkpointing, export, layout
from tfloop.engine.errors import ConfigError, one_line

logger = logging.getLogger(__name__)

_KERAS_WEIGHTS_IN_ARCHIVE = "model.weights.h5"
_OPTIMIZER_GROUP = "optimizer"  # where Keras writes a compiled model's optimizer state
_SOURCES = ("a run's --model_dir, a checkpoint prefix (.../ckpt-400), an export folder "
            "(.../export or .../export/<step>), a .keras file or a .weights.h5 file")
_FIT_HINT = "--init_from needs weights of this same architecture (same model and sizes)"


def load_initial_weights(model: Any, path: str, *, skip_mismatch: bool = False) -> str:
    """Copies the model weights found at `path` into `model`; returns a log phrase.

    Args:
      model: the freshly built model: a `keras.Model`, or a `tf.Module` (any
        trackable) holding several Keras models (checkpoint sources only).
      path: what `--init_from` names (see the module docstring).
      skip_mismatch: load what fits, skip (and log) the rest.

    Returns:
      e.g. "model weights of runs/a/ckpt-400 (6 variables)", or with
      `skip_mismatch` "... (4 variables loaded, 2 skipped)".

    Raises:
      ConfigError: one line, when `path` holds nothing usable or does not fit
        the model (with `skip_mismatch`: nothing of it fits); nothing has
        been written then.
    """
    kind, where = _find_source(path)
    fit = _Fit(path, skip_mismatch)
    if kind == "checkpoint":
        _load_from_checkpoint(model, path, where, fit)
    else:
        _load_keras_file(model, path, where, fit, is_archive=(kind == "keras"))
    return f"model weights of {where} ({fit.summary()})"


class _Fit:
    """What fits and what does not, variable by variable: refuses the first
    misfit, or (skip_mismatch) notes it to be logged with the ones loaded."""

    def __init__(self, path: str, skip_mismatch: bool):
        self.path, self.skip_mismatch = path, skip_mismatch
        self.loaded: list[str] = []
        self.skipped: list[tuple[str, str]] = []

    def misfit(self, label: str, detail: str, reason: str) -> None:
        """`detail`: the refusal's wording; `reason`: the skipped line's."""
        if not self.skip_mismatch:
            raise _misfit(self.path, detail)
        self.skipped.append((label, reason))

    def check_any(self) -> None:
        """Refuses a partial load of nothing; logs each variable (before any is written)."""
        if not self.skip_mismatch:
            return
        if not self.loaded:
            raise ConfigError(
                f"--init_from={self.path}: none of its variables fits this model "
                f"({len(self.skipped)} skipped, e.g. {self.skipped[0][0]}: "
                f"{self.skipped[0][1]}); {_FIT_HINT}")
        for label in self.loaded:
            logger.info("--init_from: loaded  %s", label)
        for label, reason in self.skipped:
            logger.info("--init_from: skipped %s (%s)", label, reason)

    def summary(self) -> str:
        if not self.skip_mismatch:
            return f"{len(self.loaded)} variables"
        return f"{len(self.loaded)} variables loaded, {len(self.skipped)} skipped"


# ---------------------------------------------------------------------------
# What PATH names.

def _find_source(path: str) -> tuple[str, str]:
    """`(kind, location)`: kind is "checkpoint", "keras" or "h5"."""
    gfile = tf.io.gfile
    prefix = re.sub(r"\.(index|data-\d{5}-of-\d{5})$", "", path)
    if gfile.exists(prefix + ".index"):  # first: ram:// calls any prefix of a file a folder
        return "checkpoint", prefix
    if gfile.isdir(path):
        found = checkpoint_files.survey(path, strict=False)  # a run folder: its newest that reads
        if found.newest:
            if found.damaged:
                logger.info("--init_from=%s: %s", path, found.skip_line("starting from"))
            return "checkpoint", found.newest
        if found.damaged:
            reasons = "; ".join(f"{d.name}: {d.reason}" for d in found.damaged[:3])
            raise ConfigError(
                f"--init_from={path} holds checkpoints and none of them reads ({reasons}); "
                "point --init_from at an intact checkpoint (.../ckpt-N) or an export")
        # The survey read the state file: it names no checkpoint that is there.
        state = layout.RunDir(path).checkpoint_state
        if gfile.exists(state) and not gfile.isdir(state):
            raise ConfigError(
                f"--init_from={path} has a 'checkpoint' file but none of the checkpoints "
                "it lists is there; point --init_from at a checkpoint prefix (.../ckpt-N) "
                "or an export")
        if gfile.exists(posixpath.join(path, export.SAVED_MODEL_FILENAME)):
            return _export_step(path, path)
        latest = export.latest_export(path)
        if latest:
            return _export_step(path, latest)
    else:
        if path.endswith(".keras") and gfile.exists(path):
            return "keras", path
        if path.endswith(".weights.h5") and gfile.exists(path):
            return "h5", path
        if not gfile.exists(path):
            raise ConfigError(f"--init_from={path} does not exist; point it at {_SOURCES}")
    raise ConfigError(
        f"--init_from={path} holds no checkpoint, export, .keras or .weights.h5 file; "
        f"point it at {_SOURCES}")


def _export_step(path: str, folder: str) -> tuple[str, str]:
    keras_file = posixpath.join(folder, export.KERAS_FILENAME)
    if not tf.io.gfile.exists(keras_file):
        raise ConfigError(f"--init_from={path} is an export without {export.KERAS_FILENAME}; "
                          "point --init_from at the run's --model_dir (its checkpoints)")
    return "keras", keras_file


def _misfit(path: str, detail: str) -> ConfigError:
    return ConfigError(f"--init_from={path} does not fit this model: {detail}; {_FIT_HINT}")


# ---------------------------------------------------------------------------
# Checkpoints: the engine's `model_weights` listing, by name.

def _load_from_checkpoint(model: Any, path: str, prefix: str, fit: _Fit) -> None:
    """Checks, then assigns, every variable of `model` from checkpoint `prefix`.

    All values are read before the first is written: the model's size in host
    memory, once.
    """
    try:
        # Not tf.train.load_checkpoint: it takes a ram:// prefix for a folder.
        reader = tf.compat.v1.train.NewCheckpointReader(prefix)
        stored = checkpointing.weight_keys(prefix, reader)
    except (ValueError, tf.errors.OpError) as error:
        raise ConfigError(f"--init_from={path}: {prefix} cannot be read as a TF2 checkpoint "
                          f"({one_line(str(error), 200) or type(error).__name__})") from None
    if stored is None:
        raise ConfigError(f"--init_from={path}: {prefix} holds no model (it was not "
                          "written by this engine); point it at a run's --model_dir")
    wanted = checkpointing.named_weights(model)
    if not wanted:
        raise ConfigError(f"--init_from={path}: this model has no variables to load into")
    shapes, dtypes = reader.get_variable_to_shape_map(), reader.get_variable_to_dtype_map()

    fitting = {}
    for name, variable in wanted.items():
        label = getattr(variable, "path", None) or variable.name
        key = stored.get(name)
        if key is None:
            fit.misfit(label, f"{_source_name(prefix, path)} has no value for {label} (it holds "
                              f"{len(stored)} variables, the model has {len(wanted)})",
                       "not in the source")
            continue
        there, here = tuple(shapes[key]), tuple(variable.shape)
        if there != here:
            fit.misfit(label, f"{label} is {there} there but {here} here",
                       f"{there} there, {here} here")
            continue
        dtype = tf.as_dtype(variable.dtype)
        if dtypes[key] != dtype:
            fit.misfit(label, f"{label} is {dtypes[key].name} there but {dtype.name} here",
                       f"{dtypes[key].name} there, {dtype.name} here")
            continue
        fitting[name] = variable
        fit.loaded.append(label)
    for name in sorted(name for name in stored if name not in wanted):
        fit.misfit(f"model_weights/{name}",
                   f"it holds {len(stored)} variables, the model has {len(wanted)} "
                   f"(nothing here takes model_weights/{name})", "nothing in this model takes it")
    fit.check_any()
    values = [reader.get_tensor(stored[name]) for name in fitting]
    for variable, value in zip(fitting.values(), values):
        variable.assign(value)


# ---------------------------------------------------------------------------
# .keras and .weights.h5: Keras' structure, compared before Keras loads it.

def _load_keras_file(model: Any, path: str, where: str, fit: _Fit, *, is_archive: bool) -> None:
    if not isinstance(model, keras.Model):
        raise ConfigError(
            f"--init_from={path} is a {'.keras' if is_archive else '.weights.h5'} file, which "
            f"only a Keras model can load, and this model is a {type(model).__name__}; point "
            "--init_from at a run's --model_dir (its checkpoint) instead")
    import h5py  # Keras' own dependency, needed only here

    data = _read_weights_h5(path, where, is_archive, h5py)
    with tempfile.TemporaryDirectory(prefix="tfloop-init-from-") as scratch:
        own_file = os.path.join(scratch, "own.weights.h5")
        model.save_weights(own_file)
        weights_file = os.path.join(scratch, "model.weights.h5")
        with h5py.File(io.BytesIO(data), "r") as source_h5, h5py.File(own_file, "r") as own_h5:
            fitting = _check_keras_entries(model, path, where, _h5_entries(source_h5),
                                           _h5_entries(own_h5), fit)
        # What Keras loads: the model's own file (its structure, its optimizer
        # state, and the skipped variables' fresh values), which it writes back
        # unchanged, with the source's value in each entry that fits.
        shutil.copyfile(own_file, weights_file)
        with h5py.File(io.BytesIO(data), "r") as source_h5, \
                h5py.File(weights_file, "r+") as weights_h5:
            for name in fitting:
                weights_h5[name][...] = source_h5[name][()]
        model.load_weights(weights_file)


def _check_keras_entries(model: keras.Model, path: str, where: str, source: dict[str, tuple],
                         expected: dict[str, tuple], fit: _Fit) -> list[str]:
    """Raises the first mismatch between the source's entries and the model's
    (or, skipping, notes each); returns the entries that fit."""
    label = _h5_labeller(model, expected)
    order = {w.path: index for index, w in enumerate(model.weights)}

    # The first offender is the first in the model's weight order.
    fitting = []
    for name in sorted(expected, key=lambda name: (order.get(label(name), len(order)), name)):
        if name not in source:
            fit.misfit(label(name), f"{_source_name(where, path)} has no value for {label(name)} "
                       f"(it holds {len(source)} variables, the model has {len(expected)})",
                       "not in the source")
        elif source[name] != expected[name]:
            fit.misfit(label(name), f"{label(name)} is {source[name]} there but "
                       f"{expected[name]} here", f"{source[name]} there, {expected[name]} here")
        else:
            fitting.append(name)
            fit.loaded.append(label(name))
    for name in sorted(set(source) - set(expected)):
        fit.misfit(name, f"it holds {len(source)} variables, the model has {len(expected)} "
                         f"(nothing here takes {name})", "nothing in this model takes it")
    fit.check_any()
    return fitting


def _read_weights_h5(path: str, where: str, is_archive: bool, h5py) -> bytes:
    """The HDF5 weights file of `where` (inside a .keras archive), read through `tf.io.gfile`."""
    with tf.io.gfile.GFile(where, "rb") as f:
        data = f.read()
    try:
        if is_archive:
            with zipfile.ZipFile(io.BytesIO(data)) as archive:
                if _KERAS_WEIGHTS_IN_ARCHIVE not in archive.namelist():
                    raise ConfigError(f"--init_from={path}: {where} holds no "
                                      f"{_KERAS_WEIGHTS_IN_ARCHIVE}; save it with model.save")
                data = archive.read(_KERAS_WEIGHTS_IN_ARCHIVE)
        h5py.File(io.BytesIO(data), "r").close()
    except (zipfile.BadZipFile, OSError) as error:
        kind = "a .keras archive" if is_archive else "an HDF5 weights file"
        raise ConfigError(f"--init_from={path}: {where} is not {kind} "
                          f"({one_line(str(error), 200) or type(error).__name__})") from None
    return data


def _h5_entries(h5) -> dict[str, tuple]:
    """`{h5 path: shape}` of the weights in `h5`; a compiled model's optimizer is none of them."""
    entries: dict[str, tuple] = {}

    def visit(name, obj):
        if hasattr(obj, "shape") and name.split("/", 1)[0] != _OPTIMIZER_GROUP:
            entries[name] = tuple(obj.shape)

    h5.visititems(visit)
    return entries


def _h5_labeller(model: keras.Model, expected: dict[str, tuple]) -> Callable[[str], str]:
    """Names an h5 entry (`layers/dense_1/vars/0`) by its variable (`sequential/dense_4/kernel`).

    Keras writes an object's own variables as `<where>/vars/<i>`; `<where>`
    steps through attributes (`enc`, `layers`) and, inside a list, names an
    item by its class in snake case, numbered per class (`dense`, `dense_1`:
    the second Dense of that list, whatever the layer's own name). The layer
    found that way lists its own variables first in its `weights`, in the
    order they are written. Where that does not account for the entry and
    its siblings, shapes included, the h5 path itself names it.
    """
    def label(name: str) -> str:
        parts = name.split("/")
        if len(parts) < 2 or parts[-2] != "vars" or not parts[-1].isdigit():
            return name
        layer = _keras_object_at(model, parts[:-2])
        if not isinstance(layer, keras.layers.Layer):
            return name
        group = name.rsplit("/", 1)[0]
        siblings = sorted((entry for entry in expected if entry.rsplit("/", 1)[0] == group),
                          key=lambda entry: int(entry.rsplit("/", 1)[1]))
        owned = [w for w in layer.weights if w.path.rsplit("/", 1)[0] == layer.path]
        if [tuple(w.shape) for w in owned] != [expected[entry] for entry in siblings]:
            return name
        return owned[int(parts[-1])].path

    return label


_SAVEABLE = (keras.layers.Layer, keras.optimizers.Optimizer, keras.metrics.Metric,
             keras.losses.Loss)


def _keras_object_at(model: keras.Model, parts: list[str]) -> Any:
    """The object Keras saves under `parts` (e.g. ["layers", "dense_1"]), or None."""
    obj = model
    steps = iter(parts)
    for step in steps:
        try:
            obj = getattr(obj, step)
        except Exception:  # a property that cannot be read: no label, no harm
            return None
        if isinstance(obj, dict):
            obj = list(obj.values())
        if isinstance(obj, (list, tuple)):
            wanted, counts, items = next(steps, None), {}, obj
            obj = None
            for item in items:
                if isinstance(item, _SAVEABLE):
                    base = _snake_case(type(item).__name__)
                    counts[base] = counts.get(base, -1) + 1
                    if (f"{base}_{counts[base]}" if counts[base] else base) == wanted:
                        obj = item
                        break
            if obj is None:
                return None
    return obj


def _snake_case(name: str) -> str:
    # As Keras names a list item in a weights file: BatchNormalization -> batch_normalization.
    name = re.sub(r"\W+", "", name)
    name = re.sub("(.)([A-Z][a-z]+)", r"\1_\2", name)
    return re.sub("([a-z])([A-Z])", r"\1_\2", name).lower()


def _source_name(where: str, path: str) -> str:
    # The file read, where it is not what --init_from named (a model_dir's ckpt-N).
    return "it" if where == path else where


