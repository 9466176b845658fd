"""``mxfp16.find_overflow``: which op of a network overflows in float16, in which pass, and the fix.

One batch runs twice on the capture engine (:mod:`mxfp16.diagnose.capture`), each run a training
step (the forward pass in training mode, the loss, the backward at the loss scale): first cast to
the target dtype (float16 emulated on a CPU with every float16 value rounded as a GPU stores it,
the float16 GPU graph where MXNet sees a GPU, bfloat16), whose every op output and every gradient
stored in float16 MXNet's op hook checks for inf and NaN; then in float32, which gives the
magnitudes there and each gradient's values float16 flushes to zero.
:mod:`mxfp16.diagnose.culprits` tells where an overflow starts; :mod:`mxfp16.diagnose.fix` finds
the blocks to keep in float32 (``cast_block(..., keep_float32=...)``), running the batch again to
check them.

Cost: the two runs, and one more per round of the fix when the forward overflows (ResNet-50 v1 at
batch 16, 224 px, float16 emulated: see docs/benchmarks.md).  Memory: one run's.
"""
import logging
import math

from mxnet import gluon

from ..casting.block import CastBlock
from ..dtypes import check_dtype
from .culprits import find_culprits, underflow_rows, wanted, with_magnitudes
from .fix import find_fix
from .graphs import random_ops
from .reading import Reader
from .session import Session, check_inputs

__all__ = ["OverflowReport", "find_overflow"]

log = logging.getLogger(__name__)

#: Dtypes the locator runs in.
TARGET_DTYPES = ("float16", "bfloat16")


def _magnitude(value):
    return "nan" if math.isnan(value) else "inf" if math.isinf(value) else f"{value:.3g}"


def _held(value):
    """What the target dtype holds at a culprit: inf, or (a NaN sum) NaN or both signs of inf."""
    return "inf" if math.isinf(value) else "inf/nan"


