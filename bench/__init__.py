"""The two benchmarks, and what they share.

    timing        interleaved, rotated, best-of/median timing; garbage collected
                  outside the clock; the float32 matmul rate; the machine in a line
    report        tables, CSV, JSON and PNG plots of both benchmarks
    collectives   bin/bench_collectives: all-reduce sizes, plug-in overhead, packing
    allreduce     the all-reduce loops it times, their inputs, the check of their sums
    training      bin/bench_train: the engine vs Model.fit vs a hand-written loop
    sweep         bin/bench_train --device_counts: one process per device count
    variants      the names bin/bench_train's --variants takes (no TensorFlow)

Tools, not libraries: they import `engine`, `collectives`, `models` and
`inputs`, and none of those imports them.
"""
