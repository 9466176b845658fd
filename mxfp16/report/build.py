"""The whole precision report: configuration, analyses, and the files it is saved to."""
import json
import os
from dataclasses import asdict, dataclass

import mxnet as mx

from ..casting import cast_symbol
from ..diagnose.precision import DEFAULT_TOLERANCES
from ..dtypes import check_dtype
from .compare import layer_comparison
from .graph_info import inspect_graph
from .memory import check_optimizer, memory_report
from .precision_map import precision_map
from .sequence import DEFAULT_SEQ_LEN, SEQUENCE_NETWORKS, input_vocabulary, random_token_batches
from .source import load_network
from .plots import save_plots
from .render import render_markdown
from .speedup import GPU_SPECS, MODEL_SUMMARY, check_gpu, estimate_speedup, published_speedups
from .tensor_cores import FLOAT16_MULTIPLE, TF32_MULTIPLE, check_tensor_cores
from .underflow import DEFAULT_HEADROOM, gradient_underflow, random_batches


def parse_shape(text):
    """An image shape such as ``'3,224,224'`` (or a sequence of 3 ints) as a tuple of positive ints.

    Raises
    ------
    ValueError
        Naming the text and the expected form.

    Examples
    --------
    >>> parse_shape('3,224,224')
    (3, 224, 224)
    """
    try:
        parts = text.split(",") if isinstance(text, str) else text
        shape = tuple(int(part) for part in parts)
    except (TypeError, ValueError):
        shape = ()
    if len(shape) != 3 or min(shape) < 1:
        raise ValueError(f"bad image shape {text!r}: write channels,height,width as positive whole "
                         "numbers, e.g. 3,224,224")
    return shape


