"""Loss scaling, static and dynamic, for Gluon Trainers (and, through :mod:`mxfp16.module`, Modules).

A scaler owns the whole sequence: ``scale(loss)`` -> backward -> optional ``clip_global_norm`` or
``unscale`` -> ``step`` (aggregate, check every gradient for inf/NaN, skip or update with the scale
undone through ``rescale_grad``) -> scale update.  With ``enabled=False`` every method passes through,
so a training loop needs no ``if float16:`` branches.
"""
import math

import mxnet as mx

from . import mxnet_internals
from .kvstore import sync_initial_weights

#: Gradients checked per ``multi_all_finite`` call (one fused kernel per chunk).
_FINITE_CHECK_CHUNK = 128


class LossScaleCollapse(RuntimeError):
    """Raised when steps keep overflowing at the minimum loss scale: training cannot recover."""


def _first_step_setup(trainer):
    """Before a Trainer's first gradient exchange, give every worker rank 0's weights.

    Left to the Trainer, a distributed kvstore may hand a worker the first summed gradients as its
    weights (see :func:`mxfp16.kvstore.sync_initial_weights`).
    """
    if not mxnet_internals.trainer_kvstore_ready(trainer):
        sync_initial_weights(trainer)


def _trainer_grads(trainer):
    """Every gradient array of a Trainer's parameters: ``[[param0 on dev0, on dev1, ...], ...]``."""
    return [param.list_grad() for param in mxnet_internals.trainer_params(trainer) if param.grad_req != "null"]


