"""The one check of the packing and compression options, wherever they come from.

`--num_packs`, `--pack_bytes` and `--gradient_dtype` reach the collectives
from `bin/train` (through `engine.config.RunConfig`), from
`bin/bench_collectives`, and from code calling `collectives.create` or the
wrappers directly. Each of those calls `check_options` (or `check_count`
for one value), so every range, every message and every fix is written once,
here.
"""

from __future__ import annotations

from typing import Any

from tfloop.collectives.interface import CollectiveError

#: The dtypes gradients may travel in (`float32` = as they are, no compression).
GRADIENT_DTYPES = ("float32", "bfloat16", "float16")

_MEANINGS = {
    "num_packs": "0 = no packing, N = at most N buckets",
    "pack_bytes": "0 = off, e.g. 4194304 for 4 MiB",
}


def check_count(arg: str, value: Any) -> int:
    """`value` of `--<arg>` (`num_packs` or `pack_bytes`) as an int >= 0 (None
    is 0); raises `CollectiveError` naming the flag and the value otherwise."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise CollectiveError(f"--{arg}={value!r} must be an integer >= 0 ({_MEANINGS[arg]})")
    return value


def check_options(
    *, num_packs: Any = 0, pack_bytes: Any = 0, gradient_dtype: Any = "float32"
) -> tuple[int, int, str]:
    """Checks the packing and compression options together; returns them
    normalized (None counts as 0).

    Raises:
      CollectiveError: a negative or non-integer count, both packings set, or
        a dtype not in `GRADIENT_DTYPES`; one line naming the flag, the value
        and the fix.
    """
    num_packs = check_count("num_packs", num_packs)
    pack_bytes = check_count("pack_bytes", pack_bytes)
    if num_packs and pack_bytes:
        raise CollectiveError(
            f"--num_packs={num_packs} and --pack_bytes={pack_bytes} are both set; choose one "
            "(a bucket count or a bucket size)"
        )
    if gradient_dtype not in GRADIENT_DTYPES:
        raise CollectiveError(
            f"--gradient_dtype={gradient_dtype!r} is not supported; choose one of "
            f"{'|'.join(GRADIENT_DTYPES)}"
        )
    return num_packs, pack_bytes, gradient_dtype
