"""Losses whose backward ignores the head gradient, found in the recorded graph.

``SoftmaxOutput``, ``MakeLoss`` and the ``*RegressionOutput`` ops (:data:`mxfp16.dtypes.LOSS_HEADS`)
start the gradient themselves: a loss scale multiplied into the loss, or passed in as the head
gradient, stops there.  GluonCV's segmentation losses (``SoftmaxCrossEntropyLoss``,
``MixSoftmaxCrossEntropyLoss``) are built on ``SoftmaxOutput``.  A step that divided such gradients by
the loss scale would train at 1/scale, silently.

:class:`HeadCheck` answers, per backward, whether the gradients of a loss pass through such an op:

* ops recorded one by one (a loss block that is not hybridized, as GluonCV's segmentation losses
  cannot be) are read from ``autograd.get_symbol`` of the loss (about 2 ms for an imperative
  ResNet-50);
* a hybridized block is one opaque ``_CachedOp`` node there, named by its outputs: its ops are read
  from the graph of the live block with those outputs (``HybridBlock._cached_graph``), once per
  graph;
* a ``_CachedOp`` whose block is gone (a hybridized loss block made anew in every step, a block
  hybridized again between its forward and the backward, a ``CachedOp`` made by hand) cannot be
  read: it is taken to hold such an op, and a Trainer lets the scale enter at the cast networks'
  boundary, which brings the gradients to the scale whether or not the op is there.

No extra backward ever runs: a second backward over a recorded graph is not the first one again.
MXNet 1.9's ``Dropout`` keeps one flag per recorded op, which its backward sets and only its forward
clears (``dropout_passthrough_`` in ``src/operator/nn/dropout-inl.h``), so from the second backward
on it passes the gradient through unmasked.  A zero-head-gradient probe before the real backward
(33d6280 to issue 34) made every step it ran in back-propagate through unmasked dropout.

The answer is kept per graph (its ops and the output names of its blocks), so a training loop
pays the look-up once.
"""
import logging
import re

import mxnet as mx
from mxnet import autograd

from .. import mxnet_internals
from . import boundary as boundary_scale
from ..dtypes import LOSS_HEADS

log = logging.getLogger(__name__)

#: The prefix get_symbol gives the outputs of recorded nodes (``node_12_net_dense0_fwd_output``):
#: a counter that grows from step to step, dropped from the cache key.
_NODE_COUNTER = re.compile(r"^node_\d+_|^(null|var)\d+$")


def _node_outputs(names, node, count, start):
    """``(output names, index after them)`` of the recorded node named ``node``, searched in
    ``names`` (``get_internals().list_outputs()``) from ``start`` on.  That list holds only visible
    outputs (not the masks of ``Dropout``, nor ``BatchNorm``'s batch statistics), while
    ``node_row_ptr`` counts every output: its rows do not line up with the names once such an op
    was recorded before (GluonNLP's ``WeightDrop`` calls ``nd.Dropout`` outside the hybridized
    graph)."""
    prefix = node + "_"
    for index in range(start, len(names)):
        if names[index].startswith(prefix):
            return names[index:index + count], index + count
    return [], start


def _graph(heads):
    """``(ops, key, cached)`` of the recorded graph behind ``heads``: the op names, what identifies
    the graph from one step to the next, and ``(output names, number of inputs)`` of each
    ``_CachedOp`` node."""
    ops, names, cached = [], [], []
    for head in heads:
        try:
            sym = autograd.get_symbol(head)
        except mx.base.MXNetError:  # not recorded: no graph, no op to find
            continue
        graph = mxnet_internals.graph_json(sym)
        outputs = sym.get_internals().list_outputs()
        rows, start = graph["node_row_ptr"], 0
        for index, node in enumerate(graph["nodes"]):
            if node["op"] == "_CachedOp":  # outputs named "<node name>_<block output name>"
                mine, start = _node_outputs(outputs, node["name"], rows[index + 1] - rows[index],
                                            start)
                cached.append((tuple(name[len(node["name"]) + 1:] for name in mine),
                               len(node["inputs"])))
        ops += [node["op"] for node in graph["nodes"] if node["op"] != "null"]
        names += [_NODE_COUNTER.sub("", name) for name in outputs]
    return ops, (tuple(ops), tuple(names)), cached