class OverflowReport:
    """What :func:`find_overflow` found.

    Attributes
    ----------
    culprits : list of Culprit
        Where an overflow starts (see :mod:`mxfp16.diagnose.culprits`), forward ones first, each
        pass in execution order: ``path`` (the owning block, ``''`` for the network's own ops or
        an input), ``op``, ``phase`` (``'forward'`` or ``'backward'``), ``max_abs`` (float32's
        largest magnitude there), ``tensor``, ``value`` (the target dtype's), ``op_type``.
    keep_float32 : list of str
        The block paths that fix the forward culprits, checked by running the batch again with
        them kept (:mod:`mxfp16.diagnose.fix`), those a cast network keeps already included:
        ``cast_block(net, dtype, keep_float32=report.keep_float32)``, ``--keep-float32
        ','.join(report.keep_float32)``.
    fixed : bool or None
        Whether the batch's training step (forward, loss, backward at the loss scale) with
        ``keep_float32`` kept, cast as ``cast_block(..., keep_float32=...)`` casts it, has no
        forward culprit, a finite loss and finite parameter gradients, but for those a backward
        culprit accounts for (see ``backward_after_fix``; None without forward culprits;
        False when no block fixes them: the network's own op, an input, or more rounds than
        :data:`mxfp16.diagnose.fix.MAX_ROUNDS`).
    backward_after_fix : list of Culprit
        The backward culprits of that step (their ``max_abs`` not read): gradients beyond
        float16 at this loss scale, which the forward overflow hid; the loss scale's to lower
        (dynamic loss scaling does), not a block's.
    underflow : list of Underflow
        For each output the cast keeps in float16 (and each float16 parameter), the share of
        its float32 gradient values, at the loss scale, that float16 flushes to zero; when the
        forward pass overflows, those the fix leaves in float16 (``fixed``), or none (not
        measured: without a fix float16's gradients are inf/NaN).
    propagated : dict
        ``{'forward': n, 'backward': m}``: outputs that overflow only because an input did.
    contained : list of Culprit
        Forward overflows that start at an op but reach no output of the network (inf by
        design: GluonNLP's attention fills masked scores with -1e18, which a softmax turns into
        0); not culprits.
    dtype, loss_scale : str, float
        What the batch ran in.
    losses : (float or None, float or None)
        The largest magnitude of the loss in float32 and in the target dtype.
    random_ops : list of str
        Random ops other than Dropout (whose draws differ between the runs and moved MXNet's
        generator).
    """

    def __init__(self, culprits, keep_float32, underflow, propagated, dtype, loss_scale,
                 losses=(None, None), random=(), contained=()):
        self.culprits = list(culprits)
        self.keep_float32 = list(keep_float32)
        self.underflow = list(underflow)
        self.propagated = dict(propagated)
        self.dtype, self.loss_scale = dtype, loss_scale
        self.losses = tuple(losses)
        self.random_ops = list(random)
        self.contained = list(contained)
        self.fixed = None
        self.backward_after_fix = []

    def __bool__(self):
        return bool(self.culprits)

    @property
    def phases(self):
        """The passes that overflow, in order: ``['forward']``, ``['backward']``, both or none."""
        return [phase for phase in ("forward", "backward")
                if any(c.phase == phase for c in self.culprits)]

    def in_phase(self, phase):
        """The culprits of one pass (``'forward'`` or ``'backward'``)."""
        return [c for c in self.culprits if c.phase == phase]

    def fix(self):
        """The fix as code (``"keep_float32=['att']"``), or None when there is none to give
        (``fixed`` says whether it was enough)."""
        return f"keep_float32={self.keep_float32!r}" if self.keep_float32 else None

    def underflowing(self, fraction=0.01):
        """The rows of ``underflow`` that lose more than ``fraction`` of their values."""
        return [row for row in self.underflow if row.fraction > fraction]

    def __str__(self):
        head = (f"find_overflow ({self.dtype}, loss scale {self.loss_scale:g}): "
                f"{len(self.culprits) or 'no'} culprit{'s' if len(self.culprits) != 1 else ''}"
                f"{' (' + ', '.join(self.phases) + ')' if self.culprits else ''}")
        lines = [head]
        if self.culprits:
            rows = [("phase", "block", "op", "tensor", self.dtype, "float32 max |x|")] + [
                (c.phase, c.path or "(network)", c.op, c.tensor, _held(c.value),
                 _magnitude(c.max_abs)) for c in self.culprits]
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            lines += ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths))
                      .rstrip() for row in rows]
            lines.append(f"  propagated: {self.propagated['forward']} forward, "
                         f"{self.propagated['backward']} backward")
        if self.keep_float32:
            step = "forward pass" if self.losses[0] is None else "training step"
            later = list(dict.fromkeys(c.tensor for c in self.backward_after_fix))
            checked = (f"checked: the batch's {step} then has no forward culprit" + (
                f"; its gradients then overflow at loss scale {self.loss_scale:g} at "
                f"{', '.join(later[:3])}: lower the scale (dynamic loss scaling does)"
                if later else "") if self.fixed else
                f"not enough: the batch's {step} still overflows with these kept")
            lines.append(f"fix: cast_block(net, {self.dtype!r}, {self.fix()})   "
                         f"(scripts: --keep-float32 {','.join(self.keep_float32)}; {checked})")
        elif self.fixed is False:
            lines.append("fix: no block to keep (an op of the network itself, a parameter or an "
                         "input overflows): keep its block's parent, normalize the input, or cast "
                         "to float32")
        lost = self.underflowing()
        if self.losses[0] is None:
            lines.append("backward: not run (no loss: pass label= and/or loss_fn=)")
        elif self.dtype == "float16" and self.fixed is False:
            lines.append("underflow: not measured: the forward pass overflows float16 and no fix "
                         "was found, so the gradients float16 would store are inf/NaN")
        elif self.dtype == "float16":
            lines.append(f"underflow{' with the fix kept' if self.fixed else ''}: {len(lost)} of "
                         f"{len(self.underflow)} float16 gradients lose more than 1% of their "
                         "values to zero" + (": " + ", ".join(
                             f"{row.tensor} {row.fraction:.1%}" for row in lost[:4]) if lost else ""))
        if self.contained:
            lines.append(f"contained: {len(self.contained)} overflow(s) reach no output (inf by "
                         f"design, such as masks): {', '.join(c.op for c in self.contained[:3])}")
        if self.random_ops:
            lines.append(f"note: random ops {self.random_ops[:4]} drew differently in the two "
                         "runs and moved MXNet's generator")
        return "\n".join(lines)


