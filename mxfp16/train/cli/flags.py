"""The command-line flags of the training scripts, with the defaults of their config dataclass.

Flag names follow MXNet's ``example/image-classification`` and GluonCV's ``train_imagenet.py``, so
existing commands carry over; every flag's help ends with its default.
"""
import argparse

from ...distributed.kvstore import KVSTORE_TYPES
from .config import FineTuneConfig, TrainConfig
from .flags_compat import add_compat_arguments
from ..schedule import LR_MODES


def int_tuple(text):
    """argparse type of comma-separated integers: ``'3,224,224'`` -> ``(3, 224, 224)``.

    Examples
    --------
    >>> int_tuple('3,224,224'), int_tuple('')
    ((3, 224, 224), ())
    """
    try:
        return tuple(int(part) for part in str(text).split(",") if part.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of integers "
                                         "(e.g. 3,224,224)") from None


def str_list(text):
    """argparse type of comma-separated names: ``'features.3,output'`` -> ``('features.3',
    'output')`` (empty names are kept for the config's check to name).

    Examples
    --------
    >>> str_list('features.3,output')
    ('features.3', 'output')
    """
    return tuple(str(text).split(","))


def step_epochs(text):
    """argparse type of ``--lr-step-epochs``: epochs (``'30,60'`` -> ``(30, 60)``), or MXNet
    example's poly schedule ``'pow2'`` as it is.

    Examples
    --------
    >>> step_epochs('30,60'), step_epochs('pow2')
    ((30, 60), 'pow2')
    """
    return str(text).strip() if str(text).strip().startswith("pow") else int_tuple(text)


class ArgumentParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors are one ``error: ...`` line and exit code 2."""

    def error(self, message):
        self.exit(2, f"error: {message} (see --help)\n")


def add_train_arguments(parser, defaults=None):
    """Add the training flags to ``parser``, with ``defaults`` (a config; default: ``TrainConfig()``)
    as their defaults."""
    defaults = defaults or TrainConfig()
    _add_network_arguments(parser, defaults)
    _add_data_arguments(parser, defaults)
    _add_optimizer_arguments(parser, defaults)
    _add_run_arguments(parser, defaults)
    add_compat_arguments(parser, defaults)
    return parser


def _add_network_arguments(parser, d):
    group = parser.add_argument_group("network")
    group.add_argument("--network", "--model", default=d.network,
                       help="model-zoo network (GluonCV or MXNet), or a network of MXNet's example "
                            "with --num-layers (resnet-v1, resnet, resnext, vgg, inception-v3, "
                            f"mobilenet, ...); --model is GluonCV's name (default: {d.network})")
    group.add_argument("--api", default=d.api, help="MXNet API: gluon (HybridBlock + Trainer) or "
                       f"module (Symbol + Module) (default: {d.api})")
    group.add_argument("--dtype", default=d.dtype,
                       help=f"training dtype: float32, float16 or bfloat16 (default: {d.dtype})")
    group.add_argument("--num-classes", type=int, default=d.num_classes,
                       help=f"number of classes (default: {d.num_classes})")
    group.add_argument("--image-shape", type=int_tuple, default=d.image_shape,
                       help="input shape C,H,W (default: %s)" % ",".join(map(str, d.image_shape)))
    group.add_argument("--gpus", default=d.gpus, help="GPUs to train on, e.g. 0,1, with "
                       "--batch-size the total batch; empty for the CPU (default: empty)")
    group.add_argument("--num-gpus", type=int, default=d.num_gpus, help="GluonCV's: train on "
                       "GPUs 0..N-1 (0: the CPU), with --batch-size per device (default: none)")
    group.add_argument("--cpus", type=int, default=d.cpus, help="data parallel over CPU "
                       "contexts cpu(0)..cpu(N-1): rehearses --gpus 0,..,N-1 on the CPU, the same "
                       "code path, no speed-up (default: 1)")
    group.add_argument("--kv-store", default=d.kv_store, help="kvstore: " + ", ".join(
        KVSTORE_TYPES) + f" (default: {d.kv_store})")


def _add_data_arguments(parser, d):
    group = parser.add_argument_group("data (no data flag: synthetic data)")
    group.add_argument("--data-train", "--rec-train", default=d.data_train,
                       help="training .rec file; --rec-train is GluonCV's name (default: none)")
    group.add_argument("--data-train-idx", "--rec-train-idx", default=d.data_train_idx,
                       help="its .idx file (default: next to the .rec)")
    group.add_argument("--data-val", "--rec-val", default=d.data_val,
                       help="validation .rec file (default: none)")
    group.add_argument("--data-val-idx", "--rec-val-idx", default=d.data_val_idx,
                       help="its .idx file (default: next to the .rec)")
    group.add_argument("--data-dir", default=d.data_dir, help="image folder, one sub-folder per "
                       "class (Caltech layout) or train/ and val/ of such folders (default: none)")
    group.add_argument("--val-fraction", type=float, default=d.val_fraction, help="--data-dir "
                       f"without val/: fraction of each class held out (default: {d.val_fraction})")
    group.add_argument("--benchmark", type=int, default=d.benchmark,
                       help=f"1: synthetic data whatever the data flags (default: {d.benchmark})")
    group.add_argument("--num-examples", type=int, default=d.num_examples,
                       help="images per epoch: synthetic data's epoch; with real data, the lr "
                            "schedule's epoch length, as in MXNet's fit.py (default: "
                            + (f"{d.num_examples})" if d.num_examples else
                               "1281167 for synthetic data; real data counts its images)"))
    group.add_argument("--data-nthreads", type=int, default=d.data_nthreads,
                       help=f"decoding threads for .rec files (default: {d.data_nthreads})")
    group.add_argument("-j", "--num-data-workers", type=int, default=d.num_data_workers,
                       help="GluonCV's: N decoding threads for .rec files and N worker processes "
                            "decoding an image folder (0: in the training process) (default: "
                            "--data-nthreads for .rec files, 0 for folders)")
    group.add_argument("--batch-size", type=int, default=d.batch_size,
                       help=f"images per step on each worker (default: {d.batch_size})")


def _add_optimizer_arguments(parser, d):
    group = parser.add_argument_group("optimization")
    group.add_argument("--num-epochs", type=int, default=d.num_epochs,
                       help=f"epochs to train (default: {d.num_epochs})")
    group.add_argument("--lr", type=float, default=d.lr, help=f"learning rate (default: {d.lr})")
    group.add_argument("--lr-mode", default=d.lr_mode, help=f"schedule: {', '.join(LR_MODES)} "
                       f"(default: {d.lr_mode})")
    group.add_argument("--lr-step-epochs", "--lr-decay-epoch", type=step_epochs,
                       default=d.lr_step_epochs,
                       help="step mode: epochs at which the lr is multiplied by --lr-factor; "
                            "pow2 (MXNet's example): the poly schedule, --lr-mode poly "
                            "(default: %s)" % ",".join(map(str, d.lr_step_epochs)))
    group.add_argument("--lr-factor", "--lr-decay", type=float, default=d.lr_factor,
                       help=f"step mode: lr decay factor (default: {d.lr_factor})")
    group.add_argument("--warmup-epochs", type=int, default=d.warmup_epochs,
                       help=f"linear lr warm-up from --warmup-lr (default: {d.warmup_epochs})")
    group.add_argument("--optimizer", default=d.optimizer, help=f"optimizer (default: {d.optimizer})")
    group.add_argument("--mom", "--momentum", type=float, default=d.mom,
                       help=f"momentum (default: {d.mom})")
    group.add_argument("--wd", type=float, default=d.wd, help=f"weight decay (default: {d.wd})")
    group.add_argument("--no-wd", action="store_true",
                       help="no weight decay on biases and BatchNorm gamma/beta (default: off)")
    group.add_argument("--label-smoothing", type=float, nargs="?", const=0.1,
                       default=d.label_smoothing, help="label smoothing epsilon; the flag alone "
                       f"means 0.1 (default: {d.label_smoothing})")
    group.add_argument("--mixup", action="store_true", help="mixup training (default: off)")
    group.add_argument("--mixup-alpha", type=float, default=d.mixup_alpha,
                       help=f"mixup Beta(alpha, alpha) parameter (default: {d.mixup_alpha})")
    group.add_argument("--loss-scale", default=d.loss_scale, help="'dynamic' (its start "
                       "measured at the first step), 'dynamic:N' (dynamic from N, e.g. "
                       "dynamic:65536, the classic start) or a number (static; 1 is none) "
                       "(default: dynamic for float16, none for float32 and bfloat16)")
    group.add_argument("--max-consecutive-skips", type=int, default=d.max_consecutive_skips,
                       help="stop when this many steps in a row overflow at the minimum loss "
                            f"scale (default: {d.max_consecutive_skips})")
    group.add_argument("--keep-float32", metavar="SELECTOR[,SELECTOR...]",
                       type=str_list, default=d.keep_float32,
                       help="blocks that stay float32 in a float16 or bfloat16 run, their ops "
                            "and parameters: block paths of the network as print(net) shows "
                            "them (features.3, output) or Gluon names (resnetv10_stage4), globs "
                            "allowed; op names for a --pretrained-model checkpoint (default: "
                            "none)")


def _add_run_arguments(parser, d):
    group = parser.add_argument_group("run")
    group.add_argument("--top-k", type=int, default=d.top_k,
                       help=f"also report top-k accuracy (default: {d.top_k})")
    group.add_argument("--model-prefix", default=d.model_prefix,
                       help="checkpoint prefix, e.g. runs/r50 (default: no checkpoints)")
    group.add_argument("--resume", default=d.resume, help="checkpoint to continue: PREFIX-NNNN, "
                       "PREFIX-NNNN+BBBBBB (mid-epoch), PREFIX for its newest complete one, or "
                       "auto: --model-prefix's newest complete one if it has one, else start "
                       "(default: none)")
    group.add_argument("--save-period", "--save-frequency", type=int, default=d.save_period,
                       help=f"save a checkpoint every N epochs (default: {d.save_period})")
    group.add_argument("--save-steps", type=int, default=d.save_steps,
                       help="also save a mid-epoch checkpoint every N batches, keeping only the "
                       "newest (default: 0, never)")
    group.add_argument("--save-minutes", type=float, default=d.save_minutes,
                       help="also save a mid-epoch checkpoint every M minutes, keeping only the "
                       "newest (default: 0, never)")
    group.add_argument("--disp-batches", "--log-interval", type=int, default=d.disp_batches,
                       help=f"log every N batches (default: {d.disp_batches})")
    group.add_argument("--seed", type=int, default=d.seed, help=f"random seed (default: {d.seed})")
    group.add_argument("--tensorboard", default=d.tensorboard,
                       help="TensorBoard log directory (default: none)")
    group.add_argument("--max-batches", type=int, default=d.max_batches,
                       help=f"stop each epoch after N batches, 0 for all (default: {d.max_batches})")
    group.add_argument("--log-file", "--logging-file", default=d.log_file,
                       help="log file (default: train.log "
                       "next to --model-prefix; none without it)")
    group.add_argument("--allow-pickle", action="store_true",
                       help="read pickled optimizer states (MXNet's or GluonCV's .states files, "
                       "mxfp16 checkpoints saved before checksums): a pickle can run any code when "
                       "read, so pass it only for files you trust (default: off)")
    group.add_argument("--skip-bad-images", action="store_true",
                       help="leave out image-folder files that are not whole JPEG/PNG images, "
                       "with a counted warning, instead of stopping at start (default: off)")


def add_fine_tune_arguments(parser, defaults=None):
    """Add the training flags and the fine-tuning ones to ``parser`` (defaults: ``FineTuneConfig()``)."""
    defaults = defaults or FineTuneConfig()
    add_train_arguments(parser, defaults)
    group = parser.add_argument_group("pretrained network")
    group.add_argument("--pretrained-model", default=defaults.pretrained_model,
                       help="MXNet checkpoint prefix (Module or Gluon export) to start from, with "
                            "--load-epoch, or a model of MXNet's model zoo (imagenet1k-resnet-50, "
                            "...: model/NAME-symbol.json and model/NAME-0000.params here or in "
                            "--model-root) (default: --network's pretrained zoo weights)")
    group.add_argument("--layer-before-fullc", default=defaults.layer_before_fullc,
                       help="put the new classifier after this layer (MXNet's fine-tune.py: "
                            "flatten0) (default: replace the last FullyConnected or Convolution)")
    group.add_argument("--freeze-backbone", action="store_true",
                       help="train the new classifier only (default: off)")
    group.add_argument("--lr-mult", type=float, default=defaults.lr_mult,
                       help="learning-rate multiplier of the pretrained layers "
                            f"(default: {defaults.lr_mult})")
    return parser
