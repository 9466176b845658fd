"""Training configuration: the command-line flags, one dataclass built from them, and its checks.

Configuration flows one way: ``argparse`` (flags defined here, shared by the scripts) ->
:class:`TrainConfig` / :class:`FineTuneConfig` (checked once by ``checked()``) -> package functions
with explicit keyword arguments.  Flag names follow MXNet's ``example/image-classification`` and
GluonCV's ``train_imagenet.py``, so existing commands carry over.
"""
import dataclasses
import math
import os
from dataclasses import dataclass

import mxnet as mx

from ...dtypes import check_dtype
from ...distributed.kvstore import KVSTORE_TYPES
from ...models import DEFAULT_MODEL_ROOT, MXNET_ZOO_MODELS
from ...checkpoints.optimizer_states import PICKLE_RISK, is_pickle_file
from ...optimizers import check_optimizer
from .compat import augmentation, network_settings, resolve_commands
from ..data.augmentation import CIFAR_RECIPE, FINE_TUNE_RECIPE, IMAGENET_RECIPE
from ..data.base import CROP_RATIO, resize_size
from ..schedule import LR_MODES

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
    # None: the synthetic epoch is ImageNet's, and real data counts its own images.
    num_examples: int = None
    data_nthreads: int = 4
    gpus: str = ""
    cpus: int = None
    num_gpus: int = None
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
    keep_float32: tuple = ()
    top_k: int = 5
    model_prefix: str = None
    resume: str = None
    save_period: int = 1
    save_steps: int = 0
    save_minutes: float = 0.0
    disp_batches: int = 20
    seed: int = 0
    tensorboard: str = None
    max_batches: int = 0
    log_file: str = None
    allow_pickle: bool = False
    skip_bad_images: bool = False
    # MXNet example's and GluonCV's flags (see mxfp16.train.cli.compat and flags_compat).
    num_layers: int = None
    batch_norm: bool = False
    use_se: bool = False
    last_gamma: bool = False
    use_pretrained: bool = False
    model_root: str = DEFAULT_MODEL_ROOT
    initializer: str = "default"
    mode: str = "hybrid"
    input_size: int = None
    crop_ratio: float = CROP_RATIO
    use_rec: bool = False
    lr_decay_period: int = 0
    warmup_lr: float = 0.0
    mixup_off_epoch: int = 0
    save_dir: str = None
    load_epoch: int = None
    resume_epoch: int = 0
    resume_params: str = None
    resume_states: str = None
    num_training_samples: int = None
    amp: bool = False
    loss: str = ""
    monitor: int = 0
    test_io: int = 0
    gc_type: str = "none"
    gc_threshold: float = 0.5
    num_data_workers: int = None
    macrobatch_size: int = 0
    warmup_strategy: str = "linear"
    profile_worker_suffix: str = ""
    profile_server_suffix: str = ""
    use_imagenet_data_augmentation: int = 0
    use_python_iter: int = 0
    use_gpu_augmenter: int = 0
    # NVIDIA's MXNet ResNet-50 flags (mxfp16.train.cli.nvidia_compat).
    arch: str = None
    fuse_bn_relu: int = 0
    fuse_bn_add_relu: int = 0
    input_layout: str = "NCHW"
    conv_layout: str = "NCHW"
    batchnorm_layout: str = "NCHW"
    pooling_layout: str = "NCHW"
    data_backend: str = None
    notes: tuple = ()
    # The example's augmentation flags: None keeps the recipe's value (see ``augmentation``).
    random_crop: int = None
    random_mirror: int = None
    random_resized_crop: int = None
    min_random_area: float = None
    max_random_area: float = None
    min_random_aspect_ratio: float = None
    max_random_aspect_ratio: float = None
    max_random_h: int = None
    max_random_s: int = None
    max_random_l: int = None
    brightness: float = None
    contrast: float = None
    saturation: float = None
    pca_noise: float = None
    max_random_rotate_angle: int = None
    max_random_shear_ratio: float = None
    max_random_scale: float = None
    min_random_scale: float = None
    pad_size: int = None
    fill_value: int = None
    rgb_mean: tuple = None
    rgb_std: tuple = None
    min_crop_size: int = None
    max_crop_size: int = None

    @property
    def run_name(self):
        """What the logs and the summary line call the run: the network."""
        return self.network

    @property
    def augmentation(self):
        """The training augmentation: train_imagenet.py's ImageNet recipe with the augmentation
        flags given."""
        return augmentation(self, IMAGENET_RECIPE)

    @property
    def network_settings(self):
        """Keyword arguments of :func:`mxfp16.models.new_network` (initializer, pretrained
        weights, GluonCV's ``last_gamma`` and ``use_se``)."""
        return network_settings(self)

    @property
    def synthetic(self):
        """Whether the run trains on synthetic data (``--benchmark 1`` or no data flag)."""
        return bool(self.benchmark) or not (self.data_train or self.data_dir)

    def checked(self):
        """This configuration with canonical names, or ``ValueError`` naming the flag to fix."""
        self = resolve_commands(self, fine_tuning=isinstance(self, FineTuneConfig))
        _check_numbers(self)
        self = dataclasses.replace(self, notes=tuple(self.notes) + _rehearsal_notes(self))
        _check_data_flags(self)
        _check_run_flags(self)
        if (self.save_steps or self.save_minutes) and not self.model_prefix:
            flag = f"--save-steps {self.save_steps}" if self.save_steps else \
                f"--save-minutes {self.save_minutes:g}"
            raise ValueError(f"{flag} saves mid-epoch checkpoints, which need --model-prefix: add "
                             "--model-prefix PREFIX (e.g. runs/r50)")
        _check_choice("--api", self.api, API_CHOICES)
        _check_choice("--lr-mode", self.lr_mode, LR_MODES)
        _check_choice("--kv-store", self.kv_store, KVSTORE_TYPES)
        devices = _check_devices(self)
        dtype = _flag_check("--dtype", check_dtype, self.dtype)
        optimizer = _flag_check("--optimizer", check_optimizer, self.optimizer)
        return dataclasses.replace(self, dtype=dtype, optimizer=optimizer, **devices,
                                   keep_float32=_keep_selectors(self.keep_float32))

    def to_dict(self):
        """The settings as JSON-ready plain values (checkpoints store them)."""
        return {key: list(value) if isinstance(value, tuple) else value
                for key, value in dataclasses.asdict(self).items()}


