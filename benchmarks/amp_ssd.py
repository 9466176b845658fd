"""GluonCV's SSD under MXNet AMP's API: casts per step in the GPU graph (MXNet AMP against
``mxfp16.amp``), and the step time of ``mxfp16.amp`` in emulated float16 and in bfloat16 against
float32 on this CPU.

Casts: the SSD network's training graph (``net(mx.sym.var('data'))`` in training mode) as MXNet
AMP builds it after ``mxnet.contrib.amp.init()`` (in a child process: AMP's ``init`` cannot be
undone) and as ``mxfp16.amp`` casts it for a GPU (:func:`mxfp16.cast_symbol`, ``emulate=False``,
the graph ``amp.init`` + ``init_trainer`` give the network).  Each cast node runs once per forward
pass and once more in the backward pass; the table splits the casts of parameters (every weight,
every step, under AMP's float32 weights) from the casts of activations.

Step time: the MXNet AMP tutorial's loop (synthetic images and targets, ``SSDMultiBoxLoss``,
``Trainer(update_on_kvstore=False)``, ``amp.init_trainer``, ``amp.scale_loss``, ``step(1)``) in
float32 (no AMP calls, as the script without ``--amp``), float16 (``amp.init()``, emulated on a
CPU) and bfloat16 (``amp.init(target_dtype='bfloat16')``), interleaved over --rounds rounds; the
median of the timed steps of each round, and the ratio to float32 of the same round.

Usage: python benchmarks/amp_ssd.py [--network ssd_300_mobilenet0.25_voc] [--size 300]
       [--batch-size 4] [--steps 4] [--warmup 2] [--rounds 3] [--quick]
"""
import argparse
import json
import statistics
import subprocess
import sys
import time
import warnings

import mxnet as mx
from mxnet import autograd, gluon

from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, publish)

NAME = "amp_ssd"

#: Graph ops that convert dtypes: MXNet's Cast and the two casts AMP inserts.
CAST_OPS = ("Cast", "amp_cast", "amp_multicast")

#: The dtypes timed, float32 first: each round runs them in this order.
DTYPES = ("float32", "float16", "bfloat16")


def ssd(network):
    from gluoncv.model_zoo import get_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = get_model(network, pretrained_base=False, norm_layer=gluon.nn.BatchNorm)
        net.initialize()
    return net


def training_graph(net):
    with autograd.train_mode():
        return mx.sym.Group(list(net(mx.sym.var("data"))))


def count_casts(sym):
    """``{'casts': n, 'parameter_casts': n}``: cast nodes, and those whose input is a parameter."""
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    params = {i for i, node in enumerate(nodes) if node["op"] == "null" and node["name"] != "data"}
    casts = [node for node in nodes if node["op"] in CAST_OPS]
    on_params = sum(sum(entry[0] in params for entry in node["inputs"]) for node in casts)
    return {"casts": len(casts), "parameter_casts": on_params,
            "ops": sum(node["op"] != "null" for node in nodes)}


def mxnet_amp_casts(network):
    """The counts for MXNet AMP's graph, from a child process (``--count-mxnet-amp``)."""
    result = subprocess.run([sys.executable, __file__, "--count-mxnet-amp", network],
                            capture_output=True, text=True, check=True)
    return json.loads(result.stdout.strip().splitlines()[-1])


def _count_mxnet_amp(network):
    from mxnet.contrib import amp
    amp.init()
    print(json.dumps(count_casts(training_graph(ssd(network)))))
    return 0


def mxfp16_casts(network):
    import mxfp16
    sym = training_graph(ssd(network))
    return count_casts(mxfp16.cast_symbol(sym, "float16", emulate=False)), count_casts(sym)


def synthetic_batch(net, size, batch_size):
    with autograd.train_mode():
        num_anchors = net(mx.nd.zeros((1, 3, size, size)))[2].shape[1]
    return [mx.nd.random.uniform(-1, 1, (batch_size, 3, size, size)),
            mx.nd.random.randint(0, 2, (batch_size, num_anchors)).astype("float32"),
            mx.nd.random.uniform(0, 1, (batch_size, num_anchors, 4))]


