"""Fine-tune a pretrained float32 network in float16 on a new dataset.

    python scripts/fine_tune.py --network resnet50_v1 --num-classes 101 \
        --data-dir ~/data/101_ObjectCategories --image-shape 3,224,224 --batch-size 32

The network is --network's pretrained zoo weights (from --model-root, ~/.mxnet/models; nothing is
downloaded when they are there), or an MXNet checkpoint (--pretrained-model PREFIX --load-epoch N: a
Module checkpoint, a Gluon export or a checkpoint of train_imagenet.py).  Its classifier is replaced
for --num-classes; --freeze-backbone trains the new classifier only, --lr-mult scales the learning
rate of the pretrained layers.  Data, training and checkpoint flags are train_imagenet.py's.  Bad
input prints one "error: ..." line and exits with code 2.
"""
import sys

from mxfp16.train.cli.config import FineTuneConfig
from mxfp16.train.jobs import fine_tune_job
from mxfp16.train.cli.flags import ArgumentParser, add_fine_tune_arguments
from mxfp16.train.runner import run_job


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_fine_tune_arguments(parser, FineTuneConfig())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    return run_job(get_args_parser(), FineTuneConfig, fine_tune_job, argv)


if __name__ == "__main__":
    sys.exit(main())