@dataclass(frozen=True)
class FineTuneConfig(TrainConfig):
    """The settings of ``scripts/fine_tune.py``: a :class:`TrainConfig` plus the pretrained network.

    ``pretrained_model`` + ``load_epoch`` name an MXNet checkpoint (Module or Gluon export), or
    ``pretrained_model`` alone a model of MXNet's model zoo (``imagenet1k-resnet-50``); without them
    ``network``'s pretrained weights come from ``model_root``.  MXNet's fine-tuning defaults: lr
    0.01, no weight decay, light augmentation (:data:`FINE_TUNE_RECIPE`).
    """

    dtype: str = "float16"
    num_epochs: int = 10
    lr: float = 0.01
    wd: float = 0.0
    lr_step_epochs: tuple = (6, 9)
    pretrained_model: str = None
    layer_before_fullc: str = None
    freeze_backbone: bool = False
    lr_mult: float = 1.0

    @property
    def run_name(self):
        """The pretrained checkpoint when one is given, else the network."""
        return self.pretrained_model or self.network

    @property
    def augmentation(self):
        """MXNet's light fine-tuning augmentation with the augmentation flags given."""
        recipe = dataclasses.replace(FINE_TUNE_RECIPE,
                                     resize=resize_size(self.image_shape, self.crop_ratio))
        return augmentation(self, recipe)

    def checked(self):
        if self.load_epoch is not None and self.pretrained_model is None:
            raise ValueError("--load-epoch is the epoch of --pretrained-model: pass "
                             "--pretrained-model PREFIX too, or neither to use --network's "
                             "pretrained weights")
        if self.pretrained_model is not None and self.load_epoch is None and \
                self.pretrained_model not in MXNET_ZOO_MODELS:
            raise ValueError(f"--pretrained-model {self.pretrained_model} needs --load-epoch (the "
                             "epoch of PREFIX-NNNN.params), unless it is a name of MXNet's model "
                             f"zoo ({', '.join(MXNET_ZOO_MODELS)})")
        if not self.lr_mult >= 0:
            raise ValueError(f"--lr-mult must be >= 0, got {self.lr_mult!r}: for example 0.1 trains "
                             "the pretrained layers ten times slower than the new classifier")
        return super().checked()


@dataclass(frozen=True)
class Cifar10Config(TrainConfig):
    """The settings of ``scripts/train_cifar10.py``: MXNet example's train_cifar10.py defaults
    (ResNet-110 on 28x28 crops of CIFAR-10 padded by 4, augmentation level 2, lr 0.05)."""

    network: str = "resnet"
    num_layers: int = 110
    num_classes: int = 10
    num_examples: int = 50000
    image_shape: tuple = (3, 28, 28)
    data_train: str = os.path.join("data", "cifar10_train.rec")
    data_val: str = os.path.join("data", "cifar10_val.rec")
    num_epochs: int = 300
    lr: float = 0.05
    lr_step_epochs: tuple = (200, 250)

    @property
    def augmentation(self):
        """MXNet's CIFAR augmentation (:data:`CIFAR_RECIPE`) with the augmentation flags given."""
        return augmentation(self, CIFAR_RECIPE)


