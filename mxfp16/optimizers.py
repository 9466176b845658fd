"""Optimizers for mixed precision: float32 master weights (``multi_precision``), ``rescale_grad``.

This is the only module that sets ``multi_precision`` and the only one that computes
``rescale_grad``.  It also finds the float32 master copies an optimizer keeps (for checkpoints of
float16 networks) and fits optimizer states saved in one precision to weights of another.
"""
import mxnet as mx
import numpy as np
from mxnet import gluon

from . import mxnet_internals
from .dtypes import LOW_PRECISION_DTYPES, check_dtype
from .distributed.kvstore import sync_if_horovod
from .master_weights import (check_optimizer, keeps_master_weights, master_index, master_weight,
                             multi_precision_optimizers)

__all__ = ["MULTI_PRECISION_OPTIMIZERS", "MOMENTUM_OPTIMIZERS", "NO_WD_SUFFIXES", "check_optimizer",
           "keeps_master_weights", "multi_precision_optimizers", "rescale_grad", "training_dtype",
           "make_optimizer", "restore_multi_precision", "make_trainer", "check_updates_on_workers",
           "master_weight", "master_copies", "adapt_states"]

#: MXNet 1.9.1's own optimizers that keep a float32 master copy of float16 weights with
#: ``multi_precision=True``, as :func:`keeps_master_weights` finds (SGD, NAG, LARS through their own
#: fused kernels; the others through the base Optimizer's master-copy path); tests check each.  Not
#: the gate: any registered optimizer that keeps master weights is accepted (GluonNLP's 'bertadam').
#: Left out: 'lamb', whose multi-precision kernel in MXNet 1.9.1 never writes its float32 copy back
#: (updates below float16 resolution are lost, as without multi_precision); 'ccsgd', a deprecated
#: alias; 'test', a fixture.
MULTI_PRECISION_OPTIMIZERS = (
    "sgd", "nag", "lars", "lbsgd", "signum", "adam", "nadam", "adamax", "adagrad",
    "groupadagrad", "adadelta", "rmsprop", "ftml", "ftrl", "dcasgd", "sgld",
)

#: Optimizers that take a ``momentum`` argument; the others reject it.
MOMENTUM_OPTIMIZERS = ("sgd", "nag", "lars", "lbsgd", "signum", "dcasgd")

#: Parameters left out of weight decay by ``no_wd`` (biases and BatchNorm's gamma and beta), as in
#: GluonCV's recipe: decaying them only shrinks the scale the normalization restores.
NO_WD_SUFFIXES = ("bias", "gamma", "beta")


def rescale_grad(loss_scale=1.0, batch_size=None):
    """The factor that turns summed, loss-scaled gradients into mean, unscaled ones.

    Parameters
    ----------
    loss_scale : float
        The factor the loss was multiplied by before backward.
    batch_size : int or None
        The number of samples the gradients are summed over (Module needs it; a Gluon Trainer
        divides by the batch size itself in ``step`` / ``update``).

    Returns
    -------
    float
        ``1 / (loss_scale * batch_size)``.

    Examples
    --------
    >>> rescale_grad(1024.0, 256)
    3.814697265625e-06
    """
    if not loss_scale > 0:
        raise ValueError(f"loss_scale must be positive, got {loss_scale!r}")
    if batch_size is not None and not batch_size > 0:
        raise ValueError(f"batch_size must be a positive number of samples, got {batch_size!r}")
    return 1.0 / (float(loss_scale) * (batch_size or 1))


def training_dtype(params, dtype=None):
    """The training dtype of a network: ``dtype`` checked against its parameters, or inferred.

    Parameters
    ----------
    params : ParameterDict, dict or list of Parameter
        ``net.collect_params()``.
    dtype : str or None
        None infers ``'float16'`` when a parameter is float16 (as :func:`mxfp16.cast_block` leaves
        them), else ``'float32'``; bfloat16 networks keep float32 parameters, so pass
        ``'bfloat16'`` for them (master weights change nothing there: they are float32 already).

    Returns
    -------
    str

    Raises
    ------
    ValueError
        For an unknown dtype, or ``'float32'`` with float16 parameters (their updates would be
        rounded to float16 without float32 master weights).

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.Dense(2, in_units=3, dtype='float16')
    >>> training_dtype(net.collect_params()), training_dtype(net.collect_params(), 'float16')
    ('float16', 'float16')
    """
    values = params.values() if hasattr(params, "values") else params
    half = [param.name for param in values if np.dtype(param.dtype) == np.float16]
    if dtype is None:
        return "float16" if half else "float32"
    dtype = check_dtype(dtype)
    if dtype == "float32" and half:
        raise ValueError(f"dtype='float32' but parameter(s) {half[:3]} are float16: float16 "
                         "weights need float32 master weights; pass dtype='float16' (or leave "
                         "dtype out to infer it from the parameters)")
    return dtype


