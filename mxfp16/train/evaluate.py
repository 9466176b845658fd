"""Evaluating and benchmarking a trained model: ``scripts/evaluate.py``.

MXNet's example ``score.py`` (top-1/top-5 of a checkpoint on a ``.rec`` file) and
``benchmark_score.py`` (inference images per second by batch size, float32 beside float16), with
GluonCV's evaluation flags (``--model``, ``--params-file``, ``--rec-val``, ``--crop-ratio``,
``--num-batches``).  The model is any of:

* a checkpoint of the training scripts: ``--checkpoint PREFIX`` (its newest) or ``PREFIX-NNNN``;
* an MXNet checkpoint pair, a Module's, a Gluon ``export`` or :func:`mxfp16.export`'s, float32 or
  float16: ``--model-prefix PREFIX --load-epoch N``;
* a zoo network with a parameter file (``save_parameters``, GluonCV's files, the scripts'
  ``.params``): ``--network NAME --params-file FILE``.

Each runs in every ``--dtype`` asked for (float16 without a GPU: the CPU emulation, said so).  The
preprocessing (image shape, centre-crop ratio, mean and std) is the flags', else the training run's
(recorded in its checkpoint, or in the ``PREFIX-preprocessing.json`` that ``scripts/export.py``
wrote beside an exported pair), else ImageNet's defaults.
"""
import glob
import json
import logging
import os
import re
import time
from dataclasses import dataclass

import mxnet as mx

from ..casting.graph import strip
from ..dtypes import check_dtype
from ..models import DATA_INPUT, Network, block_to_network, get_network, load_mxnet_checkpoint
from .state.checkpoint import load_checkpoint
from .cli.config import _check_gpus_found, contexts, gpu_ids
from .data import IMAGENET_MEAN_RGB, IMAGENET_STD_RGB, folder_iters, record_iter, synthetic_iter
from .gluon_api import gluon_network
from .metrics import Accuracy

log = logging.getLogger("mxfp16.train")

#: Batch sizes of ``--benchmark`` (MXNet's benchmark_score.py runs these).
BENCHMARK_BATCH_SIZES = (1, 32, 64, 128, 256)

#: Settings a training run's checkpoint records and evaluation takes over unless given.
PREPROCESSING = {"image_shape": (3, 224, 224), "crop_ratio": 0.875, "rgb_mean": IMAGENET_MEAN_RGB,
                 "rgb_std": IMAGENET_STD_RGB}


@dataclass
class EvalConfig:
    """The settings of ``scripts/evaluate.py``; field names are its flags'."""

    checkpoint: str = None
    model_prefix: str = None
    load_epoch: int = 0
    params_file: str = None
    network: str = None
    num_classes: int = None
    data_val: str = None
    data_val_idx: str = None
    data_dir: str = None
    val_fraction: float = 0.2
    seed: int = 0
    image_shape: tuple = None
    crop_ratio: float = None
    rgb_mean: tuple = None
    rgb_std: tuple = None
    batch_size: int = 32
    dtype: tuple = ("float32",)
    gpus: str = ""
    top_k: int = 5
    num_batches: int = 0
    benchmark: bool = False
    batch_sizes: tuple = BENCHMARK_BATCH_SIZES
    data_nthreads: int = 4

    def checked(self):
        """The config with canonical dtypes, or ``ValueError`` naming the flag to fix."""
        sources = [flag for flag, given in (("--checkpoint", self.checkpoint),
                                            ("--model-prefix", self.model_prefix),
                                            ("--params-file", self.params_file)) if given]
        if len(sources) != 1:
            raise ValueError(f"{' and '.join(sources) or 'no model given'}: pass one of "
                             "--checkpoint PREFIX[-NNNN] (a training run), --model-prefix PREFIX "
                             "--load-epoch N (an MXNet checkpoint or export), or --network NAME "
                             "--params-file FILE")
        if self.params_file and not self.network:
            raise ValueError(f"--params-file {self.params_file} needs --network NAME (the zoo "
                             "network it holds the parameters of)")
        for flag, value in (("--batch-size", self.batch_size), ("--top-k", self.top_k)):
            if value < 1:
                raise ValueError(f"{flag} {value}: pass a number >= 1")
        if self.benchmark and any(size < 1 for size in self.batch_sizes):
            raise ValueError(f"--batch-sizes {self.batch_sizes}: pass sizes >= 1, e.g. 1,32,64")
        dtypes = []
        for name in self.dtype:
            try:
                dtypes.append(check_dtype(name))
            except (ValueError, TypeError) as error:
                raise ValueError(f"--dtype {name}: {error}") from None
        self.dtype = tuple(dict.fromkeys(dtypes))
        check_devices(self.gpus)
        return self


