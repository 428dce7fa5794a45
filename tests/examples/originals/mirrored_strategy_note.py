import numpy as np
import tensorflow as tf
import keras

x, y = load_data()
dataset = tf.data.Dataset.from_tensor_slices((x / np.float32(255), y)).batch(16)

strategy = tf.distribute.MirroredStrategy()
print("Number of devices: {}".format(strategy.num_replicas_in_sync))

with strategy.scope():
    model = keras.applications.MobileNetV2(weights=None, input_shape=(32, 32, 3), classes=3)
    model.compile(loss="sparse_categorical_crossentropy",
                  optimizer=keras.optimizers.SGD(),
                  metrics=[keras.metrics.sparse_categorical_accuracy])

model.fit(dataset, epochs=2)
model.evaluate(dataset)
