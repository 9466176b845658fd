"""The early overflow warning: where a float16 run overflows, said within a few steps, with the fix.

:class:`mxfp16.Trainer`, ``mxfp16.amp``, :func:`mxfp16.module_step` and the training scripts each
hold an :class:`OverflowAlarm` and hand it every step's outcome.  A clean step costs two
assignments: nothing runs on the device, nothing waits, nothing is copied.  When
:class:`~mxfp16.scaling.watch.SkipWatch` fires (a skipped step whose loss is inf/NaN, or a few
skipped steps in a row at a safe loss scale), the alarm runs :func:`mxfp16.find_overflow` once on
the batch at hand and logs one warning: the pass that overflowed (forward or backward), the
culprits (block path, op, float32's magnitude there) and the fix as code, in the caller's terms
(:data:`CODE`: ``keep_float32=[...]``; :data:`FLAGS`: ``--keep-float32 ...``), with bfloat16
(float32's range) where the devices run it natively (:func:`mxfp16.doctor.bfloat16_native_on`).  A
:class:`~mxfp16.scaling.scalers.LossScaleCollapse` after it carries the same report and ends with
the same warning.

The batch at hand: a Trainer has neither the network nor its inputs, so a cast network keeps the
inputs of its last recorded call, by reference, until the step ends
(:func:`mxfp16.scaling.boundary.keep_call`); the scripts and the Module helpers pass their own.
"""
import collections
import logging
import math

import mxnet as mx
import numpy as np

from .diagnose import find_overflow
from .doctor import bfloat16_native_on
from .numpy_interface import legacy
from .scaling import boundary as boundary_scale
from .scaling.overflow import all_finite, max_magnitude
from .scaling.scalers import LossScaleCollapse
from .scaling.settings import FLOAT16_MAX, scale_text
from .scaling.watch import SkipWatch

log = logging.getLogger(__name__)

#: Culprits the warning lists, in execution order (the report holds them all).
SHOWN_CULPRITS = 5

#: What the locator runs on: the network (float32 or cast), its inputs as the network takes them,
#: and the keyword arguments of :func:`mxfp16.find_overflow` (``label``, ``loss_fn``).
Batch = collections.namedtuple("Batch", "network inputs options")


class Fixes:
    """How a caller writes the two fixes: blocks kept in float32, and bfloat16.

    Parameters
    ----------
    keep : str
        A format string of ``selectors`` (the list of block paths) or ``flag`` (them joined by
        commas).
    bfloat16 : str
        The switch to bfloat16.

    Examples
    --------
    >>> FLAGS.keep(['0', 'encoder.1']), CODE.keep(['0'])
    ('--keep-float32 0,encoder.1', "mxfp16.cast_block(net, 'float16', keep_float32=['0'])")
    """

    def __init__(self, keep, bfloat16):
        self._keep, self.bfloat16 = keep, bfloat16

    def keep(self, selectors):
        """The code that keeps ``selectors`` in float32."""
        return self._keep.format(selectors=list(selectors), flag=",".join(selectors))


#: A user's own code: ``cast_block`` and ``mxfp16.Trainer``.
CODE = Fixes("mxfp16.cast_block(net, 'float16', keep_float32={selectors!r})",
             "mxfp16.cast_block(net, 'bfloat16') and mxfp16.Trainer(..., dtype='bfloat16')")

#: The training scripts' flags.
FLAGS = Fixes("--keep-float32 {flag}", "--dtype bfloat16")


def _arrays(value):
    if isinstance(value, (list, tuple)):
        return [array for item in value for array in _arrays(item)]
    return [legacy(value)] if isinstance(value, mx.nd.NDArray) or hasattr(value, "as_nd_ndarray") \
        else []