def check_devices(gpus):
    """``ValueError`` for a malformed ``--gpus`` or GPUs MXNet does not see (training's check)."""
    ids = gpu_ids(gpus)
    if ids:
        _check_gpus_found(f"--gpus {gpus}", ids)


@dataclass
class LoadedModel:
    """A model to evaluate: the float32 network, a description, the training run's settings."""

    network: Network
    description: str
    trained: dict


def _saved_epochs(prefix):
    paths = glob.glob(glob.escape(prefix) + "-[0-9][0-9][0-9][0-9].params")
    return sorted(int(p[-len("NNNN.params"):-len(".params")]) for p in paths)


def _mxnet_pair(prefix, epoch):
    """An MXNet checkpoint pair, a training run's checkpoint when its JSON file is there."""
    if os.path.isfile("%s-%04d.json" % (prefix, epoch)):
        return _script_checkpoint("%s-%04d" % (prefix, epoch))
    if not os.path.isfile("%s-%04d.params" % (prefix, epoch)):
        epochs = _saved_epochs(prefix)
        found = f"the epochs saved are {', '.join(map(str, epochs))}" if epochs else \
            f"no {prefix}-NNNN.params file exists"
        raise ValueError(f"--model-prefix {prefix} --load-epoch {epoch}: {found}; pass one of "
                         "them as --load-epoch" if epochs else f"--model-prefix {prefix}: {found}; "
                         "pass the prefix of PREFIX-symbol.json and PREFIX-NNNN.params")
    network = load_mxnet_checkpoint(prefix, epoch)
    return LoadedModel(network, "%s-%04d" % (os.path.basename(prefix), epoch),
                       exported_preprocessing(prefix))


def exported_preprocessing(prefix):
    """The preprocessing ``scripts/export.py`` wrote beside an exported pair
    (``PREFIX-preprocessing.json``; for ``PREFIX-float16`` that of ``PREFIX``), as the settings of
    the training run it came from; ``{}`` without the file.

    Examples
    --------
    >>> exported_preprocessing('/nonexistent/r50-float16')
    {}
    """
    base = re.sub(r"-(float16|bfloat16)(-emulated)?$", "", prefix)
    for path in (f"{prefix}-preprocessing.json", f"{base}-preprocessing.json"):
        if os.path.isfile(path):
            with open(path) as file:
                record = json.load(file)
            return {"image_shape": [len(record["mean"])] + list(record["center_crop"]),
                    "crop_ratio": record["crop_ratio"], "rgb_mean": record["mean"],
                    "rgb_std": record["std"]}
    return {}


def _script_checkpoint(spec):
    loaded = load_checkpoint(spec)
    return LoadedModel(loaded.network, os.path.basename(loaded.name),
                       dict(loaded.meta.get("config") or {}))


def _zoo_params(network_name, params_file, num_classes):
    if not os.path.isfile(params_file):
        raise ValueError(f"--params-file {params_file}: no such file")
    block = get_network(network_name, num_classes or 1000)
    try:
        block.load_parameters(params_file, cast_dtype=True)
    except (AssertionError, ValueError, mx.base.MXNetError) as error:
        reason = " ".join(str(error).split())[:160]
        raise ValueError(f"--params-file {params_file} does not hold the parameters of --network "
                         f"{network_name} with --num-classes {num_classes or 1000} ({reason}): "
                         "pass the network and class count it was trained with") from None
    return LoadedModel(block_to_network(block), os.path.basename(params_file), {})


def load_model(config):
    """The :class:`LoadedModel` of ``config``'s model flags; float16 graphs come back float32.

    Raises
    ------
    ValueError
        For a missing checkpoint or epoch, or parameters that do not fit the named network.
    """
    if config.checkpoint:
        model = _script_checkpoint(config.checkpoint)
    elif config.model_prefix:
        model = _mxnet_pair(config.model_prefix, config.load_epoch)
    else:
        model = _zoo_params(config.network, config.params_file, config.num_classes)
    trained = model.trained.get("network")
    if config.network and trained and config.network != trained:
        raise ValueError(f"--network {config.network}: the checkpoint {model.description} is of "
                         f"{trained}; pass --network {trained} or leave it out")
    network = model.network
    # An exported float16 graph holds the casts mxfp16 inserted: back to the float32 graph, which
    # is then cast to each --dtype.
    model.network = Network(strip(network.symbol, (DATA_INPUT,)),
                            {k: v.astype("float32") for k, v in network.arg_params.items()},
                            {k: v.astype("float32") for k, v in network.aux_params.items()})
    return model


