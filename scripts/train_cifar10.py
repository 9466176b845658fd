"""Train a CIFAR-10 classifier, with the defaults of MXNet example's train_cifar10.py.

    python scripts/train_cifar10.py --network resnet --num-layers 110 --batch-size 128 --dtype float16

The network, data and flags are train_imagenet.py's; the defaults are MXNet's CIFAR-10 recipe:
--network resnet --num-layers 110 (the zoo's cifar_resnet110_v2 for 28x28 crops), 10 classes,
data/cifar10_train.rec and data/cifar10_val.rec (make them with MXNet's tools/im2rec.py; nothing is
downloaded), images padded by 4 then randomly cropped and mirrored with hue, saturation and
lightness jitter, lr 0.05 decayed at epochs 200 and 250 of 300.  Bad input prints one "error: ..."
line and exits with code 2.
"""
import sys

from mxfp16.train.cli.config import Cifar10Config
from mxfp16.train.cli.flags import ArgumentParser, add_train_arguments
from mxfp16.train.jobs import train_job
from mxfp16.train.runner import run_job


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_train_arguments(parser, Cifar10Config())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    return run_job(get_args_parser(), Cifar10Config, train_job, argv)


if __name__ == "__main__":
    sys.exit(main())
