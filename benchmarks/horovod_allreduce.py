"""What Horovod sends per step, float16 against float32, and a 2-process rehearsal of its throughput.

Part 1, bytes: the network (default ResNet-50 v1, 1000 classes) is cast as ``train_imagenet.py``
casts it (``mxfp16.train.gluon_api.gluon_network``) and the gradients' sizes are summed over the
trained parameters: what :class:`mxfp16.distributed.horovod.Horovod` allreduces per step and process, in
float32, float16 (BatchNorm's parameters stay float32) and bfloat16, and for float32 gradients
sent with Horovod's fp16 compression (``set_gradient_compression({'type': 'fp16'})``).

Part 2, allreduce time: two Horovod processes allreduce one step's gradients (every tensor, as
the Trainer does) through :class:`mxfp16.distributed.horovod.Horovod`, float32 then float16; median seconds of
``--repeats`` steps after a warm-up.

Part 3, throughput: ``scripts/train_imagenet.py --benchmark 1`` (synthetic data) once as one
process and once as ``scripts/launch.py --launcher horovod -n 2`` (horovodrun over Gloo on
loopback) with the same batch per process.  On a CPU with 2 cores the two processes share the cores
the one process had, so this is a rehearsal of the mechanics (allreduce, broadcast, sharding), not a
speed-up.  Outputs in --out-dir: horovod_allreduce.md and .json.

Usage: python benchmarks/horovod_allreduce.py [--network resnet50_v1] [--quick]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time

import mxnet as mx
import numpy as np

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, publish)
from mxfp16.models import new_network
from mxfp16.train.gluon_api import gluon_network

NAME = "horovod_allreduce"
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")


def gradient_arrays(network_name, num_classes, image_shape, dtype):
    """The gradient arrays of the network cast to ``dtype`` as the training script casts it."""
    network = new_network(network_name, num_classes, image_shape)
    block, _ = gluon_network(network, [mx.cpu()], dtype, hybridize=False)
    return [param.grad() for param in block.collect_params().values()
            if param.grad_req != "null"]


def gradient_bytes(network_name, num_classes, image_shape, dtype):
    """``(tensors, bytes)`` of the gradients one process allreduces per step in ``dtype``."""
    grads = gradient_arrays(network_name, num_classes, image_shape, dtype)
    return len(grads), sum(grad.size * np.dtype(grad.dtype).itemsize for grad in grads)


def allreduce_worker(network_name, num_classes, image_shape, repeats):
    """Run under horovodrun: time one step's allreduce of every gradient, float32 then float16,
    through mxfp16's Horovod kvstore; rank 0 prints ``ALLREDUCE {json}`` (median seconds)."""
    import mxfp16.distributed.horovod

    kv = mxfp16.distributed.horovod.Horovod()
    medians = {}
    for dtype in ("float32", "float16"):
        grads = gradient_arrays(network_name, num_classes, image_shape, dtype)
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            start = time.perf_counter()
            for index, grad in enumerate(grads):
                kv.pushpull(f"{dtype}.{index}", grad, priority=-index)
            mx.nd.waitall()
            times.append(time.perf_counter() - start)
        medians[dtype] = statistics.median(times[1:])
    if kv.rank == 0:
        print("ALLREDUCE " + json.dumps(medians), flush=True)
    return 0


def allreduce_rows(args, image_shape, bytes_rows, timeout):
    """Median seconds of one step's allreduce on 2 processes, float32 and float16."""
    command = [sys.executable, os.path.join(SCRIPTS, "launch.py"), "--launcher", "horovod",
               "-n", "2", "--timeout", str(timeout), "--", sys.executable,
               os.path.abspath(__file__), "--allreduce-worker", "--network", args.network,
               "--num-classes", str(args.num_classes), "--repeats", str(args.repeats),
               "--image-side", str(image_shape[1])]
    job = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 30,
                         env=_env())
    found = re.search(r"ALLREDUCE (\{.*\})", job.stdout)
    if job.returncode != 0 or not found:
        raise RuntimeError(f"the allreduce job failed ({job.returncode}): {job.stderr[-800:]}")
    medians = json.loads(found.group(1))
    sizes = {row["gradients"]: row["bytes"] for row in bytes_rows}
    return [{"gradients": dtype, "seconds": seconds, "mib_per_s": sizes[dtype] / 2 ** 20 / seconds}
            for dtype, seconds in medians.items()]


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


def _env():
    return dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, os.environ.get("PYTHONPATH", "")]))


def throughput(processes, flags, timeout):
    """img/s of rank 0 (its own samples) from the script's summary line."""
    train = [sys.executable, os.path.join(SCRIPTS, "train_imagenet.py"), *flags]
    if processes > 1:
        command = [sys.executable, os.path.join(SCRIPTS, "launch.py"), "--launcher", "horovod",
                   "-n", str(processes), "--timeout", str(timeout), "--", *train,
                   "--kv-store", "horovod"]
    else:
        command = train
    job = subprocess.run(command, capture_output=True, text=True, timeout=timeout + 30,
                         env=_env())
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


def markdown(bytes_rows, speed_rows, config, reduce_rows=()):
    table = [[r["gradients"], r["tensors"], f"{r['bytes'] / 2 ** 20:.2f}", f"{r['vs_float32']:.3f}"]
             for r in bytes_rows]
    text = (f"Network {config['network']}, {config['num_classes']} classes: gradients allreduced "
            "per step and process\n\n"
            + markdown_table(["gradients", "tensors", "MiB per step", "vs float32"], table))
    table = [[r["gradients"], f"{r['seconds']:.3f}", f"{r['mib_per_s']:.0f}"] for r in reduce_rows]
    text += (f"\nOne step's allreduce of every gradient, 2 processes, Gloo on loopback (median of "
             f"{config['repeats']})\n\n"
             + markdown_table(["gradients", "seconds", "MiB/s per process"], table))
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
    parser.add_argument("--repeats", type=int, default=5, help="timed allreduce steps "
                        "(default: 5)")
    parser.add_argument("--image-side", type=int, default=224, help=argparse.SUPPRESS)
    parser.add_argument("--allreduce-worker", action="store_true", help=argparse.SUPPRESS)
    return add_output_arguments(parser, "the .md and .json",
                                "mobilenet0.25 at 3x32x32, 3 batches")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args_parser().parse_args(argv)
    if args.allreduce_worker:  # a process of the allreduce job
        return allreduce_worker(args.network, args.num_classes,
                                (3, args.image_side, args.image_side), args.repeats)
    image_shape = (3, 224, 224)
    speed_shape = "3,112,112"
    if args.quick:
        args.network = args.speed_network = "mobilenet0.25"
        args.num_classes, args.batches, image_shape, speed_shape = 10, 3, (3, 32, 32), "3,32,32"
        args.repeats = 2
    train_flags = ["--network", args.speed_network, "--num-classes", str(args.num_classes),
                   "--image-shape", speed_shape, "--batch-size", "8", "--benchmark", "1",
                   "--max-batches", str(args.batches), "--num-epochs", "1", "--dtype", args.dtype]
    config = {"network": args.network, "num_classes": args.num_classes, "train_flags": train_flags,
              "repeats": args.repeats}
    bytes_rows = byte_rows(args.network, args.num_classes, image_shape)
    reduce_rows = allreduce_rows(args, image_shape, bytes_rows, timeout=600)
    speed_rows = throughput_rows(train_flags, timeout=900)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": config, "bytes": bytes_rows, "allreduce": reduce_rows,
              "throughput": speed_rows}
    publish(args.out_dir, NAME,
            header_lines(record) + markdown(bytes_rows, speed_rows, config, reduce_rows), record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
