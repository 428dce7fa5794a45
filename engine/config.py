"""The run configuration: every room's settings, composed into one frozen,
typed record, validated once.

Each room declares the settings it reads, as one frozen section beside its
code (`engine.option.option`: each field written once, with its flag's
default and help, its own check, and whether run.json remembers it)::

    Distribution, Cluster    engine/strategies/settings.py
    ModelAndData             engine/task/settings.py
    Loop, Step               engine/loop/settings.py   (Step: Trainer(options=...))
    Recipe                   engine/recipe/settings.py
    Keeping                  engine/run_dir/settings.py
    Speed                    engine/runtime/settings.py

`RunConfig` composes them. Its fields are the sections' fields, flat and in
section order (the flag order), so `bin/train`'s flags stay flat
(`--clip_norm`), `RunConfig(clip_norm=1.0)`, `config.clip_norm`,
`dataclasses.replace(config, ...)` and `config.as_dict()` (run.json,
metrics.json) work as on any dataclass, and `config.step` is the typed `Step`
a module that reads the step is handed. Adding a flag is one edit in the room
that reads it (its `option(...)` line, plus its use): `SECTIONS`,
`check_field`, `IDENTITY`, `PER_RANGE`, bin/train's flags and docs/flags.md
all come from it.

The checks, in the order they run: each field's own, in flag order (as
`bin/train` runs `check_field` over the given flags before TensorFlow loads,
so both report the same first mistake); then each section's checks of its
own fields together (its `__post_init__`), section by section; then the
checks across sections, here. Checks that need the machine or the file
system (devices, data files, `model_dir`: `engine.assembly.plan`) and the batch
arithmetic (`engine.assembly.batching`) happen before anything is created.

This module sits above every room it composes (tests/test_layers.py): the
rooms import their own section and `engine.option`, never `RunConfig` (an
annotation aside, under `TYPE_CHECKING`).
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import Any

from tfloop.engine.errors import ConfigError
# Re-exported: what callers imported from here before the sections moved to
# their rooms (the checks, the limits, the path check, each section's choices).
from tfloop.engine.option import (  # noqa: F401
    INT32_MAX, MAX_CLASSES, MAX_IMAGE_SIZE, MAX_PACK_BYTES, MAX_THREADS, MAX_TIMEOUT,
    MAX_VIRTUAL_GPUS, NON_NEGATIVE, POSITIVE, SEED_MAX, Check, Value, batches_or_all, changed_flags,
    check_model_dir_text, check_path_text, count, decay, eval_metric, factor_or_off, fraction,
    non_negative_number, one_of, option, optional_path, parse_profile_steps, parse_steps,
    positive_number, required_path, seconds, service_address, step_list, step_range, threads)
from tfloop.engine.loop.settings import MODES, NAN_POLICIES, RUN_MODES, Loop, Step  # noqa: F401
from tfloop.engine.recipe.settings import (  # noqa: F401
    BIASES_AND_NORMS, LR_SCALING, LR_SCHEDULES, Recipe)
from tfloop.engine.run_dir.settings import BEST_MODES, Keeping  # noqa: F401
from tfloop.engine.runtime.settings import PRECISIONS, Speed  # noqa: F401
from tfloop.engine.strategies.settings import SHARD_POLICIES, Cluster, Distribution  # noqa: F401
from tfloop.engine.task.settings import ModelAndData

#: The sections `RunConfig` composes, in flag order: (its attribute on a
#: config, its class). `config.recipe` is that run's `Recipe`.
COMPOSED: tuple[tuple[str, type], ...] = (
    ("distribution", Distribution), ("model_and_data", ModelAndData), ("loop", Loop),
    ("recipe", Recipe), ("step", Step), ("keeping", Keeping), ("cluster", Cluster),
    ("speed", Speed))


def _compose(cls: type) -> type:
    """Makes `cls` the frozen dataclass of every section's fields, flat, in
    `COMPOSED` order, each field's metadata naming its section's title."""
    annotations: dict[str, Any] = {}
    for attribute, section in COMPOSED:
        for field in dataclasses.fields(section):
            if field.name in annotations or hasattr(cls, field.name):
                raise TypeError(f"{section.__name__}.{field.name} is declared twice")
            annotations[field.name] = field.type
            setattr(cls, field.name, dataclasses.field(
                default=field.default, metadata={**field.metadata, "section": section.TITLE}))
    cls.__annotations__ = annotations
    return dataclasses.dataclass(frozen=True)(cls)


@_compose
class RunConfig:
    """Everything one training or evaluation run needs.

    Each field's help (`dataclasses.fields(RunConfig)[i].metadata["help"]`)
    is also the help of its flag (`bin/flag_defs.py` defines them), and is
    listed below by section (`help(RunConfig)`; written by `_document`).
    `config.<section>` (`distribution`, `model_and_data`, `loop`, `recipe`,
    `step`, `keeping`, `cluster`, `speed`) is that section as its room
    declares it (`COMPOSED`), a frozen record built and checked with the run's.
    """

    def __post_init__(self):
        # Each field on its own first, in field order: the same checks, in the
        # same order, as `check_field` makes over the flags given to bin/train
        # before TensorFlow loads, so both report the same first mistake.
        for field in dataclasses.fields(self):
            check_field(field.name, getattr(self, field.name))
        # Each section: its fields together (its own __post_init__).
        for attribute, section in COMPOSED:
            values = {field.name: getattr(self, field.name)
                      for field in dataclasses.fields(section)}
            object.__setattr__(self, f"_{attribute}", section(**values))
        self._check_across_sections()

    # Each section as its room declares it: hand a module `config.recipe`,
    # not the whole run.
    @property
    def distribution(self) -> Distribution:
        return self._distribution

    @property
    def model_and_data(self) -> ModelAndData:
        return self._model_and_data

    @property
    def loop(self) -> Loop:
        return self._loop

    @property
    def recipe(self) -> Recipe:
        return self._recipe

    @property
    def step(self) -> Step:
        return self._step

    @property
    def keeping(self) -> Keeping:
        return self._keeping

    @property
    def cluster(self) -> Cluster:
        return self._cluster

    @property
    def speed(self) -> Speed:
        return self._speed

    def changed(self, *names: str) -> list[str]:
        """`--name=value` for each of `names` not at its default: the flags a
        user set, for a refusal to name."""
        return changed_flags(self, names)

    def _check_across_sections(self) -> None:
        """The flags of two sections that only mean something together."""
        if self.synthetic_on_device and self.strategy == "parameter_server":
            raise ConfigError("--synthetic_on_device keeps one batch on the devices of a loop "
                              "that runs in this process; --strategy=parameter_server's steps "
                              "run on its workers: drop it, or use --strategy=multi_worker")
        if self.max_per_replica_batch_size and self.changed("accumulation_steps"):
            raise ConfigError(
                f"--max_per_replica_batch_size={self.max_per_replica_batch_size} lets the engine "
                f"choose the micro-batches, and --accumulation_steps={self.accumulation_steps} "
                "fixes them; give one")
        self._check_data_service()

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

    @property
    def lr_decay_boundaries(self) -> tuple[int, ...]:
        """`lr_decay_steps` as global steps."""
        return self.recipe.lr_decay_boundaries

    @property
    def profile_range(self):
        """`profile_steps` as `(A, B)`, or None."""
        return self.speed.profile_range

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)

    def section(self, name: str) -> dict:
        """The fields of one of `SECTIONS`, by title: `config.section("Distribution")`."""
        return {field: getattr(self, field) for field in SECTIONS[name]}


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


#: RunConfig's fields by section title, in flag order: how docs/flags.md,
#: `help(RunConfig)` and a reader group them (tests/engine/config/
#: test_config_sections.py: every field in exactly one). The flags themselves
#: stay flat (--learning_rate, not --recipe.learning_rate), as do
#: `RunConfig(...)`'s arguments.
SECTIONS = {section.TITLE: tuple(field.name for field in dataclasses.fields(section))
            for _, section in COMPOSED}


#: The fields that decide what a checkpoint's variables are and what they were
#: trained on (`option(identity=True)`): run.json remembers them (`run_identity`).
IDENTITY = tuple(name for name, field in _FIELDS.items() if field.metadata["identity"])

#: The fields a resumed run may change (`option(per_range=True)`), in flag
#: order: run.json records them per range of steps (`run_identity.write`).
PER_RANGE = tuple(name for name, field in _FIELDS.items() if field.metadata["per_range"])
#: On the class too: `run_identity.write` (in a room below this one) reads
#: it from the config it records.
RunConfig.PER_RANGE = PER_RANGE


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
