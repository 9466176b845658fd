"""Commands of MXNet's example/image-classification and GluonCV's train_imagenet.py, resolved.

A user's command runs with the meaning it had in the tool it came from: the example's
``--network resnet-v1 --num-layers 50`` is the zoo's ``resnet50_v1``, GluonCV's ``--input-size``
is ``--image-shape``, ``--lr-decay-period`` the step epochs, ``--save-dir`` the checkpoint prefix,
``--amp`` float16 with dynamic loss scaling, ``--load-epoch`` with ``--model-prefix`` a resume.
:func:`resolve_commands` turns those flags into the config's own settings once, when the config is
checked, and records a note for the log of each translation.
"""
import contextlib
import dataclasses
import logging
import os

import mxnet as mx

from ...models import resolve_network_name
from ..data.augmentation import AUGMENTATION_FLAGS, IMAGENET_RECIPE, with_overrides
from ..state.resume import AUTO, auto_resume
from .gluoncv_states import read_states
from .nvidia_compat import resolve_nvidia_flags
from ..schedule import POLY_POWER

log = logging.getLogger("mxfp16.train")

#: ``--mode`` values: GluonCV's (``symbolic`` trains as ``hybrid``, as GluonCV's script does).
MODES = ("hybrid", "imperative", "symbolic")

#: ``--initializer`` of MXNet's example: name -> initializer.  ``default`` is mxfp16's (and
#: GluonCV's) He initialization, which the example's default Xavier(gaussian, in, 2) equals.
INITIALIZERS = {"default": mx.init.MSRAPrelu, "msra": mx.init.MSRAPrelu, "xavier": mx.init.Xavier,
                "orthogonal": mx.init.Orthogonal, "normal": mx.init.Normal,
                "uniform": mx.init.Uniform, "one": mx.init.One, "zero": mx.init.Zero}

#: ``--loss`` of MXNet's example: losses it logs as metrics.  The loss a run trains with is the
#: softmax cross-entropy either way, and it is logged every --disp-batches batches.
LOGGED_LOSSES = ("ce", "nll_loss")

#: GluonCV's RecordIO files when ``--use-rec`` comes without them.
GLUONCV_REC_DIR = os.path.join("~", ".mxnet", "datasets", "imagenet", "rec")


def resolve_network(config):
    """``(zoo name, note)`` of ``--network`` / ``--model`` with ``--num-layers`` and
    ``--batch-norm`` (:func:`mxfp16.models.resolve_network_name`)."""
    try:
        zoo_name = resolve_network_name(config.network, config.num_layers,
                                        image_side=min(config.image_shape[1:]),
                                        batch_norm=config.batch_norm)
    except ValueError as error:
        if getattr(config, "pretrained_model", None):  # fine_tune.py: the checkpoint's network
            return config.network, None
        message = str(error)
        raise ValueError(message if message.startswith("--network") else
                         f"--network: {message}") from None
    if zoo_name == config.network:
        return zoo_name, None
    given = f"--network {config.network}" + \
        (f" --num-layers {config.num_layers}" if config.num_layers is not None else "") + \
        (" --batch-norm" if config.batch_norm else "")
    return zoo_name, f"{given} is the model zoo's {zoo_name}"


def _image_shape(config, default_shape):
    if config.input_size is None:
        return config.image_shape
    shape = (3, config.input_size, config.input_size)
    if tuple(config.image_shape) not in (tuple(default_shape), shape):
        raise ValueError(f"--input-size {config.input_size} and --image-shape "
                         f"{','.join(map(str, config.image_shape))} disagree: pass one of them")
    return shape


def _data_files(config):
    """The data flags with GluonCV's ``--use-rec`` and its default files applied."""
    if not config.use_rec:
        return {}
    train = config.data_train or os.path.join(GLUONCV_REC_DIR, "train.rec")
    files = dict(data_train=os.path.expanduser(train), data_dir=None)
    if config.data_train_idx or not config.data_train:
        files["data_train_idx"] = os.path.expanduser(
            config.data_train_idx or os.path.join(GLUONCV_REC_DIR, "train.idx"))
    if config.data_val or not config.data_train:
        files["data_val"] = os.path.expanduser(
            config.data_val or os.path.join(GLUONCV_REC_DIR, "val.rec"))
        files["data_val_idx"] = os.path.expanduser(
            config.data_val_idx or os.path.join(GLUONCV_REC_DIR, "val.idx"))
    return files


