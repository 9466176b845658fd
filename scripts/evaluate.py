"""Evaluate a trained model, or benchmark its inference, in float32, float16 and bfloat16.

    python scripts/evaluate.py --checkpoint runs/r50 --data-val val.rec --dtype float32,float16
    python scripts/evaluate.py --model-prefix deploy/r50 --load-epoch 0 --benchmark 1 \
        --dtype float32,float16 --batch-sizes 1,32,64

The model is a training run's checkpoint (--checkpoint PREFIX or PREFIX-NNNN), any MXNet checkpoint
pair or export (--model-prefix PREFIX --load-epoch N), or a zoo network with a parameter file
(--network NAME --params-file FILE).  Data: a .rec file (--data-val), an image folder (--data-dir:
its val/ part or the training run's held-out split) or synthetic images; the preprocessing is the
training run's.  Each --dtype is run and reported side by side (float16 without a GPU: emulated, and
said so); --benchmark measures inference images per second by batch size instead (MXNet's
benchmark_score.py).  The last line is a one-line summary.  Bad input prints one "error: ..." line
and exits with code 2.
"""
import sys

from mxfp16.train.evaluate import EvalConfig, evaluate_job
from mxfp16.train.cli.flags import ArgumentParser
from mxfp16.train.cli.flags_deploy import add_eval_arguments
from mxfp16.train.runner import run_command


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_eval_arguments(parser, EvalConfig())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    return run_command(get_args_parser(), EvalConfig, evaluate_job, argv)


if __name__ == "__main__":
    sys.exit(main())
