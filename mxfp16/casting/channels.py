"""Output channels of bfloat16 convolutions padded to a multiple of 16, for oneDNN's CPU kernels.

oneDNN (2.4, in MXNet 1.9.1) blocks the channels of its bfloat16 convolution kernels by 16.  A
convolution with another number of output channels (SSD's class predictors, ``4 * 11 = 44``
channels for 10 classes) takes its reference GEMM kernel, two to three times as slow as the same
convolution with 48.  The rewrite gives such a convolution zero filters (and zero biases) up to
the next multiple of 16 and slices the extra output channels off:

    Convolution(x, w, b, num_filter=n)
        = slice_axis(Convolution(x, concat(w, 0), concat(b, 0), num_filter=n + k), axis=1, 0, n)

Each kept output channel is the same sum of the same products; the padded channels are computed and
dropped, and their weights are constants (``zeros_like`` of a slice of the weight), so the weight's
gradient is the original's.  The zeros take their shape from the weight, whose output channels
must be known in the graph (Gluon's parameters, deferred or not; a Symbol's variable declared with
a ``shape``): shape inference cannot run backwards through the concat.  Rows ``channel_padding`` of
:mod:`~mxfp16.casting.rules` name the ops; convolutions of fewer than 16 channels run in float32
instead (rows ``bfloat16_float32``: the BatchNorm after them would read a plain-layout tensor), and
grouped ones are left alone (their input channels would need padding too).
"""
from .graph import GraphRewriter
from .rules import ops_with

#: oneDNN's channel block of bfloat16 convolutions on AVX-512 CPUs.
CHANNEL_BLOCK = 16


def padding(node):
    """The zero filters ``node`` gets (0: none), by the ``channel_padding`` rows.

    Examples
    --------
    >>> padding({'op': 'Convolution', 'attrs': {'num_filter': '44'}})
    4
    >>> padding({'op': 'Convolution', 'attrs': {'num_filter': '8'}})  # float32 instead
    0
    """
    attrs = node.get("attrs", {})
    if node["op"] not in ops_with("channel_padding") or int(attrs.get("num_group", 1)) != 1:
        return 0
    channels = int(attrs.get("num_filter", 0))
    return -channels % CHANNEL_BLOCK if channels > CHANNEL_BLOCK else 0


def _leading_dim_known(nodes, node):
    """Whether the weight and bias of ``node`` are variables whose ``__shape__`` gives their
    output channels (Gluon's parameters, deferred or not): the zeros take their shape from them,
    which shape inference cannot do backwards through the concat."""
    channels = node["attrs"]["num_filter"]
    for entry in node["inputs"][1:]:
        source = nodes[entry[0]]
        shape = source.get("attrs", {}).get("__shape__", "()").strip("()[] ").split(",")
        if source["op"] != "null" or shape[0].strip() != channels:
            return False
    return True


def _emit(rw, node, inputs, extra):
    """Emit the padded convolution of ``node`` (inputs mapped) and return its sliced output."""
    def op(name, op_name, entries, **attrs):
        new = {"op": op_name, "name": rw.unique_name(f"{node['name']}_{name}"),
               "attrs": {key: str(value) for key, value in attrs.items()}}
        return (rw.emit(new, entries), 0, 0)

    padded = []
    for position, entry in enumerate(inputs[1:], start=1):
        zeros = op(f"pad{position}", "zeros_like",
                   [op(f"pad{position}_like", "slice_axis", [entry], axis=0, begin=0, end=extra)])
        padded.append(op(f"padded{position}", "Concat", [entry, zeros], dim=0, num_args=2))
    channels = int(node["attrs"]["num_filter"])
    conv = dict(node, name=rw.unique_name(f"{node['name']}_padded"),
                attrs=dict(node["attrs"], num_filter=str(channels + extra)))
    out = (rw.emit(conv, [inputs[0]] + padded), 0, 0)
    sliced = {"op": "slice_axis", "name": node["name"],  # the output keeps its name
              "attrs": {"axis": "1", "begin": "0", "end": str(channels)}}
    return (rw.emit(sliced, [out]), 0, 0)


def pad_output_channels(sym, kept=frozenset()):
    """``sym`` with each convolution that :func:`padding` names padded (see the module docstring),
    but those named in ``kept`` (kept float32 by ``keep_float32``: no bfloat16 kernel to feed).

    Examples
    --------
    >>> import mxnet as mx
    >>> weight = mx.sym.var('conv_weight', shape=(20, 0, 3, 3))
    >>> bias = mx.sym.var('conv_bias', shape=(20,))
    >>> y = mx.sym.Convolution(mx.sym.var('data'), weight, bias, kernel=(3, 3), num_filter=20,
    ...                        name='conv')
    >>> padded = pad_output_channels(y)
    >>> padded.list_arguments(), padded.list_outputs()
    (['data', 'conv_weight', 'conv_bias'], ['conv_output'])
    >>> padded.infer_shape(data=(1, 2, 5, 5))[0]
    [(1, 2, 5, 5), (20, 2, 3, 3), (20,)]
    """
    rw = GraphRewriter(sym, drop_inserted=False)
    for old_id, node in rw.nodes_in_order():
        extra = padding(node)
        if extra and node["name"] not in kept and _leading_dim_known(rw.old_nodes, node):
            rw.replace(old_id, _emit(rw, node, [rw.input_entry(e) for e in node["inputs"]],
                                     extra))
        else:
            rw.copy(old_id, node)
    return rw.to_symbol(rw.heads())