def _poly_steps(config):
    """MXNet example's ``--lr-step-epochs powN``: its PolyScheduler, ``lr * (1 - t/T) ** N``."""
    if not isinstance(config.lr_step_epochs, str):
        return {}, None
    power = config.lr_step_epochs[len("pow"):].strip(" -")
    if power not in (str(POLY_POWER), f"{POLY_POWER:.1f}"):
        raise ValueError(f"--lr-step-epochs {config.lr_step_epochs}: mxfp16's poly schedule has "
                         f"power {POLY_POWER}: pass --lr-step-epochs pow{POLY_POWER} (or --lr-mode "
                         "poly), or epochs such as 30,60")
    return dict(lr_mode="poly", lr_step_epochs=()), \
        f"--lr-step-epochs {config.lr_step_epochs}: the poly schedule lr * (1 - t/T)^{POLY_POWER} " \
        "over the whole run (MXNet's PolyScheduler; --lr-mode poly)"


def _precision(config):
    """``--amp`` (GluonCV's AMP): float16 with dynamic loss scaling."""
    if not config.amp:
        return {}, None
    if config.dtype not in ("float32", "float16", "fp16"):
        raise ValueError(f"--amp trains in float16 with dynamic loss scaling and --dtype "
                         f"{config.dtype} asks for another dtype: pass one of them")
    return dict(dtype="float16", loss_scale=config.loss_scale or "dynamic"), \
        "--amp: float16 with dynamic loss scaling (float32 master weights)"


def _checkpoints(config, network, fine_tuning):
    """``model_prefix`` and ``resume`` from GluonCV's ``--save-dir`` / ``--resume-params`` and
    MXNet's ``--load-epoch`` with ``--model-prefix``."""
    settings, notes = {}, []
    prefix = config.model_prefix
    if config.save_dir and not prefix:
        prefix = settings["model_prefix"] = os.path.join(config.save_dir, f"imagenet-{network}")
        notes.append(f"--save-dir {config.save_dir}: checkpoints {prefix}-NNNN.*")
    if config.resume_states and not config.resume_params:
        raise ValueError(f"--resume-states {config.resume_states} is the optimizer state of "
                         "--resume-params: pass the parameter file saved with it too")
    if config.resume == AUTO:
        _check_auto_alone(config, fine_tuning)
        settings["resume"], note = auto_resume(prefix)
        notes.append(note)
    if config.resume_params:
        stem = config.resume_params[:-len(".params")] \
            if config.resume_params.endswith(".params") else config.resume_params
        if os.path.isfile(stem + ".json"):
            _check_resume_files(config, stem)
            settings["resume"] = stem
        else:
            notes.append(_gluoncv_resume_note(config))
            settings.update(_gluoncv_optimizer(config, notes))
    elif config.load_epoch is not None and not fine_tuning and not config.resume:
        if not prefix:
            raise ValueError(f"--load-epoch {config.load_epoch} loads the checkpoint of "
                             "--model-prefix at that epoch: pass --model-prefix too")
        stem = f"{prefix}-{config.load_epoch:04d}"
        if os.path.isfile(stem + ".json") or not os.path.isfile(stem + ".params"):
            settings["resume"] = stem
            notes.append(f"--model-prefix {prefix} --load-epoch {config.load_epoch}: resuming "
                         f"{stem}")
        else:  # a checkpoint of MXNet's example: its weights, from epoch --load-epoch on
            if config.load_epoch >= config.num_epochs:
                raise ValueError(f"--load-epoch {config.load_epoch} leaves no epoch of "
                                 f"--num-epochs {config.num_epochs}: raise --num-epochs")
            settings["resume_epoch"] = config.load_epoch
            notes.append(f"--model-prefix {prefix} --load-epoch {config.load_epoch}: the weights "
                         f"of MXNet's checkpoint {stem}, training continues at epoch "
                         f"{config.load_epoch} with a fresh optimizer state (as MXNet's fit does)")
    return settings, notes


def _check_auto_alone(config, fine_tuning):
    """``--resume auto`` picks the checkpoint itself: another flag that names one is a conflict."""
    named = [f"--resume-params {config.resume_params}"] if config.resume_params else []
    if config.load_epoch is not None and not fine_tuning:
        named.append(f"--load-epoch {config.load_epoch}")
    if named:
        raise ValueError(f"--resume auto and {named[0]} both choose the checkpoint to start from: "
                         "pass one of them")


