"""``from mxfp16 import amp``: MXNet AMP's API (``mxnet.contrib.amp``, MXNet 1.9.1) on mxfp16.

A script written for MXNet AMP ports with one line, ``from mxnet.contrib import amp`` ->
``from mxfp16 import amp``: ``amp.init()``, ``amp.init_trainer(trainer)``, ``with
amp.scale_loss(loss, trainer) as scaled: autograd.backward(scaled)``, ``amp.unscale(trainer)``
and the ``convert_*`` / ``list_*`` functions keep their names and arguments.  Behind them:

* the network a Trainer given to ``init_trainer`` trains is cast by :func:`mxfp16.cast_block` at
  its first call, whether it was built before or after ``init()`` (see :mod:`.session`): float16
  weights with float32 master copies in the optimizer, float32 normalization, float16 emulated
  on a CPU; ``target_dtype='bfloat16'`` trains in bfloat16;
* the loss scale is an :class:`mxfp16.DynamicLossScaler` with the measured ``'auto'`` start, one
  per Trainer; every gradient on every device is checked after aggregation and an overflowing
  step is skipped everywhere (see :mod:`.scaling`); its state rides in ``trainer.save_states``;
* ``amp.reset()`` undoes ``init()``: no state outlives it.

Examples
--------
>>> import mxnet as mx
>>> from mxnet import autograd, gluon
>>> from mxfp16 import amp
>>> amp.init()
>>> net = gluon.nn.HybridSequential()
>>> net.add(gluon.nn.Dense(8, activation='relu'), gluon.nn.Dense(2))
>>> net.initialize()
>>> trainer = gluon.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
...                         update_on_kvstore=False)
>>> amp.init_trainer(trainer)
>>> with autograd.record():
...     loss = gluon.loss.SoftmaxCELoss()(net(mx.nd.ones((4, 3))), mx.nd.zeros(4))
...     with amp.scale_loss(loss, trainer) as scaled_loss:
...         autograd.backward(scaled_loss)
>>> trainer.step(4)
>>> net[0].weight.dtype.__name__, amp.loss_scaler(trainer).num_steps
('float16', 1)
>>> amp.reset()
"""
import contextlib
import logging

from . import session as _session
from .convert import (convert_bucketing_module, convert_hybrid_block, convert_model,
                      convert_symbol)
from .lists import (check_op_lists, list_conditional_fp32_ops, list_fp32_ops,
                    list_loss_output_functions, list_lp16_fp32_ops, list_lp16_ops,
                    list_lp16_use_fp32_params, list_widest_type_cast, target_dtype_name)
from .scaling import attach, hook_of

log = logging.getLogger(__name__)

__all__ = ["init", "reset", "init_trainer", "scale_loss", "unscale", "loss_scaler",
           "convert_symbol", "convert_model", "convert_hybrid_block", "convert_bucketing_module",
           "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops", "list_conditional_fp32_ops",
           "list_widest_type_cast", "list_loss_output_functions", "list_lp16_use_fp32_params"]


def init(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None, layout_optimization=False):
    """Turn mixed precision on for the networks this process trains, as ``amp.init()``.

    Unlike MXNet AMP it may come before or after the network is built: the cast happens at the
    network's first call after ``init_trainer``.

    Parameters
    ----------
    target_dtype : {'float16', 'bfloat16'}
    target_precision_ops, conditional_fp32_ops, fp32_ops : list or None
        MXNet AMP's op-list overrides, checked as MXNet checks them.  Training follows mxfp16's
        rules (each op's dtype is decided on the whole graph); the lists are used by the
        ``convert_*`` functions, which take them as arguments (see the guide's table).
    layout_optimization : bool
        Accepted for MXNet 2's signature; mxfp16 keeps the network's layout.

    Raises
    ------
    ValueError
        For another ``target_dtype``, malformed op lists, or a second ``init`` with another
        dtype (call :func:`reset` first).
    """
    dtype = target_dtype_name(target_dtype)
    lists = check_op_lists(dtype, target_precision_ops, conditional_fp32_ops, fp32_ops)
    active = _session.current()
    if active is not None:
        if active.target_dtype != dtype:
            raise ValueError(f"amp.init(target_dtype={dtype!r}) after amp.init(target_dtype="
                             f"{active.target_dtype!r}): call amp.reset() first")
        return
    if lists:
        log.info("mxfp16.amp: %s are used by convert_symbol/convert_model; training casts by "
                 "mxfp16's rules", ", ".join(sorted(lists)))
    if layout_optimization:
        log.info("mxfp16.amp: layout_optimization=True has no effect; the layout stays as built")
    _session.install(_session.Session(dtype, lists))


def reset():
    """Undo :func:`init`: blocks called afterwards run as built (those cast so far stay cast).

    Examples
    --------
    >>> from mxfp16 import amp
    >>> amp.init(); amp.reset()
    """
    _session.uninstall()


def _active(function):
    active = _session.current()
    if active is None:
        raise RuntimeError(f"amp.{function} before amp.init(): call amp.init() first (before or "
                           "after building the network)")
    return active


def init_trainer(optimizer_or_trainer, loss_scale=None):
    """Give a gluon.Trainer loss scaling and float32 master weights, as ``amp.init_trainer``.

    Parameters
    ----------
    optimizer_or_trainer : gluon.Trainer
        Any Trainer, ``hvd.DistributedTrainer`` included, created with
        ``update_on_kvstore=False`` when it has several devices.
    loss_scale : None, 'dynamic', 'dynamic:N', float or mxfp16.LossScaler
        mxfp16's addition: None is ``'dynamic'`` with the measured start for float16, no
        scaling for bfloat16 (see :func:`mxfp16.make_loss_scaler`).

    Raises
    ------
    TypeError
        For an Optimizer (as MXNet AMP) or anything but a Trainer.
    RuntimeError
        Before :func:`init`.
    ValueError
        For a Trainer created with ``update_on_kvstore=True``.
    """
    active = _active("init_trainer")
    hook = attach(optimizer_or_trainer, active.target_dtype, loss_scale)
    active.add_trainer(hook.trainer)


@contextlib.contextmanager
def scale_loss(loss, optimizer_or_trainer):
    """``with amp.scale_loss(loss, trainer) as scaled_loss: autograd.backward(scaled_loss)``.

    Yields the loss times the Trainer's loss scale, or a list for a list of losses.  A loss whose
    backward ignores the head gradient (``SoftmaxOutput``: GluonCV's segmentation losses) is
    yielded as it is, and its scale enters at the cast network's boundary while the block runs
    (see :meth:`mxfp16.Trainer.backward`).
    """
    hook = hook_of(optimizer_or_trainer, "scale_loss")
    try:
        yield hook.scale(loss)
    finally:
        hook.finish_backward()


def unscale(optimizer_or_trainer):
    """Divide this step's gradients by the loss scale, for code that reads them (clipping).

    Float16 gradients below 2**-24 once unscaled flush to zero; call it once per step, after
    backward and before ``trainer.step`` / ``update``.
    """
    hook_of(optimizer_or_trainer, "unscale").unscale()


def loss_scaler(optimizer_or_trainer):
    """The :class:`mxfp16.LossScaler` of a Trainer given to :func:`init_trainer` (its
    ``loss_scale``, ``num_skipped``, ``state_dict()``); mxfp16's addition to AMP's API."""
    return hook_of(optimizer_or_trainer, "loss_scaler").scaler
