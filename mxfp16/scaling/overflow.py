"""Checks of gradient arrays that loss scaling takes its decisions from.

Whether every gradient is finite (a step is skipped when not), and how large the largest one is (an
``'auto'`` loss scale starts from it).  Each check costs one host sync however many arrays it reads.
"""
import mxnet as mx
import numpy as np

from .. import mxnet_internals
from ..numpy_interface import legacy

#: Gradients checked per ``multi_all_finite`` call (one fused kernel per chunk).
_FINITE_CHECK_CHUNK = 128


def _slow_on_cpu(array):
    """Whether an array is float16 on a CPU, where MXNet's reductions over it run several times
    slower than over its float32 copy (exact: float16 widens to float32 exactly;
    measured on 20M float16 values: max(abs) 1.33 s against 0.26 s, the finite check 228 ms
    against 63 ms)."""
    return array.context.device_type == "cpu" and array.dtype == np.float16 \
        and array.stype == "default"  # row_sparse gradients (sparse embeddings) cannot reshape


def trainer_grads(trainer):
    """Every gradient array of a Trainer's parameters: ``[[param0 on dev0, on dev1, ...], ...]``,
    as legacy NDArrays (views of a NumPy-interface network's gradients)."""
    return [[legacy(grad) for grad in param.list_grad()] for param in mxnet_internals.trainer_params(trainer)
            if param.grad_req != "null"]


def flat_trainer_grads(trainer):
    """Every gradient array of a Trainer's parameters on every device, in one list."""
    return [grad for grads in trainer_grads(trainer) for grad in grads]


def all_finite(arrays):
    """Whether every value of every array is finite (one host sync).

    Parameters
    ----------
    arrays : list of NDArray
        Any dtypes and devices.

    Returns
    -------
    bool

    Examples
    --------
    >>> import mxnet as mx
    >>> all_finite([mx.nd.ones(3), mx.nd.array([1, float('inf')], dtype='float16')])
    False
    """
    groups = {}  # multi_all_finite wants one device and one dtype per call
    flags = []
    for array in map(legacy, arrays):
        if 0 in array.shape:  # (``size`` is refused by sparse arrays)
            continue
        if _slow_on_cpu(array):  # x . (x * 0) is 0 when all of x is finite, NaN when not
            flat = array.astype("float32").reshape((-1,))
            flags.append((mx.nd.dot(flat, flat * 0) == 0).reshape((1,)))
        else:
            groups.setdefault((array.context, array.dtype), []).append(array)
    for group in groups.values():
        for start in range(0, len(group), _FINITE_CHECK_CHUNK):
            chunk = group[start:start + _FINITE_CHECK_CHUNK]
            flag = mx.nd.multi_all_finite(*chunk, num_arrays=len(chunk), init_output=True)
            flags.append(flag.as_in_context(mx.cpu()))
    if not flags:
        return True
    # One read of all the flags together: a single wait on the devices, however many groups.
    return bool(mx.nd.concat(*flags, dim=0).min().asscalar())


def max_magnitudes(arrays):
    """The largest magnitude in each array, as a float64 numpy array (one host sync).

    Parameters
    ----------
    arrays : list of NDArray
        Any dtypes and devices; inf for an array holding inf, NaN for one holding NaN.

    Returns
    -------
    numpy.ndarray

    Examples
    --------
    >>> import mxnet as mx
    >>> max_magnitudes([mx.nd.array([1, -3]), mx.nd.array([2], dtype='float16')]).tolist()
    [3.0, 2.0]
    """
    if not arrays:
        return np.zeros(0)
    maxima = [mx.nd.max(mx.nd.abs(array.astype("float32") if _slow_on_cpu(array) else array))
              .astype("float32").as_in_context(mx.cpu()).reshape((1,))
              for array in map(legacy, arrays)]
    return mx.nd.concat(*maxima, dim=0).asnumpy().astype(np.float64)


def max_magnitude(arrays):
    """The largest magnitude of any value of any array, as a Python float (one host sync).

    Parameters
    ----------
    arrays : list of NDArray
        Any dtypes and devices, finite values (check :func:`all_finite` first).

    Returns
    -------
    float
        0.0 for no arrays.

    Examples
    --------
    >>> import mxnet as mx
    >>> max_magnitude([mx.nd.array([1, -3]), mx.nd.array([2], dtype='float16')])
    3.0
    """
    return float(max_magnitudes(arrays).max(initial=0.0))


def device_sums(per_param):
    """Each parameter's gradient summed over its devices, as a kvstore's aggregation will hand it
    to the update (in float32, so the sum itself cannot overflow float16; as is for one device).

    For code that checks the gradients before the aggregation (Module); a Gluon Trainer
    aggregates first.

    Parameters
    ----------
    per_param : list of list of NDArray
        ``[[param0 on dev0, on dev1, ...], ...]``.

    Returns
    -------
    list of NDArray
        One per parameter, on the context of its first device.

    Examples
    --------
    >>> import mxnet as mx
    >>> sums = device_sums([[mx.nd.array([3, 1]), mx.nd.array([1, -4], ctx=mx.cpu(1))]])
    >>> sums[0].asnumpy().tolist()
    [4.0, -3.0]
    """
    per_param = [[legacy(grad) for grad in grads] for grads in per_param]
    return [grads[0] if len(grads) == 1 else
            mx.nd.add_n(*[g.as_in_context(grads[0].context).astype("float32") for g in grads])
            for grads in per_param]
