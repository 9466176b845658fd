"""Accuracy parity on real data: a small CNN on scikit-learn's handwritten digits, trained in
float32, float16 (CPU emulation, dynamic loss scaling), float16 without loss scaling and bfloat16.

The small-scale counterpart of Micikevicius et al. 2018, "Mixed Precision Training" (ICLR), Table 1,
which compares float32 and mixed-precision ImageNet top-1 accuracy (ResNet-50: 75.92 vs 76.04) and
notes that these classification networks train to parity even without loss scaling.

Data: the 1797 8x8 digit images bundled with scikit-learn (no download), a fixed stratified split of
1347 training and 450 test images.  Every mode starts from the same weights for a given seed and sees
the same batches.  Outputs in --out-dir: accuracy_parity.md (table of final test accuracy, mean and
standard deviation over seeds), accuracy_parity.json (every run, with the loss scale of every
step), accuracy_parity_loss.png (training loss per epoch, mean over seeds, and the dynamic loss
scale of every step).

Usage: python benchmarks/accuracy_parity.py [--seeds 5] [--epochs 15] [--quick]
"""
import argparse
import sys
from dataclasses import asdict, dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from bench_common import (parse_choices, add_output_arguments, command_line, digits_split, header_lines,
                          machine_info, markdown_table, mean_std, new_figure, parse_config,
                          require_positive, save_figure, write_results)

#: Mode name -> (training dtype, loss scale as mxfp16.make_loss_scaler takes it; 1 disables it).
MODES = {
    "float32": ("float32", 1.0),
    "float16": ("float16", "dynamic"),
    "float16-no-scaling": ("float16", 1.0),
    "bfloat16": ("bfloat16", 1.0),
}

NAME = "accuracy_parity"


@dataclass(frozen=True)
class Config:
    seeds: int
    epochs: int
    batch_size: int
    lr: float
    momentum: float
    wd: float
    modes: tuple
    out_dir: str


