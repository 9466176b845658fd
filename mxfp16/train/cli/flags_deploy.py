"""The command-line flags of ``scripts/evaluate.py`` and ``scripts/export.py``.

Names follow MXNet's ``score.py`` / ``benchmark_score.py`` (``--model-prefix``, ``--load-epoch``,
``--data-val``, ``--rgb-mean``) and GluonCV's ``verify_pretrained.py`` (``--model``,
``--params-file``, ``--rec-val``, ``--input-size``, ``--crop-ratio``, ``--num-batches``).
"""
import argparse

from .flags import int_tuple
from .flags_compat import float_tuple


def dtype_list(text):
    """argparse type of ``--dtype``: one dtype or several, comma-separated.

    Examples
    --------
    >>> dtype_list('float32,float16')
    ('float32', 'float16')
    """
    dtypes = tuple(part.strip() for part in str(text).split(",") if part.strip())
    if not dtypes:
        raise argparse.ArgumentTypeError(f"{text!r}: pass float32, float16, bfloat16 or a "
                                         "comma-separated list of them")
    return dtypes


def add_model_arguments(parser, d):
    """The flags that name a trained model (one of three sources)."""
    group = parser.add_argument_group("model (one of --checkpoint, --model-prefix, --params-file)")
    group.add_argument("--checkpoint", default=d.checkpoint,
                       help="a training run's checkpoint: PREFIX (its newest) or PREFIX-NNNN "
                            "(default: none)")
    group.add_argument("--model-prefix", "--prefix", default=d.model_prefix,
                       help="an MXNet checkpoint pair PREFIX-symbol.json + PREFIX-NNNN.params "
                            "(Module, HybridBlock.export, mxfp16.export) (default: none)")
    group.add_argument("--load-epoch", type=int, default=d.load_epoch,
                       help=f"NNNN of --model-prefix (default: {d.load_epoch})")
    group.add_argument("--params-file", default=d.params_file,
                       help="a parameter file of --network (save_parameters, GluonCV, a training "
                            "run's .params) (default: none)")
    group.add_argument("--network", "--model", default=d.network,
                       help="the zoo network of --params-file; checked against a checkpoint's "
                            "(default: none)")
    group.add_argument("--num-classes", type=int, default=d.num_classes,
                       help="classes of --network (default: the model's, or 1000)")
    group.add_argument("--gpus", default=d.gpus, help="GPU to run on, e.g. 0; empty for the "
                       "CPU (default: empty)")


def _input_size(text):
    side = int(text)
    return (3, side, side)


def add_eval_arguments(parser, d):
    """The flags of ``scripts/evaluate.py`` with ``d`` (an ``EvalConfig``) as defaults."""
    add_model_arguments(parser, d)
    group = parser.add_argument_group("data (none: synthetic)")
    group.add_argument("--data-val", "--rec-val", default=d.data_val,
                       help="validation .rec file (default: none)")
    group.add_argument("--data-val-idx", "--rec-val-idx", default=d.data_val_idx,
                       help="its .idx file (default: next to the .rec)")
    group.add_argument("--data-dir", default=d.data_dir, help="image folder: its val/ part, or "
                       "the training run's held-out split (default: none)")
    group.add_argument("--val-fraction", type=float, default=d.val_fraction,
                       help=f"--data-dir without val/: the fraction held out (default: "
                            f"{d.val_fraction})")
    group.add_argument("--seed", type=int, default=d.seed,
                       help=f"seed of that split, the training run's (default: {d.seed})")
    group.add_argument("--data-nthreads", "-j", "--num-data-workers", type=int,
                       default=d.data_nthreads, help=f"decoding threads (default: "
                                                     f"{d.data_nthreads})")
    _add_preprocessing_arguments(parser, d)
    group = parser.add_argument_group("evaluation")
    group.add_argument("--dtype", type=dtype_list, default=d.dtype,
                       help="float32, float16, bfloat16 or several, e.g. float32,float16: each "
                            "is run, side by side (default: %s)" % ",".join(d.dtype))
    group.add_argument("--batch-size", type=int, default=d.batch_size,
                       help=f"images per batch (default: {d.batch_size})")
    group.add_argument("--top-k", type=int, default=d.top_k,
                       help=f"k of the top-k accuracy (default: {d.top_k})")
    group.add_argument("--num-batches", type=int, default=d.num_batches,
                       help="batches to run, 0 for all (--benchmark: 10) (default: 0)")
    group.add_argument("--benchmark", type=int, nargs="?", const=1, default=int(d.benchmark),
                       help="1 (or the flag alone): inference throughput by --batch-sizes on "
                            "random data instead of accuracy (default: 0)")
    group.add_argument("--batch-sizes", type=int_tuple, default=d.batch_sizes,
                       help="--benchmark's batch sizes (default: %s)"
                            % ",".join(map(str, d.batch_sizes)))
    return parser


def _add_preprocessing_arguments(parser, d):
    group = parser.add_argument_group("preprocessing (default: the training run's, else ImageNet's)")
    group.add_argument("--image-shape", type=int_tuple, default=d.image_shape,
                       help="input shape C,H,W (default: the run's, else 3,224,224)")
    group.add_argument("--input-size", type=_input_size, dest="image_shape",
                       help="GluonCV's: square input of this side (default: none)")
    group.add_argument("--crop-ratio", type=float, default=d.crop_ratio,
                       help="centre crop / resized shorter side (default: the run's, else 0.875)")
    group.add_argument("--rgb-mean", type=float_tuple, default=d.rgb_mean,
                       help="per-channel mean R,G,B, 0..255 (default: the run's, else ImageNet's)")
    group.add_argument("--rgb-std", type=float_tuple, default=d.rgb_std,
                       help="per-channel std R,G,B, 0..255 (default: the run's, else ImageNet's)")


def add_export_arguments(parser, d):
    """The flags of ``scripts/export.py`` with ``d`` (an ``ExportConfig``) as defaults."""
    add_model_arguments(parser, d)
    _add_preprocessing_arguments(parser, d)
    group = parser.add_argument_group("export")
    group.add_argument("--output", "-o", default=d.output,
                       help="prefix of the files written: PREFIX-symbol.json, PREFIX-0000.params, "
                            "PREFIX-float16-..., PREFIX.onnx, PREFIX-preprocessing.json; needed "
                            "(default: none)")
    group.add_argument("--dtype", type=dtype_list, default=d.dtype,
                       help="float32 (plain MXNet, float32 servers), float16 (the GPU graph) or "
                            "float32,float16 (default: %s)" % ",".join(d.dtype))
    group.add_argument("--emulate", action="store_true",
                       help="float16: write the CPU emulation graph (Cast pairs) instead of the "
                            "GPU graph, as PREFIX-float16-emulated (default: off)")
    group.add_argument("--onnx", action="store_true",
                       help="also write PREFIX.onnx (each --dtype MXNet's exporter can write), "
                            "checked with onnx.checker (needs onnx<1.19) (default: off)")
    group.add_argument("--opset", type=int, default=d.opset,
                       help=f"ONNX opset: MXNet 1.9.1 exports 12 and 13 (default: {d.opset})")
    group.add_argument("--onnxruntime-python", default=d.onnxruntime_python,
                       help="python of a venv with onnxruntime: runs the ONNX file and compares "
                            "with MXNet's outputs (default: $MXFP16_ONNXRUNTIME_PYTHON, else not "
                            "run)")
    group.add_argument("--seed", type=int, default=d.seed,
                       help=f"seed of the random check batch (default: {d.seed})")
    return parser
