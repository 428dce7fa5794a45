"""A servable model: `<directory>/export/<step>/`, a SavedModel plus `model.keras`.

    export_model(model, input_signature=..., directory=d, step=s)
        trace serving_fn(model, inputs) once on input_signature   (a mistake: ConfigError)
        write d/export/.s.tmp-XXXX/             SavedModel, signature "serving_default"
              d/export/.s.tmp-XXXX/model.keras  when the model is a keras.Model
        rename it to d/export/s                 (locally atomic: a reader sees all or none)
        a failed write (a full disk): the temporary folder removed, ExportFailure (one line)

A temporary folder a kill -9 left is removed by the next training run at start-up
(`remove_stale_staging`, the lock holder's job).

The folder loads with no project code: `tf.saved_model.load(path)
.signatures["serving_default"](**features)`, TensorFlow Serving, or
`saved_model_cli`; `keras.models.load_model(path + "/model.keras")` gives the
Keras model back for fine-tuning.

Why `keras.export.ExportArchive`, for Keras models and any other object alike:
a plain `tf.saved_model.save` of a Keras model serializes the model's whole
object graph, its optimizer and slot variables included (tried: an Adam-built
model under MirroredStrategy wrote its optimizer's 14 variables beside its 8
weights), none of which serving needs. The archive saves only the variables
the signature reads, and both models this engine meets export through it: a
Keras model built under `MirroredStrategy` (its variables are distributed; the
signature reads the local copy and the SavedModel holds plain variables) and a
`tf.Module` holding several Keras models. The model is tracked through a
`tf.Module` holder rather than `archive.track(model)`: tracking a Keras layer
also lists its weights a second time (`variables/N` beside `_all_variables/N`
in the checkpoint; Keras 3.15's own `model.export` does it too), which doubles
the export's size; through the holder the archive still finds lookup tables
(a `StringLookup` layer's, tested).

The serving function is our own `tf.function` with the input signature, traced
before anything is written: autograph stays on (the archive's own wrapper
turns it off), and its inputs are named after the signature's dict keys
(`x`, `z`): unnamed `TensorSpec`s in a dict would otherwise become the
signature inputs `inputs` and `inputs_1`. A signature's outputs must be a
dict: a single tensor is named `outputs`, a list `outputs_0`, `outputs_1`, ...

In a cluster every worker calls `export_model` (saving may be collective, as
for checkpoints); only the chief writes into `directory`, the others into a
temporary folder that is removed before the call returns (the `write_filepath`
pattern of TensorFlow's multi-worker tutorial).
"""

from __future__ import annotations

import keyword
import logging
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any, Callable, Optional

import keras
import tensorflow as tf

from tfloop.engine.run_dir import checkpointing, layout
from tfloop.engine.runtime import disk, files
from tfloop.engine.task import user_code
from tfloop.engine.errors import ConfigError, ExportFailure, RunFailure, one_line

logger = logging.getLogger(__name__)

SIGNATURE_KEY = "serving_default"
#: The folder of a directory's exports, one `<step>/` each.
KERAS_FILENAME = "model.keras"
SAVED_MODEL_FILENAME = "saved_model.pb"

# TensorFlow 2.21's RamFileSystem renames only a directory's own entry and
# leaves every file under the old name, so `ram://` exports are copied file by
# file instead (test_export.py's canary fails when that changes).
_RENAMES_NO_DIRECTORIES = ("ram://",)

# TensorFlow's rule for an op name (core/framework/node_def_util.cc): each signature
# input is a placeholder named after it, and any other name fails the save.
_OP_NAME = re.compile(r"[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*")

# A chief's export is written here first, then renamed into place (`export_model`).

ServingFn = Callable[[Any, Any], Any]
ServingFunction = tf.types.experimental.GenericFunction


def export_path(directory: str, step: int) -> str:
    """Where `export_model(..., directory=directory, step=step)` writes."""
    return layout.RunDir(directory).export(step)


def latest_export(export_root: str) -> Optional[str]:
    """The export with the highest step in `export_root` (`<directory>/export`), or None.

    Only complete exports count: a folder named by an integer that holds its
    `saved_model.pb`; temporary folders (`.<step>.tmp-...`) never do. Steps
    compare as numbers (10 after 9).
    """
    if not tf.io.gfile.isdir(export_root):
        return None
    steps = sorted(
        (int(name), name)
        for name in (entry.rstrip("/") for entry in tf.io.gfile.listdir(export_root))
        if name.isdigit()
    )
    for _, name in reversed(steps):
        path = os.path.join(export_root, name)
        if tf.io.gfile.exists(os.path.join(path, SAVED_MODEL_FILENAME)):
            return path
    return None


