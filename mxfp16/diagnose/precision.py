"""``mxfp16.compare_precision``: every layer of a float16 (or bfloat16) run against float32's, as
NVIDIA's Polygraphy compares a TensorRT engine with its ONNX model, and how much of each layer's
error the rounding of its input alone explains.

One batch runs in inference mode on the capture engine (:mod:`mxfp16.diagnose.capture`), in float32
then in the target dtype; the op hook reads every op output.  For each op (a *layer*), in execution
order, with ``y32`` its float32 output and ``y`` its output in the target dtype as the target graph
stores it (rounded to float16 where the GPU graph stores float16: an emulated graph computes in
float32 between its roundings):

- ``abs_error = max |y - y32|`` and ``rel_error = abs_error / max |y32|`` (0 when both are 0; a
  norm-wise relative error, which values near zero cannot blow up);
- ``input_error = max |f32(r(x32)) - y32|``: the error of the float32 op run on its float32
  inputs with those the target graph stores in the target dtype rounded to it (the data, not the
  parameters: an op's own float16 weights and arithmetic are its own error): what rounding the
  layer's input alone explains;
- ``excess = abs_error / input_error``: about 1 where the layer adds nothing to the rounding of
  what it reads, large where its own float16 (weights, accumulation, overflow) or the error
  carried from earlier layers dominates; None where ``input_error`` is 0 (no input in the target
  dtype, or inputs already on its grid).

The first layer whose ``rel_error`` exceeds the tolerance (or whose output is inf or NaN) is
named.  The float32 run's outputs are kept until the target run has compared them and the op
runs of ``input_error`` have read them (ResNet-50 at batch 16, 224 px: 2.3 GB at most).
"""
import json
import math
from collections import namedtuple

import mxnet as mx
import numpy as np

from .. import numpy_interface
from ..casting import fastround
from ..casting.params import BFLOAT16
from ..casting.rules import INDEX_INPUTS
from ..dtypes import check_dtype
from .capture import as_float32, is_float
from .probes import LOW_PRECISION_NAMES
from .session import Session, check_inputs

__all__ = ["DEFAULT_TOLERANCES", "Layer", "PrecisionReport", "compare_precision"]

#: The default tolerance on ``rel_error``, per dtype: a few times what ResNet-50 v1 and a small
#: BERT reach at their last layer when nothing is wrong (docs/benchmarks.md).
DEFAULT_TOLERANCES = {"float16": 2e-2, "bfloat16": 1e-1}

#: One layer (op output) compared: its owning block's path, the op, its type, the output, the dtype
#: the target graph stores it in, float32's largest magnitude, and the errors of the module
#: docstring.
Layer = namedtuple("Layer", ["path", "op", "op_type", "tensor", "dtype", "max_abs", "abs_error",
                             "rel_error", "input_error", "excess"])


def _rounded(array, dtype):
    """``array`` (float32) rounded to ``dtype`` and widened back (float16: in one pass with
    mxfp16's fused rounding where it is built, 105 ms against 275 ms for the two casts of 12.8M
    values, measured here)."""
    if dtype == "float16":
        if fastround.available():
            return getattr(mx.nd._internal, fastround.ROUND_OP)(array)
        return array.astype("float16").astype("float32")
    return mx.nd.amp_cast(mx.nd.amp_cast(array, dtype=BFLOAT16), dtype="float32")


class _Keeper:
    """The float32 run's listener: a copy of every op output and the data, by place, and each
    output's largest magnitude."""

    def __init__(self):
        self.phase = "forward"
        self.values, self.order, self.data, self.magnitudes = {}, [], {}, {}

    def forward(self, runner, key, array):
        if is_float(array):
            where = (runner.label, key[0], runner.view.outputs[key[1:]])
            self.values[where] = as_float32(array).copy()
            self.magnitudes[where] = mx.nd.max(mx.nd.abs(self.values[where])).reshape((1,))
            self.order.append((runner, key))

    def inputs(self, runner, arrays):
        for name, array in arrays.items():
            self.data[(runner.label, runner.calls, name)] = array

    def backward(self, runner, name, array):
        pass

    def parameter(self, runner, name, grad):
        pass


