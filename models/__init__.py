"""Model builders behind a registry by name (`models.build("cnn")`)."""

from models.registry import available, build, check, register

__all__ = ["available", "build", "check", "register"]
