"""How far mxfp16's CPU emulation of a float16 LSTM is from what a GPU computes, and from float32.

On a GPU, MXNet 1.9.1's float16 ``RNN`` op runs cuDNN with float16 data: inputs, weights, outputs
and the hidden and cell states between time steps are stored in float16, while the gate GEMMs
accumulate in float32 (Tensor Cores; the op asks cuDNN for float32 math precision) and the gate
nonlinearities run in float32.  MXNet's CPU ``RNN`` op has no float16 kernel, so mxfp16 emulates the
fused op at its boundary: inputs, weights, begin states, outputs and final states are rounded to
float16, and the recurrence in between runs in float32, hidden and cell state included.

This benchmark measures what that leaves out.  For a 2-layer LSTM it compares, against float32:

* ``emulated``: ``mxfp16.cast_block(lstm, 'float16')`` on the CPU (mxfp16's emulation);
* ``per-step``: a reference computed here in numpy that also rounds each time step's hidden and
  cell state to float16 (what cuDNN stores between steps), with float32 gate arithmetic;

and reports the relative error of the outputs and final states of each, and between the two.

Outputs in --out-dir: rnn_emulation_error.md and .json.

Usage: python benchmarks/rnn_emulation_error.py [--hidden 256] [--layers 2] [--seq-len 35]
       [--batch-size 16] [--seeds 0,1,2] [--quick]
"""
import argparse
import statistics
import sys

import mxnet as mx
import numpy as np
from mxnet.gluon import rnn

import mxfp16
from bench_common import (add_output_arguments, command_line, header_lines, machine_info,
                          markdown_table, parse_config, publish, require_positive)

NAME = "rnn_emulation_error"


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=256, help="hidden and input size (default: 256)")
    parser.add_argument("--layers", type=int, default=2, help="default: 2")
    parser.add_argument("--seq-len", type=int, default=35, help="default: 35")
    parser.add_argument("--batch-size", type=int, default=16, help="default: 16")
    parser.add_argument("--seeds", default="0,1,2", help="default: 0,1,2")
    add_output_arguments(parser, "the .md and .json", "hidden 32, 8 steps, one seed")
    return parser


def make_config(args):
    require_positive(args, ("hidden", "layers", "seq_len", "batch_size"))
    try:
        args.seeds = [int(seed) for seed in args.seeds.split(",")]
    except ValueError:
        raise ValueError(f"--seeds {args.seeds!r}: give integers separated by commas, e.g. 0,1,2") \
            from None
    if args.quick:
        args.hidden, args.seq_len, args.seeds = 32, 8, [0]
    return args


def f16(array):
    return np.asarray(array, dtype=np.float32).astype(np.float16).astype(np.float32)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def per_step_reference(x, params, layers, hidden):
    """The LSTM with float16 inputs, weights and per-step states, float32 gate arithmetic."""
    seq = f16(x)
    states = []
    for layer in range(layers):
        w_x, w_h = f16(params[f"l{layer}_i2h_weight"]), f16(params[f"l{layer}_h2h_weight"])
        bias = f16(params[f"l{layer}_i2h_bias"]) + f16(params[f"l{layer}_h2h_bias"])
        h = np.zeros((seq.shape[1], hidden), np.float32)
        c = np.zeros_like(h)
        outputs = []
        for step in range(seq.shape[0]):
            gates = seq[step] @ w_x.T + h @ w_h.T + bias  # float32 accumulation
            i, f, g, o = np.split(gates, 4, axis=1)  # MXNet's gate order: in, forget, cell, out
            c = f16(sigmoid(f) * c + sigmoid(i) * np.tanh(g))
            h = f16(sigmoid(o) * np.tanh(c))
            outputs.append(h)
        seq = np.stack(outputs)
        states.append((h, c))
    return seq, np.stack([h for h, _ in states]), np.stack([c for _, c in states])


def relative(a, b):
    """Max and mean |a - b| over the largest |b|."""
    scale = float(np.abs(b).max()) or 1.0
    diff = np.abs(np.asarray(a) - np.asarray(b))
    return float(diff.max()) / scale, float(diff.mean()) / scale


def one_seed(config, seed):
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    layer = rnn.LSTM(config.hidden, num_layers=config.layers, input_size=config.hidden)
    layer.initialize(mx.init.Uniform(1.0 / np.sqrt(config.hidden)))
    x = mx.nd.array(rng.uniform(-1, 1, (config.seq_len, config.batch_size, config.hidden)))
    begin = layer.begin_state(config.batch_size)
    out32, (h32, c32) = layer(x, begin)
    params = {name[len(layer.prefix):]: p.data().asnumpy()
              for name, p in layer.collect_params().items()}
    ref_out, ref_h, ref_c = per_step_reference(x.asnumpy(), params, config.layers, config.hidden)
    emulated = mxfp16.cast_block(layer, "float16")
    out16, (h16, c16) = emulated(x, begin)
    rows = {}
    for label, (out, h, c) in (("emulated", (out16, h16, c16)),
                               ("per-step", (ref_out, ref_h, ref_c))):
        out, h, c = (a.asnumpy() if isinstance(a, mx.nd.NDArray) else a for a in (out, h, c))
        rows[label] = {"output": relative(out, out32.asnumpy()), "h": relative(h, h32.asnumpy()),
                       "c": relative(c, c32.asnumpy())}
    rows["emulated vs per-step"] = {"output": relative(out16.asnumpy(), ref_out),
                                    "h": relative(h16.asnumpy(), ref_h),
                                    "c": relative(c16.asnumpy(), ref_c)}
    return rows


def main(argv=None):
    config, error = parse_config(get_args_parser(), make_config, argv)
    if error:
        return error
    seeds = {seed: one_seed(config, seed) for seed in config.seeds}
    record = {"benchmark": NAME, "command": command_line(NAME, argv if argv is not None
                                                          else sys.argv[1:]),
              "machine": machine_info(), "hidden": config.hidden, "layers": config.layers,
              "seq_len": config.seq_len, "batch_size": config.batch_size,
              "seeds": {str(seed): rows for seed, rows in seeds.items()}}
    rows = []
    for label in ("emulated", "per-step", "emulated vs per-step"):
        for part in ("output", "h", "c"):
            worst = max(seeds[s][label][part][0] for s in seeds)
            mean = statistics.mean(seeds[s][label][part][1] for s in seeds)
            rows.append([label, part, f"{worst:.2e}", f"{mean:.2e}"])
    text = header_lines(record) + (
        f"LSTM, {config.layers} layers of {config.hidden}, {config.seq_len} steps, batch "
        f"{config.batch_size}, seeds {config.seeds}: error relative to the largest value "
        "(against float32 unless named)\n\n")
    text += markdown_table(["computation", "tensor", "max rel. error", "mean rel. error"], rows)
    publish(config.out_dir, NAME, text, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
