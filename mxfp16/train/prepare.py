"""Pack an image folder into training and validation RecordIO files, as MXNet's tools/im2rec.py does.

The output directory receives ``train.lst``/``train.rec``/``train.idx``, the same three for ``val``,
and ``classes.txt`` (one class name per line, line ``i`` is label ``i``).  Every file is first written
under a temporary directory inside the output directory and renamed into place only when all of them
are complete, so a failed or interrupted run never leaves half-written files over a previous result.
"""
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass

import cv2
import mxnet as mx
import numpy as np
from tqdm import tqdm

from .data import DataError, split_image_folder

logger = logging.getLogger(__name__)

#: The split names, the file kinds written for each, and the class list's file name.
SPLITS = ("train", "val")
SPLIT_SUFFIXES = (".lst", ".rec", ".idx")
CLASSES_FILE = "classes.txt"

#: im2rec.py's defaults: JPEG quality 95 keeps artefacts below what augmentation changes.
DEFAULT_QUALITY = 95
DEFAULT_TRAIN_RATIO = 0.8

#: The summary line names at most this many skipped files; the log names all of them.
MAX_NAMED_SKIPS = 5


@dataclass(frozen=True)
class PreparedData:
    """What :func:`prepare_dataset` wrote.

    Attributes
    ----------
    out_dir : str
        The output directory.
    classes : tuple of str
        Class names in label order.
    num_train, num_val : int
        Images written to each split.
    skipped : tuple of (str, str)
        ``(path relative to the image folder, reason)`` of every file left out.
    """

    out_dir: str
    classes: tuple
    num_train: int
    num_val: int
    skipped: tuple

    def path(self, split, suffix):
        """Path of an output file, e.g. ``path('train', '.rec')``."""
        return os.path.join(self.out_dir, split + suffix)

    @property
    def train_rec(self):
        return self.path("train", ".rec")

    @property
    def train_idx(self):
        return self.path("train", ".idx")

    @property
    def val_rec(self):
        return self.path("val", ".rec")

    @property
    def val_idx(self):
        return self.path("val", ".idx")

    @property
    def classes_file(self):
        return os.path.join(self.out_dir, CLASSES_FILE)

    def summary(self):
        """One line: what was written where, and which files were skipped."""
        line = (f"wrote {self.num_train} train + {self.num_val} val images in {len(self.classes)} "
                f"classes to {self.out_dir}")
        if not self.skipped:
            return line
        names = [name for name, _ in self.skipped[:MAX_NAMED_SKIPS]]
        more = len(self.skipped) - len(names)
        named = ", ".join(names) + (f" and {more} more (see the log)" if more else "")
        return f"{line} ({len(self.skipped)} skipped: {named})"


def _check_settings(resize, quality, train_ratio):
    if not isinstance(resize, (int, np.integer)) or resize < 0:
        raise DataError(f"resize must be an integer >= 0, got {resize!r}: the shorter side in pixels "
                        "(e.g. --resize 256 for ImageNet training at 224), or 0 to keep the size")
    if not isinstance(quality, (int, np.integer)) or not 1 <= quality <= 100:
        raise DataError(f"quality must be an integer in [1, 100], got {quality!r}: the JPEG quality "
                        f"(default {DEFAULT_QUALITY})")
    if not isinstance(train_ratio, (int, float)) or not 0 < train_ratio <= 1:
        raise DataError(f"train ratio must be in (0, 1], got {train_ratio!r}: the fraction of each "
                        "class used for training, e.g. 0.8 (the rest is validation)")


def load_image(path, resize=0):
    """Decode an image file as BGR uint8 and resize its shorter side (im2rec.py's ``--resize``).

    Parameters
    ----------
    path : str
        The image file.
    resize : int
        New length of the shorter side in pixels (the aspect ratio is kept); 0 keeps the size.

    Returns
    -------
    numpy.ndarray or None
        ``(height, width, 3)`` uint8, or None if the file cannot be decoded.

    Examples
    --------
    >>> import os, tempfile, numpy as np, cv2
    >>> path = os.path.join(tempfile.mkdtemp(), "image.png")
    >>> _ = cv2.imwrite(path, np.zeros((40, 60), np.uint8))
    >>> load_image(path, resize=20).shape
    (20, 30, 3)
    """
    image = cv2.imread(path, cv2.IMREAD_COLOR)
    if image is None or not resize:
        return image
    height, width = image.shape[:2]
    scale = resize / min(height, width)
    size = (max(1, round(width * scale)), max(1, round(height * scale)))
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_CUBIC
    return cv2.resize(image, size, interpolation=interpolation)


