"""Shared fixtures: a tiny image folder of real JPEG files, the RecordIO files built from it, and a
loader for the scripts' ``main`` functions.  Everything is generated inside the test session."""
import contextlib
import functools
import importlib.util
import os
import subprocess
import sys

import cv2
import mxnet as mx
import numpy as np
import pytest

from mxfp16.train.data import synthetic_iter
from mxfp16.train.prepare import prepare_dataset

#: Class name -> dominant colour (BGR, as cv2 writes).  The classes differ in colour, so a tiny network
#: learns them in a few epochs even through crops, flips and colour jitter; noise keeps it from
#: being trivial.  Sorted names give the labels: blue 0, green 1, red 2, yellow 3.
IMAGE_CLASSES = {"blue": (200, 40, 40), "green": (40, 200, 40), "red": (40, 40, 200),
                 "yellow": (40, 200, 200)}
IMAGES_PER_CLASS = 12
IMAGE_HEIGHT, IMAGE_WIDTH = 40, 48

SCRIPTS_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "scripts")
BENCHMARKS_DIR = os.path.join(os.path.dirname(SCRIPTS_DIR), "benchmarks")
EXAMPLES_DIR = os.path.join(os.path.dirname(SCRIPTS_DIR), "examples")


def write_image_folder(root, images_per_class=IMAGES_PER_CLASS, seed=0):
    """Write ``root/<class>/<i>.jpg`` for every class of ``IMAGE_CLASSES``: the class colour plus
    Gaussian noise (std 30), ``IMAGE_HEIGHT`` x ``IMAGE_WIDTH`` pixels."""
    rng = np.random.RandomState(seed)
    for name, colour in IMAGE_CLASSES.items():
        os.makedirs(os.path.join(root, name), exist_ok=True)
        for index in range(images_per_class):
            noise = rng.normal(0, 30, (IMAGE_HEIGHT, IMAGE_WIDTH, 3))
            image = np.clip(np.array(colour) + noise, 0, 255).astype(np.uint8)
            cv2.imwrite(os.path.join(root, name, f"{index:02d}.jpg"), image)
    return root


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory):
    """Path (``pathlib.Path``) of an image folder: 4 classes (blue, green, red, yellow = labels 0..3)
    x 12 JPEG images of 40 x 48 pixels, in ``<root>/<class>/00.jpg`` ... ``11.jpg``.  Read-only:
    tests that change it copy it first."""
    return write_image_folder(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="session")
def rec_files(image_folder, tmp_path_factory):
    """:class:`mxfp16.train.prepare.PreparedData` of the RecordIO files built from ``image_folder`` with
    ``train_ratio=0.75, seed=0`` (what scripts/prepare_data.py runs): 36 train + 12 val images
    (9 + 3 per class), 4 classes.  Paths: ``.train_rec``, ``.train_idx``, ``.val_rec``, ``.val_idx``,
    ``.classes_file``; also ``.classes`` and ``.num_train`` / ``.num_val``.  Read-only."""
    out_dir = tmp_path_factory.mktemp("rec")
    return prepare_dataset(str(image_folder), str(out_dir), train_ratio=0.75, seed=0)


