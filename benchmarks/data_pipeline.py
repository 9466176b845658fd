"""Throughput of the RecordIO input pipeline: mxfp16.train.data.record_iter against a raw
mx.io.ImageRecordIter with the same settings, for training and for validation.

The benchmark writes --num-images JPEG files (--image-size pixels square, 4 classes of coloured noise)
into a temporary folder, packs them with ``mxfp16.train.prepare.prepare_dataset`` (half for training, half
for validation) and reads each .rec file with both iterators: training with the standard ImageNet
augmentation (random resized crop, mirror, colour jitter), validation with the resize and centre
crop.  The raw iterator gets exactly the arguments ``record_iter`` passes to MXNet, so the difference
is mxfp16's wrapper: the Python file check when the iterator is created, the DataBatch it rebuilds per
batch and, for validation, the padding of the last batch.

Throughput is batch slots delivered per second (batches x batch size) over --epochs epochs after
one untimed epoch, each waiting for the data; the two iterators are measured alternately --repeats
times and the median is reported.  Setup is the time to create the iterator.  Outputs in --out-dir:
data_pipeline.md and data_pipeline.json.

Usage: python benchmarks/data_pipeline.py [--num-images 400] [--batch-size 32] [--quick]
"""
import argparse
import math
import os
import statistics
import sys
import tempfile
import time

import cv2
import mxnet as mx
import numpy as np

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, parse_image_shape, publish,
                          require_positive)
from mxfp16.train.data import base as mxdata
from mxfp16.train.data import recordio
from mxfp16.train.prepare import prepare_dataset

NAME = "data_pipeline"

#: Class colours (BGR) of the generated images; noise on top keeps JPEG decoding realistic.
CLASS_COLOURS = ((200, 40, 40), (40, 200, 40), (40, 40, 200), (40, 200, 200))


def write_images(root, num_images, size, seed=0):
    """``root/<class>/<i>.jpg``: ``num_images`` images spread over the classes."""
    rng = np.random.RandomState(seed)
    for index in range(num_images):
        label = index % len(CLASS_COLOURS)
        folder = os.path.join(root, f"class{label}")
        os.makedirs(folder, exist_ok=True)
        noise = rng.normal(0, 25, (size, size, 3))
        image = np.clip(np.array(CLASS_COLOURS[label]) + noise, 0, 255).astype(np.uint8)
        cv2.imwrite(os.path.join(folder, f"{index:05d}.jpg"), image)
    return root


def raw_iter(path_rec, batch_size, image_shape, train, num_threads):
    """The ImageRecordIter that ``recordio.record_iter`` builds, with its default settings."""
    mean, std = mxdata.IMAGENET_MEAN_RGB, mxdata.IMAGENET_STD_RGB
    common = dict(path_imgrec=path_rec, path_imgidx=recordio.default_index_path(path_rec),
                  data_shape=image_shape, batch_size=batch_size, label_width=1,
                  data_name=mxdata.DATA_NAME, label_name=mxdata.LABEL_NAME, mean_r=mean[0],
                  mean_g=mean[1], mean_b=mean[2], std_r=std[0], std_g=std[1], std_b=std[2],
                  preprocess_threads=num_threads, num_parts=1, part_index=0, seed=0,
                  verbose=False)
    if not train:
        resize = int(math.ceil(max(image_shape[1:]) / mxdata.CROP_RATIO))
        return mx.io.ImageRecordIter(shuffle=False, round_batch=False, resize=resize, **common)
    jitter = mxdata.COLOR_JITTER
    return mx.io.ImageRecordIter(
        shuffle=True, rand_mirror=True, random_resized_crop=True,
        min_random_area=mxdata.MIN_CROP_AREA, max_random_area=1.0,
        min_aspect_ratio=mxdata.CROP_ASPECT_RATIOS[0], max_aspect_ratio=mxdata.CROP_ASPECT_RATIOS[1],
        brightness=jitter, contrast=jitter, saturation=jitter, pca_noise=0.0, seed_aug=0, **common)


def wrapped_iter(path_rec, batch_size, image_shape, train, num_threads):
    return recordio.record_iter(path_rec, batch_size, image_shape, train=train,
                              num_threads=num_threads)