def mxnet_checkpoint_start(config):
    """``(prefix, epoch)`` of the MXNet example's checkpoint a train_imagenet.py run starts from
    (``--model-prefix`` + ``--load-epoch``, no checkpoint of mxfp16 there), else None."""
    if config.load_epoch is None or config.resume or not config.model_prefix or \
            hasattr(config, "pretrained_model"):
        return None
    return config.model_prefix, config.load_epoch


def _gluoncv_resume_note(config):
    """GluonCV's own files: its weights and optimizer state, the run continues at
    ``--resume-epoch``."""
    for flag, path in (("--resume-params", config.resume_params),
                       ("--resume-states", config.resume_states)):
        if path and not os.path.isfile(path):
            raise ValueError(f"{flag} {path} not found: pass a checkpoint PREFIX-NNNN.params of "
                             "mxfp16 or the files GluonCV saved (net.save_parameters, "
                             "trainer.save_states)")
    if config.resume_states and config.api != "gluon":
        raise ValueError(f"--resume-states {config.resume_states} is a gluon.Trainer state: "
                         "resume it with --api gluon (GluonCV's API)")
    states = f"; the optimizer state of {config.resume_states} (momenta; float32 master weights " \
        "in float16)" if config.resume_states else "; the optimizer state starts afresh"
    return (f"--resume-params {config.resume_params}: GluonCV's weights, training continues at "
            f"epoch {config.resume_epoch} (--resume-epoch){states}")


def _gluoncv_optimizer(config, notes):
    """``{'optimizer': ...}`` of GluonCV's ``--resume-states`` file when ``--optimizer`` is left at
    its default (GluonCV's script trains with NAG); a different ``--optimizer`` is an error."""
    saved = read_states(config.resume_states, config.allow_pickle)[1] if config.resume_states else None
    name = type(saved).__name__.lower() if saved is not None else config.optimizer
    if name == config.optimizer.lower():
        return {}
    if config.optimizer != type(config)().optimizer:
        raise ValueError(f"--resume-states {config.resume_states} holds the state of a {name} "
                         f"optimizer and --optimizer is {config.optimizer}: pass --optimizer "
                         f"{name}, or leave --resume-states out to start the optimizer afresh")
    notes.append(f"--resume-states {config.resume_states}: its {name} optimizer continues "
                 f"(GluonCV's script trains with {name}; mxfp16's default is {config.optimizer})")
    return {"optimizer": name}


def _check_resume_files(config, stem):
    """GluonCV's ``--resume-states`` and ``--resume-epoch`` must be those of the checkpoint
    ``stem`` (``PREFIX-NNNN``, saved after NNNN epochs)."""
    if config.resume_states and config.resume_states != stem + ".states":
        raise ValueError(f"--resume-states {config.resume_states} is not the optimizer state of "
                         f"--resume-params {config.resume_params}: pass {stem}.states, or leave "
                         "it out (the checkpoint brings its own)")
    epochs_done = stem.rsplit("-", 1)[-1]
    if config.resume_epoch and epochs_done.isdigit() and config.resume_epoch != int(epochs_done):
        raise ValueError(f"--resume-epoch {config.resume_epoch} does not follow --resume-params "
                         f"{config.resume_params}, saved after {int(epochs_done)} epochs: pass "
                         f"--resume-epoch {int(epochs_done)} or leave it out")