def export_model(
    model: Any,
    *,
    serving_fn: Optional[ServingFn] = None,
    input_signature: Any = None,
    directory: str,
    step: int,
    is_chief: bool = True,
    worker_name: str = "worker",
) -> Optional[str]:
    """Writes `<directory>/export/<step>/`; returns that path (None off the chief).

    `input_signature` is a `tf.TensorSpec`, or a dict or other nest of them,
    each with batch dimension None. `serving_fn(model, inputs) -> outputs`
    (default `model(inputs, training=False)`) returns a tensor, a list of
    tensors or a dict of them. An existing export of the same step is replaced.
    Mistakes in these arguments are a one-line ConfigError, raised before
    anything is written.

    Raises:
      ExportFailure: the export could not be written (a full disk): one line
        naming the folder and its free space; nothing is left of it.
    """
    if not isinstance(directory, str) or not directory:
        raise ConfigError(f"export directory ({directory!r}) must be a non-empty path or URL")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ConfigError(f"export step ({step!r}) must be a non-negative integer")
    signature = _named_signature(input_signature)
    if serving_fn is None:
        if not callable(model):
            raise ConfigError(
                f"a {type(model).__name__} cannot be called as model(inputs, training=False); "
                "pass serving_fn(model, inputs) to export it"
            )
        serving_fn = _call_model
    serve = _trace(model, serving_fn, signature)

    if not is_chief:
        scratch = checkpointing.worker_save_dir(directory, f"export-{worker_name}")
        try:
            _write(model, serve, os.path.join(scratch, str(step)))
        except (tf.errors.OpError, OSError) as error:
            raise ExportFailure(_write_failed(scratch, step, error)) from None
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return None

    final = export_path(directory, step)
    root = os.path.dirname(final)
    temporary = layout.RunDir(directory).export_staging(step)
    try:
        with files.umask_at_least():  # TensorFlow's files: at most 0644 (files module)
            files.make_dirs(root)
            no_keras = _write(model, serve, temporary)
            _move(temporary, final, within=directory)
    except (tf.errors.OpError, OSError) as error:
        raise ExportFailure(_write_failed(root, step, error),
                            fix=disk.advice(error, root, str(error))) from None
    except files.RemovalFailure as failure:  # the export it replaces
        raise ExportFailure(
            f"could not export step {step} to {root}: {failure.path} is in the way and could "
            f"not be removed ({failure.reason}); nothing was exported",
            fix=f"remove {failure.path} yourself (or make {root} writable)") from None
    finally:
        _remove_quietly(temporary, directory)
    if no_keras:
        level, reason = no_keras
        logger.log(level, "no %s in %s: %s", KERAS_FILENAME, final, reason)
    logger.info("exported %s (SavedModel signature %s%s)", final, SIGNATURE_KEY,
                "" if no_keras else f", {KERAS_FILENAME}")
    return final


def remove_stale_staging(directory: str) -> None:
    """Removes the `<directory>/export/.<step>.tmp-*` folders an export killed
    midway (kill -9) left behind: a whole SavedModel that nothing reads. For
    the process that holds the run's lock (`engine.run_dir.run_lock`), at start-up,
    beside `checkpoint_files.remove_stale_temp`; `bin/export` takes no lock
    and removes none (its own may be in progress beside a run). A link of
    that name goes as a link (`engine.runtime.files.remove`)."""
    root = layout.RunDir(directory).exports
    if not tf.io.gfile.isdir(root):
        return
    for name in tf.io.gfile.listdir(root):
        name = name.rstrip("/")
        if layout.EXPORT_STAGING.match(name):
            path = os.path.join(root, name)
            logger.info("removing %s, left by an export that did not finish", path)
            files.remove(path, within=directory)


def _write_failed(root: str, step: int, error: Exception) -> str:
    """The one line of a failed export: where, why, the free space."""
    reason = one_line((str(error) or type(error).__name__).replace(root.rstrip("/") + "/", ""),
                      100)
    return (f"could not export step {step} to {root} ({reason}); "
            f"{disk.free_there(root)}; nothing was exported")


def _remove_quietly(path: str, directory: str) -> None:
    """Removes a temporary export folder, if there is one; a failure to
    remove it is logged, never raised over the error that ended the export."""
    try:
        files.remove(path, within=directory)
    except (ConfigError, RunFailure, tf.errors.OpError, OSError) as error:
        logger.warning("could not remove %s (%s); the next run removes it", path,
                       one_line(str(error), 100))


