"""Data sources for training: RecordIO files, image folders and synthetic data.

Every source is an :class:`mx.io.DataIter`, so the Gluon loop and ``mx.mod.Module`` consume the same
objects.  A batch holds ``data[0]`` shaped ``(N, C, H, W)`` and ``label[0]`` shaped ``(N,)``, both
float32, with ``N == batch_size`` always.

Float16 training: the iterators always yield float32.  The data reaches the network as float16 by a
cast on the device (the cast :func:`mxfp16.cast_block` / :func:`mxfp16.cast_symbol` insert after the
data input), not in the iterator: ``ImageRecordIter`` ignores its ``dtype`` argument (MXNet issue
#9774), and one rule for every source keeps the Gluon and Module paths identical.

Padding: the last batch of an epoch of validation data (:func:`record_iter` with ``train=False``,
:func:`folder_iters`) is filled up by repeating real samples of that batch, and ``batch.pad`` says how
many samples at its end are repeats, so a metric that skips them counts every image exactly once.
Training batches from :func:`record_iter` follow MXNet's ``round_batch``: the last batch is filled
with the first samples of the next epoch, and ``batch.pad`` should be ignored.
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

#: Validation crops the centre ``CROP_RATIO`` of the image (224 from 256): the standard ImageNet protocol.
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
                        f"{missing}, extra: {extra}): give both the same class sub-folders, so labels agree")
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
        If the folder is unusable (see :func:`list_image_folder`) or ``val_fraction`` is out of range.

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
            f"range [0, {num_classes}): pass num_classes=<the number of classes in the data> or fix "
            f"the labels (classes are numbered 0..{num_classes - 1}; {_REBUILD})")


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
