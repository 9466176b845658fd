"""Shared pieces of the detection benchmarks (``detection_parity.py``, ``detection_speed.py``): the
detectors, their GluonCV training targets and losses, one training step, and the mAP.

The data set is the examples' (``examples/common.py``: scikit-learn's digits placed on a canvas) and
the SSD is ``examples/ssd_detection.py``'s, loaded from there so that the example and the
benchmarks train the same network on the same images.  Targets and losses are those GluonCV's
training scripts use (``scripts/detection/ssd/train_ssd.py``, ``yolo/train_yolo3.py``): for SSD,
``SSDTargetGenerator`` over the anchors of a training-mode forward and ``SSDMultiBoxLoss``, the step
divided by 1 (the loss is normalized already); for YOLOv3, ``YOLOV3PrefetchTargetGenerator`` and
the network's own losses given the targets, the step divided by the batch size.  Targets depend
on the anchors and boxes only, not on the weights: they are computed once per network layout.
"""
import importlib.util
import os
import sys

import mxnet as mx
from mxnet import autograd

import mxfp16
from bench_common import parse_choices, parse_dtypes
from mxfp16.casting import rules

EXAMPLES_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                            "examples")

#: Detector -> (family, base network): the networks the benchmarks can train.
DETECTORS = {"ssd_mobilenet0.25": ("ssd", "mobilenet0.25"),
             "ssd_resnet18_v1": ("ssd", "resnet18_v1"),
             "ssd_resnet50_v1": ("ssd", "resnet50_v1"),
             "yolo3_mobilenet0.25": ("yolo3", "mobilenet0.25"),
             "yolo3_mobilenet1.0": ("yolo3", "mobilenet1.0"),
             "yolo3_darknet53": ("yolo3", "darknet53")}

#: The dtypes both detection benchmarks compare.
DTYPES = ("float32", "float16", "bfloat16")


def add_detector_arguments(add, default_detectors):
    """The ``--detectors`` and ``--dtypes`` flags both detection benchmarks take."""
    add("--detectors", default=",".join(default_detectors),
        help=f"comma-separated, among {', '.join(DETECTORS)} "
             f"(default: {','.join(default_detectors)})")
    add("--dtypes", default=",".join(DTYPES), help="comma-separated (default: all three)")
    add("--without-rules", default="",
        help="comma-separated rules of mxfp16/casting/rules.py whose rows are removed before "
             "casting, to measure what they buy, e.g. channel_padding (default: none)")


def parse_detector_arguments(args):
    """``(detectors, dtypes, rules removed)`` of those flags, with ``--size`` checked;
    ``ValueError`` naming the bad value and the choices."""
    detectors = parse_choices(args.detectors, DETECTORS, "--detectors", "detector")
    if args.size < 64 or args.size & (args.size - 1):
        raise ValueError(f"--size {args.size}: pass a power of two >= 64, for example 128")
    without = parse_choices(args.without_rules, rules.RULES, "--without-rules", "rule") \
        if args.without_rules else ()
    return detectors, parse_dtypes(args.dtypes, DTYPES), without


def drop_rules(names):
    """Remove the rows of the rules ``names`` from mxfp16's dtype rules table, in this process."""
    rules.OP_RULES[:] = [row for row in rules.OP_RULES if row.rule not in names]

#: YOLOv3 base -> the channels of its three detection blocks: the zoo's for mobilenet1.0 (512,
#: 256, 128); for mobilenet0.25 half the zoo's (256, 128, 128), which trains the digits as well
#: at a third of the step time on this CPU.
YOLO3_FILTERS = {"mobilenet0.25": [128, 64, 64], "mobilenet1.0": [512, 256, 128]}

#: Non-maximum suppression at inference, as GluonCV's validation sets it.
NMS_THRESH, NMS_TOPK = 0.45, 400


