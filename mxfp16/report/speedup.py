"""Estimated training speed-up of float16 on V100, A100 and H100: a per-layer roofline.

Each op takes ``max(flops / peak rate, bytes / memory bandwidth)``; a training step (forward and
backward) takes 3 times the forward: backward computes two GEMMs per forward GEMM (data and weight
gradients) and reads and writes about twice the forward's tensors.  Rates:

* **float32**: every op at the FP32 (CUDA core) rate, every tensor 4 bytes;
* **TF32** (A100, H100): the GEMM layers whose dimensions are multiples of 4 run at the TF32 Tensor Core
  rate, the rest as in float32;
* **float16**: the GEMM layers eligible for Tensor Cores (:mod:`mxfp16.report.tensor_cores`) run at
  the FP16 Tensor Core rate; ineligible ones at the FP32 rate (a conservative choice: cuDNN and cuBLAS
  may still use Tensor Cores with slower padded kernels).  A first layer that breaks the rule only by
  its 3 input channels counts as padded by cuDNN: Tensor Core rate on the flops of the padded channels.
  The fused RNN op stays at the FP32 rate (:data:`FP32_MATH_LAYERS`), with half the bytes.
  Other ops (BatchNorm, activations, pooling, additions, the inserted casts) are memory-bound; they run
  at the FP32 rate on the tensors of the cast graph (float16 activations, float32 BatchNorm
  parameters).

Peak rates and bandwidths are the vendors' published dense figures (no sparsity), see
:data:`GPU_SPECS`.  Left out: kernel launch overhead, the optimizer update (memory-bound, and larger
with float32 master weights), data loading, multi-GPU communication and the efficiency real kernels
reach (often 50-80 % of peak).  Compare the ratio, not the absolute times, with measurements.
"""
from dataclasses import asdict, dataclass

from .tensor_cores import TENSOR_CORE_LAYERS, round_up

#: One-line statement of the model, for the rendered report.
MODEL_SUMMARY = ("roofline per op: max(flops / peak, bytes / bandwidth), x3 for forward + backward; "
                 "float16 Tensor Core rate only for eligible GEMM layers (a 3-channel first layer "
                 "counts as padded by cuDNN), FP32 rate otherwise; published dense peaks, no launch "
                 "overhead, optimizer or data loading: compare ratios, not times")

#: GEMM layers MXNet 1.9.1 runs without Tensor Cores in float16 and TF32: its RNN op sets
#: ``cudnn_tensor_core_ = false`` and computes float16 data in float32 (src/operator/rnn-inl.h).
FP32_MATH_LAYERS = ("RNN",)

#: Gate GEMMs per recurrent cell of the fused RNN op's modes.
RNN_GATES = {"lstm": 4, "gru": 3, "rnn_relu": 1, "rnn_tanh": 1}

#: Forward + backward costs this many forwards (backward = data-gradient + weight-gradient GEMMs).
TRAINING_FACTOR = 3


@dataclass(frozen=True)
class GpuSpec:
    """Published peak rates (FLOP/s), memory bandwidth (bytes/s) and memory (bytes) of a GPU."""

    name: str
    fp32_flops: float
    tf32_flops: float
    fp16_tensor_flops: float
    bandwidth: float
    memory: int
    source: str


#: The GPUs the report estimates for.  TF32 is None where the GPU has none.
GPU_SPECS = {
    "V100": GpuSpec("V100 SXM2 16GB", 15.7e12, None, 125e12, 900e9, 16 * 2 ** 30,
                    "NVIDIA Tesla V100 GPU data sheet (SXM2)"),
    "A100": GpuSpec("A100 SXM 80GB", 19.5e12, 156e12, 312e12, 2039e9, 80 * 2 ** 30,
                    "NVIDIA A100 Tensor Core GPU data sheet (SXM4 80GB, dense)"),
    "H100": GpuSpec("H100 SXM 80GB", 67e12, 495e12, 989e12, 3350e9, 80 * 2 ** 30,
                    "NVIDIA H100 Tensor Core GPU data sheet (SXM5, dense)"),
}


@dataclass(frozen=True)
class PublishedSpeedup:
    """A measured float16 training speed-up to print next to the estimate."""

    network: str
    setup: str
    speedup: float
    source: str


_MXNET_GUIDE = "MXNet 1.9 float16 guide (docs: faq/float16), ImageNet, 90 epochs"
_NVIDIA_DLE = "NVIDIA DeepLearningExamples, MXNet ResNet-50 v1.5 performance tables"