def run_epoch(data_iter):
    """Read one epoch, waiting for every batch; return the number of batch slots read."""
    data_iter.reset()
    slots = 0
    for batch in data_iter:
        batch.data[0].wait_to_read()
        slots += batch.data[0].shape[0]
    return slots


def measure(make_iter, path_rec, config, train):
    """(setup seconds, batch slots per second) of one iterator."""
    start = time.perf_counter()
    data_iter = make_iter(path_rec, config.batch_size, config.image_shape, train, config.num_threads)
    setup = time.perf_counter() - start
    run_epoch(data_iter)
    start = time.perf_counter()
    slots = sum(run_epoch(data_iter) for _ in range(config.epochs))
    return setup, slots / (time.perf_counter() - start)


def compare(path_rec, config, train):
    """Median setup time and throughput of both iterators, measured alternately."""
    samples = {"raw ImageRecordIter": [], "mxfp16 record_iter": []}
    for _ in range(config.repeats):
        samples["raw ImageRecordIter"].append(measure(raw_iter, path_rec, config, train))
        samples["mxfp16 record_iter"].append(measure(wrapped_iter, path_rec, config, train))
    return {name: {"setup_s": statistics.median(s for s, _ in values),
                   "img_per_s": statistics.median(r for _, r in values),
                   "img_per_s_all": [r for _, r in values]} for name, values in samples.items()}


def markdown(results):
    header = ["split", "iterator", "img/s (median)", "relative to raw", "setup s"]
    rows = []
    for split, by_iter in results.items():
        raw = by_iter["raw ImageRecordIter"]["img_per_s"]
        for name, value in by_iter.items():
            rows.append([split, name, f"{value['img_per_s']:.1f}",
                         f"{value['img_per_s'] / raw:.3f}", f"{value['setup_s']:.3f}"])
    return markdown_table(header, rows)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-images", type=int, default=400,
                        help="JPEG files generated, half for training (default: 400)")
    parser.add_argument("--image-size", type=int, default=256,
                        help="side of the generated images in pixels (default: 256)")
    parser.add_argument("--image-shape", default="3,224,224",
                        help="network input (default: 3,224,224)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    parser.add_argument("--num-threads", type=int, default=4,
                        help="decoding threads, record_iter's default (default: 4)")
    parser.add_argument("--epochs", type=int, default=2,
                        help="timed epochs per measurement (default: 2)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="alternating measurements per iterator (default: 3)")
    return add_output_arguments(parser, "the .md and .json",
                                "16 images of 64 pixels, input 3,32,32, batch 4, 1 thread, "
                                "1 epoch, 1 repeat")


def make_config(args):
    if args.quick:
        args.num_images, args.image_size, args.image_shape = 16, 64, "3,32,32"
        args.batch_size, args.num_threads, args.epochs, args.repeats = 4, 1, 1, 1
    require_positive(args, ("num_images", "image_size", "batch_size", "num_threads", "epochs", "repeats"))
    if args.num_images < 8:
        raise ValueError(f"--num-images must be >= 8 (2 per class and split), got {args.num_images}")
    args.image_shape = parse_image_shape(args.image_shape)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    config, failed = parse_config(get_args_parser(), make_config, argv)
    if failed:
        return failed
    with tempfile.TemporaryDirectory(prefix="mxfp16-data-bench-") as work:
        images = write_images(os.path.join(work, "images"), config.num_images, config.image_size)
        prepared = prepare_dataset(images, os.path.join(work, "rec"), train_ratio=0.5)
        results = {"train": compare(prepared.train_rec, config, train=True),
                   "val": compare(prepared.val_rec, config, train=False)}
    settings = {key: value for key, value in vars(config).items() if key != "out_dir"}
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": dict(settings, num_train=prepared.num_train, num_val=prepared.num_val),
              "results": results}
    text = (header_lines(record) + f"{prepared.num_train} train + {prepared.num_val} val JPEGs of "
            f"{config.image_size}x{config.image_size} pixels, input {config.image_shape}, batch "
            f"{config.batch_size}, {config.num_threads} decoding threads\n\n" + markdown(results))
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
