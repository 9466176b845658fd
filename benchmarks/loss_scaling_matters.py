"""A case where loss scaling matters: gradients that underflow in float16 unless the loss is scaled.

Micikevicius et al. 2018 ("Mixed Precision Training", ICLR) found that classification networks train
in float16 without loss scaling, but Multibox SSD diverged without it and bigLSTM needed a scale of
128: their activation gradients were mostly below float16's smallest subnormal, 2**-24 (about 6e-8),
and became zero (their Figure 3).  This benchmark reproduces that mechanism on real data, with the
gradient magnitude as the only thing that changes.

Mechanism.  A two-hidden-layer MLP classifies scikit-learn's digits with a cross-entropy loss that is
averaged over the batch (PyTorch's ``reduction='mean'``; ``trainer.step(1)``) and multiplied by a
``factor`` (2**0 ... 2**-20).  The gradient reaching the logits is ``factor * (softmax - onehot) /
batch_size`` and the hidden layers' gradients are that times the weights.  The factor stands for what
makes real gradients small: SSD's loss summed over thousands of anchors and normalised, a mean over
every token of a long sequence, a small-weighted auxiliary loss, the attenuation through a deep
network.  The SGD learning rate is divided by the same factor, so every float32 run takes exactly the
same steps (SGD with momentum is linear in the gradient and the factors are powers of two): float32
accuracy does not depend on the factor.  In float16 (CPU emulation: gradients rounded to float16 at
every GEMM output, float16 weight gradients) a gradient below 2**-25 rounds to zero and one below
2**-14 keeps fewer than 10 significant bits.  Without scaling, as the factor shrinks, more gradients
become exactly zero and the network learns less, until it does not learn at all.  With dynamic loss
scaling (``mxfp16.DynamicLossScaler``, initial scale 2**16) the loss is multiplied by the scale
before backward, which shifts the gradients back into float16's range, and the optimizer divides by
the scale in float32: it matches float32.

Reported per factor and mode: test accuracy and final training loss (the unscaled cross-entropy,
means over seeds), the fraction of weight-gradient entries that are exactly zero (sampled during
training; float32 shows the baseline of structurally zero entries: always-blank pixels, inactive
ReLUs), skipped steps and the final loss scale.  Outputs in --out-dir: loss_scaling_matters.md,
.json and .png (accuracy and zero-gradient fraction against the factor, and the training loss at the
smallest factor).

Usage: python benchmarks/loss_scaling_matters.py [--log2-factors 0,-8,-12,-14,-16,-18,-20]
       [--seeds 3] [--steps 400] [--quick]
"""
import argparse
import sys
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from bench_common import (add_output_arguments, command_line, digits_split, header_lines,
                          machine_info, markdown_table, mean_std, new_figure, parse_config,
                          parse_exponents, require_positive, save_figure, write_results)

#: Mode name -> (training dtype, loss scale as mxfp16.make_loss_scaler takes it; 1 disables it).
MODES = {
    "float32": ("float32", 1.0),
    "float16-no-scaling": ("float16", 1.0),
    "float16-dynamic": ("float16", "dynamic"),
}

NAME = "loss_scaling_matters"


@dataclass(frozen=True)
class Config:
    log2_factors: tuple
    seeds: int
    steps: int
    batch_size: int
    hidden: int
    lr: float
    momentum: float
    probe_every: int
    out_dir: str


def mlp(hidden):
    net = nn.HybridSequential()
    net.add(nn.Dense(hidden, activation="relu"), nn.Dense(hidden, activation="relu"), nn.Dense(10))
    return net


def build(mode, factor, seed, config):
    """Network, trainer (learning rate divided by ``factor``) and loss scaler for one run."""
    dtype, loss_scale = MODES[mode]
    mx.random.seed(seed)
    net = mlp(config.hidden)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype, emulate=True if dtype == "float16" else None)
    net.hybridize()
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", dtype,
                                  learning_rate=config.lr / factor, momentum=config.momentum)
    return net, trainer, mxfp16.make_loss_scaler(loss_scale, dtype)


def zero_fraction(net):
    """Fraction of the weight-gradient entries (all layers, biases excluded) that are exactly 0."""
    grads = [param.grad() for name, param in net.collect_params().items()
             if name.endswith("weight")]
    zeros = sum(int((grad == 0).sum().asscalar()) for grad in grads)
    return zeros / sum(grad.size for grad in grads)


def train(net, trainer, scaler, factor, train_data, config, rng):
    """SGD on the batch-mean loss times ``factor``; return the loss curve and zero fractions."""
    images, labels = train_data
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    curve, zeros = [], []
    for step in range(config.steps):
        batch = rng.randint(0, len(labels), config.batch_size)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(images[batch])), mx.nd.array(labels[batch])).mean()
            scaled = scaler.scale(loss * factor)
        scaled.backward()
        if step % config.probe_every == 0:
            zeros.append(zero_fraction(net))
            curve.append(float(loss.asscalar()))
        scaler.step(trainer, 1)  # the batch mean is already in the loss
    return curve, zeros


def evaluate(net, data):
    """Accuracy and mean cross-entropy (unscaled) on ``(images, labels)``."""
    images, labels = mx.nd.array(data[0]), mx.nd.array(data[1])
    logits = net(images)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()(logits, labels).mean().asscalar()
    accuracy = (logits.argmax(axis=1) == labels).mean().asscalar()
    return float(accuracy), float(loss)


