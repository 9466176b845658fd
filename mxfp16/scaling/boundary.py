"""The loss scale at the cast networks' boundary, for losses whose backward ignores the head gradient.

A loss through ``SoftmaxOutput``, ``MakeLoss`` or a ``*RegressionOutput`` op starts its gradient
itself, so a scale multiplied into the loss never reaches the network.  The gradients that can
underflow are the float16 ones, inside a cast network (:class:`mxfp16.casting.CastBlock`); float32 ones
outside do not.  So the scale is applied where the float16 region starts: while autograd records,
a cast network multiplies each float output by ``s`` and each float input by ``1/s``, shape-(1,)
float32 arrays (one pair per device and dtype, shared by every cast network), normally 1.  The
forward values are the network's own (``y * 1`` is ``y``), and so are the gradients while ``s`` is
1 (``g * 1`` is ``g``).  MXNet's backward reads ``s`` when it runs, so a Trainer writes the loss
scale into ``s`` just before the backward of such a loss and 1 right after (the engine orders the
writes around the backward's reads): the gradient entering each cast network is multiplied by the
scale, the one leaving it through its inputs divided by it again.  A GAN's generator, whose
gradient crosses the discriminator's cast network first, carries the scale once.

While the scale is held (between ``trainer.scale(loss)`` and the next step), a recorded call
writes ``BlockGrad(y) + s * (y - BlockGrad(y))`` instead of ``y * s``: the same value whatever
``s`` holds (an inf or NaN output gives NaN), and the same backward.

Examples
--------
>>> import mxnet as mx
>>> from mxnet import autograd
>>> x = mx.nd.array([1.0, -2.0])
>>> x.attach_grad()
>>> with autograd.record():
...     y = scale_outputs(x * 3)   # what a cast network's output goes through
>>> y
<BLANKLINE>
[ 3. -6.]
<NDArray 2 @cpu(0)>
>>> set_scale(1024.0)
>>> y.backward()
>>> set_scale(1.0)
>>> x.grad
<BLANKLINE>
[3072. 3072.]
<NDArray 2 @cpu(0)>
"""
import weakref

import mxnet as mx
import numpy as np
from mxnet import autograd

from ..numpy_interface import legacy, like

#: Where the scale of a head-ignoring loss goes, in the words of the Trainer's log.
SCALED_AT_BOUNDARY = "boundary"
NO_CAST_NETWORK = "no cast network"
HEAD_INSIDE = "head inside"


class _State:
    scale = 1.0  # what every factor array holds now (its inverse: 1 / scale)
    factors = {}  # (context, dtype name) -> (s, 1/s)
    calls = 0  # recorded calls of cast networks so far
    head_calls = 0  # those of graphs that hold a head-ignoring op themselves
    networks = weakref.WeakSet()  # cast networks that ran while autograd recorded
    # id(cast network) -> (a weak reference to it, the inputs of its last recorded call: references,
    # no copy), until a step ends: where the overflow warning finds the batch at hand
    # (mxfp16.overflow_warning).  A plain dict: a WeakKeyDictionary's set and clear cost 8 us a
    # step, this 1.6 us.
    last_calls = {}
    pending = None  # the ScaledBackward whose scale the factors hold


def _factors(array):
    key = (array.context, np.dtype(array.dtype).name)
    if key not in _State.factors:
        _State.factors[key] = tuple(
            mx.nd.full((1,), value, ctx=array.context, dtype=array.dtype)
            for value in (_State.scale, 1.0 / _State.scale))
    return _State.factors[key]


def _is_float(value):
    return isinstance(value, mx.nd.NDArray) and value.size > 0 and \
        np.issubdtype(np.dtype(value.dtype), np.floating)


def _times(value, factor):
    """``value`` times ``factor`` (an ``mx.np.ndarray`` through a legacy view, handed back as
    one: the view shares its memory and autograd history)."""
    array = legacy(value)
    if _State.scale == 1.0:
        return like(mx.nd.broadcast_mul(array, factor), value)
    fixed = mx.nd.BlockGrad(array)
    return like(fixed + mx.nd.broadcast_mul(factor, array - fixed), value)


def _view(factor):
    """A view of a factor, one per recorded op: the memory is shared (a write reaches every
    view), the autograd node is not.  Recorded directly, the shared array would be one node of
    every graph, and the backward of one graph (the discriminator's, in a GAN step) frees it
    under the others (``The any container is empty requested=...AGInfo``)."""
    with autograd.pause():
        return factor.reshape((1,))


def _map(value, which):
    if isinstance(value, (list, tuple)):
        return type(value)(_map(item, which) for item in value)
    return _times(value, _view(_factors(value)[which])) if _is_float(value) else value


