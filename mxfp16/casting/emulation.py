"""CPU emulation of float16 training with the numerics of GPU mixed precision.

MXNet's CPU backend has no float16 GEMM ("FP16 gemm on cpu not implemented!" for Convolution,
FullyConnected, Deconvolution, dot, ...) and its float16 elementwise kernels are 3-20x slower than
float32.  An emulated graph therefore computes in float32 and rounds through float16 exactly where a
GPU stores float16 at a matrix multiply:

* **weights** of a float16 network are float16 parameters (half the bytes, as on a GPU); each use
  casts them to float32, and their gradients come back rounded to float16;
* **inputs and outputs of every GEMM** (Convolution, Deconvolution, FullyConnected, dot, batch_dot,
  RNN, linalg_gemm) that the GPU graph runs in float16 are rounded to float16 (round to nearest even;
  above 65504 to inf; below 2**-24 to zero, subnormals kept) and back to float32.  The rounding is a
  pair of ``Cast`` ops, whose backward rounds the gradient through float16 at the same place;
* **inside a GEMM** the products are accumulated in float32, as Tensor Cores and cuDNN do;
* **the data** entering the network are rounded to float16 where a float16 op reads them, as the
  GPU graph's input cast does; an op the GPU graph runs in float32 (one ``keep_float32`` keeps, a
  softmax of the data) reads them as they come;
* normalization layers, softmax and losses see float32, with float32 parameters, as on a GPU.

Between GEMMs (BatchNorm, activations, pooling, additions) values stay float32 on the CPU while a GPU
keeps them float16; every such value is rounded again before the next GEMM reads it, so what the next
GEMM sees is exactly what the GPU's would see whenever those elementwise ops are exact in float16
(ReLU, max-pooling, reshapes) and within one float16 rounding otherwise.  Values already on the float16
grid (the output of ReLU or max-pooling of rounded values) are not rounded twice.

A BatchNorm that reads a rounded 2-D (NCHW) Convolution output reads it through a depthwise 1x1
Convolution by 1 (weight an ``_ones`` op, no parameter): ``x * 1`` in float32 is exact both ways, but
the rounding op hands over a plain NCHW array, and that convolution gives BatchNorm oneDNN's blocked
layout, as in the float32 graph, where oneDNN's plain-layout BatchNorm is several times slower.
BatchNorm then sums its statistics and gamma's gradient in the blocked layout's order, as float32
training does (float32 results in another order than without it); the step holds more memory, a
blocked copy of each such BatchNorm input.  ``MXFP16_BLOCKED_LAYOUT=0`` leaves it out.
"""
import logging
import os

import mxnet as mx

from .rules import EXACT_CONSTANT_OPS, GEMM_OPS, INDEX_INPUTS, applies
from .graph import DTYPE_CODES, GraphRewriter, node_dtype
from .transposed import deconvolution_as_convolution

log = logging.getLogger(__name__)


def blocked_layout_wanted():
    """Whether a BatchNorm after a rounding reads it through an identity convolution: on a CPU
    without GPUs, unless ``MXFP16_BLOCKED_LAYOUT=0``."""
    return os.environ.get("MXFP16_BLOCKED_LAYOUT", "1") != "0" and mx.context.num_gpus() == 0


def resolve_emulate(emulate, dtype):
    """Decide whether float16 is emulated: ``None`` means "when MXNet sees no GPU".

    Parameters
    ----------
    emulate : bool or None
        ``None`` switches emulation on when ``dtype`` is float16 and ``mx.context.num_gpus() == 0``
        (and logs one line saying so); ``True`` / ``False`` force it.
    dtype : str
        Canonical dtype name.

    Returns
    -------
    bool

    Raises
    ------
    ValueError
        If ``emulate=True`` is asked for a dtype other than float16.

    Examples
    --------
    >>> resolve_emulate(False, 'float16')
    False
    """
    if emulate is None:
        emulate = dtype == "float16" and mx.context.num_gpus() == 0
        if emulate:
            log.info("mxfp16: no GPU found, so float16 runs as CPU emulation (float32 compute, "
                     "float16 rounding at every GEMM boundary); pass emulate=False to keep float16 ops")
        return emulate
    if emulate not in (True, False):
        raise ValueError(f"emulate={emulate!r}: choose None (automatic), True or False")
    if emulate and dtype != "float16":
        raise ValueError(f"emulate=True applies to float16 only, got dtype={dtype!r}: "
                         "bfloat16 runs natively on CPU; pass emulate=None")
    return emulate


