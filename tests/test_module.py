"""Loss scaling with the Module API: static (grad_scale + rescale_grad) and dynamic (bucketing)."""
import mxnet as mx
import numpy as np
import pytest

import mxfp16

BATCH = 16


def softmax_mlp():
    net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=16, name="fc1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=4, name="fc2")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def batches(count, poison=None):
    rng = np.random.RandomState(0)
    out = []
    for i in range(count):
        x = rng.randn(BATCH, 8).astype("float32")
        if i == poison:
            x[0, 0] = np.inf
        out.append(mx.io.DataBatch([mx.nd.array(x)], [mx.nd.array(rng.randint(0, 4, BATCH))]))
    return out


def initial_params():
    mx.random.seed(3)
    mod = mx.mod.Module(softmax_mlp(), context=mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 8))], label_shapes=[("softmax_label", (BATCH,))])
    mod.init_params(mx.init.Xavier())
    return mod.get_params()


def plain_module(sym, dtype, loss_scale=1.0):
    mod = mx.mod.Module(sym, context=mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 8))], label_shapes=[("softmax_label", (BATCH,))])
    args, aux = mxfp16.cast_params(*initial_params(), sym)
    mod.init_params(arg_params=args, aux_params=aux)
    mod.init_optimizer(optimizer=mxfp16.make_optimizer(
        "sgd", dtype, loss_scale=loss_scale, batch_size=BATCH, learning_rate=0.5))
    return mod


def fc2_weight(mod):
    return mod.get_params()[0]["fc2_weight"].astype("float32").asnumpy()


def test_scale_loss_symbol_multiplies_grad_scale_and_needs_a_head():
    sym = mxfp16.scale_loss_symbol(softmax_mlp(), 256)
    assert sym.attr_dict()["softmax"]["grad_scale"] == "256.0"
    twice = mxfp16.scale_loss_symbol(sym, 2)
    assert twice.attr_dict()["softmax"]["grad_scale"] == "512.0"
    with pytest.raises(ValueError, match="no loss head.*SoftmaxOutput"):
        mxfp16.scale_loss_symbol(mx.sym.relu(mx.sym.var("data")), 8)


def test_static_scaling_the_mxnet_way_matches_the_unscaled_run():
    control = plain_module(softmax_mlp(), "float32")
    scaled = plain_module(mxfp16.scale_loss_symbol(softmax_mlp(), 1024), "float32",
                          loss_scale=1024)
    for b in batches(5):
        for mod in (control, scaled):
            mod.forward_backward(b)
            mod.update()
    np.testing.assert_allclose(fc2_weight(scaled), fc2_weight(control), rtol=1e-5, atol=1e-6)


def scaled_module(sym, scaler, dtype):
    mod = mxfp16.make_scaled_module(sym, scaler, context=mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 8))], label_shapes=[("softmax_label", (BATCH,))])
    args, aux = mxfp16.cast_params(*initial_params(), sym)
    mod.init_params(arg_params=args, aux_params=aux)
    opt = mxfp16.make_optimizer("sgd", dtype, learning_rate=0.5)
    mxfp16.init_optimizer(mod, opt)
    return mod, opt


def test_dynamic_scaling_skips_overflow_and_matches_control():
    sym16 = mxfp16.cast_symbol(softmax_mlp(), "float16", emulate=True)
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=2)
    mod, opt = scaled_module(sym16, scaler, "float16")
    control = plain_module(softmax_mlp(), "float32")
    outcomes = []
    for i, b in enumerate(batches(6, poison=2)):
        before = fc2_weight(mod)
        outcomes.append(mxfp16.module_step(mod, b, scaler, opt, BATCH))
        if not outcomes[-1]:
            assert np.array_equal(fc2_weight(mod), before)
        else:
            control.forward_backward(b)
            control.update()
    assert outcomes == [True, True, False, True, True, True]
    # 2**8 -> 2**9 after two clean steps, halved by the overflow, 2**9 again two steps later.
    assert scaler.loss_scale == 2.0 ** 9 and scaler.num_skipped == 1
    assert mod.get_params()[0]["fc2_weight"].dtype == np.float16
    np.testing.assert_allclose(fc2_weight(mod), fc2_weight(control), rtol=2e-2, atol=5e-3)


def test_disabled_scaler_trains_module_like_plain_module():
    scaler = mxfp16.DynamicLossScaler(enabled=False)
    mod, opt = scaled_module(softmax_mlp(), scaler, "float32")
    control = plain_module(softmax_mlp(), "float32")
    for b in batches(3):
        assert mxfp16.module_step(mod, b, scaler, opt, BATCH)
        control.forward_backward(b)
        control.update()
    np.testing.assert_allclose(fc2_weight(mod), fc2_weight(control), rtol=1e-6)


def test_workers_skip_when_their_summed_float16_gradients_could_overflow():
    from mxfp16.module import _sum_cannot_overflow
    half = [mx.nd.array([30000.0, -1.0], dtype="float16")]
    assert _sum_cannot_overflow(half, num_workers=2)  # 60000 <= 65504
    assert not _sum_cannot_overflow(half, num_workers=3)  # 90000 would be inf
    assert _sum_cannot_overflow([mx.nd.array([1e30])], num_workers=4)  # float32 range
