"""The binaries as console entry points: `pip install .` puts `tfloop-train`,
`tfloop-launch`, ... on PATH, each running the script of the same name in this
folder (which stays the canonical `bin/train` in a checkout)."""

import os
import runpy

_HERE = os.path.dirname(os.path.abspath(__file__))


def _run(script: str) -> None:
    runpy.run_path(os.path.join(_HERE, script), run_name="__main__")


def train() -> None:
    _run("train")


def launch() -> None:
    _run("launch")


def bench_collectives() -> None:
    _run("bench_collectives")


def bench_train() -> None:
    _run("bench_train")


def convert_to_tfrecord() -> None:
    _run("convert_to_tfrecord")


def export() -> None:
    _run("export")


def gpu_check() -> None:
    _run("gpu_check")


def predict_scaling() -> None:
    _run("predict_scaling")


def data_service() -> None:
    _run("data_service")