def _check_compat_flags(config):
    if config.gc_type == "fp16" and config.kv_store != "horovod":
        raise ValueError("--gc-type fp16 is Horovod's float16 compression of float32 gradients: "
                         "pass --kv-store horovod, or leave --gc-type out")
    gc_types = ("none", "fp16") if config.kv_store == "horovod" else ("none",)
    for flag, value, choices in (("--mode", config.mode, MODES),
                                 ("--initializer", config.initializer, tuple(INITIALIZERS)),
                                 ("--gc-type", config.gc_type, gc_types)):
        if value not in choices:
            extra = ": gradient compression is not supported with float16 training" \
                if flag == "--gc-type" else ""
            raise ValueError(f"{flag} {value!r} is not supported{extra}: choose one of "
                             f"{', '.join(choices)}")
    if config.mode == "imperative" and config.api != "gluon":
        raise ValueError("--mode imperative runs the Gluon network without hybridize: it needs "
                         "--api gluon")
    losses = [name for name in str(config.loss or "").split(",") if name]
    if any(name not in LOGGED_LOSSES for name in losses):
        raise ValueError(f"--loss {config.loss!r} is not supported: choose ce or nll_loss")
    if config.kv_store == "nccl" and not mx.runtime.Features().is_enabled("NCCL"):
        raise ValueError("--kv-store nccl needs MXNet built with NCCL, and this MXNet "
                         f"{mx.__version__} is not: pass --kv-store device")
    if config.use_pretrained and config.num_classes != 1000:
        raise ValueError(f"--use-pretrained starts from the zoo's 1000-class ImageNet weights and "
                         f"--num-classes is {config.num_classes}: use scripts/fine_tune.py for "
                         "another number of classes")
    for flag, value in (("--monitor", config.monitor), ("--test-io", config.test_io),
                        ("--lr-decay-period", config.lr_decay_period)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0 (0: off), got {value}")
    if not 0 <= config.resume_epoch < config.num_epochs:
        raise ValueError(f"--resume-epoch {config.resume_epoch} must be in [0, --num-epochs "
                         f"{config.num_epochs})")
    _check_example_fit_flags(config)
    if not 0 < config.crop_ratio <= 1 or config.warmup_lr < 0 or config.mixup_off_epoch < 0:
        raise ValueError(f"need 0 < --crop-ratio <= 1 (e.g. 0.875), --warmup-lr >= 0 and "
                         f"--mixup-off-epoch >= 0, got {config.crop_ratio}, {config.warmup_lr}, "
                         f"{config.mixup_off_epoch}")


def _check_example_fit_flags(config):
    """The flags of the example's fit.py and data.py that mxfp16 cannot honour: one error each."""
    if config.warmup_strategy != "linear":
        raise ValueError(f"--warmup-strategy {config.warmup_strategy!r} is not supported: "
                         "mxfp16's warm-up (--warmup-epochs, from --warmup-lr) is linear; "
                         "pass --warmup-strategy linear or leave it out")
    for flag, value in (("--num-data-workers", config.num_data_workers),
                        ("--macrobatch-size", config.macrobatch_size)):
        if value is not None and value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")
    # MXNet's batch_scale: the macro-batch over the batch of all workers (the launcher's count)
    workers = int(os.environ.get("DMLC_NUM_WORKER", "1")) if "dist" in config.kv_store else \
        int(os.environ.get("HOROVOD_SIZE", "1")) if config.kv_store == "horovod" else 1
    if config.optimizer == "lbsgd" and config.macrobatch_size > config.batch_size * workers:
        raise ValueError(f"--macrobatch-size {config.macrobatch_size} asks lbsgd to accumulate "
                         f"gradients over several batches of {config.batch_size * workers} "
                         f"({workers} worker(s)), which mxfp16 does not do: pass --batch-size "
                         f"{-(-config.macrobatch_size // workers)} or more workers")
    if config.profile_server_suffix:
        raise ValueError(f"--profile-server-suffix {config.profile_server_suffix}: mxfp16 does "
                         "not profile the kvstore servers; pass --profile-worker-suffix FILE to "
                         "profile the training on the workers")
    suffix = config.profile_worker_suffix
    if suffix and os.path.lexists(suffix) and not os.path.isfile(suffix):
        raise ValueError(f"--profile-worker-suffix {suffix}: MXNet's profiler deletes the file "
                         "it is given and writes a new one, so it must be a file path (it is a "
                         f"{'directory' if os.path.isdir(suffix) else 'device or special file'}); "
                         "pass a file name such as profile.json")


def _example_fit_notes(config):
    notes = []
    if config.macrobatch_size and config.optimizer != "lbsgd":
        notes.append(f"--macrobatch-size {config.macrobatch_size}: read by MXNet's lbsgd only; "
                     f"--optimizer {config.optimizer} ignores it, as in MXNet")
    if config.use_imagenet_data_augmentation:
        notes.append("--use-imagenet-data-augmentation 1: the ImageNet recipe (random resized "
                     "crop, mirror, colour jitter), train_imagenet.py's default already")
    if config.use_python_iter:
        notes.append("--use-python-iter 1: the .rec files are read by ImageRecordIter (the same "
                     "images and augmentation, decoded in C++)")
    if config.use_gpu_augmenter:
        notes.append("--use-gpu-augmenter 1: the augmentation runs on the CPU")
    if config.profile_worker_suffix:
        notes.append(f"--profile-worker-suffix {config.profile_worker_suffix}: MXNet profiler's "
                     "trace of the training (chrome://tracing)")
    if config.num_data_workers is not None:
        notes.append(f"-j {config.num_data_workers}: {config.data_nthreads} decoding threads "
                     f"for .rec files, {config.num_data_workers} worker processes for an image "
                     "folder")
    return notes


def _notes(config):
    notes = []
    if config.gc_type == "fp16":
        notes.append("--gc-type fp16: float32 gradients are sent and summed as float16 by Horovod"
                     + (" (float16 gradients already are)" if config.dtype == "float16" else ""))
    if config.monitor:
        notes.append(f"--monitor {config.monitor}: every {config.monitor} batches, the root mean "
                     "square of every parameter (MXNet Monitor's statistic)")
    if config.loss:
        notes.append(f"--loss {config.loss}: the softmax cross-entropy loss is logged every "
                     "--disp-batches batches")
    if config.use_se and not config.network.startswith("resnext"):
        notes.append(f"--use-se applies to resnext networks (GluonCV's rule): {config.network} "
                     "is built without it")
    if config.num_training_samples is not None and not config.synthetic:
        notes.append(f"--num-training-samples {config.num_training_samples}: the lr schedule's "
                     f"epoch is {config.num_training_samples} // --batch-size batches "
                     "(GluonCV's num_batches); each epoch trains on all the data's images")
    return notes + _example_fit_notes(config)


def resolve_commands(config, fine_tuning=False):
    """``config`` with the flags of MXNet's example and GluonCV turned into its own settings.

    Parameters
    ----------
    config : mxfp16.train.cli.config.TrainConfig
    fine_tuning : bool
        ``--load-epoch`` belongs to ``--pretrained-model`` (fine_tune.py), not to a resume.

    Returns
    -------
    TrainConfig
        With ``notes``: one line for the log per translated flag.

    Raises
    ------
    ValueError
        Naming the flag and the fix.
    """
    _check_compat_flags(config)
    config, nvidia_notes = resolve_nvidia_flags(config)
    default_shape = type(config)().image_shape
    config = dataclasses.replace(config, image_shape=_image_shape(config, default_shape))
    network, note = resolve_network(config)
    notes = nvidia_notes + ([note] if note else [])
    settings = dict(network=network, **_data_files(config))
    schedule, note = _poly_steps(config)
    settings.update(schedule)
    notes += [note] if note else []
    if config.lr_decay_period > 0:
        settings["lr_step_epochs"] = tuple(range(config.lr_decay_period, config.num_epochs,
                                                 config.lr_decay_period))
    if config.num_training_samples is not None:
        settings["num_examples"] = config.num_training_samples
    if config.num_data_workers is not None:  # GluonCV's -j: threads for .rec files too
        settings["data_nthreads"] = max(config.num_data_workers, 1)
    if config.top_k == 0:  # MXNet example's default: no top-k accuracy
        settings["top_k"] = 1
        notes.append("--top-k 0 (MXNet's example: no top-k report): top-1 only")
    precision, note = _precision(config)
    settings.update(precision)
    notes += [note] if note else []
    files, file_notes = _checkpoints(config, network, fine_tuning)
    settings.update(files)
    resolved = dataclasses.replace(config, **settings)
    _checked = resolved.augmentation  # raises for an augmentation flag out of range
    return dataclasses.replace(resolved, notes=tuple(notes + file_notes + _notes(resolved)))


def augmentation(config, recipe=IMAGENET_RECIPE):
    """The run's training augmentation: ``recipe`` with the augmentation flags given."""
    return with_overrides(recipe, **{name: getattr(config, name) for name in AUGMENTATION_FLAGS})


def network_settings(config):
    """Keyword arguments of :func:`mxfp16.models.new_network` for ``config`` (GluonCV's rules:
    ``last_gamma`` for every network, ``use_se`` for resnext ones)."""
    settings = dict(initializer=INITIALIZERS[config.initializer](),
                    pretrained=config.use_pretrained, root=config.model_root)
    if config.last_gamma:
        settings["last_gamma"] = True
    if config.use_se and config.network.startswith("resnext"):
        settings["use_se"] = True
    return settings


@contextlib.contextmanager
def worker_profile(suffix, rank, num_workers):
    """MXNet example's ``--profile-worker-suffix FILE``: MXNet's profiler records the training into
    ``FILE`` (``rank{rank}_FILE`` with several workers); no file without ``suffix``."""
    if not suffix:
        yield
        return
    filename = suffix if num_workers == 1 else f"rank{rank}_{suffix}"
    mx.profiler.set_config(filename=filename, profile_all=True, profile_process="worker")
    mx.profiler.set_state("run")
    try:
        yield
    finally:
        mx.profiler.set_state("stop")
        mx.profiler.dump()
        log.info("profile of the training written to %s", filename)
