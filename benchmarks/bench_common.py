"""Shared pieces of the benchmark scripts: the machine description, the digits data set and the
result files (Markdown table + JSON next to each other).

The scripts import it as a sibling module (``python benchmarks/<name>.py`` puts this folder on
``sys.path``); it is not part of the mxfp16 package because only the benchmarks use it.
"""
import dataclasses
import datetime
import importlib.util
import json
import os
import sys
import platform
import shlex
import statistics

import mxnet as mx
import numpy as np

#: Where the scripts write their results unless --out-dir says otherwise.
DEFAULT_OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")

#: The digits split: a quarter of each class held out for testing, always the same quarter.
DIGITS_TEST_FRACTION = 0.25
DIGITS_SPLIT_SEED = 0


def cpu_model():
    """The CPU model as /proc/cpuinfo names it (``platform.processor()`` elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_info():
    """CPU, core count, library versions and the date: what a result needs to be compared."""
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "mxnet": mx.__version__,
            "numpy": np.__version__, "python": platform.python_version(),
            "gpus": mx.context.num_gpus(),
            "date": datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")}


def command_line(script, argv):
    """The command that reproduces a run, as a user would type it from the repository root."""
    return " ".join(["python", f"benchmarks/{script}.py"] + [shlex.quote(arg) for arg in argv])


def digits_split():
    """scikit-learn's handwritten digits (1797 8x8 images, bundled offline), split per class.

    Returns
    -------
    tuple
        ``(train_x, train_y), (test_x, test_y)``: images as float32 ``(N, 1, 8, 8)`` scaled to [0, 1],
        labels as float32 class indices; 1347 training and 450 test images.
    """
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    images, labels = load_digits(return_X_y=True)
    images = (images / 16.0).reshape(-1, 1, 8, 8).astype("float32")
    train_x, test_x, train_y, test_y = train_test_split(
        images, labels.astype("float32"), test_size=DIGITS_TEST_FRACTION,
        random_state=DIGITS_SPLIT_SEED, stratify=labels)
    return (train_x, train_y), (test_x, test_y)


def stdlib_text(num_chars):
    """The first ``num_chars`` characters of the docstrings of Python's standard library (non-ASCII
    characters replaced by ``?``): the corpus of ``examples/lstm_language_model.py``, read through
    ``examples/common.py`` so that the example and the benchmarks train on the same text.

    The order is fixed (a fixed module list, members sorted by name); the exact text changes a
    little between Python versions, so results name theirs.
    """
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples",
                        "common.py")
    spec = importlib.util.spec_from_file_location("mxfp16_examples_common", path)
    common = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(common)
    text = "\n\n".join(doc for _, doc in common.stdlib_docstrings())
    return "".join(c if c.isascii() else "?" for c in text)[:num_chars]


def parse_image_shape(text):
    """``'3,224,224'`` -> ``(3, 224, 224)``; ValueError naming the flag otherwise."""
    try:
        shape = tuple(int(item) for item in text.split(","))
    except ValueError:
        shape = ()
    if len(shape) != 3 or shape[0] != 3 or min(shape) < 1:
        raise ValueError(f"--image-shape {text!r}: give channels,height,width with 3 channels, "
                         "for example 3,224,224")
    return shape


def parse_choices(text, choices, flag, noun):
    """A comma-separated list flag's value as a tuple, or ``ValueError`` naming the unknown items,
    the flag and the valid choices.

    >>> parse_choices("ssd, yolo", ("ssd", "yolo", "rcnn"), "--detectors", "detector")
    ('ssd', 'yolo')
    """
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    unknown = [item for item in items if item not in choices]
    if unknown or not items:
        raise ValueError(f"{flag} {text!r}: unknown {noun}(s) {unknown}; choose among "
                         f"{', '.join(choices)}")
    return items


def parse_exponents(text, flag, low, high, example):
    """A comma-separated flag of whole exponents in ``[low, high]`` (the k of factors 2^k) as a
    tuple, or ``ValueError`` naming the flag, the range and an example.

    >>> parse_exponents("0, -12", "--log2-factors", -40, 0, "0,-12,-20")
    (0, -12)
    """
    try:
        exponents = tuple(int(item) for item in text.split(",") if item.strip())
    except ValueError:
        exponents = ()
    if not exponents or any(k > high or k < low for k in exponents):
        raise ValueError(f"{flag} {text!r}: give comma-separated integers in [{low}, {high}], "
                         f"for example {example}")
    return exponents


def parse_dtypes(text, choices):
    """A comma-separated ``--dtypes`` value as a tuple, or ``ValueError`` naming the unknown ones.

    >>> parse_dtypes("float32, bfloat16", ("float32", "float16", "bfloat16"))
    ('float32', 'bfloat16')
    """
    return parse_choices(text, choices, "--dtypes", "dtype")


def mean_std(values):
    """Mean and sample standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def markdown_table(header, rows):
    """A Markdown table; numbers are written as given (format them before)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def write_results(out_dir, name, markdown, record):
    """Write ``<name>.md`` and ``<name>.json`` into ``out_dir``; return their paths."""
    os.makedirs(out_dir, exist_ok=True)
    md_path, json_path = (os.path.join(out_dir, name + suffix) for suffix in (".md", ".json"))
    with open(md_path, "w") as md_file:
        md_file.write(markdown)
    with open(json_path, "w") as json_file:
        json.dump(record, json_file, indent=2)
        json_file.write("\n")
    return md_path, json_path


def header_lines(record):
    """The Markdown lines every result file starts with: command, machine and date."""
    machine = record["machine"]
    return (f"Command: `{record['command']}`\n\n"
            f"Machine: {machine['cpu']}, {machine['cores']} cores, MXNet {machine['mxnet']}, "
            f"numpy {machine['numpy']}, Python {machine['python']}; {machine['date']}\n\n")


def new_figure(num_panels):
    """A matplotlib figure (Agg backend, no display needed) with ``num_panels`` side by side."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, num_panels, figsize=(5.5 * num_panels, 4), squeeze=False)
    return fig, list(axes[0])


