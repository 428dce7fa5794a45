"""What `bin/bench_train` can time, by name.

Its own module, free of TensorFlow, because the binary's `--variants` flag
names them before anything heavy is imported; `bench.training` times them.
"""

#: In bin/bench_train's default order.
VARIANTS = ("engine", "engine+features", "fit", "fit_tuned", "hand_loop")
