"""The fix of forward culprits: the blocks to keep in float32, checked by running the batch again.

Keeping the innermost block that owns a culprit is usually enough: its ops then run in float32.
It is not when the value that overflows leaves the block: the block's float32 output still meets
the float16 op that reads it, and overflows there (a feed-forward layer whose output is beyond
65504 feeds its activation).  So the batch runs again in the target dtype with the blocks kept
(:func:`mxfp16.casting.keep.block_keep`, as ``cast_block(..., keep_float32=...)`` keeps them),
and an overflow that still starts inside a kept block widens it to the block around it when
that block holds the ops reading the value (the feed-forward block of a layer whose output feeds
its activation), or else adds their blocks (a convolution's BatchNorm, both children of the
network); an overflow in a block not kept adds that block; until the forward pass has no culprit
or :data:`MAX_ROUNDS` runs have not found one.  Each run is the training step ``cast_block(...,
keep_float32=...)`` gives (the forward, the loss and the backward at the loss scale, the ops
selected as it selects them), and the fix is checked when that step's loss and parameter
gradients are finite too, but where a backward culprit says its gradients overflow at the loss
scale (which the first run's forward overflow hid; the scale's to lower, not a block's).  A
graph without blocks (a ``SymbolBlock``: a Module's graph, a checkpoint) is fixed by op names
instead, as ``cast_block`` selects its ops: the op, then the ops reading its value.
"""
import math
from collections import namedtuple

from ..casting.keep import block_keep, graph_keep
from .culprits import find_culprits
from .reading import Reader

__all__ = ["MAX_ROUNDS", "Fix", "find_fix"]

#: What :func:`find_fix` found: the selectors to keep, whether they fix the batch (None: nothing to
#: fix), the backward culprits ``(Culprit, place)`` of the step with them kept, and their ``Keep``
#: (None unless ``fixed``).
Fix = namedtuple("Fix", ["selectors", "fixed", "backward", "keep"])

#: Runs of the batch that look for a fix before giving up.
MAX_ROUNDS = 4


def kept_paths(net):
    """The block paths a cast network keeps in float32 already (``cast_block``'s
    ``keep_float32``)."""
    return list(getattr(net, "keep_float32", ()) or ())


def _parent(path):
    return path.rpartition(".")[0]


def _covering(path, paths):
    """The path of ``paths`` that is ``path`` or contains it, or None."""
    return next((p for p in paths if path == p or path.startswith(p + ".")), None)


def _widened(paths, starts):
    """``paths`` with what the forward culprits (``(Culprit, place)``) ask: a block not kept
    added; a kept block that still overflows (where its float32 value meets a float16 op) widened
    to the block around it when that holds the ops reading the value, else those ops' blocks
    added; None when a culprit cannot be fixed by a block (the network's own op, a parameter, an
    input)."""
    paths = list(paths)
    for culprit, place in starts:
        if not culprit.path or culprit.op_type in ("parameter", "input"):
            return None
        covering = _covering(culprit.path, paths)
        if covering is None:
            paths.append(culprit.path)
            continue
        readers = list(dict.fromkeys(p for p, _ in place[4] if p and _covering(p, paths) is None))
        parent = _parent(covering)
        if parent and all(_covering(p, [parent]) for p in readers):
            paths[paths.index(covering)] = parent  # the block around it holds the readers
        elif readers:
            paths += readers
        else:
            return None
    outermost = [p for p in paths if _covering(p, [q for q in paths if q != p]) is None]
    return list(dict.fromkeys(outermost))


def _named(names, starts):
    """``names`` (op names, for a graph without blocks: a ``SymbolBlock``) with what the forward
    culprits ask: the op added, or for an op kept already the ops reading its value; None when
    none can be (a parameter, an input, no reader left)."""
    names = list(names)
    for culprit, place in starts:
        if culprit.op_type in ("parameter", "input"):
            return None
        readers = [op for _, op in place[4] if op not in names]
        if culprit.op not in names:
            names.append(culprit.op)
        elif readers:
            names += readers
        else:
            return None
    return names


def _keep(session, selectors, by_name, call):
    """The ``Keep`` of ``selectors`` as ``cast_block(..., keep_float32=selectors)`` resolves them:
    block paths, or for a graph without blocks globs of op names (and of the Gluon names they
    start with) on its graph, with the ops the cast network kept already."""
    if not by_name:
        return block_keep(session.index, selectors)[0]
    keep = graph_keep(session.part("", call).float32, selectors)
    existing = getattr(session.net, "_keep", None)
    return keep if existing is None else existing | keep


def _finite_step(reading, backward):
    """Whether a target run's step is what a fix may leave: a finite loss, and finite parameter
    gradients unless a backward culprit (``backward``, a gradient beyond float16 at the loss
    scale, the scale's to lower) accounts for them: whatever the analysis of culprits says, a
    step that NaN reaches otherwise is not fixed."""
    return (reading.loss is None or math.isfinite(reading.loss)) and (bool(backward) or all(
        math.isfinite(values[0]) for values in reading.parameters.values()))


def find_fix(session, batch, findings):
    """The :class:`Fix` of a batch's forward culprits: the block paths to keep in float32 (those
    a cast network keeps already included, ready for ``cast_block(..., keep_float32=paths)``), or
    the op names for a graph without blocks (a ``SymbolBlock``, selected by op names); whether
    the batch's training step, cast as ``cast_block`` casts it with them kept, then has no forward
    culprit and a finite loss and parameter gradients but for a backward culprit; and the
    backward culprits of that step (gradients beyond float16 at the loss scale, which the first
    run's forward overflow hid).

    Parameters
    ----------
    session : Session
        The network under diagnosis.
    batch : dict
        ``inputs``, ``label``, ``loss_fn``, ``loss_scale`` of
        :meth:`mxfp16.diagnose.session.Session.run`.
    findings : Findings
        What the batch gave without the fix (:func:`~mxfp16.diagnose.culprits.find_culprits`).
    """
    forward = [(c, place) for c, place in findings.culprits if c.phase == "forward"]
    if not forward:
        return Fix([], None, [], None)
    by_name = not session.index.paths
    paths = [] if by_name else kept_paths(session.net)
    for _ in range(MAX_ROUNDS):
        widened = (_named if by_name else _widened)(paths, forward)
        if widened is None or widened == paths:
            return Fix([] if by_name else
                       [p for p in dict.fromkeys(c.path for c, _ in forward) if p], False, [], None)
        paths, keep = widened, _keep(session, widened, by_name, list(batch["inputs"]))
        with session.with_keep(keep):
            reader = Reader(target=True)
            _, loss = session.run("target", batch["inputs"], reader, batch["label"],
                                  batch["loss_fn"], batch["loss_scale"])
            reading = reader.read(loss)
            culprits = find_culprits(reading, session.index).culprits
        forward = [(c, place) for c, place in culprits if c.phase == "forward"]
        if not forward:
            backward = [(c, place) for c, place in culprits if c.phase == "backward"]
            fixed = _finite_step(reading, backward)
            return Fix(paths, fixed, backward, keep if fixed else None)
    return Fix(paths, False, [], None)
