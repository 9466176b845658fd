"""How a Gluon block becomes cast graphs: traced with Symbols, per mode and per shape of call.

A Gluon block is traced per mode, in training and in inference mode, so that Python code branching
on ``autograd.is_training()`` keeps both branches, and each mode with the inputs of its own call
(GluonCV's detectors take targets in training only); the :class:`~mxfp16.casting.block.CastBlock`
returned runs the graph of the current mode.

A block of MXNet's NumPy interface (``npx.set_np()``, layers calling ``F.npx.*``) is traced with
numpy symbols, as its own ``hybridize()`` traces it: its layers refuse legacy symbols.  The traced
graph is read as a legacy Symbol (the same graph: only the Python class differs), so the graph
rewrite serves both front ends, and the cast network runs it as a numpy graph again.
"""
from collections import namedtuple

import mxnet as mx
import numpy as np
from mxnet import autograd

from .. import mxnet_internals, numpy_interface
from .graph import internal_dtypes
from .signature import (block_inputs, call_structure, describe_call, describe_signature,
                        imperative_call_error)

__all__ = ["Trace", "cast_parameters", "data_input_names", "structure", "trace_call", "trace_plain",
           "variant_tracer"]


def structure(sym):
    """A graph without what differs between two traces of one block (op names, aux versions)."""
    graph = mxnet_internals.graph_json(sym)
    nodes = [(node["op"], node["name"] if node["op"] == "null" else "", node.get("attrs"),
              [entry[:2] for entry in node["inputs"]]) for node in graph["nodes"]]
    return nodes, [head[:2] for head in graph["heads"]]


class _Float32Init(mx.init.Initializer):
    """Draws a parameter's initial value in float32 and rounds it to the parameter's dtype, so
    that a float16 network initialized from a seed starts from float32's weights rounded."""

    def __init__(self, initializer):
        super().__init__()
        self._initializer = mx.init.create(initializer)

    def __call__(self, desc, arr):
        value = mx.nd.zeros(arr.shape, ctx=arr.context, dtype="float32")
        # MXNet's initializers draw with mx.np functions while the NumPy interface is on
        self._initializer(desc, numpy_interface.as_numpy(value)
                          if numpy_interface.numpy_mode() else value)
        numpy_interface.legacy(arr)[:] = value.astype(arr.dtype)


def cast_parameters(params, graphs, data_names):
    """Cast each parameter in place to the dtype the cast graphs give it.  A parameter still
    waiting for its shape (deferred initialization) is initialized in float32 and then rounded:
    drawn in float16, a uniform or normal initializer gives other values than float32 from the same
    seed."""
    for sym in graphs:
        types = internal_dtypes(sym, data_names)
        for name, param in params.items():
            if name in types and np.dtype(param.dtype) != np.dtype(types[name]):
                mxnet_internals.wrap_deferred_initializer(param, _Float32Init)
                param.cast(np.dtype(types[name]).type)


def data_input_names(block, names):
    """The names the block's data inputs are traced under: ``names`` when given; else ``data``
    for a block of one required input (as before), the names of ``hybrid_forward`` (or of the
    block's own ``forward``) for several."""
    if names is not None:
        return tuple(names)
    inputs = block_inputs(block)
    if inputs is None or len(inputs[0]) <= 1:
        return ("data",)
    return inputs[0]


#: One traced call: the cast graph, its data inputs (names and positions among the call's flat
#: arrays), the nesting of its outputs, and the structure of the float32 graph (to compare traces).
Trace = namedtuple("Trace", ["data_names", "positions", "graph", "out_fmt", "structure"])


def _traced_outputs(block, symbols, training, recording):
    """``block(*symbols)`` in the autograd state of the call being traced: GluonCV's YOLOv3 returns
    its losses when recording in training mode, raw predictions when only training."""
    scope = autograd.record(train_mode=True) if training and recording else \
        autograd.train_mode() if training else autograd.predict_mode()
    with scope:
        return block(*symbols)


def _call_error(error, block, call, training):
    """The one error a failed trace raises: an ``nd.*`` call or a front-end mismatch named, else
    the calling convention with MXNet's own message."""
    return imperative_call_error(error, block) or \
        numpy_interface.front_end_error(error, block) or TypeError(
            f"the cast network takes what {describe_signature(block)} takes, called with "
            f"{describe_call(call)} in {'training' if training else 'inference'} mode: "
            f"{' '.join(str(error).split())}")


