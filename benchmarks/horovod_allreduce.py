"""What Horovod sends per step, float16 against float32, and a 2-process rehearsal of its throughput.

Part 1, bytes: the network (default ResNet-50 v1, 1000 classes) is cast as ``train_imagenet.py``
casts it (``mxfp16.train.gluon_api.gluon_network``) and the gradients' sizes are summed over the
trained parameters: what :class:`mxfp16.horovod.Horovod` allreduces per step and process, in
float32, float16 (BatchNorm's parameters stay float32) and bfloat16, and for float32 gradients
sent with Horovod's fp16 compression (``set_gradient_compression({'type': 'fp16'})``).

Part 2, throughput: ``scripts/train_imagenet.py --benchmark 1`` (synthetic data) once as one
process and once as ``scripts/launch.py --launcher horovod -n 2`` (horovodrun over Gloo on
loopback) with the same batch per process.  On a CPU with 2 cores the two processes share the cores
the one process had, so this is a rehearsal of the mechanics (allreduce, broadcast, sharding), not a
speed-up.  Outputs in --out-dir: horovod_allreduce.md and .json.

Usage: python benchmarks/horovod_allreduce.py [--network resnet50_v1] [--quick]
"""
import argparse
import os
import re
import subprocess
import sys

import mxnet as mx
import numpy as np

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, publish)
from mxfp16.models import new_network
from mxfp16.train.gluon_api import gluon_network

NAME = "horovod_allreduce"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")


def gradient_bytes(network_name, num_classes, image_shape, dtype):
    """``(tensors, bytes)`` of the gradients one process allreduces per step in ``dtype``."""
    network = new_network(network_name, num_classes, image_shape)
    block, _ = gluon_network(network, [mx.cpu()], dtype, hybridize=False)
    grads = [param.grad() for param in block.collect_params().values()
             if param.grad_req != "null"]
    return len(grads), sum(grad.size * np.dtype(grad.dtype).itemsize for grad in grads)


def byte_rows(network_name, num_classes, image_shape):
    rows = []
    for label, dtype in (("float32", "float32"), ("float16", "float16"),
                         ("bfloat16", "bfloat16")):
        tensors, size = gradient_bytes(network_name, num_classes, image_shape, dtype)
        rows.append({"gradients": label, "tensors": tensors, "bytes": size})
    rows.append({"gradients": "float32, Horovod fp16 compression", "tensors": rows[0]["tensors"],
                 "bytes": rows[0]["bytes"] // 2})
    for row in rows:
        row["vs_float32"] = row["bytes"] / rows[0]["bytes"]
    return rows


def throughput(processes, flags, timeout):
    """img/s of rank 0 (its own samples) from the script's summary line."""
    train = [sys.executable, os.path.join(SCRIPTS, "train_imagenet.py"), *flags]
    if processes > 1:
        command = [sys.executable, os.path.join(SCRIPTS, "launch.py"), "--launcher", "horovod",
                   "-n", str(processes), "--timeout", str(timeout), "--", *train,
                   "--kv-store", "horovod"]
    else:
        command = train
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))
    job = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 30, env=env)
    found = re.search(r"epochs?, top-1 .*?, ([0-9.]+) img/s", job.stdout)
    if job.returncode != 0 or not found:
        raise RuntimeError(f"{' '.join(command)} failed ({job.returncode}): {job.stderr[-800:]}")
    return float(found.group(1))


def throughput_rows(flags, timeout):
    rows = []
    for processes in (1, 2):
        per_process = throughput(processes, flags, timeout)
        rows.append({"processes": processes, "img_per_sec_rank0": per_process,
                     "img_per_sec_total": per_process * processes})
    return rows


def markdown(bytes_rows, speed_rows, config):
    table = [[r["gradients"], r["tensors"], f"{r['bytes'] / 2 ** 20:.2f}", f"{r['vs_float32']:.3f}"]
             for r in bytes_rows]
    text = (f"Network {config['network']}, {config['num_classes']} classes: gradients allreduced "
            "per step and process\n\n"
            + markdown_table(["gradients", "tensors", "MiB per step", "vs float32"], table))
    table = [[r["processes"], f"{r['img_per_sec_rank0']:.1f}", f"{r['img_per_sec_total']:.1f}"]
             for r in speed_rows]
    return text + (f"\nThroughput rehearsal (`{' '.join(config['train_flags'])}`), same batch "
                   "per process\n\n"
                   + markdown_table(["processes", "img/s rank 0", "img/s all ranks"], table))


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50_v1", help="(default: resnet50_v1)")
    parser.add_argument("--num-classes", type=int, default=1000, help="(default: 1000)")
    parser.add_argument("--speed-network", default="resnet18_v1",
                        help="network of the throughput runs (default: resnet18_v1)")
    parser.add_argument("--dtype", default="float16", help="of the throughput runs "
                        "(default: float16)")
    parser.add_argument("--batches", type=int, default=12, help="batches per throughput run "
                        "(default: 12)")
    return add_output_arguments(parser, "the .md and .json",
                                "mobilenet0.25 at 3x32x32, 3 batches")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args_parser().parse_args(argv)
    image_shape = (3, 224, 224)
    speed_shape = "3,112,112"
    if args.quick:
        args.network = args.speed_network = "mobilenet0.25"
        args.num_classes, args.batches, image_shape, speed_shape = 10, 3, (3, 32, 32), "3,32,32"
    train_flags = ["--network", args.speed_network, "--num-classes", str(args.num_classes),
                   "--image-shape", speed_shape, "--batch-size", "8", "--benchmark", "1",
                   "--max-batches", str(args.batches), "--num-epochs", "1", "--dtype", args.dtype]
    config = {"network": args.network, "num_classes": args.num_classes, "train_flags": train_flags}
    bytes_rows = byte_rows(args.network, args.num_classes, image_shape)
    speed_rows = throughput_rows(train_flags, timeout=900)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": config, "bytes": bytes_rows, "throughput": speed_rows}
    publish(args.out_dir, NAME, header_lines(record) + markdown(bytes_rows, speed_rows, config),
            record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
