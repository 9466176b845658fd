"""When an overflow is worth locating: the trigger the Trainer, ``mxfp16.amp``, the Module helpers
and the scripts share.

Dynamic loss scaling skips a step now and then by design: the scale grows until a gradient
overflows, then halves.  What it cannot fix is an overflow that does not depend on the scale: a
forward pass whose float16 activations pass 65504 (the loss is inf/NaN), or gradients that overflow
at a scale already known to be safe.  :class:`SkipWatch` says when a run has reached either, so the
caller runs the locator once, on the batch at hand:

* a skipped step whose loss is inf or NaN (read only on skipped steps: a clean step reads nothing);
* :data:`SKIPS_BEFORE_LOCATING` skipped steps in a row, each at or below the reference scale: the
  measured ``'auto'`` start, or the scale of the last clean step, and never less than 1 (gradients
  that overflow unscaled).  A static scaler's every skip counts.

A run that only explores its scale (the classic start of 65536 halving to where the gradients fit,
an overflow after the scale grew) never reaches it.  Clean steps cost two assignments.
"""
from .overflow import all_finite

#: Skipped steps in a row at or below the reference scale before the overflow is located.
SKIPS_BEFORE_LOCATING = 3

#: Why :meth:`SkipWatch.due` fired: the loss itself is inf/NaN (the forward pass overflowed,
#: or the data holds inf/NaN), or the gradients keep overflowing at a safe scale.
LOSS_NOT_FINITE = "the loss is inf/NaN"
SKIPS_AT_SAFE_SCALE = "skipped steps in a row at or below a safe loss scale"


class SkipWatch:
    """One run's trigger for locating its overflow, fired at most once.

    Parameters
    ----------
    scaler : mxfp16.LossScaler
        The run's scaler, before its first step (whether it waits for its ``'auto'`` start).
    skips : int
        Skipped steps in a row at or below the reference scale that fire it.

    Examples
    --------
    >>> from mxfp16 import DynamicLossScaler
    >>> scaler = DynamicLossScaler(init_scale=1024.0)
    >>> watch = SkipWatch(scaler)
    >>> [watch.due(scaler, 1024.0, finite) for finite in (True, False, False)]
    [None, None, None]
    >>> watch.due(scaler, 256.0, False)  # the third skip in a row at or below 1024
    'skipped steps in a row at or below a safe loss scale'
    >>> watch.due(scaler, 128.0, False) is None  # once
    True
    """

    def __init__(self, scaler, skips=SKIPS_BEFORE_LOCATING):
        self.skips = int(skips)
        self.fired = None  # the reason it fired, once it did
        self._start = None  # the measured 'auto' start
        self._clean_scale = None  # the loss scale of the last clean step
        self._awaiting_start = scaler.needs_start
        self._suspect = 0  # skipped steps in a row at or below the reference

    def reference(self):
        """The scale at or below which a skipped step is suspect: the measured start or the last
        clean step's scale, whichever is larger, and at least 1."""
        return max(scale for scale in (self._start, self._clean_scale, 1.0) if scale is not None)

    def due(self, scaler, used_scale, finite, losses=None):
        """Record a step of ``scaler`` taken at ``used_scale``; the reason to locate its overflow
        now (:data:`LOSS_NOT_FINITE` or :data:`SKIPS_AT_SAFE_SCALE`), or None.

        Parameters
        ----------
        scaler : mxfp16.LossScaler
            After the step's update.
        used_scale : float
            The loss scale the step's backward ran at.
        finite : bool
            Whether its gradients were finite (the step updated).
        losses : list of NDArray, optional
            The step's losses, read (one wait on the device) only when the step was skipped.
        """
        if finite:
            self._suspect, self._clean_scale = 0, used_scale
            if self._awaiting_start:
                self._awaiting_start = scaler.needs_start
                self._start = None if scaler.needs_start else scaler.loss_scale
            return None
        if self.fired is not None:
            return None
        static = not hasattr(scaler, "backoff_factor")
        self._suspect = self._suspect + 1 if static or used_scale <= self.reference() else 0
        if losses and not all_finite(losses):
            self.fired = LOSS_NOT_FINITE
        elif self._suspect >= self.skips:
            self.fired = SKIPS_AT_SAFE_SCALE
        return self.fired