def _check(net, dtype, loss_scale, loss_fn):
    if not isinstance(net, gluon.Block):
        raise TypeError(f"find_overflow takes a Gluon network (a Block), got "
                        f"{type(net).__name__}: pass the network the batch is fed to")
    dtype = check_dtype(dtype)
    if dtype not in TARGET_DTYPES:
        raise ValueError(f"dtype={dtype!r}: find_overflow runs in one of {', '.join(TARGET_DTYPES)}"
                         " (float32 is the reference it compares with)")
    if isinstance(net, CastBlock) and getattr(net, "_cast_dtype", dtype) != dtype:
        log.info("mxfp16: find_overflow casts the network to %s, not %s as it was cast", dtype,
                 net._cast_dtype)
    if not (isinstance(loss_scale, (int, float)) and math.isfinite(loss_scale) and loss_scale > 0):
        raise ValueError(f"loss_scale={loss_scale!r}: give a positive number, the scale the "
                         "training step multiplies the loss by (1 without loss scaling)")
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f"loss_fn={loss_fn!r}: give a callable, loss_fn(output, label) or "
                        "loss_fn(output) (a gluon.loss.Loss)")
    return dtype


def find_overflow(net, *inputs, label=None, loss_fn=None, dtype="float16", loss_scale=1.0):
    """Run one batch in float32 and in ``dtype`` and name the ops where float16 overflows.

    Parameters
    ----------
    net : gluon.Block
        A float32 network, or one cast by :func:`mxfp16.cast_block` (traced from its float32
        original and cast the same way, its ``keep_float32`` blocks kept); a plain Block made of
        HybridBlocks runs its own code, its HybridBlocks (cast or not) examined.  Nothing of it
        changes: parameters, gradients, the Trainer's state, hybridized graphs, and MXNet's
        random generator (its Dropout masks are drawn by the locator, the same in both runs).
    *inputs : NDArray
        The batch, as ``net(*inputs)`` takes it, on one device the network is on.
    label : NDArray, optional
        The labels, for the loss.
    loss_fn : callable, optional
        ``loss_fn(output, label)`` (or ``loss_fn(output)`` without a label), per-sample losses
        as Gluon's losses give them.  Default: softmax cross-entropy when a label is given; with
        neither, only the forward pass runs.
    dtype : {'float16', 'bfloat16'}
    loss_scale : float
        The scale the loss is multiplied by before the backward, as training does.

    Returns
    -------
    OverflowReport
        True when there are culprits; ``str(report)`` is a table.

    Raises
    ------
    TypeError, ValueError
        For a network or inputs of the wrong kind, a dtype other than float16 and bfloat16, a
        loss scale that is not a positive number.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(4, in_units=2), nn.Dense(2, in_units=4))
    >>> net.initialize(mx.init.Constant(300))
    >>> report = find_overflow(net, mx.nd.ones((1, 2)))  # 600, then 4 * 600 * 300 (zero biases)
    >>> [(c.path, c.op, c.phase, c.max_abs) for c in report.culprits]
    [('1', 'net_dense1_fwd', 'forward', 720000.0)]
    >>> report.keep_float32
    ['1']
    """
    dtype = _check(net, dtype, loss_scale, loss_fn)
    check_inputs(inputs)
    if loss_fn is None and label is not None:
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    session = Session(net, dtype)
    reader = Reader(target=True)
    target_run, loss = session.run("target", inputs, reader, label, loss_fn, loss_scale)
    target = reader.read(loss)
    findings = find_culprits(target, session.index)
    reader = Reader(target=False, wanted=wanted(findings), counts=dtype == "float16")
    ref_run, loss = session.run("float32", inputs, reader, label, loss_fn, loss_scale)
    reference = reader.read(loss)
    culprits, contained = with_magnitudes(findings, reference,
                                          [runner for _, runner in ref_run.runners])
    random = [name for _, runner in ref_run.runners for name in random_ops(runner.graph)]
    underflow = underflow_rows(reference, session.index) if dtype == "float16" else []
    batch = {"inputs": inputs, "label": label, "loss_fn": loss_fn, "loss_scale": loss_scale}
    fix = find_fix(session, batch, findings)
    if fix.fixed is False:  # float16 overflows with or without what it kept: its gradients are NaN
        underflow = []
    elif fix.keep is not None:  # the gradients the fix leaves in float16
        underflow = [row for row in underflow if not fix.keep(row.op)]
    report = OverflowReport(culprits, fix.selectors, underflow, findings.propagated, dtype,
                            float(loss_scale), (reference.loss, target.loss), random, contained)
    report.fixed, report.backward_after_fix = fix.fixed, [culprit for culprit, _ in fix.backward]
    return report
