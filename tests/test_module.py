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


def scaled_module(sym, scaler, dtype, contexts=None, **optimizer_params):
    mod = mxfp16.make_scaled_module(sym, scaler, context=contexts or mx.cpu())
    mod.bind(data_shapes=[("data", (BATCH, 8))], label_shapes=[("softmax_label", (BATCH,))])
    args, aux = mxfp16.cast_params(*initial_params(), sym)
    mod.init_params(arg_params=args, aux_params=aux)
    opt = mxfp16.make_optimizer("sgd", dtype, learning_rate=0.5, **optimizer_params)
    mxfp16.init_optimizer(mod, opt)
    return mod, opt


def test_dynamic_scaling_skips_overflow_and_matches_control():
    sym16 = mxfp16.cast_symbol(softmax_mlp(), "float16", emulate=True)
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 8, growth_interval=2)
    mod, opt = scaled_module(sym16, scaler, "float16")
    control = plain_module(softmax_mlp(), "float32")
    outcomes = []
    for b in batches(6, poison=2):
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
    half = [[mx.nd.array([30000.0, -1.0], dtype="float16")]]
    assert _sum_cannot_overflow(half, num_workers=2)  # 60000 <= 65504
    assert not _sum_cannot_overflow(half, num_workers=3)  # 90000 would be inf
    assert _sum_cannot_overflow([[mx.nd.array([1e30])]], num_workers=4)  # float32 range


def test_devices_skip_when_their_summed_float16_gradients_overflow():
    from mxfp16.module import _sum_cannot_overflow

    def on_two_devices(first, second):
        return [[mx.nd.array([first], dtype="float16", ctx=mx.cpu(0)),
                 mx.nd.array([second], dtype="float16", ctx=mx.cpu(1))]]
    assert not _sum_cannot_overflow(on_two_devices(30000.0, 40000.0), num_workers=1)
    assert _sum_cannot_overflow(on_two_devices(30000.0, -40000.0), num_workers=1)
    assert not _sum_cannot_overflow(on_two_devices(30000.0, 30000.0), num_workers=2)
    # End to end: two devices skip the steps one device skips (their float16 sum would overflow
    # in update(), after a per-device check, and turn the weights to inf).
    sym16 = mxfp16.cast_symbol(softmax_mlp(), "float16", emulate=True)
    outcomes = {}
    for contexts in ([mx.cpu()], [mx.cpu(0), mx.cpu(1)]):
        scaler = mxfp16.DynamicLossScaler(growth_interval=3)
        mod, opt = scaled_module(sym16, scaler, "float16", contexts)
        outcomes[len(contexts)] = [mxfp16.module_step(mod, b, scaler, opt, BATCH)
                                   for b in batches(6)]
        assert np.isfinite(fc2_weight(mod)).all()
    assert outcomes[1] == outcomes[2] == [False, False, False, True, True, True]


# The 'auto' start -------------------------------------------------------------------------------

def run_module(contexts, scaler, steps):
    """Train the float16 MLP Module with ``scaler``: outcomes, scale after each step, parameters."""
    sym16 = mxfp16.cast_symbol(softmax_mlp(), "float16", emulate=True)
    mod, opt = scaled_module(sym16, scaler, "float16", contexts, momentum=0.9)
    outcomes, scales = [], []
    for b in batches(steps):
        outcomes.append(mxfp16.module_step(mod, b, scaler, opt, BATCH))
        scales.append(scaler.loss_scale)
    return outcomes, scales, {k: v.asnumpy() for k, v in mod.get_params()[0].items()}


@pytest.mark.parametrize("contexts", [[mx.cpu()], [mx.cpu(0), mx.cpu(1)]],
                         ids=["one device", "two devices"])
def test_module_auto_start_skips_no_step_and_matches_a_run_started_at_its_scale(contexts):
    classic = mxfp16.DynamicLossScaler(growth_interval=3)
    assert run_module(contexts, classic, 8)[0][:3] == [False] * 3  # 2**16 overflows at first
    auto = mxfp16.DynamicLossScaler(init_scale="auto", growth_interval=3)
    outcomes, scales, auto_params = run_module(contexts, auto, 8)
    assert outcomes == [True] * 8 and scales[0] == 2048.0
    fixed = mxfp16.DynamicLossScaler(init_scale=2048.0, growth_interval=3)
    fixed_outcomes, fixed_scales, fixed_params = run_module(contexts, fixed, 8)
    assert (fixed_outcomes, fixed_scales) == (outcomes, scales)
    assert fixed.state_dict() == auto.state_dict()
    for name, value in fixed_params.items():  # powers of two scale exactly: bit for bit
        assert auto_params[name].dtype == np.float16
        assert np.array_equal(auto_params[name], value)


class TwoAlikeWorkers:
    """A stand-in for a ``dist_sync`` kvstore of two workers whose values equal this one's: a push
    and pull returns twice the value pushed.  Records the keys pushed."""
    type, num_workers = "dist_sync", 2

    def __init__(self):
        self.sums, self.pushed = {}, []

    def push(self, key, value):
        self.sums[key] = value * 2
        self.pushed.append(key)

    def pull(self, key, out):
        self.sums[key].copyto(out)


def linear_module(scaler, contexts):
    """``loss = sum(data @ w.T)`` with w of shape (1, 2), zeros: d loss / d w = the data's column
    sums.  SGD with learning rate 1, batches of 4."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=1, no_bias=True, name="fc")
    mod = mxfp16.make_scaled_module(mx.sym.MakeLoss(mx.sym.sum(fc)), scaler, label_names=(),
                                    context=contexts)
    mod.bind(data_shapes=[("data", (4, 2))])
    mod.init_params(mx.init.Zero())
    opt = mxfp16.make_optimizer("sgd", "float32", learning_rate=1.0)
    mxfp16.init_optimizer(mod, opt)
    return mod, opt


@pytest.mark.parametrize("contexts, kvstore, start", [
    ([mx.cpu()], None, 2048.0),  # max|g| = 3: 3 * 2048 * 8 <= 65504
    ([mx.cpu(0), mx.cpu(1)], None, 2048.0),  # each device sees 1.5 (4096); their sum is 3
    ([mx.cpu(0), mx.cpu(1)], TwoAlikeWorkers(), 1024.0),  # two workers: 6
], ids=["one device", "two devices", "two devices, two workers"])
def test_module_auto_start_measures_the_gradients_summed_over_devices_and_workers(
        contexts, kvstore, start):
    scaler = mxfp16.DynamicLossScaler(init_scale="auto")
    mod, opt = linear_module(scaler, contexts)
    rows = mx.nd.array([[0.75, -0.25]] * 4)
    assert mxfp16.module_step(mod, mx.io.DataBatch([rows]), scaler, opt, batch_size=4,
                              kvstore=kvstore)
    assert (scaler.loss_scale, scaler.needs_start, scaler.num_skipped) == (start, False, 0)
    # Updated with the scale-1 gradients: w = -(column sums) / batch size.
    assert mod.get_params()[0]["fc_weight"].asnumpy().tolist() == [[-0.75, 0.25]]
    if kvstore is not None:
        assert kvstore.pushed == [mxfp16.module.OVERFLOW_KEY, mxfp16.module.START_KEY]
        mxfp16.module_step(mod, mx.io.DataBatch([rows]), scaler, opt, batch_size=4,
                           kvstore=kvstore)
        assert kvstore.pushed[2:] == [mxfp16.module.OVERFLOW_KEY]  # measured once
