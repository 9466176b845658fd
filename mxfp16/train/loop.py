"""The training loop of both APIs: ``train`` runs a whole :class:`~mxfp16.train.cli.config.TrainConfig`.

One loop serves Gluon and Module.  What differs between them — forward, backward and update,
prediction, the state a checkpoint saves — sits behind the small classes
:class:`~mxfp16.train.gluon_api.GluonAPI` and :class:`~mxfp16.train.module_api.ModuleAPI`;
the batches, targets, metrics, logs, evaluation, schedule and checkpoints are this module's.

Float16 recipe: the network is cast (:func:`mxfp16.cast_block` / :func:`mxfp16.cast_symbol`), the
optimizer keeps float32 master weights (:func:`mxfp16.make_optimizer`), and a loss scaler drives
every step, counting the skipped ones.  float32 and bfloat16 use a disabled scaler by default: the
same loop, no branches.  A step waits on the device at most once: for the overflow decision of an
enabled loss scaler; the metrics are read back every ``--disp-batches`` batches.
"""
import logging
import random

import mxnet as mx
import numpy as np

from ..distributed.horovod import is_horovod, rank_devices
from ..distributed.kvstore import make_kvstore
from ..scaling.scalers import make_loss_scaler
from ..models import new_network
from ..checkpoints.preemption import StopRequest
from .state.checkpoint import remove_mid_epoch_checkpoints, save_checkpoint
from .state.resume import StartPoint, resume_run
from .cli.compat import worker_profile
from .cli.config import IMAGENET_TRAIN_IMAGES, contexts
from .data import load_data
from .gluon_api import GluonAPI
from .keep_float32 import network_keep
from .cli.gluoncv_states import load_gluoncv_states
from .logs import EpochMeter, MetricsLog, epoch_line, settle_log_rank
from .metrics import Accuracy, make_targets, mixup_data
from .module_api import ModuleAPI
from .monitor import ParameterMonitor
from .state.prefix import claim_prefix, claims_early, log_removed
from .progress import Checkpointer, SavePolicy, seed_batch, skip_batches, stop_vote
from .schedule import next_learning_rate, optimizer_params, schedule_batches

log = logging.getLogger("mxfp16.train")


