"""Train a model-zoo image classifier in float32, float16 or bfloat16, with Gluon or Module.

    python scripts/train_imagenet.py --dtype float16 --benchmark 1 --network resnet50_v1 \
        --image-shape 3,64,64 --batch-size 16 --max-batches 20 --num-epochs 1

Data: RecordIO files (--data-train/--data-val, ImageNet augmentation), an image folder (--data-dir,
one sub-folder per class), or synthetic data (--benchmark 1, or no data flag).  The flags are those of
MXNet's example/image-classification and GluonCV's train_imagenet.py.  Logs go to the console and to
train.log next to --model-prefix (with metrics.jsonl); checkpoints are MXNet's own files plus a JSON
file, and --resume continues one.  The last line is a one-line summary.  Bad input (data, flags,
checkpoints) prints one "error: ..." line and exits with code 2.
"""
import sys

from mxfp16.train.cli.config import TrainConfig
from mxfp16.train.cli.flags import ArgumentParser, add_train_arguments
from mxfp16.train.jobs import train_job
from mxfp16.train.runner import run_job


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_train_arguments(parser, TrainConfig())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    return run_job(get_args_parser(), TrainConfig, train_job, argv)


if __name__ == "__main__":
    sys.exit(main())
