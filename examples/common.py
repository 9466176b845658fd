"""What the examples share: the command-line flags every example has, the devices they choose, and a
text corpus that is on every machine without a download (the docstrings of Python's standard library).

Nothing here is mxfp16: it is the plumbing a user's own script would have.
"""
import argparse
import importlib
import inspect
import sys

import mxnet as mx

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


def run(main, argv=None):
    """Run an example's ``main``: a user error is one ``error:`` line and exit code 2."""
    try:
        return main(argv)
    except UsageError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