class _Comparer(_Keeper):
    """The target run's listener: each op output's largest error against the float32 one, read
    as the target graph stores it: a float16 output of an emulated graph after its rounding."""

    def __init__(self, keeper):
        super().__init__()
        self.keeper, self.errors = keeper, {}

    def forward(self, runner, key, array):
        node = runner.view.nodes[key[1]]["name"]
        name = runner.rounded.get(node) or runner.view.outputs[key[1:]]
        where = (runner.label, key[0], name)
        reference = self.keeper.values.get(where)
        if reference is None or not is_float(array) or array.shape != reference.shape:
            return
        if name in runner.rounded.values() and node not in runner.rounded:
            return  # an emulated float16 output before its rounding: the rounding's is read
        self.errors[where] = mx.nd.max(mx.nd.abs(as_float32(array) - reference)).reshape((1,))

    def inputs(self, runner, arrays):
        pass


class _SingleOps:
    """Ops of a graph run one at a time in float32 (inference mode), each built once per kind."""

    def __init__(self, numpy):
        self.numpy, self._ops = numpy, {}

    def __call__(self, node, outputs, inputs):
        plain = {key: value for key, value in node.items() if key not in ("name", "inputs")}
        key = (json.dumps(plain, sort_keys=True), len(inputs), tuple(outputs))
        if key not in self._ops:
            nodes = [{"op": "null", "name": f"input{i}", "inputs": []} for i in range(len(inputs))]
            nodes.append(dict(plain, name="op", inputs=[[i, 0, 0] for i in range(len(inputs))]))
            graph = {"nodes": nodes, "arg_nodes": list(range(len(inputs))),
                     "heads": [[len(inputs), out, 0] for out in outputs],
                     "attrs": {"mxnet_version": ["int", 10901]}}
            sym = numpy_interface.numpy_symbol(mx.sym.load_json(json.dumps(graph)), self.numpy)
            self._ops[key] = mx.nd.CachedOp(sym)
        arrays = [numpy_interface.as_numpy(a) if self.numpy else a for a in inputs]
        with mx.autograd.predict_mode():
            out = self._ops[key](*arrays)
        return [numpy_interface.legacy(o) for o in (out if isinstance(out, list) else [out])]


def _op_inputs(runner, keeper, call, node_id, dtype):
    """The float32 inputs of op ``node_id``, those the target graph stores in ``dtype`` rounded
    to it; None when one is not known (a hidden output of another op)."""
    view, plan = runner.view, runner.part.plan
    node = view.nodes[node_id]
    low = plan.get(view.outputs.get((node_id, 0), ""), "") in LOW_PRECISION_NAMES
    skip = INDEX_INPUTS.get(node["op"], ())
    arrays = []
    for position, entry in enumerate(node["inputs"]):
        producer = view.nodes[entry[0]]
        if producer["op"] == "null":
            name = producer["name"]
            if name in runner.part.data_names:
                value, stored_low = keeper.data.get((runner.label, call, name)), False
            else:
                arrays.append(runner.arrays[name])  # a parameter: never rounded
                continue
        else:
            name = view.outputs.get(tuple(entry[:2]))
            value = keeper.values.get((runner.label, call, name))
            stored_low = plan.get(name, "") in LOW_PRECISION_NAMES
        if value is None:
            return None
        rounded = (low or stored_low) and position not in skip and is_float(value)
        arrays.append(_rounded(as_float32(value), dtype) if rounded else value)
    return arrays


#: Ops run again between two waits on the engine: the values they hold stay few.
_OPS_PER_WAIT = 16


def _readers_left(keeper):
    """``{place: how many ops still read it}`` of the float32 run's values."""
    left = {}
    for runner, (call, node_id, _) in keeper.order:
        for entry in runner.view.nodes[node_id]["inputs"]:
            name = runner.view.outputs.get(tuple(entry[:2]))
            where = (runner.label, call, name)
            left[where] = left.get(where, 0) + 1
    return left


