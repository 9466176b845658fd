"""Cost of the loss-scale boundary of a cast network (mxfp16.scaling.boundary): one training step of
GluonCV's ResNet-18 (resnet18_v1b, 10 classes) in emulated float16, with and without the factors a cast
network multiplies its inputs and outputs by while autograd records.

Modes: ``boundary off`` (the factors taken out: mxfp16 before them), ``boundary on`` (the default,
an ordinary loss: the factors hold 1), and ``SoftmaxOutput loss`` (a loss that ignores its head
gradient, whose scale enters at the boundary: the factors hold the scale during the backward, and
the step divides by it).  The step is forward, backward and the Trainer's update; the modes take
turns step by step (each one first in turn), and the median of each one's timed steps is reported
with its ratio to ``boundary off``.  Outputs in --out-dir: boundary_scale_step.md and .json.

Usage: python benchmarks/boundary_scale_step.py [--batch-size 32] [--size 32] [--steps 10] [--quick]
"""
import argparse
import time
from dataclasses import dataclass

import mxnet as mx
from gluoncv.model_zoo import get_model
from mxnet import autograd, gluon

import mxfp16
from bench_common import (add_output_arguments, parse_config, publish_step_medians,
                          require_positive)
from mxfp16.scaling import boundary as boundary_scale

NAME = "boundary_scale_step"
MODES = ("boundary off", "boundary on", "SoftmaxOutput loss")


@dataclass(frozen=True)
class Config:
    batch_size: int
    size: int
    steps: int
    warmup: int
    out_dir: str


def build():
    mx.random.seed(0)
    net = get_model("resnet18_v1b", classes=10, pretrained=False)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, "float16")
    net.hybridize(static_alloc=True, static_shape=True)
    return net, mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.01,
                                                             "momentum": 0.9},
                               dtype="float16", loss_scale=1024.0)


def _identity(value):
    return value


def step_time(mode, net, trainer, data, label):
    off = mode == "boundary off"
    saved = boundary_scale.scale_inputs, boundary_scale.scale_outputs
    if off:
        boundary_scale.scale_inputs = boundary_scale.scale_outputs = _identity
    try:
        start = time.perf_counter()
        with autograd.record():
            out = net(data)
            loss = mx.nd.SoftmaxOutput(out, label) if mode == "SoftmaxOutput loss" else \
                gluon.loss.SoftmaxCrossEntropyLoss()(out, label)
        trainer.backward(loss)
        trainer.step(data.shape[0])
        mx.nd.waitall()
        return time.perf_counter() - start
    finally:
        boundary_scale.scale_inputs, boundary_scale.scale_outputs = saved


def median_steps(config):
    """Each mode's median step time; the modes take turns step by step, each first in turn, so
    a machine shared with other jobs slows them alike."""
    setups = {mode: build() for mode in MODES}
    data = mx.nd.random.uniform(shape=(config.batch_size, 3, config.size, config.size))
    label = mx.nd.array([i % 10 for i in range(config.batch_size)])
    times = {mode: [] for mode in MODES}
    for i in range(config.warmup + config.steps):
        for mode in MODES[i % 3:] + MODES[:i % 3]:  # each mode first in turn
            net, trainer = setups[mode]
            seconds = step_time(mode, net, trainer, data, label)
            if i >= config.warmup:
                times[mode].append(seconds)
    return {mode: sorted(values)[len(values) // 2] for mode, values in times.items()}


def make_config(args):
    require_positive(args, ["batch_size", "size", "steps"])
    if args.quick:
        return Config(2, 16, 1, 1, args.out_dir)
    return Config(args.batch_size, args.size, args.steps, 2, args.out_dir)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    parser.add_argument("--size", type=int, default=32, help="image side, pixels (default: 32)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    add_output_arguments(parser, "the .md and .json", "batch 2, 16 px, one timed step")
    return parser


def main(argv=None):
    config, code = parse_config(get_args_parser(), make_config, argv)
    if config is None:
        return code
    publish_step_medians(NAME, argv, config, "ResNet-18 step, emulated float16, loss-scale boundary",
                         median_steps(config), MODES[0])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
