"""TensorFlow's tutorial "Multi-worker training with Keras": its main.py,
trained by tfloop on every worker of a TF_CONFIG cluster:

    cd examples/mwms_tutorial   # with an mnist.npz here (see mnist_setup.py)
    ../../bin/launch --num_workers=2 -- python main.py

The tutorial's code as written, with four lines changed (each marked `# tfloop`),
two more than the tutorial's single-worker cells (single_worker.py) need:

1. `strategy = tf.distribute.MultiWorkerMirroredStrategy()` becomes the
   default strategy: `fit` forms the cluster itself, and a second
   MultiWorkerMirroredStrategy in one process never completes an all-reduce;
2. the dataset becomes a function of the input context that `fit` calls, and
3. the model becomes the function that builds and compiles it (the name of
   the tutorial's function, not its call): made here, either would start
   TensorFlow before `fit` forms the cluster, and TensorFlow refuses a cluster
   then ("RuntimeError: Collective ops must be configured at program startup",
   measured: the tutorial forms its strategy first for this reason);
4. `multi_worker_model.fit(...)` becomes `tfloop.fit(...)`, with the global
   batch (a function's dataset does not tell it) and a `model_dir` every worker
   names alike (the run's checkpoints; run again, it resumes). Its
   `steps_per_epoch` is read from TUTORIAL_STEPS (70, the tutorial's, when
   unset: the test sets 2, to stay cheap), its `model_dir` from
   TUTORIAL_MODEL_DIR ("runs/mwms_tutorial" when unset).
"""

import os
import json

import tensorflow as tf
import mnist_setup
import tfloop

per_worker_batch_size = 64
tf_config = json.loads(os.environ['TF_CONFIG'])
num_workers = len(tf_config['cluster']['worker'])

strategy = tf.distribute.get_strategy()  # tfloop

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = lambda context: mnist_setup.mnist_dataset(global_batch_size)  # noqa: E731  # tfloop

with strategy.scope():
  # Model building/compiling need to be within `strategy.scope()`.
  multi_worker_model = mnist_setup.build_and_compile_cnn_model  # tfloop


tfloop.fit(multi_worker_model, multi_worker_dataset, batch_size=global_batch_size, epochs=3, steps_per_epoch=int(os.environ.get("TUTORIAL_STEPS", 70)), config=tfloop.RunConfig(model_dir=os.environ.get("TUTORIAL_MODEL_DIR", "runs/mwms_tutorial")))  # noqa: E501  # tfloop
