"""Tensor Core eligibility of the matrix multiplies: NVIDIA's multiple-of-8 rule.

Tensor Cores run a float16 GEMM at full rate when its dimensions are multiples of 8 (16 bytes of
float16; 4 for TF32, whose elements are 4 bytes).  Sources: NVIDIA, "Deep Learning Performance
Guide: Matrix Multiplication Background" and "Convolutional Layers" (channels in and out, and the
batch of fully connected layers, multiples of 8), and the MXNet 1.9 float16 guide ("input and output
channels and batch size multiples of 8").

The checked dimensions:

* ``Convolution`` / ``Deconvolution``: input channels, output channels and the batch size.  For a
  grouped convolution each group is its own GEMM, so the channels **per group** are checked (and the
  suggestion is per group times the number of groups).  A depthwise convolution (one input channel
  per group) has no Tensor Core kernel in cuDNN at all; it is listed as not eligible without a
  suggestion (it is memory-bound, and padding it would not help).
* ``FullyConnected``: M = batch (all leading dimensions without ``flatten``), N = ``num_hidden``,
  K = input features.  A language model's output layer has N = the vocabulary: 33278 (WikiText-2)
  breaks the rule, 33280 keeps it.
* ``RNN`` (the fused LSTM, GRU and RNN of ``gluon.rnn``): the batch, the input size (an embedding
  size for the first layer) and the hidden size (and the projection size, where set), as NVIDIA's
  guide asks of recurrent layers.  MXNet 1.9.1 itself runs its float16 RNN op without Tensor Cores
  (``cudnn_tensor_core_ = false`` in ``src/operator/rnn-inl.h``: float16 storage, float32 math), so
  the speed estimate keeps it at the FP32 rate; the sizes still decide Tensor Cores for recurrent
  cells unrolled into ``FullyConnected`` layers and on other frameworks.
* ``Embedding`` is a lookup, not a GEMM: its vocabulary and embedding size are listed (the
  embedding size is the K of the layer it feeds, the vocabulary the N of a tied output layer).

Suggestions **round up** to the next multiple of 8: zero-padded channels keep what the network
computes (rounding down would remove capacity), and rounding up is what cuDNN itself does when it
pads.  A first layer reading the network's input (3 RGB channels) breaks the rule, but cuDNN pads its
input channels itself and runs Tensor Cores anyway, so it is reported with that note, and the speed
estimate (:mod:`mxfp16.report.speedup`) treats it as padded.
"""
import math

from .graph_info import graph_nodes

#: The Tensor Core alignment for float16: 8 elements (16 bytes).
FLOAT16_MULTIPLE = 8

#: The alignment for TF32 Tensor Cores (A100, H100): 4 elements (16 bytes).
TF32_MULTIPLE = 4

#: The matrix-multiply layers the rule applies to.
TENSOR_CORE_LAYERS = ("Convolution", "Deconvolution", "FullyConnected", "RNN")

#: Lookups whose sizes feed GEMMs: listed and checked, but not GEMMs themselves.
EMBEDDING_LAYERS = ("Embedding",)

STEM_NOTE = ("reads the network input ({channels} channels): cuDNN pads the input channels itself "
             "and uses Tensor Cores; nothing to change")
DEPTHWISE_NOTE = "depthwise (1 channel per group): cuDNN has no Tensor Core kernel for it; memory-bound"
RNN_NOTE = ("MXNet 1.9.1 runs its float16 RNN op with float32 math, without Tensor Cores; the sizes "
            "matter for unrolled cells and other frameworks")
EMBEDDING_NOTE = ("a lookup, not a GEMM: embed_size is the K of the next layer, vocabulary the N of a "
                  "tied output layer")


def round_up(value, multiple=FLOAT16_MULTIPLE):
    """The smallest multiple of ``multiple`` that is >= ``value``.

    Examples
    --------
    >>> round_up(61), round_up(3), round_up(64)
    (64, 8, 64)
    """
    return int(math.ceil(value / multiple) * multiple)


