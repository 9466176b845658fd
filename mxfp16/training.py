"""Training a classifier: data, the Gluon loop (``train_one_epoch``, ``evaluate``, ``fit_gluon``) and
``train``, which runs a whole :class:`mxfp16.config.TrainConfig` with either API.

Float16 recipe: the network is cast with :func:`mxfp16.cast_block` (float16 weights, float32
normalization and outputs, data cast to float16 on the device), the Trainer keeps float32 master
weights (:func:`mxfp16.make_trainer`), and a loss scaler drives every step, counting the skipped
ones.  float32 and bfloat16 use a disabled scaler by default: the same loop, no branches.
"""
import dataclasses
import logging
import math
import os
import random
from dataclasses import dataclass

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

from . import data as datasets
from .casting import cast_block
from .checkpoint import CheckpointError, check_fits, load_checkpoint, save_checkpoint
from .config import MOMENTUM_OPTIMIZERS, contexts
from .logs import EpochMeter, MetricsLog, epoch_line
from .loss_scaling import make_loss_scaler
from .models import DATA_INPUT, block_to_network, new_network
from .optimizers import make_trainer
from .schedule import make_lr_scheduler

log = logging.getLogger("mxfp16.train")

#: Parameters left out of weight decay by ``--no-wd`` (biases and BatchNorm's gamma and beta), as
#: in GluonCV's recipe: decaying them only shrinks the scale the normalization restores.
NO_WD_SUFFIXES = ("bias", "gamma", "beta")


# ---------------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------------

@dataclass
class TrainData:
    """The data of a run: iterators (labels checked) and the batches trained per epoch."""

    train: mx.io.DataIter
    val: object
    batches_per_epoch: int
    description: str


def load_data(*, batch_size, image_shape, num_classes, data_train=None, data_train_idx=None,
              data_val=None, data_val_idx=None, data_dir=None, val_fraction=0.2, synthetic=False,
              num_examples=1281167, num_threads=4, num_parts=1, part_index=0, seed=0,
              max_batches=0):
    """The training and validation data chosen by the data flags.

    RecordIO files (``data_train``, ``data_val``) are read by ``ImageRecordIter`` with the ImageNet
    augmentation, sharded over ``num_parts`` workers; an image folder (``data_dir``) by Gluon
    transforms with a seeded split; ``synthetic`` data is one random batch served
    ``num_examples // batch_size`` times, validated on that same batch.  Every label is checked to
    be in ``[0, num_classes)``.

    Returns
    -------
    TrainData

    Raises
    ------
    mxfp16.data.DataError
        For a missing, unreadable or corrupt file, an empty folder or class folder, or (while
        iterating) a label outside ``[0, num_classes)``.

    Examples
    --------
    >>> data = load_data(batch_size=4, image_shape=(3, 8, 8), num_classes=10, synthetic=True,
    ...                  num_examples=12)
    >>> data.batches_per_epoch, len(list(data.train)), data.description
    (3, 3, 'synthetic data')
    """
    if synthetic:
        loaded = _synthetic_data(batch_size, image_shape, num_classes, num_examples, seed + part_index)
    elif data_dir:
        loaded = _folder_data(data_dir, batch_size, image_shape, num_classes, val_fraction, seed,
                              num_parts, part_index)
    else:
        loaded = _record_data(data_train, data_train_idx, data_val, data_val_idx, batch_size,
                              image_shape, num_threads, num_parts, part_index, seed)
    batches = min(loaded.batches_per_epoch, max_batches or loaded.batches_per_epoch)
    val = datasets.check_labels(loaded.val, num_classes) if loaded.val is not None else None
    return TrainData(datasets.check_labels(loaded.train, num_classes), val, batches,
                     loaded.description)


