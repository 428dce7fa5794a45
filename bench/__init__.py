"""The two benchmarks, and what they share.

    timing        interleaved, rotated, best-of/median timing; garbage collected
                  outside the clock; the float32 matmul rate; the machine in a line
    report        tables, CSV, JSON and PNG plots of both benchmarks
    collectives   bin/bench_collectives: all-reduce sizes, plug-in overhead, packing
    allreduce     the all-reduce loops it times, their inputs, the check of their sums
    training      bin/bench_train: the engine vs Model.fit vs a hand-written loop
    sweep         bin/bench_train --device_counts: one process per device count
    variants      the names bin/bench_train's --variants takes (no TensorFlow)
    sizes         "4K"-style byte sizes (no TensorFlow)

bin/predict_scaling, the step's speed on N devices predicted (no TensorFlow
until a model is built):
    links         link presets (bandwidth, per-step latency) with their sources
    cost_model    each all-reduce's alpha-beta cost over the links it uses
    cost_fit      alpha-beta fitted from a bin/bench_collectives sweep
    scaling       the step model: compute + the step's all-reduces, per device count
    scaling_report, predict     its table, JSON and plot; the binary's logic
    scaling_check, published    --against=measured (this machine) and =published

Tools, not libraries: they import `engine`, `collectives`, `models` and
`inputs`, and none of those imports them.
"""