def _check_multi_precision(value, dtype):
    """Accept a ``multi_precision`` that agrees with ``dtype``; raise if it contradicts it."""
    expected = dtype in LOW_PRECISION_DTYPES
    if value not in (True, False) or bool(value) != expected:
        raise ValueError(f"multi_precision={value!r} contradicts dtype={dtype!r}, which needs "
                         f"multi_precision={expected} (float32 master weights for float16 and "
                         "bfloat16, none for float32): remove multi_precision, mxfp16 sets it "
                         "from the dtype")


def _check_instance(optimizer, dtype, kwargs):
    """An Optimizer object passed in place of a name must already fit ``dtype``."""
    if kwargs:
        raise ValueError(f"optimizer parameters {sorted(kwargs)} given with an Optimizer object "
                         f"({type(optimizer).__name__}): set them on the object, or pass the "
                         "optimizer's name, as gluon.Trainer requires")
    if dtype in LOW_PRECISION_DTYPES:
        check_optimizer(type(optimizer).__name__, optimizer)
    _check_multi_precision(optimizer.multi_precision, dtype)
    return optimizer


def make_optimizer(name, dtype, loss_scale=1.0, batch_size=None, **kwargs):
    """Create an MXNet optimizer configured for training in ``dtype``.

    Parameters
    ----------
    name : str or mx.optimizer.Optimizer
        For float16 and bfloat16, a registered optimizer that keeps float32 master weights
        (:func:`keeps_master_weights`: ``'sgd'``, ``'adam'``, GluonNLP's ``'bertadam'``, ...);
        any MXNet optimizer for float32.  An Optimizer object is checked (its
        ``multi_precision`` must fit ``dtype``) and returned as it is.
    dtype : {'float32', 'float16', 'bfloat16'}
        The training dtype.  float16 and bfloat16 get ``multi_precision=True``: the optimizer keeps
        a float32 master copy of each low-precision weight, updates it, and copies it back rounded.
    loss_scale : float
        A static loss scale to undo through ``rescale_grad`` (1 for none, or when a loss scaler
        unscales).
    batch_size : int or None
        Fold ``1/batch_size`` into ``rescale_grad`` too, as ``mx.mod.Module`` expects; leave None
        for a Gluon Trainer, which divides by the batch size in ``step``.
    **kwargs
        Optimizer arguments (``learning_rate``, ``momentum``, ``wd``, ``lr_scheduler``, ...).
        ``multi_precision`` is set from ``dtype``: a value that agrees is accepted, one that
        contradicts it raises.  ``rescale_grad`` is computed here and may not be passed.

    Returns
    -------
    mx.optimizer.Optimizer

    Raises
    ------
    ValueError
        For an unsupported optimizer or dtype, a contradicting ``multi_precision``, or
        ``rescale_grad``.

    Examples
    --------
    >>> opt = make_optimizer('sgd', 'float16', loss_scale=128, batch_size=32, learning_rate=0.1,
    ...                      multi_precision=True)
    >>> opt.multi_precision, opt.rescale_grad
    (True, 0.000244140625)
    """
    dtype = check_dtype(dtype)
    if "multi_precision" in kwargs:
        _check_multi_precision(kwargs.pop("multi_precision"), dtype)
    if "rescale_grad" in kwargs:
        raise ValueError(f"make_optimizer computes rescale_grad itself; remove "
                         f"rescale_grad={kwargs['rescale_grad']!r} (pass loss_scale= and "
                         "batch_size=, or scale the loss)")
    if isinstance(name, mx.optimizer.Optimizer):
        if (loss_scale, batch_size) != (1.0, None):
            raise ValueError("loss_scale= and batch_size= need the optimizer's name, not an "
                             f"Optimizer object ({type(name).__name__}), to set its rescale_grad")
        return _check_instance(name, dtype, kwargs)
    if dtype in LOW_PRECISION_DTYPES:
        name = check_optimizer(name)
    return mx.optimizer.create(name, multi_precision=dtype in LOW_PRECISION_DTYPES,
                               rescale_grad=rescale_grad(loss_scale, batch_size), **kwargs)


