"""What the locator reads of a run: the largest magnitude of every op output and tapped gradient,
and for the float32 run how many gradient values are nonzero and how many float16 flushes to zero.

Everything is reduced on MXNet's engine while the run goes (one ``max(abs(x))`` per op output,
three reductions per tapped gradient) and read in one copy to the host at the end.
"""
import math

import mxnet as mx
import numpy as np

from ..scaling.settings import FLOAT16_MAX
from .capture import as_float32, is_float

__all__ = ["FLUSH_LIMIT", "Reader", "Reading", "overflows"]

#: The largest magnitude float16 rounds to zero: 2**-25 (half the smallest subnormal, 2**-24, is
#: a tie, which round-to-nearest-even sends to 0).
FLUSH_LIMIT = 2.0 ** -25


def overflows(value, dtype):
    """Whether a largest magnitude ``value`` is an overflow for a value stored in ``dtype`` (the
    name ``internal_dtypes`` gives it): inf or NaN, or beyond 65504 where it is float16.

    Examples
    --------
    >>> overflows(1e5, 'float16'), overflows(1e5, 'float32'), overflows(float('nan'), 'float32')
    (True, False, True)
    """
    return not math.isfinite(value) or (dtype == "float16" and value > FLOAT16_MAX)


def _max_abs(array):
    return mx.nd.max(mx.nd.abs(as_float32(array))).reshape((1,))


def _counts(array):
    """``[max |g|, nonzero values, values float16 flushes to zero]`` of a gradient."""
    grad = as_float32(array)
    nonzero = grad != 0
    flushed = (mx.nd.abs(grad) <= FLUSH_LIMIT) * nonzero
    return mx.nd.concat(_max_abs(grad), mx.nd.sum(nonzero.astype("float64")).astype("float32")
                        .reshape((1,)), mx.nd.sum(flushed.astype("float64")).astype("float32")
                        .reshape((1,)), dim=0)


class Reading:
    """What a run read, as host values.

    Attributes
    ----------
    forward, backward : list of (GraphRunner, key, numpy.ndarray)
        In the order the hook saw them; the values are ``[max |x|]``, or for the float32 run's
        gradients ``[max |g|, nonzero, flushed]`` (float64).
    parameters : dict
        ``{(runner, name): values}`` of the parameter copies' gradients.
    inputs : dict
        ``{(runner, (call, name)): values}`` of the data inputs.
    loss : float or None
        The loss's largest magnitude (None without a loss).
    """

    def __init__(self, forward, backward, parameters, inputs, loss):
        self.forward, self.backward = forward, backward
        self.parameters, self.inputs, self.loss = parameters, inputs, loss


class Reader:
    """The listener of a run (see :mod:`mxfp16.diagnose.capture`) that keeps magnitudes.

    Parameters
    ----------
    counts : bool
        Also count the gradients' nonzero and flushed values (the float32 run).
    """

    def __init__(self, counts=False):
        self.phase = "forward"
        self.counts = counts
        self._pending = []  # (table, runner, key, NDArray of values)

    def forward(self, runner, key, array):
        if self.phase == "forward" and is_float(array) and 0 not in array.shape:
            self._pending.append(("forward", runner, key, _max_abs(array)))

    def _gradient(self, array):
        return _counts(array) if self.counts else _max_abs(array)

    def backward(self, runner, key, array):
        if is_float(array) and 0 not in array.shape:
            self._pending.append(("backward", runner, key, self._gradient(array)))

    def parameter(self, runner, name, grad):
        if 0 not in grad.shape:
            self._pending.append(("parameter", runner, name, self._gradient(grad)))

    def inputs(self, runner, arrays):
        for name, array in arrays.items():
            if is_float(array) and 0 not in array.shape:
                self._pending.append(("input", runner, (runner.calls, name), _max_abs(array)))

    def read(self, loss=None):
        """The :class:`Reading`: one copy of every value to the host."""
        pending = list(self._pending)
        if loss is not None:
            pending.append(("loss", None, None, _max_abs(mx.nd.concat(
                *[as_float32(item).reshape((-1,)) for item in _arrays(loss)], dim=0))))
        sizes = [values.shape[0] for *_, values in pending]
        flat = mx.nd.concat(*[v.as_in_context(mx.cpu()) for *_, v in pending], dim=0).asnumpy() \
            if pending else np.zeros(0)
        tables = {"forward": [], "backward": [], "parameter": {}, "input": {}, "loss": None}
        start = 0
        for (table, runner, key, _), size in zip(pending, sizes):
            values = flat[start:start + size].astype(np.float64)
            start += size
            if table in ("forward", "backward"):
                tables[table].append((runner, key, values))
            elif table == "loss":
                tables["loss"] = float(values[0])
            else:
                tables[table][(runner, key)] = values
        return Reading(tables["forward"], tables["backward"], tables["parameter"],
                       tables["input"], tables["loss"])


def _arrays(value):
    """The legacy NDArrays of a loss (one array, or nested lists of them)."""
    if isinstance(value, (list, tuple)):
        return [array for item in value for array in _arrays(item)]
    return [value.as_nd_ndarray() if isinstance(value, mx.np.ndarray) else value]
