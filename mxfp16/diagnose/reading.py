"""What the locator reads of a run, reduced on MXNet's engine while the run goes and copied to the
host once at the end.

- The target run: whether each op output, tapped gradient, parameter gradient and data input is
  finite, one pass over it (its sum: inf or NaN exactly when a value is; a finite sum of float32
  activations does not overflow).  An emulated graph rounds every float16 value as a GPU stores it
  (:func:`~mxfp16.diagnose.probes.round_float16_outputs`) and its taps read gradients after their
  backward rounding, so a value beyond float16's range is inf there, as on a GPU.
- The float32 run: the largest magnitude of the outputs and gradients asked for (the culprits'),
  and for float16, of every tapped gradient and float16 parameter's, how many values are zero,
  how many float16 flushes to zero (at most 2**-25) and how many it keeps (counted on the host).
"""
import mxnet as mx
import numpy as np

from .capture import as_float32, is_float

__all__ = ["FLUSH_LIMIT", "Reader", "Reading"]

#: The largest magnitude float16 rounds to zero: 2**-25 (half the smallest subnormal, 2**-24, is
#: a tie, which round-to-nearest-even sends to 0).
FLUSH_LIMIT = 2.0 ** -25

#: float32 magnitudes as bits: at most this, float16 flushes it to zero; this and above, inf or NaN.
_FLUSH_BITS = np.array(FLUSH_LIMIT, dtype=np.float32).view(np.uint32)
_INF_BITS = np.array(np.inf, dtype=np.float32).view(np.uint32)


def _max_abs(array):
    return mx.nd.max(mx.nd.abs(as_float32(array))).reshape((1,))


class _Ones:
    """One vector of ones per device, grown as needed: the sum of an array is its dot product
    with ones, which BLAS computes about ten times faster than MXNet's CPU ``sum`` (22.7 ms
    against 269 ms for 12.8 million values, measured here)."""

    def __init__(self):
        self._vectors = {}

    def __call__(self, size, ctx):
        ones = self._vectors.get(str(ctx))
        if ones is None or ones.shape[0] < size:
            ones = self._vectors[str(ctx)] = mx.nd.ones((max(size, 1 << 16),), ctx=ctx)
        return ones[:size]


_ONES = _Ones()


def _finite_sum(array):
    """The sum of an array (inf or NaN exactly when one of its values is, for activations)."""
    flat = as_float32(array).reshape((-1,))
    return mx.nd.dot(flat, _ONES(flat.shape[0], flat.context)).reshape((1,))


def _histogram(array):
    """``[zeros, flushed, kept]`` of a gradient's finite values, counted on the host: numpy on
    the float32 bits counts them three times faster than MXNet's CPU ``histogram`` (164 ms
    against 510 ms for 12.8 million values, with the copy); this waits for the gradient."""
    bits = as_float32(array).asnumpy().reshape(-1).view(np.uint32) & np.uint32(0x7FFFFFFF)
    zeros = int(np.count_nonzero(bits == 0))
    small = int(np.count_nonzero(bits <= _FLUSH_BITS))
    finite = int(np.count_nonzero(bits < _INF_BITS))
    return mx.nd.array([zeros, small - zeros, finite - small])


class Reading:
    """What a run read, as host values.

    Attributes
    ----------
    forward, backward : list of (GraphRunner, key, numpy.ndarray)
        In the order the hook saw them (``key``: ``(call, node, output)`` forward, the output's
        name backward).  Target run: ``[sum]``; float32 run: ``[max |x|]`` forward, and
        ``[max |g| (NaN unless asked for), zeros, flushed, kept]`` backward.
    parameters : dict
        ``{(runner, name): values}`` of the parameter copies' gradients, as ``backward``.
    inputs : dict
        ``{(runner, (call, name)): values}`` of the data inputs: the target run's every one
        (``[sum]``), the float32 run's asked for (``[max |x|]``).
    loss : float or None
        The loss's largest magnitude (None without a loss).
    """

    def __init__(self, forward, backward, parameters, inputs, loss):
        self.forward, self.backward = forward, backward
        self.parameters, self.inputs, self.loss = parameters, inputs, loss


class Reader:
    """The listener of a run (see :mod:`mxfp16.diagnose.capture`).

    Parameters
    ----------
    target : bool
        The target run (finiteness of everything), or the float32 run.
    wanted : set
        The float32 run's places whose largest magnitude is read: ``('forward', label, call,
        output)``, ``('input', label, call, data name)`` and ``('backward', label, output or
        parameter)``.
    counts : bool
        The float32 run counts every gradient's zeros, flushed and kept values.
    """

    def __init__(self, target, wanted=frozenset(), counts=False):
        self.phase = "forward"
        self.target, self.wanted, self.counts = target, wanted, counts
        self._pending = []  # (table, runner, key, NDArray of values)

    def forward(self, runner, key, array):
        if self.phase != "forward" or not is_float(array) or 0 in array.shape:
            return
        if self.target:
            self._pending.append(("forward", runner, key, _finite_sum(array)))
        elif ("forward", runner.label, key[0], runner.view.outputs[key[1:]]) in self.wanted:
            self._pending.append(("forward", runner, key, _max_abs(array)))

    def _gradient(self, runner, name, array):
        if self.target:
            return _finite_sum(array)
        wanted = ("backward", runner.label, name) in self.wanted
        if not (wanted or self.counts):
            return None
        largest = _max_abs(array) if wanted else mx.nd.full((1,), np.nan, ctx=array.context)
        return mx.nd.concat(largest, _histogram(array), dim=0) if self.counts else largest

    def backward(self, runner, name, array):
        if is_float(array) and 0 not in array.shape:
            values = self._gradient(runner, name, array)
            if values is not None:
                self._pending.append(("backward", runner, name, values))

    def parameter(self, runner, name, grad):
        if 0 not in grad.shape:
            values = self._gradient(runner, name, grad)
            if values is not None:
                self._pending.append(("parameter", runner, name, values))

    def inputs(self, runner, arrays):
        for name, array in arrays.items():
            if not is_float(array) or 0 in array.shape:
                continue
            if self.target:
                self._pending.append(("input", runner, (runner.calls, name), _finite_sum(array)))
            elif ("input", runner.label, runner.calls, name) in self.wanted:
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
