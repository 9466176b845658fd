"""Data sources for training: RecordIO files, image folders and synthetic data.

Every source is an :class:`mx.io.DataIter`, so the Gluon loop and ``mx.mod.Module`` consume the same
objects.  A batch holds ``data[0]`` shaped ``(N, C, H, W)`` and ``label[0]`` shaped ``(N,)``, both
float32, with ``N == batch_size`` always.

Float16 training: the iterators always yield float32.  The data reaches the network as float16 by a
cast on the device (the cast :func:`mxfp16.cast_block` / :func:`mxfp16.cast_symbol` insert after the
data input), not in the iterator: ``ImageRecordIter`` ignores its ``dtype`` argument (MXNet issue
#9774), and one rule for every source keeps the Gluon and Module paths identical.

Padding: when the last batch of an epoch is short, it is filled up by repeating real samples of that
batch, and ``batch.pad`` says how many samples at its end are repeats, so a metric that skips them
counts every image exactly once (validation data, and image-folder training data).  Training batches
from :func:`record_iter` follow MXNet's ``round_batch`` instead: the last batch is filled with the first
samples of the next epoch, which then starts after them (so an epoch has ``ceil(n / batch_size)`` or
one batch fewer), and ``batch.pad`` is 0.
"""
import math
import os
import struct
from dataclasses import dataclass

import cv2
import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon.data.vision import transforms

#: File extensions read as images: the ones ``ImageFolderDataset`` and MXNet's im2rec.py read.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png")

#: ImageNet per-channel mean and standard deviation (RGB, 0..255 scale): the values MXNet's and
#: GluonCV's ImageNet recipes normalise with.
IMAGENET_MEAN_RGB = (123.68, 116.779, 103.939)
IMAGENET_STD_RGB = (58.393, 57.12, 57.375)

#: Validation crops the centre ``CROP_RATIO`` of the image (224 from 256), the standard ImageNet
#: protocol.
CROP_RATIO = 0.875

#: Random resized crop: the crop covers 8%..100% of the image with an aspect ratio of 3/4..4/3
#: (Inception-style augmentation, as in GluonCV's ImageNet recipe).
MIN_CROP_AREA = 0.08
CROP_ASPECT_RATIOS = (3.0 / 4.0, 4.0 / 3.0)

#: Brightness, contrast and saturation jitter of the training augmentation (GluonCV's ``jitter_param``).
COLOR_JITTER = 0.4

#: AlexNet-style PCA lighting noise when enabled (GluonCV's ``lighting_param``).
PCA_LIGHTING = 0.1

#: Input names Module binds to: MXNet's conventions for image classification.
DATA_NAME = "data"
LABEL_NAME = "softmax_label"

_REBUILD = "rebuild it with scripts/prepare_data.py (or MXNet's tools/im2rec.py)"


class DataError(ValueError):
    """A data set, a data file or a data-preparation setting that cannot work.

    The message names the file or folder, what is wrong with it and how to fix it; scripts print it as
    one ``error: ...`` line and exit with code 2.
    """


def _check_image_shape(image_shape):
    shape = tuple(image_shape) if isinstance(image_shape, (tuple, list)) else ()
    if len(shape) != 3 or shape[0] != 3 or not all(
            isinstance(size, (int, np.integer)) and size > 0 for size in shape):
        raise ValueError(f"image_shape must be (3, height, width) with positive integers, got "
                         f"{image_shape!r}: for example image_shape=(3, 224, 224)")
    return tuple(int(size) for size in shape)


def _check_positive(name, value):
    if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}: for example {name}=32")


def _check_part(num_parts, part_index):
    _check_positive("num_parts", num_parts)
    if not isinstance(part_index, (int, np.integer)) or not 0 <= part_index < num_parts:
        raise ValueError(f"part_index must be an integer in [0, num_parts={num_parts}), got "
                         f"{part_index!r}: pass the worker's rank (e.g. part_index=kv.rank)")


# ---------------------------------------------------------------------------------------------------
# Image folders
# ---------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ImageFolderSplit:
    """An image folder listed and split into training and validation images.

    Attributes
    ----------
    classes : tuple of str
        Class names in label order (sorted folder names): label ``i`` is ``classes[i]``.
    train, val : tuple of (str, int)
        ``(image path, label)`` pairs, in class order then file-name order.
    non_images : tuple of str
        Paths of files in the class folders that are not images (by extension); they are left out.
    """

    classes: tuple
    train: tuple
    val: tuple
    non_images: tuple