def _graph_of(outputs):
    """``(graph, nesting)`` of a traced call's outputs: one legacy Symbol (a Group for several)."""
    out_flat, out_fmt = mxnet_internals.flatten_call(outputs)
    out_flat = [numpy_interface.legacy_symbol(sym) for sym in out_flat]
    return (out_flat[0] if len(out_flat) == 1 else mx.sym.Group(out_flat)), out_fmt


def _check_bound(graph, names, block, call, training):
    """Refuse a trace whose graph reads a variable that is neither an input nor a parameter: an
    input given as one array where the block takes a list (an LSTM's ``[h, c]`` states traced as
    one symbol, whose missing cell state MXNet's RNN op then adds as a free variable)."""
    known = set(names) | set(block.collect_params().keys())
    unbound = [name for name in graph.list_inputs() if name not in known]
    if unbound:
        raise TypeError(f"the cast network takes what {describe_signature(block)} takes, called "
                        f"with {describe_call(call)} in {'training' if training else 'inference'} "
                        f"mode: that call leaves {unbound[:4]} unbound (an input that must be a "
                        "list, such as an LSTM's [h, c] states, given as one array?)")


def trace_call(block, call, names=None, training=False, recording=None, numpy=False):
    """``(graph, data names, positions, out_fmt)``: the float32 graph of ``block`` called as in
    ``call`` (nested lists, None), traced in one mode without changing the block (its parameters
    keep their dtypes).

    ``names`` name the call's flat arrays (default ``input0``, ``input1``, ...); the data names
    are those the graph reads, at ``positions`` among the flat arrays; ``recording`` (default:
    ``training``) traces inside ``autograd.record()``; ``numpy``: with numpy symbols, in the NumPy
    interface's semantics, whatever the process's mode."""
    flat, fmt, _ = call_structure(call)
    names = list(names) if names else [f"input{index}" for index in range(len(flat))]
    symbols = mxnet_internals.regroup(
        [None if array is None else numpy_interface.input_symbol(name, numpy)
         for array, name in zip(flat, names)], fmt)
    with autograd.pause(), numpy_interface.semantics(numpy):  # never recorded
        try:
            outputs = _traced_outputs(block, symbols, training,
                                      training if recording is None else recording)
        except (TypeError, AssertionError) as error:
            raise _call_error(error, block, call, training) from None
        graph, out_fmt = _graph_of(outputs)
    _check_bound(graph, names, block, call, training)
    used = set(graph.list_arguments())
    positions = [index for index, (array, name) in enumerate(zip(flat, names))
                 if array is not None and name in used]
    return graph, [names[index] for index in positions], positions, out_fmt


def variant_tracer(block, cast_graph, numpy=False):
    """``trace(call, names=None, training=False, recording=None) -> Trace``: the cast graph of
    ``block`` called as in ``call`` (nested lists, None), in one mode, for :class:`CastBlock`.

    ``cast_graph(graph, data_names=...)`` casts the traced float32 graph (``cast_symbol`` with
    the dtype, emulation and mode of the cast), and the block's parameters are cast to the cast
    graph's dtypes.  ``recording`` (default: ``training``) traces inside ``autograd.record()``;
    ``numpy``: with numpy symbols, in the NumPy interface's semantics, whatever the process's mode
    at the call."""
    def trace(call, names=None, training=False, recording=None):
        graph, data_names, positions, out_fmt = trace_call(block, call, names, training,
                                                           recording, numpy)
        with autograd.pause(), numpy_interface.semantics(numpy):
            cast = cast_graph(graph, data_names=data_names)
            cast_parameters(block.collect_params(), [cast], data_names)
        return Trace(data_names, positions, cast, out_fmt, structure(graph))
    return trace


def _closed_signature(block, count):
    """Whether ``block`` takes exactly ``count`` inputs, none optional: its training call is then
    its inference call, and both can be traced when it is cast."""
    inputs = block_inputs(block)
    return inputs is not None and not inputs[1] and len(inputs[0]) == count


def trace_plain(tracer, block, names):
    """The traces of the call with ``names``: inference, and training where the block's signature
    leaves no other training call (None: traced at the first training call, with its inputs)."""
    inference = tracer([mx.nd.zeros(1)] * len(names), names)
    if not _closed_signature(block, len(names)):
        return inference, None
    training = tracer([mx.nd.zeros(1)] * len(names), names, training=True)
    if training.structure == inference.structure:
        training = training._replace(graph=None)
    return inference, training
