"""Device names: the one parser, the one short spelling, the one kind test.

TensorFlow spells a device many ways ("/gpu:0", "/device:GPU:0",
"/job:worker/replica:0/task:0/device:CPU:1"). The project's canonical names
are "/gpu:0" and "/cpu:1" (what `--devices=gpu:0,cpu:1` becomes), and logs
and error messages show "gpu:0,cpu:1"::

    canonical(" GPU:0")                  -> "/gpu:0"   (None: not cpu:N or gpu:N)
    canonical("/job:localhost/replica:0/task:0/device:GPU:1") -> "/gpu:1"
    kind("/device:GPU:0")                -> "gpu"
    index("/cpu:3")                      -> 3
    short_list(["/cpu:0", "/cpu:1"])     -> "cpu:0,cpu:1"

It lives in `collectives`, the lowest package that names devices, so the
collectives and the engine share it (collectives import nothing of the engine).
"""

from __future__ import annotations

import re
from typing import Optional, Sequence

import tensorflow as tf

_CANONICAL_RE = re.compile(r"^(cpu|gpu):(\d+)$")


def canonical(item: str) -> Optional[str]:
    """"gpu:0", "GPU:0", "/cpu:3" (any case, leading slashes, spaces), and
    TensorFlow's own spellings of a device of this process ("/device:GPU:0",
    "/job:localhost/replica:0/task:0/device:GPU:0", what `tf.config` and
    `tensor.device` print) as "/gpu:0", "/cpu:3"; None for anything else
    ("tpu:0", "gpu0", a device of another task such as "/job:worker/task:1/device:GPU:0")."""
    text = item.strip()
    match = _CANONICAL_RE.match(text.lower().lstrip("/"))
    if match:
        return f"/{match.group(1)}:{int(match.group(2))}"
    if "device:" not in text.lower():
        return None
    try:
        spec = _spec(text)
    except (ValueError, TypeError):
        return None
    local = (spec.job in (None, "localhost") and spec.replica in (None, 0)
             and spec.task in (None, 0))
    device_type = (spec.device_type or "").lower()
    if not local or device_type not in ("cpu", "gpu") or spec.device_index is None:
        return None
    return f"/{device_type}:{spec.device_index}"


def _spec(device: str) -> tf.DeviceSpec:
    return tf.DeviceSpec.from_string(device)


def kind(device: str) -> str:
    """"gpu", "cpu" (or another type, lower case) for a device name in any TF
    spelling; "" when the name gives no type or does not parse."""
    try:
        device_type = _spec(device).device_type
    except (ValueError, TypeError):
        device_type = None
    return (device_type or "").lower()


def index(device: str) -> int:
    """The device's number: 3 for "/cpu:3" or "/device:CPU:3"."""
    return _spec(device).device_index


def short(device: str) -> str:
    """"cpu:0" for any TF spelling of a device (for logs and error messages)."""
    spec = _spec(device)
    return f"{(spec.device_type or '?').lower()}:{spec.device_index}"


def short_list(devices: Sequence[str], separator: str = ",") -> str:
    """"cpu:0,cpu:1": the devices as `--devices` writes them."""
    return separator.join(short(d) for d in devices)
