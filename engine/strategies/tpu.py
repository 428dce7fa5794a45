"""`--strategy=tpu`: find and initialize a TPU, or say in one line why not.

The real path is TensorFlow's: `TPUClusterResolver` names the TPU workers,
`experimental_connect_to_cluster` makes them this process's remote devices,
`initialize_tpu_system` configures the chips (and returns their topology,
hence the replica count), and `TPUStrategy(resolver)` is built from the same
resolver by `TPU.build` below.

Every step can wait on the network, and with no TPU none of them may answer:
the resolver asks the Cloud TPU API (or, with no name at all, the GCE
metadata server), and connecting to an unreachable `grpc://` address retries
for minutes (measured here: still waiting after 60 s). So `connect` only
tries when a TPU is named (`--tpu`, else `$TPU_NAME`), and bounds each step:

    no --tpu and no TPU_NAME         -> refused at once, nothing contacted
    resolving the name               -> at most `timeout_s` (a daemon thread)
    each grpc://host:port worker     -> a TCP connect, at most 5 s, before
                                        TensorFlow is pointed at it
    --tpu=local (a TPU VM)           -> initialize_tpu_system on local chips

Each failure is a `ConfigError`: "--strategy=tpu found no TPU: <why>; ...".
This runs in `engine.assembly.plan`, before anything is written.
"""

from __future__ import annotations

import os
import socket
import threading
from typing import Mapping
from urllib.parse import urlparse

import tensorflow as tf

from tfloop.engine.errors import ConfigError
from tfloop.engine.strategies.registry import register
from tfloop.engine.strategies.spec import NO_CLUSTER, ReducesItself

_FALLBACK = "use --strategy=mirrored (or one_device, central_storage) on this machine"
_PROBE_S = 5.0


def _refuse(why: str) -> ConfigError:
    return ConfigError(f"--strategy=tpu found no TPU: {why}; {_FALLBACK}")


def _reason(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0][:160] if text else ''}".rstrip(": ")


def _resolve(address: str, timeout_s: float):
    """`TPUClusterResolver(address)`, or a refusal after `timeout_s`."""
    result: dict = {}

    def resolve():
        try:
            result["resolver"] = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address)
        except Exception as error:  # the resolver raises many kinds; all mean "no TPU"
            result["error"] = error

    thread = threading.Thread(target=resolve, name="resolve TPU", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _refuse(f"resolving --tpu={address} gave no answer in {timeout_s:g} s")
    if "error" in result:
        raise _refuse(f"cannot resolve --tpu={address} ({_reason(result['error'])})")
    return result["resolver"]


def _probe(resolver) -> None:
    """A TCP connect to every TPU worker, so that TensorFlow never waits on a dead one."""
    addresses = []
    try:
        addresses = resolver.cluster_spec().as_dict().get("worker", [])
    except Exception as error:
        raise _refuse(f"the resolver lists no TPU workers ({_reason(error)})") from None
    if not addresses:
        raise _refuse("the resolver lists no TPU workers")
    for address in addresses:
        parsed = urlparse(address if "://" in address else f"grpc://{address}")
        try:
            socket.create_connection((parsed.hostname, parsed.port), timeout=_PROBE_S).close()
        except (OSError, ValueError, TypeError) as error:
            raise _refuse(f"nothing answers at {address} ({error})") from None


def connect(tpu: str = "", *, environ: Mapping[str, str] = os.environ,
            timeout_s: float = 30.0):
    """Connects to and initializes the named TPU.

    Args:
      tpu: a Cloud TPU name, `grpc://host:port`, or `local` on a TPU VM;
        empty means `$TPU_NAME`.

    Returns:
      (resolver, number of TPU cores).

    Raises:
      ConfigError: no TPU is named, or the named one cannot be reached or
        initialized (bounded in time; see the module docstring).
    """
    address = tpu.strip() or environ.get("TPU_NAME", "").strip()
    if not address:
        raise _refuse("no --tpu and no TPU_NAME in the environment (name the TPU: "
                      "--tpu=NAME, --tpu=grpc://HOST:PORT, or --tpu=local on a TPU VM)")
    if address not in _CONNECTED:  # bin/train asks before it reads --model_dir, then the plan
        _CONNECTED[address] = _connect(address, timeout_s)
    return _CONNECTED[address]


#: The TPUs this process initialized, by address: a TPU system is initialized once.
_CONNECTED: dict = {}


def _connect(address: str, timeout_s: float):
    resolver = _resolve(address, timeout_s)
    try:
        if address != "local":
            _probe(resolver)
            tf.config.experimental_connect_to_cluster(resolver)
        topology = tf.tpu.experimental.initialize_tpu_system(resolver)
    except ConfigError:
        raise
    except Exception as error:  # e.g. NotFoundError: no TPU kernels on this machine
        raise _refuse(f"{address} did not initialize ({_reason(error)})") from None
    return resolver, topology.num_tasks * topology.num_tpus_per_task


@register
class TPU(ReducesItself):
    name = "tpu"
    summary = "a Cloud TPU or TPU VM named by --tpu (or $TPU_NAME)"
    reduction = "which all-reduces over the TPU interconnect"

    def check(self, sections, role) -> None:
        super().check(sections, role)
        if sections.distribution.gpu_memory_growth:
            raise ConfigError("--gpu_memory_growth applies to GPUs, and --strategy=tpu runs on "
                              "TPU cores; drop it")

    def connect(self, distribution):
        """(resolver, cores) of the initialized TPU; refuses in one line without one."""
        return connect(distribution.tpu)

    def num_replicas(self, devices, *, role=NO_CLUSTER, connection=None) -> int:
        cores = connection[1] if connection else 0
        if cores < 1:
            raise ConfigError("--strategy=tpu found no TPU cores; use --strategy=mirrored")
        return cores

    def build(self, devices, *, connection=None, **unused) -> tf.distribute.Strategy:
        return tf.distribute.TPUStrategy(connection[0])