@tf.autograph.experimental.do_not_convert  # the engine's own (engine.task.user_code)
def _call_model(model: Any, inputs: Any) -> Any:
    return model(inputs, training=False)


def _named_signature(input_signature: Any) -> Any:
    """The signature with every unnamed spec named after its place (`x`, `a_b`, `inputs`).

    A name TensorFlow cannot save (`class`, `my feature`) would fail only when
    the SavedModel is written, after the export folder exists: refused here.
    """
    example = "e.g. input_signature={'x': tf.TensorSpec([None, 3], tf.float32)}"
    if input_signature is None:
        raise ConfigError(
            "exporting needs input_signature: a tf.TensorSpec or a dict of them with "
            f"batch dimension None ({example})"
        )

    def name(path: tuple, spec: Any) -> Any:
        if isinstance(spec, Mapping):
            return {key: name(path + (key,), value) for key, value in spec.items()}
        if isinstance(spec, (list, tuple)):
            items = [name(path + (index,), value) for index, value in enumerate(spec)]
            return type(spec)(*items) if hasattr(spec, "_fields") else type(spec)(items)
        where = "input_signature" + "".join(f"[{key!r}]" for key in path)
        if not isinstance(spec, tf.TensorSpec):
            raise ConfigError(f"{where} ({spec!r}) must be a tf.TensorSpec ({example})")
        if spec.shape.rank is None or spec.shape.rank == 0 or spec.shape[0] is not None:
            raise ConfigError(
                f"{where} has shape {spec.shape}; its first (batch) dimension must be None "
                f"so that any batch size can be served ({example})"
            )
        if spec.name:
            label = spec.name
        else:
            label = "_".join(str(key) for key in path) or "inputs"
            if not label[0].isalpha():
                label = f"inputs_{label}"
        if (not _OP_NAME.fullmatch(label) or label.endswith("/")
                or keyword.iskeyword(_parameter_name(label))):
            raise ConfigError(
                f"{where} would be the signature input {label!r}, which TensorFlow cannot save: "
                "use letters, digits, '_', '-', '.' or '/', and no Python keyword (rename the "
                "key, or give its tf.TensorSpec a name)"
            )
        return spec if spec.name else tf.TensorSpec(spec.shape, spec.dtype, name=label)

    named = name((), input_signature)
    if not tf.nest.flatten(named):
        raise ConfigError(
            f"input_signature ({input_signature!r}) holds no tf.TensorSpec ({example})")
    seen: dict[str, str] = {}
    for spec in tf.nest.flatten(named):
        other = seen.setdefault(_parameter_name(spec.name), spec.name)
        if other != spec.name:
            raise ConfigError(
                f"the signature inputs {other!r} and {spec.name!r} would both be called "
                f"{_parameter_name(spec.name)!r}; rename one of them")
    return named


def _parameter_name(name: str) -> str:
    # As TensorFlow turns a signature input's name into a parameter name ('a-b' -> 'a_b').
    swapped = "".join(c if c.isalnum() else "_" for c in name)
    return swapped if swapped[0].isalpha() else "arg_" + swapped


def _signature_outputs(outputs: Any) -> Optional[dict[str, tf.Tensor]]:
    """A signature returns a flat dict of tensors: what serving_fn returned, named; else None."""
    if tf.is_tensor(outputs):
        return {"outputs": outputs}
    if isinstance(outputs, (list, tuple)) and outputs and all(tf.is_tensor(o) for o in outputs):
        return {f"outputs_{index}": output for index, output in enumerate(outputs)}
    if isinstance(outputs, Mapping) and outputs and all(
            isinstance(key, str) and tf.is_tensor(value) for key, value in outputs.items()):
        return dict(outputs)
    return None


