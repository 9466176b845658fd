"""The capture engine: a network's batch run as MXNet graphs whose outputs an op hook reads.

Each run executes a :class:`~mxfp16.diagnose.graphs.Part`'s float32 graph or its cast as a
``CachedOp`` of its own (not inlined, no ``static_alloc``: MXNet's ``register_op_hook`` then sees
every op) on copies of the network's parameters, so the network, its parameters and gradients,
its Trainer and its hybridized graphs are left as they were.  What MXNet 1.9.1's hook reports
(``src/imperative/cached_op.cc``, ``imperative_utils.cc``): in the forward pass, every output of
every op, named ``<node>_<output>`` (``'fc_output'``, ``'bn_mean'``, ``'relu0_0'``); in the
backward pass, every output of every backward node (``'fc_backward_0'``: the gradient of the
node's first input), and never their inputs; an inlined graph (two ops or fewer, by default) runs
its backward through autograd instead and reports nothing; with ``static_alloc`` the ops run in
bulked segments that report nothing.  The gradient of an op's output is read at a tap
(:func:`~mxfp16.diagnose.probes.add_gradient_taps`) on each output the cast graph keeps in
float16: the tap's backward node outputs it; an emulated graph, whose float16 outputs are each
read through one rounding, needs no tap: the rounding's backward node outputs the gradient as
float16 stores it.

What is read is left to a *listener*: ``forward(runner, key, array)`` for each op output (``key``
is ``(call, node id, output index)``), ``backward(runner, name, array)`` for each tapped gradient
(``name`` the output tapped; a part called several times reports it once per call, in the
backward's order), ``inputs(runner, {name: array})`` for each call's data and
``parameter(runner, name, gradient)`` after the backward.
A listener computes what it keeps on MXNet's engine, so a run waits on the device once.
"""
import ctypes

import mxnet as mx
import numpy as np
from mxnet import autograd

from .. import mxnet_internals, numpy_interface
from ..casting.params import stored_as
from ..numpy_interface import legacy
from ..casting.signature import call_structure
from ..optimizers import master_copies
from .graphs import DROPOUT_MASK, GraphView, draw_masks
from .probes import TAP_SUFFIX, add_gradient_taps, round_float16_outputs, rounding_points

__all__ = ["GraphRunner", "float32_on", "as_float32", "Run"]

#: The suffix of a node's first backward output, and of a tap's, as the hook names them.
_BACKWARD = "_backward_0"
_TAP_BACKWARD = TAP_SUFFIX + _BACKWARD

#: Flags of the locator's CachedOps: never inlined, so the backward runs in the CachedOp, where the
#: hook sees it.
_CACHED_OP_FLAGS = [("inline_limit", 0)]


def as_float32(array):
    """A float16 or bfloat16 array widened to float32 (exact), for reductions: MXNet's CPU
    reductions over float16 are several times slower, and bfloat16 has none."""
    if array.dtype == np.float32:
        return array
    if array.dtype == np.float16:
        return array.astype("float32")
    return mx.nd.amp_cast(array, dtype="float32")


def is_float(array):
    """Whether an array holds floating-point values (float16, bfloat16, float32, float64)."""
    dtype = np.dtype(array.dtype)
    return dtype.kind == "f" or dtype.names == ("bfloat16",)


def float32_on(param, ctx):
    """A parameter's float32 value on ``ctx``, a copy: the optimizer's master copy when the value
    there is that copy rounded, else the value widened.

    Raises
    ------
    ValueError
        When the parameter has no value on ``ctx`` (the inputs on a device the network is not on)
        or none at all yet.
    """
    try:
        data = legacy(param.data(ctx))
    except (RuntimeError, mx.gluon.parameter.DeferredInitializationError) as error:
        raise ValueError(f"parameter {param.name!r} has no value on {ctx} "
                         f"({' '.join(str(error).split())[:120]}...): call the network once, "
                         "net(*inputs), before find_overflow, with inputs on a device it is "
                         "initialized on") from None
    masters = [m for m in master_copies(param) if m.context == ctx]
    if masters and bool((masters[0].astype(data.dtype) == data).min().asscalar()):
        return masters[0].copy()
    return data.astype("float32")