#: Published ResNet-50 measurements (see /work/shared/REFERENCES.md).
PUBLISHED_SPEEDUPS = (
    PublishedSpeedup("resnet50_v1", "8x V100, float16 batch 1024 vs float32 batch 1024 "
                     "(7.3 h vs 11.8 h)", 1.62, _MXNET_GUIDE),
    PublishedSpeedup("resnet50_v1", "8x V100, float16 batch 2048 vs float32 batch 1024 "
                     "(6.5 h vs 11.8 h)", 1.82, _MXNET_GUIDE),
    PublishedSpeedup("resnet50_v1.5", "1x V100 16GB, NHWC + DALI, float16 batch 192 vs float32 "
                     "batch 96 (1376 vs 384 img/s)", 3.58, _NVIDIA_DLE),
    PublishedSpeedup("resnet50_v1.5", "1x A100 80GB, batch 512, AMP vs TF32 (3410.5 vs 1055.8 img/s)",
                     3.23, _NVIDIA_DLE),
)


def check_gpu(name):
    """Return the key of :data:`GPU_SPECS` for ``name`` (any case), or raise ``ValueError``.

    Examples
    --------
    >>> check_gpu('a100')
    'A100'
    """
    key = str(name).upper()
    if key not in GPU_SPECS:
        raise ValueError(f"unknown GPU {name!r}: choose one of {', '.join(GPU_SPECS)}")
    return key


def published_speedups(network):
    """The published measurements for a network name (ResNet-50 variants), as dicts.

    Examples
    --------
    >>> [p['speedup'] for p in published_speedups('resnet50_v1')], published_speedups('vgg16')
    ([1.62, 1.82, 3.58, 3.23], [])
    """
    if not network or not str(network).startswith("resnet50"):
        return []
    return [asdict(item) for item in PUBLISHED_SPEEDUPS]


def rnn_forward_flops(layer):
    """Forward FLOPs of a fused RNN op: per layer and direction, the input and the recurrent GEMM of
    every gate at every time step (and the projection, where set).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> lstm = mx.gluon.rnn.LSTM(16, input_size=8)
    >>> lstm.initialize()
    >>> info = inspect_graph(lstm(mx.sym.var('data')), {'data': (5, 2, 8)})
    >>> rnn_forward_flops(next(l for l in info.layers if l.op == 'RNN'))  # 2*5*2 * 4*16 * (8+16)
    30720
    """
    steps, batch, input_size = layer.inputs[0].shape
    hidden = int(layer.attrs["state_size"])
    projection = layer.attrs.get("projection_size", "None")
    out = hidden if projection == "None" else int(projection)
    directions = 2 if layer.attrs.get("bidirectional") in ("True", "true", "1") else 1
    gates = RNN_GATES[layer.attrs["mode"]] * hidden
    flops = 0
    for _ in range(int(layer.attrs["num_layers"])):
        per_step = gates * (input_size + out) + (0 if projection == "None" else hidden * out)
        flops += 2 * steps * batch * directions * per_step
        input_size = directions * out
    return flops


