"""Gradient clipping for a cast network's gradients: drop-ins for Gluon's and GluonNLP's helpers.

A float16 network's gradients are float16, and float32 where its normalization layers keep float32
parameters.  ``gluon.utils.clip_global_norm`` fails on them on a CPU (its ``dot`` has no float16 CPU
kernel) and on any device when float16 and float32 gradients are mixed; GluonNLP's
``nlp.utils.clip_grad_global_norm`` fails on the mix (``multi_sum_sq`` requires one dtype).  The
functions here take the same arguments and return the same values, and sum the squares in float32.

With :class:`mxfp16.Trainer` the gradients hold the loss scale until ``trainer.allreduce_grads()``
divides it out: clip between that and ``trainer.update(batch_size)``, or call
``trainer.clip_global_norm(max_norm)`` before ``trainer.step``, which compares the unscaled norm.
Clipping them while they are scaled raises an error naming those calls.

With ``mxfp16.amp`` the gradients stay scaled until the step (MXNet AMP's convention) and the
functions follow MXNet issue #15738's fix: the norm compared with ``max_norm`` is the true
(unscaled) one, unless the script read ``trainer._amp_loss_scaler.loss_scale`` during the step
(GluonNLP's SQuAD script multiplies its threshold by it), in which case ``max_norm`` is in scaled
units as under MXNet AMP; either way the gradients stay scaled, and an inf or NaN norm leaves them
as they are for the step's overflow check.  :func:`route` makes the unchanged
``gluon.utils.clip_global_norm`` and ``gluonnlp.utils.clip_grad_global_norm`` do all this; what
the originals handle (float32 gradients that hold no loss scale) still goes to them.
"""
import functools
import math
import sys
import warnings
import weakref
from typing import NamedTuple

import mxnet as mx
import numpy as np

from .. import mxnet_internals
from ..numpy_interface import is_numpy, legacy, like

__all__ = ["global_norm", "clip_global_norm", "clip_grad_global_norm", "HeldScale", "watch",
           "route", "unroute"]


class HeldScale(NamedTuple):
    """The loss scale a Trainer's gradients still carry while a clipping function reads them."""

    scale: float
    #: True: ``max_norm`` is in the scaled gradients' units (the script multiplied it by the scale).
    threshold_scaled: bool


_watched = weakref.WeakSet()  # Trainers whose gradients may hold a loss scale
_originals = {}  # (module name, attribute) -> the library's function, while routed
_routed = {}  # original function -> its routed replacement (one per function)


def watch(trainer):
    """Have the clipping functions ask ``trainer`` whether its gradients hold a loss scale.

    ``trainer`` is an :class:`mxfp16.Trainer` (``holds_scaled_gradients``: refused) or a
    gluon.Trainer whose ``_amp_loss_scaler`` has ``clip_scale()`` (``mxfp16.amp``'s hook, which
    returns a :class:`HeldScale` or None).
    """
    _watched.add(trainer)


def _held(trainer):
    """``'refuse'``, a :class:`HeldScale` or None: what ``trainer``'s gradients hold now."""
    if trainer is None:
        return None
    if getattr(trainer, "holds_scaled_gradients", False):
        return "refuse"
    clip_scale = getattr(getattr(trainer, "_amp_loss_scaler", None), "clip_scale", None)
    return clip_scale() if callable(clip_scale) else None


def _one_scale(held):
    """The one :class:`HeldScale` of a clipping call's gradients (None: they hold none), from
    ``(trainer, state)`` per gradient; raise if an mxfp16.Trainer holds them scaled, or if they
    hold different scales."""
    for trainer, state in held:
        if state == "refuse":
            raise RuntimeError(
                f"the gradients hold the loss scale ({trainer.loss_scale:g}) now, so their norm "
                "is the scaled one: call trainer.allreduce_grads() first (it divides the scale "
                "out), then clip, then trainer.update(batch_size); or call "
                "trainer.clip_global_norm(max_norm) and trainer.step(batch_size)")
    states = {state for _, state in held}
    if len(states) > 1:
        scales = sorted(1.0 if state is None else state.scale for state in states)
        raise RuntimeError(f"the gradients to clip hold different loss scales {scales}: call "
                           "amp.unscale(trainer) for each Trainer first, then clip them together")
    return states.pop() if states else None


def _arrays_scale(arrays):
    """The :class:`HeldScale` of ``arrays`` (gradients), from the watched Trainers they belong to."""
    owners = {}
    for trainer in list(_watched):
        state = _held(trainer)
        if state is not None:  # the arrays themselves, not views: the caller's own handles
            owners.update((grad.handle.value, (trainer, state))
                          for param in mxnet_internals.trainer_params(trainer)
                          if param.grad_req != "null" for grad in param.list_grad())
    if not owners:
        return None
    return _one_scale([owners.get(array.handle.value, (None, None)) for array in arrays])


