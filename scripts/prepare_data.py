"""Pack an image folder into train/val RecordIO files for training, as MXNet's tools/im2rec.py does.

    python scripts/prepare_data.py ~/data/101_ObjectCategories data/caltech101 --resize 256

writes ``train.{lst,rec,idx}``, ``val.{lst,rec,idx}`` and ``classes.txt`` into the output directory.
The folder holds one sub-folder of images per class (Caltech-101/256), or ``train/`` and ``val/``
folders of such sub-folders (ImageNet), which are then the split.  Files that are not images or cannot
be decoded are logged and skipped.  Errors in the input print one ``error: ...`` line and exit with
code 2; existing output files are only replaced by a complete new result.
"""
import argparse
import logging
import sys

from mxfp16.train.data import DataError
from mxfp16.train.prepare import DEFAULT_QUALITY, DEFAULT_TRAIN_RATIO, prepare_dataset


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("root", help="image folder: one sub-folder per class, or train/ and val/ "
                                     "folders of such sub-folders")
    parser.add_argument("out_dir", help="output directory (created if needed)")
    parser.add_argument("--resize", type=int, default=0,
                        help="resize the shorter side to this many pixels, 0 keeps the size "
                             "(default: 0)")
    parser.add_argument("--quality", type=int, default=DEFAULT_QUALITY,
                        help=f"JPEG quality of the stored images, 1..100 (default: {DEFAULT_QUALITY})")
    parser.add_argument("--train-ratio", type=float, default=DEFAULT_TRAIN_RATIO,
                        help="fraction of each class used for training, the rest is validation; "
                             f"unused with train/ and val/ folders (default: {DEFAULT_TRAIN_RATIO})")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed of the split and of the record order (default: 0)")
    return parser


def main(argv=None):
    """Run the script; return the exit code (0, or 2 on a user error)."""
    args = get_args_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s: %(message)s")
    try:
        prepared = prepare_dataset(args.root, args.out_dir, resize=args.resize, quality=args.quality,
                                   train_ratio=args.train_ratio, seed=args.seed,
                                   progress=sys.stderr.isatty())
    except (DataError, OSError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(prepared.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
