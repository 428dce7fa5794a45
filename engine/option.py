"""How a setting is declared (`option`), and the checks every room's settings share.

Each room declares the settings it reads as one frozen section, in its own
`settings.py` (`engine/loop/settings.py`: `Loop` and `Step`; `engine/recipe/
settings.py`: `Recipe`; ...), each field written once with everything known
about it::

    clip_norm: float = option(0.0, "Clip the all-reduced gradients ...",
                              check=non_negative_number, per_range=True)

and `engine.config.RunConfig` composes the sections into the flat record
`bin/train`'s flags fill. This module is what the sections are made of: the
`option` declaration, `Settings` (a section's base: each field's own check
at construction, `changed`), the checks one field needs (`count`, `one_of`,
`fraction`, ...; each names the flag it was given for) and the one check of
a path's text (`check_path_text`). Imports no TensorFlow: `bin/train`
defines its flags from the sections before TensorFlow loads.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from typing import Any, Callable, ClassVar, Optional, Sequence, Union

from tfloop.engine.errors import ConfigError

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



def option(default: Value, help: str, *, check: Optional[Check] = None,
           identity: bool = False, per_range: bool = False) -> Any:
    """A section's field (and `RunConfig`'s, and bin/train's flag), written
    once with everything known about it:

    - `default` and `help`: `bin/train` defines `--<field name>` from them
      (`bin/flag_defs.py`), docs/flags.md lists them (tests/test_docs.py);
    - `check`: its own range or choice (`check_field`), run by its section at
      construction and by `bin/train` on the given flag before TensorFlow loads;
    - `identity`: it decides what the checkpoints' variables are and what they
      were trained on, so run.json remembers it (`IDENTITY`, `run_identity`);
    - `per_range`: it is part of how a run trains, which a resumed run may
      change, so run.json records it for each range of steps trained with one
      value (`PER_RANGE`, `run_identity.write`; `--optimizer` is recorded
      too, and a change of it refused by `run_identity.check`).

    The section a field belongs to is the class it is declared in.
    """
    return dataclasses.field(default=default, metadata={
        "help": help, "check": check, "identity": identity, "per_range": per_range})


class Settings:
    """The base of a room's section: a frozen dataclass of `option` fields.

    Construction runs each field's own check, in field order, then the
    section's checks of its fields together (a subclass's `__post_init__`
    calls `super().__post_init__()` first). Checks across sections are
    `RunConfig`'s.
    """

    #: The section's title: docs/flags.md's and `help(RunConfig)`'s heading.
    TITLE: ClassVar[str] = ""

    def __post_init__(self) -> None:
        for field in dataclasses.fields(self):
            check = field.metadata.get("check")
            if check is not None:
                check(field.name, getattr(self, field.name))

    def changed(self, *names: str) -> list[str]:
        """`--name=value` for each of `names` not at its default: the flags a
        user set, for a refusal to name."""
        return changed_flags(self, names)


def changed_flags(record: Any, names: Sequence[str]) -> list[str]:
    """`--name=value` for each of `names` whose value in the dataclass
    `record` (a section, or the whole `RunConfig`) is not its default."""
    defaults = {field.name: field.default for field in dataclasses.fields(record)}
    return [f"--{name}={getattr(record, name)}" for name in names
            if getattr(record, name) != defaults[name]]


def flagged(section: type, key: str) -> tuple[str, ...]:
    """The names of `section`'s fields declared with `option(key=True)`
    (`identity`, `per_range`), in field order."""
    return tuple(field.name for field in dataclasses.fields(section) if field.metadata[key])
