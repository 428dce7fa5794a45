"""Whether `--model_dir`'s storage answers: the first touch, translated once.

A `--model_dir` URL (`gs://bucket/run`) lives behind a network. TensorFlow's
filesystems report a storage they cannot reach as a `tf.errors` exception
from whatever file call came first (TF 2.21's built-in GCS filesystem, with
no network: `FailedPreconditionError: Error executing an HTTP request: libcurl
code 6 meaning 'Could not resolve hostname' ... when reading metadata of
gs://.../run.json`), which reached the user as a traceback. `check_reachable`
is that first call, made on purpose where the engine first touches
`model_dir` (`run_identity.load`, which `bin/train` calls to read run.json
and `make_plan` once for the run, and `refusals.check_model_dir`, `run()`'s first
check), and says what happened in one line, in the class the exit-code
table gives it:

- the storage did not answer (a host that does not resolve, a timeout, an
  outage: `UnavailableError`, `DeadlineExceededError`, `FailedPreconditionError`,
  which the GCS filesystem raises for a failed HTTP transfer, `AbortedError`)
  -> `StorageUnavailable`, exit 138: the same command works once it answers,
  so a platform should retry it;
- the storage answered no (`PermissionDeniedError`, `UnauthenticatedError`:
  no credentials, or an account without access; `InvalidArgumentError`: a
  bucket name that cannot be; `UnimplementedError`: a scheme no filesystem of
  this TensorFlow serves, such as s3:// without tensorflow-io) -> `ConfigError`,
  exit 2: a mistake in the request (or in the credentials it runs with, named
  by the scheme's own terms); no restart grants access, and nothing was
  written.

The same check serves every path input that may be a URL (`--init_from`,
`--summaries_dir`, ...: `flag` names it).

A local path is not probed: the operating system answers for it at once,
and `refusals.check_model_dir` checks it in its own terms.
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


def check_reachable(path: str, flag: str = "--model_dir") -> None:
    """One metadata read of `path` (a URL; a local path returns at once),
    given as `flag` (`--model_dir`, `--init_from`, `--summaries_dir`, ...).

    Raises:
      StorageUnavailable: the storage did not answer (exit 138).
      ConfigError: it refused, or no filesystem serves its scheme (exit 2).
    """
    if not is_url(path):
        return
    try:
        tf.io.gfile.exists(path)
    except UNREACHABLE as error:
        raise StorageUnavailable(
            f"{flag}={path} cannot be reached ({_reason(error)}); nothing was "
            "written: the same command works once the storage answers (check the network, "
            "or the GCS_* timeouts in docs/clusters.md)") from None
    except tf.errors.UnimplementedError as error:
        scheme = path.split("://", 1)[0]
        raise ConfigError(
            f"{flag}={path}: this TensorFlow has no filesystem for {scheme}:// "
            f"({_reason(error)}); install the package that registers it "
            f"({_PROVIDERS.get(scheme, 'its TensorFlow filesystem plugin')}), or use a local "
            "path or gs://") from None
    except REFUSED as error:
        raise ConfigError(
            f"{flag}={path} refused access ({_reason(error)}); "
            f"{_credentials(path)}, or name another {flag}") from None


#: Who serves the schemes TensorFlow 2.21 does not have built in (it has gs:// and ram://).
_PROVIDERS = {"s3": "tensorflow-io, import tensorflow_io before the run",
              "hdfs": "tensorflow-io, import tensorflow_io before the run; and a Hadoop client",
              "az": "tensorflow-io, import tensorflow_io before the run"}


def _credentials(path: str) -> str:
    """What grants access to `path`'s storage, by scheme: Google's advice for
    gs:// only (an s3:// bucket is not opened by a service account)."""
    scheme = path.split("://", 1)[0]
    if scheme == "gs":
        return ("give the job's credentials (GOOGLE_APPLICATION_CREDENTIALS, the VM's or pod's "
                "service account) access to it")
    if scheme == "s3":
        return ("give the job's AWS credentials (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
                "or the instance's or pod's role) access to it")
    if scheme in ("hdfs", "viewfs"):
        return "give the job's Hadoop user (HADOOP_USER_NAME, or its Kerberos ticket) access to it"
    return f"give the job's credentials for {scheme}:// access to it"


def _reason(error: tf.errors.OpError) -> str:
    """TensorFlow's message without its boilerplate: `Could not resolve host:
    www.googleapis.com`, not the HTTP library's preamble."""
    text = one_line(error.message or str(error), 200)
    for marker in ("error details: ", "Error executing an HTTP request: "):
        if marker in text:
            text = text.split(marker, 1)[1]
            break
    return f"{type(error).__name__}: {text}"