def forward_flops(layer):
    """Forward FLOPs of one op (2 per multiply-add for GEMMs, 1 per output value otherwise).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> conv = mx.sym.Convolution(mx.sym.var('data'), num_filter=8, kernel=(3, 3), no_bias=True)
    >>> forward_flops(inspect_graph(conv, {'data': (1, 4, 5, 5)}).layers[0])  # 2 * 8*3*3 * 4*3*3
    5184
    """
    if layer.op == "RNN":
        return rnn_forward_flops(layer)
    if layer.op in TENSOR_CORE_LAYERS:
        weight = layer.inputs[1]
        # A weight row holds the multiply-adds of one output value (Convolution: C/groups x kernel,
        # FullyConnected: K); Deconvolution scatters each input value through one row instead.
        values = layer.inputs[0].size if layer.op == "Deconvolution" else layer.outputs[0].size
        return 2 * values * (weight.size // weight.shape[0])
    return sum(t.size for t in layer.outputs)


def layer_bytes(layer):
    """Bytes an op reads and writes: all its inputs (parameters included) and outputs.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> layer_bytes(inspect_graph(mx.sym.relu(mx.sym.var('data')), {'data': (2, 8)}).layers[0])
    128
    """
    return sum(t.nbytes for t in layer.inputs) + sum(t.nbytes for t in layer.outputs)


def _tensor_rate(check, flops, tensor_flops, fp32_flops, multiple):
    """(flops, rate) of a GEMM layer on Tensor Cores if eligible or padded, else on CUDA cores."""
    if check is None or tensor_flops is None:
        return flops, fp32_flops
    if check["eligible"]:
        return flops, tensor_flops
    if check["padded_by_cudnn"]:
        channels = check["dims"]["in_channels"]
        return flops * round_up(channels, multiple) / channels, tensor_flops
    return flops, fp32_flops


def layer_time(layer, gpu, mode, check=None):
    """Seconds one op takes for forward + backward under the roofline model.

    Parameters
    ----------
    layer : mxfp16.report.graph_info.Layer
        With the dtypes of the graph that runs (float32 or the cast graph).
    gpu : GpuSpec
    mode : {'float32', 'tf32', 'float16'}
    check : dict or None
        The layer's Tensor Core check (:func:`mxfp16.report.tensor_cores.check_layer`) with the
        multiple for ``mode`` (8 for float16, 4 for TF32); None for ops that are not GEMMs.

    Returns
    -------
    (float, str)
        The time and what bounds it, ``'compute'`` or ``'memory'``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> relu = inspect_graph(mx.sym.relu(mx.sym.var('data')), {'data': (1000, 900)}).layers[0]
    >>> seconds, bound = layer_time(relu, GPU_SPECS['V100'], 'float32')
    >>> round(seconds * 1e6, 3), bound  # 3 x 7.2 MB / 900 GB/s
    (24.0, 'memory')
    """
    flops, rate = forward_flops(layer), gpu.fp32_flops
    if mode != "float32" and layer.op in TENSOR_CORE_LAYERS and layer.op not in FP32_MATH_LAYERS:
        tensor = gpu.fp16_tensor_flops if mode == "float16" else gpu.tf32_flops
        flops, rate = _tensor_rate(check, flops, tensor, gpu.fp32_flops, 8 if mode == "float16" else 4)
    compute, memory = flops / rate, layer_bytes(layer) / gpu.bandwidth
    return TRAINING_FACTOR * max(compute, memory), "compute" if compute >= memory else "memory"


def _gpu_estimate(info32, info16, checks16, checks_tf32, gpu, batch_size):
    layers32 = {layer.name: layer for layer in info32.layers}
    rows = []
    for layer in info16.layers:
        original = layers32.get(layer.name)
        row = {"name": layer.name, "op": layer.op, "tensor_core_layer": layer.op in TENSOR_CORE_LAYERS,
               "eligible": bool(checks16.get(layer.name, {}).get("eligible")),
               "padded_by_cudnn": bool(checks16.get(layer.name, {}).get("padded_by_cudnn")),
               "forward_flops": forward_flops(layer)}
        row["float32_s"] = layer_time(original, gpu, "float32")[0] if original else 0.0
        row["tf32_s"] = None if not gpu.tf32_flops else \
            layer_time(original, gpu, "tf32", checks_tf32.get(layer.name))[0] if original else 0.0
        row["float16_s"], row["float16_bound"] = layer_time(layer, gpu, "float16",
                                                            checks16.get(layer.name))
        rows.append(row)
    totals = {"float32": sum(row["float32_s"] for row in rows),
              "tf32": sum(row["tf32_s"] for row in rows) if gpu.tf32_flops else None,
              "float16": sum(row["float16_s"] for row in rows)}
    return {"gpu": gpu.name, "source": gpu.source, "step_s": totals,
            "images_per_s": {k: batch_size / v if v else None for k, v in totals.items()},
            "speedup_vs_float32": totals["float32"] / totals["float16"],
            "speedup_vs_tf32": totals["tf32"] / totals["float16"] if totals["tf32"] else None,
            "layers": rows}


def estimate_speedup(info32, info16, checks16, checks_tf32, batch_size, gpus=tuple(GPU_SPECS)):
    """Per-layer and whole-network roofline estimates of a training step's time.

    Parameters
    ----------
    info32, info16 : mxfp16.report.graph_info.GraphInfo
        The float32 graph and the float16 GPU cast graph, at ``batch_size``.
    checks16, checks_tf32 : dict
        Layer name -> Tensor Core check with multiples 8 and 4
        (:func:`mxfp16.report.tensor_cores.check_tensor_cores`'s ``layers``, keyed by name).
    batch_size : int
    gpus : sequence of str
        Keys of :data:`GPU_SPECS`.

    Returns
    -------
    dict
        GPU key -> ``gpu``, ``source``, ``step_s`` (``float32``, ``tf32`` (None on V100),
        ``float16`` seconds per training step), ``images_per_s``, ``speedup_vs_float32``,
        ``speedup_vs_tf32`` and ``layers`` (per op: ``name``, ``op``, ``tensor_core_layer``,
        ``eligible``, ``padded_by_cudnn``, ``forward_flops``, ``float32_s``, ``tf32_s``,
        ``float16_s``, ``float16_bound``).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16 import cast_symbol
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> from mxfp16.report.tensor_cores import check_tensor_cores
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4096, name='fc')
    >>> shapes = {'data': (512, 4096)}
    >>> info32 = inspect_graph(fc, shapes)
    >>> info16 = inspect_graph(cast_symbol(fc, 'float16', emulate=False), shapes)
    >>> checks = {c['name']: c for c in check_tensor_cores(info32, fc, 512)['layers']}
    >>> estimate = estimate_speedup(info32, info16, checks, checks, 512, gpus=['V100'])
    >>> # float32 1.09 ms; float16 0.14 ms of GEMM + 0.03 ms for the casts of the input and output
    >>> round(estimate['V100']['speedup_vs_float32'], 1)
    6.6
    """
    return {key: _gpu_estimate(info32, info16, checks16, checks_tf32, GPU_SPECS[check_gpu(key)],
                               batch_size)
            for key in gpus}
