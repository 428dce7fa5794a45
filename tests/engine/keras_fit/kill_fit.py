"""A `fit` of 3 epochs of 4 steps that SIGKILLs itself as epoch KILL_AT begins
(after the epoch before it ended and was logged), for test_fit_kill.py.

    python kill_fit.py MODEL_DIR CSV KILL_AT CHECKPOINT_INTERVAL

KILL_AT -1: no kill. CHECKPOINT_INTERVAL 0: fit's default. Prints the run's
start step and History as one JSON line at the end.
"""

import json
import os
import signal
import sys

import keras

from tfloop.engine import RunConfig, fit
from test_parity_basics import dataset as parity_dataset, dense  # this folder: the script's


def dataset():
    return parity_dataset(n=64, batch=16)


class KillAt(keras.callbacks.Callback):
    def __init__(self, epoch):
        super().__init__()
        self.at = epoch

    def on_epoch_begin(self, epoch, logs=None):
        if epoch == self.at:
            os.kill(os.getpid(), signal.SIGKILL)


def config(model_dir, interval=0):
    extra = {"checkpoint_interval": interval} if interval else {}
    return RunConfig(strategy="one_device", devices="cpu:0", model_dir=model_dir, seed=3,
                     steps_per_loop=2, export=False, **extra)  # the export is not under test


if __name__ == "__main__":
    model_dir, log, kill_at, interval = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    history = fit(dense, dataset(), epochs=3, verbose=0, config=config(model_dir, interval),
                  callbacks=[keras.callbacks.CSVLogger(log), KillAt(kill_at)])
    print(json.dumps({"start_step": history.run_result["start_step"],
                      "history": history.history, "epoch": history.epoch}))