@dataclass
class ReportConfig:
    """What to report on, and how.

    ``gpu_bytes=None`` takes the memory of the first GPU in ``gpus``; ``underflow_steps=0`` skips the
    gradient histogram; ``compare`` (``'float16'`` or ``'bfloat16'``) compares every layer in that
    dtype with float32 on one batch of ``compare_batch_size``, ``compare_tolerance`` (None: the
    dtype's default) on the relative error.  A sequence model reads token ids of
    shape (batch, ``seq_len``) instead of images: ``seq_len`` is set for a built-in sequence network
    (35 when not given) and must be given for a checkpoint of one; ``vocab_size``, ``embed_size``,
    ``hidden_size`` and ``num_layers`` size the built-in ``lstm_lm`` (None: GluonNLP's
    ``standard_lstm_lm_650`` on WikiText-2, see :mod:`mxfp16.report.sequence`).
    """

    network: str = "resnet50_v1"
    checkpoint: str = None
    epoch: int = 0
    num_classes: int = 1000
    image_shape: tuple = (3, 224, 224)
    batch_size: int = 256
    gpus: tuple = tuple(GPU_SPECS)
    gpu_bytes: int = None
    optimizer: str = "sgd"
    underflow_steps: int = 3
    underflow_batch_size: int = 8
    headroom: float = DEFAULT_HEADROOM
    seed: int = 0
    seq_len: int = None
    vocab_size: int = None
    embed_size: int = None
    hidden_size: int = None
    num_layers: int = None
    compare: str = None
    compare_batch_size: int = 8
    compare_tolerance: float = None

    def __post_init__(self):
        self.image_shape = parse_shape(self.image_shape)
        if self.seq_len is None and self.network in SEQUENCE_NETWORKS and not self.checkpoint:
            self.seq_len = DEFAULT_SEQ_LEN
        if self.seq_len is not None and int(self.seq_len) < 1:
            raise ValueError(f"seq_len must be a positive whole number, got {self.seq_len!r}")
        self.gpus = tuple(check_gpu(gpu) for gpu in self.gpus)
        self.optimizer = check_optimizer(self.optimizer)
        for name in ("batch_size", "underflow_batch_size", "num_classes"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be a positive whole number, got {getattr(self, name)!r}")
        if int(self.underflow_steps) < 0:
            raise ValueError(f"underflow_steps must be >= 0 (0 skips the histogram), "
                             f"got {self.underflow_steps!r}")
        if self.gpu_bytes is None:
            self.gpu_bytes = GPU_SPECS[self.gpus[0]].memory
        self._check_compare()

    def _check_compare(self):
        if self.compare is None:
            return
        self.compare = check_dtype(self.compare)
        if self.compare not in DEFAULT_TOLERANCES:
            raise ValueError(f"compare={self.compare!r}: compare float16 or bfloat16 with float32 "
                             "(--compare float16)")
        if int(self.compare_batch_size) < 1:
            raise ValueError(f"compare_batch_size must be a positive whole number, got "
                             f"{self.compare_batch_size!r}")
        tolerance = self.compare_tolerance
        if tolerance is not None and not (tolerance > 0 and tolerance < float("inf")):
            raise ValueError(f"compare_tolerance must be a positive number (default "
                             f"{DEFAULT_TOLERANCES[self.compare]:g} for {self.compare}), got "
                             f"{tolerance!r}")


def data_shape(config, batch_size):
    """The input's shape: (batch, seq_len) of token ids, or (batch, channels, height, width)."""
    return (batch_size,) + ((config.seq_len,) if config.seq_len else tuple(config.image_shape))


def _initialize(block, config):
    """A zoo network comes uninitialized: He initialization, as GluonCV trains, from the seed."""
    mx.random.seed(config.seed)
    if not config.checkpoint:
        block.initialize(mx.init.Xavier(rnd_type="gaussian", factor_type="in", magnitude=2))


def _compare(block, config, info32):
    """The layer-by-layer comparison, on one batch of random data (None unless asked for)."""
    if not config.compare:
        return None
    if config.seq_len:
        data = random_token_batches(config.compare_batch_size, config.seq_len,
                                    input_vocabulary(info32), 1, 1, config.seed)[0][0]
    else:
        data = random_batches(data_shape(config, config.compare_batch_size), 1, 1,
                              config.seed)[0][0]
    block(data)  # completes deferred initialization
    return layer_comparison(block, data, config.compare, config.compare_tolerance)


def _underflow(block, config, num_classes, info32):
    if not config.underflow_steps:
        return None
    if config.seq_len:
        batches = random_token_batches(config.underflow_batch_size, config.seq_len,
                                       input_vocabulary(info32), num_classes,
                                       config.underflow_steps, config.seed)
    else:
        batches = random_batches(data_shape(config, config.underflow_batch_size), num_classes,
                                 config.underflow_steps, config.seed)
    return gradient_underflow(block, batches, headroom=config.headroom,
                              training_batch_size=config.batch_size)


def build_report(config):
    """Analyse a network for float16 training: the report as a JSON-ready dict.

    Parameters
    ----------
    config : ReportConfig

    Returns
    -------
    dict
        ``network``, ``data_shape``, ``tensor_cores`` (:func:`check_tensor_cores`), ``precision``
        (:func:`precision_map`), ``memory`` (:func:`memory_report`), ``speedup`` (``model``,
        ``gpus``: :func:`estimate_speedup`, ``published``), ``underflow``
        (:func:`gradient_underflow`, or None) and ``compare``
        (:meth:`mxfp16.diagnose.precision.PrecisionReport.to_dict`, or None).

    Raises
    ------
    ValueError, FileNotFoundError
        For an unknown network, a missing checkpoint or a shape the network cannot take.

    Examples
    --------
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=16, underflow_steps=0))
    >>> [layer['dims'] for layer in report['tensor_cores']['layers'] if not layer['eligible']]
    [{'batch': 8, 'in_channels': 3, 'out_channels': 64}]
    """
    sizes = {key: getattr(config, key)
             for key in ("vocab_size", "embed_size", "hidden_size", "num_layers")}
    name, sym, block = load_network(config.network, config.checkpoint, config.epoch,
                                    config.num_classes, sizes)
    shapes = {"data": data_shape(config, config.batch_size)}
    cast = cast_symbol(sym, "float16", emulate=False)
    info32, info16 = inspect_graph(sym, shapes), inspect_graph(cast, shapes)
    cores = check_tensor_cores(info32, sym, config.batch_size, FLOAT16_MULTIPLE)
    tf32 = check_tensor_cores(info32, sym, config.batch_size, TF32_MULTIPLE)
    speed = estimate_speedup(info32, info16, {c["name"]: c for c in cores["layers"]},
                             {c["name"]: c for c in tf32["layers"]}, config.batch_size, config.gpus)
    outputs = {tensor.name: tensor for layer in info32.layers for tensor in layer.outputs}
    num_classes = outputs[sym.list_outputs()[0]].shape[-1]
    if config.compare or config.underflow_steps:
        _initialize(block, config)
    compare = _compare(block, config, info32)  # before the histogram casts the block in place
    return {"network": name, "data_shape": list(shapes["data"]), "config": _config_dict(config),
            "tensor_cores": cores, "precision": precision_map(sym, cast),
            "memory": memory_report(info32, info16, config.batch_size, config.gpu_bytes,
                                    optimizer=config.optimizer),
            "speedup": {"model": MODEL_SUMMARY, "gpus": speed,
                        "published": published_speedups(None if config.checkpoint else name)},
            "underflow": _underflow(block, config, num_classes, info32), "compare": compare}


def _config_dict(config):
    return {key: list(value) if isinstance(value, tuple) else value
            for key, value in asdict(config).items()}


def save_report(report, json_path=None, markdown_path=None, plots_dir=None):
    """Write the report as JSON, Markdown and PNG plots.

    Parameters
    ----------
    report : dict
        :func:`build_report`'s result.
    json_path, markdown_path : str or None
        Files to write (their folders are created); None skips.
    plots_dir : str or None
        Folder for :func:`mxfp16.report.plots.save_plots`; None skips.

    Returns
    -------
    list of str
        The files written.

    Examples
    --------
    >>> import os, tempfile
    >>> report = build_report(ReportConfig('resnet18_v1', image_shape=(3, 32, 32), batch_size=8,
    ...                                    num_classes=16, gpus=['V100'], underflow_steps=0))
    >>> folder = tempfile.mkdtemp()
    >>> [os.path.basename(path) for path in save_report(report, os.path.join(folder, 'r.json'),
    ...                                                 plots_dir=os.path.join(folder, 'plots'))]
    ['r.json', 'layer_times_V100.png']
    """
    written = []
    for path, text in ((json_path, lambda: json.dumps(report, indent=1)),
                       (markdown_path, lambda: render_markdown(report))):
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            with open(path, "w") as handle:
                handle.write(text())
            written.append(path)
    if plots_dir:
        written += save_plots(report, plots_dir)
    return written