def _list_class_folder(folder):
    """Sorted image paths and non-image paths of one class folder (sub-folders are not searched)."""
    images, others = [], []
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            is_image = os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
            (images if is_image else others).append(path)
    return images, others


def list_image_folder(root):
    """List a folder with one sub-folder of images per class.

    The rules are ``ImageFolderDataset``'s (and im2rec.py's): every sub-folder is a class, classes are
    numbered in sorted name order, and files ending in ``.jpg``, ``.jpeg`` or ``.png`` (any case) are
    images; so labels agree with theirs.

    Parameters
    ----------
    root : str
        The folder.

    Returns
    -------
    tuple
        ``(classes, items, non_images)``: class names, ``(path, label)`` pairs and the paths of the
        other files in the class folders.

    Raises
    ------
    DataError
        If ``root`` is missing, has no class sub-folders, or a class folder has no images.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> os.makedirs(os.path.join(root, "cat"))
    >>> open(os.path.join(root, "cat", "1.jpg"), "wb").close()
    >>> classes, items, non_images = list_image_folder(root)
    >>> classes, [label for _, label in items], non_images
    (('cat',), [0], ())
    """
    if not os.path.isdir(root):
        raise DataError(f"image folder {root!r} not found: pass the folder that holds one "
                        "sub-folder of images per class")
    classes = tuple(sorted(name for name in os.listdir(root) if os.path.isdir(os.path.join(root, name))))
    if not classes:
        raise DataError(f"image folder {root!r} has no class sub-folders: put the images of each "
                        "class in a sub-folder named after the class (root/<class>/<image>.jpg)")
    items, non_images = [], []
    for label, name in enumerate(classes):
        images, others = _list_class_folder(os.path.join(root, name))
        if not images:
            raise DataError(f"class folder {os.path.join(root, name)!r} has no images "
                            f"({', '.join(IMAGE_EXTENSIONS)}): add its images or remove the folder")
        items += [(path, label) for path in images]
        non_images += others
    return classes, tuple(items), tuple(non_images)


def _sorted_concat(parts):
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, dtype=np.int64)


def split_indices(labels, val_fraction, seed=0):
    """Split sample indices into training and validation, class by class (stratified).

    In each class a permutation seeded by ``seed`` picks ``round(n * val_fraction)`` validation
    samples; the same labels, fraction and seed give the same split on every machine.

    Parameters
    ----------
    labels : sequence of int
        The label of each sample.
    val_fraction : float
        Fraction of each class held out for validation, in [0, 1).
    seed : int
        Seed of the split.

    Returns
    -------
    tuple of numpy.ndarray
        Sorted training indices and sorted validation indices; together they are all indices once.

    Examples
    --------
    >>> train, val = split_indices([0, 0, 0, 0, 1, 1, 1, 1], val_fraction=0.25, seed=0)
    >>> len(train), len(val), sorted(set(train) | set(val)) == list(range(8))
    (6, 2, True)
    """
    labels = np.asarray(labels)
    rng = np.random.RandomState(seed)
    train, val = [], []
    for label in np.unique(labels):
        members = np.flatnonzero(labels == label)
        members = members[rng.permutation(len(members))]
        num_val = int(round(len(members) * val_fraction))
        val.append(members[:num_val])
        train.append(members[num_val:])
    return _sorted_concat(train), _sorted_concat(val)


def _check_fraction(val_fraction):
    if not isinstance(val_fraction, (int, float)) or not 0 <= val_fraction < 1:
        raise DataError(f"the validation fraction must be in [0, 1), got {val_fraction!r}: for "
                        "example 0.2 holds out 20% of each class (0 makes no validation set)")


def _split_folders(root):
    """``root/train`` and ``root/val`` when both exist, else None."""
    train_dir, val_dir = os.path.join(root, "train"), os.path.join(root, "val")
    return (train_dir, val_dir) if os.path.isdir(train_dir) and os.path.isdir(val_dir) else None


def _list_given_split(train_dir, val_dir):
    classes, train, train_others = list_image_folder(train_dir)
    val_classes, val, val_others = list_image_folder(val_dir)
    if val_classes != classes:
        missing = sorted(set(classes) - set(val_classes)) or "none"
        extra = sorted(set(val_classes) - set(classes)) or "none"
        raise DataError(f"{val_dir!r} does not have the class folders of {train_dir!r} (missing: "
                        f"{missing}, extra: {extra}): give both the same class sub-folders, so "
                        "labels agree")
    return ImageFolderSplit(classes, train, val, train_others + val_others)


