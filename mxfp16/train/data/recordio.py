"""RecordIO files (``.rec`` + ``.idx``, as im2rec.py and scripts/prepare_data.py write them): checks
that name the broken file, and ``ImageRecordIter`` with the ImageNet augmentation."""
import os
import struct

import cv2
import mxnet as mx
import numpy as np

from .augmentation import mean_std_params, recipe_of, record_train_params
from .base import (
    COLOR_JITTER,
    CROP_RATIO,
    DATA_NAME,
    IMAGENET_MEAN_RGB,
    IMAGENET_STD_RGB,
    LABEL_NAME,
    REBUILD_HINT,
    DataError,
    FixedShapeIter,
    check_image_shape,
    check_part,
    check_positive,
    resize_size,
)

# ---------------------------------------------------------------------------------------------------
# RecordIO
# ---------------------------------------------------------------------------------------------------

def default_index_path(path_rec):
    """The ``.idx`` file next to a ``.rec`` file: ``train.rec`` -> ``train.idx``."""
    return os.path.splitext(path_rec)[0] + ".idx"


def _check_readable(path, kind):
    if not os.path.isfile(path):
        raise DataError(f"{kind} file {path!r} not found: {REBUILD_HINT}")
    try:
        open(path, "rb").close()
    except OSError as error:
        raise DataError(f"{kind} file {path!r} cannot be read ({error.strerror}): fix its "
                        f"permissions or {REBUILD_HINT}") from None


def _read_index(path_idx):
    """Record offsets by key, from the ``key<TAB>offset`` lines of a ``.idx`` file."""
    offsets = {}
    with open(path_idx, errors="replace") as lines:
        for number, line in enumerate(lines, 1):
            fields = line.split()
            if not fields:
                continue
            try:
                key, offset = (int(field) for field in fields)
            except ValueError:
                raise DataError(f"index file {path_idx!r} line {number} is not 'key<TAB>offset' "
                                f"(got {line.strip()[:40]!r}): {REBUILD_HINT}") from None
            offsets[key] = offset
    if not offsets:
        raise DataError(f"index file {path_idx!r} is empty: {REBUILD_HINT}")
    return offsets


def _check_offsets(path_rec, path_idx, offsets):
    size = os.path.getsize(path_rec)
    outside = [offset for offset in offsets.values() if not 0 <= offset < size]
    if outside:
        raise DataError(f"record file {path_rec!r} is truncated or does not belong to index "
                        f"{path_idx!r}: {len(outside)} of {len(offsets)} records start past its end "
                        f"({size} bytes); {REBUILD_HINT}")


def _last_line(error):
    lines = str(error).strip().splitlines()
    return lines[-1].replace("MXNetError: ", "") if lines else type(error).__name__


def _check_record(path_rec, path_idx, key):
    """Read and decode one record; DataError if it is unreadable or not a single-label image."""
    record = mx.recordio.MXIndexedRecordIO(path_idx, path_rec, "r")
    try:
        header, image = mx.recordio.unpack_img(record.read_idx(key))
    except (mx.base.MXNetError, struct.error, ValueError, cv2.error) as error:
        raise DataError(f"record file {path_rec!r} is truncated or corrupt: record {key} cannot be "
                        f"read ({_last_line(error)}); {REBUILD_HINT}") from None
    finally:
        record.close()
    if image is None:
        raise DataError(f"record {key} of {path_rec!r} does not decode as an image: {REBUILD_HINT}")
    if np.ndim(header.label) != 0:
        raise DataError(f"the records of {path_rec!r} carry {np.size(header.label)} labels each, "
                        f"and training reads one class label per image: {REBUILD_HINT}")