def gemm_dims(layer):
    """The dimensions the rule checks for one GEMM layer, as a dict of name to size.

    Parameters
    ----------
    layer : mxfp16.report.graph_info.Layer
        A Convolution, Deconvolution or FullyConnected layer with shapes.

    Returns
    -------
    dict
        ``{'batch', 'in_channels', 'out_channels'}`` (per group) for convolutions,
        ``{'M', 'N', 'K'}`` for FullyConnected, ``{'batch', 'input_size', 'hidden_size'}`` (and
        ``'projection_size'`` where set) for RNN (its data is sequence-major, ``(T, N, C)``),
        ``{'vocabulary', 'embed_size'}`` for Embedding.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=10, name='fc')
    >>> gemm_dims(inspect_graph(fc, {'data': (8, 3, 4)}).layers[0])
    {'M': 8, 'N': 10, 'K': 12}
    """
    data, weight = layer.inputs[0].shape, layer.inputs[1].shape
    if layer.op == "RNN":
        dims = {"batch": data[1], "input_size": data[2], "hidden_size": int(layer.attrs["state_size"])}
        projection = layer.attrs.get("projection_size", "None")
        return dict(dims, projection_size=int(projection)) if projection != "None" else dims
    if layer.op == "Embedding":
        return {"vocabulary": weight[0], "embed_size": weight[1]}
    if layer.op == "FullyConnected":
        flatten = layer.attrs.get("flatten", "True") in ("True", "true", "1")
        features = math.prod(data[1:]) if flatten else data[-1]
        return {"M": math.prod(data) // features, "N": weight[0], "K": features}
    layout = layer.attrs.get("layout", "None")
    axis = layout.index("C") if layout not in ("None", "") else 1
    groups = int(layer.attrs.get("num_group", 1))
    out_channels = layer.outputs[0].shape[axis]
    return {"batch": data[0], "in_channels": data[axis] // groups,
            "out_channels": out_channels // groups}


def stem_layers(sym):
    """Names of the GEMM layers with no GEMM between them and the network's input.

    Examples
    --------
    >>> import mxnet as mx
    >>> first = mx.sym.Convolution(mx.sym.var('data'), num_filter=8, kernel=(1, 1), name='stem')
    >>> stem_layers(mx.sym.FullyConnected(first, num_hidden=2, name='fc'))
    ['stem']
    """
    nodes = graph_nodes(sym)
    after_gemm, stems = [False] * len(nodes), []
    for index, node in enumerate(nodes):
        upstream = any(after_gemm[entry[0]] for entry in node["inputs"])
        is_gemm = node["op"] in TENSOR_CORE_LAYERS
        if is_gemm and not upstream:
            stems.append(node["name"])
        after_gemm[index] = upstream or is_gemm
    return stems


def check_layer(layer, is_stem=False, multiple=FLOAT16_MULTIPLE):
    """The rule applied to one GEMM layer.

    Parameters
    ----------
    layer : mxfp16.report.graph_info.Layer
        A Convolution, Deconvolution or FullyConnected layer with shapes.
    is_stem : bool
        Whether the layer reads the network input with no GEMM before it (:func:`stem_layers`).
    multiple : int

    Returns
    -------
    dict
        ``name``, ``op``, ``input_shape``, ``weight_shape``, ``output_shape``, ``groups``, ``dims``,
        ``violations`` (dims not a multiple), ``suggestions`` (dim -> rounded-up size, whole layer),
        ``eligible`` (no violation), ``padded_by_cudnn`` (a stem whose only violation is its input
        channels) and ``note``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=61, name='fc')
    >>> check = check_layer(inspect_graph(fc, {'data': (32, 64)}).layers[0])
    >>> check['dims'], check['suggestions']
    ({'M': 32, 'N': 61, 'K': 64}, {'N': 64})
    """
    dims = gemm_dims(layer)
    groups = int(layer.attrs.get("num_group", 1))
    violations = {k: v for k, v in dims.items() if v % multiple}
    depthwise = "in_channels" in dims and dims["in_channels"] == 1 and groups > 1
    per_group = ("in_channels", "out_channels")
    suggestions = {} if depthwise else {
        k: round_up(v, multiple) * (groups if k in per_group else 1) for k, v in violations.items()}
    padded = is_stem and set(violations) == {"in_channels"}
    note = DEPTHWISE_NOTE if depthwise else \
        STEM_NOTE.format(channels=dims["in_channels"] * groups) if padded else \
        RNN_NOTE if layer.op == "RNN" else EMBEDDING_NOTE if layer.op in EMBEDDING_LAYERS else ""
    return {"name": layer.name, "op": layer.op, "input_shape": list(layer.inputs[0].shape),
            "weight_shape": list(layer.inputs[1].shape), "output_shape": list(layer.outputs[0].shape),
            "groups": groups, "dims": dims, "violations": violations, "suggestions": suggestions,
            "eligible": not violations, "padded_by_cudnn": padded, "note": note}


def check_tensor_cores(info, sym, batch_size, multiple=FLOAT16_MULTIPLE):
    """Check every Convolution, Deconvolution and FullyConnected layer against the rule.

    Parameters
    ----------
    info : mxfp16.report.graph_info.GraphInfo
        The float32 graph's shapes (:func:`mxfp16.report.graph_info.inspect_graph`).
    sym : mx.sym.Symbol
        The same graph (to find the layers that read the network input).
    batch_size : int
        The batch size the shapes were inferred with.
    multiple : int
        8 for float16 (:data:`FLOAT16_MULTIPLE`), 4 for TF32.

    Returns
    -------
    dict
        ``multiple``, ``batch_size``, ``batch_size_ok``, ``suggested_batch_size``, ``layers`` (one
        :func:`check_layer` dict per GEMM layer), ``violations`` (the names of the layers that
        break the rule, in graph order), ``embeddings`` (one :func:`check_layer` dict per
        Embedding) and ``embedding_violations``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> conv = mx.sym.Convolution(mx.sym.var('data'), num_filter=30, kernel=(3, 3), name='conv')
    >>> report = check_tensor_cores(inspect_graph(conv, {'data': (8, 16, 8, 8)}), conv, 8)
    >>> report['violations'], report['layers'][0]['suggestions']
    (['conv'], {'out_channels': 32})
    """
    stems = set(stem_layers(sym))
    layers = [check_layer(layer, layer.name in stems, multiple) for layer in info.layers
              if layer.op in TENSOR_CORE_LAYERS]
    embeddings = [check_layer(layer, multiple=multiple) for layer in info.layers
                  if layer.op in EMBEDDING_LAYERS]
    return {"multiple": multiple, "batch_size": batch_size,
            "batch_size_ok": batch_size % multiple == 0,
            "suggested_batch_size": round_up(batch_size, multiple), "layers": layers,
            "violations": [layer["name"] for layer in layers if not layer["eligible"]],
            "embeddings": embeddings,
            "embedding_violations": [layer["name"] for layer in embeddings if not layer["eligible"]]}