def restore_multi_precision(optimizer, dtype):
    """Give an optimizer restored from a checkpoint the ``multi_precision`` of ``dtype``.

    A float32 run's ``.states`` file holds an optimizer without master weights; resumed in float16
    it would round every update to float16.

    Examples
    --------
    >>> opt = mx.optimizer.SGD()
    >>> restore_multi_precision(opt, 'float16')
    >>> opt.multi_precision
    True
    """
    optimizer.multi_precision = check_dtype(dtype) in LOW_PRECISION_DTYPES


def make_trainer(params, optimizer, optimizer_params=None, kvstore="device",
                 compression_params=None, update_on_kvstore=False, *, dtype=None, loss_scale=1.0,
                 **kwargs):
    """A Gluon Trainer for mixed precision, ready for the loss scalers.

    It takes ``gluon.Trainer``'s arguments, so ``gluon.Trainer(params, 'sgd', {...})`` becomes
    ``make_trainer(params, 'sgd', {...}, dtype=...)``; the earlier form
    ``make_trainer(params, 'sgd', 'float16', learning_rate=0.1)`` (a dtype name in third place,
    optimizer arguments as keywords) works too.  For a Trainer that scales the loss itself, use
    :class:`mxfp16.Trainer`.

    Parameters
    ----------
    params : ParameterDict
        ``net.collect_params()``.
    optimizer : str or mx.optimizer.Optimizer
        See :func:`make_optimizer`.
    optimizer_params : dict or str, optional
        ``{'learning_rate': 0.1, 'momentum': 0.9, ...}``; ``multi_precision`` may be in it if it
        agrees with the dtype.  A dtype name here is taken as ``dtype``.
    kvstore : str or KVStore
        As for ``gluon.Trainer``: 'device', 'local', 'dist_sync', 'dist_device_sync', ..., or
        :class:`mxfp16.distributed.horovod.Horovod` (rank 0's weights are broadcast here).
    compression_params : dict, optional
        As for ``gluon.Trainer``.
    update_on_kvstore : bool or None
        Must be False (None means False): see Returns.
    dtype : {'float32', 'float16', 'bfloat16'} or None
        None infers it from the parameters (see :func:`training_dtype`).
    loss_scale : float
        Static loss scale to undo in ``rescale_grad``.  Keep 1 when a :mod:`mxfp16.scaling.scalers`
        scaler drives the steps: it unscales itself.
    **kwargs
        More optimizer arguments, merged with ``optimizer_params``.

    Returns
    -------
    gluon.Trainer
        With ``update_on_kvstore=False``: gradients are aggregated first and the update runs on the
        workers, so a loss scaler can check the aggregated gradients and skip a step everywhere.

    Raises
    ------
    ValueError
        For ``update_on_kvstore=True``, and as :func:`make_optimizer` and :func:`training_dtype`.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.Dense(2, in_units=3)
    >>> net.initialize()
    >>> trainer = make_trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
    ...                        dtype='float16')
    >>> trainer.optimizer.multi_precision, trainer.learning_rate
    (True, 0.1)
    """
    if isinstance(optimizer_params, str) or hasattr(optimizer_params, "__name__"):
        dtype, optimizer_params = optimizer_params, None  # the earlier (params, name, dtype) form
    if update_on_kvstore:
        raise ValueError("make_trainer's Trainer updates on the workers (update_on_kvstore=False), "
                         "so that a loss scaler sees the aggregated gradients before the update; "
                         "remove update_on_kvstore=True")
    dtype = training_dtype(params, dtype)
    opt = make_optimizer(optimizer, dtype, loss_scale=loss_scale,
                         **dict(optimizer_params or {}), **kwargs)
    trainer = gluon.Trainer(params, opt, kvstore=kvstore, compression_params=compression_params,
                            update_on_kvstore=False)
    sync_if_horovod(trainer, kvstore)
    return trainer


def check_updates_on_workers(trainer):
    """Raise unless ``trainer`` (its kvstore set up) updates on the workers after aggregation.

    A loss scaler must see the aggregated gradients before the update to skip it everywhere.
    gluon.Trainer updates on its kvstore by default when it has several devices, and then refuses
    ``allreduce_grads()``.

    Raises
    ------
    RuntimeError
        Naming the fix.

    Examples
    --------
    >>> from mxfp16.distributed.kvstore import sync_initial_weights
    >>> net = gluon.nn.Dense(2, in_units=3)
    >>> net.initialize(ctx=[mx.cpu(0), mx.cpu(1)])
    >>> trainer = gluon.Trainer(net.collect_params(), 'sgd')
    >>> sync_initial_weights(trainer)  # sets up its kvstore
    >>> check_updates_on_workers(trainer)
    Traceback (most recent call last):
    ...
    RuntimeError: this gluon.Trainer updates the weights on its kvstore ...
    """
    if mxnet_internals.trainer_updates_on_kvstore(trainer):
        raise RuntimeError(
            "this gluon.Trainer updates the weights on its kvstore (gluon.Trainer's default with "
            "several devices), so a loss scaler cannot check the aggregated gradients before the "
            "update: use mxfp16.Trainer(params, optimizer, optimizer_params, dtype=...) instead, "
            "which scales the loss itself, or mxfp16.make_trainer(...), or create it with "
            "gluon.Trainer(..., update_on_kvstore=False)")


