"""Report how a network will train in float16: Tensor Core eligibility, precision map, memory,
estimated GPU speed-up and activation-gradient underflow.

    python scripts/report.py --network resnet50_v1 --image-shape 3,224,224 --batch-size 256 \\
        --gpu-mem 16GiB --json report.json --markdown report.md --plots plots/

prints the report and writes it as JSON, Markdown and PNG plots when asked.  ``--compare float16``
adds every layer in float16 against float32 (``mxfp16.compare_precision``), with its plot of the
error by layer (``error_by_layer.png``).  ``--checkpoint PREFIX
--epoch N`` reports on a saved network instead (``mx.model.save_checkpoint`` or Gluon ``export``
files).  A sequence model reads token ids: ``--network lstm_lm`` is a built-in LSTM language model
(``--vocab-size``, ``--embed-size``, ``--hidden-size``, ``--num-layers``, ``--seq-len``), and a
checkpoint of one needs ``--seq-len``.  Errors in the input print one ``error: ...`` line and exit
with code 2.

    python scripts/report.py --network lstm_lm --vocab-size 33278 --batch-size 32 --seq-len 35
"""
import argparse
import sys

import mxnet as mx

from mxfp16.report import (ReportConfig, build_report, parse_shape, parse_size, render_text,
                           save_report)
from mxfp16.report.memory import OPTIMIZER_STATES
from mxfp16.report.sequence import LSTM_LM_SIZES
from mxfp16.report.speedup import GPU_SPECS
from mxfp16.report.underflow import DEFAULT_HEADROOM


class _OneLineParser(argparse.ArgumentParser):
    """Reports bad arguments as a ValueError, so main prints them as one line."""

    def error(self, message):
        raise ValueError(message)


def get_args_parser():
    """The command line: flags in the MXNet examples' style, each with its default."""
    parser = _OneLineParser(description=__doc__.split("\n\n")[0])
    add = parser.add_argument
    add("--network", default="resnet50_v1",
        help="model-zoo name, or lstm_lm for an LSTM language model (default: resnet50_v1)")
    add("--num-classes", type=int, default=1000, help="classes of a zoo network (default: 1000)")
    add("--checkpoint", help="checkpoint prefix: PREFIX-symbol.json + PREFIX-NNNN.params; replaces "
                             "--network (default: none)")
    add("--epoch", type=int, default=0, help="checkpoint epoch (default: 0)")
    add("--image-shape", default="3,224,224", help="channels,height,width (default: 3,224,224)")
    add("--batch-size", type=int, default=256, help="batch size per GPU (default: 256)")
    add("--seq-len", type=int, help="time steps of a sequence model's token ids; replaces "
                                    "--image-shape (default: 35 for lstm_lm, else none)")
    for flag, default in LSTM_LM_SIZES.items():
        add(f"--{flag.replace('_', '-')}", type=int,
            help=f"{flag.replace('_', ' ')} of lstm_lm (default: {default})")
    add("--gpu", default=",".join(GPU_SPECS),
        help=f"GPUs to estimate, comma-separated, from {', '.join(GPU_SPECS)} (default: all)")
    add("--gpu-mem", help="GPU memory for the largest batch, e.g. 16GiB, 40G, 80GB "
                          "(default: that of the first --gpu)")
    add("--optimizer", default="sgd", help=f"optimizer for the memory estimate, one of "
                                           f"{', '.join(OPTIMIZER_STATES)} (default: sgd)")
    add("--underflow-steps", type=int, default=3,
        help="training steps of the gradient histogram under CPU emulation, 0 skips it (default: 3)")
    add("--underflow-batch-size", type=int, default=8,
        help="batch size of those steps (default: 8)")
    add("--headroom", type=float, default=DEFAULT_HEADROOM,
        help=f"factor kept below 65504 by the recommended loss scale (default: {DEFAULT_HEADROOM:g})")
    add("--compare", choices=("float16", "bfloat16"),
        help="compare every layer in this dtype with float32 on one batch of random data, "
             "written to --json and --plots (error_by_layer.png) (default: none)")
    add("--compare-batch-size", type=int, default=8,
        help="batch size of that comparison (default: 8)")
    add("--compare-tolerance", type=float,
        help="largest relative error of a layer in that comparison (default: 0.02 for float16, "
             "0.1 for bfloat16)")
    add("--seed", type=int, default=0, help="seed of the random data and weights (default: 0)")
    add("--json", help="write the report as JSON to this file (default: none)")
    add("--markdown", help="write the report as Markdown to this file (default: none)")
    add("--plots", help="write PNG plots into this directory (default: none)")
    return parser


def config_from_args(args):
    """The :class:`ReportConfig` of parsed arguments (sizes and shapes parsed, errors as ValueError)."""
    return ReportConfig(
        network=args.network, checkpoint=args.checkpoint, epoch=args.epoch,
        num_classes=args.num_classes, image_shape=parse_shape(args.image_shape),
        batch_size=args.batch_size, gpus=tuple(args.gpu.split(",")),
        gpu_bytes=parse_size(args.gpu_mem) if args.gpu_mem else None, optimizer=args.optimizer,
        underflow_steps=args.underflow_steps, underflow_batch_size=args.underflow_batch_size,
        headroom=args.headroom, seed=args.seed, seq_len=args.seq_len, vocab_size=args.vocab_size,
        embed_size=args.embed_size, hidden_size=args.hidden_size, num_layers=args.num_layers,
        compare=args.compare, compare_batch_size=args.compare_batch_size,
        compare_tolerance=args.compare_tolerance)


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    try:
        args = get_args_parser().parse_args(argv)
        report = build_report(config_from_args(args))
        print(render_text(report))
        for path in save_report(report, args.json, args.markdown, args.plots):
            print(f"wrote {path}")
    except (ValueError, TypeError, OSError, mx.base.MXNetError) as error:
        message = " ".join(str(error).split())
        print(f"error: {message}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
