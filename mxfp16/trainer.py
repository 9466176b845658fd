"""``mxfp16.Trainer``: gluon.Trainer for mixed precision, a drop-in that scales the loss itself.

Porting a Gluon script is then a handful of edits: ``gluon.Trainer(...)`` becomes
``mxfp16.Trainer(..., dtype=dtype)``, ``loss.backward()`` becomes ``trainer.backward(loss)``, and
``trainer.step(batch_size)`` stays, skipping the update when a gradient overflowed.  The optimizer
comes from :func:`mxfp16.make_optimizer` (float32 master weights for float16) and the loss scaler
from :func:`mxfp16.make_loss_scaler`; ``save_states`` / ``load_states`` carry the scaler's state in
the same file as the optimizer's.
"""
import logging

import mxnet as mx
from mxnet import autograd, gluon

from . import mxnet_internals
from .estimator import ESTIMATOR_ROUTE, called_by_estimator
from .overflow_warning import OverflowAlarm, trainer_batch
from .scaling import boundary as boundary_scale
from .scaling import clipping
from .distributed.kvstore import sync_if_horovod
from .scaling.heads import HeadScaling
from .scaling.scalers import LossScaleCollapse, LossScaler, make_loss_scaler
from .optimizers import adapt_states, make_optimizer, restore_multi_precision, training_dtype

#: Attribute of the optimizer pickled into a ``.states`` file that carries the loss scaler's
#: state: inside the optimizer, the file stays one ``gluon.Trainer.load_states`` reads.
SCALER_STATE_ATTRIBUTE = "mxfp16_loss_scaler"

log = logging.getLogger(__name__)


class _GluonSteps:
    """A Trainer as the loss scaler drives it, through gluon.Trainer's own methods.

    The scaler calls ``allreduce_grads``, ``update`` and (when disabled) ``step``, which
    :class:`Trainer` overrides to call the scaler: this view breaks that loop.
    """

    def __init__(self, trainer, ignore_stale_grad=False):
        self._trainer = trainer
        self._ignore_stale_grad = ignore_stale_grad

    @property
    def unwrapped(self):
        """The Trainer itself: the scaler keeps one step in progress per Trainer."""
        return self._trainer

    def __getattr__(self, name):
        return getattr(self._trainer, name)

    def allreduce_grads(self):
        gluon.Trainer.allreduce_grads(self._trainer)

    def update(self, batch_size):
        gluon.Trainer.update(self._trainer, batch_size, self._ignore_stale_grad)

    def step(self, batch_size):
        gluon.Trainer.step(self._trainer, batch_size, self._ignore_stale_grad)


def _scaler_for(loss_scale, dtype):
    return loss_scale if isinstance(loss_scale, LossScaler) else make_loss_scaler(loss_scale, dtype)


def _check_update_on_kvstore(update_on_kvstore, scaler):
    """gluon.Trainer's setting, except that a loss scaler needs the update on the workers."""
    if not scaler.enabled:
        return update_on_kvstore
    if update_on_kvstore:
        raise ValueError("update_on_kvstore=True updates the weights inside the gradient exchange, "
                         "before the loss scaler can check the summed gradients for overflow: "
                         "leave update_on_kvstore out (mxfp16.Trainer updates on the workers), or "
                         "turn loss scaling off with loss_scale=1")
    return False