def _synthetic_data(batch_size, image_shape, num_classes, num_examples, seed):
    num_batches = max(num_examples // batch_size, 1)
    train = datasets.synthetic_iter(batch_size, image_shape, num_classes, num_batches, seed=seed)
    val = datasets.synthetic_iter(batch_size, image_shape, num_classes, 1, seed=seed)
    return TrainData(train, val, num_batches, "synthetic data")


def _folder_data(root, batch_size, image_shape, num_classes, val_fraction, seed, num_parts,
                 part_index):
    split = datasets.split_image_folder(root, val_fraction, seed)
    if len(split.classes) > num_classes:
        raise datasets.DataError(f"image folder {root!r} has {len(split.classes)} classes but "
                                 f"--num-classes is {num_classes}: pass --num-classes "
                                 f"{len(split.classes)}")
    train, val, _ = datasets.folder_iters(root, batch_size, image_shape, val_fraction, seed,
                                          num_parts=num_parts, part_index=part_index)
    shard_size = len(split.train[part_index::num_parts])
    return TrainData(train, val, math.ceil(shard_size / batch_size),
                     f"image folder {root} ({len(split.classes)} classes, {len(split.train)} "
                     f"training and {len(split.val)} validation images)")


def _record_data(data_train, data_train_idx, data_val, data_val_idx, batch_size, image_shape,
                 num_threads, num_parts, part_index, seed):
    common = dict(num_threads=num_threads, seed=seed)
    train = datasets.record_iter(data_train, batch_size, image_shape, train=True,
                                 path_idx=data_train_idx, num_parts=num_parts,
                                 part_index=part_index, **common)
    val = datasets.record_iter(data_val, batch_size, image_shape, train=False,
                               path_idx=data_val_idx, **common) if data_val else None
    num_records = datasets.check_record_file(data_train, data_train_idx)
    # Every worker must take the same number of steps: the smallest part, whole batches only.
    step = -(-num_records // num_parts)
    smallest = num_records - (num_parts - 1) * step
    batches = math.ceil(num_records / batch_size) if num_parts == 1 else \
        max(smallest // batch_size, 1)
    return TrainData(train, val, batches, f"RecordIO {data_train} ({num_records} images)")


# ---------------------------------------------------------------------------------------------------
# Steps shared by both APIs
# ---------------------------------------------------------------------------------------------------

def make_targets(labels, num_classes, smoothing=0.0, mixup_lambda=None):
    """Soft targets ``(N, num_classes)`` for label smoothing and mixup (GluonCV's recipe).

    Smoothing puts ``1 - smoothing + smoothing / K`` on the label and ``smoothing / K`` elsewhere;
    mixup blends each row with the row of the reversed batch: ``lam * y + (1 - lam) * y[::-1]``
    (mix the data with :func:`mixup_data` and the same ``lam``).

    Examples
    --------
    >>> import mxnet as mx
    >>> make_targets(mx.nd.array([0, 2]), 3, smoothing=0.3).asnumpy().astype(float).round(2).tolist()
    [[0.8, 0.1, 0.1], [0.1, 0.1, 0.8]]
    >>> make_targets(mx.nd.array([0, 2]), 3, mixup_lambda=0.75).asnumpy().tolist()
    [[0.75, 0.0, 0.25], [0.25, 0.0, 0.75]]
    """
    off = smoothing / num_classes
    targets = labels.one_hot(num_classes, on_value=1.0 - smoothing + off, off_value=off)
    if mixup_lambda is None:
        return targets
    return mixup_lambda * targets + (1.0 - mixup_lambda) * targets.flip(axis=0)


def mixup_data(data, mixup_lambda):
    """Blend each image with the image at the mirrored position of the batch."""
    return mixup_lambda * data + (1.0 - mixup_lambda) * data.flip(axis=0)


def accuracy_metrics(top_k, num_classes):
    """``[Accuracy, TopKAccuracy]`` with ``k = min(top_k, num_classes)`` (top-1 twice when k is 1).

    Examples
    --------
    >>> [metric.name for metric in accuracy_metrics(5, num_classes=4)]
    ['accuracy', 'top_k_accuracy_4']
    """
    k = min(top_k, num_classes)
    return [mx.metric.Accuracy(), mx.metric.TopKAccuracy(k) if k > 1 else mx.metric.Accuracy()]


def update_accuracy(metrics, label, outputs, pad=0):
    """Update ``metrics`` with a batch, leaving out its last ``pad`` samples (repeats).

    Parameters
    ----------
    metrics : list of mx.metric.EvalMetric
    label : NDArray
        ``(N,)`` class labels.
    outputs : list of NDArray
        Scores (logits or probabilities) of the batch, split over devices in order.
    pad : int
        Trailing samples to leave out.

    Examples
    --------
    >>> import mxnet as mx
    >>> metrics = accuracy_metrics(1, 2)
    >>> update_accuracy(metrics, mx.nd.array([0, 1, 1]), [mx.nd.array([[1, 0], [0, 1], [1, 0]])],
    ...                 pad=1)
    >>> metrics[0].get()
    ('accuracy', 1.0)
    """
    scores = mx.nd.concat(*[o.as_in_context(mx.cpu()) for o in outputs], dim=0)
    valid = label.shape[0] - (pad or 0)
    for metric in metrics:
        metric.update([label[:valid]], [scores[:valid]])


def next_learning_rate(optimizer):
    """The learning rate the next update of ``optimizer`` will use (its schedule at the next update).

    Examples
    --------
    >>> import mxnet as mx
    >>> opt = mx.optimizer.SGD(learning_rate=0.1, lr_scheduler=make_lr_scheduler(
    ...     0.1, 'step', num_epochs=2, batches_per_epoch=3, step_epochs=[1]), begin_num_update=3)
    >>> next_learning_rate(opt)  # update 4 is the first of epoch 1
    0.010000000000000002
    """
    if optimizer.lr_scheduler is None:
        return optimizer.learning_rate
    return optimizer.lr_scheduler(optimizer.num_update + 1)


def optimizer_params(*, optimizer, lr, mom, wd, lr_mode, lr_step_epochs, lr_factor, warmup_epochs,
                     num_epochs, batches_per_epoch, num_update=0):
    """Keyword arguments of :func:`mxfp16.make_optimizer` for a run, the schedule included.

    ``mom`` is passed only to optimizers that take a momentum; ``num_update`` (updates already
    done, when resuming) becomes ``begin_num_update``, which positions the schedule.

    Examples
    --------
    >>> params = optimizer_params(optimizer='adam', lr=0.01, mom=0.9, wd=1e-4, lr_mode='cosine',
    ...                           lr_step_epochs=(), lr_factor=0.1, warmup_epochs=0, num_epochs=2,
    ...                           batches_per_epoch=10, num_update=10)
    >>> sorted(params), round(params['lr_scheduler'](20), 6)
    (['begin_num_update', 'learning_rate', 'lr_scheduler', 'wd'], 0.0)
    """
    scheduler = make_lr_scheduler(lr, lr_mode, num_epochs, batches_per_epoch, lr_step_epochs,
                                  lr_factor, warmup_epochs)
    params = dict(learning_rate=lr, wd=wd, begin_num_update=num_update, lr_scheduler=scheduler)
    if optimizer in MOMENTUM_OPTIMIZERS:
        params["momentum"] = mom
    return params


def run_epochs(train_epoch, evaluate, status, save, *, begin_epoch, num_epochs, save_period,
               metrics_log, top_k):
    """The epoch loop of both APIs: train, validate, log, checkpoint.

    Parameters
    ----------
    train_epoch : callable
        ``train_epoch(epoch)`` -> dict of training statistics (see ``EpochMeter.close``).
    evaluate : callable
        ``evaluate()`` -> ``(top1, topk)``, None for no validation data.
    status : callable
        ``status()`` -> dict with ``lr``, ``loss_scale``, ``num_skipped``, ``num_update``.
    save : callable or None
        ``save(epochs_done, record)`` writes a checkpoint.
    begin_epoch, num_epochs, save_period : int
    metrics_log : MetricsLog
    top_k : int
        For the log lines.

    Returns
    -------
    dict
        The last epoch's record.  ``metrics_log`` gets a ``start`` record (epoch, lr, loss scale,
        update count at the start) and one ``epoch`` record per epoch.
    """
    record = dict(event="start", epoch=begin_epoch, **status())
    log.info("starting at epoch %d: lr %.5g, loss scale %g, %d updates done", begin_epoch,
             record["lr"], record["loss_scale"], record["num_update"])
    metrics_log.write(record, step=begin_epoch, group="start")
    for epoch in range(begin_epoch, num_epochs):
        stats = train_epoch(epoch)
        top1, topk = evaluate()
        record = dict(event="epoch", epoch=epoch, **stats, top1=top1, topk=topk, **status())
        log.info(epoch_line(record, top_k))
        metrics_log.write(record, step=epoch)
        if save and ((epoch + 1) % save_period == 0 or epoch + 1 == num_epochs):
            save(epoch + 1, record)
    return record


# ---------------------------------------------------------------------------------------------------
# Gluon
# ---------------------------------------------------------------------------------------------------

def gluon_network(network, ctx, dtype, no_wd=False):
    """A hybridized Gluon network for ``network``: ``(block, net)``.

    Parameters
    ----------
    network : mxfp16.models.Network
        Graph and values; ``fixed_param_names`` get ``grad_req='null'``, ``lr_mult`` sets each
        parameter's ``lr_mult``.
    ctx : list of Context
    dtype : {'float32', 'float16', 'bfloat16'}
    no_wd : bool
        ``wd_mult=0`` on biases and BatchNorm's gamma and beta.

    Returns
    -------
    tuple
        ``block``, the ``SymbolBlock`` whose parameters are trained (cast in place to ``dtype``,
        normalization kept float32), and ``net``, the cast network to call.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.models import new_network
    >>> block, net = gluon_network(new_network('mobilenet0.25', 4, (3, 32, 32)), [mx.cpu()],
    ...                            'float16')
    >>> block.collect_params()['mobilenet0_conv0_weight'].dtype.__name__
    'float16'
    >>> net(mx.nd.zeros((2, 3, 32, 32))).dtype.__name__
    'float32'
    """
    block = gluon.SymbolBlock(network.symbol, [mx.sym.var(DATA_INPUT, dtype="float32")])
    params = block.collect_params()
    params.load_dict({**network.arg_params, **network.aux_params}, ctx=ctx)
    for name, param in params.items():
        if name in network.fixed_param_names:
            param.grad_req = "null"
        param.lr_mult = network.lr_mult.get(name, 1.0)
        if no_wd and name.endswith(NO_WD_SUFFIXES):
            param.wd_mult = 0.0
    net = cast_block(block, dtype)
    net.hybridize(static_alloc=True, static_shape=True)
    return block, net


#: Optimizer settings a resumed run takes from the command line, not from the checkpoint's pickled
#: optimizer, so both APIs resume alike (the schedule follows --num-epochs, which may be extended).
COMMAND_LINE_SETTINGS = ("lr", "wd", "momentum", "lr_scheduler")


def load_trainer_states(trainer, states_path):
    """``trainer.load_states``, keeping the settings of :data:`COMMAND_LINE_SETTINGS`.

    The checkpoint restores the optimizer state and the update count (the schedule's position).
    """
    fresh = trainer.optimizer
    trainer.load_states(states_path)
    for name in COMMAND_LINE_SETTINGS:
        if hasattr(fresh, name):
            setattr(trainer.optimizer, name, getattr(fresh, name))


def train_step(net, trainer, scaler, batch, *, ctx, loss_fn, num_classes, batch_size,
               smoothing=0.0, mixup_lambda=None):
    """One Gluon step: forward, scaled backward, ``scaler.step`` (update, or skip on overflow).

    Returns
    -------
    tuple
        ``(labels, outputs, losses, updated)``: lists per device, and whether the update ran.
    """
    data = gluon.utils.split_and_load(batch.data[0], ctx)
    labels = gluon.utils.split_and_load(batch.label[0], ctx)
    targets = labels
    if smoothing or mixup_lambda is not None:
        targets = [make_targets(y, num_classes, smoothing, mixup_lambda) for y in labels]
    if mixup_lambda is not None:
        data = [mixup_data(x, mixup_lambda) for x in data]
    with autograd.record():
        outputs = [net(x) for x in data]
        losses = [loss_fn(out, target) for out, target in zip(outputs, targets)]
        scaled = scaler.scale(losses)
    autograd.backward(scaled)
    updated = scaler.step(trainer, batch_size)
    return labels, outputs, losses, updated


def train_one_epoch(net, trainer, scaler, train_data, *, ctx, num_classes, batch_size, num_batches,
                    epoch=0, smoothing=0.0, mixup_alpha=0.0, disp_batches=20, metrics_log=None,
                    seed=0):
    """Train a Gluon network for one epoch (at most ``num_batches`` batches).

    Parameters
    ----------
    net : gluon.HybridBlock
        The network to call (cast by :func:`gluon_network`).
    trainer : gluon.Trainer
        From :func:`mxfp16.make_trainer` over the network's parameters.
    scaler : mxfp16.LossScaler
        Drives every step; a disabled one for float32 and bfloat16.
    train_data : mx.io.DataIter
        Reset at the start.
    ctx : list of Context
        Devices; each batch is split over them.
    num_classes : int
    batch_size : int
        Samples a step's gradients sum over (all devices and workers).
    num_batches : int
        Batches to train at most.
    epoch : int
        For the logs, and the mixup generator's seed.
    smoothing : float
        Label smoothing.
    mixup_alpha : float
        Mix each batch with ``lam ~ Beta(alpha, alpha)`` (0: no mixup), drawn from a generator
        seeded by ``seed + epoch``, so a resumed run draws the same.
    disp_batches : int
        Log every ``disp_batches`` batches.
    metrics_log : mxfp16.logs.MetricsLog, optional
        Receives per-batch TensorBoard scalars.
    seed : int

    Returns
    -------
    dict
        ``train_loss``, ``train_acc``, ``img_per_sec``, ``skipped_steps``, ``batches``.

    Raises
    ------
    mxfp16.LossScaleCollapse
        When steps keep overflowing at the minimum loss scale.

    Examples
    --------
    >>> import mxnet as mx, mxfp16
    >>> from mxnet.gluon import nn
    >>> from mxfp16.data import synthetic_iter
    >>> from mxfp16.models import block_to_network
    >>> mlp = nn.HybridSequential(prefix='mlp_')
    >>> with mlp.name_scope():
    ...     mlp.add(nn.Flatten(), nn.Dense(4, in_units=48))
    >>> mlp.initialize()
    >>> block, net = gluon_network(block_to_network(mlp), [mx.cpu()], 'float16')
    >>> trainer = mxfp16.make_trainer(block.collect_params(), 'sgd', 'float16', learning_rate=0.1)
    >>> scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 8)
    >>> stats = train_one_epoch(net, trainer, scaler, synthetic_iter(8, (3, 4, 4), 4, 5),
    ...                         ctx=[mx.cpu()], num_classes=4, batch_size=8, num_batches=5)
    >>> stats['batches'], stats['skipped_steps'], trainer.optimizer.num_update
    (5, 0, 5)
    """
    soft = bool(smoothing or mixup_alpha)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=not soft)
    rng = np.random.RandomState(seed + epoch)
    meter = EpochMeter(epoch, num_batches, scaler, disp_batches, metrics_log)
    train_data.reset()
    for _, batch in zip(range(num_batches), train_data):
        mixup_lambda = rng.beta(mixup_alpha, mixup_alpha) if mixup_alpha else None
        labels, outputs, losses, updated = train_step(
            net, trainer, scaler, batch, ctx=ctx, loss_fn=loss_fn, num_classes=num_classes,
            batch_size=batch_size, smoothing=smoothing, mixup_lambda=mixup_lambda)
        meter.update(labels, outputs, losses, updated, next_learning_rate(trainer.optimizer),
                     trainer.optimizer.num_update)
    return meter.close()


def evaluate(net, val_data, *, ctx, top_k, num_classes):
    """Top-1 and top-k accuracy of a Gluon network on ``val_data`` (padding left out).

    Parameters
    ----------
    net : gluon.HybridBlock
    val_data : mx.io.DataIter or None
        Reset at the start; ``batch.pad`` trailing samples of a batch are repeats and not counted.
    ctx : list of Context
    top_k : int
        ``k`` of the second accuracy (at most ``num_classes``).
    num_classes : int

    Returns
    -------
    tuple of float
        ``(top1, topk)``, or ``(None, None)`` when ``val_data`` is None.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> from mxfp16.data import synthetic_iter
    >>> net = nn.Dense(3, in_units=12)
    >>> net.initialize()
    >>> top1, top3 = evaluate(net, synthetic_iter(4, (3, 2, 2), 3, 2), ctx=[mx.cpu()], top_k=5,
    ...                       num_classes=3)
    >>> top3
    1.0
    """
    if val_data is None:
        return None, None
    metrics = accuracy_metrics(top_k, num_classes)
    val_data.reset()
    for batch in val_data:
        outputs = [net(x) for x in gluon.utils.split_and_load(batch.data[0], ctx)]
        update_accuracy(metrics, batch.label[0], outputs, batch.pad)
    return tuple(metric.get()[1] for metric in metrics)


def fit_gluon(network, data, scaler, config, *, ctx, kvstore, num_workers, begin_epoch,
              states_path, num_update, metrics_log, save):
    """Train ``network`` with Gluon from ``begin_epoch`` to ``config.num_epochs``.

    Parameters
    ----------
    network : mxfp16.models.Network
        The float32 network and its starting values.
    data : TrainData
    scaler : mxfp16.LossScaler
    config : mxfp16.config.TrainConfig
        Checked; read for the dtype, the optimizer and schedule, targets and logging settings.
    ctx : list of Context
    kvstore : str or KVStore
    num_workers : int
        Workers of a distributed job (1 otherwise).
    begin_epoch : int
        First epoch to train (a checkpoint's epoch when resuming).
    states_path : str or None
        A checkpoint's Trainer state: optimizer state and update count.
    num_update : int
        Updates done before ``begin_epoch``.
    metrics_log : mxfp16.logs.MetricsLog
    save : callable or None
        ``save(epochs_done, record, network_now, save_states)`` (see :func:`checkpoint_saver`).

    Returns
    -------
    dict
        The last epoch record (see :func:`run_epochs`).
    """
    block, net = gluon_network(network, ctx, config.dtype, config.no_wd)
    params = optimizer_params(**schedule_settings(config), num_update=num_update,
                              batches_per_epoch=data.batches_per_epoch)
    trainer = make_trainer(block.collect_params(), config.optimizer, config.dtype, kvstore=kvstore,
                           **params)
    if states_path:
        load_trainer_states(trainer, states_path)
    step_batch = config.batch_size * num_workers

    def train_epoch(epoch):
        return train_one_epoch(net, trainer, scaler, data.train, ctx=ctx,
                               num_classes=config.num_classes, batch_size=step_batch,
                               num_batches=data.batches_per_epoch, epoch=epoch,
                               smoothing=config.label_smoothing,
                               mixup_alpha=config.mixup_alpha if config.mixup else 0.0,
                               disp_batches=config.disp_batches, metrics_log=metrics_log,
                               seed=config.seed)

    def snapshot(epochs_done, record):
        save(epochs_done, record, block_to_network(block), trainer.save_states)

    return run_epochs(
        train_epoch, lambda: evaluate(net, data.val, ctx=ctx, top_k=config.top_k,
                                      num_classes=config.num_classes),
        lambda: run_status(trainer.optimizer, scaler), snapshot if save else None,
        begin_epoch=begin_epoch, num_epochs=config.num_epochs, save_period=config.save_period,
        metrics_log=metrics_log, top_k=config.top_k)


def schedule_settings(config):
    """The :func:`optimizer_params` arguments a config sets (all but the epoch length)."""
    return dict(optimizer=config.optimizer, lr=config.lr, mom=config.mom, wd=config.wd,
                lr_mode=config.lr_mode, lr_step_epochs=config.lr_step_epochs,
                lr_factor=config.lr_factor, warmup_epochs=config.warmup_epochs,
                num_epochs=config.num_epochs)


def run_status(optimizer, scaler):
    """Learning rate, loss scale, skipped steps and update count, for the epoch records."""
    return {"lr": next_learning_rate(optimizer), "loss_scale": scaler.loss_scale,
            "num_skipped": scaler.num_skipped, "num_update": optimizer.num_update}


# ---------------------------------------------------------------------------------------------------
# A whole run
# ---------------------------------------------------------------------------------------------------

def make_kvstore(kv_store):
    """``(kvstore, rank, num_workers)`` for a ``--kv-store`` name.

    Distributed kvstores are created here (the data is sharded by their rank); for the others the
    name is returned and the Trainer or Module makes one.

    Raises
    ------
    ValueError
        For a distributed kvstore outside a distributed job (no ``DMLC_ROLE``), where MXNet would
        wait for a scheduler forever.

    Examples
    --------
    >>> make_kvstore('device')
    ('device', 0, 1)
    """
    if "dist" in kv_store:
        if "DMLC_ROLE" not in os.environ:
            raise ValueError(f"--kv-store {kv_store} needs the processes of a distributed job: run "
                             "the script through scripts/launch.py (e.g. launch.py -n 2 -s 1 -- "
                             "python scripts/train_imagenet.py ...), or use --kv-store device")
        kvstore = mx.kv.create(kv_store)
        return kvstore, kvstore.rank, kvstore.num_workers
    return kv_store, 0, 1


def resume_checkpoint(spec, network, *, api, dtype, optimizer):
    """Load the checkpoint ``spec`` (``--resume``) and check it fits the network and settings.

    Raises
    ------
    mxfp16.checkpoint.CheckpointError
        If it does not exist, or was trained with another API, dtype, optimizer, network or class
        count.
    """
    checkpoint = load_checkpoint(spec)
    trained = checkpoint.meta.get("config", {})
    for flag, value in (("api", api), ("dtype", dtype), ("optimizer", optimizer)):
        saved = trained.get(flag)
        if saved != value:
            raise CheckpointError(f"checkpoint {checkpoint.name!r} was trained with --{flag} {saved} "
                                  f"and its optimizer state is for that: resume with --{flag} {saved}")
    check_fits({**checkpoint.network.arg_params, **checkpoint.network.aux_params},
               {**network.arg_params, **network.aux_params},
               f"checkpoint {checkpoint.name!r} (--network {trained.get('network')} "
               f"--num-classes {trained.get('num_classes')})",
               "resume with the --network and --num-classes it was trained with")
    return checkpoint


def checkpoint_saver(config, scaler):
    """A function ``save(epochs_done, record, network, save_states)`` that writes a checkpoint under
    ``config.model_prefix`` with :func:`mxfp16.checkpoint.save_checkpoint`: the network, the
    optimizer state, the scaler's state, the update count, the learning rate, the epoch record and
    the configuration."""
    def save(epochs_done, record, network, save_states):
        paths = save_checkpoint(config.model_prefix, epochs_done, network, save_states, scaler,
                                num_update=record["num_update"], lr=record["lr"], metrics=record,
                                config=config.to_dict())
        log.info("saved checkpoint %s", paths.meta[:-len(".json")])
    return save


def _warn_batch_size(batch_size, dtype):
    if dtype == "float16" and batch_size % 8:
        log.warning("--batch-size %d is not a multiple of 8: float16 Tensor Cores run fastest on "
                    "multiples of 8", batch_size)


def _resume(config, network, scaler):
    """Network, scaler and starting point of the run: a checkpoint's when ``config.resume``."""
    if not config.resume:
        return network, dict(begin_epoch=0, states_path=None, num_update=0)
    checkpoint = resume_checkpoint(config.resume, network, api=config.api, dtype=config.dtype,
                                   optimizer=config.optimizer)
    if checkpoint.epoch >= config.num_epochs:
        raise ValueError(f"checkpoint {checkpoint.name!r} has trained {checkpoint.epoch} epochs, "
                         f"all of --num-epochs {config.num_epochs}: raise --num-epochs to continue")
    scaler.load_state_dict(checkpoint.meta.get(scaler.state_dict_key, scaler.state_dict()))
    log.info("resuming from checkpoint %s", checkpoint.name)
    if not config.model_prefix:
        log.warning("no --model-prefix: this run saves no checkpoint (pass --model-prefix %s to "
                    "continue the run's checkpoints)", checkpoint.prefix)
    network = dataclasses.replace(network, arg_params=checkpoint.network.arg_params,
                                  aux_params=checkpoint.network.aux_params)
    return network, dict(begin_epoch=checkpoint.epoch, states_path=checkpoint.states_path,
                         num_update=checkpoint.meta.get("num_update", 0))


def train(config, network=None, metrics_path=None, name=None):
    """Run the training a checked :class:`~mxfp16.config.TrainConfig` describes.

    Parameters
    ----------
    config : TrainConfig
        From ``TrainConfig(...).checked()``.
    network : mxfp16.models.Network, optional
        The float32 network to train (fine-tuning builds one); default: a new ``config.network``.
    metrics_path : str, optional
        ``metrics.jsonl`` to append the records to: a ``start`` record, then one per epoch.
    name : str, optional
        What the logs call the network (default: ``config.network``).

    Returns
    -------
    dict
        The last epoch record: ``epoch``, ``train_loss``, ``train_acc``, ``top1``, ``topk``,
        ``img_per_sec``, ``lr``, ``loss_scale``, ``num_skipped``, ``num_update``, ...

    Raises
    ------
    ValueError
        (``DataError``, ``CheckpointError``) for bad data, flags or checkpoints.
    mxfp16.LossScaleCollapse
        When steps keep overflowing at the minimum loss scale.
    """
    from .module_training import fit_module  # a cycle otherwise: it builds on this module
    ctx = contexts(config.gpus)
    kvstore, rank, num_workers = make_kvstore(config.kv_store)
    for seed in (random.seed, np.random.seed, mx.random.seed):
        seed(config.seed)
    data = load_data(**_data_settings(config), num_parts=num_workers, part_index=rank)
    if network is None:
        network = new_network(config.network, config.num_classes, config.image_shape)
    scaler = make_loss_scaler(config.loss_scale, config.dtype)
    scaler.max_consecutive_skips = config.max_consecutive_skips
    network, start = _resume(config, network, scaler)
    _warn_batch_size(config.batch_size, config.dtype)
    log.info("training %s in %s with the %s API on %s (%d worker(s)): %s, %d batches of %d "
             "per epoch", name or config.network, config.dtype, config.api, ",".join(map(str, ctx)),
             num_workers, data.description, data.batches_per_epoch, config.batch_size)
    save = checkpoint_saver(config, scaler) if config.model_prefix and rank == 0 \
        else None
    fit = fit_gluon if config.api == "gluon" else fit_module
    with MetricsLog(metrics_path if rank == 0 else None,
                    config.tensorboard if rank == 0 else None) as metrics_log:
        return fit(network, data, scaler, config, ctx=ctx, kvstore=kvstore,
                   num_workers=num_workers, metrics_log=metrics_log, save=save, **start)


def _data_settings(config):
    return dict(batch_size=config.batch_size, image_shape=tuple(config.image_shape),
                num_classes=config.num_classes, data_train=config.data_train,
                data_train_idx=config.data_train_idx, data_val=config.data_val,
                data_val_idx=config.data_val_idx, data_dir=config.data_dir,
                val_fraction=config.val_fraction, synthetic=config.synthetic,
                num_examples=config.num_examples, num_threads=config.data_nthreads,
                seed=config.seed, max_batches=config.max_batches)
