"""Choosing the data of a run: RecordIO files, an image folder or synthetic data, labels checked.

Every source is an ``mx.io.DataIter`` yielding float32 batches of exactly ``batch_size`` (see
:mod:`mxfp16.train.data.base`), so both APIs consume the same objects.
"""
import dataclasses
import logging
import math
from dataclasses import dataclass

import mxnet as mx

from .base import CROP_RATIO, DataError, check_labels, synthetic_iter
from .folders import folder_iters, split_image_folder
from .image_check import bad_images
from .recordio import check_record_file, record_iter

log = logging.getLogger("mxfp16.train")


@dataclass
class TrainData:
    """The data of a run: iterators (labels checked) and the batches trained per epoch."""

    train: mx.io.DataIter
    val: object
    batches_per_epoch: int
    description: str


def load_data(*, batch_size, image_shape, num_classes, data_train=None, data_train_idx=None,
              data_val=None, data_val_idx=None, data_dir=None, val_fraction=0.2, synthetic=False,
              num_examples=1281167, num_threads=4, num_parts=1, part_index=0, seed=0,
              max_batches=0, augmentation=None, crop_ratio=CROP_RATIO, num_workers=0,
              shard_val=False, skip_bad_images=False):
    """The training and validation data chosen by the data flags.

    RecordIO files (``data_train``, ``data_val``) are read by ``ImageRecordIter`` with the ImageNet
    augmentation, sharded over ``num_parts`` workers; an image folder (``data_dir``) by Gluon
    transforms with a seeded split; ``synthetic`` data is one random batch served
    ``num_examples // batch_size`` times, validated on that same batch.  Every label is checked to
    be in ``[0, num_classes)``.  ``augmentation`` (an
    :class:`~mxfp16.train.data.augmentation.Augmentation`, default: the ImageNet recipe) and
    ``crop_ratio`` (validation centre crop) apply to files and folders alike.  ``num_threads``
    decode ``.rec`` files; ``num_workers`` processes decode an image folder (0: this process).
    ``shard_val`` shards the validation data of files and folders like the training data (a
    Horovod rank validates its part and the counts are summed).  An image folder's files are
    checked first (:mod:`~mxfp16.train.data.image_check`): one that is not a whole JPEG/PNG file is
    an error, or, with ``skip_bad_images``, left out with a counted warning.

    Returns
    -------
    TrainData

    Raises
    ------
    mxfp16.train.data.DataError
        For a missing, unreadable or corrupt file, an empty folder or class folder, or (while
        iterating) a label outside ``[0, num_classes)``.

    Examples
    --------
    >>> data = load_data(batch_size=4, image_shape=(3, 8, 8), num_classes=10, synthetic=True,
    ...                  num_examples=12)
    >>> data.batches_per_epoch, len(list(data.train)), data.description
    (3, 3, 'synthetic data')
    """
    if synthetic:
        loaded = _synthetic_data(batch_size, image_shape, num_classes, num_examples, seed + part_index)
    elif data_dir:
        loaded = _folder_data(data_dir, batch_size, image_shape, num_classes, val_fraction, seed,
                              num_parts, part_index, augmentation=augmentation,
                              crop_ratio=crop_ratio, num_workers=num_workers, shard_val=shard_val,
                              skip_bad_images=skip_bad_images)
    else:
        loaded = _record_data(data_train, data_train_idx, data_val, data_val_idx, batch_size,
                              image_shape, num_threads, num_parts, part_index, seed,
                              augmentation=augmentation, crop_ratio=crop_ratio,
                              shard_val=shard_val)
    batches = min(loaded.batches_per_epoch, max_batches or loaded.batches_per_epoch)
    val = check_labels(loaded.val, num_classes) if loaded.val is not None else None
    return TrainData(check_labels(loaded.train, num_classes), val, batches,
                     loaded.description)


def _synthetic_data(batch_size, image_shape, num_classes, num_examples, seed):
    num_batches = max(num_examples // batch_size, 1)
    train = synthetic_iter(batch_size, image_shape, num_classes, num_batches, seed=seed)
    val = synthetic_iter(batch_size, image_shape, num_classes, 1, seed=seed)
    return TrainData(train, val, num_batches, "synthetic data")


def _screened(root, split, skip_bad_images):
    """The images of ``split`` to leave out (see :func:`load_data`)."""
    items = split.train + split.val
    bad = bad_images([path for path, _ in items])
    if not bad:
        return frozenset()
    example = f"{bad[0][0]} {bad[0][1]}"
    if not skip_bad_images:
        raise DataError(f"{len(bad)} of the {len(items)} images of {root} are not whole JPEG/PNG "
                        f"files ({example}{', ...' if len(bad) > 1 else ''}): remove or replace "
                        "them, or pass --skip-bad-images to leave them out")
    log.warning("--skip-bad-images: left out %d of the %d images of %s, which are not whole "
                "JPEG/PNG files (%s%s)", len(bad), len(items), root, example,
                ", ..." if len(bad) > 1 else "")
    return frozenset(path for path, _ in bad)


def _folder_data(root, batch_size, image_shape, num_classes, val_fraction, seed, num_parts,
                 part_index, skip_bad_images=False, **augmentation):
    split = split_image_folder(root, val_fraction, seed)
    exclude = _screened(root, split, skip_bad_images)
    if exclude:
        split = dataclasses.replace(split, train=_kept(split.train, exclude),
                                    val=_kept(split.val, exclude))
    if len(split.classes) > num_classes:
        raise DataError(f"image folder {root!r} has {len(split.classes)} classes but "
                                 f"--num-classes is {num_classes}: pass --num-classes "
                                 f"{len(split.classes)}")
    train, val, _ = folder_iters(root, batch_size, image_shape, val_fraction, seed,
                                          num_parts=num_parts, part_index=part_index,
                                          exclude=exclude, **augmentation)
    shard_size = len(split.train[part_index::num_parts])
    return TrainData(train, val, math.ceil(shard_size / batch_size),
                     f"image folder {root} ({len(split.classes)} classes, {len(split.train)} "
                     f"training and {len(split.val)} validation images)")


def _kept(items, exclude):
    return tuple(item for item in items if item[0] not in exclude)


def _record_data(data_train, data_train_idx, data_val, data_val_idx, batch_size, image_shape,
                 num_threads, num_parts, part_index, seed, shard_val=False, **augmentation):
    common = dict(num_threads=num_threads, seed=seed, **augmentation)
    train = record_iter(data_train, batch_size, image_shape, train=True,
                                 path_idx=data_train_idx, num_parts=num_parts,
                                 part_index=part_index, **common)
    val_part = dict(num_parts=num_parts, part_index=part_index) if shard_val else {}
    val = record_iter(data_val, batch_size, image_shape, train=False,
                               path_idx=data_val_idx, **val_part, **common) if data_val else None
    num_records = check_record_file(data_train, data_train_idx)
    # Every worker must take the same number of steps: the smallest part, whole batches only.
    step = -(-num_records // num_parts)
    smallest = num_records - (num_parts - 1) * step
    batches = math.ceil(num_records / batch_size) if num_parts == 1 else \
        max(smallest // batch_size, 1)
    return TrainData(train, val, batches, f"RecordIO {data_train} ({num_records} images)")
