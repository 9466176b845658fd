"""How far mxfp16's CPU emulation of a float16 LSTM is from what a GPU computes, and from float32.

On a GPU, MXNet 1.9.1's float16 ``RNN`` op calls cuDNN with float16 data (inputs, weights, outputs,
begin and final states) and float32 math precision, cuDNN's "pseudo-half" configuration (MXNet
passes CUDNN_DATA_FLOAT as the RNN descriptor's mathPrec for float16 data with cuDNN 7.5 or later,
apache/mxnet#16670): the gate GEMMs accumulate in float32 and the gate nonlinearities run in
float32, while each step's output h is written to the float16 output tensor, which the next layer
reads (and, as far as cuDNN's documentation tells, the next step's recurrent GEMM).  Where cuDNN
keeps the cell state c between steps is not documented; the reference below rounds it to float16
(the worse case).  MXNet's CPU ``RNN`` op has no float16 kernel, so mxfp16 emulates
the fused op at its boundary: inputs, weights, begin states, outputs and final states are rounded
to float16, and the recurrence in between runs in float32, hidden and cell state included.

This benchmark measures what that leaves out.  For a multi-layer LSTM it compares, against float32:

* ``emulated``: ``mxfp16.cast_block(lstm, 'float16')`` on the CPU (mxfp16's emulation);
* ``per-step``: the same weights as ``gluon.rnn.LSTMCell``s unrolled step by step, with float16
  inputs and weights, and each step's hidden and cell state rounded to float16, gates in float32;
* ``unrolled, no rounding``: those cells in float32, to show the reference is the fused layer;

and reports the relative error of the outputs and final states of each, and between the emulation
and the per-step reference.

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


def round_f16(array):
    """Round an NDArray to float16 and back to float32."""
    return array.astype("float16").astype("float32")


def unrolled_cells(layer, layers, hidden):
    """One ``gluon.rnn.LSTMCell`` per layer of the fused ``layer``, with its weights."""
    params = {name[len(layer.prefix):]: p.data() for name, p in layer.collect_params().items()}
    cells = []
    for index in range(layers):
        cell = rnn.LSTMCell(hidden, input_size=hidden)
        cell.initialize()
        for name, param in cell.collect_params().items():
            param.set_data(params[f"l{index}_{name[len(cell.prefix):]}"])
        cells.append(cell)
    return cells


def run_unrolled(cells, x, per_step_rounding):
    """The LSTM step by step; with ``per_step_rounding`` the inputs and weights are float16 values
    and each step's hidden and cell state are rounded to float16 (what cuDNN stores between steps),
    while the gates are computed in float32 (float32 accumulation, float32 nonlinearities)."""
    keep = round_f16 if per_step_rounding else (lambda array: array)
    seq = [keep(x[step]) for step in range(x.shape[0])]
    finals = []
    for cell in cells:
        if per_step_rounding:
            for param in cell.collect_params().values():
                param.set_data(round_f16(param.data()))
        h = c = mx.nd.zeros((x.shape[1], cell._hidden_size))
        outputs = []
        for step_input in seq:
            _, (h, c) = cell(step_input, [h, c])
            h, c = keep(h), keep(c)
            outputs.append(h)
        seq = outputs
        finals.append((h, c))
    return (mx.nd.stack(*seq).asnumpy(), mx.nd.stack(*[h for h, _ in finals]).asnumpy(),
            mx.nd.stack(*[c for _, c in finals]).asnumpy())


def relative(a, b):
    """Max and mean |a - b| over the largest |b|."""
    scale = float(np.abs(b).max()) or 1.0
    diff = np.abs(np.asarray(a) - np.asarray(b))
    return float(diff.max()) / scale, float(diff.mean()) / scale


#: The computations compared with float32, and the pair compared with each other.
COMPARED = ("emulated", "per-step", "unrolled, no rounding")
PAIR = "emulated vs per-step"


def one_seed(config, seed):
    mx.random.seed(seed)
    rng = np.random.RandomState(seed)
    layer = rnn.LSTM(config.hidden, num_layers=config.layers, input_size=config.hidden)
    layer.initialize(mx.init.Uniform(1.0 / np.sqrt(config.hidden)))
    x = mx.nd.array(rng.uniform(-1, 1, (config.seq_len, config.batch_size, config.hidden)))
    begin = layer.begin_state(config.batch_size)
    out32, (h32, c32) = layer(x, begin)
    float32 = (out32.asnumpy(), h32.asnumpy(), c32.asnumpy())
    # the unrolled cells copy float32's weights before the cast rounds the layer's in place
    plain = run_unrolled(unrolled_cells(layer, config.layers, config.hidden), x, False)
    per_step = run_unrolled(unrolled_cells(layer, config.layers, config.hidden), x, True)
    out16, (h16, c16) = mxfp16.cast_block(layer, "float16")(x, begin)
    emulated = (out16.asnumpy(), h16.asnumpy(), c16.asnumpy())
    results = dict(zip(COMPARED, (emulated, per_step, plain)))
    rows = {label: compare(result, float32) for label, result in results.items()}
    rows[PAIR] = compare(emulated, per_step)
    return rows


def compare(result, reference):
    return {part: relative(a, b) for part, a, b in zip(("output", "h", "c"), result, reference)}


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
    for label in COMPARED + (PAIR,):
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