def master_copies(param):
    """The float32 master copies of a float16 Parameter held by its Trainer's optimizer.

    Parameters
    ----------
    param : Parameter

    Returns
    -------
    list of NDArray
        One per device, all equal; empty before the first update, for a parameter that is not
        float16, without a Trainer, or with one that updates on its kvstore.

    Examples
    --------
    >>> from mxnet import autograd
    >>> import mxfp16
    >>> dense = gluon.nn.Dense(2, in_units=3)
    >>> dense.initialize()
    >>> net = mxfp16.cast_block(dense, 'float16')
    >>> trainer = mxfp16.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
    ...                          loss_scale=1)
    >>> with autograd.record():
    ...     loss = net(mx.nd.ones((1, 3))).sum()
    >>> trainer.backward(loss)
    >>> trainer.step(1)
    True
    >>> [copy.dtype.__name__ for copy in master_copies(dense.weight)]
    ['float32']
    """
    trainer = mxnet_internals.param_trainer(param)
    if trainer is None or np.dtype(param.dtype) != np.float16:
        return []
    params = mxnet_internals.trainer_params(trainer)
    index = next((i for i, p in enumerate(params) if p is param), None)
    copies = [master_weight(updater.optimizer, updater.states.get(index))
              for updater in mxnet_internals.trainer_updaters(trainer)]
    return [copy for copy in copies if copy is not None]


def _structure(state):
    """A state's nesting and dtypes, which tell a multi-precision state from a plain one."""
    if isinstance(state, (tuple, list)):
        return tuple(_structure(item) for item in state)
    return state.dtype.__name__ if isinstance(state, mx.nd.NDArray) else type(state).__name__


def _adapted_state(optimizer, index, state, weight):
    """``state`` made to fit ``weight``'s dtype: a float32 master copy added or dropped."""
    probe = mx.nd.zeros((1,) * len(weight.shape), dtype="float32")
    plain = _structure(optimizer.create_state(index, probe))
    at = master_index(optimizer)
    if weight.dtype == np.float16 and optimizer.multi_precision and _structure(state) == plain:
        master = weight.astype("float32")
        return (master, state) if at == 0 else (state, master)
    if weight.dtype != np.float16 and _structure(state) != plain and \
            isinstance(state, (tuple, list)) and len(state) == 2 and \
            _structure(state[1 - at]) == plain:
        return state[1 - at]
    return state


def adapt_states(updater, params):
    """Make an Updater's loaded states fit the current weights' dtypes, in place.

    A float32 run's state of a weight that is float16 now gets a float32 master copy (the weight);
    a float16 run's state of a weight that is float32 now loses its master copy.

    Parameters
    ----------
    updater : mx.optimizer.Updater
        With states just loaded (``Trainer.load_states``).
    params : list of Parameter
        The Trainer's parameters, in its order (the states' keys are their positions).

    Examples
    --------
    >>> updater = mx.optimizer.get_updater(make_optimizer('sgd', 'float16', momentum=0.9))
    >>> weight = gluon.Parameter('w', shape=(2,), dtype='float16')
    >>> weight.initialize()
    >>> updater.states = {0: mx.nd.zeros((2,))}  # a float32 run's momentum
    >>> adapt_states(updater, [weight])
    >>> [array.dtype.__name__ for array in updater.states[0]]  # (momentum, master copy)
    ['float32', 'float32']
    """
    for index, state in list(updater.states.items()):
        weight = _first_array(params[index]) if isinstance(index, int) and \
            0 <= index < len(params) else None
        if weight is not None:
            updater.states[index] = _adapted_state(updater.optimizer, index, state, weight)


def _first_array(param):
    """A Parameter's value on its first device, or None while it waits for initialization."""
    try:
        return param.list_data()[0]
    except (RuntimeError, gluon.parameter.DeferredInitializationError):
        return None