def locate(batch, loss_scale, find=find_overflow):
    """``(report, None)`` of the locator on ``batch`` at ``loss_scale``, or ``(None, why)`` where
    it cannot say more than a sentence: no batch, a batch that holds inf/NaN or values beyond
    65504 (float16's largest) itself, a locator error.

    Parameters
    ----------
    batch : Batch or None
    loss_scale : float
        The scale of the step that overflowed (the backward's gradients are taken at it).
    find : callable
        :func:`mxfp16.find_overflow`.
    """
    if batch is None:
        return None, ("no batch to locate it on: no network cast by mxfp16.cast_block ran while "
                      "autograd recorded this step; run mxfp16.find_overflow(net, *batch) on one")
    arrays = [array for array in _arrays(batch.inputs) if np.dtype(array.dtype).kind == "f"]
    if arrays and not all_finite(arrays):
        return None, "the batch's inputs themselves hold inf/NaN: check the data"
    largest = max_magnitude(arrays) if arrays else 0.0
    if largest > FLOAT16_MAX:
        return None, (f"the batch's inputs reach {largest:.3g}, beyond float16's 65504, before any "
                      "op: normalize them (or scale them down) before the network")
    try:
        return find(batch.network, *batch.inputs, loss_scale=loss_scale, **batch.options), None
    except (ValueError, TypeError, RuntimeError, mx.base.MXNetError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return None, f"mxfp16.find_overflow could not run on this network: {first}"


def _magnitude(value):
    if not math.isfinite(value):
        return "inf/NaN in float32 too"
    beyond = " beyond float16's 65504" if value > FLOAT16_MAX else ""
    return f"{value:.3g} in float32{beyond}"


def culprit_lines(culprits, limit=SHOWN_CULPRITS):
    """The lines naming ``culprits`` (path, op, phase, float32's magnitude), at most ``limit``.

    Examples
    --------
    >>> Culprit = collections.namedtuple('Culprit', 'path op phase max_abs')
    >>> for line in culprit_lines([Culprit('0', 'att0_batch_dot0', 'forward', 1.43e5),
    ...                            Culprit('', 'softmax0', 'forward', float('nan'))], limit=1):
    ...     print(line)
      forward  0: att0_batch_dot0, 1.43e+05 in float32 beyond float16's 65504
      ... and 1 more
    """
    lines = [f"  {item.phase:<8} {item.path + ': ' if item.path else ''}{item.op}, "
             f"{_magnitude(float(item.max_abs))}" for item in culprits[:limit]]
    if len(culprits) > limit:
        lines.append(f"  ... and {len(culprits) - limit} more")
    return lines


def _kept(network):
    """The blocks ``network`` keeps in float32 already (a cast network says), as paths."""
    return list(getattr(network, "keep_float32", None) or ())


def _finite(culprit):
    return math.isfinite(float(culprit.max_abs))


def _keepable(report):
    """The forward culprits an op kept in float32 fixes: finite in float32 (not a network that
    diverged) and an op, not a value the network is given (an input or a parameter)."""
    return [item for item in report.culprits if item.phase == "forward" and _finite(item)
            and getattr(item, "op_type", None) not in ("parameter", "input")]


def keep_selectors(report, network):
    """The ``keep_float32`` selectors that fix the forward culprits: the report's (block paths, or
    op names for a graph without its blocks, a ``SymbolBlock`` or a Module's), with those
    ``network`` keeps already; none when no culprit is an op a kept block fixes."""
    if not _keepable(report):
        return []
    return list(dict.fromkeys(_kept(network) + list(report.keep_float32)))


def _backward_fix(culprits, fixes, scaler):
    floor = getattr(scaler, "min_scale", 1.0)
    paths = list(dict.fromkeys(item.path for item in culprits if item.path))
    return (f"Fix: the gradients overflow at this loss scale; dynamic scaling halves it on skipped "
            f"steps, below 1 if need be (down to {scale_text(floor)}), and a run that then trains "
            "needs nothing more. Else scale the loss down"
            + (f", or keep these blocks in float32: {fixes.keep(paths)}" if paths else ""))


def _value_fixes(culprits):
    """The lines for culprits no kept op fixes: values inf/NaN in float32 as well, and inputs or
    parameters beyond 65504 before any op."""
    lines = []
    if any(not _finite(item) for item in culprits):
        lines.append("Fix: float32 is inf/NaN there as well, so float16's range is not the cause "
                     "(the weights or the data diverged): lower the learning rate, check the data "
                     "for inf/NaN")
    values = [item.op for item in culprits if item.phase == "forward" and _finite(item)
              and getattr(item, "op_type", None) in ("parameter", "input")]
    if values:
        lines.append(f"Fix: {', '.join(values[:3])} exceed 65504, float16's largest value, "
                     "before any op: normalize the inputs (or scale them down) before the network")
    return lines


def fix_lines(report, network, fixes, bfloat16, scaler):
    """The warning's ``Fix:`` lines for ``report``: what no kept op fixes (a network diverged in
    float32 too, inputs beyond 65504), the ops or blocks to keep in float32 (with those kept
    already), the loss scale for a backward-only overflow, and bfloat16 where the devices run it
    natively."""
    culprits = list(report.culprits)
    lines = _value_fixes(culprits)
    selectors, forward = keep_selectors(report, network), _keepable(report)
    if selectors:
        checked = {True: " (checked on this batch: its forward pass then fits float16)",
                   False: " (not enough on this batch: its forward pass still overflows with "
                          "these kept)"}.get(getattr(report, "fixed", None), "")
        lines.append(f"Fix: keep them in float32{checked}: {fixes.keep(selectors)}")
    elif forward:
        start = list(dict.fromkeys(item.path or item.op for item in forward))
        lines.append("Fix: mxfp16.find_overflow found no blocks to keep that fix them on this "
                     "batch: keep them and the ops reading their values in float32, starting "
                     f"with {fixes.keep(start)}, or normalize what feeds them")
    elif not lines and culprits:
        lines.append(_backward_fix(culprits, fixes, scaler))
    if bfloat16 and culprits and all(_finite(item) for item in culprits):
        lines.append(f"  or train in bfloat16 (float32's range, native on these devices): "
                     f"{fixes.bfloat16}")
    return lines


def _clean_forward(forward_only, scaler):
    """What an empty report says: nothing overflows, or (a forward pass only, without the loss)
    that the gradients do."""
    if not forward_only:
        return ("nothing overflows float16 there at this loss scale; check the data for inf/NaN, "
                "or lower the learning rate")
    floor = scale_text(getattr(scaler, "min_scale", 1.0))
    return ("its forward pass does not overflow float16, so the gradients did; without the loss "
            "the backward was not run: mxfp16.find_overflow(net, *batch, label=..., loss_fn=...) "
            "names its ops. Dynamic scaling halves the scale on skipped steps, below 1 if need be "
            f"(down to {floor}): a run that then trains needs nothing more")


def compose(caller, reason, step, loss_scale, report, *, why=None, network=None, fixes=CODE,
            bfloat16=False, scaler=None, forward_only=False):
    """The warning: what happened at which step, what the locator found, and the fix.

    Examples
    --------
    >>> from mxfp16.scaling.watch import LOSS_NOT_FINITE
    >>> Report = collections.namedtuple('Report', 'culprits keep_float32')
    >>> Culprit = collections.namedtuple('Culprit', 'path op phase max_abs')
    >>> report = Report([Culprit('0', 'att0_batch_dot0', 'forward', 1.43e5)], ['0'])
    >>> print(compose('mxfp16.Trainer', LOSS_NOT_FINITE, 1, 1.0, report, fixes=FLAGS))
    mxfp16.Trainer: step 1 skipped: the loss is inf/NaN (loss scale 1).
    float16 overflows in the forward pass; mxfp16.find_overflow on the step's batch names:
      forward  0: att0_batch_dot0, 1.43e+05 in float32 beyond float16's 65504
    Fix: keep them in float32: --keep-float32 0
    """
    head = f"{caller}: step {step} skipped: {reason} (loss scale {scale_text(loss_scale)})."
    if report is None:
        return f"{head}\n{why[0].upper()}{why[1:]}."
    culprits = list(report.culprits)
    if not culprits:
        return f"{head}\nmxfp16.find_overflow on the step's batch: " + \
            _clean_forward(forward_only, scaler)
    what = f"float16 overflows in the {culprits[0].phase} pass" if any(map(_finite, culprits)) \
        else f"the {culprits[0].phase} pass is inf/NaN, in float32 too"
    lines = [head, f"{what}; mxfp16.find_overflow on the step's batch names:"]
    lines += culprit_lines(culprits)
    lines += fix_lines(report, network, fixes, bfloat16, scaler)
    return "\n".join(lines)


class OverflowAlarm:
    """One run's early overflow warning: the trigger, the locator run once, the warning logged.

    Parameters
    ----------
    scaler : mxfp16.LossScaler
        The run's scaler, before its first step.
    caller : str
        Who warns, in the warning (``'mxfp16.Trainer'``, ``'mxfp16.amp'``, ...).
    logger : logging.Logger
    fixes : Fixes
        :data:`CODE` or :data:`FLAGS` (or the caller's own).
    find : callable
        The locator, :func:`mxfp16.find_overflow`.

    Attributes
    ----------
    report : OverflowReport or None
        The locator's report, once it ran.
    message : str or None
        The warning logged.
    """

    def __init__(self, scaler, caller, logger=log, fixes=CODE, find=find_overflow):
        self.watch = SkipWatch(scaler)
        self.caller, self._log, self.fixes, self._find = caller, logger, fixes, find
        self.report = self.message = None

    def after_step(self, scaler, used_scale, finite, batch, losses=None):
        """Record a step; when the watch fires, locate the overflow on ``batch()`` and warn.

        Parameters
        ----------
        scaler : mxfp16.LossScaler
            After the step's update.
        used_scale : float
            The scale the step's backward ran at.
        finite : bool
            Whether the step updated.
        batch : callable
            Returns the :class:`Batch` at hand (or None); called only when the watch fires.
        losses : list of NDArray, optional
            The step's losses, read only on a skipped step.

        Returns
        -------
        str or None
            Why it warned (:data:`mxfp16.scaling.watch.LOSS_NOT_FINITE`, ...), None if it did not.
        """
        reason = self.watch.due(scaler, used_scale, finite, losses)
        if reason is not None:
            self._sound(reason, scaler, used_scale, batch)
        return reason

    def collapsed(self, collapse, scaler, used_scale, batch):
        """The :class:`LossScaleCollapse` to raise instead of ``collapse``: with the report and
        the warning (located now if it was not yet)."""
        if self.message is None:
            self._sound("the loss scale collapsed", scaler, used_scale, batch)
        return LossScaleCollapse(f"{collapse}\n{self.message}", report=self.report)

    def _sound(self, reason, scaler, used_scale, batch):
        at_hand = batch()
        self.report, why = locate(at_hand, used_scale, self._find)
        network = None if at_hand is None else at_hand.network
        native = at_hand is not None and bfloat16_native_on(
            {array.context.device_type for array in _arrays(at_hand.inputs)})
        forward_only = at_hand is not None and not (at_hand.options.get("label") is not None or
                                                    at_hand.options.get("loss_fn") is not None)
        self.message = compose(self.caller, reason, scaler.num_steps, used_scale, self.report,
                               why=why, network=network, fixes=self.fixes, bfloat16=native,
                               scaler=scaler, forward_only=forward_only)
        self._log.warning("%s", self.message)


def trainer_batch(params):
    """The :class:`Batch` at hand for a Trainer of ``params``: the last recorded call of the
    outermost cast network holding one of them (a cast plain Block over its cast parts), None if
    none ran since the last step."""
    wanted = {id(param) for param in params}
    found = []
    for network, inputs in boundary_scale.last_calls():
        owned = [id(param) for param in network.collect_params().values()]
        if any(key in wanted for key in owned):
            found.append((len(owned), network, inputs))
    if not found:
        return None
    _, network, inputs = max(found, key=lambda entry: entry[0])
    return Batch(network, tuple(inputs), {})


__all__ = ["OverflowAlarm", "Batch", "Fixes", "CODE", "FLAGS", "compose", "keep_selectors",
           "locate", "trainer_batch"]
