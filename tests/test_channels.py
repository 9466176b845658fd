"""Output channels of bfloat16 convolutions padded to oneDNN's blocks of 16 (mxfp16.casting.channels)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting import rules
from mxfp16.casting.channels import pad_output_channels
from mxfp16.casting.graph import internal_dtypes

BFLOAT16_STEP = 2.0 ** -7  # bfloat16 keeps 8 significant bits


def predictor(channels, groups=1):
    """SSD's class predictor at a tiny size: a 3x3 convolution of ``channels`` outputs, with
    bias, on a 32-channel map, its input channels deferred."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(32, 1, in_channels=3), nn.Activation("relu"),
            nn.Conv2D(channels, 3, padding=1, groups=groups))
    return net


def convolutions(sym):
    """``{name: num_filter}`` of the graph's Convolution nodes."""
    import json
    nodes = json.loads(sym.tojson())["nodes"]
    return {n["name"]: int(n["attrs"]["num_filter"]) for n in nodes if n["op"] == "Convolution"}


def test_a_convolution_of_44_channels_runs_48_and_keeps_44_in_bfloat16():
    net = predictor(44)
    net.initialize()
    cast = mxfp16.cast_block(net, "bfloat16")
    assert sorted(convolutions(cast.graphs[0]).values()) == [32, 48]
    types = internal_dtypes(cast.graphs[0], cast.data_names)
    assert types[f"{net[2].name}_fwd_padded_output"] == "void16"  # numpy names bfloat16 void16
    out = cast(mx.nd.ones((2, 3, 6, 6)))
    assert out.shape == (2, 44, 6, 6) and net[2].weight.shape == (44, 32, 3, 3)


@pytest.mark.parametrize("channels, groups", [(32, 1), (8, 1), (40, 2)])
def test_multiples_of_16_small_and_grouped_convolutions_are_not_padded(channels, groups):
    net = predictor(channels, groups)
    net.initialize()
    cast = mxfp16.cast_block(net, "bfloat16")
    assert sorted(convolutions(cast.graphs[0]).values()) == sorted([32, channels])


def test_a_symbol_without_the_weight_shape_is_left_alone():
    y = mx.sym.Convolution(mx.sym.var("data"), kernel=(3, 3), num_filter=20, name="conv")
    assert pad_output_channels(y).tojson() == y.tojson()


def outputs_and_gradients(dtype, padded=True, monkeypatch=None):
    """Output and the 44-channel convolution's weight and bias gradients, from seed 0."""
    if not padded:
        monkeypatch.setattr(rules, "OP_RULES",
                            [r for r in rules.OP_RULES if r.rule != "channel_padding"])
    mx.random.seed(0)
    net = predictor(44)
    net.initialize(mx.init.Xavier())
    net[2].bias.initialize(mx.init.Uniform(0.1), force_reinit=True)
    cast = mxfp16.cast_block(net, dtype)
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 6, 6)))
    head = mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (2, 44, 6, 6)))
    with autograd.record():
        out = cast(x)
    out.backward(head)
    grads = [p.grad().astype("float32").asnumpy() for p in (net[2].weight, net[2].bias)]
    return [out.asnumpy()] + grads


def test_padded_bfloat16_matches_unpadded_bfloat16_and_float32(monkeypatch):
    """The kept channels are the same sums: within one bfloat16 step of the unpadded bfloat16
    graph's (the kernels add in another order), and within bfloat16's resolution of float32."""
    padded = outputs_and_gradients("bfloat16")
    plain = outputs_and_gradients("bfloat16", padded=False, monkeypatch=monkeypatch)
    monkeypatch.undo()
    reference = outputs_and_gradients("float32")
    for got, same, want in zip(padded, plain, reference):
        assert got.shape == want.shape
        np.testing.assert_allclose(got, same, rtol=BFLOAT16_STEP, atol=BFLOAT16_STEP * 1e-2)
        np.testing.assert_allclose(got, want, rtol=4 * BFLOAT16_STEP,
                                   atol=4 * BFLOAT16_STEP * np.abs(want).max())