def save_figure(fig, path):
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_config(parser, make_config, argv):
    """``(config, None)`` from the flags, or ``(None, 2)`` after one ``error: ...`` line on stderr."""
    try:
        return make_config(parser.parse_args(argv)), None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return None, 2


def parse_argv(parser, make_config, argv):
    """:func:`parse_config` on ``argv`` as a list (None: ``sys.argv[1:]``), for a ``main(argv)``
    that records its command line: ``(config, argv, None)``, or ``(None, argv, 2)``."""
    argv = sys.argv[1:] if argv is None else list(argv)
    config, failed = parse_config(parser, make_config, argv)
    return config, argv, failed


def config_from(config_class, values):
    """A ``config_class`` (a dataclass) of the entries of ``values`` that name its fields."""
    return config_class(**{field: values[field] for field in config_class.__dataclass_fields__})


def publish(out_dir, name, text, record, extra=""):
    """Write ``<name>.md`` and ``.json`` and print the table with the files written."""
    write_results(out_dir, name, text, record)
    print(text + f"\nwrote {out_dir}/{name}.md{extra or ' and .json'}")


def publish_step_medians(name, argv, config, title, seconds, base):
    """Write and print the median step time of each mode and its ratio to mode ``base``.

    ``seconds`` maps each mode, in table order, to its median step (s); ``config`` is the run's
    dataclass; ``argv`` the flags (None: ``sys.argv[1:]``)."""
    ratio = {mode: value / seconds[base] for mode, value in seconds.items()}
    key = f"over_{base.replace(' ', '_')}"
    record = {"benchmark": name, "command": command_line(name, sys.argv[1:] if argv is None else argv),
              "machine": machine_info(), "config": dataclasses.asdict(config),
              "summary": [{"mode": mode, "median_step_s": value, key: ratio[mode]}
                          for mode, value in seconds.items()]}
    rows = [(mode, f"{value * 1000:.1f}", f"{ratio[mode]:.3f}") for mode, value in seconds.items()]
    text = (f"# {title}\n\n{header_lines(record)}"
            + markdown_table(["mode", "median step (ms)", f"÷ {base}"], rows))
    publish(config.out_dir, name, text, record)


def require_positive(args, names):
    """Raise ``ValueError`` naming the first flag of ``names`` below 1."""
    for name in names:
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")


def add_output_arguments(parser, outputs, quick):
    """The ``--out-dir`` and ``--quick`` flags every benchmark has.

    Parameters
    ----------
    parser : argparse.ArgumentParser
    outputs : str
        What goes to ``--out-dir``, for the help text (e.g. "the .md and .json").
    quick : str
        What ``--quick`` shrinks the run to, for the help text.
    """
    parser.add_argument("--out-dir", default=DEFAULT_OUT_DIR,
                        help=f"where {outputs} go (default: benchmarks/results)")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: {quick} (default: off)")
    return parser
