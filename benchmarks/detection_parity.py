"""Detection accuracy parity: SSD, YOLOv3 and Faster R-CNN trained in float32, float16 (CPU emulation)
and bfloat16 over several seeds, compared by VOC07 mAP on unseen digits.

The question of gluon-cv#1305 (YOLOv3 with ``--amp`` reaching mAP 2.5e-5 against 0.6 without): does a
detector trained in float16 or bfloat16 reach float32's accuracy?  Nothing can be downloaded here, so
the task is a small real detection set: scikit-learn's handwritten digits scaled up and placed at
random on 128-pixel canvases, 1 to 3 per image, with their boxes and classes
(``examples/common.py``'s ``digit_detection_set``: --num-train training images, --num-test test
images of the held-out fifth of the digits).

Detectors (``bench_detection.py``): the SSD of ``examples/ssd_detection.py`` (mobilenet0.25 base,
heads at strides 8 to 128), GluonCV's YOLOv3 on mobilenet0.25 and GluonCV's Faster R-CNN on
ResNet-18 v1b (a light RoI head, 32 RoIs sampled per image), all from scratch.  Each trains with
the targets and losses of GluonCV's training script of its family, SGD (momentum 0.9, weight
decay 5e-4), --steps steps of --batch-size images (the same batches in every dtype for a seed),
YOLOv3 and Faster R-CNN with GluonCV's linear learning-rate warm-up.  Networks are cast by
``mxfp16.cast_block`` and trained by ``mxfp16.Trainer`` (dynamic loss scaling in float16).  The
seed sets the initial weights and the batch order; the data set is the same in every run.

The verdict per detector and dtype: whether its mean mAP lies within float32's seed-to-seed range
(min..max over seeds), or beyond it on the better or the worse side.  A run that cannot train
records its error instead of a number.  Outputs in --out-dir: detection_parity.md (one row per
detector and dtype) and detection_parity.json (every run).

Usage: python benchmarks/detection_parity.py [--seeds 3] [--steps 400] [--quick]
"""
import argparse
import sys
import time
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from bench_common import (add_output_arguments, command_line, config_from, header_lines,
                          machine_info, markdown_table, mean_std, parse_argv, publish,
                          require_positive, write_results)
from bench_detection import (DETECTORS, add_detector_arguments, build, detection_data, drop_rules,
                             loss_function, mean_ap, parse_detector_arguments, prepare,
                             short_error, targets, train_step)

NAME = "detection_parity"
DEFAULT_DETECTORS = ("ssd_mobilenet0.25", "yolo3_mobilenet0.25", "faster_rcnn_resnet18_v1b")


@dataclass(frozen=True)
class Config:
    detectors: tuple
    dtypes: tuple
    seeds: int
    first_seed: int
    steps: int
    batch_size: int
    size: int
    num_train: int
    num_test: int
    ssd_lr: float
    yolo_lr: float
    yolo_warmup: int
    rcnn_lr: float
    rcnn_warmup: int
    without_rules: tuple
    out_dir: str


def run_one(detector, dtype, seed, config, data, batch_targets):
    """Train one detector in one dtype from one seed; return its record."""
    (images, _), (test_images, test_labels) = data
    family = DETECTORS[detector][0]
    lr, warmup = {"ssd": (config.ssd_lr, 0), "yolo3": (config.yolo_lr, config.yolo_warmup),
                  "rcnn": (config.rcnn_lr, config.rcnn_warmup)}[family]
    record = {"detector": detector, "dtype": dtype, "seed": seed}
    start = time.perf_counter()
    try:
        net, trainer = prepare(build(detector, config.size, seed, config.batch_size), dtype,
                               lr, warmup)
        loss_fn = loss_function(detector)
        order = np.random.RandomState(seed).permutation(len(images))
        for step in range(config.steps):
            rows = mx.nd.array(np.take(order, range(step * config.batch_size,
                                                    (step + 1) * config.batch_size), mode="wrap"))
            parts = train_step(detector, net, trainer, images.take(rows),
                               [target.take(rows) for target in batch_targets], loss_fn)
        record.update(map=mean_ap(detector, net, test_images, test_labels),
                      final_losses=[float(part.mean().asscalar()) for part in parts],
                      skipped_steps=trainer.num_skipped, final_loss_scale=trainer.loss_scale)
    except Exception as error:  # a dtype that cannot train is a result, not a crash
        record.update(map=None, error=short_error(error))
    record["seconds"] = time.perf_counter() - start
    return record


def versus_range(mean, reference):
    """``'within'`` float32's seed range (min..max), else ``'better'`` or ``'worse'``."""
    if min(reference) <= mean <= max(reference):
        return "within"
    return "better" if mean > max(reference) else "worse"


