"""Gradient clipping for a cast network's gradients: drop-ins for Gluon's and GluonNLP's helpers.

A float16 network's gradients are float16, and float32 where its normalization layers keep float32
parameters.  ``gluon.utils.clip_global_norm`` fails on them on a CPU (its ``dot`` has no float16 CPU
kernel) and on any device when float16 and float32 gradients are mixed; GluonNLP's
``nlp.utils.clip_grad_global_norm`` fails on the mix (``multi_sum_sq`` requires one dtype).  The
functions here take the same arguments and return the same values, and sum the squares in float32.

With :class:`mxfp16.Trainer` the gradients hold the loss scale until ``trainer.allreduce_grads()``
divides it out: clip between that and ``trainer.update(batch_size)``, or call
``trainer.clip_global_norm(max_norm)`` before ``trainer.step``, which compares the unscaled norm.
"""
import math
import warnings

import mxnet as mx

from . import mxnet_internals

__all__ = ["global_norm", "clip_global_norm", "clip_grad_global_norm"]


def _sum_of_squares(array):
    """The sum of squares of an array, in float32."""
    if array.stype != "default":
        return mx.nd.square(array.norm().astype("float32"))
    return mx.nd.sum(mx.nd.square(array.astype("float32", copy=False)))


def global_norm(arrays):
    """The 2-norm of a list of arrays of any float dtypes, accumulated in float32.

    Parameters
    ----------
    arrays : list of NDArray
        float16, bfloat16, float32 or float64, mixed, on any devices.

    Returns
    -------
    NDArray
        Shape (1,), float32, on the first array's device.

    Examples
    --------
    >>> import mxnet as mx
    >>> global_norm([mx.nd.full((4,), 1.5, dtype='float16'), mx.nd.full((1,), 3.0)]).asscalar()
    4.2426405
    """
    if not arrays:
        raise ValueError("global_norm needs at least one array, got an empty list: pass the "
                         "gradients, e.g. [p.grad() for p in net.collect_params().values()]")
    ctx = arrays[0].context
    squares = [_sum_of_squares(array).reshape((1,)).as_in_context(ctx) for array in arrays]
    return mx.nd.sqrt(mx.nd.add_n(*squares))


def clip_global_norm(arrays, max_norm, check_isfinite=True):
    """``gluon.utils.clip_global_norm`` for float16 (and mixed float16/float32) arrays, on CPU too.

    Rescales the arrays in place so that their global 2-norm is at most ``max_norm``, exactly as
    Gluon's (the scale is ``min(1, max_norm / (norm + 1e-8))``).

    Parameters
    ----------
    arrays : list of NDArray
    max_norm : float
    check_isfinite : bool
        As in Gluon: warn if the norm is inf or NaN (a blocking read) and return a float.

    Returns
    -------
    float or NDArray
        The global norm before clipping: a float if ``check_isfinite``, else an NDArray of shape
        (1,).

    Examples
    --------
    >>> import mxnet as mx
    >>> grads = [mx.nd.full((4,), 1.5, dtype='float16'), mx.nd.full((1,), 3.0)]
    >>> round(clip_global_norm(grads, 1.0), 4)
    4.2426
    >>> round(float(global_norm(grads).asscalar()), 3)
    1.0
    """
    total = global_norm(arrays)
    if check_isfinite and not math.isfinite(float(total.asscalar())):
        warnings.warn(UserWarning("nan or inf is detected. Clipping results will be undefined."),
                      stacklevel=2)
    ctx = total.context
    scale = mx.nd.min(mx.nd.concat(max_norm / (total + 1e-8), mx.nd.ones(1, ctx=ctx), dim=0))
    for array in arrays:  # scaled in float32, then rounded once
        factor = scale.as_in_context(array.context)
        array[:] = (array.astype("float32", copy=False) * factor).astype(array.dtype, copy=False)
    return float(total.asscalar()) if check_isfinite else total


def _check_unscaled(params):
    """Raise if a Parameter's Trainer holds loss-scaled gradients now."""
    for param in params:
        trainer = mxnet_internals.param_trainer(param)
        if getattr(trainer, "holds_scaled_gradients", False):
            raise RuntimeError(
                f"the gradients hold the loss scale ({trainer.loss_scale:g}) now, so their norm "
                "is the scaled one: call trainer.allreduce_grads() first (it divides the scale "
                "out), then clip, then trainer.update(batch_size); or call "
                "trainer.clip_global_norm(max_norm) and trainer.step(batch_size)")


def clip_grad_global_norm(parameters, max_norm, check_isfinite=True):
    """``gluonnlp.utils.clip_grad_global_norm`` for a cast network's float16 and float32 gradients.

    Rescales the gradients of ``parameters`` in place so that their global 2-norm is at most
    ``max_norm``, as GluonNLP's does: each parameter counts once (call ``trainer.allreduce_grads()``
    first when there are several devices), and every device's copy is scaled.

    Parameters
    ----------
    parameters : list of Parameter
        ``net.collect_params().values()``; those with ``grad_req='null'`` are left out.
    max_norm : float
    check_isfinite : bool
        Warn if the norm is inf or NaN (a blocking read).

    Returns
    -------
    NDArray
        The global norm before clipping, shape (1,), float32.

    Raises
    ------
    RuntimeError
        If an :class:`mxfp16.Trainer` holds the parameters' gradients still multiplied by the loss
        scale (before its ``allreduce_grads()``), naming the calls to make instead.

    Examples
    --------
    >>> from mxnet import autograd
    >>> from mxnet.gluon import nn
    >>> import mxfp16
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(4, in_units=3), nn.LayerNorm(in_channels=4))
    >>> net.initialize()
    >>> net = mxfp16.cast_block(net, 'float16')
    >>> with autograd.record():
    ...     loss = (net(mx.nd.ones((2, 3))) * mx.nd.arange(4)).sum()
    >>> loss.backward()
    >>> norm = clip_grad_global_norm(net.collect_params().values(), 0.1)
    >>> round(float(global_norm([p.grad() for p in net.collect_params().values()]).asscalar()), 3)
    0.1
    """
    params = [param for param in parameters if param.grad_req != "null"]
    if not params:
        raise ValueError("clip_grad_global_norm found no parameter with a gradient (all have "
                         "grad_req='null'): pass net.collect_params().values()")
    _check_unscaled(params)
    grads = [param.list_grad()[index % len(param.list_grad())]
             for index, param in enumerate(params)]
    total = global_norm(grads)
    if check_isfinite and not math.isfinite(float(total.asscalar())):
        warnings.warn(UserWarning("nan or inf is detected. Clipping results will be undefined."),
                      stacklevel=2)
    ratio = mx.nd.maximum(mx.nd.ones((1,), ctx=total.context), total / max_norm)
    for param in params:
        for grad in param.list_grad():  # divided in float32, then rounded once
            divisor = ratio.as_in_context(grad.context)
            grad[:] = (grad.astype("float32", copy=False) / divisor).astype(grad.dtype, copy=False)
    return total
