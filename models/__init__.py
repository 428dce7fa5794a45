"""Model builders behind a registry by name (`models.build("cnn")`)."""

from tfloop.models import vision  # noqa: F401  (registers mobilenet_v2, resnet50, resnet_small)
from tfloop.models.errors import ModelError
from tfloop.models.registry import available, build, check, register

__all__ = ["ModelError", "available", "build", "check", "register"]