def run_one(mode, log2_factor, seed, config, train_data, test_data):
    factor = 2.0 ** log2_factor
    net, trainer, scaler = build(mode, factor, seed, config)
    curve, zeros = train(net, trainer, scaler, factor, train_data, config,
                         np.random.RandomState(seed))
    test_accuracy, _ = evaluate(net, test_data)
    _, train_loss = evaluate(net, train_data)
    return {"mode": mode, "log2_factor": log2_factor, "seed": seed, "test_accuracy": test_accuracy,
            "train_loss": train_loss, "zero_grad_fraction": float(np.mean(zeros)),
            "loss_curve": curve, "skipped_steps": scaler.num_skipped,
            "final_loss_scale": scaler.loss_scale}


def summarize(runs, config):
    """One row per (factor, mode), means over seeds."""
    rows = []
    for log2_factor in config.log2_factors:
        for mode in MODES:
            mine = [r for r in runs if r["mode"] == mode and r["log2_factor"] == log2_factor]
            accuracy, accuracy_std = mean_std(r["test_accuracy"] for r in mine)
            rows.append({"log2_factor": log2_factor, "mode": mode, "seeds": len(mine),
                         "accuracy_mean": accuracy, "accuracy_std": accuracy_std,
                         "train_loss_mean": mean_std(r["train_loss"] for r in mine)[0],
                         "zero_grad_fraction": mean_std(r["zero_grad_fraction"] for r in mine)[0],
                         "skipped_steps_mean": mean_std(r["skipped_steps"] for r in mine)[0],
                         "final_loss_scale": mine[0]["final_loss_scale"],
                         "mean_loss_curve": np.mean([r["loss_curve"] for r in mine], 0).tolist()})
    return rows


def markdown(summary):
    header = ["loss factor", "mode", "test accuracy % (mean ± std)", "final train loss",
              "zero weight grads %", "skipped steps", "final loss scale (seed 0)"]
    rows = [[f"2^{row['log2_factor']}", row["mode"],
             f"{100 * row['accuracy_mean']:.2f} ± {100 * row['accuracy_std']:.2f}",
             f"{row['train_loss_mean']:.4f}", f"{100 * row['zero_grad_fraction']:.1f}",
             f"{row['skipped_steps_mean']:g}", f"{row['final_loss_scale']:g}"] for row in summary]
    return markdown_table(header, rows)


def plot(summary, config, path):
    fig, (acc_axis, zero_axis, loss_axis) = new_figure(3)
    smallest = min(config.log2_factors)
    for mode in MODES:
        rows = [row for row in summary if row["mode"] == mode]
        factors = [row["log2_factor"] for row in rows]
        acc_axis.plot(factors, [100 * row["accuracy_mean"] for row in rows], marker="o", label=mode)
        zero_axis.plot(factors, [100 * row["zero_grad_fraction"] for row in rows], marker="o",
                       label=mode)
        curve = next(row["mean_loss_curve"] for row in rows if row["log2_factor"] == smallest)
        loss_axis.plot([config.probe_every * i for i in range(len(curve))], curve, label=mode)
    acc_axis.set(xlabel="log2(loss factor)", ylabel="test accuracy %", title="Digits MLP")
    zero_axis.set(xlabel="log2(loss factor)", ylabel="weight-gradient entries that are 0 (%)",
                  title="Gradient underflow")
    loss_axis.set(xlabel="step", ylabel="training loss (unscaled)", yscale="log",
                  title=f"Loss factor 2^{smallest}")
    for axis in (acc_axis, zero_axis, loss_axis):
        axis.legend()
    return save_figure(fig, path)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2-factors", default="0,-8,-12,-14,-16,-18,-20",
                        help="comma-separated exponents k of the loss factors 2^k "
                             "(default: 0,-8,-12,-14,-16,-18,-20)")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per factor and mode (default: 3)")
    parser.add_argument("--steps", type=int, default=400, help="SGD steps per run (default: 400)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.add_argument("--hidden", type=int, default=64, help="units per hidden layer (default: 64)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="SGD learning rate at factor 1; divided by the factor (default: 0.05)")
    parser.add_argument("--momentum", type=float, default=0.9, help="(default: 0.9)")
    parser.add_argument("--probe-every", type=int, default=10,
                        help="steps between zero-gradient counts (default: 10)")
    return add_output_arguments(parser, "the .md, .json and .png",
                                "factor 2^-20 only, 1 seed, 40 steps")


def parse_factors(text):
    return parse_exponents(text, "--log2-factors", -40, 0, "0,-12,-20")


def make_config(args):
    require_positive(args, ("seeds", "steps", "batch_size", "hidden", "probe_every"))
    factors = parse_factors(args.log2_factors)
    seeds, steps = args.seeds, args.steps
    if args.quick:
        factors, seeds, steps = (-20,), 1, 40
    return Config(factors, seeds, steps, args.batch_size, args.hidden, args.lr, args.momentum,
                  args.probe_every, args.out_dir)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    config, failed = parse_config(get_args_parser(), make_config, argv)
    if failed:
        return failed
    train_data, test_data = digits_split()
    runs = [run_one(mode, k, seed, config, train_data, test_data)
            for k in config.log2_factors for seed in range(config.seeds) for mode in MODES]
    summary = summarize(runs, config)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "summary": summary, "runs": runs}
    text = header_lines(record) + markdown(summary)
    write_results(config.out_dir, NAME, text, record)
    figure = plot(summary, config, f"{config.out_dir}/{NAME}.png")
    print(text + f"\nwrote {config.out_dir}/{NAME}.md, .json and {figure}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