def check_record_file(path_rec, path_idx=None):
    """Check a ``.rec``/``.idx`` pair in Python before ``ImageRecordIter`` reads it.

    ``ImageRecordIter`` aborts the process or hangs on a missing, truncated or corrupt file; this
    raises a :class:`DataError` instead.  It checks that both files are readable, that every offset of
    the index lies inside the record file, and that the first and the last record (by offset) unpack
    and decode as images with one label.

    Parameters
    ----------
    path_rec : str
        The ``.rec`` file.
    path_idx : str, optional
        Its ``.idx`` file (default: ``path_rec`` with the extension ``.idx``).

    Returns
    -------
    int
        The number of records.

    Raises
    ------
    DataError
        Naming the file, what is wrong and the fix.

    Examples
    --------
    >>> import os, tempfile, numpy as np, mxnet as mx
    >>> prefix = os.path.join(tempfile.mkdtemp(), "tiny")
    >>> record = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    >>> for key in range(3):
    ...     header = mx.recordio.IRHeader(0, key, key, 0)
    ...     record.write_idx(key, mx.recordio.pack_img(header, np.zeros((8, 8, 3), np.uint8)))
    >>> record.close()
    >>> check_record_file(prefix + ".rec")
    3
    """
    path_idx = default_index_path(path_rec) if path_idx is None else path_idx
    _check_readable(path_rec, "record")
    _check_readable(path_idx, "index")
    offsets = _read_index(path_idx)
    _check_offsets(path_rec, path_idx, offsets)
    by_offset = sorted(offsets, key=offsets.get)
    for key in dict.fromkeys((by_offset[0], by_offset[-1])):
        _check_record(path_rec, path_idx, key)
    return len(offsets)