def symbol_ops(graph):
    """Every op of a graph in JSON form, those in subgraphs (partitioned graphs) included.

    Examples
    --------
    >>> import json
    >>> import mxnet as mx
    >>> symbol_ops(json.loads(mx.sym.SoftmaxOutput(mx.sym.var('x') * 2).tojson()))
    ['_mul_scalar', 'SoftmaxOutput']
    """
    ops = []
    for node in graph["nodes"]:
        if node["op"] != "null":
            ops.append(node["op"])
        for subgraph in node.get("subgraphs", ()):
            ops += symbol_ops(subgraph)
    return ops


def _cached_ops(cached):
    """``{signature: head-ignoring ops}`` of the live hybridized blocks whose graphs have the
    outputs (names) and the number of inputs of ``_CachedOp`` nodes (``cached``); the nodes
    without such a block are left out."""
    wanted = set(cached)
    graphs = {}
    for sym in mxnet_internals.hybridized_graphs():
        signature = (tuple(sym.list_outputs()), len(sym.list_inputs()))
        if signature in wanted:
            graphs.setdefault(signature, set()).update(
                set(symbol_ops(mxnet_internals.graph_json(sym))) & LOSS_HEADS)
    return graphs


def visible_head_ignoring_ops(heads):
    """The ops among :data:`LOSS_HEADS` recorded one by one on the way to ``heads`` (hybridized
    blocks are not looked into: see :class:`HeadCheck`).

    Parameters
    ----------
    heads : list of NDArray
        Losses computed inside ``autograd.record()``.

    Returns
    -------
    list of str
        Sorted op names, empty when there is none.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet import autograd
    >>> x = mx.nd.ones((2, 3))
    >>> x.attach_grad()
    >>> with autograd.record():
    ...     loss = mx.nd.MakeLoss(x.sum())
    >>> visible_head_ignoring_ops([loss])
    ['MakeLoss']
    """
    ops, _, _ = _graph(heads)
    return sorted(set(ops) & LOSS_HEADS)


#: What :meth:`HeadCheck.ops` names for a ``_CachedOp`` whose block is gone (its graph unread).
UNREAD_BLOCK = "a hybridized block whose graph is gone"


class HeadCheck:
    """Per-graph answers to: do the gradients of these losses ignore the head gradient?

    Each answer is the sorted list of head-ignoring ops found, ``[UNREAD_BLOCK]`` when a
    ``_CachedOp`` on the way belongs to a block that is gone, or empty.  The ops of a hybridized
    block are read from its graph, remembered by the graph's outputs: a block seen once stays
    known after it is hybridized again.  Nothing runs a backward.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet import autograd
    >>> w = mx.nd.ones((3,))
    >>> w.attach_grad()
    >>> with autograd.record():
    ...     loss = (w * 2).sum()
    >>> HeadCheck().ops([loss])
    []
    """

    def __init__(self):
        self._answers = {}
        self._blocks = {}  # (output names, number of inputs) -> head-ignoring ops of that graph

    def ops(self, heads):
        """The head-ignoring ops on the way to ``heads``.

        Parameters
        ----------
        heads : list of NDArray
            The losses, inside or just after ``autograd.record()``, before their backward.

        Returns
        -------
        list of str
        """
        ops, key, cached = _graph(heads)
        if key not in self._answers:
            found = set(ops) & LOSS_HEADS
            if not found and cached:
                unseen = [signature for signature in cached if signature not in self._blocks]
                if unseen:
                    self._blocks.update(_cached_ops(unseen))
                found = set().union(*(self._blocks.get(signature, {UNREAD_BLOCK})
                                      for signature in cached))
            self._answers[key] = sorted(found)
        return self._answers[key]