def train_one_epoch(api, train_data, *, num_classes, batch_size, num_batches, epoch=0,
                    smoothing=0.0, mixup_alpha=0.0, disp_batches=20, metrics_log=None, seed=0,
                    mixup_until=None, start_batch=0, meter_state=None, checkpointer=None):
    """Train one epoch (at most ``num_batches`` batches) through ``api``.

    Parameters
    ----------
    api : GluonAPI or ModuleAPI
    train_data : mx.io.DataIter
        Reset at the start.
    num_classes : int
    batch_size : int
        Samples per step over all devices and workers (the optimizer divides the gradients by it).
    num_batches : int
    epoch : int
        For the logs, and the mixup generator's seed.
    smoothing : float
        Label smoothing.
    mixup_alpha : float
        Mix each batch with ``lam ~ Beta(alpha, alpha)`` (0: no mixup), drawn from a generator
        seeded by ``seed + epoch``, so a resumed run draws the same.
    disp_batches : int
        Log every ``disp_batches`` batches.
    metrics_log : mxfp16.train.logs.MetricsLog, optional
        Receives per-batch TensorBoard scalars.
    seed : int
    mixup_until : int, optional
        From this epoch on mixup draws ``lam = 1`` (no mixing: GluonCV's ``--mixup-off-epoch``).
    start_batch : int
        Batches of this epoch already trained (a resumed run): they are skipped, and every random
        draw from here on is the uninterrupted run's (:func:`~mxfp16.train.progress.seed_batch`
        before each batch).
    meter_state : dict, optional
        The partial epoch's statistics saved with those batches.
    checkpointer : mxfp16.train.progress.Checkpointer, optional
        Called after every step: mid-epoch checkpoints, and the stop on a signal
        (:class:`~mxfp16.train.progress.TrainingStopped`).

    Returns
    -------
    dict
        ``train_loss``, ``train_acc``, ``img_per_sec``, ``skipped_steps``, ``batches``, and
        ``meter_state`` (the statistics as :meth:`EpochMeter.state` gives them).

    Raises
    ------
    mxfp16.LossScaleCollapse
        When steps keep overflowing at the minimum loss scale.

    Examples
    --------
    >>> import mxnet as mx, mxfp16
    >>> from mxnet.gluon import nn
    >>> from mxfp16.models import block_to_network
    >>> from mxfp16.train.data import synthetic_iter
    >>> mlp = nn.HybridSequential(prefix='mlp_')
    >>> with mlp.name_scope():
    ...     mlp.add(nn.Flatten(), nn.Dense(4, in_units=48))
    >>> mlp.initialize()
    >>> api = GluonAPI(block_to_network(mlp), mxfp16.StaticLossScaler(2.0 ** 8), ctx=[mx.cpu()],
    ...                dtype='float16', kvstore='device', optimizer='sgd',
    ...                optimizer_params={'learning_rate': 0.1})
    >>> stats = train_one_epoch(api, synthetic_iter(8, (3, 4, 4), 4, 5), num_classes=4,
    ...                         batch_size=8, num_batches=5)
    >>> stats['batches'], stats['skipped_steps'], api.optimizer.num_update
    (5, 0, 5)
    """
    soft = bool(smoothing or mixup_alpha)
    lambdas = _mixup_lambdas(seed, epoch, num_batches, mixup_alpha, mixup_until)
    meter = EpochMeter(epoch, num_batches, api.scaler, disp_batches, metrics_log)
    if meter_state:
        meter.load_state(meter_state)
    seed_batch(seed, epoch, 0)  # before the reset: iterators with workers shuffle there
    train_data.reset()
    start_batch = skip_batches(train_data, start_batch, seed, epoch)
    for index in range(start_batch, num_batches):
        seed_batch(seed, epoch, index)
        try:
            batch = train_data.next()
        except StopIteration:
            break
        mixup_lambda = None if lambdas is None else lambdas[index]
        data, labels = api.split(batch.data[0]), api.split(batch.label[0])
        targets = [make_targets(y, num_classes, smoothing, mixup_lambda) for y in labels] \
            if soft else labels
        if mixup_lambda is not None:
            data = [mixup_data(x, mixup_lambda) for x in data]
        outputs, losses, updated = api.train_step(data, targets, batch_size)
        meter.update(labels, outputs, losses, updated, next_learning_rate(api.optimizer),
                     api.optimizer.num_update)
        if checkpointer is not None:
            checkpointer.after_step(epoch, index + 1, meter)
    meter_state = meter.state() if checkpointer is not None else None
    return dict(meter.close(), meter_state=meter_state)


def _mixup_lambdas(seed, epoch, num_batches, alpha, until):
    """Mixup's ``lam`` of every batch of the epoch, ``Beta(alpha, alpha)`` draws from a generator
    seeded by ``seed + epoch`` (a resumed run draws the same), 1 from epoch ``until`` on; None
    without mixup."""
    if not alpha:
        return None
    lambdas = np.random.RandomState(seed + epoch).beta(alpha, alpha, num_batches)
    return np.ones(num_batches) if until is not None and epoch >= until else lambdas


def evaluate(api, val_data, *, top_k, num_classes, reduce=None, stop=None):
    """Top-1 and top-k accuracy on ``val_data`` (padding left out), or ``(None, None)`` without it.

    ``reduce`` sums ``[top-1 hits, top-k hits, samples]`` over the ranks of a Horovod job whose
    ranks each validate their shard (every rank calls it, once).  ``stop`` (a
    :class:`~mxfp16.checkpoints.preemption.StopRequest`) abandons the evaluation at the next batch
    once a signal arrived: it returns None then.

    Examples
    --------
    >>> import mxnet as mx, mxfp16
    >>> from mxnet.gluon import nn
    >>> from mxfp16.models import block_to_network
    >>> from mxfp16.train.data import synthetic_iter
    >>> net = nn.Dense(3, in_units=12, prefix='fc_')
    >>> net.initialize()
    >>> api = GluonAPI(block_to_network(net), mxfp16.StaticLossScaler(1, enabled=False),
    ...                ctx=[mx.cpu()], dtype='float32', kvstore='device', optimizer='sgd',
    ...                optimizer_params={})
    >>> top1, top3 = evaluate(api, synthetic_iter(4, (3, 2, 2), 3, 2), top_k=5, num_classes=3)
    >>> top3
    1.0
    """
    if val_data is None:
        return None, None
    accuracy = Accuracy(top_k, num_classes)
    val_data.reset()
    for batch in val_data:
        if stop is not None and stop.requested:
            return None
        accuracy.update([batch.label[0]], api.predict(batch.data[0]), batch.pad)
    if reduce is None:
        return accuracy.get()
    top1, topk, count = reduce(accuracy.totals())
    return (top1 / count, topk / count) if count else (float("nan"), float("nan"))


