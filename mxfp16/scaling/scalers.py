"""Loss scaling, static and dynamic, for Gluon Trainers (and through :mod:`mxfp16.module`, Modules).

A scaler owns the whole sequence: ``scale(loss)`` -> backward -> optional ``clip_global_norm`` or
``unscale`` -> ``step`` (aggregate, check every gradient for inf/NaN, skip or update with the scale
undone through ``rescale_grad``) -> scale update.  With ``enabled=False`` every method passes
through, so a training loop needs no ``if float16:`` branches.

A dynamic scaler started with ``init_scale='auto'`` takes its first step at scale 1, measures the
largest aggregated gradient, and starts at :func:`recommend_loss_scale` of it, the same rule the
report's recommendation follows; then it grows and backs off as usual.
"""
import math

import mxnet as mx

from .. import mxnet_internals
from .overflow import all_finite, flat_trainer_grads, max_magnitude, trainer_grads
from ..distributed.kvstore import sync_initial_weights
from .heads import visible_head_ignoring_ops
# recommend_loss_scale and its constants live with the settings; they are imported from here too.
from .settings import (CLASSIC_INIT_SCALE, DEFAULT_HEADROOM, FLOAT16_MAX,  # noqa: F401
                       MAX_LOSS_SCALE, MIN_LOSS_SCALE, check_dynamic_settings, check_positive,
                       check_whole, is_auto, parse_loss_scale, recommend_loss_scale, scale_text)
from ..optimizers import check_updates_on_workers


class LossScaleCollapse(RuntimeError):
    """Raised when steps keep overflowing at the minimum loss scale: training cannot recover.

    ``report`` is the overflow report of the batch at hand (:func:`mxfp16.find_overflow`) where
    the Trainer, ``mxfp16.amp``, :func:`mxfp16.module_step` or the scripts located the overflow,
    whose warning then ends the message; None where nothing located it.
    """

    def __init__(self, message, report=None):
        super().__init__(message)
        self.report = report


def _first_step_setup(trainer):
    """Before a Trainer's first gradient exchange, give every worker rank 0's weights.

    Left to the Trainer, a distributed kvstore may hand a worker the first summed gradients as its
    weights (see :func:`mxfp16.distributed.kvstore.sync_initial_weights`).
    """
    if not mxnet_internals.trainer_kvstore_ready(trainer):
        sync_initial_weights(trainer)


class _PendingStep:
    """What a scaler knows of one Trainer's step between its backward and its update: the scale its
    loss was multiplied by, and whether its gradients were aggregated and unscaled already."""

    def __init__(self, scale):
        self.scale = scale
        self.reduced = False
        self.unscaled = False


def _trainer_key(trainer):
    """The Trainer behind ``trainer`` (mxfp16.Trainer hands the scaler a view of itself)."""
    return id(getattr(trainer, "unwrapped", trainer))