def split_image_folder(root, val_fraction=0.2, seed=0):
    """List an image folder and split it into training and validation images.

    If ``root`` has both a ``train`` and a ``val`` sub-folder (the ImageNet layout), they are the split
    and ``val_fraction`` is not used; they must hold the same class folders.  Otherwise ``root`` holds
    the class folders (the Caltech-101/256 layout) and :func:`split_indices` holds out
    ``val_fraction`` of each class, seeded by ``seed``.

    Parameters
    ----------
    root : str
        The image folder.
    val_fraction : float
        Fraction of each class held out for validation, in [0, 1).
    seed : int
        Seed of the split.

    Returns
    -------
    ImageFolderSplit

    Raises
    ------
    DataError
        If the folder is unusable (see :func:`list_image_folder`), ``val_fraction`` is out of range
        or leaves no training image.

    Examples
    --------
    >>> import os, tempfile
    >>> root = tempfile.mkdtemp()
    >>> for name in ("a/1.jpg", "a/2.jpg", "b/1.png", "b/2.png", "b/notes.txt"):
    ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    ...     open(os.path.join(root, name), "wb").close()
    >>> split = split_image_folder(root, val_fraction=0.5, seed=0)
    >>> split.classes, len(split.train), len(split.val), [os.path.basename(p) for p in split.non_images]
    (('a', 'b'), 2, 2, ['notes.txt'])
    """
    _check_fraction(val_fraction)
    given = _split_folders(root)
    if given:
        return _list_given_split(*given)
    classes, items, non_images = list_image_folder(root)
    train, val = split_indices([label for _, label in items], val_fraction, seed)
    if not len(train):
        raise DataError(f"holding out {val_fraction:.0%} of each class of {root!r} leaves no "
                        "training image: lower the validation fraction")
    return ImageFolderSplit(classes, tuple(items[i] for i in train), tuple(items[i] for i in val),
                            non_images)


# ---------------------------------------------------------------------------------------------------
# Iterators
# ---------------------------------------------------------------------------------------------------

class _FixedShapeIter(mx.io.DataIter):
    """Base of the iterators here: fixed float32 shapes, batches of exactly ``batch_size``."""

    def __init__(self, batch_size, image_shape):
        super().__init__(batch_size)
        self.provide_data = [mx.io.DataDesc(DATA_NAME, (batch_size,) + tuple(image_shape), np.float32)]
        self.provide_label = [mx.io.DataDesc(LABEL_NAME, (batch_size,), np.float32)]

    def _batch(self, data, label, num_valid):
        """A DataBatch of the first ``num_valid`` samples, filled up by repeating them."""
        pad = self.batch_size - num_valid
        if pad:
            keep = mx.nd.array(np.arange(self.batch_size) % num_valid, dtype="int64")
            data, label = mx.nd.take(data, keep), mx.nd.take(label, keep)
        return mx.io.DataBatch([data.astype("float32", copy=False)],
                               [label.astype("float32", copy=False)], pad=pad,
                               provide_data=self.provide_data, provide_label=self.provide_label)


class _SyntheticIter(_FixedShapeIter):
    """One random batch, served ``num_batches`` times per epoch."""

    def __init__(self, batch_size, image_shape, num_classes, num_batches, seed):
        super().__init__(batch_size, image_shape)
        rng = np.random.RandomState(seed)
        self._data = mx.nd.array(rng.uniform(-1, 1, (batch_size,) + image_shape), dtype="float32")
        self._label = mx.nd.array(rng.randint(0, num_classes, batch_size), dtype="float32")
        self._num_batches = num_batches
        self._served = 0

    def reset(self):
        self._served = 0

    def next(self):
        if self._served >= self._num_batches:
            raise StopIteration
        self._served += 1
        return self._batch(self._data, self._label, self.batch_size)


def synthetic_iter(batch_size, image_shape, num_classes, num_batches, seed=0):
    """Random images and labels, for throughput measurements and smoke runs.

    The data (uniform in [-1, 1)) and labels (uniform in [0, num_classes)) are generated once, as one
    batch that every step serves again, so the iterator costs nothing per batch.

    Parameters
    ----------
    batch_size : int
        Samples per batch.
    image_shape : tuple of int
        ``(3, height, width)``.
    num_classes : int
        Labels are in ``[0, num_classes)``.
    num_batches : int
        Batches per epoch.
    seed : int
        Seed of the data and labels.

    Returns
    -------
    mx.io.DataIter

    Raises
    ------
    ValueError
        If an argument is out of range.

    Examples
    --------
    >>> data_iter = synthetic_iter(4, (3, 8, 8), num_classes=10, num_batches=2)
    >>> batches = list(data_iter)
    >>> len(batches), batches[0].data[0].shape, batches[0].label[0].dtype
    (2, (4, 3, 8, 8), <class 'numpy.float32'>)
    """
    image_shape = _check_image_shape(image_shape)
    for name, value in (("batch_size", batch_size), ("num_classes", num_classes),
                        ("num_batches", num_batches)):
        _check_positive(name, value)
    return _SyntheticIter(batch_size, image_shape, num_classes, num_batches, seed)


