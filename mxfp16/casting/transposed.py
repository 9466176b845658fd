"""Transposed convolutions (``Deconvolution``) as ``Convolution``, for CPU float16 emulation.

MXNet 1.9.1's oneDNN ``Deconvolution`` fails in backward whenever its weight is the output of
another op (``MXNetError: could not execute a primitive``, or the process dies with ``terminate
called without an active exception``), in plain MXNet too (``Deconvolution(x, w * 1)``).  Emulation
must read a float16 weight through a ``Cast`` to float32, so an emulated transposed convolution could
not train.  ``Convolution`` has no such failure, and a transposed convolution is one exactly:

    Deconvolution(x, w, stride s, pad p, dilate d, adj a)
        = Convolution(zero-upsample(x, s) with a trailing zeros, flip(transpose(w)),
                      stride 1, pad d * (k - 1) - p, dilate d)

where zero-upsampling puts ``s - 1`` zeros between neighbouring values, ``transpose`` swaps the
weight's input and output channels (group by group), and ``flip`` reverses every spatial axis.  Every
output is the same sum of the same products; only the order of the float32 additions differs.  The
cost is the zeros: ``s**n`` times the multiply-adds of the transposed convolution for stride ``s`` in
``n`` spatial dimensions.

A 2D transposed convolution with equal strides ``s`` dividing its square kernel (DCGAN's ``k=4,
s=2``), no dilation and one group takes a form without zeros when its weight's shape is known in
the traced graph (``in_channels`` given: Gluon's symbols keep the shapes of their first trace, so a
forward before the cast does not help): output phase ``r`` at
``q`` is ``sum_m x[q - m] * w[r + s*m]``, so one ``Convolution`` of the padded input computes the
``s**2`` phases as channels, ``depth_to_space`` interleaves them, and a slice takes the output.  Its
``Reshape`` of the weight infers shapes forward only, hence the condition.  See docs/sequence_models.md and
docs/benchmarks.md for what each form costs.

The rewrite also sidesteps a oneDNN failure of plain float32 MXNet: ``Deconvolution`` with one
output channel and 16 or more input channels ("could not create a primitive descriptor for a reorder
primitive").  bfloat16 graphs are rewritten too, before MXNet's AMP pass, which then runs the
``Convolution`` in bfloat16 (a ``Deconvolution`` it cannot rewrite, one with ``target_shape``, runs in
float32 on its float32 weight variable, fed directly).  The GPU graph keeps ``Deconvolution``:
cuDNN's transposed convolution has neither failure, and needs no zeros.
"""
import ast

from .graph import GraphRewriter

#: Layouts the rewrite handles: channels first, as MXNet's CPU Deconvolution requires.
CHANNELS_FIRST = (None, "None", "NCW", "NCHW", "NCDHW")


def _tuple(attrs, key, size, default):
    """A tuple attribute of a node (``'(2, 2)'``), or ``default`` repeated when unset or empty."""
    value = attrs.get(key)
    parsed = tuple(ast.literal_eval(value)) if value not in (None, "", "None") else ()
    return parsed if parsed else (default,) * size


def variable_inputs(nodes, node):
    """Positions of ``node``'s inputs that are variables (parameters), not op outputs: the inputs
    a ``Deconvolution`` left as it is must read directly, since oneDNN's backward fails on a weight
    that is an op output."""
    return tuple(i for i, entry in enumerate(node["inputs"]) if nodes[entry[0]]["op"] == "null")


def rewritable(node):
    """Whether a ``Deconvolution`` node can be written as a ``Convolution``: channels first, and
    its output size given by stride, pad and adj (``target_shape`` unset)."""
    attrs = node.get("attrs", {})
    return (node["op"] == "Deconvolution" and attrs.get("layout") in CHANNELS_FIRST
            and not _tuple(attrs, "target_shape", 0, 0))


class _Emitter:
    """Emits the ops of one rewritten node, each with a fresh name derived from the node's."""

    def __init__(self, rw, name):
        self.rw = rw
        self.name = name

    def op(self, op, inputs, name=None, **attrs):
        node = {"op": op, "name": name or self.rw.unique_name(f"{self.name}_{op.lower()}"),
                "attrs": {k: str(v) for k, v in attrs.items()}}
        return (self.rw.emit(node, inputs), 0, 0)