def load_module(folder, name, prefix):
    """``<folder>/<name>.py`` as a module named ``<prefix>_<name>`` (the scripts, benchmarks and
    examples are not packages)."""
    spec = importlib.util.spec_from_file_location(f"{prefix}_{name}",
                                                  os.path.join(folder, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_script_main(name):
    """The ``main`` function of ``scripts/<name>.py``."""
    return load_module(SCRIPTS_DIR, name, "scripts").main


@pytest.fixture
def script_main():
    """A loader of script entry points: ``script_main("prepare_data")(["root", "out"])``."""
    return load_script_main


@pytest.fixture
def load_benchmark(monkeypatch):
    """``load_benchmark("cast_time")`` -> the module benchmarks/cast_time.py (with its sibling
    ``bench_common`` importable, as when the script runs)."""
    monkeypatch.syspath_prepend(BENCHMARKS_DIR)

    return lambda name: load_module(BENCHMARKS_DIR, name, "benchmarks")


def chosen_items(request, name):
    """The items of the test function ``name`` of the requesting module that this session runs
    (after ``-k``, ``-m`` and deselection): what a module fixture that starts their work ahead
    of them should start."""
    return [item for item in request.session.items
            if getattr(item, "module", None) is request.module
            and getattr(item, "originalname", None) == name]


@contextlib.contextmanager
def started_ahead(request, test, args, timeout, **popen):
    """In a module fixture: start ``args`` now if the session runs ``test`` of the requesting
    module, so that the process works on one core while the tests before ``test`` run here on the
    other.  Yields a callable giving its ``CompletedProcess`` (waited for once, up to ``timeout``
    seconds), or None; a process still running when the fixture ends is killed."""
    if not chosen_items(request, test):
        yield None
        return
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               **popen)

    @functools.cache
    def result():
        stdout, stderr = process.communicate(timeout=timeout)
        return subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    try:
        yield result
    finally:
        if process.poll() is None:  # the test did not ask (-x)
            process.kill()
        process.communicate()


def slow_except(values, fast):
    """``values`` for ``pytest.mark.parametrize``, those not in ``fast`` marked slow: the fast tier
    (``-m "not slow"``) runs a few small cases of a sweep, the full suite all of them."""
    return [value if value in fast else pytest.param(value, marks=pytest.mark.slow)
            for value in values]


class PoisonedIter(mx.io.DataIter):
    """Synthetic batches; in those of ``poisoned``, the images from row ``first_row`` on hold values
    that overflow float16 (inf gradients): all of them by default, or only the part of the batch
    that lands on the second of two devices with ``first_row=batch_size // 2``."""

    def __init__(self, num_batches, poisoned, batch_size, image_shape, first_row=0):
        super().__init__(batch_size)
        self._data = synthetic_iter(batch_size, image_shape, 4, num_batches, seed=1)
        self._poisoned, self._index = set(poisoned), 0
        self._scale = mx.nd.array([1.0] * first_row + [1e6] * (batch_size - first_row)).reshape(
            (batch_size, 1, 1, 1))
        self.provide_data, self.provide_label = self._data.provide_data, self._data.provide_label

    def reset(self):
        self._data.reset()
        self._index = 0

    def next(self):
        batch = self._data.next()
        if self._index in self._poisoned:
            batch = mx.io.DataBatch([batch.data[0] * self._scale], batch.label, pad=0)
        self._index += 1
        return batch


def horovod_missing():
    """Why the Horovod jobs cannot run here (None when they can), found without importing
    ``horovod.mxnet``: its library, loaded with RTLD_GLOBAL, would stay in the test process."""
    import glob
    import importlib.util

    try:
        spec = importlib.util.find_spec("horovod.mxnet")
    except ImportError:
        spec = None
    if spec is None:
        return "Horovod is not installed"
    if not glob.glob(os.path.join(os.path.dirname(spec.origin), "mpi_lib*.so")):
        return "Horovod was built without MXNet support (HOROVOD_WITH_MXNET=1)"
    return None


def pytest_report_header(config):
    """Say at the top of every run whether tests/test_horovod.py runs its horovodrun jobs."""
    reason = horovod_missing()
    if reason is None:
        return "horovod: installed for MXNet; tests/test_horovod.py runs its horovodrun jobs"
    return (f"horovod: {reason}; tests/test_horovod.py skips its horovodrun jobs "
            "(pip install -e \".[horovod]\" as docs/distributed.md says)")


def load_example(name):
    """The example ``examples/<name>.py`` as a module (its directory on sys.path for ``common``)."""
    if EXAMPLES_DIR not in sys.path:
        sys.path.insert(0, EXAMPLES_DIR)
    return load_module(EXAMPLES_DIR, name, "example")