def preprocessing(config, trained):
    """``{image_shape, crop_ratio, rgb_mean, rgb_std}``: the flags', else the training run's, else
    ImageNet's.

    Examples
    --------
    >>> preprocessing(EvalConfig(crop_ratio=1.0), {'image_shape': [3, 32, 32]})['image_shape']
    (3, 32, 32)
    """
    settings = {}
    for name, default in PREPROCESSING.items():
        value = getattr(config, name)
        value = trained.get(name) if value is None else value
        value = default if value is None else value
        settings[name] = tuple(value) if isinstance(value, (list, tuple)) else value
    return settings


def val_data(config, num_classes, prep):
    """``(iterator, description)`` of the evaluation data: a ``.rec`` file, the validation part of
    an image folder (the training run's split), or synthetic images."""
    common = dict(mean_rgb=prep["rgb_mean"], std_rgb=prep["rgb_std"], crop_ratio=prep["crop_ratio"])
    shape, batch = prep["image_shape"], config.batch_size
    if config.data_val:
        return (record_iter(config.data_val, batch, shape, train=False,
                            path_idx=config.data_val_idx, num_threads=config.data_nthreads,
                            **common), f"RecordIO {config.data_val}")
    if config.data_dir:
        _, val, _ = folder_iters(config.data_dir, batch, shape, config.val_fraction, config.seed,
                                 **common)
        if val is None:
            raise ValueError(f"--data-dir {config.data_dir} holds no validation images: pass "
                             "--val-fraction > 0 or a folder with val/")
        return val, f"image folder {config.data_dir}"
    return (synthetic_iter(batch, shape, num_classes, max(config.num_batches, 1), config.seed),
            "synthetic data")


def dtype_label(dtype, ctx):
    """How a dtype runs here: ``float16 (emulated on CPU)`` without a GPU.

    Examples
    --------
    >>> dtype_label('float16', [mx.cpu()]), dtype_label('float16', [mx.gpu(0)])
    ('float16 (emulated on CPU)', 'float16')
    """
    if dtype == "float16" and all(c.device_type == "cpu" for c in ctx):
        return "float16 (emulated on CPU)"
    return dtype


def score(network, data, *, dtype, ctx, top_k, num_classes, num_batches=0):
    """``(top1, topk, images per second, predicted classes)`` of ``network`` run in ``dtype``."""
    _, net = gluon_network(network, ctx[:1], dtype)
    accuracy, predicted, count = Accuracy(top_k, num_classes), [], 0
    data.reset()
    start = time.time()
    for index, batch in enumerate(data):
        if num_batches and index >= num_batches:
            break
        out = net(batch.data[0].as_in_context(ctx[0]))
        accuracy.update([batch.label[0]], [out], batch.pad)
        valid = out.shape[0] - batch.pad
        predicted.append(out[:valid].argmax(axis=1))
        count += valid
    classes = mx.nd.concat(*predicted, dim=0).asnumpy() if predicted else None
    top1, topk = accuracy.get()
    return top1, topk, count / max(time.time() - start, 1e-9), classes


def throughput(network, *, dtype, ctx, batch_size, image_shape, num_batches, dry_run=2):
    """Inference images per second at ``batch_size`` (MXNet's benchmark_score.py: random data,
    ``dry_run`` batches first, then ``num_batches`` timed, waiting for the last)."""
    _, net = gluon_network(network, ctx[:1], dtype)
    data = mx.nd.random.uniform(-1, 1, shape=(batch_size,) + tuple(image_shape), ctx=ctx[0])
    for _ in range(dry_run):
        net(data).wait_to_read()
    start = time.time()
    for _ in range(num_batches):
        out = net(data)
    out.wait_to_read()
    return num_batches * batch_size / max(time.time() - start, 1e-9)


def _check_classes(config, network, image_shape):
    try:
        outputs = network.symbol.infer_shape(**{DATA_INPUT: (1,) + tuple(image_shape)})[1]
    except mx.base.MXNetError as error:
        raise ValueError(f"the model cannot take images of shape {tuple(image_shape)} "
                         f"({str(error).strip().splitlines()[0][:120]}): pass the --image-shape "
                         "it was trained with") from None
    num_classes = outputs[0][-1]
    if config.num_classes and config.num_classes != num_classes:
        raise ValueError(f"--num-classes {config.num_classes}: the model has {num_classes} "
                         f"classes; pass --num-classes {num_classes} or leave it out")
    return num_classes


