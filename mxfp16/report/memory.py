"""Training memory, float32 against float16 with float32 master weights: an estimate.

**Parameters** (exact, from shape inference): the weights in their training dtype, one gradient per
weight in the same dtype, for float16 training a float32 master copy of each float16 weight (what
``multi_precision=True`` keeps), the optimizer state in float32 (:data:`OPTIMIZER_STATES` values
per weight: SGD's momentum 1, Adam's mean and variance 2), and the auxiliary states (BatchNorm
running statistics, float32 in both).

**Activations** (an estimate): every output of every op is kept for the backward pass, in the dtype
the graph gives it, plus the data input.  In the float16 graph the inserted casts' outputs count
too (the float16 copy of the data, the float32 copy of the logits).  MXNet's memory planner does
better where an op's backward does not need a tensor (it shares or frees it), and worse by what this
leaves out: cuDNN workspaces, gradient buffers of the activations during backward, BatchNorm's saved
per-channel statistics, the CUDA context and the allocator's fragmentation.  Treat the largest batch
size as an upper bound.
"""
import re

import numpy as np

#: One-line statement of the activation model, for the rendered report.
ACTIVATION_MODEL = ("estimate: every op output is kept for backward, in its dtype, plus the data input; "
                    "no cuDNN workspace, activation-gradient buffers, CUDA context or fragmentation, "
                    "and no memory sharing by MXNet's planner")

#: Float32 values of optimizer state per weight: SGD and NAG keep a momentum, RMSProp (non-centered)
#: and AdaGrad a running square, Adam and LAMB a mean and a variance.  SGD without momentum keeps
#: none; call it 'sgd' with ``momentum=0`` in MXNet, here pass 'none'.
OPTIMIZER_STATES = {"none": 0, "sgd": 1, "nag": 1, "rmsprop": 1, "adagrad": 1, "adam": 2, "lamb": 2}

_UNITS = {"": 1, "b": 1, "k": 2 ** 10, "kib": 2 ** 10, "kb": 10 ** 3, "m": 2 ** 20, "mib": 2 ** 20,
          "mb": 10 ** 6, "g": 2 ** 30, "gib": 2 ** 30, "gb": 10 ** 9, "t": 2 ** 40, "tib": 2 ** 40,
          "tb": 10 ** 12}


