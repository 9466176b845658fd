"""Train a ResNet in float16 (or bfloat16) with MXNet's NumPy interface and mxfp16, in the style of
"Dive into Deep Learning": ``from mxnet import np, npx; npx.set_np()``, residual blocks whose
``hybrid_forward`` calls ``F.npx.relu``, ``mx.np`` arrays in and out.

The data is scikit-learn's handwritten digits (8x8 grey images, 10 classes, shipped with
scikit-learn: no download).  After training, the float32 checkpoint the cast network writes is
loaded into a fresh float32 ResNet, which is evaluated too.

    python examples/numpy_interface.py --dtype bfloat16
    python examples/numpy_interface.py --dtype float16 --gpus 0

It ends with one line: ``numpy_interface: dtype=float16 ... val_acc=... reloaded_acc=...``.
"""
import os
import tempfile
import time

import mxnet as mx
import numpy as onp
from mxnet import autograd, gluon, np, npx
from mxnet.gluon import nn
from sklearn.datasets import load_digits

import mxfp16
from common import check_positive, devices, fit, make_parser, run


class Residual(nn.HybridBlock):
    """d2l's residual block: two 3x3 convolutions with BatchNorm, an optional 1x1 shortcut."""

    def __init__(self, channels, use_1x1conv=False, strides=1, **kwargs):
        super().__init__(**kwargs)
        self.conv1 = nn.Conv2D(channels, kernel_size=3, padding=1, strides=strides)
        self.conv2 = nn.Conv2D(channels, kernel_size=3, padding=1)
        self.conv3 = nn.Conv2D(channels, kernel_size=1, strides=strides) if use_1x1conv else None
        self.bn1, self.bn2 = nn.BatchNorm(), nn.BatchNorm()

    def hybrid_forward(self, F, X):
        Y = F.npx.relu(self.bn1(self.conv1(X)))
        Y = self.bn2(self.conv2(Y))
        if self.conv3:
            X = self.conv3(X)
        return F.npx.relu(Y + X)


def resnet(width=16, num_classes=10):
    """A small ResNet of d2l's residual blocks, for 8x8 images."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(width, kernel_size=3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            Residual(width), Residual(width),
            Residual(2 * width, use_1x1conv=True, strides=2), Residual(2 * width),
            nn.GlobalAvgPool2D(), nn.Dense(num_classes))
    return net


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=4, batch_size=64, lr=0.05)
    parser.add_argument("--width", type=int, default=16,
                        help="channels of the first residual blocks (default: 16)")
    return parser


def load_data(batch_size, seed):
    """Train and validation ``DataLoader``s of the digits (``mx.np`` batches in numpy mode)."""
    digits = load_digits()
    images = (digits.images / 16.0).astype(onp.float32)[:, None]  # (N, 1, 8, 8) in [0, 1]
    labels = digits.target.astype(onp.float32)
    order = onp.random.RandomState(seed).permutation(len(images))
    split = int(len(images) * 0.8)
    train, val = order[:split], order[split:]
    loader = gluon.data.DataLoader
    return (loader(gluon.data.ArrayDataset(images[train], labels[train]), batch_size,
                   shuffle=True, last_batch="discard"),
            loader(gluon.data.ArrayDataset(images[val], labels[val]), batch_size))


def train_one_epoch(net, trainer, loss_fn, train_data, ctx):
    """One pass over the training data; returns the mean loss of the steps taken."""
    total, steps = 0.0, 0
    for data, label in train_data:
        datas = gluon.utils.split_and_load(data, ctx)
        labels = gluon.utils.split_and_load(label, ctx)
        with autograd.record():
            losses = [loss_fn(net(x), y) for x, y in zip(datas, labels)]
        trainer.backward(losses)  # scaled by the loss scale
        if trainer.step(data.shape[0]):  # False when the step overflowed and was skipped
            total += sum(float(loss.mean()) for loss in losses) / len(losses)
            steps += 1
    return total / max(steps, 1)


def evaluate(net, val_data, ctx):
    """Accuracy over the validation data."""
    correct, count = 0, 0
    for data, label in val_data:
        for x, y in zip(gluon.utils.split_and_load(data, ctx, even_split=False),
                        gluon.utils.split_and_load(label, ctx, even_split=False)):
            correct += int((net(x).argmax(axis=1) == y.astype("int64")).sum())
            count += y.shape[0]
    return correct / count


def reloaded_accuracy(net, args, val_data, ctx):
    """The accuracy of a fresh float32 ResNet that loads the cast network's checkpoint."""
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "resnet.params")
        net.save_parameters(path)  # float32 master weights, the float32 network's names
        fresh = resnet(args.width)
        fresh.load_parameters(path, ctx=ctx)  # no option
    return evaluate(fresh, val_data, ctx)


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "width")
    ctx = devices(args.gpus, args.cpus)
    npx.set_np()  # MXNet's NumPy interface, process-wide
    try:
        return train(args, ctx)
    finally:
        npx.reset_np()  # the tests run every example in one process


def train(args, ctx):
    mx.random.seed(args.seed)
    onp.random.seed(args.seed)  # the DataLoader shuffles with numpy
    train_data, val_data = load_data(args.batch_size, args.seed)
    net = resnet(args.width)
    net.initialize(mx.init.Xavier(magnitude=2), ctx=ctx)
    net(np.zeros((1, 1, 8, 8), ctx=ctx[0]))  # shapes known: float32 draws, then rounded
    net = mxfp16.cast_block(net, args.dtype)  # BatchNorm stays float32, outputs are float32
    net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd",
                             {"learning_rate": args.lr, "momentum": 0.9, "wd": 1e-4},
                             dtype=args.dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    start = time.time()
    train_loss, val_acc = fit(train_one_epoch, evaluate, args.num_epochs, net, trainer, loss_fn,
                              train_data, val_data, ctx)
    reloaded = reloaded_accuracy(net, args, val_data, ctx)
    print(f"numpy_interface: dtype={args.dtype} epochs={args.num_epochs} "
          f"train_loss={train_loss:.3f} val_acc={val_acc:.3f} reloaded_acc={reloaded:.3f} "
          f"loss_scale={trainer.loss_scale:g} skipped={trainer.num_skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
