"""Train GluonCV's SSD object detector in float16 (or bfloat16) with mxfp16: the network of MXNet's AMP
tutorial, on a detection set of handwritten digits.

MXNet's AMP tutorial trains GluonCV's SSD (``ssd_512_resnet50_v1``) on Pascal VOC.  This script trains
the same detector family on data every machine has: scikit-learn's handwritten digits scaled up and
placed at random on a noisy canvas (1 to 3 per image, 10 classes; ``common.digit_detection_set``).
Its default is tiny, a mobilenet0.25 base on 128-pixel images and 200 steps, so that it trains on a
CPU in under a minute; ``--network resnet50_v1 --data-shape 512`` is the tutorial's base and size.
The rest is GluonCV's training script (``scripts/detection/ssd/train_ssd.py``): targets from
``SSDTargetGenerator`` with the anchors of a training-mode forward, ``SSDMultiBoxLoss`` (hard
negative mining 3:1), SGD with momentum, and ``VOC07MApMetric`` after NMS (0.45, top 400).
GluonCV's photometric and geometric augmentation is left out: a flipped digit is another symbol.
The network is cast with ``mxfp16.cast_block`` and trained by ``mxfp16.Trainer`` (dynamic loss
scaling in float16); box decoding and NMS run in float32.

    python examples/ssd_detection.py --dtype float16
    python examples/ssd_detection.py --dtype bfloat16 --network resnet50_v1 --num-epochs 4

It ends with one line: ``ssd_detection: dtype=float16 ... map=...``, the VOC07 mAP at IoU 0.5 on
unseen digits.
"""
import math
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxfp16
from common import (DIGIT_CLASSES, UsageError, check_positive, detection_map, devices,
                    digit_detection_set, make_parser, run)

#: Base network -> its stride-8, stride-16 and stride-32 feature layers (GluonCV's names), which
#: the SSD heads read; two more stride-doubling layers follow (128 px: 16, 8, 4, 2 and 1 cells).
FEATURES = {"mobilenet0.25": ["relu10_fwd", "relu22_fwd", "relu26_fwd"],
            "mobilenet1.0": ["relu10_fwd", "relu22_fwd", "relu26_fwd"],
            "resnet18_v1": ["stage2_activation1", "stage3_activation1", "stage4_activation1"],
            "resnet50_v1": ["stage2_activation3", "stage3_activation5", "stage4_activation2"]}