class Trainer(gluon.Trainer):
    """A drop-in for ``gluon.Trainer`` that trains float16 networks: master weights, loss scaling.

    Parameters
    ----------
    params, optimizer, optimizer_params, kvstore, compression_params, update_on_kvstore
        As for ``gluon.Trainer``.  ``kvstore`` may be ``mx.kv.create('horovod')`` (after
        ``import mxfp16.distributed.horovod``) in a horovodrun job: rank 0's weights are broadcast here, and
        gradients are summed over the ranks before the loss scaler checks them.
        ``optimizer_params`` may hold ``multi_precision`` if it agrees with ``dtype`` (GluonCV's
        scripts set it for float16); mxfp16 sets it from ``dtype``.
        ``update_on_kvstore=True`` is refused while the loss is scaled: the scaler must see the
        aggregated gradients before the update.
    dtype : {'float16', 'bfloat16', 'float32'} or None
        The training dtype; None infers it from the parameters (float16 when
        :func:`mxfp16.cast_block` made them so).
    loss_scale : 'dynamic', float, LossScaler or None
        None: ``'dynamic'`` for float16, off for float32 and bfloat16 (see
        :func:`mxfp16.make_loss_scaler`); a number: a static scale (1 turns scaling off); or a
        scaler of your own.

    Notes
    -----
    When a skipped step's loss is inf/NaN, or after three skipped steps in a row at or below a
    safe loss scale, the Trainer runs :func:`mxfp16.find_overflow` once, on the inputs its cast
    networks took in that step (kept by reference until the step ends; nothing is copied, and a
    clean step does no more than before), and logs one warning: the pass that overflowed, the
    culprits and the fix as code (``keep_float32=[...]``, or bfloat16 where the devices run it
    natively).  :attr:`overflow_report` keeps the report, and a later
    :class:`~mxfp16.scaling.scalers.LossScaleCollapse` carries it.  Without the loss function it
    locates forward overflows; call :func:`mxfp16.find_overflow` with ``label`` and ``loss_fn``
    for the backward's.

    Raises
    ------
    ValueError
        For a ``multi_precision`` or ``dtype`` that contradicts the parameters, an unsupported
        optimizer, or ``update_on_kvstore=True`` with loss scaling.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet import autograd
    >>> from mxnet.gluon import nn
    >>> import mxfp16
    >>> net = nn.Dense(2, in_units=4)
    >>> net.initialize()
    >>> net = mxfp16.cast_block(net, 'float16')
    >>> trainer = mxfp16.Trainer(net.collect_params(), 'sgd', {'learning_rate': 0.1},
    ...                          dtype='float16', loss_scale=1024)
    >>> with autograd.record():
    ...     loss = net(mx.nd.ones((8, 4))).sum()
    >>> trainer.backward(loss)  # the loss times 1024
    >>> trainer.step(8), trainer.loss_scale, trainer.num_skipped
    (True, 1024.0, 0)
    """

    def __init__(self, params, optimizer, optimizer_params=None, kvstore="device",
                 compression_params=None, update_on_kvstore=None, *, dtype=None,
                 loss_scale=None):
        dtype = training_dtype(params, dtype)
        self.dtype = dtype
        self.scaler = _scaler_for(loss_scale, dtype)
        self._loss_scaled = False  # trainer.backward / trainer.scale ran since the last update
        self.scaled_with = None  # the loss scale of that backward, which the update divides by
        self._heads = HeadScaling("mxfp16.Trainer", log)
        self._alarm = OverflowAlarm(self.scaler, "mxfp16.Trainer", log)
        self._losses = None  # the losses of the step in progress, read only if it overflows
        optimizer = make_optimizer(optimizer, dtype, **dict(optimizer_params or {}))
        super().__init__(params, optimizer, kvstore=kvstore, compression_params=compression_params,
                         update_on_kvstore=_check_update_on_kvstore(update_on_kvstore,
                                                                    self.scaler))
        sync_if_horovod(self, kvstore)
        # gluon.utils.clip_global_norm / nlp.utils.clip_grad_global_norm on this Trainer's
        # float16 or mixed gradients: mxfp16's drop-ins, or the error naming what to call
        clipping.watch(self)
        clipping.route()

    @property
    def loss_scale(self):
        """The loss scale the next :meth:`backward` multiplies by (1.0 when scaling is off)."""
        return self.scaler.loss_scale

    @property
    def num_steps(self):
        """Steps the loss scaler checked, skipped ones included (none while scaling is off)."""
        return self.scaler.num_steps

    @property
    def num_skipped(self):
        """Steps skipped because a gradient overflowed."""
        return self.scaler.num_skipped

    @property
    def consecutive_skips(self):
        """Skipped steps in a row, up to the last one."""
        return self.scaler.consecutive_skips

    @property
    def holds_scaled_gradients(self):
        """Whether the gradients are multiplied by the loss scale now: after :meth:`backward`,
        until :meth:`allreduce_grads` divides it out or the step ends (:meth:`clip_global_norm`
        clips them scaled).  Not after a backward at scale 1 (the ``'auto'`` start, or a loss that
        ignores its head gradient with no cast network to scale at).  Clipping helpers that
        measure a norm refuse them."""
        return (self.scaler.enabled and self._loss_scaled and self.scaled_with != 1.0
                and not self.scaler.is_unscaled(self))

    def scale(self, loss):
        """The loss (an NDArray or a list) times the loss scale, for code that calls ``backward``
        itself (inside ``autograd.record()``); :meth:`backward` does both.

        A loss whose backward ignores the head gradient (``SoftmaxOutput``, ``MakeLoss``, ...)
        comes back as it is: its scale enters at the cast networks' boundary, from now until the
        next :meth:`backward`, :meth:`scale` or step, which also bring the gradients outside the
        cast networks to the scale (see :meth:`backward`)."""
        heads = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        how = self._start_backward(heads)
        self._loss_scaled, self._losses = True, heads
        if how == "head" and self.scaled_with != 1.0:
            return self.scaler.scale(loss)
        return loss

    def _start_backward(self, heads):
        """How this backward's loss scale reaches the gradients (:class:`HeadScaling`), with
        ``scaled_with`` set to the scale the step will divide by."""
        self.scaler.discard_step(self)
        clipping.route()  # again, in case amp.reset() undid it or GluonNLP came since
        how = self._heads.start(heads, mxnet_internals.trainer_params(self), self.loss_scale)
        self.scaled_with = 1.0 if how == "none" else self.loss_scale
        return how

    def backward(self, losses, retain_graph=False, train_mode=True):
        """``autograd.backward`` of the losses multiplied by the loss scale.

        Replaces ``loss.backward()`` / ``for l in losses: l.backward()``, inside or outside
        ``autograd.record()``: the scale enters as the head gradient, so the gradients are the
        ones ``(loss * scale).backward()`` gives.

        When a loss passes through an op whose backward ignores the head gradient
        (``SoftmaxOutput``, ``MakeLoss``, the ``*RegressionOutput`` ops: GluonCV's segmentation
        losses), found in the recorded graph, the scale enters at the boundary of the cast
        networks (:mod:`mxfp16.scaling.boundary`) instead: each multiplies the gradient of its
        outputs by it, and the gradients of parameters outside them are multiplied after the
        backward; the step divides by the scale as for any loss.  Without a cast network on the
        way (one cast with ``net.cast``), or with the op inside a cast network's graph, the
        backward runs unscaled and the step divides by 1: float32's update, with float16
        gradients below 2**-24 flushed to zero (logged once, with what to do).

        Parameters
        ----------
        losses : NDArray or list of NDArray
            One loss per device, as ``split_and_load`` gives them.
        retain_graph, train_mode : bool
            As for ``NDArray.backward``.
        """
        heads = list(losses) if isinstance(losses, (list, tuple)) else [losses]
        how = self._start_backward(heads)
        scale = self.scaled_with
        head_grads = None if how != "head" or scale == 1.0 else \
            [mx.nd.full(head.shape, scale, ctx=head.context, dtype=head.dtype) for head in heads]
        try:
            autograd.backward(heads, head_grads=head_grads, retain_graph=retain_graph,
                              train_mode=train_mode)
        finally:
            self._heads.finish()
        self._loss_scaled, self._losses = True, heads

    def _steps(self, ignore_stale_grad=False):
        """This Trainer as the scaler drives it, once the step's loss was scaled."""
        self._heads.finish()  # after trainer.scale(loss) and the user's backward
        if self.scaler.enabled and not self._loss_scaled:
            fix = ESTIMATOR_ROUTE if called_by_estimator() else (
                "replace `loss.backward()` or `for l in loss: l.backward()` with "
                "`trainer.backward(loss)`")
            raise RuntimeError(
                "the gradients did not come from trainer.backward(loss): with loss scaling on "
                f"(scale {self.loss_scale:g}), loss.backward() leaves them unscaled and the step "
                f"would divide them by the scale; {fix}")
        return _GluonSteps(self, ignore_stale_grad)

    def _scaled_step(self, batch_size, ignore_stale_grad):
        """The scaler's step; on overflow the early warning (:mod:`mxfp16.overflow_warning`) is
        told, and a collapse carries its report.  The batch the cast networks kept is let go."""
        steps = self._steps(ignore_stale_grad)
        used = self.loss_scale if self.scaled_with is None else self.scaled_with
        try:
            updated = self.scaler.step(steps, batch_size)
        except LossScaleCollapse as collapse:
            raise self._alarm.collapsed(collapse, self.scaler, used, self._batch) from None
        finally:
            self._loss_scaled, self.scaled_with = False, None
        self._alarm.after_step(self.scaler, used, updated, self._batch, self._losses)
        self._losses = None
        boundary_scale.forget_calls()
        return updated

    def _batch(self):
        return trainer_batch(mxnet_internals.trainer_params(self))

    @property
    def overflow_report(self):
        """The overflow report (:func:`mxfp16.find_overflow`) of the batch at hand when the
        early warning fired (a skipped step whose loss was inf/NaN, or a few skipped steps in a row
        at a safe scale), else None."""
        return self._alarm.report

    def step(self, batch_size, ignore_stale_grad=False):
        """Aggregate, check every gradient on every device, and update unless one overflowed.

        Parameters
        ----------
        batch_size, ignore_stale_grad
            As for ``gluon.Trainer.step``.

        Returns
        -------
        bool
            True if the weights were updated; False if the step was skipped (weights and optimizer
            state untouched on every device) and the dynamic scale backed off.
        """
        return self._scaled_step(batch_size, ignore_stale_grad)

    def allreduce_grads(self):
        """Aggregate the gradients across devices, as in Gluon, and divide them by the loss scale,
        so that code between this and :meth:`update` (``gluon.utils.clip_global_norm``) sees the
        true gradients.  Gradients below float16's smallest value (2**-24) flush to zero on the
        way: :meth:`clip_global_norm` clips without that loss."""
        if self.scaler.enabled:
            self.scaler.unscale(self._steps())
        else:
            super().allreduce_grads()

    def update(self, batch_size, ignore_stale_grad=False):
        """Update after :meth:`allreduce_grads` (aggregating first if it was not called), unless a
        gradient overflowed; return whether the update ran (see :meth:`step`)."""
        if not self.scaler.enabled:
            super().update(batch_size, ignore_stale_grad)
            return True
        return self._scaled_step(batch_size, ignore_stale_grad)

    def clip_global_norm(self, max_norm):
        """Aggregate the gradients and clip their global norm, measured unscaled, to ``max_norm``.

        Call between :meth:`backward` and :meth:`step`.  Returns the unscaled global norm (inf or
        NaN when a gradient overflowed: nothing is clipped and ``step`` skips).
        """
        return self.scaler.clip_global_norm(self._steps(), max_norm)

    def save_states(self, fname):
        """Save the optimizer state (master weights, momenta, update count) and the loss
        scaler's state, in gluon.Trainer's format (``gluon.Trainer.load_states`` reads it)."""
        optimizer = self.optimizer
        setattr(optimizer, SCALER_STATE_ATTRIBUTE, self.scaler.state_dict())
        try:
            super().save_states(fname)
        finally:
            delattr(optimizer, SCALER_STATE_ATTRIBUTE)

    def load_states(self, fname):
        """Load what :meth:`save_states` or ``gluon.Trainer.save_states`` wrote.

        A file from gluon.Trainer has no scaler state (the scaler keeps its own).  The states are
        fitted to the weights' dtypes: resuming a float32 run in float16 gives each float16 weight
        a float32 master copy (the weight itself), and the reverse drops it.
        """
        super().load_states(fname)
        optimizer = self.optimizer
        scaler_state = optimizer.__dict__.pop(SCALER_STATE_ATTRIBUTE, None)
        if scaler_state is not None:
            self.scaler.load_state_dict(scaler_state)
        restore_multi_precision(optimizer, self.dtype)
        params = mxnet_internals.trainer_params(self)
        for updater in mxnet_internals.trainer_updaters(self):
            adapt_states(updater, params)
