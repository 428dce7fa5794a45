"""A run's train pipeline handed to the tf.data service (`--data_service`).

The pipeline the task builds (built-in or the user's, checked and with the
run's options) is given to the dispatcher, which deals its source out to the
data workers with dynamic sharding (`inputs.service` says why that mode and
what it costs); evaluation stays local. What changes for the run, measured
on loopback and said once at start-up:

- the order of batches is the workers' (it depends on which one finishes
  first), so `--deterministic` no longer makes reruns equal;
- a resumed run cannot skip to where it stopped (a skip inside the pipeline
  would skip in every worker's own share): it starts a new pass over the
  data, after the steps it already trained, with the examples it had yet to
  see in the interrupted pass seen later or not at all in that pass;
- each example is still trained on once per pass (at most once: the splits a
  killed worker held are lost), with no duplicates across workers.

The job name is what keeps runs apart: every consumer naming one job shares
its batches (each batch to one of them). The workers of one multi-worker
cluster name the same job (so the service shards the data between them, each
example to one worker), two runs never do (their model_dir, host or cluster
differ), and a restarted run's job carries the step it resumes from and its
batch: a restart from another step (or with another batch) never joins the
job of the attempt before it, which the dispatcher keeps for a while after
its last consumer left; one from the same step may, and then reads on in the
same pass.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
from typing import Mapping

import tensorflow as tf

from tfloop import inputs
from tfloop.engine.errors import ConfigError
from tfloop.inputs import service
from tfloop.launch import data_service

logger = logging.getLogger(__name__)


def job_prefix(model_dir: str, cluster: Mapping[str, tuple]) -> str:
    """`tfloop-<digest>`, the same in every task of one cluster, different
    for any two runs that could share a dispatcher: a cluster's tasks hash
    its members' addresses and `--model_dir` as given (each task may see it
    under another working directory); one process hashes its host name and
    the absolute model_dir (which the run's lock keeps to one writer)."""
    if cluster:
        key = {"cluster": {job: list(tasks) for job, tasks in sorted(cluster.items())},
               "model_dir": model_dir}
    else:
        key = {"host": socket.gethostname(), "model_dir": _absolute(model_dir)}
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]
    return f"tfloop-{digest}"


def _absolute(model_dir: str) -> str:
    return model_dir if "://" in model_dir else os.path.abspath(model_dir)


def job_name(prefix: str, *, start_step: int, global_batch_size: int) -> str:
    """The job of one attempt: a restart from another step, or with another
    batch, is another job (the dispatcher refuses a named job whose dataset
    changed, and a stale one would hand out the old attempt's leftovers)."""
    return f"{prefix}-step{start_step}-batch{global_batch_size}"


def serve(dataset: tf.data.Dataset, *, address: str, prefix: str, start_step: int,
          global_batch_size: int, where: str, wait_s: float) -> tf.data.Dataset:
    """`dataset` produced by the service at `address`, after the one-line
    refusals of a pipeline its workers cannot run (`inputs.service`) and of
    an address where nothing answers within `wait_s` (`--startup_timeout`:
    a dispatcher pod may start after the trainer's)."""
    reachable = data_service.wait_reachable(address, wait_s, on_wait=lambda: logger.info(
        "--data_service=%s: waiting up to %gs for its dispatcher", address, wait_s))
    if not reachable:
        raise ConfigError(
            f"--data_service={address}: no dispatcher answers there (waited {wait_s:g}s, "
            "--startup_timeout); start one (bin/data_service prints its address) or fix the "
            "address")
    try:
        service.check_servable(dataset, where)
        job = job_name(prefix, start_step=start_step, global_batch_size=global_batch_size)
        served = service.distribute(dataset, address, job)
    except inputs.InputError as error:
        raise ConfigError(str(error)) from None
    logger.info(
        "--data_service=%s: the train pipeline runs on its data workers (job %s, dynamic "
        "sharding: each example once per pass over the data, no duplicates across workers); "
        "the batches come in the order the workers finish them, so neither --deterministic "
        "nor exact resume holds for the data%s; evaluation runs here", address, job,
        f" (this run resumes at step {start_step} on a new pass)" if start_step else "")
    return served