def run_status(api):
    """Learning rate, loss scale, skipped steps and update count, for the epoch records."""
    return {"lr": next_learning_rate(api.optimizer), "loss_scale": api.scaler.loss_scale,
            "num_skipped": api.scaler.num_skipped, "num_update": api.optimizer.num_update}


def fit(api, data, *, begin_epoch, num_epochs, epoch_settings, top_k, save_period=1,
        metrics_log=None, save=None, val_reduce=None, begin_batch=0, meter_state=None,
        checkpointer=None):
    """The epoch loop: train, validate, log, checkpoint, from ``begin_epoch`` to ``num_epochs``.

    Parameters
    ----------
    api : GluonAPI or ModuleAPI
    data : mxfp16.train.data.TrainData
    begin_epoch, num_epochs : int
    epoch_settings : dict
        Keyword arguments of :func:`train_one_epoch` (``num_classes``, ``batch_size``, ...).
    top_k : int
    save_period : int
        Save every ``save_period`` epochs, and after the last.
    metrics_log : mxfp16.train.logs.MetricsLog, optional
        Gets a ``start`` record and one ``epoch`` record per epoch.
    save : callable, optional
        ``save(epochs_done, record, network, save_states)`` writes a checkpoint, returns its name.
    val_reduce : callable, optional
        Sums the validation counts over the ranks (see :func:`evaluate`).
    begin_batch : int
        Batches of ``begin_epoch`` done already (resuming a mid-epoch checkpoint).
    meter_state : dict, optional
        Their statistics, from the checkpoint.
    checkpointer : mxfp16.train.progress.Checkpointer, optional
        Mid-epoch checkpoints and the stop on SIGTERM/SIGINT: a signal during training stops
        after the step, one during validation abandons it (one process only; a distributed job
        validates to the end), one during a checkpoint's write after the write; the position is
        saved and :class:`~mxfp16.train.progress.TrainingStopped` raised.

    Returns
    -------
    dict
        The last epoch's record: ``epoch``, ``train_loss``, ``train_acc``, ``top1``, ``topk``,
        ``img_per_sec``, ``lr``, ``loss_scale``, ``num_skipped``, ``num_update``, ...
    """
    metrics_log = metrics_log or MetricsLog()
    _log_start(api, metrics_log, begin_epoch, begin_batch)
    stop = None if checkpointer is None or checkpointer.vote else checkpointer.stop
    if getattr(data.train, "skip", None) is None:  # ImageRecordIter: replay the epochs' shuffles
        for _ in range(begin_epoch):
            data.train.reset()
    for epoch in range(begin_epoch, num_epochs):
        first = epoch == begin_epoch
        stats = train_one_epoch(api, data.train, num_batches=data.batches_per_epoch, epoch=epoch,
                                metrics_log=metrics_log, checkpointer=checkpointer,
                                start_batch=begin_batch if first else 0,
                                meter_state=meter_state if first else None, **epoch_settings)
        ended = stats.pop("meter_state")
        scores = evaluate(api, data.val, top_k=top_k, reduce=val_reduce, stop=stop,
                          num_classes=epoch_settings["num_classes"])
        if scores is None:  # a signal during validation: the epoch's training is saved
            checkpointer.stopped(epoch, stats["batches"],
                                 checkpointer.checkpoint(epoch, stats["batches"], ended))
        top1, topk = scores
        record = dict(event="epoch", epoch=epoch, **stats, top1=top1, topk=topk, **run_status(api))
        log.info(epoch_line(record, top_k))
        metrics_log.write(record, step=epoch)
        due = (epoch + 1) % save_period == 0 or epoch + 1 == num_epochs
        _end_epoch(api, record, epoch + 1, num_epochs, save=save, due=due,
                   checkpointer=checkpointer)
    return record