def example_module(name):
    """``examples/<name>.py`` as a module (the examples' folder on ``sys.path`` for ``common``)."""
    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    spec = importlib.util.spec_from_file_location(f"mxfp16_examples_{name}",
                                                  os.path.join(EXAMPLES_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def detection_data(num_train, num_test, size):
    """``(train_images, train_labels), (test_images, test_labels)`` of the digits detection set;
    the test digits are unseen ones (the other split), on other canvases."""
    common = example_module("common")
    return (common.digit_detection_set(num_train, size, seed=0),
            common.digit_detection_set(num_test, size, seed=1, split="test"))


def build(detector, size, seed):
    """The float32 network, initialized from ``seed``, NMS set as GluonCV validates."""
    family, base = DETECTORS[detector]
    mx.random.seed(seed)
    if family == "ssd":
        net = example_module("ssd_detection").build_ssd(base, size)
    else:
        net = build_yolo3(base, example_module("common").DIGIT_CLASSES)
    net.set_nms(nms_thresh=NMS_THRESH, nms_topk=NMS_TOPK)
    net.initialize()
    return net


def build_yolo3(base, classes):
    """GluonCV's YOLOv3 on a MobileNet (``yolo3_mobilenet*_custom``'s stages, anchors and strides)
    with :data:`YOLO3_FILTERS`, or the zoo's ``yolo3_darknet53_custom`` itself; no pretrained
    weights."""
    from gluoncv.model_zoo.mobilenet import get_mobilenet
    from gluoncv.model_zoo.yolo.yolo3 import get_yolov3, yolo3_darknet53_custom

    if base == "darknet53":
        return yolo3_darknet53_custom(classes, pretrained_base=False)

    features = get_mobilenet(multiplier=float(base[len("mobilenet"):]), pretrained=False).features
    stages = [features[:33], features[33:69], features[69:-2]]
    anchors = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
    return get_yolov3(base, stages, YOLO3_FILTERS[base], anchors, [8, 16, 32], classes, "")


def targets(detector, net, labels, size):
    """GluonCV's training targets of ``labels`` (NDArrays, one row per image): SSD's
    ``(cls_targets, box_targets)``; YOLOv3's ``(gt_boxes, objectness, center, scale, weights,
    class)``, the order the network takes them in after the images."""
    family, _ = DETECTORS[detector]
    if family == "ssd":
        return list(example_module("ssd_detection").ssd_targets(net, labels, size))
    from gluoncv.model_zoo.yolo.yolo_target import YOLOV3PrefetchTargetGenerator

    fake = mx.nd.zeros((1, 3, size, size))
    with autograd.train_mode():
        _, anchors, offsets, feat_maps, _, _, _, _ = net(fake)
    gt_boxes = mx.nd.array(labels[:, :, :4])
    generator = YOLOV3PrefetchTargetGenerator(num_class=len(net.classes))
    return [gt_boxes] + list(generator(fake, feat_maps, anchors, offsets, gt_boxes,
                                       mx.nd.array(labels[:, :, 4:5])))


def prepare(net, dtype, lr, warmup_steps=0):
    """Cast ``net`` to ``dtype`` and make its SGD ``mxfp16.Trainer`` (momentum 0.9, weight decay
    5e-4, as GluonCV's scripts; dynamic loss scaling in float16), the learning rate rising
    linearly from 0 over ``warmup_steps`` (GluonCV's YOLOv3 warm-up) and constant after."""
    net.hybridize(static_alloc=True, static_shape=True)
    net = mxfp16.cast_block(net, dtype)
    schedule = mx.lr_scheduler.FactorScheduler(step=2 ** 30, base_lr=lr,
                                               warmup_steps=warmup_steps)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd",
                             {"learning_rate": lr, "momentum": 0.9, "wd": 5e-4,
                              "lr_scheduler": schedule}, dtype=dtype)
    return net, trainer


def train_step(detector, net, trainer, data, batch_targets, loss_fn=None):
    """One training step as GluonCV's script of the family computes it; returns the loss parts
    (NDArrays): SSD's class and box losses, YOLOv3's objectness, center, scale and class losses."""
    family, _ = DETECTORS[detector]
    with autograd.record():
        if family == "ssd":
            cls_pred, box_pred, _ = net(data)
            total, cls_loss, box_loss = loss_fn([cls_pred], [box_pred], *[[target] for target
                                                                        in batch_targets])
            parts = [cls_loss[0], box_loss[0]]
        else:
            parts = list(net(data, *batch_targets))
            total = [parts[0] + parts[1] + parts[2] + parts[3]]
    trainer.backward(total)
    trainer.step(1 if family == "ssd" else data.shape[0])
    return parts


def loss_function(detector):
    """SSD's ``SSDMultiBoxLoss`` (hard negative mining 3:1); None for YOLOv3, whose losses are in
    the network."""
    import gluoncv

    return gluoncv.loss.SSDMultiBoxLoss() if DETECTORS[detector][0] == "ssd" else None


def mean_ap(net, images, labels):
    """VOC07 mAP at IoU 0.5 (GluonCV's ``VOC07MApMetric``), the network hybridized anew for
    inference as GluonCV's validation does."""
    net.hybridize(static_alloc=True, static_shape=True)
    return example_module("common").detection_map(net, images, labels)


def short_error(error):
    """The last line of an exception's message (MXNet's are long), prefixed by its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]
