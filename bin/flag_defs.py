"""Flags written once, for every binary that takes them.

A flag that sets a `RunConfig` field takes its default and help from the field
(`engine.option.option`, in the section of the room that reads it), so
`bin/train`, `bin/bench_train` and `bin/bench_collectives` cannot drift apart
on `--devices`, `--seed` or `--intra_op_threads`. A binary may give another
default where its job differs (the benchmarks default to four logical CPUs)
and add a sentence to the help.
"""

from __future__ import annotations

import dataclasses
import os
import types
from typing import Iterable, Mapping, Optional

from absl import flags

from tfloop.engine.config import RunConfig  # imports no TensorFlow

#: Every binary that imports TensorFlow takes it (`cli.import_tensorflow` reads it).
VERBOSE = flags.DEFINE_bool(
    "verbose", False, "Also print TensorFlow's own C++ start-up and log lines (oneDNN, CUDA, "
    "CPU features, ...), hidden otherwise so that the first line is the engine's.")

_DEFINE = {bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float,
           str: flags.DEFINE_string}


def define_run_flags(names: Optional[Iterable[str]] = None, *,
                     defaults: Mapping[str, object] = {},
                     extra_help: Mapping[str, str] = {}) -> list[str]:
    """Defines `--<field>` for the named `RunConfig` fields (all when None);
    returns the names defined."""
    fields = {field.name: field for field in dataclasses.fields(RunConfig)}
    names = list(fields) if names is None else list(names)
    for name in names:
        field = fields[name]
        help_text = field.metadata["help"]
        if name in extra_help:
            help_text = f"{help_text} {extra_help[name]}"
        _DEFINE[type(field.default)](name, defaults.get(name, field.default), help_text)
    return names


def run_flag_values(names: Iterable[str]) -> dict:
    """`{name: value}` of flags defined by `define_run_flags`, after parsing."""
    return {name: flags.FLAGS[name].value for name in names}


def platform_dir_defaults(environ: Mapping[str, str] = os.environ, *,
                          flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
    """Vertex AI's output directories (`AIP_*`, `launch.platforms.platform_dirs`)
    as the defaults of `--model_dir` (`AIP_CHECKPOINT_DIR`, else
    `AIP_MODEL_DIR`: where a restarted job finds its checkpoints) and
    `--summaries_dir` (`AIP_TENSORBOARD_LOG_DIR`); a flag given on the command
    line wins. Sets the flags' values before they are read; returns one line
    per decision, for the caller to log once logging is set up.

    A value taken is checked as a path given on the command line is
    (`config.check_path_text`: blank, a newline, `~`, ...), naming the variable.
    """
    from tfloop.engine.config import check_path_text
    from tfloop.launch import platforms

    dirs = platforms.platform_dirs(environ)
    chosen = (("model_dir", dirs.run_dir,
               "AIP_CHECKPOINT_DIR" if dirs.checkpoint_dir is not None else "AIP_MODEL_DIR"),
              ("summaries_dir", dirs.tensorboard_log_dir, "AIP_TENSORBOARD_LOG_DIR"))
    said = []
    for name, value, variable in chosen:
        if value is None or name not in flag_values:
            continue
        flag = flag_values[name]
        if flag.present:
            said.append(f"--{name}={flag.value} as given (not ${variable}={value})")
        else:
            check_path_text(f"${variable}", value)
            flag.value = value
            said.append(f"--{name}={value} from ${variable} (Vertex AI); --{name} overrides it")
    return said


def check_given_run_flags(names: Iterable[str]) -> None:
    """`config.check_field` over the flags of `names` given on the command
    line: a value wrong whatever the others say (`--collective_timeout=nan`)
    is refused right after parsing, before TensorFlow's import. Only the given
    ones: a flag left out may yet take the value remembered in run.json
    (`remembered_run_values`), and the checks of fields together wait for it
    (`RunConfig`)."""
    from tfloop.engine.config import check_field

    for name in names:
        if flags.FLAGS[name].present:
            check_field(name, flags.FLAGS[name].value)


def remembered_run_values(names: Iterable[str]) -> dict:
    """`run_flag_values`, with the task/model/data flags not given on the
    command line taken from what trained `--model_dir` (its run.json), so
    resuming, evaluating and exporting need only `--model_dir`."""
    from tfloop.engine import strategies  # loads TensorFlow: not at flag definition
    from tfloop.engine.run_dir import run_identity

    values = run_flag_values(names)
    given = {name for name in values if flags.FLAGS[name].present}
    # Hardware the strategy must find (--strategy=tpu) is asked for before the
    # model_dir's storage: without a TPU the refusal is that, whatever the storage.
    if "strategy" in values:  # bin/export names no strategy: nothing to connect to
        strategies.get(values["strategy"]).connect(types.SimpleNamespace(**values))
    return run_identity.fill(values, given, run_identity.load(values["model_dir"]))


def define_output_dir(default: str, what: str) -> None:
    flags.DEFINE_string("output_dir", default, f"Where {what} go.")
