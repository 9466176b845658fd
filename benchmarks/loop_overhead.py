"""Training-loop overhead on short steps: scripts/train_imagenet.py against a bare loop, side by side.

On a GPU a ResNet-50 step takes tens of milliseconds, so whatever a training script does on the host
per batch (reading losses and predictions back for metrics and the progress bar, checking labels,
splitting batches) eats into the float16 speed-up.  Short CPU steps (``cifar_resnet20_v1``, batch
64, 32x32) show that overhead the way a GPU would.

For each dtype, --rounds times in turn and in one process:

* the bare loop: the least any toolkit on top of MXNet does per step, on the very network the
  script trains (the zoo network as a ``SymbolBlock``, ``cast_block``, ``hybridize(static_alloc,
  static_shape)``: ``mxfp16.train.gluon_api.gluon_network``).  One in-memory batch, forward,
  backward, the loss scaler's step (dynamic scaling for float16, none for the others) and SGD with
  momentum; --warmup steps, then --steps steps timed with one ``waitall`` at the end (the host never
  waits in between, except for the overflow decision of float16's scaler, which the script makes
  too);
* the script: ``scripts/train_imagenet.py``'s ``main()`` with ``--benchmark 1`` (synthetic data),
  two epochs of --steps batches, and the img/s of its second epoch (graph built, memory allocated;
  read from metrics.jsonl), so both sides are steady-state figures.

Reported: the img/s of both and their ratio (script / bare loop) per round, and the median ratio
per dtype.  Outputs in --out-dir: loop_overhead.md and .json.

Usage: python benchmarks/loop_overhead.py [--network cifar_resnet20_v1] [--batch-size 64]
       [--image-shape 3,32,32] [--steps 60] [--rounds 3] [--quick]
"""
import argparse
import json
import os
import statistics
import sys
import tempfile
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, parse_dtypes, parse_image_shape,
                          publish, require_positive)
from mxfp16.models import new_network
from mxfp16.train.gluon_api import gluon_network

NAME = "loop_overhead"
DTYPES = ("float32", "float16", "bfloat16")
SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")


def bare_img_per_s(config, dtype):
    """Steady-state img/s of the bare loop."""
    mx.random.seed(0)
    network = new_network(config.network, config.num_classes, config.image_shape)
    block, net = gluon_network(network, [mx.cpu()], dtype)
    trainer = mxfp16.make_trainer(block.collect_params(), "sgd", dtype, learning_rate=0.01,
                                  momentum=0.9)
    scaler = mxfp16.make_loss_scaler(None, dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = mx.nd.random.uniform(-1, 1, shape=(config.batch_size,) + tuple(config.image_shape))
    label = mx.nd.array([i % config.num_classes for i in range(config.batch_size)])

    def step():
        with autograd.record():
            loss = scaler.scale(loss_fn(net(data), label))
        loss.backward()
        scaler.step(trainer, config.batch_size)

    for _ in range(config.warmup):
        step()
    mx.nd.waitall()
    start = time.perf_counter()
    for _ in range(config.steps):
        step()
    mx.nd.waitall()
    return config.batch_size * config.steps / (time.perf_counter() - start)


def script_img_per_s(config, dtype):
    """img/s of the second epoch of scripts/train_imagenet.py, run in this process."""
    sys.path.insert(0, SCRIPTS)
    import train_imagenet  # noqa: E402 (a script, found on its folder)
    shape = ",".join(str(size) for size in config.image_shape)
    with tempfile.TemporaryDirectory(prefix="mxfp16-overhead-") as work_dir:
        log_file = os.path.join(work_dir, "train.log")
        code = train_imagenet.main([
            "--benchmark", "1", "--network", config.network, "--dtype", dtype,
            "--batch-size", str(config.batch_size), "--image-shape", shape,
            "--num-classes", str(config.num_classes), "--num-epochs", "2",
            "--max-batches", str(config.steps), "--disp-batches", str(config.steps),
            "--log-file", log_file])
        if code != 0:
            raise RuntimeError(f"train_imagenet.py exited with {code}")
        with open(os.path.join(work_dir, "metrics.jsonl")) as lines:
            records = [json.loads(line) for line in lines]
    return next(r["img_per_sec"] for r in records if r.get("event") == "epoch" and r["epoch"] == 1)


def measure(config, dtype):
    rounds = []
    for _ in range(config.rounds):
        bare = bare_img_per_s(config, dtype)
        script = script_img_per_s(config, dtype)
        rounds.append({"bare_img_per_s": bare, "script_img_per_s": script, "ratio": script / bare})
    return {"dtype": dtype, "rounds": rounds,
            "median_ratio": statistics.median(r["ratio"] for r in rounds)}


def markdown(rows):
    header = ["dtype", "bare loop img/s (per round)", "train_imagenet.py img/s (per round)",
              "script / bare (per round)", "median"]
    table = [[row["dtype"],
              ", ".join(f"{r['bare_img_per_s']:.1f}" for r in row["rounds"]),
              ", ".join(f"{r['script_img_per_s']:.1f}" for r in row["rounds"]),
              ", ".join(f"{r['ratio']:.3f}" for r in row["rounds"]),
              f"{row['median_ratio']:.3f}"] for row in rows]
    return markdown_table(header, table)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="cifar_resnet20_v1",
                        help="(default: cifar_resnet20_v1)")
    parser.add_argument("--batch-size", type=int, default=64, help="(default: 64)")
    parser.add_argument("--image-shape", default="3,32,32", help="(default: 3,32,32)")
    parser.add_argument("--num-classes", type=int, default=10, help="(default: 10)")
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help=f"comma-separated subset of {', '.join(DTYPES)} (default: all)")
    parser.add_argument("--steps", type=int, default=60,
                        help="timed steps per side and round (default: 60)")
    parser.add_argument("--warmup", type=int, default=5,
                        help="untimed steps of the bare loop (default: 5)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="alternations of bare loop and script (default: 3)")
    return add_output_arguments(parser, "the .md and .json",
                                "batch 8, 3 steps, 1 round")


def make_config(args):
    if args.quick:
        args.batch_size, args.steps, args.warmup, args.rounds = 8, 3, 1, 1
    require_positive(args, ("batch_size", "num_classes", "steps", "rounds"))
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    args.dtypes = parse_dtypes(args.dtypes, DTYPES)
    args.image_shape = parse_image_shape(args.image_shape)
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    config, failed = parse_config(get_args_parser(), make_config, argv)
    if failed:
        return failed
    rows = [measure(config, dtype) for dtype in config.dtypes]
    settings = {key: value for key, value in vars(config).items() if key != "out_dir"}
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": settings, "results": rows}
    text = (header_lines(record) + f"{config.network}, batch {config.batch_size}, input "
            f"{config.image_shape}; {config.steps} steady steps per side, {config.rounds} rounds "
            "alternating bare loop and script\n\n" + markdown(rows))
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