def _params_scale(params):
    """The :class:`HeldScale` of the gradients of ``params``, from each one's Trainer."""
    trainers = {mxnet_internals.param_trainer(param) for param in params}
    return _one_scale([(trainer, _held(trainer)) for trainer in trainers])


def _accumulation_dtype(arrays):
    return "float64" if any(array.dtype == np.float64 for array in arrays) else "float32"


def _sum_of_squares(array, dtype):
    """The sum of squares of an array, in ``dtype``."""
    if array.stype != "default":
        return mx.nd.square(array.norm().astype(dtype))
    return mx.nd.sum(mx.nd.square(array.astype(dtype, copy=False)))


def global_norm(arrays):
    """The 2-norm of a list of arrays of any float dtypes, accumulated in float32 (or float64).

    Parameters
    ----------
    arrays : list of NDArray
        float16, bfloat16, float32 or float64, mixed, on any devices.

    Returns
    -------
    NDArray
        Shape (1,), float32 (float64 if an array is float64), on the first array's device.

    Examples
    --------
    >>> import mxnet as mx
    >>> global_norm([mx.nd.full((4,), 1.5, dtype='float16'), mx.nd.full((1,), 3.0)]).asscalar()
    4.2426405
    """
    if not arrays:
        raise ValueError("global_norm needs at least one array, got an empty list: pass the "
                         "gradients, e.g. [p.grad() for p in net.collect_params().values()]")
    ctx, dtype = arrays[0].context, _accumulation_dtype(arrays)
    squares = [_sum_of_squares(legacy(array), dtype).reshape((1,)).as_in_context(ctx)
               for array in arrays]
    return like(mx.nd.sqrt(mx.nd.add_n(*squares)), arrays[0])


def _compared_norm(total, held, check_isfinite):
    """The norm ``max_norm`` is compared with: the true one, unless the gradients hold a scale
    and the threshold was scaled with them; the original's warning for an inf or NaN norm."""
    norm = total if held is None or held.threshold_scaled else total / held.scale
    # with a loss scale held, an inf or NaN is an overflow the step's check skips: no warning
    if held is None and check_isfinite and not math.isfinite(float(total.asscalar())):
        warnings.warn(UserWarning("nan or inf is detected. Clipping results will be undefined."),
                      stacklevel=3)
    return norm


def _multiply(arrays, factor, norm, held):
    """Multiply each array in place by ``factor`` (shape (1,)), in float32, rounded once; with a
    loss scale held, an inf or NaN norm leaves them as they are for the step's overflow check."""
    if held is not None:
        factor = mx.nd.where(mx.nd.contrib.isfinite(norm), factor, mx.nd.ones_like(factor))
    dtype = _accumulation_dtype(arrays)
    for array in arrays:
        scaled = array.astype(dtype, copy=False) * factor.as_in_context(array.context)
        array[:] = scaled.astype(array.dtype, copy=False)


def clip_global_norm(arrays, max_norm, check_isfinite=True):
    """``gluon.utils.clip_global_norm`` for float16 (and mixed float16/float32) arrays, on CPU too.

    Rescales the arrays in place so that their global 2-norm is at most ``max_norm``, exactly as
    Gluon's (the scale is ``min(1, max_norm / (norm + 1e-8))``).  Gradients an ``mxfp16.amp``
    Trainer holds scaled are clipped by their true norm and stay scaled (see the module's text).

    Parameters
    ----------
    arrays : list of NDArray
    max_norm : float
    check_isfinite : bool
        As in Gluon: warn if the norm is inf or NaN (a blocking read) and return a float.

    Returns
    -------
    float or NDArray
        The global norm before clipping, in ``max_norm``'s units: a float if ``check_isfinite``,
        else an NDArray of shape (1,).

    Raises
    ------
    RuntimeError
        If an :class:`mxfp16.Trainer` holds the gradients still multiplied by the loss scale
        (before its ``allreduce_grads()``), naming the calls to make instead.

    Examples
    --------
    >>> import mxnet as mx
    >>> grads = [mx.nd.full((4,), 1.5, dtype='float16'), mx.nd.full((1,), 3.0)]
    >>> round(clip_global_norm(grads, 1.0), 4)
    4.2426
    >>> round(float(global_norm(grads).asscalar()), 3)
    1.0
    """
    return _clip_arrays(arrays, max_norm, check_isfinite, _arrays_scale(arrays))


def _clip_arrays(arrays, max_norm, check_isfinite, held):
    """Clip ``arrays`` (``mx.np.ndarray`` through legacy views: the same memory); the norm as
    Gluon returns it (an ``mx.np.ndarray`` for numpy arrays when not a float)."""
    template = arrays[0] if arrays else None
    arrays = [legacy(array) for array in arrays]
    total = global_norm(arrays)
    norm = _compared_norm(total, held, check_isfinite)
    ones = mx.nd.ones(1, ctx=norm.context, dtype=norm.dtype)
    _multiply(arrays, mx.nd.min(mx.nd.concat(max_norm / (norm + 1e-8), ones, dim=0)), norm, held)
    return float(norm.asscalar()) if check_isfinite else like(norm, template)