def scale_outputs(outputs):
    """A cast network's outputs (an NDArray, or nested lists), each float one times ``s``: the
    same values, whose gradient is multiplied by the scale set at backward time.  Call while
    autograd records."""
    return _map(outputs, 0)


def scale_inputs(inputs):
    """A cast network's inputs, each float one times ``1/s`` (see :func:`scale_outputs`)."""
    return _map(inputs, 1)


def note_call(network, holds_head):
    """Count a recorded call of a cast network; ``holds_head``: its graph has a head-ignoring op,
    whose gradient the boundary would divide by the scale without having multiplied it."""
    _State.calls += 1
    _State.head_calls += bool(holds_head)
    _State.networks.add(network)


def keep_call(network, inputs):
    """Keep the arguments of a recorded call of a cast network (a :class:`CastBlock` or a cast
    plain Block), by reference, until :func:`forget_calls`: the batch an overflow is located on,
    with nothing copied or computed."""
    _State.last_calls[id(network)] = (weakref.ref(network), inputs)


def last_calls():
    """``[(cast network, inputs of its last recorded call)]`` since the last :func:`forget_calls`
    (networks gone since left out)."""
    return [(network, inputs) for network, inputs in
            ((ref(), inputs) for ref, inputs in _State.last_calls.values()) if network is not None]


def forget_calls():
    """Drop the inputs :func:`note_call` kept (a step's end: its batch is not held after it)."""
    if _State.last_calls:
        _State.last_calls.clear()


def recorded_calls():
    """``(calls, head_calls)`` so far: a Trainer compares them with those of its last backward."""
    return _State.calls, _State.head_calls


def set_scale(scale):
    """Write ``scale`` into every ``s`` and its inverse into every ``1/s`` (engine-ordered
    after the reads of the ops queued before)."""
    scale = float(scale)
    if scale == _State.scale:
        return
    _State.scale = scale
    with autograd.pause():  # the factors are inputs of recorded ops: written outside the record
        for factor, inverse in _State.factors.values():
            factor[:] = scale
            inverse[:] = 1.0 / scale


def current_scale():
    """What ``s`` holds now (1.0 outside a backward of a head-ignoring loss)."""
    return _State.scale


def where_scale_goes(since):
    """Where a head-ignoring loss's scale can go, given :func:`recorded_calls` at the last
    backward (``since``): :data:`SCALED_AT_BOUNDARY`, :data:`NO_CAST_NETWORK` (no cast network
    ran while autograd recorded since) or :data:`HEAD_INSIDE` (one that ran holds the op)."""
    calls, head_calls = since
    if _State.head_calls > head_calls:
        return HEAD_INSIDE
    return SCALED_AT_BOUNDARY if _State.calls > calls else NO_CAST_NETWORK


class ScaledBackward:
    """One backward (or the user's, after ``trainer.scale``) whose loss scale enters at the cast
    networks' boundary.

    On creation ``s`` takes the scale (one at a time: a new one finishes the one before, so a
    scale left set by a ``trainer.scale(loss)`` that was never stepped does not reach another
    backward).  :meth:`finish` sets it back to 1 and brings the gradients of
    the Trainer's parameters outside every cast network (float32 code between the loss and a cast
    network, whose gradients the boundary did not scale) to the same scale.  Those with
    ``grad_req='add'`` are zeroed here and get ``saved + scale * new`` there, so what they held
    before is not multiplied again.

    Parameters
    ----------
    params : list of Parameter
        The Trainer's parameters.
    scale : float
    """

    def __init__(self, params, scale):
        finish_pending()
        inside = {id(param) for network in list(_State.networks)
                  for param in network.collect_params().values()}
        self.scale = float(scale)
        self._outside = [param for param in params
                         if param.grad_req != "null" and id(param) not in inside]
        self._saved = []
        with autograd.pause():  # trainer.scale(loss) is called inside autograd.record()
            for param in self._outside:
                if param.grad_req == "add":
                    for grad in param.list_grad():
                        self._saved.append((grad, grad.copy()))
                        grad[:] = 0
        set_scale(self.scale)
        _State.pending = self

    def finish(self):
        """Set ``s`` back to 1 and scale the gradients outside the cast networks (once)."""
        if _State.pending is not self:
            return
        _State.pending = None
        set_scale(1.0)
        with autograd.pause():
            for param in self._outside:
                if param.grad_req == "write":
                    for grad in param.list_grad():
                        grad *= self.scale
            for grad, saved in self._saved:
                grad *= self.scale
                grad += saved
        self._outside, self._saved = [], []


def finish_pending():
    """Finish the :class:`ScaledBackward` in progress, if any (whichever Trainer started it)."""
    if _State.pending is not None:
        _State.pending.finish()
