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

from mxfp16 import LossScaleCollapse
from mxfp16.config import ArgumentParser, TrainConfig, add_train_arguments
from mxfp16.logs import error_line, run_files, run_logging, summary_line
from mxfp16.training import train


def get_args_parser():
    parser = ArgumentParser(description=__doc__.split("\n\n")[0])
    return add_train_arguments(parser, TrainConfig())


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    try:
        args = get_args_parser().parse_args(argv)
    except SystemExit as exit_request:  # --help, or a usage error already printed
        return exit_request.code
    try:
        config = TrainConfig(**vars(args)).checked()
        log_file, metrics_path = run_files(config.log_file, config.model_prefix)
        with run_logging(log_file):
            record = train(config, metrics_path=metrics_path)
    except (ValueError, OSError, LossScaleCollapse) as error:
        print(error_line(error), file=sys.stderr)
        return 2
    print(summary_line(config.network, config.dtype, config.api, record, config.top_k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