def _check_batch_labels(labels, num_classes, batch_index):
    valid = (labels >= 0) & (labels < num_classes) & (labels == np.floor(labels))
    if not valid.all():
        bad = labels[~valid].flat[0]
        raise DataError(
            f"label {bad:g} in batch {batch_index} (counting from 0) is not a class index in the valid "
            f"range [0, {num_classes}): set the number of classes (--num-classes) to that of the "
            f"data or fix the labels (classes are numbered 0..{num_classes - 1}; {_REBUILD})")


class _LabelCheckIter(mx.io.DataIter):
    """Checks the labels of every batch of the wrapped iterator."""

    def __init__(self, data_iter, num_classes):
        super().__init__(data_iter.batch_size)
        self._data_iter = data_iter
        self._num_classes = num_classes
        self._batch_index = 0

    @property
    def provide_data(self):
        return self._data_iter.provide_data

    @property
    def provide_label(self):
        return self._data_iter.provide_label

    def reset(self):
        self._data_iter.reset()
        self._batch_index = 0

    def next(self):
        batch = self._data_iter.next()
        _check_batch_labels(batch.label[0].asnumpy(), self._num_classes, self._batch_index)
        self._batch_index += 1
        return batch


def check_labels(data_iter, num_classes):
    """Wrap an iterator so that a label outside ``[0, num_classes)`` raises instead of training on.

    An out-of-range label makes the loss read memory past the logits (garbage or NaN losses, or a
    crash on GPU).  The labels are checked on the host with numpy; they are small.

    Parameters
    ----------
    data_iter : mx.io.DataIter
        The iterator to check.
    num_classes : int
        Number of classes of the network's output.

    Returns
    -------
    mx.io.DataIter
        The same batches, checked.

    Raises
    ------
    DataError
        While iterating, naming the label, the batch and the valid range.

    Examples
    --------
    >>> import mxnet as mx, numpy as np
    >>> data = mx.io.NDArrayIter(np.zeros((4, 3, 2, 2)), np.array([0, 1, 2, 3]), batch_size=2)
    >>> batches = list(check_labels(data, num_classes=3))  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mxfp16.data.DataError: label 3 in batch 1 (counting from 0) is not a class index in ...
    """
    _check_positive("num_classes", num_classes)
    return _LabelCheckIter(data_iter, num_classes)


# ---------------------------------------------------------------------------------------------------
# RecordIO
# ---------------------------------------------------------------------------------------------------

def default_index_path(path_rec):
    """The ``.idx`` file next to a ``.rec`` file: ``train.rec`` -> ``train.idx``."""
    return os.path.splitext(path_rec)[0] + ".idx"


def _check_readable(path, kind):
    if not os.path.isfile(path):
        raise DataError(f"{kind} file {path!r} not found: {_REBUILD}")
    try:
        open(path, "rb").close()
    except OSError as error:
        raise DataError(f"{kind} file {path!r} cannot be read ({error.strerror}): fix its "
                        f"permissions or {_REBUILD}") from None


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
                                f"(got {line.strip()[:40]!r}): {_REBUILD}") from None
            offsets[key] = offset
    if not offsets:
        raise DataError(f"index file {path_idx!r} is empty: {_REBUILD}")
    return offsets


def _check_offsets(path_rec, path_idx, offsets):
    size = os.path.getsize(path_rec)
    outside = [offset for offset in offsets.values() if not 0 <= offset < size]
    if outside:
        raise DataError(f"record file {path_rec!r} is truncated or does not belong to index "
                        f"{path_idx!r}: {len(outside)} of {len(offsets)} records start past its end "
                        f"({size} bytes); {_REBUILD}")


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
                        f"read ({_last_line(error)}); {_REBUILD}") from None
    finally:
        record.close()
    if image is None:
        raise DataError(f"record {key} of {path_rec!r} does not decode as an image: {_REBUILD}")
    if np.ndim(header.label) != 0:
        raise DataError(f"the records of {path_rec!r} carry {np.size(header.label)} labels each, "
                        f"and training reads one class label per image: {_REBUILD}")


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