def all_finite(arrays):
    """Whether every value of every array is finite (one host sync).

    Parameters
    ----------
    arrays : list of NDArray
        Any dtypes and devices.

    Returns
    -------
    bool

    Examples
    --------
    >>> import mxnet as mx
    >>> all_finite([mx.nd.ones(3), mx.nd.array([1, float('inf')], dtype='float16')])
    False
    """
    groups = {}  # multi_all_finite wants one device and one dtype per call
    for array in arrays:
        groups.setdefault((array.context, array.dtype), []).append(array)
    flags = []
    for group in groups.values():
        for start in range(0, len(group), _FINITE_CHECK_CHUNK):
            chunk = group[start:start + _FINITE_CHECK_CHUNK]
            flag = mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True)
            flags.append(flag.as_in_context(mx.cpu()))
    return all(bool(flag.asscalar()) for flag in flags)


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
        _check_positive("scale", scale)
        if int(max_consecutive_skips) != max_consecutive_skips or max_consecutive_skips < 1:
            raise ValueError(f"max_consecutive_skips must be a whole number >= 1, "
                             f"got {max_consecutive_skips!r}")
        self.enabled = bool(enabled)
        self.max_consecutive_skips = int(max_consecutive_skips)
        self._scale = float(scale)
        self.min_scale = float(scale)
        self.num_steps = 0
        self.num_skipped = 0
        self.consecutive_skips = 0
        self._unscaled = False
        self._reduced = False

    @property
    def loss_scale(self):
        """The current loss scale (1.0 when disabled)."""
        return self._scale if self.enabled else 1.0

    def scale(self, loss):
        """Multiply a loss (an NDArray or a list of them) by the loss scale before ``backward``."""
        if not self.enabled:
            return loss
        if isinstance(loss, (list, tuple)):
            return [item * self._scale for item in loss]
        return loss * self._scale

    def _reduce(self, trainer):
        """Aggregate gradients across devices and workers, once per step."""
        if not self._reduced:
            _first_step_setup(trainer)
            trainer.allreduce_grads()
            self._reduced = True

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
        if self._unscaled:
            raise RuntimeError("unscale() was already called since the last step(): gradients would "
                               "be divided by the loss scale twice; call it once per step")
        self._reduce(trainer)
        for grads in _trainer_grads(trainer):
            for grad in grads:
                grad *= 1.0 / self._scale
        self._unscaled = True

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
        _check_positive("max_norm", max_norm)
        self._reduce(trainer)
        per_param = _trainer_grads(trainer)
        squares = [mx.nd.sum(mx.nd.square(grads[0].astype("float32"))).as_in_context(mx.cpu())
                   for grads in per_param]
        divisor = 1.0 if (self._unscaled or not self.enabled) else self._scale
        norm = math.sqrt(float(mx.nd.add_n(*squares).asscalar())) / divisor if squares else 0.0
        if math.isfinite(norm) and norm > max_norm:
            for grads in per_param:
                for grad in grads:
                    grad *= max_norm / norm
        return norm

    def step(self, trainer, batch_size):
        """Update the parameters unless a gradient overflowed; then update the loss scale.

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
        finite = all_finite([g for grads in _trainer_grads(trainer) for g in grads])
        used_scale, unscaled = self._scale, self._unscaled
        self._unscaled = self._reduced = False
        self.update(finite)
        if finite:
            trainer.update(batch_size if unscaled else batch_size * used_scale)
        return finite

    def update(self, finite):
        """Record one step's outcome and adjust the scale (the module helper calls this directly)."""
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
                f"{self.min_scale:g}: the gradients are inf/NaN even unscaled. Lower the learning "
                "rate, check the data for inf/NaN, or keep the overflowing layers in float32")

    def _grow(self):
        """Clean-step hook: a static scaler keeps its scale."""

    def _back_off(self):
        """Overflow hook: a static scaler keeps its scale."""

    def state_dict(self):
        """The scaler's state as plain numbers, for checkpoints."""
        return {"loss_scale": self._scale, "num_steps": self.num_steps,
                "num_skipped": self.num_skipped, "consecutive_skips": self.consecutive_skips}

    def load_state_dict(self, state):
        """Restore :meth:`state_dict`'s output (missing counters of older checkpoints count from 0)."""
        if "loss_scale" not in state:
            raise ValueError(f"not a loss-scaler state: keys {sorted(state)} lack 'loss_scale'")
        _check_positive("loss_scale", state["loss_scale"])
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
    init_scale : float
        Starting scale (PyTorch's and apex's 2**16).
    growth_factor : float
        Multiplier after ``growth_interval`` clean steps in a row (> 1).
    backoff_factor : float
        Multiplier on overflow (between 0 and 1).
    growth_interval : int
        Clean steps in a row before the scale grows.
    min_scale, max_scale : float
        Bounds of the scale.
    enabled : bool
        ``False``: pass-through.
    max_consecutive_skips : int
        Overflowing steps in a row at ``min_scale`` before :class:`LossScaleCollapse`.

    Examples
    --------
    >>> scaler = DynamicLossScaler()
    >>> for _ in range(4):
    ...     scaler.update(finite=False)
    >>> scaler.loss_scale == 2 ** 12
    True
    """

    def __init__(self, init_scale=2.0 ** 16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000, min_scale=1.0, max_scale=2.0 ** 24, enabled=True,
                 max_consecutive_skips=200):
        super().__init__(init_scale, enabled=enabled, max_consecutive_skips=max_consecutive_skips)
        _check_positive("min_scale", min_scale)
        if not growth_factor > 1:
            raise ValueError(f"growth_factor must be > 1, got {growth_factor!r}")
        if not 0 < backoff_factor < 1:
            raise ValueError(f"backoff_factor must be between 0 and 1, got {backoff_factor!r}")
        if int(growth_interval) != growth_interval or growth_interval < 1:
            raise ValueError(f"growth_interval must be a whole number >= 1, got {growth_interval!r}")
        if not min_scale <= init_scale <= max_scale:
            raise ValueError(f"need min_scale <= init_scale <= max_scale, got {min_scale!r}, "
                             f"{init_scale!r}, {max_scale!r}")
        self.growth_factor = float(growth_factor)
        self.backoff_factor = float(backoff_factor)
        self.growth_interval = int(growth_interval)
        self.min_scale = float(min_scale)
        self.max_scale = float(max_scale)
        self.growth_tracker = 0

    def _grow(self):
        self.growth_tracker += 1
        if self.growth_tracker >= self.growth_interval:
            self._scale = min(self._scale * self.growth_factor, self.max_scale)
            self.growth_tracker = 0

    def _back_off(self):
        self._scale = max(self._scale * self.backoff_factor, self.min_scale)
        self.growth_tracker = 0

    def state_dict(self):
        return dict(super().state_dict(), growth_tracker=self.growth_tracker)

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.growth_tracker = int(state.get("growth_tracker", 0))


def make_loss_scaler(loss_scale, dtype):
    """The scaler for a ``--loss-scale`` setting: ``'dynamic'``, a number, or None for the default.

    The default is dynamic scaling for float16 and none (a disabled scaler) for float32 and bfloat16,
    whose range is float32's.

    Parameters
    ----------
    loss_scale : str, float or None
        ``'dynamic'``, a positive number (static scale; 1 disables scaling), or None.
    dtype : str
        The training dtype.

    Returns
    -------
    LossScaler

    Examples
    --------
    >>> make_loss_scaler(None, 'float16')
    DynamicLossScaler(loss_scale=65536, enabled=True, steps=0, skipped=0)
    >>> make_loss_scaler('128', 'float16').loss_scale
    128.0
    """
    if loss_scale is None:
        loss_scale = "dynamic" if dtype == "float16" else 1.0
    if str(loss_scale).lower() == "dynamic":
        return DynamicLossScaler()
    try:
        value = float(loss_scale)
    except (TypeError, ValueError):
        raise ValueError(f"loss scale {loss_scale!r} is neither 'dynamic' nor a number: "
                         "pass 'dynamic' or a positive number such as 128") from None
    _check_positive("loss scale", value)
    return StaticLossScaler(value, enabled=value != 1.0)


def _check_positive(name, value):
    try:
        ok = float(value) > 0 and math.isfinite(float(value))
    except (TypeError, ValueError):
        ok = False
    if not ok:
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