def _part_size(num_records, num_parts, part_index):
    """Records in one part: MXNet's indexed RecordIO reader gives part ``p`` the records
    ``[p * step, (p + 1) * step)`` in index order, with ``step = ceil(num_records / num_parts)``."""
    step = -(-num_records // num_parts)
    return max(0, min(num_records, (part_index + 1) * step) - part_index * step)


class _RecordIter(FixedShapeIter):
    """An ImageRecordIter with a ``pad`` a training loop can trust.

    Training (``num_samples=None``): with ``round_batch`` MXNet fills the last batch with the first
    samples of the next epoch (which then starts after them) and reports ``pad`` erratically, even on
    middle batches; every sample is real, so ``pad`` is 0.  Validation (``round_batch=False``): MXNet
    fills the tail of the last batch with stale data and reports ``pad=0``; here the tail repeats real
    samples and ``pad`` counts them, so every image counts exactly once per epoch.
    """

    def __init__(self, record_iter, batch_size, image_shape, num_samples=None):
        super().__init__(batch_size, image_shape)
        self._record_iter = record_iter
        self._num_samples = num_samples
        self._served = 0

    def reset(self):
        self._record_iter.reset()
        self._served = 0

    def next(self):
        if self._num_samples is not None and self._served >= self._num_samples:
            raise StopIteration
        batch = self._record_iter.next()
        num_valid = self.batch_size
        if self._num_samples is not None:
            num_valid = min(self.batch_size, self._num_samples - self._served)
        self._served += num_valid
        return self._batch(batch.data[0], batch.label[0], num_valid)


def record_iter(path_rec, batch_size, image_shape, train=True, path_idx=None, jitter=COLOR_JITTER,
                lighting=0.0, mean_rgb=IMAGENET_MEAN_RGB, std_rgb=IMAGENET_STD_RGB, num_threads=4,
                num_parts=1, part_index=0, seed=0, augmentation=None, crop_ratio=CROP_RATIO):
    """Batches of images from a RecordIO file, decoded and augmented by ``mx.io.ImageRecordIter``.

    Training: shuffled, random resized crop (8%..100% of the area, aspect 3/4..4/3), random mirror,
    brightness/contrast/saturation jitter and optional PCA lighting.  Validation: in file order, the
    shorter side resized to ``max(height, width) / 0.875`` then the centre crop, every image exactly
    once per epoch (see the module notes on padding).  Both normalise ``(x - mean_rgb) / std_rgb``.
    The files are checked first with :func:`check_record_file`.

    Parameters
    ----------
    path_rec : str
        The ``.rec`` file (from scripts/prepare_data.py or im2rec.py).
    batch_size : int
        Samples per batch (per worker).
    image_shape : tuple of int
        ``(3, height, width)`` of the network input.
    train : bool
        Training augmentation and shuffling, or validation preprocessing.
    path_idx : str, optional
        The ``.idx`` file (default: next to ``path_rec``).
    jitter : float
        Brightness, contrast and saturation jitter (training).
    lighting : float
        PCA lighting noise (training); 0 disables it, GluonCV's recipe uses ``PCA_LIGHTING``.
    mean_rgb, std_rgb : tuple of float
        Per-channel normalisation, on the 0..255 scale.
    num_threads : int
        Decoding threads.
    num_parts, part_index : int
        Distributed training: the file is cut into ``num_parts`` shards and this worker reads shard
        ``part_index`` (e.g. ``num_parts=kv.num_workers, part_index=kv.rank``).
    seed : int
        Seed of the shuffle and of the augmentation.
    augmentation : mxfp16.train.data.augmentation.Augmentation, optional
        The training augmentation and normalisation (MXNet example's flags); replaces ``jitter``,
        ``lighting``, ``mean_rgb`` and ``std_rgb``.
    crop_ratio : float
        Validation: the centre crop is this fraction of the resized shorter side.

    Returns
    -------
    mx.io.DataIter
        float32 data ``(batch_size,) + image_shape`` and float32 labels ``(batch_size,)``.

    Raises
    ------
    DataError
        If a file is missing, unreadable, truncated or corrupt, or this worker's shard is empty.
    ValueError
        If an argument is out of range.

    Examples
    --------
    >>> import os, tempfile, numpy as np, mxnet as mx
    >>> prefix = os.path.join(tempfile.mkdtemp(), "tiny")
    >>> record = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    >>> for key in range(3):
    ...     header = mx.recordio.IRHeader(0, key, key, 0)
    ...     record.write_idx(key, mx.recordio.pack_img(header, np.zeros((20, 24, 3), np.uint8)))
    >>> record.close()
    >>> val_data = record_iter(prefix + ".rec", 2, (3, 16, 16), train=False, num_threads=1)
    >>> [(batch.data[0].shape, batch.label[0].asnumpy().tolist(), batch.pad) for batch in val_data]
    [((2, 3, 16, 16), [0.0, 1.0], 0), ((2, 3, 16, 16), [2.0, 2.0], 1)]
    """
    image_shape = check_image_shape(image_shape)
    check_positive("batch_size", batch_size)
    check_positive("num_threads", num_threads)
    check_part(num_parts, part_index)
    path_idx = default_index_path(path_rec) if path_idx is None else path_idx
    num_records = check_record_file(path_rec, path_idx)
    part_size = _part_size(num_records, num_parts, part_index)
    if not part_size:
        raise DataError(f"part {part_index} of {num_parts} of {path_rec!r} is empty: the file has "
                        f"{num_records} records; use num_parts <= {num_records}")
    aug = recipe_of(augmentation, jitter, lighting, mean_rgb, std_rgb)
    common = dict(path_imgrec=path_rec, path_imgidx=path_idx, data_shape=image_shape,
                  batch_size=batch_size, label_width=1, data_name=DATA_NAME, label_name=LABEL_NAME,
                  preprocess_threads=num_threads, num_parts=num_parts, part_index=part_index,
                  seed=seed, verbose=False)
    if train:
        train_iter = mx.io.ImageRecordIter(shuffle=True, seed_aug=seed,
                                           **record_train_params(aug), **common)
        return _RecordIter(train_iter, batch_size, image_shape)
    val_iter = mx.io.ImageRecordIter(shuffle=False, round_batch=False,
                                     resize=resize_size(image_shape, crop_ratio),
                                     **mean_std_params(aug.rgb_mean, aug.rgb_std), **common)
    return _RecordIter(val_iter, batch_size, image_shape, num_samples=part_size)

