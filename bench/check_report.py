"""The report of `bin/gpu_check`: one `CheckResult` per check, written as
JSON and Markdown after every check.

Why after every check: the checks exercise the parts of a GPU host most
likely to crash or hang (CUDA libraries, NCCL, a first PTX JIT), and a report
that appears only at the end would be lost with the process. Each write goes
to a temporary file first and replaces the old one (`os.replace`), so a
reader never sees half a file; `complete` is false until the last check.

Imports no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math
import os
from typing import Any, Optional

from tfloop.engine.runtime import files

PASS, FAIL, SKIPPED = "pass", "fail", "skipped"
STATUSES = (PASS, FAIL, SKIPPED)

JSON_NAME = "report.json"
MARKDOWN_NAME = "report.md"


@dataclasses.dataclass
class CheckResult:
    """One check's outcome.

    Attributes:
      name: stable identifier (`training_plain`), the key a script reads.
      title: what it checks, in words.
      status: pass | fail | skipped.
      reason: why it failed or was skipped, or what it found (one line).
      numbers: what it measured (losses, relative differences, busbw, ...).
      seconds: wall time of the check.
    """

    name: str
    title: str
    status: str
    reason: str = ""
    numbers: dict[str, Any] = dataclasses.field(default_factory=dict)
    seconds: float = 0.0

    def __post_init__(self):
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} must be one of {'|'.join(STATUSES)}")
        if self.status != PASS and not self.reason:
            raise ValueError(f"a {self.status} check ({self.name}) needs a reason")


class Report:
    """The checks done so far, rewritten to `output_dir` on every `add`.

        report = Report(output_dir, mode="gpu", machine={...})
        for check in checks:
            report.add(run(check))       # report.json and report.md rewritten
        report.finish()                  # complete: true
    """

    def __init__(self, output_dir: str, *, mode: str, machine: Optional[dict] = None):
        self.output_dir = output_dir
        self.mode = mode
        self.machine = dict(machine or {})
        self.results: list[CheckResult] = []
        self.complete = False
        self.started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self.write()

    @property
    def json_path(self) -> str:
        return os.path.join(self.output_dir, JSON_NAME)

    @property
    def markdown_path(self) -> str:
        return os.path.join(self.output_dir, MARKDOWN_NAME)

    def add(self, result: CheckResult) -> None:
        self.results.append(result)
        self.write()

    def finish(self) -> None:
        self.complete = True
        self.write()

    def failed(self) -> list[CheckResult]:
        return [r for r in self.results if r.status == FAIL]

    def counts(self) -> dict[str, int]:
        return {status: sum(r.status == status for r in self.results) for status in STATUSES}

    def as_dict(self) -> dict:
        return {"mode": self.mode, "started": self.started, "complete": self.complete,
                "machine": self.machine, "counts": self.counts(),
                "checks": [dataclasses.asdict(r) for r in self.results]}

    def write(self) -> None:
        _write_atomically(self.json_path, json.dumps(_finite(self.as_dict()), indent=2) + "\n")
        _write_atomically(self.markdown_path, markdown(self))


def markdown(report: Report) -> str:
    """The report for people: a table of every check, then each one's numbers."""
    counts = report.counts()
    lines = [f"# GPU check ({'CPU dry run' if report.mode == 'cpu_dry_run' else report.mode})",
             "", f"Started {report.started}; "
             f"{'complete' if report.complete else 'INCOMPLETE (still running, or stopped)'}: "
             f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[SKIPPED]} skipped.", ""]
    if report.machine:
        lines += ["## Machine", ""]
        lines += [f"- {key}: {_cell(value)}" for key, value in report.machine.items()]
        lines.append("")
    lines += ["## Checks", "", "| check | status | seconds | reason |", "|---|---|---|---|"]
    for r in report.results:
        lines.append(f"| {r.title} (`{r.name}`) | **{r.status}** | {r.seconds:.1f} | "
                     f"{_cell(r.reason)} |")
    for r in report.results:
        if not r.numbers:
            continue
        lines += ["", f"### {r.name}", ""]
        lines += [f"- {key}: {_cell(value)}" for key, value in r.numbers.items()]
    return "\n".join(lines) + "\n"


def _cell(value: Any) -> str:
    if isinstance(value, float):
        text = f"{value:.4g}"
    elif isinstance(value, (dict, list)):
        text = json.dumps(_finite(value))
    else:
        text = str(value)
    return text.replace("|", "\\|").replace("\n", " ")


def _finite(value: Any) -> Any:
    """NaN and infinities as strings: JSON has no spelling for them."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value


def _write_atomically(path: str, text: str) -> None:
    # A random temporary name, never opened through a link (engine.runtime.files).
    files.write_atomically(path, text)