#: What each case of :func:`mxfp16.scaling.boundary.where_scale_goes` means, for the log.
_WHERE = {
    boundary_scale.SCALED_AT_BOUNDARY: (
        logging.INFO,
        "the loss scale enters the gradients at the cast networks' boundary instead (each cast "
        "network multiplies the gradient of its outputs by it and divides the one of its inputs; "
        "gradients outside the cast networks are multiplied after the backward), so the step "
        "divides by the scale as for any loss"),
    boundary_scale.NO_CAST_NETWORK: (
        logging.WARNING,
        "no network cast by mxfp16.cast_block ran while autograd recorded since the last "
        "backward (a network cast with net.cast('float16')?), so the scale has no boundary to "
        "enter at: this loss is back-propagated unscaled and the step divides by 1, as in "
        "float32, and float16 gradients below 2**-24 flush to zero on the way. Cast the network "
        "with mxfp16.cast_block (the scale then enters at its boundary), or use a loss that passes "
        "the head gradient on (gluon.loss.SoftmaxCrossEntropyLoss)"),
    boundary_scale.HEAD_INSIDE: (
        logging.WARNING,
        "the op is inside a cast network's own graph (cast with the network), behind the "
        "boundary where the scale enters: this loss is back-propagated unscaled and the step "
        "divides by 1, as in float32, and float16 gradients below 2**-24 flush to zero on the "
        "way. Cast the network without its loss and compute the loss on its float32 outputs "
        "(the scale then enters at its boundary)"),
}


def describe(ops, where=boundary_scale.NO_CAST_NETWORK):
    """``(level, sentence)`` a Trainer logs (once per case) when a loss ignores its head gradient,
    for ``where`` the scale goes (:func:`mxfp16.scaling.boundary.where_scale_goes`)."""
    level, what = _WHERE[where]
    if UNREAD_BLOCK in ops:
        return level, (
            f"the loss passes through {UNREAD_BLOCK} (a hybridized block made anew for the step "
            "or hybridized again before the backward, or a CachedOp made by hand), so mxfp16 "
            "cannot tell whether an op in it ignores the head gradient (SoftmaxOutput, MakeLoss, "
            f"*RegressionOutput) and treats the loss as one that does: {what}. Keep the block "
            "from step to step to let mxfp16 read its graph")
    return level, (f"the loss passes through {', '.join(ops)}, whose backward ignores the head "
                   "gradient (GluonCV's segmentation losses are built on SoftmaxOutput), so a "
                   f"scale multiplied into the loss would not reach the gradients: {what}")


class HeadScaling:
    """One Trainer's answer, per backward, to: how does the loss scale reach the gradients?

    ``'head'``: through the loss (its head gradient), as for any loss; ``'boundary'``: the loss
    passes through a head-ignoring op, and the scale enters at the cast networks' boundary
    (a :class:`mxfp16.scaling.boundary.ScaledBackward` is pending until :meth:`finish`);
    ``'none'``: it cannot, the backward runs unscaled.  Logged once per case.

    Parameters
    ----------
    name : str
        The caller, in the log (``'mxfp16.Trainer'``, ``'mxfp16.amp'``).
    logger : logging.Logger
        The caller's logger.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet import autograd
    >>> w = mx.nd.ones((3,))
    >>> w.attach_grad()
    >>> with autograd.record():
    ...     loss = mx.nd.MakeLoss((w * 2).sum())
    >>> HeadScaling('doctest').start([loss], [], 1024.0)
    'none'
    """

    def __init__(self, name, logger=log):
        self._name, self._log = name, logger
        self._check = HeadCheck()
        self._since = boundary_scale.recorded_calls()
        self._logged = set()
        self._pending = None

    def start(self, heads, params, scale):
        """How ``scale`` reaches the gradients of ``heads`` (see the class); ``params`` are the
        Trainer's parameters.  Runs no backward: the gradients are untouched."""
        self.finish()
        boundary_scale.finish_pending()  # another Trainer's, never stepped: not into this one
        since, self._since = self._since, boundary_scale.recorded_calls()
        if scale == 1.0:
            return "head"
        ops = self._check.ops(heads)
        if not ops:
            return "head"
        where = boundary_scale.where_scale_goes(since)
        if where not in self._logged:
            self._logged.add(where)
            level, sentence = describe(ops, where)
            self._log.log(level, "%s: %s", self._name, sentence)
        if where != boundary_scale.SCALED_AT_BOUNDARY:
            return "none"
        self._pending = boundary_scale.ScaledBackward(params, scale)
        return "boundary"

    def finish(self):
        """End the pending boundary-scaled backward, if any: ``s`` back to 1, the gradients
        outside the cast networks scaled."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.finish()
