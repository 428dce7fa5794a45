"""The process the engine runs in: devices (logical CPUs, GPUs, threads), the
start-up watchdog of a cluster, logging, and the files it makes and removes
(`files`: never through a symbolic link, modes whatever the umask; on this
lowest floor so that the hang dumps and every room above share it). Imports
nothing of the engine's other rooms, only its base (`engine.errors`,
`engine.config`)."""
