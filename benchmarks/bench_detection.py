"""Shared pieces of the detection benchmarks (``detection_parity.py``, ``detection_speed.py``): the
detectors, their GluonCV training targets and losses, one training step, and the mAP.

The data set is the examples' (``examples/common.py``: scikit-learn's digits placed on a canvas) and
the SSD is ``examples/ssd_detection.py``'s, loaded from there so that the example and the
benchmarks train the same network on the same images.  Targets and losses are those GluonCV's
training scripts use (``scripts/detection/ssd/train_ssd.py``, ``yolo/train_yolo3.py``,
``faster_rcnn/train_faster_rcnn.py``): for SSD, ``SSDTargetGenerator`` over the anchors of a
training-mode forward and ``SSDMultiBoxLoss``, the step divided by 1 (the loss is normalized
already); for YOLOv3, ``YOLOV3PrefetchTargetGenerator`` and the network's own losses given the
targets, the step divided by the batch size; for Faster R-CNN, ``RPNTargetGenerator``'s anchor
targets (as ``FasterRCNNDefaultTrainTransform`` makes them), the network's own RoI sampling and
RCNN targets given the gt boxes and labels, and the four losses of GluonCV's
``ForwardBackwardTask``, the step divided by the batch size.  The RPN, SSD and YOLOv3 targets
depend on the anchors and boxes only, not on the weights: they are computed once per layout.
"""
import importlib.util
import os
import sys

import mxnet as mx
import numpy as np
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
             "yolo3_darknet53": ("yolo3", "darknet53"),
             "faster_rcnn_resnet18_v1b": ("rcnn", "resnet18_v1b")}

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


def build(detector, size, seed, batch_size=1):
    """The float32 network, initialized from ``seed``, NMS set as GluonCV validates; Faster
    R-CNN's training calls take ``batch_size`` images (its inference calls one)."""
    family, base = DETECTORS[detector]
    mx.random.seed(seed)
    classes = example_module("common").DIGIT_CLASSES
    if family == "ssd":
        net = example_module("ssd_detection").build_ssd(base, size)
    elif family == "rcnn":
        net = build_faster_rcnn(size, classes, batch_size)
    else:
        net = build_yolo3(base, classes)
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


#: Faster R-CNN's sampling, scaled down from the zoo's (600-pixel images, 128 RoIs per image and
#: 6000/300 proposals, minutes a step on this CPU) to 128-pixel canvases with 1 to 3 digits.
RCNN_CONFIG = dict(rpn_channel=128, base_size=16, scales=(1, 2, 3), ratios=(0.5, 1, 2),
                   alloc_size=(64, 64), rpn_train_pre_nms=256, rpn_train_post_nms=64,
                   rpn_test_pre_nms=128, rpn_test_post_nms=32, rpn_min_size=4, num_sample=32,
                   pos_iou_thresh=0.5, pos_ratio=0.25, roi_mode="align", roi_size=(7, 7),
                   strides=16, clip=4.42, nms_thresh=0.3, nms_topk=400, post_nms=100)

#: RPNTargetGenerator's anchors per image (the transform's default is 256 of 20000 anchors; a
#: canvas has 8 x 8 x 9).
RPN_SAMPLES = 64


def build_faster_rcnn(size, classes, batch_size):
    """GluonCV's Faster R-CNN (``get_faster_rcnn``) on ResNet-18 v1b, as
    ``faster_rcnn_resnet50_v1b_voc`` builds it on ResNet-50 (features up to ``layer3``, stride
    16) but with a light RoI head (one 3x3 convolution of 128 channels before the zoo's global
    pooling, where the zoo runs ``layer4`` on every RoI) and :data:`RCNN_CONFIG`'s sampling.
    BatchNorm uses batch statistics: there are no pretrained statistics to freeze."""
    from gluoncv.model_zoo.rcnn.faster_rcnn import get_faster_rcnn
    from gluoncv.model_zoo.resnetv1b import resnet18_v1b
    from mxnet.gluon import nn

    base = resnet18_v1b(pretrained=False, dilated=False, use_global_stats=False)
    features, top = nn.HybridSequential(), nn.HybridSequential()
    for layer in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"):
        features.add(getattr(base, layer))
    top.add(nn.Conv2D(128, 3, padding=1, use_bias=False), nn.BatchNorm(), nn.Activation("relu"))
    return get_faster_rcnn(name="resnet18_v1b", dataset="digits", pretrained=False,
                           features=features, top_features=top, classes=classes, short=size,
                           max_size=size, max_num_gt=3, per_device_batch_size=batch_size,
                           **RCNN_CONFIG)