def is_grid_preserving(node):
    """Whether ``node`` only selects or moves values, so rounded inputs give rounded outputs."""
    return applies("grid", node)


class _Emulator:
    """Rewrites a float32 graph into its emulated float16 form, following a GPU graph's dtypes."""

    def __init__(self, sym, plan, data_names, kept=frozenset()):
        self.rw = GraphRewriter(sym)
        self.plan = plan
        self.data_names = set(data_names)
        self.kept = kept  # names of the ops keep_float32 keeps
        self.rounded = set()  # new node ids whose outputs are rounded on every use
        self.half_params = set()  # new node ids of float16 parameters
        self.on_grid = set()  # new node ids whose outputs already are float16 values
        self.inputs = set()  # new node ids of the data inputs, of any float dtype
        # New node ids whose shape may be known only from their consumers: parameters (deferred
        # initialization; the flat parameter vector of an RNN), ops without inputs (a begin state
        # made by ``zeros(shape=(layers, 0, hidden))``) and what is computed from them.  The fused
        # rounding op infers shapes forward only, so these are rounded with the Cast pair, which
        # infers them both ways.
        self.partial = set()

    def use(self, old_entry):
        """The float32 entry a consumer reads for an old entry."""
        entry = self.rw.input_entry(old_entry)
        if entry[0] in self.rounded:
            return self.round(entry)
        if entry[0] in self.half_params:
            cast = self.rw.cast(entry, "float32")
            self.on_grid.add(cast[0])
            self.partial.add(cast[0])
            return cast
        return entry

    def round(self, entry):
        if entry[0] in self.on_grid:
            return entry
        cast_pair = entry[0] in self.inputs or entry[0] in self.partial
        out = self.rw.round_to_float16(entry, any_dtype=cast_pair)
        self.on_grid.add(out[0])
        return out

    def variable(self, old_id, node):
        name = node["name"]
        if name not in self.data_names and self.plan.get(name) == "float16":
            attrs = dict(node.get("attrs", {}), __dtype__=DTYPE_CODES["float16"])
            self.half_params.add(self.rw.emit(dict(node, attrs=attrs), [], old_id))
            return
        is_data = name in self.data_names
        if not is_data:  # float32: declared, since a rounding Cast pair passes no type backwards
            node = dict(node, attrs=dict(node.get("attrs", {}), __dtype__=DTYPE_CODES["float32"]))
        new_id = self.rw.emit(node, [], old_id)
        if is_data:
            self.rounded.add(new_id)
            self.inputs.add(new_id)
        else:
            self.partial.add(new_id)

    def runs_in_float16(self, node):
        name = node["name"]
        return "float16" in (self.plan.get(f"{name}_output"), self.plan.get(f"{name}_output0"))

    def casts_a_float(self, node):
        """Whether a cast node's input is a float16 or float32 value in the GPU graph (a cast
        between those two becomes a rounding or nothing; a cast of integers stays)."""
        source = self.rw.old_nodes[node["inputs"][0][0]]
        if source["op"] == "null":
            return True
        index = node["inputs"][0][1]
        dtype = self.plan.get(f"{source['name']}_output{index}",
                              self.plan.get(f"{source['name']}_output") if index == 0 else None)
        return dtype in (None, "float16", "float32")

    def created(self, old_id, node):
        """An op without inputs (zeros, random samplers, arange), copied; zeros and ones are on
        the float16 grid already."""
        new_id = self.rw.emit(node, [], old_id)
        self.partial.add(new_id)
        if node["op"] in EXACT_CONSTANT_OPS:
            self.on_grid.add(new_id)

    def runs_in_float32(self, node):
        """Whether the GPU graph runs ``node`` in float32 (a float32 op, one ``keep_float32``
        keeps): it reads the data as they come, where a float16 op reads them cast to float16."""
        name = node["name"]
        return self.plan.get(f"{name}_output", self.plan.get(f"{name}_output0")) == "float32"

    def read(self, old_entry, node, position, skip):
        """The entry ``node`` reads at input ``position``: index inputs (token ids) as they are
        (rounding would change ids above 2048), the data unrounded (in float32) by an op the
        GPU graph runs in float32, the output of a kept op rounded by an op it runs in float16
        (the GPU graph's cast there: a kept block's overflow out of it is float16's), any other
        value through :meth:`use`."""
        if position in skip:
            return self.rw.input_entry(old_entry)
        entry = self.rw.input_entry(old_entry)
        if entry[0] in self.inputs and node_dtype(node) is None and self.runs_in_float32(node):
            return self.rw.cast(entry, "float32")
        if self.rw.old_nodes[old_entry[0]]["name"] in self.kept and node_dtype(node) is None \
                and self.runs_in_float16(node):
            return self.round(entry)
        return self.use(old_entry)

    def operator(self, old_id, node):
        skip = INDEX_INPUTS.get(node["op"], ())
        inputs = [self.read(e, node, i, skip) for i, e in enumerate(node["inputs"])]
        values = [e for i, e in enumerate(inputs) if i not in skip]
        cast_to = node_dtype(node)
        if cast_to is not None and not self.casts_a_float(node):
            self.rw.emit(node, inputs, old_id)  # integers to float (shapes, top-k indices): kept
            return
        if cast_to == "float16":  # a cast the graph already had becomes a rounding
            self.rw.replace(old_id, self.round(inputs[0]))
            return
        if cast_to == "float32":
            self.rw.replace(old_id, inputs[0])
            return
        if node["op"] == "BatchNorm" and inputs and self.wants_blocked_layout(node, node["inputs"][0]):
            inputs[0] = self.blocked(inputs[0], self.rw.input_entry(node["inputs"][0]))
        gemm = node["op"] in GEMM_OPS and self.runs_in_float16(node)
        if gemm:
            inputs = [e if i in skip else self.round(e) for i, e in enumerate(inputs)]
        new_id = self.rw.emit(node, inputs, old_id)
        if values and values[0][0] in self.partial:  # the first input decides most output shapes
            self.partial.add(new_id)
        if gemm:
            self.rounded.add(new_id)
        elif is_grid_preserving(node) and all(e[0] in self.on_grid for e in values):
            self.on_grid.add(new_id)

    def wants_blocked_layout(self, node, old_entry):
        """Whether a BatchNorm reads a rounded 2-D NCHW Convolution's output over channels."""
        source = self.rw.input_entry(old_entry)
        conv = self.rw.nodes[source[0]]
        attrs = conv.get("attrs", {})
        return (blocked_layout_wanted() and conv["op"] == "Convolution" and source[0] in self.rounded
                and source[0] not in self.partial and attrs.get("layout", "NCHW") == "NCHW"
                and len(attrs.get("kernel", "()").strip("()").split(",")) == 2
                and "num_filter" in attrs and node.get("attrs", {}).get("axis", "1") == "1")

    def blocked(self, rounded, source):
        """The rounded output through an identity depthwise convolution, bit for bit the same value
        and gradient, but in oneDNN's blocked layout (see the module docstring)."""
        channels = int(self.rw.nodes[source[0]]["attrs"]["num_filter"])
        out = self.rw.identity_convolution(rounded, channels, 2)
        self.on_grid.add(out[0])
        return out

    def run(self):
        for old_id, node in self.rw.nodes_in_order():
            if node["op"] == "null":
                self.variable(old_id, node)
            elif not node["inputs"]:
                self.created(old_id, node)
            else:
                self.operator(old_id, node)
        return self.rw.to_symbol([self.use(head) for head in self.rw.old_heads])


def emulate_float16(sym, plan, data_names, kept=frozenset()):
    """Rewrite float32 graph ``sym`` so that it computes in float32 with float16 rounding.

    Parameters
    ----------
    sym : mx.sym.Symbol
        The original (float32) graph.
    plan : dict of str to str
        The dtypes of the GPU float16 graph, as :func:`mxfp16.casting.graph.internal_dtypes` gives them:
        which parameters are float16 and which GEMMs run in float16.
    data_names : sequence of str
        The graph's data inputs.
    kept : set of str
        The names of the ops ``keep_float32`` keeps: float32 in ``plan``, their outputs rounded
        where a float16 op reads them, as the GPU graph casts them there.

    Returns
    -------
    mx.sym.Symbol
        The emulated graph (see the module docstring for its exact semantics).  Its transposed
        convolutions are Convolutions (:mod:`mxfp16.casting.transposed`): oneDNN's Deconvolution
        cannot train with the float16 weight cast to float32 that emulation feeds it.
    """
    return _Emulator(deconvolution_as_convolution(sym), plan, data_names, kept).run()
