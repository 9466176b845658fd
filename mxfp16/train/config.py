"""Training configuration: the command-line flags, one dataclass built from them, and its checks.

Configuration flows one way: ``argparse`` (flags defined here, shared by the scripts) ->
:class:`TrainConfig` / :class:`FineTuneConfig` (checked once by ``checked()``) -> package functions
with explicit keyword arguments.  Flag names follow MXNet's ``example/image-classification`` and
GluonCV's ``train_imagenet.py``, so existing commands carry over.
"""
import dataclasses
from dataclasses import dataclass

import mxnet as mx

from ..dtypes import check_dtype
from ..kvstore import KVSTORE_TYPES
from ..models import DEFAULT_MODEL_ROOT, check_network_name
from ..optimizers import check_optimizer
from .schedule import LR_MODES

#: The two MXNet APIs a run can train with (``--api``).
API_CHOICES = ("gluon", "module")

#: Images in ImageNet-1k's training set: MXNet's default epoch length for synthetic data.
IMAGENET_TRAIN_IMAGES = 1281167


@dataclass(frozen=True)
class TrainConfig:
    """Every setting of a training run, as ``scripts/train_imagenet.py`` resolves it.

    Field names are the flags' (``--lr-step-epochs`` -> ``lr_step_epochs``); see
    :func:`add_train_arguments` for their meaning.  Call :meth:`checked` before use.

    Examples
    --------
    >>> config = TrainConfig(network='resnet18_v1', dtype='fp16').checked()
    >>> config.dtype, config.synthetic
    ('float16', True)
    >>> TrainConfig(lr_mode='linear').checked()
    Traceback (most recent call last):
    ...
    ValueError: --lr-mode 'linear' is not supported: choose one of step, cosine, poly
    """

    network: str = "resnet50_v1"
    api: str = "gluon"
    dtype: str = "float32"
    num_classes: int = 1000
    image_shape: tuple = (3, 224, 224)
    data_train: str = None
    data_train_idx: str = None
    data_val: str = None
    data_val_idx: str = None
    data_dir: str = None
    val_fraction: float = 0.2
    benchmark: int = 0
    num_examples: int = IMAGENET_TRAIN_IMAGES
    data_nthreads: int = 4
    gpus: str = ""
    kv_store: str = "device"
    batch_size: int = 128
    num_epochs: int = 90
    lr: float = 0.1
    lr_mode: str = "step"
    lr_step_epochs: tuple = (30, 60, 80)
    lr_factor: float = 0.1
    warmup_epochs: int = 0
    optimizer: str = "sgd"
    mom: float = 0.9
    wd: float = 1e-4
    no_wd: bool = False
    label_smoothing: float = 0.0
    mixup: bool = False
    mixup_alpha: float = 0.2
    loss_scale: str = None
    max_consecutive_skips: int = 200
    top_k: int = 5
    model_prefix: str = None
    resume: str = None
    save_period: int = 1
    disp_batches: int = 20
    seed: int = 0
    tensorboard: str = None
    max_batches: int = 0
    log_file: str = None

    @property
    def run_name(self):
        """What the logs and the summary line call the run: the network."""
        return self.network

    @property
    def synthetic(self):
        """Whether the run trains on synthetic data (``--benchmark 1`` or no data flag)."""
        return bool(self.benchmark) or not (self.data_train or self.data_dir)

    def checked(self):
        """This configuration with canonical names, or ``ValueError`` naming the flag to fix."""
        _check_numbers(self)
        _check_data_flags(self)
        _check_choice("--api", self.api, API_CHOICES)
        _check_choice("--lr-mode", self.lr_mode, LR_MODES)
        _check_choice("--kv-store", self.kv_store, KVSTORE_TYPES)
        if self.batch_size % len(contexts(self.gpus)):
            raise ValueError(f"--batch-size {self.batch_size} does not split evenly over the "
                             f"{len(contexts(self.gpus))} devices of --gpus {self.gpus}: pass a "
                             "multiple of the number of GPUs")
        dtype = _flag_check("--dtype", check_dtype, self.dtype)
        _flag_check("--network", check_network_name, self.network)
        optimizer = _flag_check("--optimizer", check_optimizer, self.optimizer)
        return dataclasses.replace(self, dtype=dtype, optimizer=optimizer)

    def to_dict(self):
        """The settings as JSON-ready plain values (checkpoints store them)."""
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class FineTuneConfig(TrainConfig):
    """The settings of ``scripts/fine_tune.py``: a :class:`TrainConfig` plus the pretrained network.

    ``pretrained_model`` + ``load_epoch`` name an MXNet checkpoint (Module or Gluon export); without
    them ``network``'s pretrained weights come from ``model_root``.
    """

    dtype: str = "float16"
    num_epochs: int = 10
    lr: float = 0.01
    lr_step_epochs: tuple = (6, 9)
    pretrained_model: str = None
    load_epoch: int = None
    model_root: str = DEFAULT_MODEL_ROOT
    freeze_backbone: bool = False
    lr_mult: float = 1.0

    @property
    def run_name(self):
        """The pretrained checkpoint when one is given, else the network."""
        return self.pretrained_model or self.network

    def checked(self):
        if (self.pretrained_model is None) != (self.load_epoch is None):
            raise ValueError("--pretrained-model and --load-epoch go together: pass both to start "
                             "from an MXNet checkpoint, or neither to use --network's pretrained "
                             "weights")
        if not self.lr_mult >= 0:
            raise ValueError(f"--lr-mult must be >= 0, got {self.lr_mult!r}: for example 0.1 trains "
                             "the pretrained layers ten times slower than the new classifier")
        return super().checked()