def parse_size(text):
    """Bytes in a memory size such as ``'16GiB'``, ``'16GB'`` or ``'40G'``.

    ``KiB/MiB/GiB/TiB`` are powers of 1024 and ``KB/MB/GB/TB`` powers of 1000 (SI); a bare letter
    (``K, M, G, T``) is taken as binary, as ``free -h`` and ``nvidia-smi`` mean it.  A plain number is
    bytes.  Case does not matter.

    Parameters
    ----------
    text : str

    Returns
    -------
    int

    Raises
    ------
    ValueError
        If ``text`` is not a positive number followed by a known unit.

    Examples
    --------
    >>> parse_size('16GiB'), parse_size('16GB'), parse_size('40G'), parse_size('1.5 KiB')
    (17179869184, 16000000000, 42949672960, 1536)
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", str(text))
    unit = match and match.group(2).lower()
    if not match or unit not in _UNITS or float(match.group(1)) <= 0:
        raise ValueError(f"cannot read the memory size {text!r}: write a positive number with a unit "
                         "such as 16GiB, 16GB, 40G or 512MiB (KiB/MiB/GiB/TiB and K/M/G/T are "
                         "binary, KB/MB/GB/TB decimal)")
    return int(float(match.group(1)) * _UNITS[unit])


def check_optimizer(name):
    """Return ``name`` lower-cased if :data:`OPTIMIZER_STATES` knows it, else raise ``ValueError``.

    Examples
    --------
    >>> check_optimizer('Adam')
    'adam'
    """
    key = str(name).lower()
    if key not in OPTIMIZER_STATES:
        raise ValueError(f"unknown optimizer {name!r} for the memory estimate: choose one of "
                         f"{', '.join(OPTIMIZER_STATES)}")
    return key


def _trainable(info, data_names):
    return [t for name, t in info.variables.items()
            if name not in data_names and name not in info.aux_names]


def parameter_bytes(info, data_names=("data",), optimizer="sgd"):
    """Bytes of weights, gradients, master weights, optimizer state and auxiliary states.

    Parameters
    ----------
    info : mxfp16.report.graph_info.GraphInfo
        A graph's shapes and dtypes: the float32 graph for float32 training, the cast graph for
        float16 training (float16 weights get a float32 master copy).
    data_names : sequence of str
        The data inputs, which are not parameters.
    optimizer : str
        A key of :data:`OPTIMIZER_STATES`.

    Returns
    -------
    dict
        ``weights``, ``gradients``, ``master_weights``, ``optimizer_state``, ``aux`` and ``total``
        in bytes, and ``num_parameters`` (trainable values).

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4, name='fc')
    >>> parameter_bytes(inspect_graph(fc, {'data': (1, 3)}), optimizer='adam')['total']
    256
    """
    states = OPTIMIZER_STATES[check_optimizer(optimizer)]
    trainable = _trainable(info, set(data_names))
    weights = sum(t.nbytes for t in trainable)
    half = sum(t.size for t in trainable if np.dtype(t.dtype).itemsize < 4)
    count = sum(t.size for t in trainable)
    result = {"weights": weights, "gradients": weights, "master_weights": 4 * half,
              "optimizer_state": 4 * states * count,
              "aux": sum(info.variables[name].nbytes for name in info.aux_names)}
    result["total"] = sum(result.values())
    result["num_parameters"] = count
    return result


def activation_bytes(info, data_names=("data",)):
    """Bytes of the activations kept for backward, by the model of the module docstring.

    Returns
    -------
    int
        The data inputs plus every op output, at the shapes ``info`` was inferred with.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> net = mx.sym.relu(mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=4))
    >>> activation_bytes(inspect_graph(net, {'data': (2, 3)}))  # (2*3 + 2*4 + 2*4) * 4
    88
    """
    inputs = sum(info.variables[name].nbytes for name in data_names)
    return inputs + sum(t.nbytes for layer in info.layers for t in layer.outputs)


def max_batch_size(gpu_bytes, fixed_bytes, per_sample_bytes):
    """The largest batch whose parameters and activations fit in ``gpu_bytes`` (0 if none does).

    Examples
    --------
    >>> max_batch_size(1000, 200, 30)
    26
    """
    return max(0, int((gpu_bytes - fixed_bytes) // per_sample_bytes))


def memory_report(info32, info16, batch_size, gpu_bytes, data_names=("data",), optimizer="sgd"):
    """Parameter and activation memory for float32 and float16 training, and the batch that fits.

    Parameters
    ----------
    info32, info16 : mxfp16.report.graph_info.GraphInfo
        The float32 graph and the float16 (GPU) cast graph, at batch size ``batch_size``.
    batch_size : int
        The batch size of the shapes (activations are divided by it to get bytes per sample).
    gpu_bytes : int
        GPU memory (see :func:`parse_size`).
    data_names : sequence of str
    optimizer : str
        A key of :data:`OPTIMIZER_STATES`.

    Returns
    -------
    dict
        Per dtype (``'float32'``, ``'float16'``): ``parameters`` (:func:`parameter_bytes`),
        ``activations_per_sample``, ``total_at_batch``, ``max_batch_size`` and
        ``max_batch_size_multiple_of_8``; plus ``batch_size``, ``gpu_bytes``, ``optimizer`` and
        ``activation_model``.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxfp16 import cast_symbol
    >>> from mxfp16.report.graph_info import inspect_graph
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=8, name='fc')
    >>> shapes = {'data': (4, 8)}
    >>> report = memory_report(inspect_graph(fc, shapes),
    ...                        inspect_graph(cast_symbol(fc, 'float16', emulate=False), shapes),
    ...                        batch_size=4, gpu_bytes=2 ** 20)
    >>> # float32: data 8 + output 8 values x 4 B; float16 adds a float16 copy of the data, a float16
    >>> # output and its float32 copy: 32 + 16 + 16 + 32
    >>> report['float32']['activations_per_sample'], report['float16']['activations_per_sample']
    (64.0, 96.0)
    """
    report = {"batch_size": batch_size, "gpu_bytes": gpu_bytes, "optimizer": check_optimizer(optimizer),
              "activation_model": ACTIVATION_MODEL}
    for dtype, info in (("float32", info32), ("float16", info16)):
        params = parameter_bytes(info, data_names, optimizer)
        per_sample = activation_bytes(info, data_names) / batch_size
        largest = max_batch_size(gpu_bytes, params["total"], per_sample)
        report[dtype] = {"parameters": params, "activations_per_sample": per_sample,
                         "total_at_batch": params["total"] + per_sample * batch_size,
                         "max_batch_size": largest, "max_batch_size_multiple_of_8": largest // 8 * 8}
    return report
