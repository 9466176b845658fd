"""Preemption: the time from SIGTERM to exit of scripts/train_imagenet.py, and the checkpoint sizes.

A spot instance gets 30 s to 2 min of notice, Kubernetes 30 s by default (``terminationGracePeriod
Seconds``), SLURM what ``--signal`` asks for: the run must finish its step, save and exit in that.
For each of --rounds rounds, the script trains --network in float16 (dynamic loss scaling) on
synthetic data with ``--disp-batches 1``; once its log shows batch --signal-batch of epoch 0, the
benchmark sends SIGTERM and measures until the process has exited (exit code 143 expected), and
reads from the log how much of that was the rest of the step and how much the checkpoint's write.
The checkpoint written is the one a stop writes (``PREFIX-0000+BBBBBB``): its files' sizes are
reported too.

On this CPU float16 is emulated, so a step takes far longer than on a GPU: the time to exit is
dominated here by the step in flight; the checkpoint's write (serialising float32 weights and the
optimizer state to disk) is what a GPU run pays too.

Outputs in --out-dir: preemption.md and .json.

Usage: python benchmarks/preemption.py [--network resnet50_v1] [--image-shape 3,224,224]
       [--batch-size 8] [--rounds 3] [--quick]
"""
import argparse
import datetime
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, publish, require_positive)

NAME = "preemption"
SCRIPT = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts",
                      "train_imagenet.py")


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet50_v1", help="zoo network (default: resnet50_v1)")
    parser.add_argument("--image-shape", default="3,224,224", help="default: 3,224,224")
    parser.add_argument("--batch-size", type=int, default=8, help="default: 8")
    parser.add_argument("--signal-batch", type=int, default=3,
                        help="send SIGTERM once this batch was logged (default: 3)")
    parser.add_argument("--rounds", type=int, default=3, help="default: 3")
    add_output_arguments(parser, "the .md and .json", "a tiny network, 1 round")
    return parser


def make_config(args):
    require_positive(args, ("batch_size", "signal_batch", "rounds"))
    if args.quick:
        args.network, args.image_shape, args.batch_size, args.rounds = \
            "cifar_resnet20_v1", "3,16,16", 4, 1
    return args


def _log_time(line):
    """The timestamp that starts a log line, in seconds."""
    stamp = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
    return stamp.timestamp()


def one_round(args, folder):
    prefix = os.path.join(folder, "r")
    argv = [sys.executable, SCRIPT, "--network", args.network, "--image-shape", args.image_shape,
            "--batch-size", str(args.batch_size), "--dtype", "float16", "--benchmark", "1",
            "--num-examples", str(args.batch_size * (args.signal_batch + 50)), "--num-epochs", "1",
            "--disp-batches", "1", "--model-prefix", prefix]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    marker = f"Epoch[0] Batch[{args.signal_batch}]"
    lines = []
    for line in process.stdout:
        lines.append(line)
        if marker in line:
            break
    sent = time.time()
    process.send_signal(signal.SIGTERM)
    rest, _ = process.communicate(timeout=600)
    exited = time.time()
    lines += rest.splitlines(keepends=True)
    if process.returncode != 143:
        raise RuntimeError(f"exit code {process.returncode}, not 143:\n{''.join(lines[-20:])}")
    last_batch = max(_log_time(line) for line in lines if "Batch[" in line)
    saved = [line for line in lines if " INFO saved checkpoint " in line][-1]
    name = saved.rsplit(" ", 1)[1].strip()
    sizes = {suffix: os.path.getsize(name + suffix) for suffix in (".params", ".states", ".json")
             if os.path.exists(name + suffix)}
    return {"seconds_to_exit": exited - sent,
            "seconds_step_rest": max(last_batch - sent, 0.0),
            "seconds_save": _log_time(saved) - last_batch,
            "checkpoint": os.path.basename(name), "sizes": sizes}


def main(argv=None):
    config, error = parse_config(get_args_parser(), make_config, argv)
    if error:
        return error
    rounds = []
    for _ in range(config.rounds):
        with tempfile.TemporaryDirectory() as folder:
            rounds.append(one_round(config, folder))
    sizes = rounds[-1]["sizes"]
    record = {"benchmark": NAME, "command": command_line(NAME, argv if argv is not None else sys.argv[1:]),
              "machine": machine_info(), "network": config.network,
              "image_shape": config.image_shape, "batch_size": config.batch_size,
              "rounds": rounds,
              "median_seconds_to_exit": statistics.median(r["seconds_to_exit"] for r in rounds)}
    rows = [[i, f"{r['seconds_to_exit']:.2f}", f"{r['seconds_step_rest']:.2f}",
             f"{r['seconds_save']:.2f}", r["checkpoint"]] for i, r in enumerate(rounds)]
    text = header_lines(record) + (
        f"{config.network} float16 (emulated), {config.image_shape}, batch {config.batch_size}: "
        "SIGTERM after a logged batch, until exit (143)\n\n")
    text += markdown_table(["round", "signal to exit (s)", "rest of the step (s)",
                            "checkpoint write (s)", "checkpoint"], rows)
    text += "\n" + markdown_table(["file", "bytes", "MiB"],
                                  [[suffix, size, f"{size / 2 ** 20:.1f}"]
                                   for suffix, size in sizes.items()])
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
