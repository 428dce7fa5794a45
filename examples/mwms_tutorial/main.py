"""TensorFlow's tutorial "Multi-worker training with Keras": its main.py,
trained by tfloop on every worker of a TF_CONFIG cluster:

    cd examples/mwms_tutorial   # with an mnist.npz here (see mnist_setup.py)
    ../../bin/launch --num_workers=2 -- python main.py

The tutorial's code as written, with two lines changed (each marked `# tfloop`;
tests/examples/originals/mwms_tutorial_main.py is the tutorial's, and the
test counts the `diff`): `import tfloop`, and `multi_worker_model.fit(...)`
becomes `tfloop.fit(multi_worker_model, ...)` with a `model_dir` every worker
names alike (the run's checkpoints; run again, it resumes). `fit` adopts the
script's own `MultiWorkerMirroredStrategy` (the cluster it formed) and trains
the script's `multi_worker_model` in place. Its `steps_per_epoch` is read from
TUTORIAL_STEPS (70, the tutorial's, when unset: the test sets 2, to stay
cheap) and its `model_dir` from TUTORIAL_MODEL_DIR ("runs/mwms_tutorial" when
unset).
"""

import os
import json

import tensorflow as tf
import mnist_setup
import tfloop  # tfloop

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model()


tfloop.fit(multi_worker_model, multi_worker_dataset, epochs=3, steps_per_epoch=int(os.environ.get("TUTORIAL_STEPS", 70)), config=tfloop.RunConfig(model_dir=os.environ.get("TUTORIAL_MODEL_DIR", "runs/mwms_tutorial")))  # noqa: E501  # tfloop