def _input_errors(keeper, dtype):
    """``{place: NDArray max |f32(r(x32)) - y32|}`` of every op output the float32 run kept,
    each value dropped once the last op reading it has run again (and the engine waited on every
    few ops), so that what is held shrinks as it goes."""
    errors, singles, done, left = {}, {}, set(), _readers_left(keeper)
    for runner, (call, node_id, _) in keeper.order:
        if (id(runner), call, node_id) in done:
            continue
        done.add((id(runner), call, node_id))
        node = runner.view.nodes[node_id]
        outputs = sorted(out for (n, out) in runner.view.outputs if n == node_id)
        inputs = _op_inputs(runner, keeper, call, node_id, dtype)
        if inputs is not None and node["inputs"]:
            single = singles.setdefault(id(runner), _SingleOps(runner.part.numpy))
            for out, value in zip(outputs, single(node, outputs, inputs)):
                where = (runner.label, call, runner.view.outputs[(node_id, out)])
                if where in keeper.values and value.shape == keeper.values[where].shape:
                    errors[where] = mx.nd.max(mx.nd.abs(as_float32(value) -
                                                        keeper.values[where])).reshape((1,))
        for entry in node["inputs"]:
            where = (runner.label, call, runner.view.outputs.get(tuple(entry[:2])))
            left[where] -= 1
            if not left[where]:
                keeper.values.pop(where, None)
        if len(done) % _OPS_PER_WAIT == 0:
            mx.nd.waitall()
    return errors


def _ratio(error, explained):
    if explained > 0:
        return error / explained
    return None


class PrecisionReport:
    """What :func:`compare_precision` found.

    Attributes
    ----------
    layers : list of Layer
        Every op output in execution order (see :mod:`mxfp16.diagnose.precision`).
    first : Layer or None
        The first layer whose ``rel_error`` exceeds ``tolerance``, or whose output is inf or
        NaN.
    dtype : str
    tolerance : float

    ``bool(report)`` is True when a layer is beyond tolerance.
    """

    def __init__(self, layers, dtype, tolerance):
        self.layers, self.dtype, self.tolerance = list(layers), dtype, tolerance
        self.first = next((layer for layer in self.layers if _beyond(layer, tolerance)), None)

    def __bool__(self):
        return self.first is not None

    def to_dict(self):
        """The report as JSON-ready values (inf and NaN as strings, as ``json`` cannot write
        them)."""
        def plain(value):
            return value if value is None or math.isfinite(value) else str(value)
        return {"dtype": self.dtype, "tolerance": self.tolerance,
                "first_beyond_tolerance": self.first and self.first.op,
                "layers": [{key: plain(value) if isinstance(value, float) else value
                            for key, value in layer._asdict().items()} for layer in self.layers]}

    def worst(self, count=5):
        """The ``count`` layers of largest ``excess`` (the error they add to their input's
        rounding), largest first."""
        scored = [layer for layer in self.layers
                  if layer.excess is not None and not math.isnan(layer.excess)]
        return sorted(scored, key=lambda layer: -layer.excess)[:count]

    def __str__(self):
        last = self.layers[-1] if self.layers else None
        lines = [f"compare_precision ({self.dtype} against float32, tolerance {self.tolerance:g}): "
                 f"{len(self.layers)} layers; " + (
                     f"first beyond tolerance: {self.first.op} ({self.first.path or '(network)'}),"
                     f" relative error {self.first.rel_error:.3g}" if self.first else
                     "every layer within tolerance")]
        if last is not None:
            lines.append(f"  last layer {last.op}: relative error {last.rel_error:.3g}")
        rows = [("block", "op", "rel error", "input rounding", "excess")] + [
            (layer.path or "(network)", layer.op, f"{layer.rel_error:.3g}",
             f"{layer.input_error / layer.max_abs if layer.max_abs else 0:.3g}",
             f"{layer.excess:.3g}") for layer in self.worst()]
        widths = [max(len(row[i]) for row in rows) for i in range(5)]
        lines.append("  largest excess over the input's rounding:")
        lines += ["    " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip()
                  for row in rows]
        return "\n".join(lines)


def _beyond(layer, tolerance):
    return not math.isfinite(layer.abs_error) or layer.rel_error > tolerance