def _upsample(emit, data, strides, adj):
    """``data`` with ``s - 1`` zeros between neighbours along each spatial axis, and ``adj``
    trailing zeros (the output padding of the transposed convolution)."""
    ndim = len(strides) + 2
    for i, (stride, extra) in enumerate(zip(strides, adj)):
        if stride == 1:
            continue
        axis = 2 + i
        expanded = emit.op("expand_dims", [data], axis=axis + 1)
        zeros = emit.op("zeros_like", [expanded])
        stacked = emit.op("Concat", [expanded] + [zeros] * (stride - 1), dim=axis + 1,
                          num_args=stride)
        shape = (0,) * axis + (-3,) + (0,) * (ndim - 1 - axis)
        data = emit.op("Reshape", [stacked], shape=shape)
        trailing = stride - 1 - extra  # zeros past the last value that the output does not see
        if trailing:
            data = emit.op("slice_axis", [data], axis=axis, begin=0, end=-trailing)
    return data


def _convolution_weight(emit, weight, groups, spatial):
    """Deconvolution's weight ``(C_in, C_out / g, k...)`` as Convolution's ``(C_out, C_in / g,
    k...)``, reversed along every spatial axis.  With one group, ``transpose`` and ``reverse``
    infer shapes both ways, so a weight whose shape waits for the data (deferred initialization)
    gets it; with several, the weight's shape must be known (``Reshape`` infers forward only)."""
    if groups == 1:
        swapped = emit.op("transpose", [weight], axes=(1, 0) + tuple(range(2, 2 + spatial)))
    else:
        split = emit.op("Reshape", [weight], shape=(-4, groups, -1, -2))
        swapped = emit.op("SwapAxis", [split], dim1=1, dim2=2)
        swapped = emit.op("Reshape", [swapped], shape=(-3, -2))
    return emit.op("reverse", [swapped], axis=tuple(range(2, 2 + spatial)))


def _emit_convolution(rw, node, inputs):
    """Emit the Convolution form of Deconvolution ``node`` (its inputs already mapped); return
    the entry of its output.  The Convolution keeps the node's name, so dtype plans keyed by
    ``<name>_output`` still apply."""
    attrs = node.get("attrs", {})
    kernel = _tuple(attrs, "kernel", 0, 1)
    spatial = len(kernel)
    strides = _tuple(attrs, "stride", spatial, 1)
    dilate = _tuple(attrs, "dilate", spatial, 1)
    pad = _tuple(attrs, "pad", spatial, 0)
    adj = _tuple(attrs, "adj", spatial, 0)
    groups = int(attrs.get("num_group", 1))
    emit = _Emitter(rw, node["name"])
    data = _upsample(emit, inputs[0], strides, adj)
    weight = _convolution_weight(emit, inputs[1], groups, spatial)
    full = [d * (k - 1) - p for d, k, p in zip(dilate, kernel, pad)]
    for i, f in enumerate(full):
        if f < 0:  # a pad beyond the kernel's reach: crop the input, as it would crop the output
            data = emit.op("slice_axis", [data], axis=2 + i, begin=-f, end=f)
    conv_attrs = {"kernel": kernel, "stride": (1,) * spatial, "dilate": dilate,
                  "pad": tuple(max(f, 0) for f in full), "num_filter": attrs["num_filter"],
                  "num_group": groups, "no_bias": attrs.get("no_bias", "True")}  # Deconvolution's default
    if attrs.get("layout") not in (None, "None"):
        conv_attrs["layout"] = attrs["layout"]
    return emit.op("Convolution", [data, weight] + list(inputs[2:]), name=node["name"],
                   **conv_attrs)


def _known_shape(nodes, entry):
    """The shape of a variable input whose ``__shape__`` is fully known, else None."""
    node = nodes[entry[0]]
    text = node.get("attrs", {}).get("__shape__") if node["op"] == "null" else None
    shape = tuple(ast.literal_eval(text)) if text else ()
    return shape if shape and all(shape) else None