def clip_grad_global_norm(parameters, max_norm, check_isfinite=True):
    """``gluonnlp.utils.clip_grad_global_norm`` for a cast network's float16 and float32 gradients.

    Rescales the gradients of ``parameters`` in place so that their global 2-norm is at most
    ``max_norm``, as GluonNLP's does: each parameter counts once (call ``trainer.allreduce_grads()``
    first when there are several devices), and every device's copy is scaled.  Gradients an
    ``mxfp16.amp`` Trainer holds scaled are clipped by their true norm and stay scaled (see the
    module's text).

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
        The global norm before clipping, in ``max_norm``'s units, shape (1,), float32.

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
    return _clip_params(params, max_norm, check_isfinite, _params_scale(params))


def _clip_params(params, max_norm, check_isfinite, held):
    grads = [legacy(param.list_grad()[index % len(param.list_grad())])
             for index, param in enumerate(params)]
    total = global_norm(grads)
    norm = _compared_norm(total, held, check_isfinite)
    ratio = mx.nd.maximum(mx.nd.ones((1,), ctx=norm.context, dtype=norm.dtype), norm / max_norm)
    _multiply([legacy(grad) for param in params for grad in param.list_grad()], 1 / ratio, norm,
              held)
    return norm


def _originals_handle(grads):
    """Whether Gluon's and GluonNLP's own functions handle these gradients: all float32 legacy
    NDArrays (they fail on float16 on a CPU, on mixed dtypes and, concatenating a float32 one, on
    float64; and MXNet 1.9.1's ``clip_global_norm`` calls legacy operators on the NumPy
    interface's arrays)."""
    return all(grad.dtype == np.float32 and not is_numpy(grad) for grad in grads)


def _routed_gluon(original):
    @functools.wraps(original)
    def clip_global_norm(arrays, max_norm, check_isfinite=True):
        arrays = list(arrays)
        held = _arrays_scale(arrays)
        if held is None and _originals_handle(arrays):
            return original(arrays, max_norm, check_isfinite)
        return _clip_arrays(arrays, max_norm, check_isfinite, held)
    return clip_global_norm


def _routed_gluonnlp(original):
    @functools.wraps(original)
    def clip_grad_global_norm(parameters, max_norm, check_isfinite=True):
        parameters = list(parameters)
        params = [param for param in parameters if param.grad_req != "null"]
        held = _params_scale(params)
        if held is None and _originals_handle([g for p in params for g in p.list_grad()]):
            return original(parameters, max_norm, check_isfinite)
        return _clip_params(params, max_norm, check_isfinite, held)
    return clip_grad_global_norm


#: (module, function, maker of its routed replacement): what :func:`route` replaces.
_TARGETS = (("mxnet.gluon.utils", "clip_global_norm", _routed_gluon),
            ("gluonnlp.utils", "clip_grad_global_norm", _routed_gluonnlp),
            ("gluonnlp.utils.parameter", "clip_grad_global_norm", _routed_gluonnlp))


def route():
    """Send the unchanged ``mxnet.gluon.utils.clip_global_norm`` and
    ``gluonnlp.utils.clip_grad_global_norm`` through this module when the originals cannot serve.

    Float32 gradients that hold no loss scale still go to the originals (same results); float16,
    bfloat16, float64 or mixed ones go to :func:`clip_global_norm` / :func:`clip_grad_global_norm`,
    as do gradients a watched Trainer holds scaled (see the module's text).  GluonNLP is routed
    only if imported: call again after importing it (``amp.init_trainer``, each
    ``amp.scale_loss`` and each :class:`mxfp16.Trainer` do).  :func:`unroute` puts the originals
    back.

    Examples
    --------
    >>> from mxnet import gluon
    >>> unroute()  # nothing to undo unless an mxfp16.Trainer or amp.init() routed them
    >>> original = gluon.utils.clip_global_norm
    >>> route()
    >>> gluon.utils.clip_global_norm.__wrapped__ is original
    True
    >>> unroute()
    >>> gluon.utils.clip_global_norm is original
    True
    """
    for module_name, name, make_routed in _TARGETS:
        module = sys.modules.get(module_name)
        if module is None or (module_name, name) in _originals:
            continue
        original = getattr(module, name)
        if original not in _routed:
            _routed[original] = make_routed(original)
        _originals[(module_name, name)] = original
        setattr(module, name, _routed[original])


def unroute():
    """Put back the functions :func:`route` replaced, exactly (the same objects)."""
    for (module_name, name), original in _originals.items():
        setattr(sys.modules[module_name], name, original)
    _originals.clear()