def _log_dtypes(dtypes, ctx):
    if any(dtype_label(d, ctx) != d for d in dtypes):
        log.info("float16 runs as the CPU emulation here (no GPU): float32 arithmetic rounded "
                 "through float16 at every GEMM, the GPU's numerics at a fraction of its speed")


def _runnable(dtype, ctx, run, **kwargs):
    """``run(dtype=dtype, ctx=ctx, **kwargs)``; a dtype MXNet cannot run on this device (bfloat16
    on a GPU: MXNet 1.9.1 has CPU kernels only) becomes one ``ValueError`` naming the fix."""
    try:
        return run(dtype=dtype, ctx=ctx, **kwargs)
    except mx.base.MXNetError as error:
        reason = str(error).strip().splitlines()[0][:160]
        raise ValueError(f"--dtype {dtype} cannot run on {ctx[0]} ({reason}): leave it out of "
                         "--dtype, or run on a device that has its kernels (bfloat16: the CPU; "
                         "float16: a GPU, or the CPU emulation without --gpus)") from None


def accuracy_line(model, config, ctx, prep, num_classes):
    """Score the model in every dtype; return the one summary line."""
    data, where = val_data(config, num_classes, prep)
    parts, reference, count = [], None, 0
    for dtype in config.dtype:
        top1, topk, speed, classes = _runnable(dtype, ctx, score, network=model.network,
                                               data=data, top_k=config.top_k,
                                               num_classes=num_classes,
                                               num_batches=config.num_batches)
        count = 0 if classes is None else len(classes)
        part = (f"{dtype_label(dtype, ctx)} top-1 {top1:.4f} top-{config.top_k} {topk:.4f}")
        if reference is not None and classes is not None:
            part += f" agreement with {config.dtype[0]} {(classes == reference).mean():.4f}"
        reference = classes if reference is None else reference
        parts.append(f"{part} ({speed:.1f} img/s)")
        log.info("%s: %s", model.description, parts[-1])
    return f"{model.description} on {where} ({count} images): " + "; ".join(parts)


def benchmark_line(model, config, ctx, prep):
    """Inference throughput by batch size and dtype (a table on stdout); return the summary
    line."""
    header = "batch size | " + " | ".join(f"{dtype_label(d, ctx)} img/s" for d in config.dtype)
    print(header)
    rows = []
    for batch_size in config.batch_sizes:
        speeds = [_runnable(dtype, ctx, throughput, network=model.network,
                            batch_size=batch_size, image_shape=prep["image_shape"],
                            num_batches=config.num_batches or 10) for dtype in config.dtype]
        print(f"{batch_size:10d} | " + " | ".join(f"{s:.1f}" for s in speeds), flush=True)
        rows.append(f"{batch_size}: " + ", ".join(
            f"{dtype_label(d, ctx)} {s:.1f}" for d, s in zip(config.dtype, speeds)))
    return (f"{model.description} inference img/s at {'x'.join(map(str, prep['image_shape']))} "
            f"on {ctx[0]}, by batch size: " + "; ".join(rows))


def evaluate_job(config):
    """``scripts/evaluate.py``'s job: top-1/top-k in each dtype, or with ``benchmark`` the
    throughput by batch size; returns the summary line.

    Examples
    --------
    >>> import os, tempfile
    >>> from mxfp16.models import new_network
    >>> from mxfp16.casting import export
    >>> from mxfp16.train.gluon_api import gluon_network
    >>> block, _ = gluon_network(new_network('mobilenet0.25', 4, (3, 32, 32)), [mx.cpu()],
    ...                          'float32')
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'net')
    >>> _ = export(block, prefix)
    >>> line = evaluate_job(EvalConfig(model_prefix=prefix, image_shape=(3, 32, 32),
    ...                                batch_size=4, top_k=2).checked())
    >>> line.split(' (')[0]
    'net-0000 on synthetic data'
    """
    ctx = contexts(config.gpus)
    model = load_model(config)
    prep = preprocessing(config, model.trained)
    num_classes = _check_classes(config, model.network, prep["image_shape"])
    _log_dtypes(config.dtype, ctx)
    if config.benchmark:
        return benchmark_line(model, config, ctx, prep)
    return accuracy_line(model, config, ctx, prep, num_classes)
