import argparse
import os

import numpy as np
import tensorflow as tf


def get_args():
    parser = argparse.ArgumentParser()
    parser.add_argument('--epochs', type=int, default=5)
    parser.add_argument('--steps-per-epoch', type=int, default=50)
    parser.add_argument('--batch-size', type=int, default=32, help='per replica')
    parser.add_argument('--job-dir', default='job')
    return parser.parse_args()


def preprocess(image, label):
    image = tf.cast(tf.expand_dims(image, -1), tf.float32) / 255.0
    return image, tf.cast(label, tf.int64)


def create_dataset(global_batch_size):
    with np.load('mnist.npz') as data:
        images, labels = data['x_train'], data['y_train']
    dataset = tf.data.Dataset.from_tensor_slices((images, labels))
    dataset = dataset.map(preprocess, num_parallel_calls=tf.data.AUTOTUNE)
    dataset = dataset.shuffle(1000, seed=42).repeat().batch(global_batch_size)
    return dataset.prefetch(tf.data.AUTOTUNE)


def create_model():
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(8, 3, activation='relu'),
        tf.keras.layers.MaxPooling2D(),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation='relu'),
        tf.keras.layers.Dense(10)])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.Adam(0.001),
        metrics=['accuracy'])
    return model


def _is_chief(task_type, task_id):
    return task_type is None or task_type == 'chief' or (task_type == 'worker' and task_id == 0)


def _model_path(job_dir, task_type, task_id):
    if _is_chief(task_type, task_id):
        return os.path.join(job_dir, 'model.keras')
    return os.path.join(job_dir, f'workertemp_{task_id}', 'model.keras')


def main():
    args = get_args()
    tf.keras.utils.set_random_seed(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    print('Number of replicas: {}'.format(strategy.num_replicas_in_sync))
    global_batch_size = args.batch_size * strategy.num_replicas_in_sync
    train_dataset = create_dataset(global_batch_size)
    with strategy.scope():
        model = create_model()
    model.fit(train_dataset, epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
    task_type = strategy.cluster_resolver.task_type
    task_id = strategy.cluster_resolver.task_id
    path = _model_path(args.job_dir, task_type, task_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model.save(path)
    print('Saved the model to {}'.format(path))


if __name__ == '__main__':
    main()
