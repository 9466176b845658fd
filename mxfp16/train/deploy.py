"""Exporting a trained model for deployment: ``scripts/export.py``.

From any model :mod:`mxfp16.train.evaluate` loads, writes under ``--output PREFIX``:

* ``PREFIX-symbol.json`` + ``PREFIX-0000.params``: the float32 graph and the float32 (master)
  weights, for plain MXNet, ONNX and float32 servers (``--dtype float32``, the default);
* ``PREFIX-float16-symbol.json`` + ``PREFIX-float16-0000.params``: the float16 GPU graph with
  every parameter (``--dtype float16``; ``--emulate`` for the CPU emulation graph instead);
* ``PREFIX.onnx`` (``--onnx``; ``PREFIX-float16.onnx`` where MXNet's exporter can write float16,
  else skipped with a note when ``PREFIX.onnx`` is written);
* ``PREFIX-preprocessing.json``: the inference preprocessing as trained (resize, centre crop,
  mean and std).

Each file is checked after writing: the float32 graph reloaded and run against the trained
network, the float16 graph's parameters and dtypes (it runs on a GPU only), the ONNX file by
``onnx.checker`` and, with ``--onnxruntime-python``, by onnxruntime against MXNet's outputs.
"""
import json
import logging
import os
from dataclasses import dataclass

import mxnet as mx
import numpy as np

from ..casting.deploy import export_network, param_dtypes
from ..onnx_export import (DEFAULT_OPSET, check_opset, compare_outputs, default_onnxruntime_python,
                           export_onnx, onnx_summary, run_onnxruntime)
from .data.base import resize_size
from .evaluate import PREPROCESSING, EvalConfig, load_model, preprocessing
from .gluon_api import gluon_network

log = logging.getLogger("mxfp16.train")

#: Largest difference to MXNet's float32 logits an ONNX run may show, relative to their scale.
ONNX_TOLERANCE = {"float32": 1e-4, "float16": 2e-2}

#: Images of the check batch.
CHECK_BATCH = 2


@dataclass
class ExportConfig:
    """The settings of ``scripts/export.py``; field names are its flags'."""

    output: str = None
    checkpoint: str = None
    model_prefix: str = None
    load_epoch: int = 0
    params_file: str = None
    network: str = None
    num_classes: int = None
    gpus: str = ""
    image_shape: tuple = None
    crop_ratio: float = None
    rgb_mean: tuple = None
    rgb_std: tuple = None
    dtype: tuple = ("float32",)
    emulate: bool = False
    onnx: bool = False
    opset: int = DEFAULT_OPSET
    onnxruntime_python: str = None
    seed: int = 0

    def checked(self):
        """The config checked, or ``ValueError`` naming the flag to fix."""
        if not self.output:
            raise ValueError("--output is missing: pass the prefix of the files to write, e.g. "
                             "--output deploy/r50 (deploy/r50-symbol.json, ...)")
        probe = EvalConfig(checkpoint=self.checkpoint, model_prefix=self.model_prefix,
                           params_file=self.params_file, network=self.network,
                           dtype=self.dtype, gpus=self.gpus).checked()
        bad = [d for d in probe.dtype if d not in ("float32", "float16")]
        if bad:
            raise ValueError(f"--dtype {bad[0]}: export writes float32 and float16 graphs; "
                             "bfloat16 runs from the float32 graph (cast it with mxfp16)")
        self.dtype = probe.dtype
        if self.onnx:
            check_opset(self.opset)
        self.onnxruntime_python = self.onnxruntime_python or default_onnxruntime_python()
        return self


def output_prefix(output, dtype, emulate=False):
    """The prefix of one dtype's files.

    Examples
    --------
    >>> output_prefix('deploy/r50', 'float32'), output_prefix('deploy/r50', 'float16')
    ('deploy/r50', 'deploy/r50-float16')
    """
    if dtype == "float32":
        return output
    return f"{output}-{dtype}" + ("-emulated" if emulate else "")


def write_preprocessing(output, prep):
    """``PREFIX-preprocessing.json``: what a server does to an image before the network."""
    record = {"input": "data", "layout": "NCHW", "channels": "RGB", "pixel_range": [0, 255],
              "resize_shorter_side": resize_size(prep["image_shape"], prep["crop_ratio"]),
              "center_crop": list(prep["image_shape"][1:]), "crop_ratio": prep["crop_ratio"],
              "mean": list(prep["rgb_mean"]), "std": list(prep["rgb_std"]),
              "normalize": "(pixel - mean) / std, per channel, after the crop"}
    path = f"{output}-preprocessing.json"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as out:
        json.dump(record, out, indent=1)
    return path


def _imported(files, ctx):
    block = mx.gluon.SymbolBlock.imports(files[0], ["data"], files[1], ctx=ctx)
    return block, dict(block.collect_params().items())


def check_float32(files, reference, data, ctx):
    """Reload the float32 export and compare its outputs with the trained network's."""
    block, params = _imported(files, ctx)
    diff, agreement = compare_outputs(reference, block(data).asnumpy())
    if agreement < 1.0 or diff > 1e-5 * max(1.0, float(np.abs(reference).max())):
        raise RuntimeError(f"the exported float32 graph {files[0]} does not reproduce the network "
                           f"(max difference {diff:.3g}, agreement {agreement:.4f})")
    return f"{len(params)} parameters, outputs reproduced (max difference {diff:.1g})"


