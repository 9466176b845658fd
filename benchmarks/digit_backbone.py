"""Pretrain a GluonCV classification backbone on the digits, to stand in for the ImageNet weights a
detection script loads with ``pretrained_base=True`` (nothing can be downloaded here).

Detection recipes start from a pretrained backbone; from random weights, GluonCV's
``train_ssd.py`` learns the digits detection set (``benchmarks/voc_digits.py``) too slowly for a
float16-versus-float32 comparison in a session's budget.  This script trains the zoo's classifier
(for example ``mobilenet0.25``, its 1000-way output kept so that the file loads where the model
store's would) to name the single digit on canvases of ``examples/common.py``'s digits,
training split only, in float32, and saves its parameters.  ``benchmarks/run_upstream.py
--backbone mobilenet0.25=FILE`` then hands the file to the script; every dtype of a comparison
starts from the same file.

Images: ``--size``-pixel canvases with one digit each (16-32 pixels at 96), normalized with
ImageNet's mean and standard deviation as GluonCV's transforms do.  SGD with momentum 0.9, batch
64, learning rate 0.1 then 0.01 for the last 30 % of the steps.  The last 600 canvases are held
out and the script prints the accuracy on them.  The same arguments give the same file.

Usage: python benchmarks/digit_backbone.py --out FILE [--network mobilenet0.25] [--steps 2000]
       [--size 96] [--quick]
"""
import argparse
import os
import sys

import numpy as np
from voc_digits import digit_detection_set  # a sibling, as bench_common is to the others

IMAGENET_MEAN = np.array([0.485, 0.456, 0.406], np.float32)[:, None, None]
IMAGENET_STD = np.array([0.229, 0.224, 0.225], np.float32)[:, None, None]
HELD_OUT = 600
BATCH_SIZE = 64


def digit_canvases(num_images, size):
    """``num_images`` normalized canvases of one digit each and the digits (float32 arrays)."""
    images, labels = digit_detection_set(num_images, size, seed=5, split="train", max_digits=1)
    return (images - IMAGENET_MEAN) / IMAGENET_STD, labels[:, 0, 4]


def train_backbone(network, steps, size, seed=0, held_out=HELD_OUT):
    """The zoo's ``network`` trained ``steps`` steps on ``9 * held_out`` digit canvases; returns
    (net, accuracy on ``held_out`` more)."""
    import mxnet as mx
    from gluoncv.model_zoo import get_model
    from mxnet import autograd, gluon

    mx.random.seed(seed)
    images, digits = digit_canvases(held_out * 10, size)
    num_train = len(images) - held_out
    net = get_model(network, pretrained=False)
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(seed)
    for step in range(steps):
        if step == int(steps * 0.7):
            trainer.set_learning_rate(0.01)
        pick = rng.randint(0, num_train, BATCH_SIZE)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(images[pick])), mx.nd.array(digits[pick]))
        loss.backward()
        trainer.step(BATCH_SIZE)
    predicted = np.concatenate([
        net(mx.nd.array(images[start:start + 100])).argmax(axis=1).asnumpy()
        for start in range(num_train, len(images), 100)])
    return net, float(np.mean(predicted == digits[num_train:]))


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="parameters file to write")
    parser.add_argument("--network", default="mobilenet0.25",
                        help="GluonCV classification network (default: mobilenet0.25)")
    parser.add_argument("--steps", type=int, default=2000, help="SGD steps (default: 2000)")
    parser.add_argument("--size", type=int, default=96, help="canvas side in pixels (default: 96)")
    parser.add_argument("--quick", action="store_true",
                        help="20 steps, 600 canvases of 64 pixels")
    return parser


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    held_out = HELD_OUT // 10 if args.quick else HELD_OUT
    if args.quick:
        args.steps, args.size = 20, 64
    if args.steps < 1 or args.size < 32:
        print(f"error: --steps {args.steps} --size {args.size}: need at least 1 step and 32 "
              "pixels; pass larger values", file=sys.stderr)
        return 2
    if os.path.exists(args.out):
        print(f"error: --out {args.out} exists; it is never overwritten: pass a new file name",
              file=sys.stderr)
        return 2
    from gluoncv.model_zoo import get_model_list

    if args.network not in get_model_list():
        print(f"error: --network {args.network!r} is not in GluonCV's model zoo; pass one of its "
              "classification networks, e.g. mobilenet0.25", file=sys.stderr)
        return 2
    net, accuracy = train_backbone(args.network, args.steps, args.size, held_out=held_out)
    net.save_parameters(args.out)
    print(f"{args.network}: {args.steps} steps, held-out digit accuracy {accuracy:.3f}, "
          f"saved to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
