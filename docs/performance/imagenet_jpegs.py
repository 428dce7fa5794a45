"""Writes a small ImageNet-like dataset in the ImageNet TFRecord layout (docs/data.md).

    .venv/bin/python docs/performance/imagenet_jpegs.py OUT

OUT/tree: 4 class folders of 80 JPEGs each, 500x375 and 375x500 (ILSVRC's
typical sizes), smooth colour fields plus noise at quality 90 (about 78 KB
each); OUT/records: that tree converted by `bin/convert_to_tfrecord
--format=imagenet`'s code (8 train shards, a fifth held out as validation).
Then time the train preprocessing at 224 with the input benchmark::

    taskset -c 0 bin/bench_train --dataset=imagenet --data_dir=OUT/records --model=cnn \\
        --image_size=224 --devices=cpu:0 --variants=input --steps=10 --repetitions=3 \\
        --global_batch_size=64 --noplot
"""

import os
import sys

import numpy as np
import tensorflow as tf

from tfloop.inputs import imagenet_convert


def main(out: str) -> None:
    tree, rng = os.path.join(out, "tree"), np.random.default_rng(0)
    for label in range(4):
        folder = os.path.join(tree, f"n0{label}")
        os.makedirs(folder, exist_ok=True)
        for index in range(80):
            height, width = (375, 500) if index % 2 else (500, 375)
            field = tf.image.resize(rng.uniform(0, 255, (height // 25, width // 25, 3)),
                                    (height, width)).numpy()
            image = np.clip(field + rng.normal(0, 12, field.shape), 0, 255).astype(np.uint8)
            tf.io.write_file(os.path.join(folder, f"n0{label}_{index}.JPEG"),
                             tf.io.encode_jpeg(image, quality=90))
    print(imagenet_convert.write(tree, os.path.join(out, "records"), num_shards=8,
                                 eval_fraction=0.2))


if __name__ == "__main__":
    main(sys.argv[1])