def _layers(keeper, comparer, explained, index):
    """The :class:`Layer` rows, read from the engine in one copy."""
    places = [(runner, key, (runner.label, key[0], runner.view.outputs[key[1:]]))
              for runner, key in keeper.order]
    pending = []
    for _, _, where in places:
        pending += [keeper.magnitudes[where], comparer.errors.get(where, mx.nd.array([math.nan])),
                    explained.get(where, mx.nd.zeros(1))]
    values = mx.nd.concat(*[v.as_in_context(mx.cpu()) for v in pending], dim=0).asnumpy() \
        if pending else np.zeros(0)
    layers = []
    for number, (runner, (_, node_id, _), where) in enumerate(places):
        magnitude, error, input_error = (float(v) for v in values[3 * number:3 * number + 3])
        node = runner.view.nodes[node_id]
        dtype = runner.part.plan.get(where[2], "float32")
        layers.append(Layer(index.owner(node["name"]), node["name"], node["op"], where[2],
                            "bfloat16" if dtype == "void16" else dtype, magnitude, error,
                            error / magnitude if magnitude else (0.0 if error == 0 else math.inf),
                            input_error, _ratio(error, input_error)))
    return layers


def compare_precision(net, *inputs, dtype="float16", tolerance=None):
    """Compare every layer of ``net`` in ``dtype`` with float32 on one batch (inference mode).

    Parameters
    ----------
    net : gluon.Block
        A float32 network or one cast by :func:`mxfp16.cast_block` (run as it was cast), or a
        plain Block of HybridBlocks; nothing of it changes.
    *inputs : NDArray
        The batch, as ``net(*inputs)`` takes it.
    dtype : {'float16', 'bfloat16'}
        float16 is emulated on a CPU (every output the GPU graph stores in float16 rounded to it).
    tolerance : float, optional
        The largest ``rel_error`` a layer may have; default :data:`DEFAULT_TOLERANCES` of the
        dtype.

    Returns
    -------
    PrecisionReport
        ``layers`` in execution order with their errors (defined in
        :mod:`mxfp16.diagnose.precision`), and ``first``, the first layer beyond tolerance.

    Raises
    ------
    TypeError, ValueError
        For a network or inputs of the wrong kind, another dtype, or a tolerance that is not a
        positive number.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential(prefix='net_')
    >>> with net.name_scope():
    ...     net.add(nn.Dense(3, in_units=2), nn.Dense(1, in_units=3))
    >>> net.initialize(mx.init.Constant(0.5))
    >>> report = compare_precision(net, mx.nd.array([[1, 1000]]))
    >>> [(layer.op, layer.max_abs, layer.abs_error, layer.excess) for layer in report.layers]
    [('net_dense0_fwd', 500.5, 0.0, None), ('net_dense1_fwd', 750.75, 0.25, None)]

    750.75 lies halfway between float16's 750.5 and 751: its own rounding, not its input's (500.5
    is a float16 value), hence no ``excess`` to give.

    >>> report.first is None
    True
    """
    dtype = check_dtype(dtype)
    if dtype not in DEFAULT_TOLERANCES:
        raise ValueError(f"dtype={dtype!r}: compare_precision compares one of "
                         f"{', '.join(DEFAULT_TOLERANCES)} with float32")
    tolerance = DEFAULT_TOLERANCES[dtype] if tolerance is None else tolerance
    if not (isinstance(tolerance, (int, float)) and tolerance > 0 and math.isfinite(tolerance)):
        raise ValueError(f"tolerance={tolerance!r}: give a positive number, the largest relative "
                         f"error a layer may have (default {DEFAULT_TOLERANCES[dtype]:g} for "
                         f"{dtype})")
    if not isinstance(net, mx.gluon.Block):
        raise TypeError(f"compare_precision takes a Gluon network (a Block), got "
                        f"{type(net).__name__}: pass the network the batch is fed to")
    check_inputs(inputs)
    session = Session(net, dtype, training=False)
    keeper = _Keeper()
    session.run("float32", inputs, keeper)
    comparer = _Comparer(keeper)
    session.run("target", inputs, comparer)
    explained = _input_errors(keeper, dtype)
    return PrecisionReport(_layers(keeper, comparer, explained, session.index), dtype,
                           float(tolerance))
