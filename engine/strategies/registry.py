"""`--strategy` name → its `StrategySpec`."""

from __future__ import annotations

from tfloop.engine.errors import ConfigError

_SPECS: dict = {}


def register(spec_class):
    """Class decorator: makes `spec_class` available as `--strategy=<its name>`."""
    _SPECS[spec_class.name] = spec_class()
    return spec_class


def available() -> list[str]:
    return sorted(_SPECS)


def get(name: str):
    """The spec of `--strategy=name`, or the one-line refusal listing the names."""
    if name not in _SPECS:
        raise ConfigError(
            f"--strategy={name!r} is not a strategy; choose one of: {', '.join(available())}")
    return _SPECS[name]