def build_ssd(network="mobilenet0.25", data_shape=128, classes=DIGIT_CLASSES):
    """An SSD (GluonCV's ``get_ssd``) for square images of ``data_shape`` pixels, not initialized.

    Heads on the base network's stride-8, 16 and 32 features and on extra layers down to 1x1;
    anchor sizes from 1/8 of the image up to the whole image, ratios 1, 2 and 1/2.  No pretrained
    weights (nothing downloads).
    """
    from gluoncv.model_zoo.ssd.ssd import get_ssd

    if network not in FEATURES:
        raise UsageError(f"--network {network}: choose among {', '.join(FEATURES)}")
    if data_shape < 64 or data_shape & (data_shape - 1):
        raise UsageError(f"--data-shape {data_shape}: pass a power of two >= 64, e.g. 128")
    extra = int(math.log2(data_shape // 32))  # stride-doubling layers after the stride-32 features
    num_heads = len(FEATURES[network]) + extra
    sizes = list(np.linspace(data_shape / 8, data_shape, num_heads + 1))
    return get_ssd(network, data_shape, features=FEATURES[network], filters=[128] * extra,
                   sizes=sizes, ratios=[[1, 2, 0.5]] * num_heads,
                   steps=[8 * 2 ** level for level in range(num_heads)], classes=classes,
                   dataset="", pretrained_base=False)


def ssd_targets(net, labels, data_shape):
    """GluonCV's SSD training targets of ``labels``: ``(cls_targets, box_targets)`` NDArrays, from
    the anchors of a training-mode forward, as ``SSDDefaultTrainTransform`` computes them."""
    from gluoncv.model_zoo.ssd.target import SSDTargetGenerator

    with autograd.train_mode():
        _, _, anchors = net(mx.nd.zeros((1, 3, data_shape, data_shape)))
    generator = SSDTargetGenerator(iou_thresh=0.5, stds=(0.1, 0.1, 0.2, 0.2),
                                   negative_mining_ratio=-1)
    cls_targets, box_targets, _ = generator(anchors, None, mx.nd.array(labels[:, :, :4]),
                                            mx.nd.array(labels[:, :, 4:5]))
    return cls_targets, box_targets


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=2, batch_size=16, lr=0.02)
    add = parser.add_argument
    add("--network", default="mobilenet0.25", choices=tuple(FEATURES),
        help="SSD base network (default: mobilenet0.25)")
    add("--data-shape", type=int, default=128,
        help="image side in pixels, a power of two >= 64 (default: 128)")
    add("--num-train", type=int, default=1600, help="training images (default: 1600)")
    add("--num-val", type=int, default=100, help="validation images (default: 100)")
    add("--momentum", type=float, default=0.9, help="SGD momentum (default: 0.9)")
    add("--wd", type=float, default=5e-4, help="weight decay (default: 0.0005)")
    return parser


def train_one_epoch(net, trainer, loss_fn, train_data, ctx):
    """One pass over ``train_data`` as GluonCV's train_ssd.py: the loss is normalized over the
    positive anchors already, so the step divides by 1.  Returns the mean class and box losses."""
    losses_per_batch = []
    for batch in train_data:
        data, cls_targets, box_targets = (gluon.utils.split_and_load(part, ctx) for part in batch)
        with autograd.record():
            cls_preds, box_preds = zip(*(net(x)[:2] for x in data))
            sum_loss, cls_loss, box_loss = loss_fn(cls_preds, box_preds, cls_targets, box_targets)
        trainer.backward(sum_loss)
        trainer.step(1)
        losses_per_batch.append([np.mean([loss.mean().asscalar() for loss in losses])
                                 for losses in (cls_loss, box_loss)])
    return np.mean(losses_per_batch, axis=0)


def main(argv=None):
    import gluoncv

    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "num_train", "num_val")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)  # the DataLoader shuffles with numpy
    net = build_ssd(args.network, args.data_shape)
    net.set_nms(nms_thresh=0.45, nms_topk=400)
    net.initialize()
    images, labels = digit_detection_set(args.num_train, args.data_shape, seed=args.seed)
    val_images, val_labels = digit_detection_set(args.num_val, args.data_shape,
                                                 seed=args.seed + 1, split="test")
    train_data = gluon.data.DataLoader(
        gluon.data.ArrayDataset(mx.nd.array(images), *ssd_targets(net, labels, args.data_shape)),
        batch_size=args.batch_size, shuffle=True, last_batch="rollover")
    net.collect_params().reset_ctx(ctx)
    net = mxfp16.cast_block(net, args.dtype)  # box decoding and NMS stay float32
    trainer = mxfp16.Trainer(net.collect_params(), "sgd",
                             {"learning_rate": args.lr, "momentum": args.momentum, "wd": args.wd},
                             dtype=args.dtype)
    loss_fn = gluoncv.loss.SSDMultiBoxLoss()

    start = time.time()
    for epoch in range(args.num_epochs):
        # as GluonCV's script: hybridize anew in each mode (static_shape races on several devices)
        net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
        cls_loss, box_loss = train_one_epoch(net, trainer, loss_fn, train_data, ctx)
        net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
        val_map = detection_map(net, val_images, val_labels, ctx=ctx[0])
        print(f"epoch {epoch}: train loss class {cls_loss:.3f} box {box_loss:.3f}, "
              f"val mAP {val_map:.3f}, loss scale {trainer.loss_scale:g}")
    print(f"ssd_detection: dtype={args.dtype} network={args.network} "
          f"data_shape={args.data_shape} epochs={args.num_epochs} cls_loss={cls_loss:.3f} "
          f"box_loss={box_loss:.3f} map={val_map:.3f} loss_scale={trainer.loss_scale:g} "
          f"skipped={trainer.num_skipped} time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
