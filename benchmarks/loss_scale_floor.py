"""The floor of dynamic loss scaling: how far below 1 the scale must be able to go.

A loss whose gradients overflow float16 even unscaled (a loss weighted 1e6, YOLOv3's objectness
loss summed over its anchors) trains only if the dynamic scale goes below 1, as PyTorch's
GradScaler lets it.  Its floor (``min_scale``) bounds the loss weights that still train: each run
here trains the same three-layer regression (Dense 64-64-1 with ReLU, 64 samples of 32 features,
Adam, the loss weighted by ``w``: Adam's steps do not depend on ``w`` in float32) in emulated
float16 with ``DynamicLossScaler(init_scale='auto', min_scale=floor)`` driving the step, and reports the final
unweighted loss, the skipped steps and the final scale, against float32 with the same weight.
A floor too high leaves the heavy weights at scale ``floor``, every step skipped (the loss stays at
its start); each halving below 1 is a skipped step, so a weight needing scale 2**-k costs about k
steps at the start: the float32 loss beside each run is float32's after as many updates
(steps not skipped).  The floor chosen, ``mxfp16.scaling.settings.MIN_LOSS_SCALE``, is the lowest
these runs need.  Outputs in --out-dir: loss_scale_floor.md and .json.

Usage: python benchmarks/loss_scale_floor.py [--log2-weights 0,10,20,30,40]
       [--log2-floors 0,-12,-24,-36] [--steps 60] [--quick]
"""
import argparse
import math
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_argv, parse_exponents, publish, require_positive)

NAME = "loss_scale_floor"


@dataclass(frozen=True)
class Config:
    log2_weights: tuple
    log2_floors: tuple
    steps: int
    lr: float
    out_dir: str


def build(dtype, floor):
    """The network, cast, and its loss scaler (float32: None, no scaling)."""
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(64, activation="relu", in_units=32), nn.Dense(64, activation="relu"),
            nn.Dense(1))
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype)
    net.hybridize()
    scaler = None if dtype == "float32" else \
        mxfp16.DynamicLossScaler("auto", min_scale=floor, max_consecutive_skips=10 ** 6)
    return net, scaler


def run(dtype, weight, floor, config):
    """The unweighted loss after each step, skipped steps and final loss scale of one run."""
    net, scaler = build(dtype, floor)
    trainer = mxfp16.make_trainer(net.collect_params(), "adam", dtype, learning_rate=config.lr)
    rng = np.random.RandomState(0)
    x, y = mx.nd.array(rng.randn(64, 32)), mx.nd.array(rng.randn(64, 1))
    l2 = gluon.loss.L2Loss()
    curve = []
    for _ in range(config.steps):
        with autograd.record():
            loss = l2(net(x), y) * weight
            scaled = loss if scaler is None else scaler.scale(loss)
        scaled.backward()
        if scaler is None:
            trainer.step(64)
        else:
            scaler.step(trainer, 64)
        curve.append(float(l2(net(x), y).mean().asscalar()))
    return {"loss": curve[-1], "curve": curve,
            "skipped": 0 if scaler is None else scaler.num_skipped,
            "final_scale": 1.0 if scaler is None else scaler.loss_scale}


def measure(config):
    rows = []
    for log2_weight in config.log2_weights:
        weight = 2.0 ** log2_weight
        reference = run("float32", weight, 1.0, config)["curve"]
        for log2_floor in config.log2_floors:
            row = run("float16", weight, 2.0 ** log2_floor, config)
            updates = config.steps - row.pop("skipped")
            rows.append(dict(row, log2_weight=log2_weight, log2_floor=log2_floor, updates=updates,
                             float32_loss=reference[updates - 1] if updates else None,
                             curve=None))
    return rows


def markdown(rows, record):
    header = ["loss weight", "floor", "updates (of the steps)", "float16 loss",
              "float32 loss after as many updates", "final scale"]
    body = [[f"2^{row['log2_weight']}", f"2^{row['log2_floor']}", row["updates"],
             f"{row['loss']:.4f}",
             "–" if row["float32_loss"] is None else f"{row['float32_loss']:.4f}",
             f"2^{math.log2(row['final_scale']):g}"] for row in rows]
    return (f"# Dynamic loss scaling's floor\n\n{header_lines(record)}"
            + markdown_table(header, body))


def make_config(args):
    require_positive(args, ["steps"])
    weights = parse_exponents(args.log2_weights, "--log2-weights", 0, 60, "0,10,20")
    floors = parse_exponents(args.log2_floors, "--log2-floors", -60, 0, "0,-12,-24")
    if args.quick:
        return Config((10, 20), (0, -24), 12, args.lr, args.out_dir)
    return Config(weights, floors, args.steps, args.lr, args.out_dir)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-weights", default="0,10,20,30,40",
                        help="exponents k of the loss weights 2^k (default: 0,10,20,30,40)")
    parser.add_argument("--log2-floors", default="0,-12,-24,-36",
                        help="exponents k of the floors 2^k, <= 0 (default: 0,-12,-24,-36)")
    parser.add_argument("--steps", type=int, default=60, help="Adam steps per run (default: 60)")
    parser.add_argument("--lr", type=float, default=0.003, help="Adam's learning rate "
                                                                "(default: 0.003)")
    add_output_arguments(parser, "the .md and .json", "weights 2^10 and 2^20, floors 1 and "
                                                      "2^-24, 12 steps")
    return parser


def main(argv=None):
    config, argv, failed = parse_argv(get_args_parser(), make_config, argv)
    if config is None:
        return failed
    rows = measure(config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "runs": rows}
    publish(config.out_dir, NAME, markdown(rows, record), record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