def _resize_size(image_shape):
    """Shorter side to resize to before the validation centre crop (256 for 224)."""
    return int(math.ceil(max(image_shape[1:]) / CROP_RATIO))


def _train_augmentation(jitter, lighting, seed):
    """ImageRecordIter arguments of the standard ImageNet training augmentation."""
    return dict(shuffle=True, rand_mirror=True, random_resized_crop=True,
                min_random_area=MIN_CROP_AREA, max_random_area=1.0,
                min_aspect_ratio=CROP_ASPECT_RATIOS[0], max_aspect_ratio=CROP_ASPECT_RATIOS[1],
                brightness=jitter, contrast=jitter, saturation=jitter, pca_noise=lighting,
                seed_aug=seed)


class _RecordIter(_FixedShapeIter):
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
                num_parts=1, part_index=0, seed=0):
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
    image_shape = _check_image_shape(image_shape)
    _check_positive("batch_size", batch_size)
    _check_positive("num_threads", num_threads)
    _check_part(num_parts, part_index)
    path_idx = default_index_path(path_rec) if path_idx is None else path_idx
    num_records = check_record_file(path_rec, path_idx)
    part_size = _part_size(num_records, num_parts, part_index)
    if not part_size:
        raise DataError(f"part {part_index} of {num_parts} of {path_rec!r} is empty: the file has "
                        f"{num_records} records; use num_parts <= {num_records}")
    common = dict(path_imgrec=path_rec, path_imgidx=path_idx, data_shape=image_shape,
                  batch_size=batch_size, label_width=1, data_name=DATA_NAME, label_name=LABEL_NAME,
                  mean_r=mean_rgb[0], mean_g=mean_rgb[1], mean_b=mean_rgb[2], std_r=std_rgb[0],
                  std_g=std_rgb[1], std_b=std_rgb[2], preprocess_threads=num_threads,
                  num_parts=num_parts, part_index=part_index, seed=seed, verbose=False)
    if train:
        train_iter = mx.io.ImageRecordIter(**_train_augmentation(jitter, lighting, seed), **common)
        return _RecordIter(train_iter, batch_size, image_shape)
    val_iter = mx.io.ImageRecordIter(shuffle=False, round_batch=False,
                                     resize=_resize_size(image_shape), **common)
    return _RecordIter(val_iter, batch_size, image_shape, num_samples=part_size)


# ---------------------------------------------------------------------------------------------------
# Image folders as iterators
# ---------------------------------------------------------------------------------------------------

def _normalised_tensor(mean_rgb, std_rgb):
    """HWC uint8 -> CHW float32, normalised as ImageRecordIter does (ToTensor divides by 255)."""
    return [transforms.ToTensor(),
            transforms.Normalize([m / 255.0 for m in mean_rgb], [s / 255.0 for s in std_rgb])]


def _train_transform(image_shape, jitter, lighting, mean_rgb, std_rgb):
    height, width = image_shape[1:]
    steps = [transforms.RandomResizedCrop((width, height), scale=(MIN_CROP_AREA, 1.0),
                                          ratio=CROP_ASPECT_RATIOS),
             transforms.RandomFlipLeftRight()]
    if jitter:
        steps.append(transforms.RandomColorJitter(brightness=jitter, contrast=jitter,
                                                  saturation=jitter))
    if lighting:
        steps.append(transforms.RandomLighting(lighting))
    return transforms.Compose(steps + _normalised_tensor(mean_rgb, std_rgb))


def _val_transform(image_shape, mean_rgb, std_rgb):
    height, width = image_shape[1:]
    return transforms.Compose([transforms.Resize(_resize_size(image_shape), keep_ratio=True),
                               transforms.CenterCrop((width, height))]
                              + _normalised_tensor(mean_rgb, std_rgb))


def _read_image(path):
    """Decode an image file as ``ImageFolderDataset`` does (RGB, HWC uint8), naming it on failure."""
    try:
        return mx.image.imread(path, flag=1)
    except mx.base.MXNetError:
        raise DataError(f"image {path!r} cannot be decoded: remove or replace it (or pack the folder "
                        "with scripts/prepare_data.py, which skips such files)") from None