class GraphRunner:
    """One graph of a :class:`~mxfp16.diagnose.graphs.Part` (``kind``: ``'float32'`` or
    ``'target'``) on one device, with taps and the op hook, on its own copies of the parameters.

    Calling it runs the graph (recorded by autograd when the caller records) and returns the
    outputs nested as the network returns them.  Parameter copies are made at the first call
    and kept, so the calls of one batch share them and their gradients add up, as the network's
    would.
    """

    def __init__(self, part, kind, ctx, listener, rng, taps=True):
        self.part, self.kind, self.ctx = part, kind, ctx
        self.listener, self.rng = listener, rng
        graph = part.float32 if kind == "float32" else part.target
        self.rounded = {}  # rounding node -> the output whose stored gradient its backward gives
        if kind == "target" and part.emulated:  # every float16 value rounded, as on a GPU
            graph = round_float16_outputs(graph, part.plan)
            self.rounded = rounding_points(graph, part.plan)
            taps = False
        # the target's gradients as stored (rounded), the float32 run's before any rounding
        self.graph = add_gradient_taps(graph, part.plan, after_rounding=kind == "float32")[0] \
            if taps else graph
        self.view = GraphView(self.graph)
        self.calls = 0  # how many times this runner ran: the first element of its keys
        self.analysis = None  # what mxfp16.diagnose.culprits builds of the graph, once
        self._masks = part.masks
        self._arrays = None
        self._op = mx.nd.CachedOp(numpy_interface.numpy_symbol(self.graph, part.numpy),
                                  _CACHED_OP_FLAGS)
        self.error = None  # what the hook raised: ctypes would print and drop it
        mxnet_internals.register_cached_op_hook(self._op, self._on_output)

    def _on_output(self, name, op_name, handle):
        try:
            self._read(name.decode(), handle)
        except Exception as error:  # noqa: BLE001 (raised again by Run.call and the step)
            self.error = self.error or error

    def _read(self, name, handle):
        array = mx.nd.NDArray(ctypes.cast(handle, mx.base.NDArrayHandle), writable=False)
        if name.endswith(_TAP_BACKWARD):
            self.listener.backward(self, name[:-len(_TAP_BACKWARD)], array)
            return
        if name.endswith(_BACKWARD) and name[:-len(_BACKWARD)] in self.rounded:
            self.listener.backward(self, self.rounded[name[:-len(_BACKWARD)]], array)
            return
        entry = self.view.by_hook.get(name)
        if entry is not None and not self.view.nodes[entry[0]]["name"].endswith(TAP_SUFFIX):
            self.listener.forward(self, (self.calls,) + entry, array)

    def _parameters(self, shapes):
        """``{name: array}`` of the graph's parameters on the device, in the graph's dtypes."""
        names = [n for n in self.graph.list_inputs()
                 if n not in self.part.data_names and not n.startswith(DROPOUT_MASK)]
        arg_types, _, aux_types = self.graph.infer_type_partial(**shapes)
        types = dict(zip(self.graph.list_arguments(), arg_types))
        types.update(zip(self.graph.list_auxiliary_states(), aux_types))
        aux = set(self.graph.list_auxiliary_states())
        arrays = {}
        for name in names:
            param = self.part.params[name]
            value = stored_as(float32_on(param, self.ctx), np.dtype(types[name] or "float32").name)
            value = numpy_interface.as_numpy(value) if self.part.numpy else value
            if name not in aux and param.grad_req != "null":
                value.attach_grad()
            arrays[name] = value
        return arrays

    @property
    def arrays(self):
        """``{name: array}`` of the runner's parameter copies (empty before its first call)."""
        return self._arrays or {}

    def parameter_gradients(self):
        """``{name: gradient}`` of the parameter copies that take one (legacy arrays)."""
        return {name: legacy(array.grad) for name, array in (self._arrays or {}).items()
                if array.grad is not None}

    def _mask_arrays(self, data):
        """This call's Dropout masks, drawn from the run's generator (the same in both runs)."""
        if not self._masks:
            return {}
        shapes = {name: array.shape for name, array in data.items()}
        internals = self.part.float32.get_internals()
        _, out_shapes, _ = internals.infer_shape_partial(**shapes)
        known = dict(zip(internals.list_outputs(), out_shapes))
        known.update(shapes)
        masks = draw_masks(self._masks, known, self.rng)
        arrays = {}
        for (name, _, _, _), mask in zip(self._masks, masks):
            array = mx.nd.array(mask, ctx=self.ctx)
            arrays[name] = numpy_interface.as_numpy(array) if self.part.numpy else array
        return arrays

    def __call__(self, flat):
        positions = self.part.positions
        given = [flat[i] for i in positions] if positions is not None else list(flat)
        data = {name: array.detach() for name, array in zip(self.part.data_names, given)}
        if self._arrays is None:
            self._arrays = self._parameters({n: a.dtype for n, a in data.items()})
        inputs = dict(self._arrays, **data, **self._mask_arrays(data))
        self.listener.inputs(self, {name: legacy(array) for name, array in data.items()})
        out = self._op(*[inputs[name] for name in self.graph.list_inputs()])
        self.calls += 1
        if self.part.out_fmt is None:
            return out
        return mxnet_internals.regroup(out if isinstance(out, list) else [out], self.part.out_fmt)


class Run:
    """One run of a batch in one kind of graph: the runners of the network's parts, created at
    their first call, and the step (forward, loss, backward at the loss scale).

    Parameters
    ----------
    parts : callable
        ``parts(call) -> Part`` for a call of the network.
    kind : {'float32', 'target'}
    listener : object
        See the module docstring.
    seed : int
        The seed of the run's Dropout masks (both runs take the same, so they drop the same
        values).
    taps : bool
        Tap the gradients (not for a run without a backward).
    """

    def __init__(self, parts, kind, listener, seed=0, taps=True):
        self.parts, self.kind, self.listener, self.taps = parts, kind, listener, taps
        self.rng = np.random.RandomState(seed)
        self.runners = []

    def call(self, key, call, ctx):
        """Run the part of the network ``key`` names with ``call`` (its list of arguments)."""
        part = self.parts(key, call)
        for _, runner in self.runners:
            if runner.part is part and runner.ctx == ctx:
                break
        else:
            runner = GraphRunner(part, self.kind, ctx, self.listener, self.rng, self.taps)
            runner.label = (key, call_structure(call)[2], str(ctx))  # the same in both runs
            self.runners.append((key, runner))
        flat, _ = mxnet_internals.flatten_call(list(call))
        out = runner(flat)
        if runner.error is not None:
            raise runner.error
        return out

    def parameters(self):
        """Tell the listener every parameter copy's gradient (after the backward)."""
        for _, runner in self.runners:
            for name, grad in runner.parameter_gradients().items():
                self.listener.parameter(runner, name, grad)


def training_step(forward, label, loss_fn, loss_scale, listener):
    """Run ``forward()`` recorded in training mode, its loss and the backward of the loss times
    ``loss_scale``; returns the loss (None and no backward without a label or a loss)."""
    with autograd.record(train_mode=True):
        out = forward()
        if loss_fn is None:
            return None
        loss = loss_fn(out) if label is None else loss_fn(out, label)
        scaled = loss * loss_scale
    listener.phase = "backward"
    scaled.backward()
    return loss
