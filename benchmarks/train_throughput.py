"""CPU training throughput: a bare hybridized Gluon loop against scripts/train_imagenet.py.

For each dtype (float32, float16 as CPU emulation, bfloat16) the bare loop is the least any toolkit
on top of MXNet can do per step: one in-memory batch, ``cast_block`` + ``hybridize(static_alloc,
static_shape)``, forward, backward, loss-scaler step (dynamic scaling for float16, as training needs;
none for the others) and SGD with momentum.  It runs --warmup + --steps steps and reports two
figures: the steady state (batch size over the median time of the last --steps steps) and the
average over all of them, first steps (graph building, memory allocation) included.  Then
``scripts/train_imagenet.py --benchmark 1`` runs in a subprocess (in a temporary folder) on the same
network, batch size, image shape and dtype for the same number of batches, and the img/s of its
closing summary line is taken: an average over the whole epoch, first batch included, so the ratio
script / bare loop compares it with the bare loop's average over all steps.  Everything is measured
in one run and reported as ratios (script / bare loop; each dtype / float32), which carry over
between machines better than absolute numbers.  If the script is missing or fails, its column says
so and the bare-loop numbers are still reported.  Outputs in --out-dir: train_throughput.md and
.json.

Usage: python benchmarks/train_throughput.py [--network resnet50_v1] [--batch-size 16]
       [--image-shape 3,224,224] [--quick]
"""
import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import mxnet as mx
from mxnet import autograd, gluon

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, parse_dtypes, parse_image_shape,
                          publish, require_positive)
from mxfp16.models import get_network

NAME = "train_throughput"
DTYPES = ("float32", "float16", "bfloat16")
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      "train_imagenet.py")

#: A throughput figure in a log line: "123.4 img/s", "Speed: 123.4 samples/sec", ...
THROUGHPUT_PATTERN = re.compile(r"([0-9]+(?:\.[0-9]+)?)\s*(?:img/s|images/s|samples/s(?:ec)?)\b")


