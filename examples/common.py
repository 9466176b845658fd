"""What the examples share: the command-line flags every example has, the devices they choose, and a
text corpus that is on every machine without a download (the docstrings of Python's standard library).

Nothing here is mxfp16: it is the plumbing a user's own script would have.
"""
import argparse
import importlib
import inspect
import sys

import mxnet as mx
import numpy as np

#: Standard-library modules whose docstrings make the examples' text corpus: long, English, and in
#: every CPython since 3.7 (their wording changes a little between versions).
DOC_MODULES = ("argparse", "collections", "csv", "datetime", "decimal", "functools", "inspect",
               "json", "logging", "os", "pathlib", "pickle", "random", "re", "shutil", "socket",
               "string", "subprocess", "tarfile", "textwrap", "threading", "typing", "unittest",
               "urllib.parse", "zipfile")

DTYPES = ("float32", "float16", "bfloat16")


class UsageError(ValueError):
    """A bad command-line value: printed as one line, exit code 2 (other errors keep their traceback)."""


class ExampleParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one ``error: ...`` line and exit code 2."""

    def error(self, message):
        self.exit(2, f"error: {message}\n")


def make_parser(description, epochs, batch_size, lr):
    """The flags every example has: dtype, devices, epochs, batch size, learning rate, seed."""
    parser = ExampleParser(description=description)
    add = parser.add_argument
    add("--dtype", default="float16", choices=DTYPES,
        help="training dtype; float16 runs in CPU emulation without a GPU (default: float16)")
    add("--gpus", default="", help="GPU ids, e.g. 0 or 0,1 (default: none, train on the CPU)")
    add("--cpus", type=int, default=None,
        help="N CPU devices, data parallel as over N GPUs; replaces --gpus (default: 1)")
    add("--num-epochs", type=int, default=epochs, help=f"epochs to train (default: {epochs})")
    add("--batch-size", type=int, default=batch_size,
        help=f"batch size over all devices (default: {batch_size})")
    add("--lr", type=float, default=lr, help=f"learning rate (default: {lr:g})")
    add("--seed", type=int, default=0, help="seed of data order and weights (default: 0)")
    return parser


def devices(gpus="", cpus=None):
    """The contexts of ``--gpus`` / ``--cpus``: ``'0,1'`` -> [gpu(0), gpu(1)]; default [cpu(0)].

    Raises
    ------
    UsageError
        For a malformed ``--gpus``, or both flags given.
    """
    text = str(gpus or "").strip()
    if text and cpus is not None:
        raise UsageError(f"--gpus {text} and --cpus {cpus} both choose the devices: pass one of them")
    if text:
        try:
            ids = [int(i) for i in text.split(",")]
        except ValueError:
            raise UsageError(f"--gpus {text!r}: write GPU ids separated by commas, e.g. 0,1") from None
        found = mx.context.num_gpus()
        if max(ids) >= found:
            raise UsageError(f"--gpus {text}: MXNet sees {found} GPU(s); leave --gpus out to train "
                             "on the CPU (float16 is emulated there), or --cpus N to rehearse N devices")
        return [mx.gpu(i) for i in ids]
    if cpus is not None and cpus < 1:
        raise UsageError(f"--cpus {cpus}: pass a number of devices >= 1")
    return [mx.cpu(i) for i in range(cpus or 1)]


def check_positive(args, *names):
    """Raise UsageError naming the first of ``names`` whose value in ``args`` is not > 0."""
    for name in names:
        value = getattr(args, name)
        if not value > 0:
            flag = "--" + name.replace("_", "-")
            raise UsageError(f"{flag} {value}: pass a number > 0")


def stdlib_docstrings(modules=DOC_MODULES):
    """The docstrings of ``modules``, of their public classes and functions, and of those classes'
    public methods.

    Returns
    -------
    list of (str, str)
        ``(module name, docstring)`` pairs, in a fixed order.
    """
    docs = []
    for name in modules:
        module = importlib.import_module(name)
        members = [module] + [value for key, value in sorted(vars(module).items())
                              if not key.startswith("_") and getattr(value, "__module__", None) == name
                              and (inspect.isclass(value) or inspect.isfunction(value))]
        methods = [method for member in members[1:] if inspect.isclass(member)
                   for key, method in sorted(vars(member).items())
                   if not key.startswith("_") and inspect.isfunction(method)]
        docs += [(name, doc) for doc in (inspect.getdoc(member) for member in members + methods)
                 if doc]
    return docs


#: The digits' classes, as a detector's ``classes``.
DIGIT_CLASSES = tuple(str(digit) for digit in range(10))


def digit_detection_set(num_images, size=128, seed=0, max_digits=3, split="train"):
    """A detection data set made of scikit-learn's handwritten digits (shipped with it: no download)
    scaled up and placed at random on a noisy canvas, with their boxes and classes.

    Each image holds 1 to ``max_digits`` digits that do not overlap, each scaled by a whole factor to
    a side of 16 to 40 pixels at ``size=128`` (in proportion at other sizes) and tinted a random colour; the
    box is the tight box of the digit's ink.  ``split='train'`` draws from four fifths of the 1797
    digits and ``'test'`` from the other fifth, so test digits are unseen ones.  The same arguments
    give the same images.

    Returns
    -------
    tuple of numpy.ndarray
        ``(images, labels)``: float32 ``(N, 3, size, size)`` in [0, 1], and float32
        ``(N, max_digits, 5)`` rows ``xmin, ymin, xmax, ymax, class`` in pixels, padded with -1
        (GluonCV's layout of ground truths).

    >>> images, labels = digit_detection_set(2, size=64, seed=1)
    >>> images.shape, labels.shape
    ((2, 3, 64, 64), (2, 3, 5))
    """
    from sklearn.datasets import load_digits

    if split not in ("train", "test"):
        raise UsageError(f"split {split!r}: choose 'train' or 'test'")
    digits = load_digits()
    chosen = np.arange(len(digits.images)) % 5 == (4 if split == "test" else 0)
    chosen = ~chosen if split == "train" else chosen
    glyphs, classes = digits.images[chosen] / 16.0, digits.target[chosen]
    rng = np.random.RandomState(seed)
    images = rng.uniform(0, 0.15, (num_images, 3, size, size)).astype(np.float32)
    labels = np.full((num_images, max_digits, 5), -1, np.float32)
    for index in range(num_images):
        boxes = []
        for _ in range(rng.randint(1, max_digits + 1)):
            pick = rng.randint(len(glyphs))
            scale = max(1, round(rng.randint(2, 6) * size / 128))
            glyph = np.kron(glyphs[pick], np.ones((scale, scale)))
            box = _place(glyph, size, boxes, rng)
            if box is None:
                continue
            x, y = box
            ink = np.argwhere(glyph > 0.25)
            (top, left), (bottom, right) = ink.min(0), ink.max(0) + 1
            colour = rng.uniform(0.5, 1.0, (3, 1, 1))
            patch = images[index, :, y:y + glyph.shape[0], x:x + glyph.shape[1]]
            np.maximum(patch, glyph[None] * colour, out=patch)
            labels[index, len(boxes)] = (x + left, y + top, x + right, y + bottom, classes[pick])
            boxes.append((x, y, x + glyph.shape[1], y + glyph.shape[0]))
    return images, labels


def detection_map(net, images, labels, batch_size=50, ctx=None):
    """A detector's VOC07 mAP at IoU 0.5 (GluonCV's ``VOC07MApMetric``, as GluonCV's training
    scripts validate) on ``images`` and ``labels`` of :func:`digit_detection_set`.

    ``net(x)`` must return GluonCV's ``(ids, scores, bboxes)``; boxes are clipped to the image as
    GluonCV's scripts do.  The network is called in inference mode on ``ctx`` (default: CPU).
    """
    from gluoncv.utils.metrics.voc_detection import VOC07MApMetric

    ctx = ctx or mx.cpu()
    metric = VOC07MApMetric(iou_thresh=0.5, class_names=DIGIT_CLASSES)
    for start in range(0, len(images), batch_size):
        ids, scores, bboxes = net(mx.nd.array(images[start:start + batch_size], ctx=ctx))
        truth = labels[start:start + batch_size]
        metric.update(bboxes.clip(0, images.shape[-1]), ids, scores, truth[:, :, :4],
                      truth[:, :, 4:5])
    return float(metric.get()[1][-1])

def _place(glyph, size, boxes, rng, tries=20):
    """A top-left corner where ``glyph`` lies inside the canvas and off every box, or None."""
    height, width = glyph.shape
    for _ in range(tries):
        x, y = rng.randint(0, size - width + 1), rng.randint(0, size - height + 1)
        if all(x >= right or x + width <= left or y >= bottom or y + height <= top
               for left, top, right, bottom in boxes):
            return x, y
    return None

def fit(train_one_epoch, evaluate, num_epochs, net, trainer, loss_fn, train_data, val_data, ctx):
    """Train ``num_epochs`` epochs with the example's own loops: each epoch
    ``train_one_epoch(net, trainer, loss_fn, train_data, ctx)`` (the mean training loss), then
    ``evaluate(net, val_data, ctx)`` (the validation accuracy), and one line printed.

    Returns the last epoch's ``(train_loss, val_acc)``."""
    for epoch in range(num_epochs):
        train_loss = train_one_epoch(net, trainer, loss_fn, train_data, ctx)
        val_acc = evaluate(net, val_data, ctx)
        print(f"epoch {epoch}: train loss {train_loss:.3f}, val accuracy {val_acc:.3f}, "
              f"loss scale {trainer.loss_scale:g}")
    return train_loss, val_acc


def run(main, argv=None):
    """Run an example's ``main``: a user error is one ``error:`` line and exit code 2."""
    try:
        return main(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
