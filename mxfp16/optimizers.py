"""Optimizers for mixed precision: float32 master weights (``multi_precision``) and ``rescale_grad``.

This is the only module that sets ``multi_precision`` and the only one that computes ``rescale_grad``.
"""
import mxnet as mx
from mxnet import gluon

from .dtypes import LOW_PRECISION_DTYPES, check_dtype

#: MXNet optimizers that keep a float32 master copy of float16 weights with ``multi_precision=True``
#: (SGD, NAG, LARS through their own fused kernels; the others through the base Optimizer's
#: master-copy path), each checked by tests/test_optimizers.py.  Left out: 'lamb', whose
#: multi-precision kernel in MXNet 1.9.1 never writes its float32 copy back (updates below float16
#: resolution are lost, as without multi_precision); 'ccsgd', a deprecated alias; 'test', a fixture.
MULTI_PRECISION_OPTIMIZERS = (
    "sgd", "nag", "lars", "lbsgd", "signum", "adam", "nadam", "adamax", "adagrad",
    "groupadagrad", "adadelta", "rmsprop", "ftml", "ftrl", "dcasgd", "sgld",
)


def check_optimizer(name):
    """Return the lower-case optimizer name, or raise ``ValueError`` naming the supported ones."""
    key = str(name).lower()
    if key not in MULTI_PRECISION_OPTIMIZERS:
        raise ValueError(f"unknown or unsupported optimizer {name!r}: mixed precision needs one with "
                         f"float32 master weights: {', '.join(MULTI_PRECISION_OPTIMIZERS)}")
    return key


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


def make_optimizer(name, dtype, loss_scale=1.0, batch_size=None, **kwargs):
    """Create an MXNet optimizer configured for training in ``dtype``.

    Parameters
    ----------
    name : str
        One of :data:`MULTI_PRECISION_OPTIMIZERS` (``'sgd'``, ``'adam'``, ...).
    dtype : {'float32', 'float16', 'bfloat16'}
        The training dtype.  float16 and bfloat16 get ``multi_precision=True``: the optimizer keeps a
        float32 master copy of each low-precision weight, updates it, and copies it back rounded.
    loss_scale : float
        A static loss scale to undo through ``rescale_grad`` (1 for none, or when a loss scaler
        unscales).
    batch_size : int or None
        Fold ``1/batch_size`` into ``rescale_grad`` too, as ``mx.mod.Module`` expects; leave None for a
        Gluon Trainer, which divides by the batch size in ``step``.
    **kwargs
        Optimizer arguments (``learning_rate``, ``momentum``, ``wd``, ``lr_scheduler``, ...).
        ``multi_precision`` and ``rescale_grad`` are set here and may not be passed.

    Returns
    -------
    mx.optimizer.Optimizer

    Raises
    ------
    ValueError
        For an unsupported optimizer or dtype, or a conflicting keyword.

    Examples
    --------
    >>> opt = make_optimizer('sgd', 'float16', loss_scale=128, batch_size=32, learning_rate=0.1)
    >>> opt.multi_precision, opt.rescale_grad
    (True, 0.000244140625)
    """
    name = check_optimizer(name)
    dtype = check_dtype(dtype)
    for key in ("multi_precision", "rescale_grad"):
        if key in kwargs:
            raise ValueError(f"make_optimizer sets {key} itself; remove {key}={kwargs[key]!r} "
                             "(pass loss_scale= and batch_size= instead)")
    return mx.optimizer.create(name, multi_precision=dtype in LOW_PRECISION_DTYPES,
                               rescale_grad=rescale_grad(loss_scale, batch_size), **kwargs)


def make_trainer(params, optimizer, dtype, loss_scale=1.0, kvstore="device", **optimizer_params):
    """A Gluon Trainer for mixed precision, ready for the loss scalers.

    Parameters
    ----------
    params : ParameterDict
        ``net.collect_params()``.
    optimizer : str
        The optimizer name (see :func:`make_optimizer`).
    dtype : {'float32', 'float16', 'bfloat16'}
    loss_scale : float
        Static loss scale to undo in ``rescale_grad``.  Keep 1 when a :mod:`mxfp16.loss_scaling`
        scaler drives the steps: it unscales itself.
    kvstore : str or KVStore
        As for ``gluon.Trainer``: 'device', 'local', 'dist_sync', 'dist_device_sync', ...
    **optimizer_params
        ``learning_rate``, ``momentum``, ``wd``, ...

    Returns
    -------
    gluon.Trainer
        With ``update_on_kvstore=False``: gradients are aggregated first and the update runs on the
        workers, so a loss scaler can check the aggregated gradients and skip a step everywhere.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.Dense(2, in_units=3)
    >>> net.initialize()
    >>> trainer = make_trainer(net.collect_params(), 'sgd', 'float16', learning_rate=0.1)
    >>> trainer.optimizer.multi_precision
    True
    """
    opt = make_optimizer(optimizer, dtype, loss_scale=loss_scale, **optimizer_params)
    return gluon.Trainer(params, opt, kvstore=kvstore, update_on_kvstore=False)