def _write_split(items, root, prefix, resize, quality, progress):
    """Pack ``(path, label)`` items into ``prefix.rec``/``.idx``/``.lst``; return (count, skipped)."""
    record = mx.recordio.MXIndexedRecordIO(prefix + ".idx", prefix + ".rec", "w")
    lines, skipped = [], []
    try:
        for path, label in tqdm(items, desc=os.path.basename(prefix), unit="img", disable=not progress):
            name = os.path.relpath(path, root).replace(os.sep, "/")
            image = load_image(path, resize)
            if image is None:
                skipped.append((name, "cannot be decoded as an image"))
                continue
            key = len(lines)
            header = mx.recordio.IRHeader(0, float(label), key, 0)
            record.write_idx(key, mx.recordio.pack_img(header, image, quality=quality, img_fmt=".jpg"))
            lines.append(f"{key}\t{float(label):f}\t{name}\n")
    finally:
        record.close()
    with open(prefix + ".lst", "w") as list_file:
        list_file.writelines(lines)
    return len(lines), skipped


def _shuffled(items, rng):
    """Records in a seeded random order, as im2rec.py shuffles: shards and unshuffled readers then
    see every class."""
    return [items[i] for i in rng.permutation(len(items))]


def _write_all(split, root, work_dir, resize, quality, seed, progress):
    """Write every output file into ``work_dir``; return ({split: count}, skipped)."""
    rng = np.random.RandomState(seed)
    counts, skipped = {}, []
    for name, items in zip(SPLITS, (split.train, split.val)):
        prefix = os.path.join(work_dir, name)
        counts[name], split_skipped = _write_split(_shuffled(items, rng), root, prefix, resize,
                                                   quality, progress)
        skipped += split_skipped
    with open(os.path.join(work_dir, CLASSES_FILE), "w") as classes_file:
        classes_file.writelines(name + "\n" for name in split.classes)
    return counts, skipped


def _publish(work_dir, out_dir):
    """Move the finished files into place (each rename is atomic)."""
    for name in sorted(os.listdir(work_dir)):
        os.replace(os.path.join(work_dir, name), os.path.join(out_dir, name))


def prepare_dataset(root, out_dir, resize=0, quality=DEFAULT_QUALITY,
                    train_ratio=DEFAULT_TRAIN_RATIO, seed=0, progress=False):
    """Pack an image folder into ``train``/``val`` ``.lst`` + ``.rec`` + ``.idx`` and ``classes.txt``.

    Classes are the sorted sub-folder names, numbered from 0.  If ``root`` has ``train/`` and ``val/``
    sub-folders they are the split (``train_ratio`` is not used); otherwise ``train_ratio`` of each class
    goes to training, picked by a permutation seeded by ``seed`` (see
    :func:`mxfp16.train.data.split_image_folder`), and each split is written in a seeded random order.
    Files that are not images, or that cannot be decoded, are logged and skipped.  An empty split
    gives empty ``.rec``/``.idx``/``.lst`` files.

    Parameters
    ----------
    root : str
        The image folder.
    out_dir : str
        The output directory (created if needed).
    resize : int
        Shorter side of the stored images in pixels (aspect kept); 0 stores them at their size.
    quality : int
        JPEG quality of the stored images, 1..100.
    train_ratio : float
        Fraction of each class used for training, in (0, 1].
    seed : int
        Seed of the split and of the record order.
    progress : bool
        Show a progress bar on stderr.

    Returns
    -------
    PreparedData
        The counts, classes, skipped files and output paths.

    Raises
    ------
    DataError
        If the folder or a setting is unusable, or no image could be decoded; nothing in ``out_dir``
        is changed then.

    Examples
    --------
    >>> import os, tempfile, numpy as np, cv2
    >>> root, out_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    >>> for name in ("cat/1.jpg", "cat/2.jpg", "dog/1.jpg", "dog/2.jpg"):
    ...     os.makedirs(os.path.dirname(os.path.join(root, name)), exist_ok=True)
    ...     _ = cv2.imwrite(os.path.join(root, name), np.zeros((20, 24, 3), np.uint8))
    >>> prepared = prepare_dataset(root, out_dir, train_ratio=0.5)
    >>> prepared.summary() == f"wrote 2 train + 2 val images in 2 classes to {out_dir}"
    True
    >>> sorted(os.listdir(out_dir))  # doctest: +NORMALIZE_WHITESPACE
    ['classes.txt', 'train.idx', 'train.lst', 'train.rec', 'val.idx', 'val.lst', 'val.rec']
    """
    _check_settings(resize, quality, train_ratio)
    split = split_image_folder(root, val_fraction=1.0 - train_ratio, seed=seed)
    os.makedirs(out_dir, exist_ok=True)
    work_dir = tempfile.mkdtemp(prefix=".prepare-", dir=out_dir)
    try:
        counts, skipped = _write_all(split, root, work_dir, resize, quality, seed, progress)
        if not any(counts.values()):
            raise DataError(f"none of the images in {root!r} can be decoded: check that they are "
                            "JPEG or PNG files")
        _publish(work_dir, out_dir)
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    skipped = sorted([(os.path.relpath(path, root).replace(os.sep, "/"), "not an image file")
                      for path in split.non_images] + skipped)
    for name, reason in skipped:
        logger.warning("skipped %s: %s", name, reason)
    return PreparedData(out_dir, split.classes, counts["train"], counts["val"], tuple(skipped))