def contexts(gpus):
    """The devices of a ``--gpus`` value: ``''`` is the CPU, ``'0,1'`` GPUs 0 and 1.

    Examples
    --------
    >>> contexts(''), contexts('0,1')
    ([cpu(0)], [gpu(0), gpu(1)])
    """
    text = str(gpus or "").strip()
    if not text:
        return [mx.cpu()]
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus {gpus!r} is not a comma-separated list of GPU ids: pass e.g. "
                         "--gpus 0,1, or leave it empty for the CPU") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {gpus!r} must list distinct GPU ids >= 0, e.g. --gpus 0,1")
    return [mx.gpu(i) for i in ids]


def _check_choice(flag, value, choices):
    if value not in choices:
        raise ValueError(f"{flag} {value!r} is not supported: choose one of {', '.join(choices)}")


def _flag_check(flag, check, *args):
    """Run a package check; prefix its message with the flag it is about."""
    try:
        return check(*args)
    except ValueError as error:
        raise ValueError(f"{flag}: {error}") from None


_POSITIVE_INTS = ("num_classes", "batch_size", "num_epochs", "num_examples", "data_nthreads",
                  "save_period", "disp_batches", "top_k", "max_consecutive_skips")
_NON_NEGATIVE = ("warmup_epochs", "max_batches", "wd", "label_smoothing")


def _check_numbers(config):
    for name in _POSITIVE_INTS:
        if getattr(config, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(config, name)}")
    for name in _NON_NEGATIVE:
        if getattr(config, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(config, name)}")
    if not config.lr > 0 or not 0 < config.lr_factor <= 1:
        raise ValueError(f"need --lr > 0 and 0 < --lr-factor <= 1, got --lr {config.lr} "
                         f"--lr-factor {config.lr_factor}")
    if config.label_smoothing >= 1 or not config.mixup_alpha > 0 or not 0 <= config.mom < 1:
        raise ValueError("need 0 <= --label-smoothing < 1 (e.g. 0.1), --mixup-alpha > 0 (e.g. 0.2) "
                         f"and 0 <= --mom < 1, got {config.label_smoothing}, {config.mixup_alpha}, "
                         f"{config.mom}")
    if config.warmup_epochs >= config.num_epochs and config.warmup_epochs:
        raise ValueError(f"--warmup-epochs {config.warmup_epochs} leaves no epoch after the warm-up "
                         f"of --num-epochs {config.num_epochs}: lower it")


def _check_data_flags(config):
    if config.data_dir and (config.data_train or config.data_val):
        raise ValueError("pass either --data-dir (an image folder) or --data-train/--data-val "
                         "(RecordIO files), not both")
    if config.data_val and not config.data_train:
        raise ValueError("--data-val needs --data-train: pass the training .rec file too")
    if not 0 <= config.val_fraction < 1:
        raise ValueError(f"--val-fraction must be in [0, 1), got {config.val_fraction}: "
                         "for example 0.2")
    if len(config.image_shape) != 3 or config.image_shape[0] != 3 or min(config.image_shape) < 1:
        raise ValueError(f"--image-shape must be 3,HEIGHT,WIDTH, got "
                         f"{','.join(map(str, config.image_shape))}: for example 3,224,224")
