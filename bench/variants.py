"""What `bin/bench_train` can time, by name.

Its own module, free of TensorFlow, because the binary's `--variants` flag
names them before anything heavy is imported; `bench.training` times them.
"""

#: Every variant, in bin/bench_train's order: `input` is the training pipeline
#: alone and `step` the engine with its input on the devices (`bench.input_pipeline`).
VARIANTS = ("engine", "engine+features", "fit", "fit_tuned", "hand_loop", "input", "step")
#: What `--variants` times when not told: the loops side by side.
DEFAULT_VARIANTS = VARIANTS[:5]
