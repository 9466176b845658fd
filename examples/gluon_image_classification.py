"""Train an image classifier in float16 (or bfloat16) with Gluon and mxfp16: the guide's Gluon recipe
as a complete script.

The data is scikit-learn's handwritten digits (8x8 grey images, 10 classes, shipped with
scikit-learn: no download), or random images of any shape with ``--data synthetic`` (a speed test).
The network is any model-zoo name; the small CIFAR ResNet-20 trains the digits in seconds.

    python examples/gluon_image_classification.py --dtype float16
    python examples/gluon_image_classification.py --dtype float16 --gpus 0,1 --network resnet50_v1 \\
        --data synthetic --image-shape 3,224,224 --batch-size 256

It ends with one line: ``gluon_image_classification: dtype=float16 ... val_acc=...``.
"""
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from sklearn.datasets import load_digits

import mxfp16
from common import UsageError, check_positive, devices, fit, make_parser, run
from mxfp16.models import get_network


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=5, batch_size=64, lr=0.1)
    add = parser.add_argument
    add("--network", default="cifar_resnet20_v1", help="model-zoo name (default: cifar_resnet20_v1)")
    add("--data", default="digits", choices=("digits", "synthetic"),
        help="scikit-learn's digits, or random images for a speed test (default: digits)")
    add("--image-shape", default="3,32,32",
        help="channels,height,width of --data synthetic (default: 3,32,32)")
    add("--num-classes", type=int, default=10, help="classes of --data synthetic (default: 10)")
    add("--num-examples", type=int, default=1024,
        help="images of --data synthetic (default: 1024)")
    add("--wd", type=float, default=1e-4, help="weight decay (default: 0.0001)")
    return parser


def load_data(args):
    """Train and validation ``DataLoader``s and the number of classes."""
    if args.data == "digits":
        digits = load_digits()
        images = (digits.images / 16.0).astype(np.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
        labels, num_classes = digits.target.astype(np.float32), 10
    else:
        try:
            shape = tuple(int(side) for side in args.image_shape.split(","))
        except ValueError:
            shape = ()
        if len(shape) != 3:
            raise UsageError(f"--image-shape {args.image_shape!r}: write channels,height,width, "
                             "e.g. 3,32,32")
        rng = np.random.RandomState(args.seed)
        images = rng.uniform(size=(args.num_examples,) + shape).astype(np.float32)
        labels = rng.randint(0, args.num_classes, args.num_examples).astype(np.float32)
        num_classes = args.num_classes
    split = int(len(images) * 0.8)
    order = np.random.RandomState(args.seed).permutation(len(images))
    train, val = order[:split], order[split:]
    loader = gluon.data.DataLoader
    return (loader(gluon.data.ArrayDataset(images[train], labels[train]), args.batch_size,
                   shuffle=True, last_batch="discard"),
            loader(gluon.data.ArrayDataset(images[val], labels[val]), args.batch_size),
            num_classes)


def train_one_epoch(net, trainer, loss_fn, train_data, ctx):
    """One pass over the training data; returns the mean loss of the steps taken."""
    total, steps = 0.0, 0
    for data, label in train_data:
        datas = gluon.utils.split_and_load(data, ctx)  # float32: the net casts it on the device
        labels = gluon.utils.split_and_load(label, ctx)
        with autograd.record():
            losses = [loss_fn(net(x), y) for x, y in zip(datas, labels)]
        trainer.backward(losses)  # scaled by the loss scale
        if trainer.step(data.shape[0]):  # False when the step overflowed and was skipped
            total += sum(loss.mean().asscalar() for loss in losses) / len(losses)
            steps += 1
    return total / max(steps, 1)


def evaluate(net, val_data, ctx):
    metric = mx.metric.Accuracy()
    for data, label in val_data:
        datas = gluon.utils.split_and_load(data, ctx, even_split=False)
        labels = gluon.utils.split_and_load(label, ctx, even_split=False)
        metric.update(labels, [net(x) for x in datas])
    return metric.get()[1]


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "num_classes", "num_examples")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)  # the DataLoader shuffles with numpy
    train_data, val_data, num_classes = load_data(args)
    try:
        net = get_network(args.network, num_classes=num_classes)
    except ValueError as error:
        raise UsageError(f"--network {args.network}: {error}") from None
    net.initialize(mx.init.Xavier(magnitude=2), ctx=ctx)
    net = mxfp16.cast_block(net, args.dtype)  # BatchNorm stays float32, outputs are float32
    # static_shape on several devices races in MXNet 1.9.1 (BatchNorm statistics; docs/performance.md)
    net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd",
                             {"learning_rate": args.lr, "momentum": 0.9, "wd": args.wd},
                             dtype=args.dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    start = time.time()
    train_loss, val_acc = fit(train_one_epoch, evaluate, args.num_epochs, net, trainer, loss_fn,
                              train_data, val_data, ctx)
    print(f"gluon_image_classification: dtype={args.dtype} network={args.network} "
          f"epochs={args.num_epochs} train_loss={train_loss:.3f} val_acc={val_acc:.3f} "
          f"loss_scale={trainer.loss_scale:g} skipped={trainer.num_skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