def step_times(network, dtype, size, batch_size, steps, warmup):
    """Median seconds of a training step of the tutorial's loop in ``dtype``."""
    import gluoncv as gcv
    from mxfp16 import amp
    mx.random.seed(0)
    if dtype != "float32":
        amp.init(target_dtype=dtype)
    try:
        net = ssd(network)
        batch = synthetic_batch(net, size, batch_size)
        net.hybridize(static_alloc=True, static_shape=True)
        trainer = gluon.Trainer(net.collect_params(), "sgd",
                                {"learning_rate": 0.001, "wd": 0.0005, "momentum": 0.9},
                                update_on_kvstore=False)
        if dtype != "float32":
            amp.init_trainer(trainer)
        mbox_loss = gcv.loss.SSDMultiBoxLoss()
        times = []
        for index in range(warmup + steps):
            start = time.perf_counter()
            with autograd.record():
                cls_pred, box_pred, _ = net(batch[0])
                sum_loss, _, _ = mbox_loss([cls_pred], [box_pred], [batch[1]], [batch[2]])
                if dtype == "float32":
                    autograd.backward(sum_loss)
                else:
                    with amp.scale_loss(sum_loss, trainer) as scaled_loss:
                        autograd.backward(scaled_loss)
            trainer.step(1)
            mx.nd.waitall()
            if index >= warmup:
                times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        amp.reset()


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="ssd_300_mobilenet0.25_voc",
                        help="a GluonCV SSD (default: ssd_300_mobilenet0.25_voc)")
    parser.add_argument("--size", type=int, default=300, help="image side (default: 300)")
    parser.add_argument("--batch-size", type=int, default=4, help="(default: 4)")
    parser.add_argument("--steps", type=int, default=4, help="timed steps (default: 4)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (default: 2)")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default: 3)")
    parser.add_argument("--count-mxnet-amp", metavar="NETWORK", help=argparse.SUPPRESS)
    return add_output_arguments(parser, "the .md and .json",
                                "size 96, batch 1, 1 step after 1 warm-up, 1 round")


def markdown(casts, rounds):
    cast_rows = [[name, row["casts"], row["parameter_casts"],
                  row["casts"] - row["parameter_casts"], row["ops"]]
                 for name, row in casts.items()]
    text = markdown_table(["training graph (GPU)", "cast nodes", "on parameters",
                           "on activations", "graph ops"], cast_rows)
    time_rows = []
    for dtype in DTYPES:
        seconds = [r[dtype] for r in rounds]
        ratios = [r[dtype] / r["float32"] for r in rounds]
        time_rows.append([dtype, f"{statistics.median(seconds):.3f}",
                          f"{statistics.median(ratios):.2f}",
                          ", ".join(f"{ratio:.2f}" for ratio in ratios)])
    return text + "\n\n" + markdown_table(
        ["dtype (mxfp16.amp on this CPU)", "step s (median)", "÷ float32 (median)",
         "÷ float32 per round"], time_rows)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args_parser().parse_args(argv)
    if args.count_mxnet_amp:
        return _count_mxnet_amp(args.count_mxnet_amp)
    if args.quick:
        args.size, args.batch_size, args.steps, args.warmup, args.rounds = 96, 1, 1, 1, 1
    if min(args.steps, args.rounds, args.batch_size) < 1 or args.warmup < 0:
        print("error: --steps, --rounds and --batch-size must be >= 1 and --warmup >= 0",
              file=sys.stderr)
        return 2
    ours, float32 = mxfp16_casts(args.network)
    casts = {"float32 (no casts)": float32, "MXNet AMP (mxnet.contrib.amp.init)":
             mxnet_amp_casts(args.network), "mxfp16.amp (amp.init, emulate=False)": ours}
    rounds = [{dtype: step_times(args.network, dtype, args.size, args.batch_size, args.steps,
                                 args.warmup) for dtype in DTYPES} for _ in range(args.rounds)]
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": {key: getattr(args, key) for key in
                         ("network", "size", "batch_size", "steps", "warmup", "rounds")},
              "casts": casts, "rounds": rounds}
    text = header_lines(record) + f"Network: {args.network}\n\n" + markdown(casts, rounds)
    publish(args.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
