"""Seeing inside a run, apart from the loop it watches: the engine's clock
(`clock`: wall time per loop, per-step stamps in sampled loops only, one-time
probes after the untimed first loop), where a loop's time goes (`step_time`),
the step's FLOPs and `mfu` (`step_flops`), the straggler table (`stragglers`),
TensorBoard's restart mark, HParams and graph (`board`), and `watchers`, what a
run adds to see inside itself. Above the loop (its actions and trainer are
what it watches; the trainer calls a `engine.loop.contracts.LoopClock`, whose
do-nothing base lives with the runner contract); below the strategies, which
give each trainer its clock."""
