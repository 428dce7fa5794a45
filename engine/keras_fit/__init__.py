"""Keras's front door: a compiled model and its callbacks, trained by the engine.

    fit(model_fn, train_data, *, epochs, steps_per_epoch, validation_data,
        callbacks, config) -> keras.callbacks.History

`fit` (the call), `compiled` (a compiled model as a Task), `callbacks`
(Keras callbacks in the engine's loop), `epochs` (a Keras dataset as fixed
global batches, with exact epochs), `keras_state` (what Keras's `fit` builds
before the first epoch and does after the last), `steps` (a model's own
`train_step` and `test_step`). See docs/keras.md.
"""