def small_cnn():
    """Two conv layers with BatchNorm (kept float32 by the cast), global pooling, one Dense."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"), nn.MaxPool2D(2),
            nn.Conv2D(64, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(10))
    return net


def build(mode, seed, config, steps_per_epoch):
    """The cast network, its trainer (cosine learning-rate decay to 0) and its loss scaler."""
    dtype, loss_scale = MODES[mode]
    mx.random.seed(seed)
    net = small_cnn()
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype, emulate=True if dtype == "float16" else None)
    net.hybridize()
    schedule = mx.lr_scheduler.CosineScheduler(config.epochs * steps_per_epoch, base_lr=config.lr)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", dtype, learning_rate=config.lr,
                                  lr_scheduler=schedule, momentum=config.momentum, wd=config.wd)
    return net, trainer, mxfp16.make_loss_scaler(loss_scale, dtype)


def train_one_epoch(net, trainer, scaler, train_data, batch_size, rng, scales):
    """One shuffled pass (the last partial batch dropped); return the mean unscaled loss.  The loss
    scale each step was taken at is appended to ``scales``."""
    images, labels = train_data
    order = rng.permutation(len(labels))
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    losses = []
    for start in range(0, len(order) - batch_size + 1, batch_size):
        batch = order[start:start + batch_size]
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(images[batch])), mx.nd.array(labels[batch]))
            scaled = scaler.scale(loss)
        scaled.backward()
        scales.append(scaler.loss_scale)
        scaler.step(trainer, batch_size)
        losses.append(float(loss.mean().asscalar()))
    return float(np.mean(losses))


def evaluate(net, test_data):
    images, labels = test_data
    predictions = net(mx.nd.array(images)).argmax(axis=1).asnumpy()
    return float((predictions == labels).mean())


def run_one(mode, seed, config, train_data, test_data):
    """Train one mode from one seed; return its final test accuracy and loss curve."""
    net, trainer, scaler = build(mode, seed, config, len(train_data[1]) // config.batch_size)
    rng, scales = np.random.RandomState(seed), []
    losses = [train_one_epoch(net, trainer, scaler, train_data, config.batch_size, rng, scales)
              for _ in range(config.epochs)]
    return {"mode": mode, "seed": seed, "test_accuracy": evaluate(net, test_data),
            "epoch_losses": losses, "skipped_steps": scaler.num_skipped,
            "final_loss_scale": scaler.loss_scale, "step_loss_scales": scales}


def summarize(runs, modes):
    """One row per mode: accuracy mean/std/min/max, final loss, skipped steps."""
    rows = []
    for mode in modes:
        mine = [run for run in runs if run["mode"] == mode]
        mean, std = mean_std(run["test_accuracy"] for run in mine)
        curve = np.mean([run["epoch_losses"] for run in mine], axis=0)
        rows.append({"mode": mode, "seeds": len(mine), "accuracy_mean": mean, "accuracy_std": std,
                     "accuracy_min": min(run["test_accuracy"] for run in mine),
                     "accuracy_max": max(run["test_accuracy"] for run in mine),
                     "final_train_loss": float(curve[-1]), "mean_loss_curve": curve.tolist(),
                     "skipped_steps_mean": float(np.mean([run["skipped_steps"] for run in mine]))})
    return rows


def markdown(summary):
    header = ["mode", "seeds", "test accuracy % (mean ± std)", "min–max %", "final train loss",
              "skipped steps (mean)"]
    rows = [[row["mode"], row["seeds"],
             f"{100 * row['accuracy_mean']:.2f} ± {100 * row['accuracy_std']:.2f}",
             f"{100 * row['accuracy_min']:.2f}–{100 * row['accuracy_max']:.2f}",
             f"{row['final_train_loss']:.4f}", f"{row['skipped_steps_mean']:g}"] for row in summary]
    return markdown_table(header, rows)


def plot_losses(summary, runs, path):
    """The training loss per epoch of each mode (mean over seeds) and, beside it, the loss scale
    of every step of the dynamically scaled runs (one line per seed)."""
    fig, (losses, scales) = new_figure(2)
    for row in summary:
        epochs = range(1, len(row["mean_loss_curve"]) + 1)
        losses.plot(epochs, row["mean_loss_curve"], marker="o", markersize=3, label=row["mode"])
    losses.set(xlabel="epoch", ylabel="training loss (mean over seeds)", yscale="log",
               title="Digits CNN: training loss per mode")
    losses.legend()
    for run in runs:
        if MODES[run["mode"]][1] == "dynamic":
            scales.step(range(1, len(run["step_loss_scales"]) + 1), run["step_loss_scales"],
                        where="post", label=f"{run['mode']}, seed {run['seed']}")
    scales.set(xlabel="step", ylabel="loss scale", yscale="log", xscale="log",
               title="Dynamic loss scale at each step")
    scales.legend()
    return save_figure(fig, path)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per mode (default: 5)")
    parser.add_argument("--epochs", type=int, default=15, help="training epochs (default: 15)")
    parser.add_argument("--batch-size", type=int, default=32, help="(default: 32)")
    parser.add_argument("--lr", type=float, default=0.05,
                        help="initial SGD learning rate, cosine decay to 0 (default: 0.05)")
    parser.add_argument("--momentum", type=float, default=0.9, help="(default: 0.9)")
    parser.add_argument("--wd", type=float, default=1e-4, help="weight decay (default: 1e-4)")
    parser.add_argument("--modes", default=",".join(MODES),
                        help=f"comma-separated subset of {', '.join(MODES)} (default: all)")
    return add_output_arguments(parser, "the .md, .json and .png",
                                "1 seed, 2 epochs")


def make_config(args):
    modes = parse_choices(args.modes, MODES, "--modes", "mode")
    require_positive(args, ("seeds", "epochs", "batch_size"))
    seeds, epochs = (1, 2) if args.quick else (args.seeds, args.epochs)
    return Config(seeds, epochs, args.batch_size, args.lr, args.momentum, args.wd, modes,
                  args.out_dir)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    config, failed = parse_config(get_args_parser(), make_config, argv)
    if failed:
        return failed
    train_data, test_data = digits_split()
    runs = [run_one(mode, seed, config, train_data, test_data)
            for seed in range(config.seeds) for mode in config.modes]
    summary = summarize(runs, config.modes)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": asdict(config), "summary": summary, "runs": runs}
    text = header_lines(record) + markdown(summary)
    write_results(config.out_dir, NAME, text, record)
    plot = plot_losses(summary, runs, f"{config.out_dir}/{NAME}_loss.png")
    print(text + f"\nwrote {config.out_dir}/{NAME}.md, .json and {plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
