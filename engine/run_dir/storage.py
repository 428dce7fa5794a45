"""Whether `--model_dir`'s storage answers: the first touch, translated once.

A `--model_dir` URL (`gs://bucket/run`) lives behind a network. TensorFlow's
filesystems report a storage they cannot reach as a `tf.errors` exception
from whatever file call came first (TF 2.21's built-in GCS filesystem, with
no network: `FailedPreconditionError: Error executing an HTTP request: libcurl
code 6 meaning 'Could not resolve hostname' ... when reading metadata of
gs://.../run.json`), which reached the user as a traceback. `check_reachable`
is that first call, made on purpose where the engine first touches
`model_dir` (`run_identity.load`, which `bin/train` calls to read run.json,
and `plan.check_model_dir`, `run()`'s first check), and says what happened in
one line, in the class the exit-code table gives it:

- the storage did not answer (a host that does not resolve, a timeout, an
  outage: `UnavailableError`, `DeadlineExceededError`, `FailedPreconditionError`,
  which the GCS filesystem raises for a failed HTTP transfer, `AbortedError`)
  -> `StorageUnavailable`, exit 138: the same command works once it answers,
  so a platform should retry it;
- the storage answered no (`PermissionDeniedError`, `UnauthenticatedError`:
  no credentials, or an account without access; `InvalidArgumentError`,
  `UnimplementedError`: a bucket name or a scheme that cannot be) ->
  `ConfigError`, exit 2: a mistake in the request (or in the credentials it
  runs with); no restart grants access, and nothing was written.

A local path is not probed: the operating system answers for it at once,
and `plan.check_model_dir` checks it in its own terms.
"""

from __future__ import annotations

import tensorflow as tf

from tfloop.engine.errors import ConfigError, StorageUnavailable, one_line

#: What a storage that does not answer raises: a restart can fix it.
UNREACHABLE = (tf.errors.UnavailableError, tf.errors.DeadlineExceededError,
               tf.errors.FailedPreconditionError, tf.errors.AbortedError)
#: What a storage that answers "no" raises: a restart cannot fix it.
REFUSED = (tf.errors.PermissionDeniedError, tf.errors.UnauthenticatedError,
           tf.errors.InvalidArgumentError, tf.errors.UnimplementedError)


def is_url(model_dir: str) -> bool:
    return "://" in model_dir


def check_reachable(model_dir: str) -> None:
    """One metadata read of `model_dir` (a URL; a local path returns at once).

    Raises:
      StorageUnavailable: the storage did not answer (exit 138).
      ConfigError: it refused (exit 2).
    """
    if not is_url(model_dir):
        return
    try:
        tf.io.gfile.exists(model_dir)
    except UNREACHABLE as error:
        raise StorageUnavailable(
            f"--model_dir={model_dir} cannot be reached ({_reason(error)}); nothing was "
            "written: the same command works once the storage answers (check the network, "
            "or the GCS_* timeouts in docs/clusters.md)") from None
    except REFUSED as error:
        raise ConfigError(
            f"--model_dir={model_dir} refused access ({_reason(error)}); give the job's "
            "credentials (GOOGLE_APPLICATION_CREDENTIALS, the VM's or pod's service account) "
            "access to it, or name another --model_dir") from None


def _reason(error: tf.errors.OpError) -> str:
    """TensorFlow's message without its boilerplate: `Could not resolve host:
    www.googleapis.com`, not the HTTP library's preamble."""
    text = one_line(error.message or str(error), 200)
    for marker in ("error details: ", "Error executing an HTTP request: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    return f"{type(error).__name__}: {text}"