def bare_loop_step_times(network, dtype, batch_size, image_shape, steps, warmup, num_classes):
    """Seconds of each of the ``warmup + steps`` steps of the bare loop."""
    mx.random.seed(0)
    net = get_network(network, num_classes=num_classes)
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype, emulate=True if dtype == "float16" else None)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", dtype, learning_rate=0.01,
                                  momentum=0.9)
    scaler = mxfp16.make_loss_scaler(None, dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data = mx.nd.random.uniform(-1, 1, shape=(batch_size,) + tuple(image_shape))
    label = mx.nd.array([i % num_classes for i in range(batch_size)])
    times = []
    for _ in range(warmup + steps):
        start = time.perf_counter()
        with autograd.record():
            loss = scaler.scale(loss_fn(net(data), label))
        loss.backward()
        scaler.step(trainer, batch_size)
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return times


def script_command(config, dtype):
    shape = ",".join(str(size) for size in config.image_shape)
    return [sys.executable, SCRIPT, "--benchmark", "1", "--network", config.network,
            "--batch-size", str(config.batch_size), "--image-shape", shape, "--dtype", dtype,
            "--max-batches", str(config.warmup + config.steps), "--num-epochs", "1"]


def parse_throughput(log):
    """The last img/s figure in a log, or None."""
    matches = THROUGHPUT_PATTERN.findall(log)
    return float(matches[-1]) if matches else None


def script_throughput(stdout, stderr):
    """The img/s of the script's summary line (stdout), else the last one it logged (stderr)."""
    found = parse_throughput(stdout)
    return found if found is not None else parse_throughput(stderr)


def run_script(config, dtype):
    """{'status', 'img_per_s', 'command', 'log_tail'} of one scripts/train_imagenet.py run."""
    command = script_command(config, dtype)
    result = {"command": " ".join(command[1:]), "img_per_s": None}
    if not os.path.isfile(SCRIPT):
        return dict(result, status=f"skipped: {os.path.relpath(SCRIPT)} not found")
    try:
        with tempfile.TemporaryDirectory(prefix="mxfp16-throughput-") as work_dir:
            done = subprocess.run(command, capture_output=True, text=True, cwd=work_dir,
                                  timeout=config.script_timeout)
    except subprocess.TimeoutExpired:
        return dict(result, status=f"failed: no result within {config.script_timeout} s")
    result["log_tail"] = (done.stderr.strip().splitlines() + done.stdout.strip().splitlines())[-5:]
    if done.returncode != 0:
        return dict(result, status=f"failed: exit code {done.returncode}")
    img_per_s = script_throughput(done.stdout, done.stderr)
    if img_per_s is None:
        return dict(result, status="failed: no img/s figure in its output")
    return dict(result, status="ok", img_per_s=img_per_s)


def measure(config, dtype):
    times = bare_loop_step_times(config.network, dtype, config.batch_size, config.image_shape,
                                 config.steps, config.warmup, config.num_classes)
    median = statistics.median(times[config.warmup:])
    return {"dtype": dtype, "bare_median_step_s": median,
            "bare_img_per_s": config.batch_size / median,
            "bare_all_steps_img_per_s": config.batch_size * len(times) / sum(times),
            "bare_step_times_s": times, "script": run_script(config, dtype)}


def add_ratios(rows):
    """Script / bare loop (both averaged over all steps) per dtype, and each dtype / float32 for the
    bare loop's steady state."""
    reference = next((row["bare_img_per_s"] for row in rows if row["dtype"] == "float32"), None)
    for row in rows:
        script = row["script"]["img_per_s"]
        row["script_over_bare"] = script / row["bare_all_steps_img_per_s"] if script else None
        row["bare_over_float32"] = row["bare_img_per_s"] / reference if reference else None
    return rows


def markdown(rows):
    header = ["dtype", "bare loop img/s, steady", "vs float32", "bare loop img/s, all steps",
              "train_imagenet.py img/s", "script / bare loop (all steps)"]
    table = []
    for row in rows:
        script = row["script"]
        table.append([row["dtype"], f"{row['bare_img_per_s']:.2f}",
                      f"{row['bare_over_float32']:.3f}" if row["bare_over_float32"] else "–",
                      f"{row['bare_all_steps_img_per_s']:.2f}",
                      f"{script['img_per_s']:.2f}" if script["img_per_s"] else script["status"],
                      f"{row['script_over_bare']:.3f}" if row["script_over_bare"] else "–"])
    return markdown_table(header, table)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50_v1", help="(default: resnet50_v1)")
    parser.add_argument("--batch-size", type=int, default=16, help="(default: 16)")
    parser.add_argument("--image-shape", default="3,224,224", help="(default: 3,224,224)")
    parser.add_argument("--num-classes", type=int, default=1000,
                        help="classes of the bare loop's network (default: 1000)")
    parser.add_argument("--dtypes", default=",".join(DTYPES),
                        help=f"comma-separated subset of {', '.join(DTYPES)} (default: all)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps (default: 10)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed steps (default: 3)")
    parser.add_argument("--script-timeout", type=int, default=3600,
                        help="seconds before a train_imagenet.py run is given up (default: 3600)")
    return add_output_arguments(parser, "the .md and .json",
                                "resnet18_v1, batch 2, input 3,32,32, 10 classes, 2 steps after 1")


def make_config(args):
    if args.quick:
        args.network, args.batch_size, args.image_shape = "resnet18_v1", 2, "3,32,32"
        args.num_classes, args.steps, args.warmup = 10, 2, 1
    require_positive(args, ("batch_size", "num_classes", "steps", "script_timeout"))
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
    rows = add_ratios([measure(config, dtype) for dtype in config.dtypes])
    settings = {key: value for key, value in vars(config).items() if key != "out_dir"}
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": settings, "results": rows}
    text = (header_lines(record) + f"{config.network}, batch {config.batch_size}, input "
            f"{config.image_shape}; steady: median of {config.steps} steps after {config.warmup}; "
            f"all steps: mean over all {config.warmup + config.steps}\n\n"
            + markdown(rows))
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
