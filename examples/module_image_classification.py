"""Train an image classifier in float16 (or bfloat16) with the Symbol/Module API and mxfp16: the
guide's Module recipe as a complete script.

The data is scikit-learn's handwritten digits (8x8 grey images, 10 classes, shipped with
scikit-learn: no download), or random images of any shape with ``--data synthetic`` (a speed test).
The graph is any model-zoo network with a SoftmaxOutput head, cast with ``mxfp16.cast_symbol``; the
Module is a loss-scaled ``BucketingModule`` (one bucket per loss scale) stepped by
``mxfp16.module_step``, which skips the update when a gradient overflowed.

    python examples/module_image_classification.py --dtype float16
    python examples/module_image_classification.py --dtype float16 --gpus 0,1 --network resnet50_v1 \\
        --data synthetic --image-shape 3,224,224 --batch-size 256

It ends with one line: ``module_image_classification: dtype=float16 ... val_acc=...``.
"""
import time

import mxnet as mx
import numpy as np
from sklearn.datasets import load_digits

import mxfp16
from common import UsageError, check_positive, devices, make_parser, run
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
    """Train and validation ``NDArrayIter``s and the number of classes."""
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
    return (mx.io.NDArrayIter(images[train], labels[train], args.batch_size, shuffle=True,
                              last_batch_handle="discard", label_name="softmax_label"),
            mx.io.NDArrayIter(images[val], labels[val], args.batch_size,
                              label_name="softmax_label"),
            num_classes)


def build_module(network, num_classes, dtype, scaler, ctx, data_shape, batch_size):
    """A bound, initialized, loss-scaled Module of ``network`` cast to ``dtype``."""
    try:
        net = get_network(network, num_classes=num_classes)
    except ValueError as error:
        raise UsageError(f"--network {network}: {error}") from None
    sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    sym = mxfp16.cast_symbol(sym, dtype)  # Cast after data, float32 BN params, Cast before softmax
    mod = mxfp16.make_scaled_module(sym, scaler, context=ctx)
    mod.bind(data_shapes=[("data", (batch_size,) + data_shape)],
             label_shapes=[("softmax_label", (batch_size,))])
    mod.init_params(mx.init.Xavier(magnitude=2))
    return mod


def train_one_epoch(mod, scaler, optimizer, train_iter, batch_size):
    """One pass over the training data; returns the mean cross-entropy of the steps taken."""
    train_iter.reset()
    metric = mx.metric.CrossEntropy()
    for batch in train_iter:
        if mxfp16.module_step(mod, batch, scaler, optimizer, batch_size):  # False: skipped
            mod.update_metric(metric, batch.label)
    return metric.get()[1]


def evaluate(mod, scaler, val_iter):
    """Accuracy over the validation data.  Each batch names its bucket, the current loss scale, as
    module_step does (``mod.score`` would ask the Module for a bucket of key None)."""
    val_iter.reset()
    metric = mx.metric.Accuracy()
    for batch in val_iter:
        batch.bucket_key = scaler.loss_scale
        mod.forward(batch, is_train=False)
        mod.update_metric(metric, batch.label)
    return metric.get()[1]


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "num_classes", "num_examples")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)  # NDArrayIter shuffles with numpy
    train_iter, val_iter, num_classes = load_data(args)
    scaler = mxfp16.make_loss_scaler(None, args.dtype)  # dynamic for float16, off otherwise
    mod = build_module(args.network, num_classes, args.dtype, scaler, ctx,
                       train_iter.provide_data[0].shape[1:], args.batch_size)
    optimizer = mxfp16.make_optimizer("sgd", args.dtype, batch_size=args.batch_size,
                                      learning_rate=args.lr, momentum=0.9, wd=args.wd)
    mxfp16.init_optimizer(mod, optimizer)

    start = time.time()
    for epoch in range(args.num_epochs):
        train_loss = train_one_epoch(mod, scaler, optimizer, train_iter, args.batch_size)
        val_acc = evaluate(mod, scaler, val_iter)
        print(f"epoch {epoch}: train loss {train_loss:.3f}, val accuracy {val_acc:.3f}, "
              f"loss scale {scaler.loss_scale:g}")
    print(f"module_image_classification: dtype={args.dtype} network={args.network} "
          f"epochs={args.num_epochs} train_loss={train_loss:.3f} val_acc={val_acc:.3f} "
          f"loss_scale={scaler.loss_scale:g} skipped={scaler.num_skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
