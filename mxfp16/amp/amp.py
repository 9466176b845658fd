"""``mxfp16.amp.amp``: the module behind ``from mxfp16 import amp``, under the name MXNet gives it.

GluonNLP 0.10's BERT scripts import MXNet AMP as ``from mxnet.contrib.amp import amp`` (the module
``mxnet/contrib/amp/amp.py``); ``from mxfp16.amp import amp`` is the same one-line port.  The
functions live here and :mod:`mxfp16.amp` re-exports them, as MXNet's package does.

Examples
--------
>>> from mxfp16 import amp as package
>>> from mxfp16.amp import amp
>>> amp.init is package.init and amp.scale_loss is package.scale_loss
True
"""
import contextlib
import logging

from ..casting.selectors import selector_list
from ..scaling import clipping as _clipping
from . import lists  # noqa: F401  (amp.lists.symbol_fp16, as MXNet's amp module has it)
from . import session as _session
from .convert import (convert_bucketing_module, convert_hybrid_block, convert_model,
                      convert_symbol)
from .lists import BFLOAT16 as bfloat16  # noqa: F401  (MXNet's amp.bfloat16)
from .lists import (check_op_lists, list_conditional_fp32_ops, list_fp32_ops,
                    list_loss_output_functions, list_lp16_fp32_ops, list_lp16_ops,
                    list_lp16_use_fp32_params, list_widest_type_cast, lists_extended,
                    target_dtype_name)
from .scaling import attach, hook_of

log = logging.getLogger(__name__)

__all__ = ["init", "reset", "init_trainer", "scale_loss", "unscale", "loss_scaler",
           "convert_symbol", "convert_model", "convert_hybrid_block", "convert_bucketing_module",
           "list_lp16_ops", "list_fp32_ops", "list_lp16_fp32_ops", "list_conditional_fp32_ops",
           "list_widest_type_cast", "list_loss_output_functions", "list_lp16_use_fp32_params"]


def init(target_dtype="float16", target_precision_ops=None, conditional_fp32_ops=None,
         fp32_ops=None, layout_optimization=False, *, keep_float32=None):
    """Turn mixed precision on for the networks this process trains, as ``amp.init()``.

    Unlike MXNet AMP it may come before or after the network is built: the cast happens at the
    network's first call after ``init_trainer``.  It also routes ``gluon.utils.clip_global_norm``
    and ``gluonnlp.utils.clip_grad_global_norm`` through :mod:`mxfp16.scaling.clipping` (float16 and
    mixed gradients; the true norm compared with ``max_norm`` while the gradients hold the loss
    scale, unless the script read ``trainer._amp_loss_scaler.loss_scale`` in the step); float32
    calls still reach the originals, and :func:`reset` restores them.

    Parameters
    ----------
    target_dtype : {'float16', 'bfloat16'}
    target_precision_ops, conditional_fp32_ops, fp32_ops : list or None
        MXNet AMP's op-list overrides, checked as MXNet checks them.  Training follows mxfp16's
        rules (each op's dtype is decided on the whole graph), and keeps the ops of ``fp32_ops``
        in float32 too, as MXNet AMP runs them (in addition to what mxfp16's rules keep
        float32, where MXNet's list replaces its own); the lists are used by the ``convert_*``
        functions, which take them as arguments (see docs/amp.md's table).
    layout_optimization : bool
        Accepted for MXNet 2's signature; mxfp16 keeps the network's layout.
    keep_float32 : selector or list of selectors, optional
        mxfp16's addition, where MXNet AMP has nothing per block: the blocks every network cast
        keeps in float32, as :func:`mxfp16.cast_block`'s ``keep_float32`` (block paths such as
        ``'encoder.*.attention'``, Gluon names, Block subclasses, Blocks).  With several
        networks, a Block applies to the network it is in; a string or class must match in each
        network cast, else that network's first call raises one ``ValueError`` naming it and
        the nearest paths.

    Raises
    ------
    ValueError
        For another ``target_dtype``, malformed op lists, or a second ``init`` with another
        dtype (call :func:`reset` first).
    TypeError
        For a ``keep_float32`` selector of another kind.
    """
    dtype = target_dtype_name(target_dtype)
    op_lists = check_op_lists(dtype, target_precision_ops, conditional_fp32_ops, fp32_ops)
    keep = selector_list(keep_float32) if keep_float32 is not None else []
    active = _session.current()
    if active is not None:
        if active.target_dtype != dtype:
            raise ValueError(f"amp.init(target_dtype={dtype!r}) after amp.init(target_dtype="
                             f"{active.target_dtype!r}): call amp.reset() first")
        return
    if op_lists or lists_extended(dtype):
        log.info("mxfp16.amp: the op lists (%s) are used by the convert_* functions; training "
                 "casts by mxfp16's rules (mxfp16/casting/rules.py)%s",
                 ", ".join(sorted(op_lists)) or "extended",
                 ", with the ops of fp32_ops in float32" if op_lists.get("fp32_ops") else "")
    if layout_optimization:
        log.info("mxfp16.amp: layout_optimization=True has no effect; the layout stays as built")
    _session.install(_session.Session(dtype, op_lists, keep))
    _clipping.route()


def reset():
    """Undo :func:`init`: blocks called afterwards run as built (those cast so far stay cast),
    and Gluon's and GluonNLP's clipping functions are the originals again.

    Examples
    --------
    >>> from mxfp16 import amp
    >>> amp.init(); amp.reset()
    """
    _session.uninstall()
    _clipping.unroute()


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
    _clipping.route()  # GluonNLP may have been imported since init()


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
