"""The flags of MXNet's example/image-classification and GluonCV's train_imagenet.py that mxfp16's
own flags do not already spell (those are aliases in :mod:`mxfp16.train.cli.flags`: ``--model``,
``--rec-train``, ``-j``, ``--momentum``, ``--lr-decay``, ...).

:mod:`mxfp16.train.cli.compat` gives each its meaning in the tool it came from.  Where GluonCV's
default differs from mxfp16's, a GluonCV command keeps GluonCV's meaning for the flags it passes
only; docs/mxnet_gluoncv_commands.md lists the defaults that differ.
"""
import argparse

from .compat import INITIALIZERS, MODES
from ..data.augmentation import IMAGENET_RECIPE
from .nvidia_compat import add_nvidia_arguments


def float_tuple(text):
    """argparse type of comma-separated numbers: ``'123.68,116.779,103.939'`` -> a tuple.

    Examples
    --------
    >>> float_tuple('1,2.5,3')
    (1.0, 2.5, 3.0)
    """
    try:
        return tuple(float(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of numbers "
                                         "(e.g. 123.68,116.779,103.939)") from None


class Unsupported(argparse.Action):
    """A flag whose feature mxfp16 does not have: one ``error:`` line naming it."""

    def __init__(self, option_strings, dest, reason, **kwargs):
        self.reason = reason
        super().__init__(option_strings, dest, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(f"{option_string}: {self.reason}")


def add_compat_arguments(parser, d):
    """Add the example's and GluonCV's flags to ``parser``, with the config ``d``'s defaults."""
    _add_network_flags(parser.add_argument_group("networks of MXNet's example and GluonCV"), d)
    _add_training_flags(parser.add_argument_group("GluonCV's and MXNet's training flags"), d)
    _add_augmentation_flags(parser.add_argument_group(
        "augmentation (MXNet example's flags, for .rec files and image folders alike; "
        "defaults: the script's recipe)"), d)
    add_nvidia_arguments(parser.add_argument_group(
        "NVIDIA's MXNet ResNet-50 (DeepLearningExamples) flags"), d)
    distillation = "knowledge distillation is not supported by mxfp16: train without --teacher, " \
        "--temperature and --hard-weight"
    for flag in ("--teacher", "--temperature", "--hard-weight"):
        parser.add_argument(flag, action=Unsupported, reason=distillation,
                            help="GluonCV's distillation: not supported, an error (default: none)")
    return parser


def _add_network_flags(group, d):
    group.add_argument("--num-layers", type=int, default=d.num_layers,
                       help="layers of an MXNet example --network (resnet, resnet-v1, resnext, "
                            f"vgg) (default: {d.num_layers or 'none'})")
    group.add_argument("--batch-norm", action="store_true",
                       help="VGG with batch normalization (vgg16 -> vgg16_bn) (default: off)")
    group.add_argument("--use-se", "--use_se", dest="use_se", action="store_true",
                       help="squeeze-and-excitation in resnext networks (GluonCV) (default: off)")
    group.add_argument("--last-gamma", action="store_true", help="zero gamma of the last "
                       "BatchNorm of each residual block (GluonCV) (default: off)")
    group.add_argument("--use-pretrained", action="store_true",
                       help="start from the zoo's pretrained ImageNet weights (default: off)")
    group.add_argument("--model-root", default=d.model_root,
                       help=f"folder of the zoo's pretrained weights (default: {d.model_root})")
    group.add_argument("--initializer", default=d.initializer,
                       help=f"weight initializer: {', '.join(INITIALIZERS)}; default is He "
                            f"(MSRA) initialization (default: {d.initializer})")
    group.add_argument("--mode", default=d.mode, help=f"GluonCV's: {', '.join(MODES)} "
                       "(imperative: the Gluon network is not hybridized) (default: "
                       f"{d.mode})")


def _add_training_flags(group, d):
    group.add_argument("--input-size", type=int, default=d.input_size,
                       help="GluonCV's: square input side, same as --image-shape 3,N,N "
                            "(default: --image-shape)")
    group.add_argument("--crop-ratio", type=float, default=d.crop_ratio,
                       help="validation: centre crop of this fraction of the resized shorter side "
                            f"(default: {d.crop_ratio})")
    group.add_argument("--use-rec", action="store_true", help="GluonCV's: read --rec-train/"
                       "--rec-val (default: off; on with --rec-train)")
    group.add_argument("--num-training-samples", type=int, default=d.num_training_samples,
                       help="GluonCV's: images per epoch of the lr schedule (N // --batch-size "
                            "batches); the epoch's batches come from the data, and synthetic data "
                            "has N images (default: none, the data's own count)")
    group.add_argument("--lr-decay-period", type=int, default=d.lr_decay_period,
                       help="GluonCV's: decay the lr every N epochs, replacing --lr-step-epochs; "
                            f"0: off (default: {d.lr_decay_period})")
    group.add_argument("--warmup-lr", type=float, default=d.warmup_lr,
                       help=f"learning rate the warm-up starts from (default: {d.warmup_lr})")
    group.add_argument("--mixup-off-epoch", type=int, default=d.mixup_off_epoch,
                       help="GluonCV's: last N epochs train without mixup (default: "
                            f"{d.mixup_off_epoch})")
    group.add_argument("--amp", action="store_true", help="GluonCV's AMP: float16 with dynamic "
                       "loss scaling, same as --dtype float16 (default: off)")
    group.add_argument("--save-dir", default=d.save_dir, help="GluonCV's: checkpoints in this "
                       "folder as imagenet-NETWORK-NNNN.* (default: none; --model-prefix wins)")
    group.add_argument("--load-epoch", type=int, default=d.load_epoch,
                       help="train_imagenet.py: resume the checkpoint of --model-prefix at this "
                            "epoch (MXNet's example); fine_tune.py: the epoch of "
                            "--pretrained-model (default: none)")
    group.add_argument("--resume-params", default=d.resume_params,
                       help="GluonCV's: resume the checkpoint PREFIX-NNNN.params of mxfp16, or "
                            "start from a parameter file GluonCV saved (default: none)")
    group.add_argument("--resume-states", default=d.resume_states,
                       help="GluonCV's: the optimizer state, PREFIX-NNNN.states, or the "
                            "trainer.save_states file of GluonCV's run: its optimizer (nag) and "
                            "momenta, float16 master weights added; GluonCV's file is a pickle, "
                            "read only with --allow-pickle (default: the checkpoint's; none for a "
                            "GluonCV file)")
    group.add_argument("--resume-epoch", type=int, default=d.resume_epoch,
                       help="GluonCV's: the epoch to resume at; must be the checkpoint's NNNN "
                            f"(default: {d.resume_epoch}, the checkpoint's)")
    group.add_argument("--test-io", type=int, default=d.test_io,
                       help=f"1: only read the training data and log its speed (default: "
                            f"{d.test_io})")
    group.add_argument("--loss", default=d.loss, help="MXNet example's: ce or nll_loss to log; "
                       "the cross-entropy loss is always logged (default: none)")
    group.add_argument("--monitor", type=int, default=d.monitor,
                       help="log the root mean square of every parameter every N batches "
                            f"(MXNet example's Monitor); 0: off (default: {d.monitor})")
    group.add_argument("--gc-type", default=d.gc_type, help="gradient compression: none, or "
                       "fp16 with --kv-store horovod (float32 gradients sent as float16); 2bit "
                       f"is an error (default: {d.gc_type})")
    group.add_argument("--gc-threshold", type=float, default=d.gc_threshold,
                       help=f"2bit gradient compression threshold (default: {d.gc_threshold})")
    _add_example_fit_flags(group, d)


def _add_example_fit_flags(group, d):
    """Flags of the example's common/fit.py and common/data.py with no flag of mxfp16's own."""
    group.add_argument("--warmup-strategy", default=d.warmup_strategy,
                       help="MXNet example's: linear only, the --warmup-epochs warm-up; its "
                            f"LBSGD strategies are an error (default: {d.warmup_strategy})")
    group.add_argument("--macrobatch-size", type=int, default=d.macrobatch_size,
                       help="MXNet example's lbsgd: effective batch; larger than the batch of "
                            "all workers is an error (no gradient accumulation), ignored by the "
                            f"other optimizers as in MXNet (default: {d.macrobatch_size})")
    group.add_argument("--profile-worker-suffix", default=d.profile_worker_suffix,
                       help="MXNet profiler's trace of the training into this file (rankN_FILE "
                            "with several workers) (default: none)")
    group.add_argument("--profile-server-suffix", default=d.profile_server_suffix,
                       help="profiling the kvstore servers: not supported, an error; use "
                            "--profile-worker-suffix (default: none)")
    group.add_argument("--use-imagenet-data-augmentation", type=int,
                       default=d.use_imagenet_data_augmentation,
                       help="1: the ImageNet augmentation, train_imagenet.py's recipe already "
                            f"(default: {d.use_imagenet_data_augmentation})")
    group.add_argument("--use-python-iter", type=int, default=d.use_python_iter,
                       help="1: MXNet reads .rec files in Python; mxfp16 reads the same images "
                            f"with ImageRecordIter (noted) (default: {d.use_python_iter})")
    group.add_argument("--use-gpu-augmenter", type=int, default=d.use_gpu_augmenter,
                       help="1: MXNet augments on the GPUs; mxfp16 augments on the CPU (noted) "
                            f"(default: {d.use_gpu_augmenter})")


#: (flag, type, help) of the augmentation flags; the default is the recipe's value.
_AUGMENTATION = (
    ("--random-crop", int, "1: random crop (without --random-resized-crop), 0: centre crop"),
    ("--random-mirror", int, "1: random horizontal flip"),
    ("--random-resized-crop", int, "1: crop a random area and aspect ratio, resized"),
    ("--min-random-area", float, "resized crop: smallest fraction of the area"),
    ("--max-random-area", float, "resized crop: largest fraction of the area"),
    ("--min-random-aspect-ratio", float, "smallest aspect ratio (width/height)"),
    ("--max-random-aspect-ratio", float, "largest aspect ratio; without --min-random-aspect-ratio "
                                         "and resized crop: the largest change, [1-a, 1+a]"),
    ("--max-random-h", int, "largest hue change, 0..180"),
    ("--max-random-s", int, "largest saturation change, 0..255"),
    ("--max-random-l", int, "largest lightness change, 0..255"),
    ("--brightness", float, "brightness jitter"),
    ("--contrast", float, "contrast jitter"),
    ("--saturation", float, "saturation jitter"),
    ("--pca-noise", float, "PCA lighting noise"),
    ("--max-random-rotate-angle", int, "largest rotation, degrees"),
    ("--max-random-shear-ratio", float, "largest shear, 0..1"),
    ("--max-random-scale", float, "largest scale"),
    ("--min-random-scale", float, "smallest scale"),
    ("--pad-size", int, "pixels of padding on each side"),
    ("--fill-value", int, "value of padded and rotated-in pixels"),
    ("--rgb-mean", float_tuple, "per-channel mean R,G,B (0..255)"),
    ("--rgb-std", float_tuple, "per-channel std R,G,B (0..255); MXNet's example uses 1,1,1"),
    ("--min-crop-size", int, "smallest random crop side, -1: off"),
    ("--max-crop-size", int, "largest random crop side, -1: off"),
)


def _add_augmentation_flags(group, d):
    recipe = getattr(d, "augmentation", IMAGENET_RECIPE)
    for flag, kind, text in _AUGMENTATION:
        name = flag[2:].replace("-", "_")
        value = getattr(recipe, name)
        shown = ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else \
            "none" if value is None else f"{value:g}"
        group.add_argument(flag, type=kind, default=getattr(d, name),
                           help=f"{text} (default: {shown})")
