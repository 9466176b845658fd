"""CPU float16 emulation: GPU mixed-precision numerics at every GEMM boundary."""
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

import mxfp16

FLOAT16_MAX = 65504.0
SMALLEST_SUBNORMAL = 2.0 ** -24


def dense(units, weight, in_units):
    net = nn.Dense(units, use_bias=False, in_units=in_units)
    net.initialize(mx.init.Constant(weight))
    return net


def test_gemm_output_above_float16_max_becomes_inf():
    net = mxfp16.cast_block(dense(1, 1.0, 2), "float16", emulate=True)
    out = net(mx.nd.array([[30000.0, 30000.0], [30000.0, 40000.0]])).asnumpy()
    assert out[0, 0] == 60000.0  # 60000 is a float16 value
    assert np.isinf(out[1, 0])  # 70000 > 65504


def test_gemm_matches_float32_accumulation_of_float16_values():
    rng = np.random.RandomState(0)
    x = rng.randn(4, 64).astype("float32")
    w = rng.randn(8, 64).astype("float32")
    net = nn.Dense(8, use_bias=False, in_units=64)
    net.initialize()
    net.weight.set_data(mx.nd.array(w))
    out = mxfp16.cast_block(net, "float16", emulate=True)(mx.nd.array(x)).asnumpy()
    x16, w16 = x.astype("float16").astype("float64"), w.astype("float16").astype("float64")
    expected = (x16 @ w16.T).astype("float16")
    # Only the float32 summation order may differ: at most one float16 step apart.
    assert np.all(np.abs(out - expected) <= np.spacing(np.abs(expected).astype("float16")))
    assert out.dtype == np.float32 and np.all(out.astype("float16") == out)


def weight_grad(net, x, loss_multiplier, loss_scale):
    with autograd.record():
        loss = net(x).sum() * loss_multiplier * loss_scale
    loss.backward()
    return next(iter(net.collect_params().values())).grad().asnumpy()


def test_gradient_below_float16_range_underflows_without_loss_scaling():
    block = dense(1, 1.0, 4)
    net = mxfp16.cast_block(block, "float16", emulate=True)
    x = mx.nd.ones((1, 4))
    tiny = 2.0 ** -26  # d loss / d output: below 2**-24, so float16 stores 0
    assert np.all(weight_grad(net, x, tiny, 1.0) == 0)
    grad = weight_grad(net, x, tiny, 2.0 ** 10)
    assert grad.dtype == np.float16
    assert np.all(grad.astype("float64") == tiny * 2.0 ** 10)  # survives, exactly


def test_float32_network_keeps_the_tiny_gradient():
    assert np.all(weight_grad(dense(1, 1.0, 4), mx.nd.ones((1, 4)), 2.0 ** -26, 1.0)
                  == 2.0 ** -26)


def test_inputs_are_rounded_like_the_gpu_input_cast():
    net = mxfp16.cast_block(dense(1, 1.0, 1), "float16", emulate=True)
    out = net(mx.nd.array([[1.0 + 2.0 ** -12]])).asnumpy()
    assert out[0, 0] == 1.0  # 1 + 2**-12 is not a float16 value and rounds to 1


def test_weights_and_gradients_are_stored_as_float16():
    block = dense(2, 0.5, 3)
    net = mxfp16.cast_block(block, "float16", emulate=True)
    with autograd.record():
        loss = net(mx.nd.ones((2, 3))).sum()
    loss.backward()
    assert block.weight.data().dtype == np.float16
    assert block.weight.grad().dtype == np.float16


def test_emulation_turns_on_by_itself_without_gpu_and_says_so(caplog):
    assert mx.context.num_gpus() == 0
    with caplog.at_level(logging.INFO, logger="mxfp16"):
        assert mxfp16.resolve_emulate(None, "float16") is True
    assert any("emulation" in record.getMessage() for record in caplog.records)
    assert mxfp16.resolve_emulate(None, "float32") is False
    assert mxfp16.resolve_emulate(False, "float16") is False


def test_emulate_false_prepares_the_gpu_graph_on_cpu():
    sym = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc")
    gpu = mxfp16.cast_symbol(sym, "float16", emulate=False)
    internals = gpu.get_internals()
    _, out_types, _ = internals.infer_type(data="float32")
    types = dict(zip(internals.list_outputs(), out_types))
    assert types["fc_output"] == np.float16  # runs in float16 on a GPU
    emulated = mxfp16.cast_symbol(sym, "float16", emulate=True)
    internals = emulated.get_internals()
    _, out_types, _ = internals.infer_type(data="float32")
    assert dict(zip(internals.list_outputs(), out_types))["fc_output"] == np.float32


def test_bad_emulate_value_names_choices():
    with pytest.raises(ValueError, match="'yes'.*None.*True.*False"):
        mxfp16.resolve_emulate("yes", "float16")


@pytest.mark.skipif(mx.context.num_gpus() == 0, reason="needs a GPU")
def test_gpu_runs_real_float16():
    net = dense(2, 0.5, 3)
    net.collect_params().reset_ctx(mx.gpu(0))
    out = mxfp16.cast_block(net, "float16")(mx.nd.ones((2, 3), ctx=mx.gpu(0)))
    assert out.dtype == np.float32 and net.weight.data().dtype == np.float16


def test_batchnorm_reads_a_rounded_convolution_through_an_exact_identity_convolution():
    from mxfp16.casting.emulation import emulate_float16
    from mxfp16.casting.graph import count_ops, strip
    conv = mx.sym.Convolution(mx.sym.var("data"), num_filter=4, kernel=(3, 3), no_bias=True, name="conv")
    sym = mx.sym.BatchNorm(conv, name="bn")
    emulated = emulate_float16(sym, {"conv_output": "float16", "conv_weight": "float16"}, ["data"])
    assert count_ops(emulated, "Convolution") == 2 and count_ops(emulated, "_ones") == 1
    assert emulated.list_arguments() == sym.list_arguments()  # the identity's weight is no parameter
    assert count_ops(strip(emulated, ["data"]), "Convolution") == 1  # a second cast starts afresh
    rng = np.random.RandomState(0)
    x, w = rng.randn(2, 3, 8, 8).astype("float32"), rng.randn(4, 3, 3, 3).astype("float16")
    internals = emulated.get_internals()
    names = [n for n in internals.list_outputs() if n.endswith("_identity_output")]
    args = {"data": mx.nd.array(x), "conv_weight": mx.nd.array(w, dtype="float16")}
    identity = internals[names[0]].bind(mx.cpu(), args).forward()[0]
    reference = mx.nd.Convolution(mx.nd.array(x.astype("float16").astype("float32")),
                                  mx.nd.array(w.astype("float32")), num_filter=4, kernel=(3, 3),
                                  no_bias=True).asnumpy().astype("float16").astype("float32")
    assert identity.asnumpy().tobytes() == reference.tobytes()
