"""The gradient checks loss scaling decides from: exact answers for float16 arrays on a CPU, which
take a float32 path there (MXNet's float16 reductions on a CPU are several times slower)."""
import mxnet as mx
import numpy as np
import pytest

from mxfp16.scaling.overflow import all_finite, max_magnitude, max_magnitudes

CONTEXTS = [mx.cpu(0), mx.cpu(1)]


def _float16(values, ctx=None):
    return mx.nd.array(np.array(values, dtype=np.float16), ctx=ctx or mx.cpu(0), dtype="float16")


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
@pytest.mark.parametrize("position", [0, 1000, 4095])
def test_a_non_finite_float16_value_anywhere_is_found(bad, position):
    values = np.full(4096, 65504, dtype=np.float16)  # the largest finite float16 everywhere else
    values[position] = bad
    arrays = [mx.nd.ones(3), _float16(np.zeros(5)), _float16(values, ctx=mx.cpu(1))]
    assert all_finite(arrays) is False


def test_finite_float16_extremes_pass():
    values = [65504, -65504, 2.0 ** -24, -2.0 ** -24, 0.0, -0.0]
    arrays = [_float16(values, ctx) for ctx in CONTEXTS] + [mx.nd.array([1e30, -1e30])]
    assert all_finite(arrays) is True
    assert all_finite([]) is True
    assert all_finite([_float16(np.zeros((0,)))]) is True


def test_max_magnitudes_of_float16_are_exact():
    arrays = [_float16([3, -65504, 1], mx.cpu(1)), _float16([2.0 ** -24, -2.0 ** -14]),
              mx.nd.array([-7.5, 2]), mx.nd.array([1.5], dtype="float64")]
    assert max_magnitudes(arrays).tolist() == [65504.0, 2.0 ** -14, 7.5, 1.5]
    assert max_magnitude(arrays) == 65504.0
    inf_nan = max_magnitudes([_float16([1, -np.inf]), _float16([np.nan, 2])])
    assert inf_nan[0] == np.inf and np.isnan(inf_nan[1])