class _LoaderIter(_FixedShapeIter):
    """A ``gluon.data.DataLoader`` as a DataIter; the last, shorter batch is filled by repeats."""

    def __init__(self, loader, batch_size, image_shape):
        super().__init__(batch_size, image_shape)
        self._loader = loader
        self._batches = iter(loader)

    def reset(self):
        self._batches = iter(self._loader)

    def next(self):
        data, label = next(self._batches)
        return self._batch(data, label, data.shape[0])


def _loader_iter(items, transform, batch_size, image_shape, shuffle, num_workers):
    dataset = gluon.data.SimpleDataset(list(items)).transform_first(_read_image)
    loader = gluon.data.DataLoader(dataset.transform_first(transform), batch_size=batch_size,
                                   shuffle=shuffle, last_batch="keep", num_workers=num_workers)
    return _LoaderIter(loader, batch_size, image_shape)


def folder_iters(root, batch_size, image_shape, val_fraction=0.2, seed=0, jitter=COLOR_JITTER,
                 lighting=0.0, mean_rgb=IMAGENET_MEAN_RGB, std_rgb=IMAGENET_STD_RGB, num_workers=0,
                 num_parts=1, part_index=0):
    """Training and validation batches read straight from an image folder (Gluon transforms).

    The folder is listed and split by :func:`split_image_folder`: ``root/train`` and ``root/val`` when
    both exist, else a stratified split that holds out ``val_fraction`` of each class, seeded by
    ``seed`` (the split ``scripts/prepare_data.py --train-ratio 1-val_fraction --seed seed`` makes).
    The preprocessing matches :func:`record_iter`: training takes a random resized crop, a random
    mirror, colour jitter and optional PCA lighting; validation resizes the shorter side to
    ``max(height, width) / 0.875`` and takes the centre crop.  ``seed`` fixes the split only; the
    shuffle and the augmentation follow the global seeds (``mx.random.seed``, ``np.random.seed``).

    Parameters
    ----------
    root : str
        The image folder (one sub-folder per class, or ``train/`` and ``val/`` of such folders).
    batch_size : int
        Samples per batch.
    image_shape : tuple of int
        ``(3, height, width)`` of the network input.
    val_fraction : float
        Fraction of each class held out for validation, in [0, 1); unused with ``train/`` + ``val/``.
    seed : int
        Seed of the split.
    jitter, lighting, mean_rgb, std_rgb
        As for :func:`record_iter`.
    num_workers : int
        DataLoader worker processes (0 decodes in the calling thread).
    num_parts, part_index : int
        Distributed training: this worker reads every ``num_parts``-th training image starting at
        ``part_index`` (of the training list in folder order); validation is not sharded.

    Returns
    -------
    tuple
        ``(train_data, val_data, classes)``: two ``mx.io.DataIter`` (``val_data`` is None when no
        image is held out) and the class names in label order.

    Raises
    ------
    DataError
        If the folder is missing or empty, a class folder has no images, or (while iterating) an image
        cannot be decoded.

    Examples
    --------
    >>> import os, tempfile, numpy as np, cv2
    >>> root = tempfile.mkdtemp()
    >>> for name in ("a/1.jpg", "a/2.jpg", "b/1.jpg", "b/2.jpg"):
    ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    ...     _ = cv2.imwrite(os.path.join(root, name), np.zeros((20, 24, 3), np.uint8))
    >>> train_data, val_data, classes = folder_iters(root, 4, (3, 16, 16), val_fraction=0.5)
    >>> batch = next(train_data)
    >>> classes, batch.data[0].shape, batch.label[0].shape, batch.pad
    (('a', 'b'), (4, 3, 16, 16), (4,), 2)
    """
    image_shape = _check_image_shape(image_shape)
    _check_positive("batch_size", batch_size)
    _check_part(num_parts, part_index)
    split = split_image_folder(root, val_fraction, seed)
    shard = split.train[part_index::num_parts]
    if not shard:
        raise DataError(f"part {part_index} of {num_parts} of image folder {root!r} has no training "
                        f"image ({len(split.train)} in all): use fewer workers or more images")
    train_transform = _train_transform(image_shape, jitter, lighting, mean_rgb, std_rgb)
    train_data = _loader_iter(shard, train_transform, batch_size, image_shape,
                              shuffle=True, num_workers=num_workers)
    val_data = None
    if split.val:
        val_transform = _val_transform(image_shape, mean_rgb, std_rgb)
        val_data = _loader_iter(split.val, val_transform, batch_size, image_shape,
                                shuffle=False, num_workers=num_workers)
    return train_data, val_data, split.classes
