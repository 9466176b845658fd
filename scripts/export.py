"""Export a trained model for deployment: plain MXNet float32, float16 for GPUs, ONNX.

    python scripts/export.py --checkpoint runs/r50 --output deploy/r50 --dtype float32,float16 --onnx

The model is a training run's checkpoint (--checkpoint PREFIX or PREFIX-NNNN), an MXNet checkpoint
pair (--model-prefix PREFIX --load-epoch N) or a zoo network with a parameter file (--network NAME
--params-file FILE).  Written under --output PREFIX: PREFIX-symbol.json + PREFIX-0000.params (the
float32 graph and float32 master weights, for plain MXNet without mxfp16), PREFIX-float16-... (the
float16 GPU graph, every parameter in its dtype), PREFIX.onnx (--onnx, needs onnx<1.19) and
PREFIX-preprocessing.json (resize, crop, mean and std as trained).  Every file is checked after
writing (--onnxruntime-python runs the ONNX file in onnxruntime's own venv).  The last line is a
one-line summary.  Bad input prints one "error: ..." line and exits with code 2.
"""
import sys

from mxfp16.train.deploy import ExportConfig, export_job
from mxfp16.train.cli.flags import ArgumentParser
from mxfp16.train.cli.flags_deploy import add_export_arguments
from mxfp16.train.runner import run_command


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_export_arguments(parser, ExportConfig())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    return run_command(get_args_parser(), ExportConfig, export_job, argv)


if __name__ == "__main__":
    sys.exit(main())
