"""A local `TF_CONFIG` cluster launcher, and the one model of a `TF_CONFIG` task.

    tf_config   Role (who a process of a cluster is), parse / current_role /
                resolve / adopt / check_port_free (the engine reads TF_CONFIG,
                or a platform's variables), cluster_spec / tf_config_for (the
                launcher writes it), TFConfigError
    platforms   the cluster where no TF_CONFIG is written (JobSet / Indexed
                Job, Vertex AI's CLUSTER_SPEC), Vertex's AIP_* directories
    launcher    Launcher, LaunchConfig, LaunchError: bin/launch's supervisor
    exit_codes  the exit-code contract: which statuses a restart can fix
    threads     each process's share of the cores (TF_NUM_INTRAOP_THREADS),
                which the launcher deals out and the engine reads
    environment the names of the other variables the launcher sets and the
                engine reads (TFLOOP_DIAGNOSTICS_DIR)

Standard library only, so `bin/launch` starts at once and the engine can read
its role before TensorFlow does.
"""

import importlib as _importlib

#: Each name and its module, resolved on first use: a module of this package
#: (tf_config, environment, ...) loads without the 800-line launcher.
_EXPORTS = {"LaunchConfig": "launcher", "Launcher": "launcher", "LaunchError": "launcher",
            "Role": "tf_config", "TFConfigError": "tf_config"}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    if name in _EXPORTS:
        return getattr(_importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
