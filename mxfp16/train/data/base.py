"""What every data source shares: the batch conventions, checks, synthetic data and label checks.

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

import mxnet as mx
import numpy as np

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

REBUILD_HINT = "rebuild it with scripts/prepare_data.py (or MXNet's tools/im2rec.py)"


class DataError(ValueError):
    """A data set, a data file or a data-preparation setting that cannot work.

    The message names the file or folder, what is wrong with it and how to fix it; scripts print it as
    one ``error: ...`` line and exit with code 2.
    """


def check_image_shape(image_shape):
    shape = tuple(image_shape) if isinstance(image_shape, (tuple, list)) else ()
    if len(shape) != 3 or shape[0] != 3 or not all(
            isinstance(size, (int, np.integer)) and size > 0 for size in shape):
        raise ValueError(f"image_shape must be (3, height, width) with positive integers, got "
                         f"{image_shape!r}: for example image_shape=(3, 224, 224)")
    return tuple(int(size) for size in shape)


def check_positive(name, value):
    if not isinstance(value, (int, np.integer)) or value <= 0:
        raise ValueError(f"{name} must be a positive integer, got {value!r}: for example {name}=32")


def check_part(num_parts, part_index):
    check_positive("num_parts", num_parts)
    if not isinstance(part_index, (int, np.integer)) or not 0 <= part_index < num_parts:
        raise ValueError(f"part_index must be an integer in [0, num_parts={num_parts}), got "
                         f"{part_index!r}: pass the worker's rank (e.g. part_index=kv.rank)")



# ---------------------------------------------------------------------------------------------------
# Iterators
# ---------------------------------------------------------------------------------------------------

class FixedShapeIter(mx.io.DataIter):
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


class _SyntheticIter(FixedShapeIter):
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

    def skip(self, count):
        """Skip ``count`` batches; return how many there were."""
        skipped = min(count, self._num_batches - self._served)
        self._served += skipped
        return skipped


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
    image_shape = check_image_shape(image_shape)
    for name, value in (("batch_size", batch_size), ("num_classes", num_classes),
                        ("num_batches", num_batches)):
        check_positive(name, value)
    return _SyntheticIter(batch_size, image_shape, num_classes, num_batches, seed)


def _check_batch_labels(labels, num_classes, batch_index):
    valid = (labels >= 0) & (labels < num_classes) & (labels == np.floor(labels))
    if not valid.all():
        bad = labels[~valid].flat[0]
        raise DataError(
            f"label {bad:g} in batch {batch_index} (counting from 0) is not a class index in the valid "
            f"range [0, {num_classes}): set the number of classes (--num-classes) to that of the "
            f"data or fix the labels (classes are numbered 0..{num_classes - 1}; {REBUILD_HINT})")


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

    @property
    def skip(self):
        """The wrapped iterator's ``skip(count)``, counting the batches for the messages; None
        (``AttributeError``) when it has none."""
        inner = self._data_iter.skip

        def skip(count):
            skipped = inner(count)
            self._batch_index += skipped
            return skipped
        return skip


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
    mxfp16.train.data.base.DataError: label 3 in batch 1 (counting from 0) is not a class index in ...
    """
    check_positive("num_classes", num_classes)
    return _LabelCheckIter(data_iter, num_classes)



def resize_size(image_shape, crop_ratio=CROP_RATIO):
    """Shorter side to resize to before the validation centre crop (256 for 224 and 0.875:
    GluonCV's ``ceil(input_size / crop_ratio)``)."""
    return int(math.ceil(max(image_shape[1:]) / crop_ratio))