def _subpixel_plan(nodes, node):
    """``(stride, taps)`` when ``node`` can run as one Convolution per output phase (a 2D
    transposed convolution with equal strides above 1, kernel a multiple of the stride, no
    dilation, one group, weight and bias of known shapes), else None."""
    attrs = node.get("attrs", {})
    kernel = _tuple(attrs, "kernel", 0, 1)
    strides = _tuple(attrs, "stride", len(kernel), 1)
    if (len(kernel) != 2 or len(set(strides)) != 1 or strides[0] == 1
            or len(set(kernel)) != 1 or kernel[0] % strides[0]
            or set(_tuple(attrs, "dilate", 2, 1)) != {1} or int(attrs.get("num_group", 1)) != 1
            or any(_known_shape(nodes, entry) is None for entry in node["inputs"][1:])):
        return None
    return strides[0], kernel[0] // strides[0]


def _emit_subpixel(rw, node, inputs, stride, taps):
    """Emit ``node`` as one Convolution computing the ``stride**2`` output phases as channels,
    interleaved by ``depth_to_space``: the multiply-adds of the transposed convolution, no zeros.

    Output phase ``r`` (per axis) at position ``q`` is ``sum_m x[q - m] * w[r + stride * m]``:
    a convolution of ``x`` with taps ``m < taps`` of the kernel, reversed."""
    attrs = node.get("attrs", {})
    pad = _tuple(attrs, "pad", 2, 0)
    adj = _tuple(attrs, "adj", 2, 0)
    emit = _Emitter(rw, node["name"])
    weight = emit.op("Reshape", [inputs[1]], shape=(0, 0, -4, taps, stride, -4, taps, stride))
    weight = emit.op("reverse", [weight], axis=(2, 4))
    weight = emit.op("transpose", [weight], axes=(3, 5, 1, 0, 2, 4))
    weight = emit.op("Reshape", [weight], shape=(-3, -2))  # (phase_h * phase_w, C_out, ...)
    weight = emit.op("Reshape", [weight], shape=(-3, -2))  # (phases * C_out, C_in, taps, taps)
    data = emit.op("Pad", [inputs[0]], mode="constant",
                   pad_width=(0, 0, 0, 0, taps - 1, taps, taps - 1, taps))
    biases = [emit.op("tile", [bias], reps=(stride * stride,)) for bias in inputs[2:]]
    out = emit.op("Convolution", [data, weight] + biases, name=node["name"], kernel=(taps, taps),
                  num_filter=int(attrs["num_filter"]) * stride * stride,
                  no_bias=attrs.get("no_bias", "True"))  # Deconvolution's default
    out = emit.op("depth_to_space", [out], block_size=stride)
    for axis, (p, extra) in enumerate(zip(pad, adj)):
        # The phases cover stride * (I + taps) positions; the output starts at pad and ends
        # stride - adj + pad before their end.
        out = emit.op("slice_axis", [out], axis=2 + axis, begin=p, end=-(stride - extra + p))
    return out


def deconvolution_as_convolution(sym):
    """Rewrite every transposed convolution of ``sym`` as the equivalent ``Convolution``.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph; its ``Deconvolution`` nodes with a channels-first layout and no ``target_shape``
        are rewritten (see the module docstring), every other node is copied.

    Returns
    -------
    mx.sym.Symbol
        The same function of the same arguments, with the same output names.

    Examples
    --------
    >>> import mxnet as mx
    >>> x = mx.sym.var('data')
    >>> y = mx.sym.Deconvolution(x, kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=3,
    ...                          name='up')
    >>> conv = deconvolution_as_convolution(y)
    >>> conv.list_arguments(), conv.list_outputs()
    (['data', 'up_weight'], ['up_output'])
    >>> conv.infer_shape(data=(1, 2, 5, 5))[1], y.infer_shape(data=(1, 2, 5, 5))[1]
    ([(1, 3, 10, 10)], [(1, 3, 10, 10)])
    """
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        if node["op"] == "Deconvolution" and rewritable(node):
            inputs = [rw.input_entry(e) for e in node["inputs"]]
            plan = _subpixel_plan(rw.old_nodes, node)
            rw.replace(old_id, _emit_subpixel(rw, node, inputs, *plan) if plan else
                       _emit_convolution(rw, node, inputs))
        else:
            rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())
