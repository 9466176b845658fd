"""Cost of transposed convolutions on this CPU: one training step of a DCGAN generator in float32
(oneDNN's Deconvolution), emulated float16 and bfloat16 (both run each transposed convolution as the
equivalent Convolution of the zero-upsampled input, see mxfp16.casting.transposed).

The generator is DCGAN's (Radford et al. 2016) at a small size: latent (N, nz) -> 4x4 -> 8x8 ->
16x16 -> 32x32 by Conv2DTranspose(k=4, stride 2, pad 1) with BatchNorm and ReLU, ending in a 3x3
Conv2D to 3 channels and tanh.  The step is forward, backward of a squared error to random images,
and the Trainer's update; the median of the timed steps is reported, with each dtype's ratio to
float32.  Outputs in --out-dir: transposed_conv_step.md and .json.

Usage: python benchmarks/transposed_conv_step.py [--batch-size 64] [--ngf 64] [--steps 10] [--quick]
"""
import argparse
import time
from dataclasses import asdict, dataclass

import mxnet as mx
from mxnet import autograd
from mxnet.gluon import nn

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, publish, require_positive)

NAME = "transposed_conv_step"
DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True)
class Config:
    batch_size: int
    ngf: int
    latent_size: int
    steps: int
    warmup: int
    out_dir: str


def generator(ngf):
    """DCGAN's generator, 32x32 RGB out, four transposed convolutions."""
    net = nn.HybridSequential(prefix="gen_")
    with net.name_scope():
        net.add(nn.HybridLambda(lambda F, x: F.reshape(x, (0, -1, 1, 1))),
                nn.Conv2DTranspose(ngf * 8, 4, 1, 0, use_bias=False))
        for width in (ngf * 4, ngf * 2, ngf):
            net.add(nn.BatchNorm(), nn.Activation("relu"),
                    nn.Conv2DTranspose(width, 4, 2, 1, use_bias=False))
        net.add(nn.BatchNorm(), nn.Activation("relu"), nn.Conv2D(3, 3, 1, 1),
                nn.Activation("tanh"))
    return net


def median_step(config, dtype):
    mx.random.seed(0)
    net = generator(config.ngf)
    net.initialize(mx.init.Normal(0.02))
    net = mxfp16.cast_block(net, dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 2e-4},
                             dtype=dtype)
    noise = mx.nd.random.normal(shape=(config.batch_size, config.latent_size))
    target = mx.nd.random.uniform(-1, 1, shape=(config.batch_size, 3, 32, 32))
    times = []
    for i in range(config.warmup + config.steps):
        start = time.perf_counter()
        with autograd.record():
            loss = ((net(noise) - target) ** 2).mean()
        trainer.backward(loss)
        trainer.step(config.batch_size)
        mx.nd.waitall()
        if i >= config.warmup:
            times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


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
    seconds = {dtype: median_step(config, dtype) for dtype in DTYPES}
    rows = [(dtype, f"{seconds[dtype] * 1000:.1f}", f"{seconds[dtype] / seconds['float32']:.2f}")
            for dtype in DTYPES]
    record = {"benchmark": NAME, "command": command_line(NAME, argv or []),
              "machine": machine_info(), "config": asdict(config),
              "summary": [{"dtype": d, "median_step_s": seconds[d],
                           "over_float32": seconds[d] / seconds["float32"]} for d in DTYPES]}
    text = (f"# DCGAN generator step, transposed convolutions\n\n{header_lines(record)}"
            + markdown_table(["dtype", "median step (ms)", "÷ float32"], rows))
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
