"""The Module-API path of the training scripts (``--api module``).

The network's float32 graph gets a ``SoftmaxOutput`` head and goes through
:func:`mxfp16.cast_symbol`; its parameters through :func:`mxfp16.cast_params`.  The loss scaler
drives a ``BucketingModule`` keyed by the loss scale (:func:`mxfp16.make_scaled_module`), one
:func:`mxfp16.module_step` per batch.  Data, targets, metrics, the epoch loop and checkpoints are
shared with the Gluon path (:mod:`mxfp16.training`).
"""
import logging
import warnings

import mxnet as mx
import numpy as np

from .casting import cast_params, cast_symbol
from .data import DATA_NAME, LABEL_NAME
from .logs import EpochMeter
from .models import Network
from .module import init_optimizer, make_scaled_module, module_step
from .optimizers import make_optimizer
from .training import (NO_WD_SUFFIXES, schedule_settings, accuracy_metrics, make_targets,
                       mixup_data, next_learning_rate, optimizer_params, run_epochs, run_status,
                       update_accuracy)

log = logging.getLogger("mxfp16.train")

#: Name of the softmax head; its label input is ``softmax_label`` (:data:`mxfp16.data.LABEL_NAME`).
SOFTMAX_NAME = "softmax"


def training_symbol(network):
    """The float32 training graph of ``network``: its logits into ``SoftmaxOutput``.

    Examples
    --------
    >>> import mxnet as mx
    >>> logits = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=3, name='fc')
    >>> training_symbol(Network(logits, {}, {})).list_arguments()
    ['data', 'fc_weight', 'fc_bias', 'softmax_label']
    """
    return mx.sym.SoftmaxOutput(network.symbol, name=SOFTMAX_NAME)


def make_module(network, scaler, *, ctx, dtype, data_shape, label_shape, kvstore, optimizer,
                optimizer_params, no_wd=False, states_path=None):
    """A bound, initialized ``BucketingModule`` for ``network`` in ``dtype``, and its optimizer.

    Parameters
    ----------
    network : mxfp16.models.Network
        float32 graph (logits) and values; ``fixed_param_names`` are not trained, ``lr_mult``
        multiplies learning rates by name.
    scaler : mxfp16.LossScaler
        Its scale is the module's first bucket.
    ctx : list of Context
    dtype : {'float32', 'float16', 'bfloat16'}
    data_shape : tuple of int
        ``(N, C, H, W)``.
    label_shape : tuple of int
        ``(N,)`` for class labels, ``(N, K)`` for soft targets (label smoothing, mixup).
    kvstore : str or KVStore
    optimizer : str
    optimizer_params : dict
        For :func:`mxfp16.make_optimizer` (see :func:`mxfp16.training.optimizer_params`).
    no_wd : bool
        No weight decay on biases and BatchNorm's gamma and beta.
    states_path : str, optional
        A checkpoint's optimizer state to restore.

    Returns
    -------
    tuple
        ``(module, optimizer)``: train with :func:`mxfp16.module_step`.

    Examples
    --------
    >>> import mxnet as mx, mxfp16
    >>> logits = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> network = Network(logits, {'fc_weight': mx.nd.ones((4, 12)), 'fc_bias': mx.nd.zeros(4)}, {})
    >>> module, opt = make_module(network, mxfp16.DynamicLossScaler(), ctx=[mx.cpu()],
    ...                           dtype='float16', data_shape=(2, 3, 2, 2), label_shape=(2,),
    ...                           kvstore='device', optimizer='sgd',
    ...                           optimizer_params={'learning_rate': 0.1})
    >>> module.get_params()[0]['fc_weight'].dtype.__name__, opt.multi_precision
    ('float16', True)
    """
    sym = cast_symbol(training_symbol(network), dtype, data_names=(DATA_NAME,))
    module = make_scaled_module(sym, scaler, data_names=(DATA_NAME,), label_names=(LABEL_NAME,),
                                context=ctx, fixed_param_names=list(network.fixed_param_names),
                                logger=log)
    module.bind(data_shapes=[(DATA_NAME, data_shape)], label_shapes=[(LABEL_NAME, label_shape)])
    arg_params, aux_params = cast_params(network.arg_params, network.aux_params, sym,
                                         data_names=(DATA_NAME,), label_names=(LABEL_NAME,))
    module.init_params(arg_params=arg_params, aux_params=aux_params)
    opt = make_optimizer(optimizer, dtype, **optimizer_params)
    opt.set_lr_mult(dict(network.lr_mult))
    if no_wd:
        opt.set_wd_mult({name: 0.0 for name in network.param_names
                         if name.endswith(NO_WD_SUFFIXES)})
    with warnings.catch_warnings():  # module_step sets rescale_grad itself, for each loss scale
        warnings.filterwarnings("ignore", message=".*rescale_grad.*")
        init_optimizer(module, opt, kvstore)
    if states_path:
        bucket_module(module).load_optimizer_states(states_path)
    return module, opt


def bucket_module(module):
    """The current bucket's ``Module`` of a ``BucketingModule``: the one that can save and load the
    optimizer state, which all buckets share (``BucketingModule`` has no such methods)."""
    return getattr(module, "_curr_module", module)


def _soft_cross_entropy(probs, targets):
    """Per-sample cross-entropy of softmax outputs against ``(N, K)`` targets."""
    return -(targets * mx.nd.log(mx.nd.clip(probs, 1e-12, 1.0))).sum(axis=1)


