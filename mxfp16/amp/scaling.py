"""Loss scaling behind ``amp.init_trainer`` / ``scale_loss`` / ``unscale``, on any gluon.Trainer.

gluon.Trainer (MXNet 1.9.1) has one hook for AMP: before each update, ``Trainer._update`` asks
``trainer._amp_loss_scaler.has_overflow(params)`` and skips the update when it says so.  That is
the only attribute ``init_trainer`` sets; the Trainer's methods stay its own, so Horovod's
``DistributedTrainer``, ``allreduce_grads()`` + ``update()`` and ``step()`` all keep working.  The
hook is a :class:`TrainerScaling`, which drives an :class:`mxfp16.LossScaler`: the check covers
every gradient on every device, after aggregation, and the scale is undone through the
optimizer's ``rescale_grad`` (float32 arithmetic inside the update) unless ``unscale`` already
divided the gradients.
"""
import logging

import mxnet as mx
from mxnet import autograd, gluon

from .. import mxnet_internals
from ..scaling import clipping
from ..scaling.overflow import all_finite, flat_trainer_grads, max_magnitude, trainer_grads
from ..overflow_warning import Fixes, OverflowAlarm, trainer_batch
from ..scaling import boundary as boundary_scale
from ..scaling.heads import HeadScaling
from ..scaling.scalers import LossScaleCollapse, LossScaler, make_loss_scaler
from ..master_weights import check_optimizer
from ..optimizers import check_updates_on_workers, rescale_grad, restore_multi_precision
from ..trainer import SCALER_STATE_ATTRIBUTE

log = logging.getLogger(__name__)

#: The fixes the overflow warning gives an ``mxfp16.amp`` script.
AMP_FIXES = Fixes("amp.init(keep_float32={selectors!r})", "amp.init(target_dtype='bfloat16')")


class TrainerScaling:
    """What ``init_trainer`` attaches to a Trainer: its loss scaler and this step's bookkeeping.

    Parameters
    ----------
    trainer : gluon.Trainer
        Any Trainer (``hvd.DistributedTrainer`` too) that updates on the workers.
    scaler : mxfp16.LossScaler
        Float16: a dynamic scaler with the measured ``'auto'`` start; bfloat16: a disabled one.
    dtype : {'float16', 'bfloat16'}
    """

    def __init__(self, trainer, scaler, dtype):
        self.trainer = trainer
        self.scaler = scaler
        self.dtype = dtype
        self.scaled_with = None  # the scale this step's loss was multiplied by
        self.unscaled = False  # unscale() divided this step's gradients already
        self.scale_read = False  # the script read loss_scale since the last update
        self._optimizer = None  # the optimizer last seen: load_states replaces it
        self._heads = HeadScaling("mxfp16.amp", log)
        self.alarm = OverflowAlarm(scaler, "mxfp16.amp", log, AMP_FIXES)
        self._losses = None  # this step's losses, read only if it overflows
        self._adopt_optimizer()

    @property
    def loss_scale(self):
        """The scale the next ``scale_loss`` multiplies by (MXNet AMP's ``LossScaler`` name).

        A script that reads it during a step (GluonNLP's SQuAD script: ``norm_clip = 1.0 * size *
        trainer._amp_loss_scaler.loss_scale``) clips in scaled units, as under MXNet AMP: see
        :meth:`clip_scale`."""
        self.scale_read = True
        return self.scaler.loss_scale

    def clip_scale(self):
        """What the clipping functions of :mod:`mxfp16.scaling.clipping` need to know of this step's
        gradients: None if they are true ones (no scale, or ``unscale`` divided it out), else the
        scale they carry and whether ``max_norm`` is in scaled units (the script read
        :attr:`loss_scale` since the last update)."""
        if not self.scaler.enabled or self.unscaled or self.scaled_with in (None, 1.0):
            return None
        return clipping.HeldScale(self.scaled_with, self.scale_read)

    def _adopt_optimizer(self):
        """Give the Trainer's optimizer (a new one after ``trainer.load_states``) float32 master
        weights and the scaler's state; a loaded one hands the scaler the state it was saved with."""
        optimizer = self.trainer.optimizer
        if optimizer is self._optimizer:
            return
        saved = optimizer.__dict__.get(SCALER_STATE_ATTRIBUTE)
        if self._optimizer is not None and saved is not None:
            self.scaler.load_state_dict(saved)
        if self.dtype == "float16":  # float16 weights: the optimizer must keep float32 copies
            check_optimizer(type(optimizer).__name__, optimizer)
        restore_multi_precision(optimizer, self.dtype)
        self._optimizer = optimizer
        self._publish()

    def _publish(self):
        """Keep the scaler's state on the optimizer, so ``trainer.save_states`` saves it."""
        setattr(self._optimizer, SCALER_STATE_ATTRIBUTE, self.scaler.state_dict())

    def scale(self, loss):
        """The loss (or list of losses) times the loss scale, recorded for this step.

        The first call sets up the Trainer's kvstore (as its first step would) and refuses one
        that would update the weights inside the gradient exchange, before any update."""
        if not mxnet_internals.trainer_kvstore_ready(self.trainer):
            with autograd.pause():
                mxnet_internals.init_trainer_kvstore(self.trainer)
            check_updates_on_workers(self.trainer)
        self._adopt_optimizer()
        clipping.route()  # GluonNLP may have been imported since init_trainer
        heads = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        self._losses = heads
        scale = self.scaler.loss_scale if self.scaler.enabled else 1.0
        how = self._heads.start(heads, mxnet_internals.trainer_params(self.trainer), scale)
        if how == "head":
            self.scaled_with = self.scaler.loss_scale
            return self.scaler.scale(loss)
        self.scaled_with = scale if how == "boundary" else 1.0  # mxfp16.Trainer's rule
        return loss

    def finish_backward(self):
        """After the user's backward (``scale_loss``'s exit): a loss scale that entered at the cast
        networks' boundary leaves it, and the gradients outside them take it."""
        self._heads.finish()

    def unscale(self):
        """Divide this step's gradients, on every device, by the scale of their loss."""
        self.finish_backward()
        if not self.scaler.enabled or self.scaled_with is None:
            return
        if self.unscaled:
            raise RuntimeError("amp.unscale(trainer) was already called since the last step: the "
                               "gradients would be divided by the loss scale twice; call it once "
                               "per step, after backward and before trainer.step/update")
        for grads in trainer_grads(self.trainer):
            for grad in grads:
                grad *= 1.0 / self.scaled_with
        self.unscaled = True

    def has_overflow(self, params):  # noqa: ARG002 - gluon.Trainer's call passes its params
        """gluon.Trainer's hook, called after aggregation and before the update: whether to skip.

        Checks every gradient on every device (one host sync), undoes the loss scale through the
        optimizer's ``rescale_grad``, and moves the scale (halved on overflow; after
        ``growth_interval`` clean steps doubled; the first step measures the ``'auto'`` start).
        """
        self.finish_backward()
        self._adopt_optimizer()
        check_updates_on_workers(self.trainer)
        used = self.scaled_with or 1.0
        scale = 1.0 if self.unscaled else used
        self.scaled_with, self.unscaled, self.scale_read = None, False, False
        if not self.scaler.enabled:
            return False
        grads = flat_trainer_grads(self.trainer)
        finite = all_finite(grads)
        if finite and self.scaler.needs_start:
            self.scaler.start_from(max_magnitude(grads) / scale * self.scaler.loss_scale)
        if finite:
            optimizer = self.trainer.optimizer
            optimizer.rescale_grad = optimizer.rescale_grad * rescale_grad(scale)
        self._update(finite, used)
        self._publish()
        return not finite

    def _update(self, finite, used):
        """The scaler's update, and the early overflow warning told of the step (a collapse
        carries its report); the batch the cast networks kept is let go."""
        try:
            self.scaler.update(finite)
        except LossScaleCollapse as collapse:
            raise self.alarm.collapsed(collapse, self.scaler, used, self._batch) from None
        self.alarm.after_step(self.scaler, used, finite, self._batch, self._losses)
        self._losses = None
        boundary_scale.forget_calls()

    def _batch(self):
        return trainer_batch(mxnet_internals.trainer_params(self.trainer))


