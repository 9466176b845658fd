"""Cost of transposed convolutions on this CPU: one training step of a DCGAN generator in float32
(oneDNN's Deconvolution), emulated float16 and bfloat16 (both run each transposed convolution as the
equivalent Convolution: of its output phases, or of the zero-upsampled input, see
mxfp16.casting.transposed).

The generator is DCGAN's (Radford et al. 2016) at a small size: latent (N, nz) -> 4x4 -> 8x8 ->
16x16 -> 32x32 by Conv2DTranspose(k=4, stride 2, pad 1) with BatchNorm and ReLU, ending in a 3x3
Conv2D to 3 channels and tanh.  The step is forward, backward of a squared error to random images,
and the Trainer's update; the modes take turns step by step, and the median of each one's timed
steps is reported, with its ratio to float32.  Outputs in --out-dir: transposed_conv_step.md and .json.

Usage: python benchmarks/transposed_conv_step.py [--batch-size 64] [--ngf 64] [--steps 10] [--quick]
"""
import argparse
import time
from dataclasses import dataclass

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

import mxfp16
from bench_common import (add_output_arguments, parse_config, publish_step_medians,
                          require_positive)

NAME = "transposed_conv_step"
#: (row name, dtype, in_channels given): with the weights' shapes known at the cast, a stride-2
#: transposed convolution runs as one Convolution of its four output phases; waiting for the first
#: batch, as the Convolution of the zero-upsampled input (4x the multiply-adds).
MODES = (("float32", "float32", True),
         ("float16 (phases)", "float16", True), ("float16 (zeros)", "float16", False),
         ("bfloat16 (phases)", "bfloat16", True), ("bfloat16 (zeros)", "bfloat16", False))


@dataclass(frozen=True)
class Config:
    batch_size: int
    ngf: int
    latent_size: int
    steps: int
    warmup: int
    out_dir: str


def generator(ngf, latent_size, in_channels=True):
    """DCGAN's generator, 32x32 RGB out, four transposed convolutions; ``in_channels``: their
    weights' shapes are known when the network is cast (else they wait for the first batch)."""
    def given(channels):
        return channels if in_channels else 0
    net = nn.HybridSequential(prefix="gen_")
    with net.name_scope():
        net.add(nn.HybridLambda(lambda F, x: F.reshape(x, (0, -1, 1, 1))),
                nn.Conv2DTranspose(ngf * 8, 4, 1, 0, use_bias=False,
                                   in_channels=given(latent_size)))
        for width in (ngf * 4, ngf * 2, ngf):
            net.add(nn.BatchNorm(), nn.Activation("relu"),
                    nn.Conv2DTranspose(width, 4, 2, 1, use_bias=False,
                                       in_channels=given(width * 2)))
        net.add(nn.BatchNorm(), nn.Activation("relu"), nn.Conv2D(3, 3, 1, 1),
                nn.Activation("tanh"))
    return net


def build(config, dtype, in_channels):
    """``(network, trainer)`` of one mode, from the same seed."""
    mx.random.seed(0)
    net = generator(config.ngf, config.latent_size, in_channels)
    net.initialize(mx.init.Normal(0.02))
    net = mxfp16.cast_block(net, dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    return net, mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 2e-4}, dtype=dtype)


def step_time(net, trainer, noise, target):
    start = time.perf_counter()
    with autograd.record():
        loss = ((net(noise) - target) ** 2).mean()
    trainer.backward(loss)
    trainer.step(noise.shape[0])
    mx.nd.waitall()
    return time.perf_counter() - start


def median_steps(config):
    """Each mode's median step time; the modes take turns step by step, so a machine shared with
    other jobs slows them alike."""
    setups = {name: build(config, dtype, known) for name, dtype, known in MODES}
    noise = mx.nd.random.normal(shape=(config.batch_size, config.latent_size))
    target = mx.nd.random.uniform(-1, 1, shape=(config.batch_size, 3, 32, 32))
    times = {name: [] for name in setups}
    for i in range(config.warmup + config.steps):
        for name, (net, trainer) in setups.items():
            seconds = step_time(net, trainer, noise, target)
            if i >= config.warmup:
                times[name].append(seconds)
    return {name: sorted(values)[len(values) // 2] for name, values in times.items()}


def make_config(args):
    require_positive(args, ["batch_size", "ngf", "latent_size", "steps"])
    if args.quick:
        return Config(4, 4, 8, 1, 1, args.out_dir)
    return Config(args.batch_size, args.ngf, args.latent_size, args.steps, 2, args.out_dir)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.add_argument("--ngf", type=int, default=64, help="generator width (default: 64)")
    parser.add_argument("--latent-size", type=int, default=100, help="(default: 100)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    add_output_arguments(parser, "the .md and .json", "batch 4, width 4, one timed step")
    return parser


def main(argv=None):
    config, code = parse_config(get_args_parser(), make_config, argv)
    if config is None:
        return code
    publish_step_medians(NAME, argv, config, "DCGAN generator step, transposed convolutions",
                         median_steps(config), "float32")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