def _log_start(api, metrics_log, begin_epoch, begin_batch):
    """The ``start`` record of a run (log line and metrics), with where it starts."""
    record = dict(event="start", epoch=begin_epoch, **run_status(api))
    scale = "measured at the first step" if api.scaler.needs_start else f"{record['loss_scale']:g}"
    where = f"epoch {begin_epoch}" + (f", batch {begin_batch}" if begin_batch else "")
    log.info("starting at %s: lr %.5g, loss scale %s, %d updates done", where,
             record["lr"], scale, record["num_update"])
    metrics_log.write(record, step=begin_epoch, group="start")


def _end_epoch(api, record, epochs_done, num_epochs, *, save, due, checkpointer):
    """The checkpoint at an epoch's end (when ``due``), and the stop on a signal that arrived: a
    signal during the write stops after it, with the epoch saved."""
    name = None
    if save and due:
        name = save(epochs_done, record, *api.snapshot(), device_aux=api.device_aux())
    if checkpointer is not None and checkpointer.stop_requested() and epochs_done < num_epochs:
        if save and name is None:
            name = save(epochs_done, record, *api.snapshot(), device_aux=api.device_aux())
        checkpointer.stopped(epochs_done, 0, name)
    if name is not None and checkpointer is not None:
        checkpointer.policy.saved()


def checkpoint_saver(prefix, scaler, config_dict, **static_meta):
    """A function ``save(epochs_done, record, network, save_states, batch=0, progress=None)`` that
    writes a checkpoint under ``prefix`` with :func:`mxfp16.train.state.checkpoint.save_checkpoint` (the
    network, the optimizer state, the scaler's state, the update count, the learning rate, the
    record, the configuration, ``static_meta`` and, mid-epoch, the partial epoch's statistics),
    removes the mid-epoch checkpoints before it, and returns its name."""
    def save(epochs_done, record, network, save_states, batch=0, progress=None, device_aux=None):
        paths = save_checkpoint(prefix, epochs_done, network, save_states, scaler, batch=batch,
                                device_aux=device_aux, num_update=record["num_update"],
                                lr=record["lr"], metrics=record, config=config_dict,
                                progress=progress, **static_meta)
        name = paths.meta[:-len(".json")]
        remove_mid_epoch_checkpoints(prefix, before=(epochs_done, batch))
        log.info("saved checkpoint %s", name)
        return name
    return save


def _warn_batch_size(batch_size, dtype):
    if dtype == "float16" and batch_size % 8:
        log.warning("--batch-size %d is not a multiple of 8: float16 Tensor Cores run fastest on "
                    "multiples of 8", batch_size)


def _make_api(config, network, scaler, data, *, ctx, kvstore, start, per_epoch):
    """The :class:`GluonAPI` or :class:`ModuleAPI` of ``config.api``, its optimizer positioned at
    ``start`` of a schedule of ``per_epoch`` batches per epoch."""
    params = optimizer_params(
        optimizer=config.optimizer, lr=config.lr, mom=config.mom, wd=config.wd,
        lr_mode=config.lr_mode, lr_step_epochs=config.lr_step_epochs, lr_factor=config.lr_factor,
        warmup_epochs=config.warmup_epochs, num_epochs=config.num_epochs,
        batches_per_epoch=per_epoch, num_update=start.num_update, warmup_lr=config.warmup_lr)
    gluoncv_states = start.states_path if start.states_order else None
    common = dict(ctx=ctx, dtype=config.dtype, kvstore=kvstore, optimizer=config.optimizer,
                  optimizer_params=params, soft_targets=bool(config.label_smoothing or config.mixup),
                  no_wd=config.no_wd, states_path=None if gluoncv_states else start.states_path,
                  allow_pickle=config.allow_pickle,
                  keep_float32=network_keep(network, config.keep_float32))
    if config.api == "gluon":
        api = GluonAPI(network, scaler, hybridize=config.mode != "imperative", **common)
        if gluoncv_states:
            load_gluoncv_states(api.trainer, gluoncv_states, start.states_order,
                                dtype=config.dtype, master_values=network.arg_params,
                                allow_pickle=config.allow_pickle)
    else:
        api = ModuleAPI(network, scaler, data_shape=data.train.provide_data[0].shape,
                        num_classes=config.num_classes, **common)
    if start.devices_path and start.num_devices == len(ctx):  # each device's BatchNorm statistics
        api.load_device_aux(mx.nd.load(start.devices_path))
    return api


