"""`bin/bench_train --device_counts=1,2,4`: one process per device count, one table and plot.

TensorFlow fixes its (logical) devices once per process, so each count runs
the benchmark binary again in a subprocess on the first N devices of a kind,
writing its JSON into `<output_dir>/<N>dev/`; this process then combines them
into one table, `bench_train.json` and `bench_train.png` (`bench.report`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Sequence

from tfloop.bench import report
from tfloop.bench.timing import Progress
from tfloop.engine.errors import ConfigError

#: Flags each run of the sweep sets itself, so they are not passed on.
_SWEEP_FLAGS = ("--devices", "--device_counts", "--output_dir")


def parse_device_counts(values: Sequence[str], *, global_batch_size: int) -> list[int]:
    """`["1", "2", "4"]` → `[1, 2, 4]`; each count positive and dividing the batch."""
    try:
        counts = [int(c) for c in values]
    except ValueError:
        raise ConfigError(f"--device_counts={','.join(values)} is not a list "
                          "of integers; e.g. --device_counts=1,2,4") from None
    bad = [c for c in counts if c < 1 or global_batch_size % c]
    if bad:
        raise ConfigError(f"--device_counts: {bad[0]} must be positive and divide "
                          f"--global_batch_size={global_batch_size}")
    return counts


def child_args(argv: Sequence[str]) -> list[str]:
    """The binary's arguments without those each run of the sweep sets itself."""
    return [a for a in argv if not a.startswith(_SWEEP_FLAGS)]


def sweep(device_counts: Sequence[int], device_kind: str, argv: Sequence[str], output_dir: str,
          *, script: str, progress: Progress = print, plot: bool = True) -> list[dict]:
    """Runs `script argv --devices=<kind>:0..N-1` once per count in a subprocess
    (logical devices are fixed per process); combines their JSON, prints one
    table, writes `bench_train.json` and the plot."""
    results = []
    for count in device_counts:
        devices = ",".join(f"{device_kind}:{i}" for i in range(count))
        sub_dir = os.path.join(output_dir, f"{count}dev")
        progress(f"=== {count} device(s): {devices}")
        subprocess.run([sys.executable, script, *argv, f"--devices={devices}",
                        "--device_counts=", f"--output_dir={sub_dir}"], check=True)
        [name] = [n for n in os.listdir(sub_dir) if n.endswith(".json")]
        with open(os.path.join(sub_dir, name)) as f:
            results.append(json.load(f))
    progress(report.training_table(results))
    files = report.write_training_sweep(results, output_dir, plot=plot)
    progress(f"wrote {', '.join(files)}")
    return results
