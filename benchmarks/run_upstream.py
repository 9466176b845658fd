"""Run an upstream training script (GluonCV's ``train_ssd.py``, ``train_yolo3.py``, ...) unchanged and
offline, for the script comparisons in docs/benchmarks.md.

The scripts ask GluonCV's model zoo for ImageNet-pretrained backbones (``pretrained_base=True``),
which would be downloaded; nothing can be downloaded here.  This runner gives the script one of two
stand-ins and refuses any other download:

* ``--random-base``: every zoo network is built with ``pretrained_base=False`` (the backbone starts
  from random weights, as ``net.initialize()`` leaves it);
* ``--backbone NAME=FILE``: the model store hands ``FILE`` to the zoo where it would fetch the
  pretrained weights of ``NAME`` (for example ``mobilenet0.25``, pretrained on digits by
  ``benchmarks/digit_backbone.py``).

It also samples the process's resident memory (``VmRSS``) every ``--rss-interval`` seconds into
``--rss-log`` and, when the script trained through ``mxfp16.amp``, prints each Trainer's final
loss scale and skipped-step count at exit (the scripts log neither).

The script itself is not part of mxfp16: get it from its project (for the ``--amp`` run, a copy
with the one line ``from mxnet.contrib import amp`` → ``from mxfp16 import amp``).

Usage: python benchmarks/run_upstream.py [--random-base | --backbone NAME=FILE] [--rss-log FILE]
       SCRIPT.py [SCRIPT ARGS...]
"""
import argparse
import atexit
import os
import runpy
import sys
import threading
import time


def resident_gb():
    """The process's resident set size in GB (``VmRSS`` of /proc/self/status)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS"):
                return int(line.split()[1]) / 1e6
    return float("nan")


def sample_memory(path, interval):
    """Append ``seconds GB`` lines to ``path`` every ``interval`` seconds, from a daemon thread."""
    start = time.time()

    def sample():
        with open(path, "a") as log:
            while True:
                log.write(f"{time.time() - start:.0f} {resident_gb():.3f}\n")
                log.flush()
                time.sleep(interval)
    threading.Thread(target=sample, daemon=True).start()


def offline_model_store(backbones, random_base):
    """Route GluonCV's model store to ``backbones`` (name -> file); with ``random_base`` build every
    zoo network with ``pretrained_base=False``.  Any other weight file raises instead of
    downloading."""
    import gluoncv.model_zoo as zoo
    import gluoncv.model_zoo.model_store as store

    def get_model_file(name, tag=None, root=None):  # noqa: ARG001 - the store's signature
        if name in backbones:
            return backbones[name]
        raise RuntimeError(f"offline: no weights for {name!r}; pass --backbone {name}=FILE "
                           "or --random-base")
    store.get_model_file = get_model_file
    if random_base:
        zoo_get_model = zoo.get_model

        def get_model(name, **kwargs):
            if "pretrained_base" in kwargs:  # not the backbones' own get_model(pretrained=...)
                kwargs["pretrained_base"] = False
            return zoo_get_model(name, **kwargs)
        zoo.get_model = get_model


def report_loss_scalers():
    """Print, at exit, the loss scale and skipped steps of each Trainer ``mxfp16.amp`` scales."""
    import mxfp16.amp as amp

    trainers = []
    init_trainer = amp.init_trainer

    def recording_init_trainer(optimizer_or_trainer, *args, **kwargs):
        trainers.append(optimizer_or_trainer)
        return init_trainer(optimizer_or_trainer, *args, **kwargs)
    # both import forms: `from mxfp16 import amp` and GluonNLP's `from mxfp16.amp import amp`
    amp.init_trainer = amp.amp.init_trainer = recording_init_trainer

    def report():
        for trainer in trainers:
            scaler = amp.loss_scaler(trainer)
            print(f"mxfp16.amp loss scaler: final scale {scaler.loss_scale}, "
                  f"skipped steps {scaler.num_skipped}", flush=True)
    atexit.register(report)


def parse_backbone(text):
    name, sep, path = text.partition("=")
    if not sep or not name or not os.path.isfile(path):
        raise argparse.ArgumentTypeError(
            f"{text!r}: give NAME=FILE with an existing parameters file, e.g. "
            "mobilenet0.25=/tmp/mobilenet0.25_digits.params")
    return name, path


def get_args_parser():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    base = parser.add_mutually_exclusive_group()
    base.add_argument("--random-base", action="store_true",
                      help="build zoo networks with pretrained_base=False (default: off)")
    base.add_argument("--backbone", type=parse_backbone, action="append", default=[],
                      help="NAME=FILE: the weights the zoo loads for NAME (repeatable)")
    parser.add_argument("--rss-log", default="", help="file to append VmRSS samples to "
                        "(default: none)")
    parser.add_argument("--rss-interval", type=float, default=30.0,
                        help="seconds between samples (default: 30)")
    parser.add_argument("script", help="the training script to run")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="its arguments")
    return parser


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    if not os.path.isfile(args.script):
        print(f"error: script {args.script!r} not found; pass the path of a training script",
              file=sys.stderr)
        return 2
    offline_model_store(dict(args.backbone), args.random_base)
    if args.rss_log:
        sample_memory(args.rss_log, args.rss_interval)
    report_loss_scalers()
    sys.argv = [args.script, *args.script_args]
    runpy.run_path(args.script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