def _trainer_of(optimizer_or_trainer, function):
    if isinstance(optimizer_or_trainer, gluon.Trainer):
        return optimizer_or_trainer
    if isinstance(optimizer_or_trainer, mx.optimizer.Optimizer):
        raise TypeError(f"amp.{function} takes the gluon.Trainer, got the optimizer "
                        f"{type(optimizer_or_trainer).__name__}: pass the Trainer (for Module, "
                        "use amp.convert_bucketing_module and mxfp16.module_step)")
    raise TypeError(f"amp.{function} takes a gluon.Trainer, got "
                    f"{type(optimizer_or_trainer).__name__}")


def attach(trainer, dtype, loss_scale=None):
    """Attach a :class:`TrainerScaling` to ``trainer`` (once) and return it."""
    trainer = _trainer_of(trainer, "init_trainer")
    hook = getattr(trainer, "_amp_loss_scaler", None)
    if isinstance(hook, TrainerScaling):
        return hook
    if mxnet_internals.trainer_update_on_kvstore_setting(trainer):
        raise ValueError("amp.init_trainer: this Trainer was created with update_on_kvstore=True, "
                         "which updates the weights inside the gradient exchange, before an "
                         "overflow can skip the step: create it with update_on_kvstore=False, as "
                         "GluonCV's scripts do under --amp")
    scaler = loss_scale if isinstance(loss_scale, LossScaler) else \
        make_loss_scaler(loss_scale, dtype)
    hook = TrainerScaling(trainer, scaler, dtype)
    trainer._amp_loss_scaler = hook  # the attribute gluon.Trainer._update reads
    # The one MXNet AMP's own scale_loss reads too: GluonCV's R-CNN ForwardBackwardTask imports
    # mxnet.contrib.amp itself; its scale_loss then scales by this hook's loss_scale and undoes
    # it through trainer._scale, so has_overflow (which saw no mxfp16 scale_loss) divides by 1.
    trainer._amp_original_scale = mxnet_internals.trainer_scale(trainer)
    clipping.watch(trainer)
    return hook


def hook_of(optimizer_or_trainer, function):
    """The :class:`TrainerScaling` of a Trainer, or the error naming ``amp.init_trainer``."""
    trainer = _trainer_of(optimizer_or_trainer, function)
    hook = getattr(trainer, "_amp_loss_scaler", None)
    if not isinstance(hook, TrainerScaling):
        raise RuntimeError(f"amp.{function}: this Trainer has no mxfp16 loss scaler; call "
                           "amp.init_trainer(trainer) after creating it (with "
                           "`from mxfp16 import amp`)")
    return hook