def _epoch_settings(config, num_workers):
    return dict(num_classes=config.num_classes, batch_size=config.batch_size * num_workers,
                smoothing=config.label_smoothing,
                mixup_alpha=config.mixup_alpha if config.mixup else 0.0,
                disp_batches=config.disp_batches, seed=config.seed,
                mixup_until=config.num_epochs - config.mixup_off_epoch)


def _start_point(config, network, scaler, per_epoch, states_order, num_workers,
                 batches_per_epoch):
    """The network and :class:`~mxfp16.train.state.resume.StartPoint` of the run: a checkpoint's
    (``--resume``), GluonCV's files and ``--resume-epoch`` or an MXNet example checkpoint's epoch,
    else the start of training."""
    network, start = resume_run(config.resume, network, scaler, api=config.api, dtype=config.dtype,
                                optimizer=config.optimizer, num_epochs=config.num_epochs,
                                model_prefix=config.model_prefix, settings=config.to_dict(),
                                num_workers=num_workers, batches_per_epoch=batches_per_epoch,
                                allow_pickle=config.allow_pickle, loss_scale=config.loss_scale)
    if not config.resume and (config.resume_epoch or config.resume_params):
        start = StartPoint(config.resume_epoch, config.resume_epoch * per_epoch,
                           config.resume_states, states_order)
    return network, start


def _log_run(config, data, ctx, num_workers, per_epoch, reason):
    _warn_batch_size(config.batch_size, config.dtype)
    log.info("training %s in %s with the %s API on %s (%d worker(s)): %s, %d batches of %d "
             "per epoch", config.run_name, config.dtype, config.api, ",".join(map(str, ctx)),
             num_workers, data.description, data.batches_per_epoch, config.batch_size)
    if reason:
        log.info("lr schedule: %d batches per epoch (%s); the data's epoch has %d", per_epoch,
                 reason, data.batches_per_epoch)


def train(config, network=None, metrics_path=None, states_order=None):
    """Run the training a checked :class:`~mxfp16.train.cli.config.TrainConfig` describes.

    Parameters
    ----------
    config : TrainConfig
        From ``TrainConfig(...).checked()``.
    network : mxfp16.models.Network, optional
        The float32 network to train (fine-tuning builds one); default: a new ``config.network``.
    metrics_path : str, optional
        ``metrics.jsonl`` to append the records to: a ``start`` record, then one per epoch.
    states_order : tuple of str, optional
        GluonCV's ``--resume-states``: the parameter names in the file's order.

    Returns
    -------
    dict
        The last epoch record (see :func:`fit`).

    Raises
    ------
    ValueError
        (``DataError``, ``CheckpointError``) for bad data, flags or checkpoints.
    mxfp16.LossScaleCollapse
        When steps keep overflowing at the minimum loss scale.
    """
    scaler = _make_scaler(config)
    ctx, kvstore, rank, num_workers = _devices_and_kvstore(config)
    settle_log_rank(rank)
    horovod = is_horovod(kvstore)
    for seed in (random.seed, np.random.seed, mx.random.seed):
        seed(config.seed)
    # Horovod's ranks validate a shard each and sum the counts, as NVIDIA's example does.
    data = load_data(**data_settings(config), num_parts=num_workers, part_index=rank,
                     shard_val=horovod)
    val_reduce = (lambda totals: kvstore.allreduce_values("val", totals)) if horovod else None
    if network is None:
        network = new_network(config.network, config.num_classes, config.image_shape,
                              **config.network_settings)
    per_epoch, reason = schedule_batches(config, data, num_workers)
    network, start = _start_point(config, network, scaler, per_epoch, states_order, num_workers,
                                  data.batches_per_epoch)
    _log_run(config, data, ctx, num_workers, per_epoch, reason)
    api = _make_api(config, network, scaler, data, ctx=ctx, kvstore=kvstore, start=start,
                    per_epoch=per_epoch)
    if config.monitor:  # MXNet example's --monitor N
        api = ParameterMonitor(api, config.monitor)
    save = checkpoint_saver(config.model_prefix, scaler, config.to_dict(),
                            num_workers=num_workers, batches_per_epoch=data.batches_per_epoch,
                            num_devices=len(ctx)) \
        if config.model_prefix and rank == 0 else None
    return _fit_run(config, api, data, start, save=save, kvstore=kvstore, rank=rank,
                    num_workers=num_workers, metrics_path=metrics_path, val_reduce=val_reduce)


