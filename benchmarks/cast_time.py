"""Time to cast a ResNet-50 graph: mxfp16.cast_symbol against mxnet.contrib.amp.convert_symbol.

Three conversions of the same float32 Symbol (the network applied to ``mx.sym.var('data')`` with a
``SoftmaxOutput`` head): ``mxfp16.cast_symbol(sym, 'float16', emulate=False)`` (the GPU graph),
``mxfp16.cast_symbol(sym, 'float16', emulate=True)`` (the CPU emulation graph) and MXNet's
``amp.convert_symbol(sym, target_dtype='float16')``.  Each is run --repeats times after one untimed
warm-up; the table gives the median and the minimum wall-clock time, the cast nodes each inserts
(``Cast``, ``amp_cast``, ``amp_multicast``) and the graph's node count.  Outputs in --out-dir:
cast_time.md and cast_time.json.

Usage: python benchmarks/cast_time.py [--network resnet50_v1] [--repeats 5] [--quick]
"""
import argparse
import json
import statistics
import sys
import time

import mxnet as mx
from mxnet.contrib import amp

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, publish)
from mxfp16.models import get_network

NAME = "cast_time"

#: Graph ops that convert dtypes: MXNet's Cast and the two casts AMP inserts.
CAST_OPS = ("Cast", "amp_cast", "amp_multicast")

#: Conversion name -> function of the float32 symbol.
CONVERSIONS = {
    "mxfp16.cast_symbol (GPU graph, emulate=False)":
        lambda sym: mxfp16.cast_symbol(sym, "float16", emulate=False),
    "mxfp16.cast_symbol (CPU emulation, emulate=True)":
        lambda sym: mxfp16.cast_symbol(sym, "float16", emulate=True),
    "mxnet.contrib.amp.convert_symbol (target_dtype='float16')":
        lambda sym: amp.convert_symbol(sym, target_dtype="float16"),
}


def network_symbol(network, num_classes):
    """The float32 training graph: the Gluon network on ``data`` plus a SoftmaxOutput head."""
    net = get_network(network, num_classes=num_classes)
    return mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")


def count_ops(sym):
    """(number of cast nodes, number of operator nodes) of a Symbol."""
    # tojson() hides amp_cast nodes unless told not to.
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    ops = [node["op"] for node in graph["nodes"] if node["op"] != "null"]
    return sum(op in CAST_OPS for op in ops), len(ops)


def time_conversion(convert, sym, repeats):
    """Wall-clock seconds of ``repeats`` conversions after one warm-up, and the converted graph."""
    converted = convert(sym)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        convert(sym)
        times.append(time.perf_counter() - start)
    return times, converted


def measure(sym, repeats):
    baseline_casts, baseline_ops = count_ops(sym)
    rows = []
    for name, convert in CONVERSIONS.items():
        times, converted = time_conversion(convert, sym, repeats)
        casts, ops = count_ops(converted)
        rows.append({"conversion": name, "median_s": statistics.median(times), "min_s": min(times),
                     "times_s": times, "casts_inserted": casts - baseline_casts, "graph_ops": ops})
    return rows, baseline_ops


def markdown(rows, baseline_ops):
    header = ["conversion", "median s", "min s", "casts inserted", "graph ops (float32: "
              f"{baseline_ops})"]
    table = [[row["conversion"], f"{row['median_s']:.3f}", f"{row['min_s']:.3f}",
              row["casts_inserted"], row["graph_ops"]] for row in rows]
    return markdown_table(header, table)


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--network", default="resnet50_v1", help="(default: resnet50_v1)")
    parser.add_argument("--num-classes", type=int, default=1000, help="(default: 1000)")
    parser.add_argument("--repeats", type=int, default=5, help="timed runs each (default: 5)")
    return add_output_arguments(parser, "the .md and .json",
                                "resnet18_v1, 10 classes, 1 repeat")


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    args = get_args_parser().parse_args(argv)
    if args.quick:
        args.network, args.num_classes, args.repeats = "resnet18_v1", 10, 1
    if args.repeats < 1:
        print(f"error: --repeats must be >= 1, got {args.repeats}", file=sys.stderr)
        return 2
    try:
        sym = network_symbol(args.network, args.num_classes)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rows, baseline_ops = measure(sym, args.repeats)
    record = {"benchmark": NAME, "command": command_line(NAME, argv), "machine": machine_info(),
              "config": {"network": args.network, "num_classes": args.num_classes,
                         "repeats": args.repeats}, "float32_graph_ops": baseline_ops,
              "results": rows}
    text = header_lines(record) + f"Network: {args.network}\n\n" + markdown(rows, baseline_ops)
    publish(args.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
