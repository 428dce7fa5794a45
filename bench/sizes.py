"""Byte sizes as the benchmarks write them: "4K", "4KiB", "1mb", "4096" (K/M/G
are powers of 1024). No TensorFlow: `bin/predict_scaling` reads `--packings`
with it before anything heavy is imported."""

from __future__ import annotations

import re

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
_SIZE_RE = re.compile(r"^(\d+)\s*([KMG]?)(?:I?B)?$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """"4K" → 4096 ("4KiB", "4kb", "4096" too); ValueError otherwise."""
    match = _SIZE_RE.match(text.strip())
    if not match:
        raise ValueError(text)
    return int(match.group(1)) * _UNITS[match.group(2).upper()]


def format_size(num_bytes: int) -> str:
    """4096 → "4K"; sizes that are no whole K, M or G stay in bytes."""
    for unit in ("G", "M", "K"):
        if num_bytes >= _UNITS[unit] and num_bytes % _UNITS[unit] == 0:
            return f"{num_bytes // _UNITS[unit]}{unit}"
    return str(num_bytes)
