"""Times `--dataset=imagenet`'s start-up count of a local folder's records (docs/data.md).

    .venv/bin/python docs/performance/imagenet_count.py FILES RECORDS_PER_FILE

Writes FILES train shards of RECORDS_PER_FILE small records into a temporary
folder and times `inputs.imagenet.load` on it: the name checks, the first
record, and the header walk that counts the examples (12 bytes read per
record, plain system calls, 4 threads). Measured on this project's shared
2-core machine: `128 1250` (160,000 records) 0.8 s, 1.1 s, 4.2 s in three
runs (other sessions' load); through `tf.io.gfile` it had taken 15.5 s, which
is why local files are walked with plain system calls
(`inputs.framing.count_records`). A folder of ILSVRC-2012's 1024/128 shards is
not walked (its counts are the references').
"""

import os
import shutil
import sys
import tempfile
import time

import tensorflow as tf

from tfloop.inputs import imagenet


def main(files: int, per_file: int) -> None:
    folder = tempfile.mkdtemp()
    try:
        record = tf.train.Example(features=tf.train.Features(feature={
            imagenet.IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(
                value=[b"\xff\xd8\xff" + b"x" * 1000])),
            imagenet.LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[1])),
        })).SerializeToString()
        for index in range(files):
            name = imagenet.shard_name("train", index, files)
            with tf.io.TFRecordWriter(os.path.join(folder, name)) as writer:
                for _ in range(per_file):
                    writer.write(record)
        start = time.perf_counter()
        splits = imagenet.load(data_dir=folder)
        print(f"{len(splits.train)} records in {files} files: loaded and counted in "
              f"{time.perf_counter() - start:.2f} s")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]))