def train_one_epoch(module, optimizer, scaler, train_data, *, num_classes, batch_size, num_batches,
                    epoch=0, smoothing=0.0, mixup_alpha=0.0, kvstore=None, disp_batches=20,
                    metrics_log=None, seed=0):
    """Train a Module for one epoch (at most ``num_batches`` batches).

    Parameters
    ----------
    module, optimizer
        From :func:`make_module`.
    scaler : mxfp16.LossScaler
    train_data : mx.io.DataIter
    num_classes, batch_size, num_batches, epoch, smoothing, mixup_alpha
        As for :func:`mxfp16.training.train_one_epoch`.
    disp_batches, metrics_log, seed
        Likewise.
    kvstore : KVStore or None
        A distributed kvstore, through which the workers agree on skipping a step.

    Returns
    -------
    dict
        ``train_loss``, ``train_acc``, ``img_per_sec``, ``skipped_steps``, ``batches``.

    Raises
    ------
    mxfp16.LossScaleCollapse
        When steps keep overflowing at the minimum loss scale.
    """
    soft = bool(smoothing or mixup_alpha)
    rng = np.random.RandomState(seed + epoch)
    meter = EpochMeter(epoch, num_batches, scaler, disp_batches, metrics_log)
    train_data.reset()
    for _, batch in zip(range(num_batches), train_data):
        mixup_lambda = rng.beta(mixup_alpha, mixup_alpha) if mixup_alpha else None
        labels, data = batch.label[0], batch.data[0]
        targets = make_targets(labels, num_classes, smoothing, mixup_lambda)
        if mixup_lambda is not None:
            data = mixup_data(data, mixup_lambda)
        step_batch = mx.io.DataBatch([data], [targets if soft else labels])
        updated = module_step(module, step_batch, scaler, optimizer, batch_size, kvstore=kvstore)
        probs = module.get_outputs()[0]
        meter.update([labels], [probs], [_soft_cross_entropy(probs, targets)], updated,
                     next_learning_rate(optimizer), optimizer.num_update)
    return meter.close()


def evaluate(module, val_data, *, scaler, top_k, num_classes):
    """Top-1 and top-k accuracy of a Module on ``val_data`` (padding left out), or (None, None).

    The forward passes run in the bucket of the current loss scale (the one the next training
    step uses), so validation binds nothing new.
    """
    if val_data is None:
        return None, None
    metrics = accuracy_metrics(top_k, num_classes)
    val_data.reset()
    for batch in val_data:
        module.forward(mx.io.DataBatch([batch.data[0]], None, bucket_key=scaler.loss_scale,
                                       provide_data=module.data_shapes,
                                       provide_label=module.label_shapes), is_train=False)
        update_accuracy(metrics, batch.label[0], module.get_outputs(), batch.pad)
    return tuple(metric.get()[1] for metric in metrics)


def current_network(module, network):
    """``network`` with the module's current parameter values (float32 copies)."""
    # Module re-reads the devices only after an update; a skipped step still moved the BatchNorm
    # statistics, so ask for a fresh copy (Module offers no public way to).
    module._params_dirty = True
    arg_params, aux_params = module.get_params()
    return Network(network.symbol, {k: v.astype("float32") for k, v in arg_params.items()},
                   {k: v.astype("float32") for k, v in aux_params.items()},
                   network.fixed_param_names, network.lr_mult)


def fit_module(network, data, scaler, config, *, ctx, kvstore, num_workers, begin_epoch,
               states_path, num_update, metrics_log, save):
    """Train ``network`` with the Module API from ``begin_epoch`` to ``config.num_epochs``.

    The parameters and the return value are those of :func:`mxfp16.training.fit_gluon`;
    ``num_update`` positions the fresh optimizer's schedule, ``states_path`` restores its state.
    """
    soft = bool(config.label_smoothing or config.mixup)
    batch_shape = data.train.provide_data[0].shape
    label_shape = (batch_shape[0], config.num_classes) if soft else (batch_shape[0],)
    params = optimizer_params(**schedule_settings(config), num_update=num_update,
                              batches_per_epoch=data.batches_per_epoch)
    module, optimizer = make_module(
        network, scaler, ctx=ctx, dtype=config.dtype, data_shape=batch_shape,
        label_shape=label_shape, kvstore=kvstore, optimizer=config.optimizer,
        optimizer_params=params, no_wd=config.no_wd, states_path=states_path)
    step_kvstore = kvstore if isinstance(kvstore, mx.kv.KVStore) else None

    def train_epoch(epoch):
        return train_one_epoch(module, optimizer, scaler, data.train,
                               num_classes=config.num_classes,
                               batch_size=config.batch_size * num_workers,
                               num_batches=data.batches_per_epoch, epoch=epoch,
                               smoothing=config.label_smoothing,
                               mixup_alpha=config.mixup_alpha if config.mixup else 0.0,
                               kvstore=step_kvstore, disp_batches=config.disp_batches,
                               metrics_log=metrics_log, seed=config.seed)

    def snapshot(epochs_done, record):
        save(epochs_done, record, current_network(module, network),
             bucket_module(module).save_optimizer_states)

    return run_epochs(
        train_epoch, lambda: evaluate(module, data.val, scaler=scaler, top_k=config.top_k,
                                      num_classes=config.num_classes),
        lambda: run_status(optimizer, scaler), snapshot if save else None,
        begin_epoch=begin_epoch, num_epochs=config.num_epochs, save_period=config.save_period,
        metrics_log=metrics_log, top_k=config.top_k)