class LossScaler:
    """Base class of the loss scalers: a fixed ``loss_scale``, overflow checks and skipped steps.

    Parameters
    ----------
    scale : float
        The loss scale.
    enabled : bool
        ``False`` makes every method a pass-through (scale 1, ``step`` = ``trainer.step``).
    max_consecutive_skips : int
        Overflowing steps in a row at the minimum scale before :class:`LossScaleCollapse` is raised.
    """

    #: Key under which checkpoints store :meth:`state_dict`.
    state_dict_key = "loss_scaler"

    def __init__(self, scale, enabled=True, max_consecutive_skips=200):
        check_positive("scale", scale)
        check_whole("max_consecutive_skips", max_consecutive_skips)
        self.enabled = bool(enabled)
        self.max_consecutive_skips = int(max_consecutive_skips)
        self._scale = float(scale)
        self.min_scale = float(scale)
        self.num_steps = 0
        self.num_skipped = 0
        self.consecutive_skips = 0
        # Trainer -> its step in progress.  One scaler may serve several Trainers (a GAN's generator
        # and discriminator, as PyTorch's GradScaler serves several optimizers): each step unscales
        # by the scale its own loss was multiplied by, even when another Trainer's overflow has
        # backed the scale off in between.
        self._pending = {}

    @property
    def loss_scale(self):
        """The current loss scale (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    @property
    def needs_start(self):
        """Whether the scale waits for its ``'auto'`` start (see :class:`DynamicLossScaler`)."""
        return False

    def scale(self, loss):
        """Multiply a loss (an NDArray or a list of them) by the loss scale before ``backward``.

        Raises
        ------
        RuntimeError
            If the loss passes through an op whose backward ignores the head gradient
            (``SoftmaxOutput``, ``MakeLoss``, ...; GluonCV's segmentation losses): the scale would
            not reach the gradients, and the step would train at 1/scale.  ``mxfp16.Trainer``'s
            ``backward`` and ``scale`` handle such losses (hybridized blocks are not looked into
            here: they are, by the Trainer).
        """
        if not self.enabled:
            return loss
        heads = list(loss) if isinstance(loss, (list, tuple)) else [loss]
        ops = visible_head_ignoring_ops(heads) if self._scale != 1.0 else []
        if ops:
            raise RuntimeError(
                f"the loss passes through {', '.join(ops)}, whose backward ignores the head "
                f"gradient: multiplied by the loss scale {self._scale:g}, the gradients would come "
                "out unscaled and the step would divide them by the scale. Use mxfp16.Trainer and "
                "trainer.backward(loss) (or trainer.scale(loss)), which back-propagate such a loss "
                "unscaled, or a loss that passes the head gradient on "
                "(gluon.loss.SoftmaxCrossEntropyLoss)")
        if isinstance(loss, (list, tuple)):
            return [item * self._scale for item in loss]
        return loss * self._scale

    def _pending_step(self, trainer):
        """The step in progress of ``trainer``, begun at the scale its loss was multiplied by
        (``trainer.scaled_with`` where the Trainer records it, else the current scale)."""
        key = _trainer_key(trainer)
        if key not in self._pending:
            self._pending[key] = _PendingStep(getattr(trainer, "scaled_with", None) or self._scale)
        return self._pending[key]

    def is_unscaled(self, trainer):
        """Whether :meth:`unscale` divided ``trainer``'s gradients of the step in progress."""
        pending = self._pending.get(_trainer_key(trainer))
        return pending is not None and pending.unscaled

    def discard_step(self, trainer):
        """Forget ``trainer``'s step in progress: its next backward starts a new one (a step that
        was aggregated or unscaled but never taken must not leak into the next)."""
        self._pending.pop(_trainer_key(trainer), None)

    def _reduce(self, trainer):
        """Aggregate gradients across devices and workers, once per step."""
        pending = self._pending_step(trainer)
        if not pending.reduced:
            _first_step_setup(trainer)
            check_updates_on_workers(trainer)
            trainer.allreduce_grads()
            pending.reduced = True
            self._aggregated(flat_trainer_grads(trainer))

    def _aggregated(self, grads):
        """Hook: a step's gradients just aggregated, not yet clipped or unscaled."""

    def unscale(self, trainer):
        """Divide the gradients by the loss scale in place (for code that reads or clips them).

        Float16 gradients below 2**-24 after unscaling flush to zero; :meth:`clip_global_norm` clips
        without that loss.  Call at most once between two steps.

        Raises
        ------
        RuntimeError
            If called twice before :meth:`step`.
        """
        if not self.enabled:
            return
        pending = self._pending_step(trainer)
        if pending.unscaled:
            raise RuntimeError("unscale() was already called since the last step(): gradients "
                               "would be divided by the loss scale twice; call it once per step")
        self._reduce(trainer)
        for grads in trainer_grads(trainer):
            for grad in grads:
                grad *= 1.0 / pending.scale
        pending.unscaled = True

    def clip_global_norm(self, trainer, max_norm):
        """Clip the gradients' global norm, measured unscaled, to ``max_norm``; return that norm.

        The threshold is compared with the *unscaled* norm (clipping scaled gradients would shrink
        the threshold by the loss scale, MXNet issue #15738) and the scaled gradients are multiplied
        in place, so no float16 gradient underflows on the way.  The norm is summed in float32.
        A non-finite norm clips nothing: :meth:`step` will skip the step.

        Returns
        -------
        float
            The global norm of the unscaled gradients.
        """
        check_positive("max_norm", max_norm)
        self._reduce(trainer)
        per_param = trainer_grads(trainer)
        squares = [mx.nd.sum(mx.nd.square(grads[0].astype("float32"))).as_in_context(mx.cpu())
                   for grads in per_param]
        pending = self._pending_step(trainer)
        divisor = 1.0 if (pending.unscaled or not self.enabled) else pending.scale
        norm = math.sqrt(float(mx.nd.add_n(*squares).asscalar())) / divisor if squares else 0.0
        if math.isfinite(norm) and norm > max_norm:
            for grads in per_param:
                for grad in grads:
                    grad *= max_norm / norm
        return norm

    def step(self, trainer, batch_size):
        """Update the parameters unless a gradient overflowed; then update the loss scale.

        A dynamic scaler waiting for its ``'auto'`` start (:attr:`needs_start`) sets it here from
        the aggregated gradients, measured before any clipping, and updates with them (scale 1).

        Parameters
        ----------
        trainer : gluon.Trainer
            Created with ``update_on_kvstore=False`` (as :func:`mxfp16.make_trainer` does), so the
            check sees the aggregated gradients and every device and worker decides alike.
        batch_size : int
            Samples behind the gradients, as for ``trainer.step``.

        Returns
        -------
        bool
            True if the update ran, False if it was skipped (weights and optimizer state untouched).
        """
        if not self.enabled:
            _first_step_setup(trainer)
            trainer.step(batch_size)
            return True
        self._reduce(trainer)
        finite = all_finite(flat_trainer_grads(trainer))
        pending = self._pending.pop(_trainer_key(trainer))
        self.update(finite)
        if finite:
            trainer.update(batch_size if pending.unscaled else batch_size * pending.scale)
        return finite

    def update(self, finite):
        """Record one step's outcome and adjust the scale (:func:`mxfp16.module_step` calls it)."""
        self.num_steps += 1
        if finite:
            self.consecutive_skips = 0
            self._grow()
            return
        self.num_skipped += 1
        self.consecutive_skips += 1
        self._back_off()
        if self._scale <= self.min_scale and self.consecutive_skips >= self.max_consecutive_skips:
            raise LossScaleCollapse(
                f"{self.consecutive_skips} steps in a row overflowed at the minimum loss scale "
                f"{scale_text(self.min_scale)}: the gradients are inf/NaN even at that scale. "
                "Lower the learning rate, check the data for inf/NaN, or keep the overflowing "
                "layers in float32 (mxfp16.find_overflow(net, *batch) names them)")

    def _grow(self):
        """Clean-step hook: a static scaler keeps its scale."""

    def _back_off(self):
        """Overflow hook: a static scaler keeps its scale."""

    def state_dict(self):
        """The scaler's state as plain numbers, for checkpoints."""
        return {"loss_scale": self._scale, "num_steps": self.num_steps,
                "num_skipped": self.num_skipped, "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`'s output (counters older checkpoints lack start at 0)."""
        if "loss_scale" not in state:
            raise ValueError(f"not a loss-scaler state: keys {sorted(state)} lack 'loss_scale'")
        check_positive("loss_scale", state["loss_scale"])
        self._scale = float(state["loss_scale"])
        self.num_steps = int(state.get("num_steps", 0))
        self.num_skipped = int(state.get("num_skipped", 0))
        self.consecutive_skips = int(state.get("consecutive_skips", 0))

    def __repr__(self):
        return (f"{type(self).__name__}(loss_scale={self.loss_scale:g}, enabled={self.enabled}, "
                f"steps={self.num_steps}, skipped={self.num_skipped})")


class StaticLossScaler(LossScaler):
    """A fixed loss scale; overflowing steps are skipped and counted.

    Examples
    --------
    >>> scaler = StaticLossScaler(128)
    >>> scaler.loss_scale
    128.0
    >>> scaler.update(finite=False); scaler.loss_scale, scaler.num_skipped
    (128.0, 1)
    """


class DynamicLossScaler(LossScaler):
    """A loss scale that halves on overflow and doubles after ``growth_interval`` clean steps.

    Parameters
    ----------
    init_scale : float or 'auto'
        Starting scale: a number (2**16 is PyTorch's and apex's), or ``'auto'``: the first step
        runs at scale 1 and measures the largest aggregated gradient ``g``; the scale then starts
        at :func:`recommend_loss_scale` ``(g)`` (within ``[min_scale, max_scale]``), and that first
        step updates the weights like any other.  If its gradients overflow even at scale 1, it is
        skipped, the scale halves (below 1, down to ``min_scale``) and the next step measures.
    growth_factor : float
        Multiplier after ``growth_interval`` clean steps in a row (> 1).
    backoff_factor : float
        Multiplier on overflow (between 0 and 1).
    growth_interval : int
        Clean steps in a row before the scale grows.
    min_scale, max_scale : float
        Bounds of the scale.  ``min_scale`` is below 1 by default (:data:`MIN_LOSS_SCALE`,
        2**-24, chosen by measurement: ``benchmarks/loss_scale_floor.py``), as PyTorch's
        GradScaler goes below 1: a loss whose gradients overflow float16 even unscaled (weighted
        1e6) trains at a scale of 1/2**k.
    enabled : bool
        ``False``: pass-through.
    max_consecutive_skips : int
        Overflowing steps in a row at ``min_scale`` before :class:`LossScaleCollapse`.

    Raises
    ------
    ValueError
        For a setting out of its range, naming it.

    Examples
    --------
    >>> scaler = DynamicLossScaler()
    >>> for _ in range(4):
    ...     scaler.update(finite=False)
    >>> scaler.loss_scale == 2 ** 12
    True
    >>> auto = DynamicLossScaler(init_scale='auto')
    >>> auto.loss_scale, auto.needs_start
    (1.0, True)
    >>> auto.start_from(3.0)  # 3 * 2048 * 8 <= 65504 < 3 * 4096 * 8
    2048.0
    """

    def __init__(self, init_scale=CLASSIC_INIT_SCALE, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=MIN_LOSS_SCALE, max_scale=MAX_LOSS_SCALE,
                 enabled=True, max_consecutive_skips=200):
        auto = is_auto(init_scale)
        super().__init__(1.0 if auto else init_scale, enabled=enabled,
                         max_consecutive_skips=max_consecutive_skips)
        check_dynamic_settings(init_scale, growth_factor, backoff_factor, growth_interval,
                                min_scale, max_scale)
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.growth_tracker = 0
        self._start_pending = auto
        self._start_max = None  # the measurement of the current step, until update()

    @property
    def needs_start(self):
        """Whether the ``'auto'`` start is still to be measured (False when disabled)."""
        return self.enabled and self._start_pending

    def start_from(self, max_abs):
        """Set the ``'auto'`` start from one step's largest aggregated gradient magnitude.

        For code that checks gradients itself (:func:`mxfp16.module_step`); ``step`` calls it.

        Parameters
        ----------
        max_abs : float
            Over every gradient, after aggregation across devices and workers, of a step taken at
            the current :attr:`loss_scale`, so every replica starts alike.

        Returns
        -------
        float
            The new loss scale.

        Raises
        ------
        RuntimeError
            If the start is not waiting for a measurement (:attr:`needs_start` is False).
        """
        if not self.needs_start:
            raise RuntimeError("start_from() is for a scaler waiting for its 'auto' start, and "
                               f"this one is not ({self!r}): create it with init_scale='auto'")
        start = recommend_loss_scale(max_abs / self._scale, max_scale=self.max_scale,
                                     min_scale=self.min_scale)
        self._scale = max(start, self.min_scale)
        self._start_pending = False
        return self._scale

    def _aggregated(self, grads):
        if self.needs_start:  # measured before clip_global_norm or unscale changes them
            self._start_max = max_magnitude(grads)

    def update(self, finite):
        measured, self._start_max = self._start_max, None
        if finite and self.needs_start:
            if measured is None:
                raise RuntimeError("the 'auto' start was not measured this step: call "
                                   "start_from(max_abs) before update(True), or use step()")
            self.start_from(measured)
        super().update(finite)

    def _grow(self):
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            self._scale = min(self._scale * self.growth_factor, self.max_scale)
            self.growth_tracker = 0

    def _back_off(self):
        self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        self.growth_tracker = 0

    def state_dict(self):
        """The state as plain numbers; ``start_pending: True`` only while the ``'auto'`` start
        waits for its measurement, so a started scaler's state is the classic one."""
        state = dict(super().state_dict(), growth_tracker=self.growth_tracker)
        if self._start_pending:
            state["start_pending"] = True
        return state

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`'s output; a state without ``start_pending`` (a started
        scaler's, or an older checkpoint's) has its start: a resumed run does not measure again."""
        super().load_state_dict(state)
        self.growth_tracker = int(state.get("growth_tracker", 0))
        self._start_pending = bool(state.get("start_pending", False))
        self._start_max = None

    def __repr__(self):
        if not self.needs_start:
            return super().__repr__()
        return (f"{type(self).__name__}(loss_scale=auto, enabled={self.enabled}, "
                f"steps={self.num_steps}, skipped={self.num_skipped})")


def make_loss_scaler(loss_scale, dtype, *, init_scale=None, growth_factor=2.0, backoff_factor=0.5,
                     growth_interval=2000, min_scale=MIN_LOSS_SCALE, max_scale=MAX_LOSS_SCALE,
                     max_consecutive_skips=200):
    """The scaler for a ``--loss-scale`` setting, every scaler setting given as a keyword.

    Parameters
    ----------
    loss_scale : str, float or None
        * None: ``'dynamic'`` for float16; for float32 and bfloat16, whose range is float32's, no
          scaling (a disabled scaler).
        * ``'dynamic'``: a :class:`DynamicLossScaler` whose start is measured at the first step
          (``init_scale='auto'``), unless ``init_scale`` says otherwise.
        * ``'dynamic:N'``: dynamic, starting at N; ``'dynamic:65536'`` is the classic start.
        * a positive number, or a string of one: a :class:`StaticLossScaler`; 1 disables scaling.
    dtype : str
        The training dtype.
    init_scale : float, 'auto' or None
        The start of dynamic scaling, as the ``:N`` suffix gives it (pass one of the two); None
        means ``'auto'``.
    growth_factor, backoff_factor, growth_interval, min_scale, max_scale
        Dynamic scaling's settings (see :class:`DynamicLossScaler`); a static scale has no use for
        them.
    max_consecutive_skips : int
        Overflowing steps in a row at the minimum scale before :class:`LossScaleCollapse`.

    Returns
    -------
    LossScaler

    Raises
    ------
    ValueError
        For a ``loss_scale`` of none of these forms, ``init_scale`` with a static scale or with a
        ``:N`` suffix, or a setting out of its range.

    Examples
    --------
    >>> make_loss_scaler(None, 'float16')
    DynamicLossScaler(loss_scale=auto, enabled=True, steps=0, skipped=0)
    >>> make_loss_scaler('dynamic:65536', 'float16', max_consecutive_skips=50).loss_scale
    65536.0
    >>> make_loss_scaler('dynamic', 'float16', init_scale=1024).loss_scale
    1024.0
    >>> make_loss_scaler('128', 'float16').loss_scale
    128.0
    """
    kind, value = parse_loss_scale(loss_scale, dtype, init_scale)
    if kind == "dynamic":
        return DynamicLossScaler(value, growth_factor, backoff_factor, growth_interval, min_scale,
                                 max_scale, max_consecutive_skips=max_consecutive_skips)
    return StaticLossScaler(value, enabled=value != 1.0,
                            max_consecutive_skips=max_consecutive_skips)
