"""The names of the environment variables `bin/launch` sets for its tasks
and the engine reads: one place both import, so the engine needs none of
the launcher to read them.

Standard library only (nothing at all): `engine.runtime.hang` imports it.
"""

#: Where each task writes its hang dumps (`engine.runtime.hang`): the
#: launcher's diagnostics folder, so one place gathers every task's.
DIAGNOSTICS_ENV = "TFLOOP_DIAGNOSTICS_DIR"