def rpn_targets(net, labels, size):
    """``RPNTargetGenerator``'s ``(cls_targets, box_targets, box_masks)`` for every image, over
    the RPN's anchors on the stride-16 feature map, as ``FasterRCNNDefaultTrainTransform`` makes
    them (its sampling draws from numpy's generator: seeded here, so the targets are the same in
    every run)."""
    from gluoncv.model_zoo.rcnn.rpn.rpn_target import RPNTargetGenerator

    side = size // RCNN_CONFIG["strides"]
    anchors = net.rpn.anchor_generator(mx.nd.zeros((1, 1, side, side)))
    generator = RPNTargetGenerator(num_sample=RPN_SAMPLES, pos_iou_thresh=0.7,
                                   neg_iou_thresh=0.3, pos_ratio=0.5)
    state = np.random.get_state()
    np.random.seed(0)
    rows = []
    for label in labels:
        boxes = mx.nd.array(label[label[:, 4] >= 0, :4])
        rows.append(generator(boxes, anchors.reshape((-1, 4)), size, size))
    np.random.set_state(state)
    return [mx.nd.array(np.stack(parts)) for parts in zip(*rows)]


def rcnn_losses():
    """The four losses of GluonCV's ``train_faster_rcnn.py``: RPN objectness and boxes, RCNN
    classes and boxes."""
    from mxnet import gluon

    return (gluon.loss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=False),
            gluon.loss.HuberLoss(rho=1 / 9.), gluon.loss.SoftmaxCrossEntropyLoss(),
            gluon.loss.HuberLoss(rho=1.))


def rcnn_loss_parts(net, data, batch_targets, losses):
    """``ForwardBackwardTask.forward_backward``'s arithmetic: each loss normalized by its number
    of sampled anchors or RoIs, summed over the batch."""
    gt_box, gt_label, rpn_cls, rpn_box_targets, rpn_masks = batch_targets
    rpn_cls_loss, rpn_box_loss, rcnn_cls_loss, rcnn_box_loss = losses
    (cls_pred, box_pred, _, _, _, rpn_score, rpn_box, _, cls_targets, box_targets,
     box_masks, _) = net(data, gt_box, gt_label)
    rpn_score = rpn_score.squeeze(axis=-1)
    num_rpn = (rpn_cls >= 0).sum()
    num_rcnn = (cls_targets >= 0).sum()
    return [rpn_cls_loss(rpn_score, rpn_cls, rpn_cls >= 0) * rpn_cls.size / num_rpn,
            rpn_box_loss(rpn_box, rpn_box_targets, rpn_masks) * rpn_box.size / num_rpn,
            rcnn_cls_loss(cls_pred, cls_targets, cls_targets.expand_dims(-1) >= 0)
            * cls_targets.size / num_rcnn,
            rcnn_box_loss(box_pred, box_targets, box_masks) * box_pred.size / num_rcnn]


def targets(detector, net, labels, size):
    """GluonCV's training targets of ``labels`` (NDArrays, one row per image): SSD's
    ``(cls_targets, box_targets)``; YOLOv3's ``(gt_boxes, objectness, center, scale, weights,
    class)``, the order the network takes them in after the images; Faster R-CNN's ``(gt_boxes,
    gt_labels, rpn_cls_targets, rpn_box_targets, rpn_box_masks)``."""
    family, _ = DETECTORS[detector]
    if family == "ssd":
        return list(example_module("ssd_detection").ssd_targets(net, labels, size))
    if family == "rcnn":
        return [mx.nd.array(labels[:, :, :4]), mx.nd.array(labels[:, :, 4:5])] \
            + rpn_targets(net, labels, size)
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
    (NDArrays): SSD's class and box losses, YOLOv3's objectness, center, scale and class losses,
    Faster R-CNN's RPN objectness and box and RCNN class and box losses."""
    family, _ = DETECTORS[detector]
    with autograd.record():
        if family == "ssd":
            cls_pred, box_pred, _ = net(data)
            total, cls_loss, box_loss = loss_fn([cls_pred], [box_pred], *[[target] for target
                                                                        in batch_targets])
            parts = [cls_loss[0], box_loss[0]]
        elif family == "rcnn":
            parts = rcnn_loss_parts(net, data, batch_targets, loss_fn)
            total = [sum(part.sum() for part in parts)]
        else:
            parts = list(net(data, *batch_targets))
            total = [parts[0] + parts[1] + parts[2] + parts[3]]
    trainer.backward(total)
    trainer.step(1 if family == "ssd" else data.shape[0])
    return parts


def loss_function(detector):
    """SSD's ``SSDMultiBoxLoss`` (hard negative mining 3:1); Faster R-CNN's four losses
    (:func:`rcnn_losses`); None for YOLOv3, whose losses are in the network."""
    import gluoncv

    family = DETECTORS[detector][0]
    if family == "rcnn":
        return rcnn_losses()
    return gluoncv.loss.SSDMultiBoxLoss() if family == "ssd" else None


def mean_ap(detector, net, images, labels):
    """VOC07 mAP at IoU 0.5 (GluonCV's ``VOC07MApMetric``), the network hybridized anew for
    inference as GluonCV's validation does (Faster R-CNN's inference takes one image a call)."""
    net.hybridize(static_alloc=True, static_shape=True)
    batch_size = 1 if DETECTORS[detector][0] == "rcnn" else 50
    return example_module("common").detection_map(net, images, labels, batch_size=batch_size)


def short_error(error):
    """The last line of an exception's message (MXNet's are long), prefixed by its type."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {lines[-1] if lines else ''}"[:300]
