"""A network under diagnosis: its calls traced into parts, run as float32 and as its cast.

A HybridBlock (float32 or cast) is one part, traced from the call the locator is given.  A plain
``gluon.Block`` (Python code around HybridBlocks, GluonNLP's ``NMTModel``) runs its own
``forward``; while it does, each of its outermost HybridBlocks (cast or not) is routed to the run's
graph of that block, called with what the Block's code passes it (``forward`` replaced on the
instance for the run, then put back).
"""
import contextlib

import mxnet as mx
from mxnet import autograd, gluon

from .. import mxnet_internals
from ..casting.block import CastBlock
from ..casting.keep import Keep
from ..casting.plain_block import CastPlainBlock
from ..casting.selectors import BlockIndex
from ..casting.signature import call_structure
from .capture import Run, training_step
from .graphs import recast_part, trace_part

__all__ = ["Session", "first_context"]


#: Every op kept in float32: a part of a cast plain Block that its ``keep_float32`` left float32.
_KEEP_ALL = Keep(lambda name, op=None: True)


def first_context(inputs):
    """The device of the first array among ``inputs`` (nested lists allowed).

    Raises
    ------
    TypeError
        When there is no array.
    """
    flat, _ = mxnet_internals.flatten_call(list(inputs))
    arrays = [array for array in flat if array is not None]
    if not arrays:
        raise TypeError("the network's inputs hold no array: pass the batch the network is "
                        "called with, as net(*inputs) takes it")
    return arrays[0].context


def _hybrid_parts(block, prefix=""):
    """``{path: HybridBlock}`` of the outermost HybridBlocks of a plain Block."""
    parts = {}
    for name, child in mxnet_internals.block_children(block).items():
        if isinstance(child, gluon.HybridBlock):
            parts[prefix + name] = child
        else:
            parts.update(_hybrid_parts(child, f"{prefix}{name}."))
    return parts


def _symbolic(args):
    flat, _ = mxnet_internals.flatten_call(list(args))
    return any(isinstance(item, mx.sym.Symbol) for item in flat)


def _routed_forward(block, path, run, ctx):
    """``forward`` of a plain Block's part for the run: arrays go to the run's graph, Symbols (the
    part being traced) to the block's own ``forward``."""
    own = type(block).forward.__get__(block)

    def forward(*args):
        return own(*args) if _symbolic(args) else run.call(path, list(args), ctx)
    return forward


class Session:
    """A network and the dtype it is diagnosed in.

    Parameters
    ----------
    net : gluon.Block
        A HybridBlock, float32 or cast by :func:`mxfp16.cast_block`, or a plain Block made of
        HybridBlocks (float32, or cast in place).
    dtype : {'float16', 'bfloat16'}
    training : bool
        Run the batch as a training step (training mode, the backward of a loss), or as
        inference (inference mode, the forward pass alone).

    Attributes
    ----------
    index : BlockIndex
        The network's blocks, which name the block an op belongs to.
    """

    def __init__(self, net, dtype, training=True):
        self.net, self.dtype, self.training = net, dtype, training
        self.index = BlockIndex(net)
        self.plain = not isinstance(net, gluon.HybridBlock)
        self.keep = None  # a Keep the target graphs are cast again with (see with_keep)
        self._parts = {}

    def part(self, key, call):
        """The :class:`~mxfp16.diagnose.graphs.Part` of the network's part ``key`` (``''``: the
        network) called with ``call``, traced once per shape of call."""
        base = (key, call_structure(call)[2], None)
        if base not in self._parts:
            block = self.net if key == "" else self.index.paths[key]
            part = trace_part(block, call, self.dtype, self.training)
            if isinstance(self.net, CastPlainBlock) and not isinstance(block, CastBlock):
                part = recast_part(part, self.dtype, _KEEP_ALL)  # kept float32 at the cast
            self._parts[base] = part
        if self.keep is None:
            return self._parts[base]
        # the Keep itself, not its id(): held by the key, it cannot be freed and its id given to
        # the next round's Keep, which would then find this round's graph
        kept = base[:2] + (self.keep,)
        if kept not in self._parts:
            self._parts[kept] = recast_part(self._parts[base], self.dtype, self.keep)
        return self._parts[kept]

    @contextlib.contextmanager
    def with_keep(self, keep):
        """Cast the target graphs keeping ``keep`` (a ``Keep``) in float32 in the body."""
        previous, self.keep = self.keep, keep
        try:
            yield
        finally:
            self.keep = previous

    @contextlib.contextmanager
    def _routed(self, run, ctx):
        """A plain Block's HybridBlocks called through ``run`` in the body."""
        parts = _hybrid_parts(self.net) if self.plain else {}
        saved = {path: vars(block).get("forward") for path, block in parts.items()}
        for path, block in parts.items():
            block.forward = _routed_forward(block, path, run, ctx)
        try:
            yield
        finally:
            for path, block in parts.items():
                if saved[path] is None:
                    del block.forward
                else:
                    block.forward = saved[path]

    def run(self, kind, inputs, listener, label=None, loss_fn=None, loss_scale=1.0):
        """Run the batch in one kind of graph (``'float32'`` or ``'target'``): the forward pass in
        training mode and, with a loss, the backward at ``loss_scale`` (for a session of inference,
        the forward pass in inference mode).  Returns ``(run, loss)``."""
        ctx = first_context(inputs)
        run = Run(self.part, kind, listener, taps=self.training)

        def forward():
            if self.plain:
                return self.net(*inputs)
            return run.call("", list(inputs), ctx)

        with self._routed(run, ctx):
            if self.training:
                loss = training_step(forward, label, loss_fn, loss_scale, listener)
            else:
                with autograd.predict_mode():
                    forward()
                loss = None
        if loss is not None:
            run.parameters()
        errors = [runner.error for _, runner in run.runners if runner.error is not None]
        if errors:
            raise errors[0]
        return run, loss


def check_inputs(inputs):
    """Refuse inputs that are not arrays (or nested lists of them, None allowed)."""
    try:
        flat, _ = mxnet_internals.flatten_call(list(inputs))
    except ValueError:
        flat = [None, object()]
    bad = [item for item in flat if item is not None and not isinstance(item, mx.nd.NDArray)]
    if bad:
        raise TypeError(f"the network's inputs must be NDArrays (mx.nd or mx.np), None or lists "
                        f"of them, got {type(bad[0]).__name__}: pass the batch as the network "
                        "takes it, net(*inputs)")
