"""A user's collective (`--collective=module:Class`), checked instead of trusted.

A plug-in is code imported from `sys.path` that runs inside every training
step. One that drops a gradient, transposes one, or hands back the
replicas' values unsummed does not crash: the optimizer applies whatever it
gets, and the run trains wrong and exits 0. So `registry.create` wraps every
plug-in (and, with `--check_collective`, any collective) in `Checked`::

    Checked(plugin).check_devices(devices)    # anything raised: one line naming the plug-in
    Checked(plugin).batch_all_reduce(values, destinations):
        results = plugin.batch_all_reduce(values, destinations)   # anything raised: one line
        check_results(values, results)        # while tracing: structure, shapes, dtypes
        if compare_steps and call <= compare_steps:               # --check_collective
            diff = |result on each replica - sum of the values' replicas|
            record the first value beyond tolerance; stop the step before the update

The structural check costs nothing at run time: it reads static shapes and
dtypes while the step is traced, and adds no op. `probe` traces it once on
zeros shaped like the gradients before anything is written (the trainer
calls it), so a plug-in of the wrong shape is refused before a `model_dir`
exists.

The comparison (`compare_steps`) adds the plain sum of each value's replicas
(`tf.add_n`, the arithmetic every built-in reduction performs) and a
difference per replica; it is a debug mode, off by default. A difference
beyond float summation order (2·n·ε·Σ|x|, n replicas, ε the dtype's unit
roundoff) fails the step in an assertion that runs before the reduced
values reach the optimizer, and `mismatch` turns it into one line naming the
plug-in, the gradient and the largest difference.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

import tensorflow as tf

from tfloop.collectives import _values
from tfloop.collectives.base import Wrapper
from tfloop.collectives.interface import Collective, CollectiveError

#: Unit roundoff per float dtype: the relative error of one rounding.
_UNIT_ROUNDOFF = {tf.float64: 2.0**-53, tf.float32: 2.0**-24, tf.bfloat16: 2.0**-8,
                  tf.float16: 2.0**-11}

#: The assertion's message; `mismatch` recognizes the failure by the state it recorded.
_FAILED = "the collective's sum differs from the plain sum of the replicas (--check_collective)"


def reason(error: BaseException) -> str:
    """`Type: message` of what a plug-in raised, on one line, cut before it gets long."""
    text = " ".join(f"{type(error).__name__}: {error}".split())
    return text if len(text) <= 200 else text[:197] + "..."


def named(label: str, error: CollectiveError) -> CollectiveError:
    """A plug-in's own `CollectiveError`, its message prefixed with
    `--collective=<label>: ` unless it names the plug-in already."""
    message = str(error)
    return CollectiveError(message if label in message else f"--collective={label}: {message}")


class Checked(Wrapper):
    """`inner`'s results checked at trace time (and compared at run time for
    the first `compare_steps` all-reduces); see the module docstring.

    Args:
      inner: the collective to check, as the user wrote it (no wrappers).
      label: how the user named it (`my_module:MyCollective`), for messages.
      compare_steps: all-reduces to compare with the plain sum (0: none).
    """

    def __init__(self, inner: Collective, *, label: str, compare_steps: int = 0):
        super().__init__(inner)
        if isinstance(compare_steps, bool) or not isinstance(compare_steps, int) \
                or compare_steps < 0:
            raise CollectiveError(f"compare_steps={compare_steps!r} must be an integer >= 0 "
                                  "(0: no comparison)")
        self.label = label
        self.compare_steps = compare_steps
        #: A description of each value ever compared, by the index the graph records.
        self._described: list[str] = []
        if compare_steps:
            with tf.init_scope(), tf.device("/cpu:0"):
                self._calls = tf.Variable(0, dtype=tf.int64, trainable=False)
                self._bad = tf.Variable(-1, dtype=tf.int32, trainable=False)
                self._bad_call = tf.Variable(0, dtype=tf.int64, trainable=False)
                self._bad_diff = tf.Variable(0.0, dtype=tf.float64, trainable=False)

    def describe(self) -> str:
        return self.inner.describe()

    def check_devices(self, devices: Sequence[str]) -> None:
        self._guarded(f"check_devices({list(devices)})", self.inner.check_devices, devices)

    def check_gradient_dtype(self, dtype: str) -> None:
        self._guarded(f"check_gradient_dtype({dtype!r})", self.inner.check_gradient_dtype, dtype)

    def _guarded(self, call: str, check, *args) -> None:
        """Runs one of the plug-in's checks: its `CollectiveError` named, anything
        else it raises (the user's code: whatever it raises is theirs) one line."""
        try:
            check(*args)
        except CollectiveError as error:
            raise named(self.label, error) from None
        except Exception as error:
            raise CollectiveError(
                f"--collective={self.label}: its {call} raised {reason(error)}; fix the "
                "plug-in or choose a built-in collective") from None

    @tf.autograph.experimental.do_not_convert  # graph-building Python, called in merge_call
    def batch_all_reduce(self, values, destinations) -> list[Any]:
        names = [_name_of(d) for d in destinations]
        values, destinations = _values.prepare_batch(values, destinations)
        try:
            results = self.inner.batch_all_reduce(values, destinations)
        except CollectiveError:
            raise
        except Exception as error:  # the user's code, while the step is traced
            raise CollectiveError(
                f"--collective={self.label}: its batch_all_reduce raised {reason(error)} on "
                f"{len(values)} value(s) ({_describe(values[0], names[0]) if values else 'none'}, "
                "...); fix the plug-in or choose a built-in collective") from None
        results = check_results(self.label, values, results, names)
        if self.compare_steps and values and _values.is_distributed(values[0]):
            results = self._compare(values, results, names)
        return results

    def _compare(self, values: list, results: list, names: list[str]) -> list:
        offset = len(self._described)
        self._described.extend(_describe(v, n) for v, n in zip(values, names))
        call = self._calls.assign_add(1)

        def compare():
            excess, diffs = zip(*(_excess(v, r) for v, r in zip(values, results)))
            excess, diffs = tf.stack(excess), tf.stack(diffs)
            bad = excess > 0.0
            any_bad = tf.reduce_any(bad)
            first = tf.argmax(tf.cast(bad, tf.int32), output_type=tf.int32)
            record = tf.group(
                self._bad.assign(tf.where(any_bad, offset + first, self._bad)),
                self._bad_diff.assign(tf.where(any_bad, tf.gather(diffs, first), self._bad_diff)),
                self._bad_call.assign(tf.where(any_bad, call, self._bad_call)))
            with tf.control_dependencies([record]):
                stop = tf.debugging.Assert(tf.logical_not(any_bad), [_FAILED])
            with tf.control_dependencies([stop]):
                return tf.identity(any_bad)

        checked = tf.cond(call <= self.compare_steps, compare, lambda: tf.constant(False))
        # The optimizer gets the results only after the comparison passed.
        with tf.control_dependencies([checked]):
            return [tf.nest.map_structure(tf.identity, r, expand_composites=True)
                    if not _values.is_distributed(r)
                    else _values.map_components(tf.identity, r, mirrored=True)
                    for r in results]

    def mismatch(self) -> Optional[CollectiveError]:
        """The one-line error for a comparison that failed, None when none did."""
        if not self.compare_steps:
            return None
        bad = int(self._bad.numpy())
        if bad < 0:
            return None
        return CollectiveError(
            f"--collective={self.label}: its sum of {self._described[bad]} differs from the "
            f"plain sum of the replicas by up to {float(self._bad_diff.numpy()):.6g} (max abs) "
            f"at all-reduce {int(self._bad_call.numpy())} of the {self.compare_steps} "
            "--check_collective compares; the plug-in's batch_all_reduce must return the "
            "sum over replicas of each value on every replica")


def find(collective: Any) -> Optional[Checked]:
    """The `Checked` inside `collective`'s wrappers, if any."""
    while collective is not None:
        if isinstance(collective, Checked):
            return collective
        collective = getattr(collective, "inner", None)
    return None


def mismatch(collective: Any) -> Optional[CollectiveError]:
    """After a step failed: the one-line error when `--check_collective`
    stopped it (the caller re-raises the original error otherwise)."""
    checked = find(collective)
    return checked.mismatch() if checked is not None else None


def probe(collective: Any, strategy: tf.distribute.Strategy, variables: Sequence[Any]) -> None:
    """Traces `collective` once on zeros shaped like `variables`' gradients
    (nothing runs), so that a checked plug-in whose results have the wrong
    structure is refused before training writes anything. Only checked
    collectives are traced, and only with several replicas (one replica's
    gradients are never all-reduced)."""
    if find(collective) is None or strategy.num_replicas_in_sync == 1 or not variables:
        return
    variables = list(variables)

    def replica():
        grads = [tf.zeros(v.shape, v.dtype) for v in variables]
        return tf.distribute.get_replica_context().merge_call(
            lambda _, g: collective.batch_all_reduce(g, variables), args=(grads,))

    tf.function(lambda: strategy.run(replica), autograph=False).get_concrete_function()


def check_results(label: str, values: list, results: Any, names: Sequence[str]) -> list:
    """Raises `CollectiveError` naming the first result that cannot be the
    sum of its value: a count that differs, None, a per-replica value left
    unreduced, a single tensor for several replicas, another shape or dtype."""
    fix = "batch_all_reduce must return, in order, each value's sum mirrored onto its replicas"
    if results is None or isinstance(results, (str, bytes)) or not hasattr(results, "__len__"):
        raise CollectiveError(f"--collective={label} returned {type(results).__name__} from "
                              f"batch_all_reduce, not a list; {fix}")
    results = list(results)
    if len(results) != len(values):
        raise CollectiveError(f"--collective={label} returned {len(results)} result(s) for "
                              f"{len(values)} value(s); {fix}")
    for i, (value, result) in enumerate(zip(values, results)):
        what = f"result {i} ({_describe(value, names[i] if i < len(names) else '')})"
        if result is None:
            raise CollectiveError(f"--collective={label}: {what} is None; {fix}")
        parts = _values.components(value)
        if _values.is_distributed(value):
            if not _values.is_distributed(result):
                raise CollectiveError(
                    f"--collective={label}: {what} is one tensor, not one copy per replica "
                    f"({len(parts)}); build it with collectives.mirrored(...); {fix}")
            if not _values.is_mirrored(result):
                raise CollectiveError(
                    f"--collective={label}: {what} is {type(result).__name__}, values left "
                    f"unreduced per replica; {fix}")
        got = _values.components(result)
        if len(got) != len(parts):
            raise CollectiveError(f"--collective={label}: {what} has {len(got)} copies for "
                                  f"{len(parts)} replica(s); {fix}")
        for part, out in zip(parts, got):
            if getattr(out, "dtype", None) != part.dtype:
                raise CollectiveError(
                    f"--collective={label}: {what} comes back as "
                    f"{getattr(getattr(out, 'dtype', None), 'name', type(out).__name__)}; {fix}")
            want, have = _shape(part), _shape(out)
            if have is None or not want.is_compatible_with(have) or want.rank != have.rank:
                raise CollectiveError(
                    f"--collective={label}: {what} comes back with shape "
                    f"{_shape_text(have)}; {fix}")
    return results


def _name_of(destination: Any) -> str:
    """A variable's path (Keras 3) or name, for messages."""
    for attribute in ("path", "name"):
        name = getattr(destination, attribute, None)
        if isinstance(name, str) and name:
            return name
    return ""


def _shape(tensor: Any) -> Optional[tf.TensorShape]:
    if isinstance(tensor, tf.IndexedSlices):
        dense = tf.get_static_value(tensor.dense_shape)
        return tf.TensorShape(dense) if dense is not None else tf.TensorShape(None)
    shape = getattr(tensor, "shape", None)
    return tf.TensorShape(shape) if shape is not None else None


def _shape_text(shape: Optional[tf.TensorShape]) -> str:
    if shape is None:
        return "none"
    if shape.rank is None:
        return "unknown"
    return "(" + ", ".join("?" if d is None else str(d) for d in shape.as_list()) + ")"


def _describe(value: Any, name: str) -> str:
    part = _values.components(value)[0]
    what = f"shape {_shape_text(_shape(part))} {getattr(part.dtype, 'name', part.dtype)}"
    return f"the gradient of {name}, {what}" if name else what


def _excess(value: Any, result: Any) -> tuple[tf.Tensor, tf.Tensor]:
    """(largest |difference| − tolerance, largest |difference|) over every
    replica's copy of `result` against the plain sum of `value`'s replicas."""
    parts = [tf.convert_to_tensor(c) for c in _values.components(value)]
    dtype = parts[0].dtype
    wide = tf.float64 if dtype == tf.float64 else tf.float32
    unit = _UNIT_ROUNDOFF.get(dtype, 0.0)
    with tf.device(parts[0].device):
        widened = [tf.cast(p, wide) for p in parts]
        total = tf.add_n(widened)
        tolerance = 2.0 * len(parts) * unit * tf.add_n([tf.abs(p) for p in widened])
    excess, diffs = [], []
    for out in _values.components(result):
        out = tf.convert_to_tensor(out)
        with tf.device(out.device):
            # Where the sum itself is not finite (the gradients were not), there is
            # nothing to compare; a NaN the plug-in made where the sum is finite counts.
            diff = tf.where(tf.math.is_finite(total), tf.abs(tf.cast(out, wide) - total), 0.0)
            diff = tf.where(tf.math.is_nan(diff), tf.constant(float("inf"), wide), diff)
            excess.append(tf.cast(tf.reduce_max(diff - tolerance), tf.float64))
            diffs.append(tf.cast(tf.reduce_max(diff), tf.float64))
    return tf.reduce_max(tf.stack(excess)), tf.reduce_max(tf.stack(diffs))