def check_float16(files, ctx):
    """Reload the float16 export: every parameter present, in the dtype the graph gives it."""
    sym = mx.sym.load(files[0])
    saved = {k.split(":", 1)[1]: v.dtype.__name__ for k, v in mx.nd.load(files[1]).items()}
    expected = param_dtypes(sym)
    wrong = [n for n, t in expected.items() if saved.get(n) != t]
    if wrong or len(saved) != len(expected):
        raise RuntimeError(f"the float16 export {files[1]} does not fit its graph: "
                           f"{wrong[:4] or 'other parameters'}")
    counts = {t: list(expected.values()).count(t) for t in sorted(set(expected.values()))}
    _imported(files, ctx)
    return (f"{len(saved)} parameters, dtypes as the graph infers them ("
            + ", ".join(f"{n} {t}" for t, n in counts.items()) + ")")


def check_onnx(onnx_file, reference, data, dtype, python):
    """The checker's view of the ONNX file and, with onnxruntime's interpreter, its outputs."""
    summary = onnx_summary(onnx_file)
    text = (f"opset {summary['opset']}, checker passed, input "
            f"{list(summary['inputs'].values())[0]}")
    if not python:
        return text + "; onnxruntime not run (no --onnxruntime-python)"
    outputs, versions = run_onnxruntime(python, onnx_file, data.asnumpy())
    diff, agreement = compare_outputs(reference, outputs)
    scale = max(1.0, float(np.abs(reference).max()))
    if agreement < 1.0 and dtype == "float32" or diff > ONNX_TOLERANCE[dtype] * scale:
        raise RuntimeError(f"{onnx_file} run by onnxruntime does not reproduce MXNet's outputs "
                           f"(max difference {diff:.3g}, agreement {agreement:.4f})")
    return (text + f"; onnxruntime {versions['onnxruntime']}: max difference {diff:.2g}, "
            f"agreement {agreement:.4f}")


def _onnx_part(config, dtype, files, prep, reference, data, float32_written):
    """Write and check the ONNX file of one dtype; its part of the summary line.  A float16 graph
    MXNet cannot export (BatchNorm's float32 parameters at opsets 12-13) is skipped with a note when
    the float32 ONNX file is written too, else it is the error."""
    onnx_file = output_prefix(config.output, dtype) + ".onnx"
    try:
        export_onnx(mx.sym.load(files[0]), mx.nd.load(files[1]), onnx_file,
                    (CHECK_BATCH,) + tuple(prep["image_shape"]), opset=config.opset)
    except RuntimeError as error:
        if dtype == "float32" or not float32_written:
            raise
        return (f"ONNX float16 skipped ({str(error).split(': export the')[0]}; "
                f"{output_prefix(config.output, 'float32')}.onnx is the ONNX file to deploy)")
    return (f"ONNX {dtype} {onnx_file} "
            f"({check_onnx(onnx_file, reference, data, dtype, config.onnxruntime_python)})")


def export_job(config):
    """``scripts/export.py``'s job; returns the summary line.

    Raises
    ------
    ValueError
        For a model that cannot be loaded (see :func:`mxfp16.train.evaluate.load_model`).
    RuntimeError
        When a written file fails its check, or MXNet cannot export the graph to ONNX.
    """
    model = load_model(config)
    prep = preprocessing(config, model.trained)
    ctx = mx.gpu(int(config.gpus.split(",")[0])) if config.gpus else mx.cpu()
    data = mx.nd.array(np.random.RandomState(config.seed).uniform(
        -1, 1, (CHECK_BATCH,) + tuple(prep["image_shape"])), ctx=ctx)
    block, _ = gluon_network(model.network, [ctx], "float32", hybridize=False)
    reference = block(data).asnumpy()
    parts = []
    for dtype in config.dtype:
        net = block if dtype == "float32" else \
            gluon_network(model.network, [ctx], dtype, hybridize=False)[1]
        files = export_network(net, output_prefix(config.output, dtype, config.emulate),
                               dtype=dtype, emulate=config.emulate and dtype == "float16")
        check = check_float32(files, reference, data, ctx) if dtype == "float32" else \
            check_float16(files, ctx)
        parts.append(f"{dtype} {files[0]} + {os.path.basename(files[1])} ({check})")
        log.info("exported %s", parts[-1])
        if config.onnx:
            parts.append(_onnx_part(config, dtype, files, prep, reference, data,
                                    float32_written="float32" in config.dtype))
            skipped = parts[-1].startswith("ONNX float16 skipped")
            log.log(logging.WARNING if skipped else logging.INFO, "%s" if skipped else "exported %s",
                    parts[-1])
    path = write_preprocessing(config.output, prep)
    return f"exported {model.description}: " + "; ".join(parts) + f"; preprocessing {path}"


__all__ = ["ExportConfig", "export_job", "output_prefix", "PREPROCESSING"]