def _make_scaler(config):
    try:
        return make_loss_scaler(config.loss_scale, config.dtype,
                                max_consecutive_skips=config.max_consecutive_skips)
    except ValueError as error:
        raise ValueError(f"--loss-scale: {error}") from None


def _devices_and_kvstore(config):
    """``(ctx, kvstore, rank, num_workers)`` of this process; under Horovod one GPU per process
    and ``--gc-type fp16`` (float16 on the wire)."""
    ctx = contexts(config.gpus, config.cpus)
    kvstore, rank, num_workers = make_kvstore(config.kv_store)
    if is_horovod(kvstore):
        ctx = rank_devices(ctx, kvstore.local_rank)
        kvstore.set_gradient_compression({"type": config.gc_type})
    return ctx, kvstore, rank, num_workers


def _fit_run(config, api, data, start, *, save, kvstore, rank, num_workers, metrics_path,
             val_reduce):
    """:func:`fit` inside what a run holds while it trains: the prefix (claimed here by a
    ``dist_sync`` worker that learned it is rank 0), rank 0's metrics, the worker profile and the
    signal handlers."""
    late_claim = save is not None and not claims_early(config.kv_store)
    with claim_prefix(config.model_prefix if late_claim else None) as removed, \
            MetricsLog(metrics_path if rank == 0 else None,
                       config.tensorboard if rank == 0 else None) as metrics_log, \
            worker_profile(config.profile_worker_suffix, rank, num_workers), \
            StopRequest() as stop:
        log_removed(removed)
        checkpointer = Checkpointer(
            _mid_epoch_saver(api, save), stop,
            SavePolicy(config.save_steps, config.save_minutes), data.batches_per_epoch,
            vote=stop_vote(kvstore, num_workers), prefix=config.model_prefix, rank=rank)
        return fit(api, data, begin_epoch=start.begin_epoch, num_epochs=config.num_epochs,
                   epoch_settings=_epoch_settings(config, num_workers), top_k=config.top_k,
                   save_period=config.save_period, metrics_log=metrics_log, save=save,
                   val_reduce=val_reduce, begin_batch=start.begin_batch,
                   meter_state=start.meter_state, checkpointer=checkpointer)


def _mid_epoch_saver(api, save):
    """``save(epoch, batch, meter_state)`` of a mid-epoch checkpoint through ``save`` (None where
    the run saves nothing)."""
    if save is None:
        return None

    def save_position(epoch, batch, meter_state):
        record = dict(event="progress", epoch=epoch, batch=batch, **run_status(api))
        return save(epoch, record, *api.snapshot(), batch=batch, progress=meter_state,
                    device_aux=api.device_aux())
    return save_position


def data_settings(config):
    """The keyword arguments of :func:`mxfp16.train.data.load_data` a config sets (all but the
    worker's shard)."""
    return dict(batch_size=config.batch_size, image_shape=tuple(config.image_shape),
                num_classes=config.num_classes, data_train=config.data_train,
                data_train_idx=config.data_train_idx, data_val=config.data_val,
                data_val_idx=config.data_val_idx, data_dir=config.data_dir,
                val_fraction=config.val_fraction, synthetic=config.synthetic,
                num_examples=config.num_examples or IMAGENET_TRAIN_IMAGES,
                num_threads=config.data_nthreads,
                seed=config.seed, max_batches=config.max_batches,
                augmentation=config.augmentation, crop_ratio=config.crop_ratio,
                num_workers=config.num_data_workers or 0,
                skip_bad_images=config.skip_bad_images)