def _trace(model: Any, serving_fn: ServingFn, signature: Any) -> ServingFunction:
    """The serving `tf.function`, traced once so that a mismatch fails before any write.

    Traced without autograph, as the engine's loops are: `serving_fn`, the
    user's (a task's `serve`), is converted where it is called
    (`engine.task.user_code`), and autograph wraps any exception raised under
    it in its own error type: unusable outputs are noted here and refused
    after the trace, so that the refusal stays a ConfigError.
    """
    unusable = []

    def serve(inputs):
        outputs = user_code.converted(serving_fn)(model, inputs)
        named = _signature_outputs(outputs)
        if named is None:
            unusable.append(outputs)
            return {}
        return named

    function = tf.function(serve, input_signature=[signature], autograph=False)
    try:
        function.get_concrete_function()
    except (ValueError, TypeError, KeyError) as error:
        # Autograph's message lists the traced frames first; the error itself comes last.
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = lines[-1][:300] if lines else type(error).__name__
        raise ConfigError(
            f"the model cannot serve input_signature {signature}: {reason}; "
            "make input_signature match the model's inputs, or pass a serving_fn that does"
        ) from None
    if unusable:
        raise ConfigError(
            f"the serving function returned {type(unusable[0]).__name__} {unusable[0]!r:.120}; "
            "it must return a tensor, a list of tensors, or a dict of tensors with string keys"
        )
    return function


def _write(model: Any, serve: ServingFunction, path: str) -> Optional[tuple[int, str]]:
    """Writes the SavedModel and model.keras at `path`; else (log level, why no model.keras)."""
    holder = tf.Module()
    holder.model = model
    archive = keras.export.ExportArchive()
    archive.track(holder)
    archive.add_endpoint(SIGNATURE_KEY, serve)
    archive.write_out(path, verbose=False)

    if not isinstance(model, keras.Model):
        return logging.INFO, (
            f"a {type(model).__name__} is not a keras.Model (the SavedModel serves it)")
    keras_path = os.path.join(path, KERAS_FILENAME)
    try:
        model.save(keras_path)
        # A custom class that is not registered saves, but no process can load it back.
        keras.models.load_model(keras_path, compile=False)
    except (NotImplementedError, TypeError, ValueError) as error:
        if tf.io.gfile.exists(keras_path):
            tf.io.gfile.remove(keras_path)
        return _not_saveable(model, error)
    return None


#: The classes whose missing model.keras was explained at WARNING in this
#: process: a notebook or a run with several exports (best, final) says it once.
_EXPLAINED: set = set()


def _not_saveable(model: Any, error: Exception) -> tuple[int, str]:
    """(log level, why no model.keras): the fix, named for the class Keras
    could not find (a subclassed model, e.g. examples/gan.py's GAN, or a
    custom layer in it), at WARNING once per class and process."""
    reason = " ".join(str(error).split())
    missing = re.search(r"Could not locate class '([^']+)'", reason)
    rebuilt = re.search(r"<class '(?:[\w.]+\.)?(\w+)'> could not be deserialized", reason)
    name = (missing or rebuilt).group(1) if (missing or rebuilt) else type(model).__name__
    level = logging.INFO if name in _EXPLAINED else logging.WARNING
    _EXPLAINED.add(name)
    if missing:
        return level, (
            f"Keras cannot load class {name!r} back; decorate it with "
            "@keras.saving.register_keras_serializable() (and give it get_config() if its "
            "__init__ takes arguments) to get model.keras; the SavedModel serves it")
    if rebuilt:
        return level, (
            f"Keras cannot rebuild {name!r} from its config; let its __init__ take what "
            "get_config() returns (**kwargs: name, trainable, ...) or define get_config() to "
            "get model.keras; the SavedModel serves it")
    return level, (
        f"the model does not round-trip through Keras saving ({reason[:200]}); register "
        "custom layers with @keras.saving.register_keras_serializable() and give them "
        "get_config(); the SavedModel serves it")


def _move(source: str, target: str, *, within: str) -> None:
    """Puts the finished export at `target`, replacing one already there
    (removed through `engine.runtime.files.remove`: a link there goes as a
    link, its target untouched; `within`: the run's folder).

    A local rename is atomic; on filesystems whose rename copies object by
    object (gs://) a reader may briefly see a partial folder, as with any
    TensorFlow export there. `ram://` cannot rename directories: copied, with
    `saved_model.pb` last, which is what `latest_export` waits for.
    """
    if files.remove(target, within=within):
        logger.info("removed the existing export %s, to replace it", target)
    if not target.startswith(_RENAMES_NO_DIRECTORIES):
        tf.io.gfile.rename(source, target)
        return
    copied = []
    for folder, _, names in tf.io.gfile.walk(source):
        relative_folder = folder[len(source):].strip("/")
        tf.io.gfile.makedirs(os.path.join(target, relative_folder))
        copied += [os.path.join(relative_folder, name) for name in names]
    copied.sort(key=lambda relative: relative == SAVED_MODEL_FILENAME)
    for relative in copied:
        tf.io.gfile.copy(os.path.join(source, relative), os.path.join(target, relative))
    files.remove(source, within=within)
