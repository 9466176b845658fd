"""The cost of trusted checkpoints for ResNet-50: the optimizer state as NDArrays + JSON against
MXNet's pickle (time to write and read, bytes), and the SHA-256 checksums written and verified.

A float16 ResNet-50 with SGD momentum keeps, per float16 weight, a float32 momentum and a float32
master weight: the ``.states`` file holds both.  For each of --rounds rounds the benchmark writes
and reads that state in both formats (each write flushed to disk with fsync, as a checkpoint's
is), hashes the checkpoint's ``.params`` and ``.states`` files as saving and loading do, and reads
them back as saving does (MXNet's writers can drop the end of a file silently on a full disk).  The
states are made as the first step makes them (``create_state_multi_precision``), so no training
step is needed; their values do not change the cost.

Outputs in --out-dir: checkpoint_format.md and .json.

Usage: python benchmarks/checkpoint_format.py [--network resnet50_v1] [--rounds 3] [--quick]
"""
import argparse
import os
import statistics
import sys
import tempfile
import time

import mxnet as mx

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, publish, require_positive)
from mxfp16 import mxnet_internals
from mxfp16.checkpoints.files import sha256_file
from mxfp16.models import block_to_network, get_network
from mxfp16.checkpoints.optimizer_states import load_trainer_states, save_trainer_states
from mxfp16.optimizers import make_trainer

NAME = "checkpoint_format"


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--network", default="resnet50_v1", help="zoo network (default: resnet50_v1)")
    parser.add_argument("--rounds", type=int, default=3, help="default: 3")
    add_output_arguments(parser, "the .md and .json", "a tiny network, 1 round")
    return parser


def make_config(args):
    require_positive(args, ("rounds",))
    if args.quick:
        args.network, args.rounds = "cifar_resnet20_v1", 1
    return args


def float16_trainer(network):
    """A float16 network's Trainer (SGD momentum, float32 master weights) with its states made."""
    net = get_network(network, num_classes=1000)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 224, 224) if network.startswith("resnet") else (1, 3, 32, 32)))
    net.cast("float16")
    trainer = make_trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                           dtype="float16")
    mxnet_internals.init_trainer_kvstore(trainer)
    updater = mxnet_internals.trainer_updaters(trainer)[0]
    for index, param in enumerate(mxnet_internals.trainer_params(trainer)):
        updater.states[index] = trainer.optimizer.create_state_multi_precision(index, param.data())
    return net, trainer


def _timed(function, *args):
    start = time.perf_counter()
    function(*args)
    return time.perf_counter() - start


def _flushed(write):
    def run(path):
        write(path)
        with open(path, "rb") as written:
            os.fsync(written.fileno())
    return run


def one_round(net, trainer, folder):
    params, pickled, arrays = (os.path.join(folder, name) for name in
                               ("r.params", "pickle.states", "ndarray.states"))
    mx.nd.save(params, {k: v.data().astype("float32") for k, v in net.collect_params().items()})
    times = {"pickle_write": _timed(_flushed(trainer.save_states), pickled),
             "pickle_read": _timed(trainer.load_states, pickled),
             "ndarray_write": _timed(_flushed(lambda p: save_trainer_states(trainer, p)), arrays),
             "ndarray_read": _timed(load_trainer_states, trainer, arrays),
             "sha256": _timed(lambda: [sha256_file(p) for p in (params, arrays)]),
             "read_back": _timed(lambda: [mx.nd.load(p) for p in (params, arrays)])}
    sizes = {"params": os.path.getsize(params), "pickle": os.path.getsize(pickled),
             "ndarray": os.path.getsize(arrays)}
    return times, sizes


def main(argv=None):
    config, error = parse_config(get_args_parser(), make_config, argv)
    if error:
        return error
    net, trainer = float16_trainer(config.network)
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        for _ in range(config.rounds):
            rounds.append(one_round(net, trainer, folder))
    sizes = rounds[-1][1]
    median = {key: statistics.median(times[key] for times, _ in rounds) for key in rounds[0][0]}
    record = {"benchmark": NAME, "command": command_line(NAME, argv if argv is not None else sys.argv[1:]),
              "machine": machine_info(), "network": config.network, "parameters":
              len(block_to_network(net).arg_params), "rounds": [t for t, _ in rounds],
              "median_seconds": median, "bytes": sizes}
    rows = [["optimizer state, pickle (MXNet's)", f"{median['pickle_write']:.2f}",
             f"{median['pickle_read']:.2f}", sizes["pickle"]],
            ["optimizer state, NDArrays + JSON (mxfp16)", f"{median['ndarray_write']:.2f}",
             f"{median['ndarray_read']:.2f}", sizes["ndarray"]],
            ["SHA-256 of .params + .states (once at save, once at load)", f"{median['sha256']:.2f}",
             f"{median['sha256']:.2f}", sizes["params"] + sizes["ndarray"]],
            ["read-back check of .params + .states (at save)", f"{median['read_back']:.2f}", "-",
             sizes["params"] + sizes["ndarray"]]]
    text = header_lines(record) + (
        f"{config.network} float16, SGD momentum with float32 master weights; median of "
        f"{config.rounds} round(s); writes flushed to disk\n\n")
    text += markdown_table(["what", "write (s)", "read (s)", "bytes"], rows)
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
