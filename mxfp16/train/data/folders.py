"""Image folders (one sub-folder per class, Caltech layout, or train/ and val/ of such folders):
listing, a seeded stratified split, and Gluon-transform iterators."""
import os
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon.data.vision import transforms

from ... import mxnet_internals
from .augmentation import FolderAugmenter, normalised_tensor, recipe_of
from .workers import WorkerLoader
from .base import (
    COLOR_JITTER,
    CROP_RATIO,
    IMAGE_EXTENSIONS,
    IMAGENET_MEAN_RGB,
    IMAGENET_STD_RGB,
    DataError,
    FixedShapeIter,
    check_image_shape,
    check_part,
    check_positive,
    resize_size,
)

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
# Image folders as iterators
# ---------------------------------------------------------------------------------------------------

def _val_transform(image_shape, mean_rgb, std_rgb, crop_ratio=CROP_RATIO):
    height, width = image_shape[1:]
    return transforms.Compose([transforms.Resize(resize_size(image_shape, crop_ratio),
                                                 keep_ratio=True),
                               transforms.CenterCrop((width, height))]
                              + normalised_tensor(mean_rgb, std_rgb))


def _read_image(path):
    """Decode an image file as ``ImageFolderDataset`` does (RGB, HWC uint8), naming it on failure."""
    try:
        return mx.image.imread(path, flag=1)
    except mx.base.MXNetError:
        raise DataError(f"image {path!r} cannot be decoded: remove or replace it (or pack the folder "
                        "with scripts/prepare_data.py, which skips such files)") from None


class _LoaderIter(FixedShapeIter):
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

    def skip(self, count):
        """Skip the next ``count`` batches of a freshly reset epoch; return how many there were.
        Without workers the skipped images are not read (their indices are drawn from the
        shuffled order only); with workers they are read and dropped."""
        fast = mxnet_internals.dataloader_batches(self._loader, count)
        if fast is not None:
            skipped, self._batches = fast
            return skipped
        for index in range(count):
            if next(self._batches, None) is None:
                return index
        return count


def _loader_iter(items, transform, batch_size, image_shape, shuffle, num_workers):
    dataset = gluon.data.SimpleDataset(list(items)).transform_first(_read_image)
    loader = WorkerLoader(dataset.transform_first(transform), batch_size=batch_size,
                          shuffle=shuffle, last_batch="keep", num_workers=num_workers)
    return _LoaderIter(loader, batch_size, image_shape)


def folder_iters(root, batch_size, image_shape, val_fraction=0.2, seed=0, jitter=COLOR_JITTER,
                 lighting=0.0, mean_rgb=IMAGENET_MEAN_RGB, std_rgb=IMAGENET_STD_RGB, num_workers=0,
                 num_parts=1, part_index=0, augmentation=None, crop_ratio=CROP_RATIO,
                 shard_val=False, exclude=frozenset()):
    """Training and validation batches read straight from an image folder (Gluon transforms).

    The folder is listed and split by :func:`split_image_folder`: ``root/train`` and ``root/val`` when
    both exist, else a stratified split that holds out ``val_fraction`` of each class, seeded by
    ``seed`` (the split ``scripts/prepare_data.py --train-ratio 1-val_fraction --seed seed`` makes).
    The preprocessing matches :func:`record_iter`: training applies ``augmentation`` (default: a
    random resized crop, a random mirror, colour jitter and optional PCA lighting) with
    :class:`~mxfp16.train.data.augmentation.FolderAugmenter`; validation resizes the shorter side to
    ``max(height, width) / crop_ratio`` and takes the centre crop.  ``seed`` fixes the split only; the
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
        ``part_index`` (of the training list in folder order); validation too with ``shard_val``.
    augmentation : mxfp16.train.data.augmentation.Augmentation, optional
        Replaces ``jitter``, ``lighting``, ``mean_rgb`` and ``std_rgb``.
    crop_ratio : float
        Validation centre crop as a fraction of the resized shorter side.
    exclude : set of str
        Image paths to leave out (files found broken, ``--skip-bad-images``).

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
    image_shape = check_image_shape(image_shape)
    check_positive("batch_size", batch_size)
    check_part(num_parts, part_index)
    split = split_image_folder(root, val_fraction, seed)
    if exclude:
        split = ImageFolderSplit(split.classes, tuple(i for i in split.train if i[0] not in exclude),
                                 tuple(i for i in split.val if i[0] not in exclude),
                                 split.non_images)
    shard = split.train[part_index::num_parts]
    if not shard:
        raise DataError(f"part {part_index} of {num_parts} of image folder {root!r} has no training "
                        f"image ({len(split.train)} in all): use fewer workers or more images")
    aug = recipe_of(augmentation, jitter, lighting, mean_rgb, std_rgb)
    train_transform = FolderAugmenter(aug, image_shape)
    train_data = _loader_iter(shard, train_transform, batch_size, image_shape,
                              shuffle=True, num_workers=num_workers)
    val_data = None
    val_list = split.val[part_index::num_parts] if shard_val else split.val
    if val_list:
        val_transform = _val_transform(image_shape, aug.rgb_mean, aug.rgb_std, crop_ratio)
        val_data = _loader_iter(val_list, val_transform, batch_size, image_shape,
                                shuffle=False, num_workers=num_workers)
    return train_data, val_data, split.classes