def contexts(gpus="", cpus=None):
    """The devices of a run: the GPUs of ``--gpus``, else ``cpus`` CPU contexts (``--cpus``).

    ``cpus=N`` gives ``cpu(0)`` ... ``cpu(N-1)``: data parallel as over N GPUs, the same code path
    (batch split, gradients per device, their aggregation), on the machine's shared cores.

    Raises
    ------
    ValueError
        For a malformed ``--gpus``, or ``--gpus`` with ``--cpus``.

    Examples
    --------
    >>> contexts(''), contexts('0,1'), contexts(cpus=2)
    ([cpu(0)], [gpu(0), gpu(1)], [cpu(0), cpu(1)])
    """
    ids = gpu_ids(gpus)
    if ids and cpus is not None:
        raise ValueError(f"--cpus {cpus} and --gpus {gpus} both choose the devices: pass --gpus "
                         f"to train on GPUs, or --cpus to rehearse {cpus} devices on the CPU, "
                         "not both")
    if ids:
        return [mx.gpu(i) for i in ids]
    return [mx.cpu(i) for i in range(cpus or 1)]


def gpu_ids(gpus):
    """The GPU ids of a ``--gpus`` value: ``'0,1'`` -> ``[0, 1]``, ``''`` -> ``[]``."""
    text = str(gpus or "").strip()
    if not text:
        return []
    try:
        ids = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"--gpus {gpus!r} is not a comma-separated list of GPU ids: pass e.g. "
                         "--gpus 0,1, or leave it empty for the CPU") from None
    if any(i < 0 for i in ids) or len(set(ids)) != len(ids):
        raise ValueError(f"--gpus {gpus!r} must list distinct GPU ids >= 0, e.g. --gpus 0,1")
    return ids


def gpu_count():
    """The GPUs MXNet sees (``mx.context.num_gpus()``: 0 with MXNet's CPU build)."""
    return mx.context.num_gpus()


def cuda_built():
    """Whether this MXNet is built with CUDA (``mx.runtime.Features().is_enabled('CUDA')``)."""
    return mx.runtime.Features().is_enabled("CUDA")


def _check_gpus_found(flag, ids):
    """``ValueError`` unless MXNet sees GPUs ``ids``, naming what it found and the fixes."""
    found = gpu_count()
    if max(ids) < found:
        return
    cuda = cuda_built()
    build = "built with CUDA" if cuda else "a CPU build (built without CUDA)"
    get_gpus = "make the GPUs visible (nvidia-smi, CUDA_VISIBLE_DEVICES; python -m mxfp16.doctor)" \
        if cuda else 'install MXNet\'s CUDA build (pip install -e ".[cu112]")'
    on_cpu, rehearse = ("--num-gpus 0", f"--num-gpus 0 --cpus {len(ids)}") \
        if flag.startswith("--num-gpus") else ("no --gpus", f"--cpus {len(ids)} instead")
    rehearsal = f", or {rehearse} to rehearse {len(ids)} devices on the CPU" if len(ids) > 1 else ""
    raise ValueError(f"{flag} needs GPU {max(ids)} but MXNet finds {found} GPU(s) "
                     f"(mx.context.num_gpus() = {found}; MXNet {mx.__version__} is {build}): "
                     f"{get_gpus}, or pass {on_cpu} to train on the CPU with float16 "
                     f"emulated{rehearsal}")


def _check_devices(config):
    """The device fields of a checked config (GluonCV's ``--num-gpus`` as ``gpus`` and a total
    ``batch_size``), or ``ValueError`` for devices that clash, are not found or split the batch."""
    gpus, batch_size, flag = str(config.gpus or "").strip(), config.batch_size, f"--gpus {config.gpus}"
    if config.cpus is not None and not config.cpus >= 1:
        raise ValueError(f"--cpus must be >= 1, got {config.cpus}: e.g. --cpus 2 rehearses 2 devices")
    if config.num_gpus is not None:
        if gpus:
            raise ValueError(f"--gpus {gpus} and --num-gpus {config.num_gpus} both choose the GPUs "
                             "(MXNet's and GluonCV's flag): pass one; --batch-size is the total "
                             "batch with --gpus, the batch per device with --num-gpus")
        if config.num_gpus < 0:
            raise ValueError(f"--num-gpus must be >= 0 (0: the CPU), got {config.num_gpus}")
        if config.num_gpus and config.cpus is not None:
            raise ValueError(f"--cpus {config.cpus} and --num-gpus {config.num_gpus} both choose "
                             f"the devices: pass --num-gpus {config.num_gpus} to train on GPUs, or "
                             f"--num-gpus 0 --cpus {config.cpus} to rehearse {config.cpus} devices "
                             "on the CPU (--batch-size per device either way)")
        gpus, flag = ",".join(map(str, range(config.num_gpus))), f"--num-gpus {config.num_gpus}"
        batch_size *= max(config.num_gpus, config.cpus or 1)
    num_devices = len(contexts(gpus, config.cpus))
    if batch_size % num_devices:
        raise ValueError(f"--batch-size {batch_size} does not split evenly over the {num_devices} "
                         f"devices of {flag if gpus else f'--cpus {config.cpus}'}: pass a "
                         f"multiple of {num_devices}")
    if gpus:
        _check_gpus_found(flag, gpu_ids(gpus))
    return dict(gpus=gpus, num_gpus=None, batch_size=batch_size)


