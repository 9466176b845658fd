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
* a hybridized block is one opaque ``_CachedOp`` node there, so a graph that holds one is probed
  once: a backward with zero head gradients leaves every gradient zero unless an op ignores its head
  gradient.  The answer is kept per graph (its ops and the output names of its blocks), so a training
  loop pays the probe once.
"""
import json
import logging
import re

import mxnet as mx
import numpy as np
from mxnet import autograd

from .dtypes import LOSS_HEADS

log = logging.getLogger(__name__)

#: The prefix get_symbol gives the outputs of recorded nodes (``node_12_net_dense0_fwd_output``):
#: a counter that grows from step to step, dropped from the cache key.
_NODE_COUNTER = re.compile(r"^node_\d+_|^(null|var)\d+$")


def _graph(heads):
    """``(ops, key)`` of the recorded graph behind ``heads``: the op names, and what identifies the
    graph from one step to the next."""
    ops, names = [], []
    for head in heads:
        try:
            sym = autograd.get_symbol(head)
        except mx.base.MXNetError:  # not recorded: no graph, no op to find
            continue
        ops += [node["op"] for node in json.loads(sym.tojson())["nodes"] if node["op"] != "null"]
        names += [_NODE_COUNTER.sub("", name) for name in sym.get_internals().list_outputs()]
    return ops, (tuple(ops), tuple(names))


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
    ops, _ = _graph(heads)
    return sorted(set(ops) & LOSS_HEADS)


def _nonzero_anywhere(arrays):
    """Whether any array holds a finite value other than zero (a NaN from 0 * inf does not count)."""
    for array in arrays:
        values = array.astype("float32").asnumpy()
        if np.any(np.isfinite(values) & (values != 0)):
            return True
    return False


def _probe(heads, grads):
    """Whether a backward with zero head gradients writes any non-zero gradient (it does only
    through an op that ignores its head gradient).  Gradients that accumulate (``grad_req='add'``)
    are restored afterwards.  The probe runs in predict mode: in training mode, oneDNN's BatchNorm
    updates its running statistics in backward, and would update them twice."""
    with autograd.pause():  # trainer.backward may be called inside autograd.record()
        saved = [grad.copy() for grad in grads]
        zeros = [mx.nd.zeros(head.shape, ctx=head.context, dtype=head.dtype) for head in heads]
        autograd.backward(heads, head_grads=zeros, retain_graph=True, train_mode=False)
        found = _nonzero_anywhere(grads)
        for grad, value in zip(grads, saved):
            value.copyto(grad)
    return found


class HeadCheck:
    """Per-graph answers to: do the gradients of these losses ignore the head gradient?

    One per Trainer (the probe reads that Trainer's gradients).  Each answer is the list of ops
    found, ``['a hybridized block']`` when only the probe could tell, or empty.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet import autograd
    >>> w = mx.nd.ones((3,))
    >>> w.attach_grad()
    >>> with autograd.record():
    ...     loss = (w * 2).sum()
    >>> HeadCheck().ops([loss], [w.grad])
    []
    """

    def __init__(self):
        self._answers = {}

    def ops(self, heads, grads):
        """The head-ignoring ops on the way to ``heads``.

        Parameters
        ----------
        heads : list of NDArray
            The losses, inside or just after ``autograd.record()``, before their backward.
        grads : list of NDArray
            The gradient arrays that backward writes (for the probe of hybridized blocks).

        Returns
        -------
        list of str
        """
        ops, key = _graph(heads)
        if key not in self._answers:
            found = sorted(set(ops) & LOSS_HEADS)
            if not found and "_CachedOp" in ops and _probe(heads, grads):
                found = ["a hybridized block"]
            self._answers[key] = found
        return self._answers[key]


def describe(ops):
    """The sentence a Trainer logs when a loss ignores its head gradient (once per Trainer)."""
    return (f"the loss passes through {', '.join(ops)}, whose backward ignores the head gradient "
            "(GluonCV's segmentation losses are built on SoftmaxOutput): a loss scale would not "
            "reach the gradients, so this loss is back-propagated unscaled and the step divides by "
            "1, as in float32. Float16 gradients below 2**-24 flush to zero on the way; a loss "
            "that passes the head gradient on (gluon.loss.SoftmaxCrossEntropyLoss) is scaled")
