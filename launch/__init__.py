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

from tfloop.launch.launcher import LaunchConfig, Launcher, LaunchError
from tfloop.launch.tf_config import Role, TFConfigError

__all__ = ["LaunchConfig", "LaunchError", "Launcher", "Role", "TFConfigError"]