def device_line(config):
    """The first log line of a run: its devices, and its batch per step and per device.

    Examples
    --------
    >>> device_line(TrainConfig(cpus=2, batch_size=8).checked())
    'devices: cpu(0), cpu(1) (--cpus 2: a rehearsal of 2 GPUs on the CPU); batch 8 per step, 4 per device'
    """
    ctx = contexts(config.gpus, config.cpus)
    rehearsal = f" (--cpus {len(ctx)}: a rehearsal of {len(ctx)} GPUs on the CPU)" \
        if len(ctx) > 1 and ctx[0].device_type == "cpu" else ""
    worker = " on each worker" if "dist" in config.kv_store or config.kv_store == "horovod" else ""
    return (f"devices: {', '.join(map(str, ctx))}{rehearsal}; batch {config.batch_size} per step"
            f"{worker}, {config.batch_size // len(ctx)} per device")


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
_NON_NEGATIVE = ("warmup_epochs", "max_batches", "wd", "label_smoothing", "save_steps",
                 "save_minutes")


def _check_numbers(config):
    for name in _POSITIVE_INTS:
        if getattr(config, name) is not None and getattr(config, name) < 1:
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
    if config.warmup_epochs >= config.num_epochs and config.warmup_epochs and not config.max_batches:
        raise ValueError(f"--warmup-epochs {config.warmup_epochs} leaves no epoch after the warm-up "
                         f"of --num-epochs {config.num_epochs}: lower it (a rehearsal shortened "
                         "with --max-batches N keeps it)")


def _rehearsal_notes(config):
    """What a run shortened with ``--max-batches`` does differently from the full command."""
    if config.warmup_epochs >= config.num_epochs and config.warmup_epochs and config.max_batches:
        return (f"--warmup-epochs {config.warmup_epochs} with --num-epochs {config.num_epochs} "
                f"(--max-batches {config.max_batches}: a rehearsal): the run ends inside the "
                f"warm-up, its learning rate rising as in the full run's first {config.num_epochs} "
                f"epoch(s), below --lr {config.lr:g}",)
    return ()


def _check_run_flags(config):
    """Non-finite numbers, a checkpoint prefix that names a folder only, pickled state files not
    allowed: one line each, before anything runs."""
    for flag in ("rgb_mean", "rgb_std"):
        values = getattr(config, flag, None)
        if values is not None and (not all(math.isfinite(v) for v in values)
                                   or (flag == "rgb_std" and min(values) <= 0)):
            raise ValueError(f"--{flag.replace('_', '-')} {','.join(f'{v:g}' for v in values)} "
                             f"must be {'finite' if flag == 'rgb_mean' else 'finite and > 0'} for "
                             f"each of R,G,B: for example "
                             f"{'123.68,116.28,103.53' if flag == 'rgb_mean' else '58.4,57.12,57.38'}")
    for flag in ("lr", "wd", "mom", "lr_factor", "label_smoothing", "mixup_alpha", "warmup_lr",
                 "save_minutes", "crop_ratio", "lr_mult"):
        value = getattr(config, flag, None)
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"--{flag.replace('_', '-')} {value} is not a finite number: pass a "
                             "finite value (see --help for its default)")
    if config.model_prefix and config.model_prefix.endswith(("/", os.sep)):
        raise ValueError(f"--model-prefix {config.model_prefix} names a folder only: the files "
                         f"would be called {config.model_prefix}-0001.params; add a name, e.g. "
                         f"--model-prefix {os.path.join(config.model_prefix, config.network)}")
    if config.resume_states and not config.allow_pickle and os.path.isfile(config.resume_states) \
            and is_pickle_file(config.resume_states):
        raise ValueError(f"--resume-states {config.resume_states}: {PICKLE_RISK}; pass "
                         "--allow-pickle if you trust this file")


def _keep_selectors(value):  # --keep-float32 as a tuple (from 'a,b' too), no selector empty
    selectors = tuple(value.split(",") if isinstance(value, str) else value)
    if not all(isinstance(s, str) and s.strip() for s in selectors):
        raise ValueError(f"--keep-float32 {','.join(map(str, selectors))!r} has an empty selector: "
                         "give block paths or names separated by commas, e.g. features.3,output")
    return tuple(s.strip() for s in selectors)


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