def summarize(runs, config):
    rows = []
    for detector in config.detectors:
        reference = [r["map"] for r in runs if r["detector"] == detector
                     and r["dtype"] == "float32" and r["map"] is not None]
        for dtype in config.dtypes:
            done = [r for r in runs if r["detector"] == detector and r["dtype"] == dtype]
            values = [r["map"] for r in done if r["map"] is not None]
            errors = sorted({r["error"] for r in done if "error" in r})
            row = {"detector": detector, "dtype": dtype, "values": values, "errors": errors,
                   "skipped_steps": [r.get("skipped_steps") for r in done]}
            if values:
                row["mean"], row["std"] = mean_std(values)
                row["vs_float32_range"] = versus_range(row["mean"], reference) \
                    if reference else None
            rows.append(row)
    return rows


def markdown(summary):
    header = ["detector", "dtype", "mAP mean", "std", "per seed", "vs float32 seed range",
              "skipped steps"]
    rows = []
    for row in summary:
        if row["values"]:
            rows.append([row["detector"], row["dtype"], f"{row['mean']:.3f}", f"{row['std']:.3f}",
                         " ".join(f"{v:.3f}" for v in row["values"]),
                         row["vs_float32_range"] or "-",
                         " ".join(str(s) for s in row["skipped_steps"] if s is not None)])
        else:
            rows.append([row["detector"], row["dtype"], "not measured", "-", "-", "-", "-"])
    errors = [f"- {row['detector']} {row['dtype']}: `{error}`" for row in summary
              for error in row["errors"]]
    return markdown_table(header, rows) + ("\nErrors:\n\n" + "\n".join(errors) + "\n"
                                            if errors else "")


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add_detector_arguments(add, DEFAULT_DETECTORS)
    add("--seeds", type=int, default=3, help="seeds per detector and dtype (default: 3)")
    add("--first-seed", type=int, default=0,
        help="the seeds are first-seed, first-seed + 1, ... (default: 0)")
    add("--steps", type=int, default=400, help="training steps per run (default: 400)")
    add("--batch-size", type=int, default=16, help="images per step (default: 16)")
    add("--size", type=int, default=128, help="image side in pixels (default: 128)")
    add("--num-train", type=int, default=2000, help="training images (default: 2000)")
    add("--num-test", type=int, default=200, help="test images (default: 200)")
    add("--ssd-lr", type=float, default=0.02, help="SSD learning rate (default: 0.02)")
    add("--yolo-lr", type=float, default=0.01, help="YOLOv3 learning rate (default: 0.01)")
    add("--yolo-warmup", type=int, default=100,
        help="YOLOv3 warm-up steps, as GluonCV's --warmup-epochs (default: 100)")
    add("--rcnn-lr", type=float, default=0.02, help="Faster R-CNN learning rate (default: 0.02)")
    add("--rcnn-warmup", type=int, default=50,
        help="Faster R-CNN warm-up steps, as GluonCV's --lr-warmup (default: 50)")
    return add_output_arguments(parser, "the .md and .json",
                                "one seed, 3 steps, 32 training and 8 test images at 64 px")


def make_config(args):
    detectors, dtypes, without = parse_detector_arguments(args)
    require_positive(args, ("seeds", "steps", "batch_size", "num_train", "num_test"))
    values = dict(vars(args), detectors=detectors, dtypes=dtypes, without_rules=without)
    if args.quick:
        values.update(seeds=1, steps=3, batch_size=4, size=64, num_train=32, num_test=8)
    return config_from(Config, values)


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if failed:
        return failed
    drop_rules(config.without_rules)
    (images, labels), test = detection_data(config.num_train, config.num_test, config.size)
    data = (mx.nd.array(images), labels), test
    runs = []
    for detector in config.detectors:
        batch_targets = targets(detector, build(detector, config.size, 0, config.batch_size),
                                labels, config.size)
        for seed in range(config.first_seed, config.first_seed + config.seeds):
            for dtype in config.dtypes:
                runs.append(run_one(detector, dtype, seed, config, data, batch_targets))
                print(runs[-1], flush=True)
                # the results so far, so that an interrupted run keeps what it measured
                write_results(config.out_dir, NAME, *result_files(runs, config, argv))
    publish(config.out_dir, NAME, *result_files(runs, config, argv))
    return 0


def result_files(runs, config, argv):
    """The Markdown text and the JSON record of ``runs``."""
    summary = summarize(runs, config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "summary": summary, "runs": runs}
    return header_lines(record) + markdown(summary), record


if __name__ == "__main__":
    sys.exit(main())
