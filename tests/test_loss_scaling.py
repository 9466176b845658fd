"""Loss scalers: exact scale arithmetic, skipped steps, agreement with unscaled runs, state."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16 import DynamicLossScaler, LossScaleCollapse, StaticLossScaler


def test_four_overflows_from_two_to_the_sixteen_give_two_to_the_twelve():
    scaler = DynamicLossScaler()
    for _ in range(4):
        scaler.update(finite=False)
    assert scaler.loss_scale == 2.0 ** 12
    assert (scaler.num_steps, scaler.num_skipped, scaler.consecutive_skips) == (4, 4, 4)


def test_scale_doubles_after_growth_interval_and_stops_at_max_scale():
    scaler = DynamicLossScaler(init_scale=2.0 ** 22, growth_interval=3, max_scale=2.0 ** 24)
    expected_scales = [2 ** 22, 2 ** 22, 2 ** 23, 2 ** 23, 2 ** 23] + [2 ** 24] * 4
    for expected in expected_scales:
        scaler.update(finite=True)
        assert scaler.loss_scale == expected
    assert scaler.num_skipped == 0 and scaler.growth_tracker == 0


def test_overflow_resets_growth_and_scale_stops_at_min_scale():
    scaler = DynamicLossScaler(init_scale=4.0, growth_interval=2, min_scale=1.0,
                               max_consecutive_skips=10)
    scaler.update(True)
    scaler.update(False)
    assert scaler.loss_scale == 2.0 and scaler.growth_tracker == 0
    for _ in range(3):
        scaler.update(False)
    assert scaler.loss_scale == 1.0


def test_collapse_at_min_scale_fails_fast_with_a_clear_message():
    scaler = DynamicLossScaler(init_scale=2.0 ** -22, max_consecutive_skips=5)
    scaler.update(False)
    scaler.update(False)  # 2**-22 -> 2**-24, the default minimum, below 1
    assert scaler.loss_scale == 2.0 ** -24 == scaler.min_scale
    for _ in range(2):
        scaler.update(False)
    assert scaler.loss_scale == 2.0 ** -24
    with pytest.raises(LossScaleCollapse,
                       match="5 steps in a row overflowed.*minimum loss scale 2\\*\\*-24") as caught:
        scaler.update(False)
    assert caught.value.report is None  # nothing located it: a bare scaler


def test_the_dynamic_scale_goes_below_1_and_the_auto_start_follows():
    """Gradients that overflow even unscaled (a loss weighted 1e6) halve the scale below 1, as
    PyTorch's GradScaler does; the 'auto' start is then measured there."""
    scaler = DynamicLossScaler(init_scale="auto")
    for expected in (0.5, 0.25, 0.125):
        scaler.update(False)
        assert scaler.loss_scale == expected and scaler.needs_start
    # max|g| of 1e5 at scale 1/8 is 8e5 unscaled: 2**-7 * 8e5 * 8 = 50000 <= 65504
    assert scaler.start_from(1e5) == 2.0 ** -7


def test_static_scaler_keeps_its_scale_and_collapses_after_the_limit():
    scaler = StaticLossScaler(128, max_consecutive_skips=3)
    scaler.update(False)
    scaler.update(True)
    assert scaler.loss_scale == 128.0 and scaler.consecutive_skips == 0
    scaler.update(False)
    scaler.update(False)
    with pytest.raises(LossScaleCollapse):
        scaler.update(False)


def test_state_dict_round_trip_with_plain_numbers():
    scaler = DynamicLossScaler(growth_interval=5)
    for finite in [False, True, True, False, True]:
        scaler.update(finite)
    state = scaler.state_dict()
    assert state == {"loss_scale": 2.0 ** 14, "num_steps": 5, "num_skipped": 2,
                     "consecutive_skips": 0, "growth_tracker": 1}
    assert all(type(v) in (int, float) for v in state.values())
    restored = DynamicLossScaler(growth_interval=5)
    restored.load_state_dict(state)
    assert restored.state_dict() == state
    with pytest.raises(ValueError, match="loss_scale"):
        restored.load_state_dict({"scale": 1})


@pytest.mark.parametrize("kwargs, message", [
    ({"init_scale": 0}, "init_scale must be 'auto' .* or a positive number such as 65536, got 0"),
    ({"init_scale": "automatic"}, "init_scale must be 'auto'.*got 'automatic'"),
    ({"init_scale": None}, "init_scale must be 'auto'.*got None"),
    ({"init_scale": "auto", "min_scale": 4.0, "max_scale": 2.0}, "min_scale <= init_scale"),
    ({"max_consecutive_skips": 0}, "max_consecutive_skips must be a whole number >= 1"),
    ({"growth_factor": 1.0}, "growth_factor must be > 1"),
    ({"backoff_factor": 1.5}, "backoff_factor"),
    ({"growth_interval": 0}, "growth_interval"),
    ({"init_scale": 2.0 ** 30}, "min_scale <= init_scale <= max_scale"),
])
def test_bad_scaler_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicLossScaler(**kwargs)


def test_make_loss_scaler_defaults_and_parsing():
    default = mxfp16.make_loss_scaler(None, "float16")
    assert isinstance(default, DynamicLossScaler) and default.needs_start
    assert default.loss_scale == 1.0  # until the first step measures the start
    assert mxfp16.make_loss_scaler("dynamic", "float32").needs_start
    assert not mxfp16.make_loss_scaler(None, "float32").enabled
    assert not mxfp16.make_loss_scaler(None, "bfloat16").enabled
    assert not mxfp16.make_loss_scaler(1, "float16").enabled
    assert mxfp16.make_loss_scaler("512", "float16").loss_scale == 512.0
    assert isinstance(mxfp16.make_loss_scaler(512, "float16"), StaticLossScaler)
    classic = mxfp16.make_loss_scaler("Dynamic:65536", "float16")
    assert (classic.loss_scale, classic.needs_start) == (65536.0, False)
    assert mxfp16.make_loss_scaler("dynamic:auto", "float16").needs_start
    keyword = mxfp16.make_loss_scaler(None, "float16", init_scale=2.0 ** 16)
    assert (keyword.loss_scale, keyword.needs_start) == (65536.0, False)


def test_make_loss_scaler_takes_every_setting_as_a_keyword():
    scaler = mxfp16.make_loss_scaler("dynamic", "float16", init_scale=256, growth_factor=4.0,
                                     backoff_factor=0.25, growth_interval=7, min_scale=2.0,
                                     max_scale=2.0 ** 20, max_consecutive_skips=9)
    assert (scaler.loss_scale, scaler.growth_factor, scaler.backoff_factor, scaler.growth_interval,
            scaler.min_scale, scaler.max_scale, scaler.max_consecutive_skips) == (
        256.0, 4.0, 0.25, 7, 2.0, 2.0 ** 20, 9)
    static = mxfp16.make_loss_scaler("128", "float16", max_consecutive_skips=3)
    assert (static.loss_scale, static.max_consecutive_skips) == (128.0, 3)


@pytest.mark.parametrize("loss_scale, kwargs, message", [
    ("huge", {}, "'huge' is none of the accepted forms: 'dynamic' .*'dynamic:N' such as "
                 "'dynamic:65536'.*a positive number such as 128.*None"),
    ("dynamic:lots", {}, "'dynamic:lots' has no start after 'dynamic:'; accepted forms: 'dynamic'"),
    ("dynamic:", {}, "has no start after 'dynamic:'"),
    ("dynamic:-4", {}, "has no start after 'dynamic:'"),
    ("-8", {}, "loss scale must be a positive finite number, got -8.0"),
    ("dynamic:1024", {"init_scale": 512}, "both give the start of dynamic scaling: pass one"),
    ("128", {"init_scale": 512}, "init_scale=512 is where dynamic scaling starts, but loss scale "
                                 "'128' is static: pass loss_scale='dynamic'"),
    (None, {"init_scale": "auto"}, "loss scale 1.0 is static"),  # float32's default
    ("dynamic", {"init_scale": "soon"}, "init_scale must be 'auto'"),
    ("dynamic", {"max_consecutive_skips": 0}, "max_consecutive_skips must be a whole number"),
])
def test_make_loss_scaler_errors_name_the_value_and_the_accepted_forms(loss_scale, kwargs,
                                                                        message):
    with pytest.raises(ValueError, match=message):
        mxfp16.make_loss_scaler(loss_scale, "float32" if loss_scale is None else "float16",
                                **kwargs)


def small_net(seed=0, dtype="float32", ctx=None):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier(), ctx=ctx or mx.cpu())
    return mxfp16.cast_block(net, dtype) if dtype != "float32" else net, net


def batch(seed=0, n=16):
    rng = np.random.RandomState(seed)
    return mx.nd.array(rng.randn(n, 8)), mx.nd.array(rng.randint(0, 4, n))


LOSS = gluon.loss.SoftmaxCrossEntropyLoss()


def train(net, trainer, scaler, steps, poison_step=None):
    outcomes = []
    for step in range(steps):
        x, y = batch(step)
        if step == poison_step:
            x[0, 0] = np.inf
        with autograd.record():
            loss = scaler.scale(LOSS(net(x), y))
        loss.backward()
        outcomes.append(scaler.step(trainer, x.shape[0]))
    return outcomes


def weights(block):
    """Every parameter's values (float32), in order: two networks' parameter names differ."""
    return dict(enumerate(p.data().astype("float32").asnumpy()
                          for p in block.collect_params().values()))


@pytest.mark.parametrize("enabled", [True, False])
def test_scaled_run_agrees_with_control_run(enabled):
    control, _ = small_net()
    trainer = mxfp16.make_trainer(control.collect_params(), "sgd", "float32", learning_rate=0.1,
                                  momentum=0.9)
    train(control, trainer, mxfp16.StaticLossScaler(1.0, enabled=False), 6)
    scaled, _ = small_net()
    trainer = mxfp16.make_trainer(scaled.collect_params(), "sgd", "float32", learning_rate=0.1,
                                  momentum=0.9)
    scaler = DynamicLossScaler(init_scale=2.0 ** 10, enabled=enabled)
    assert train(scaled, trainer, scaler, 6) == [True] * 6
    for name, value in weights(control).items():
        np.testing.assert_allclose(weights(scaled)[name], value, rtol=1e-5, atol=1e-6)


def test_float16_scaled_run_agrees_with_float32_run():
    control, _ = small_net()
    trainer = mxfp16.make_trainer(control.collect_params(), "sgd", "float32", learning_rate=0.1)
    train(control, trainer, StaticLossScaler(1.0, enabled=False), 6)
    net16, block = small_net(dtype="float16")
    trainer = mxfp16.make_trainer(net16.collect_params(), "sgd", "float16", learning_rate=0.1)
    scaler = DynamicLossScaler(init_scale=2.0 ** 16)
    outcomes = train(net16, trainer, scaler, 12)
    assert scaler.num_skipped == outcomes.count(False) >= 1  # 2**16 overflows at first
    control_more, _ = small_net()
    trainer = mxfp16.make_trainer(control_more.collect_params(), "sgd", "float32",
                                  learning_rate=0.1)
    # The float32 run takes the same updates: the batches of the steps float16 did not skip.
    for step, stepped in enumerate(outcomes):
        if stepped:
            x, y = batch(step)
            with autograd.record():
                loss = LOSS(control_more(x), y)
            loss.backward()
            trainer.step(x.shape[0])
    for name, value in weights(control_more).items():
        np.testing.assert_allclose(weights(block)[name], value, rtol=2e-2, atol=5e-3)


def test_overflowed_step_leaves_weights_and_optimizer_state_unchanged(tmp_path):
    net, _ = small_net(dtype="float16")
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float16", learning_rate=0.1,
                                  momentum=0.9)
    scaler = DynamicLossScaler(init_scale=8.0)
    assert train(net, trainer, scaler, 1) == [True]
    before = weights(net)
    trainer.save_states(str(tmp_path / "before.states"))
    assert train(net, trainer, scaler, 1, poison_step=0) == [False]
    trainer.save_states(str(tmp_path / "after.states"))
    assert (tmp_path / "before.states").read_bytes() == (tmp_path / "after.states").read_bytes()
    for name, value in weights(net).items():
        assert np.array_equal(value, before[name])
    assert scaler.loss_scale == 4.0 and scaler.num_skipped == 1


def test_every_device_takes_the_same_skip_decision():
    contexts = [mx.cpu(0), mx.cpu(1)]
    net, block = small_net(ctx=contexts)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float32", learning_rate=0.1)
    scaler = StaticLossScaler(4.0)
    x, y = batch(0)
    x[0, 0] = np.inf  # only the first device's half of the batch overflows
    with autograd.record():
        losses = [scaler.scale(LOSS(net(xs), ys)) for xs, ys in
                  zip(gluon.utils.split_and_load(x, contexts),
                      gluon.utils.split_and_load(y, contexts))]
    autograd.backward(losses)
    before = [p.list_data()[1].asnumpy() for p in block.collect_params().values()]
    assert scaler.step(trainer, x.shape[0]) is False
    after = [p.list_data()[1].asnumpy() for p in block.collect_params().values()]
    assert all(np.array_equal(a, b) for a, b in zip(before, after))


def test_unscale_twice_raises_and_unscaled_step_matches_plain_step():
    plain, _ = small_net()
    trainer = mxfp16.make_trainer(plain.collect_params(), "sgd", "float32", learning_rate=0.1)
    train(plain, trainer, StaticLossScaler(1.0, enabled=False), 1)
    net, _ = small_net()
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float32", learning_rate=0.1)
    scaler = StaticLossScaler(64.0)
    x, y = batch(0)
    with autograd.record():
        loss = scaler.scale(LOSS(net(x), y))
    loss.backward()
    scaler.unscale(trainer)
    with pytest.raises(RuntimeError, match="already called"):
        scaler.unscale(trainer)
    assert scaler.step(trainer, x.shape[0])
    for name, value in weights(plain).items():
        np.testing.assert_allclose(weights(net)[name], value, rtol=1e-6, atol=1e-7)


def test_clip_global_norm_compares_the_unscaled_norm():
    results = {}
    for scale in (1.0, 1024.0):
        net, _ = small_net()
        trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float32", learning_rate=0.1)
        scaler = StaticLossScaler(scale, enabled=scale != 1.0)
        x, y = batch(0)
        with autograd.record():
            loss = scaler.scale(LOSS(net(x), y))
        loss.backward()
        norm = scaler.clip_global_norm(trainer, max_norm=0.01)
        grads = [p.grad().asnumpy() / scaler.loss_scale for p in net.collect_params().values()]
        results[scale] = norm, np.sqrt(sum(float((g ** 2).sum()) for g in grads))
        scaler.step(trainer, x.shape[0])
    (norm1, clipped1), (norm2, clipped2) = results[1.0], results[1024.0]
    assert norm1 > 0.01 and norm2 == pytest.approx(norm1, rel=1e-5)
    assert clipped1 == pytest.approx(0.01, rel=1e-4) and clipped2 == pytest.approx(0.01, rel=1e-4)


def test_disabled_scaler_is_a_pass_through():
    scaler = DynamicLossScaler(enabled=False)
    loss = mx.nd.ones(2)
    assert scaler.scale(loss) is loss and scaler.loss_scale == 1.0
    net, _ = small_net()
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float32", learning_rate=0.1)
    assert train(net, trainer, scaler, 2) == [True, True]
    assert scaler.num_steps == 0


# The 'auto' start -------------------------------------------------------------------------------

def constructed_step(scaler, grads_per_device, max_norm=None):
    """One step on a float32 parameter ``w`` (zeros, one copy per device) whose gradient on device
    ``i`` is ``grads_per_device[i]``; SGD with learning rate 1 and batch size 1, so after an update
    ``w`` is minus the aggregated (and clipped) gradient.  Returns (stepped, w on every device)."""
    contexts = [mx.cpu(i) for i in range(len(grads_per_device))]
    param = gluon.Parameter("w", shape=(len(grads_per_device[0]),), init=mx.init.Zero())
    param.initialize(ctx=contexts)
    trainer = mxfp16.make_trainer({"w": param}, "sgd", "float32", learning_rate=1.0)
    with autograd.record():
        losses = [scaler.scale((param.data(ctx) * mx.nd.array(grad, ctx=ctx)).sum())
                  for ctx, grad in zip(contexts, grads_per_device)]
    autograd.backward(losses)
    if max_norm is not None:
        scaler.clip_global_norm(trainer, max_norm)
    stepped = scaler.step(trainer, batch_size=1)
    return stepped, [w.asnumpy() for w in param.list_data()]


@pytest.mark.parametrize("grads_per_device, kwargs, start", [
    ([[3.0, -1.0]], {}, 2048.0),  # 3 * 2048 * 8 <= 65504 < 3 * 4096 * 8
    ([[-0.5, 0.25]], {}, 8192.0),
    ([[3.0, 0.0], [1.0, 0.0]], {}, 1024.0),  # the aggregated 4, not device 0's 3 (2048)
    ([[3.0, 0.0], [-3.0, 0.0]], {}, 2.0 ** 24),  # they cancel: nothing bounds the scale
    ([[0.0, 0.0]], {}, 2.0 ** 24),
    ([[1e-3, 0.0]], {"max_scale": 1024.0}, 1024.0),
    ([[1000.0, 0.0]], {"min_scale": 64.0}, 64.0),  # 8 by the rule, raised to min_scale
    ([[1e6, 0.0]], {}, 2.0 ** -7),  # 1e6 * 2**-7 * 8 <= 65504: below 1, the floor is 2**-24
    ([[1e6, 0.0]], {"min_scale": 1.0}, 1.0),  # too large for any scale above 1
])
def test_auto_start_is_the_power_of_two_of_the_aggregated_gradients(grads_per_device, kwargs,
                                                                     start):
    scaler = DynamicLossScaler(init_scale="auto", **kwargs)
    stepped, weights_per_device = constructed_step(scaler, grads_per_device)
    assert stepped and scaler.loss_scale == start and not scaler.needs_start
    assert (scaler.num_steps, scaler.num_skipped, scaler.growth_tracker) == (1, 0, 1)
    aggregated = np.sum(grads_per_device, axis=0, dtype=np.float32)
    for weight in weights_per_device:  # updated with the scale-1 gradients, on every device
        assert np.array_equal(weight, -aggregated)


def test_recommend_loss_scale_is_exact_at_powers_of_two_and_extremes():
    recommend = mxfp16.scaling.scalers.recommend_loss_scale
    at_the_edge = 65504.0 / 8 / 2048  # max|g| * 2048 * 8 == 65504 exactly
    assert recommend(at_the_edge) == 2048.0
    assert recommend(np.nextafter(at_the_edge, np.inf)) == 1024.0
    assert recommend(5e-324) == recommend(0.0) == 2.0 ** 24  # no float overflow on the way
    assert recommend(1e300) == recommend(np.inf) == 1.0


def test_auto_start_agrees_with_the_report_recommendation():
    for max_abs in (3.0, 0.5, 1e-3, 700.0):
        scaler = DynamicLossScaler(init_scale="auto")
        assert scaler.start_from(max_abs) == mxfp16.scaling.scalers.recommend_loss_scale(max_abs)
    from mxfp16.report import underflow
    assert underflow.recommend_loss_scale is mxfp16.scaling.scalers.recommend_loss_scale
    assert underflow.DEFAULT_HEADROOM == mxfp16.scaling.scalers.DEFAULT_HEADROOM == 8.0


def test_auto_start_is_measured_before_clipping():
    scaler = DynamicLossScaler(init_scale="auto")
    stepped, (weight,) = constructed_step(scaler, [[3.0, -4.0]], max_norm=0.5)
    assert stepped and scaler.loss_scale == 1024.0  # from max|g| = 4, not the clipped 0.4
    np.testing.assert_allclose(weight, [-0.3, 0.4], rtol=1e-6)


def test_auto_start_overflowing_at_scale_1_is_skipped_and_measured_again():
    scaler = DynamicLossScaler(init_scale="auto")
    stepped, (weight,) = constructed_step(scaler, [[np.inf, 1.0]])
    assert not stepped and np.array_equal(weight, [0.0, 0.0])
    assert (scaler.loss_scale, scaler.needs_start, scaler.num_skipped) == (0.5, True, 1)
    stepped, _ = constructed_step(scaler, [[3.0, 1.0]])
    assert stepped and (scaler.loss_scale, scaler.needs_start) == (2048.0, False)
    assert (scaler.num_steps, scaler.num_skipped, scaler.consecutive_skips) == (2, 1, 0)


def test_auto_scale_is_1_until_measured_and_the_state_says_whether_it_was():
    scaler = DynamicLossScaler(init_scale="auto", growth_interval=5)
    loss = mx.nd.array([3.0, 0.5])
    assert scaler.scale(loss).asnumpy().tolist() == [3.0, 0.5]
    assert repr(scaler) == "DynamicLossScaler(loss_scale=auto, enabled=True, steps=0, skipped=0)"
    pending = scaler.state_dict()
    assert pending == {"loss_scale": 1.0, "num_steps": 0, "num_skipped": 0,
                       "consecutive_skips": 0, "growth_tracker": 0, "start_pending": True}
    assert json.loads(json.dumps(pending)) == pending  # checkpoints store it as JSON
    constructed_step(scaler, [[3.0, 0.0]])
    started = scaler.state_dict()
    assert started == {"loss_scale": 2048.0, "num_steps": 1, "num_skipped": 0,
                       "consecutive_skips": 0, "growth_tracker": 1}  # the classic keys
    resumed = DynamicLossScaler(init_scale="auto", growth_interval=5)
    resumed.load_state_dict(started)  # a resumed run does not measure again
    assert (resumed.loss_scale, resumed.needs_start) == (2048.0, False)
    assert resumed.scale(loss).asnumpy().tolist() == [6144.0, 1024.0]
    older = DynamicLossScaler(init_scale="auto")
    older.load_state_dict({"loss_scale": 512.0})  # a checkpoint from before the 'auto' start
    assert (older.loss_scale, older.needs_start) == (512.0, False)
    fixed = DynamicLossScaler()
    fixed.load_state_dict(pending)  # saved before the first step: measures at its first step
    assert (fixed.loss_scale, fixed.needs_start) == (1.0, True)


def test_disabled_auto_scaler_is_a_pass_through():
    scaler = DynamicLossScaler(init_scale="auto", enabled=False)
    loss = mx.nd.ones(2)
    assert scaler.scale(loss) is loss and not scaler.needs_start
    stepped, (weight,) = constructed_step(scaler, [[3.0, 1.0]])
    assert stepped and np.array_equal(weight, [-3.0, -1.0])
    assert (scaler.loss_scale, scaler.num_steps) == (1.0, 0)


def test_start_from_and_an_unmeasured_update_are_refused():
    with pytest.raises(RuntimeError, match="create it with init_scale='auto'"):
        DynamicLossScaler().start_from(3.0)
    scaler = DynamicLossScaler(init_scale="auto")
    scaler.update(finite=False)  # an overflow needs no measurement
    with pytest.raises(RuntimeError, match=r"not measured this step: call start_from\(max_abs\)"):
        scaler.update(finite=True)


def train_on(contexts, scaler, steps):
    """Train the float16 small_net on ``contexts`` (the batch split over them): the outcomes, the
    scale after each step, and every parameter's float32 values on every device."""
    net, block = small_net(dtype="float16", ctx=contexts)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float16", learning_rate=0.1,
                                  momentum=0.9)
    outcomes, scales = [], []
    for step in range(steps):
        x, y = batch(step)
        with autograd.record():
            losses = [scaler.scale(LOSS(net(xs), ys)) for xs, ys in
                      zip(gluon.utils.split_and_load(x, contexts),
                          gluon.utils.split_and_load(y, contexts))]
        autograd.backward(losses)
        outcomes.append(scaler.step(trainer, x.shape[0]))
        scales.append(scaler.loss_scale)
    values = [[array.astype("float32").asnumpy() for array in p.list_data()]
              for p in block.collect_params().values()]
    return outcomes, scales, values


def first_batch_max_gradient():
    """max|g| of the float16 small_net's scale-1 gradients on batch 0, measured by hand."""
    net, _ = small_net(dtype="float16")
    x, y = batch(0)
    with autograd.record():
        loss = LOSS(net(x), y)
    loss.backward()
    return max(float(p.grad().abs().max().asscalar()) for p in net.collect_params().values())


@pytest.mark.parametrize("contexts", [[mx.cpu()], [mx.cpu(0), mx.cpu(1)]],
                         ids=["one device", "two devices"])
def test_auto_start_skips_no_step_and_matches_a_run_started_at_its_scale(contexts):
    classic = DynamicLossScaler(growth_interval=3)
    assert train_on(contexts, classic, 8)[0][:2] == [False, False]  # 2**16 overflows at first
    auto = DynamicLossScaler(init_scale="auto", growth_interval=3)
    outcomes, scales, auto_values = train_on(contexts, auto, 8)
    assert outcomes == [True] * 8 and auto.num_skipped == 0
    start = scales[0]
    assert start == mxfp16.scaling.scalers.recommend_loss_scale(first_batch_max_gradient()) == 2048.0
    fixed = DynamicLossScaler(init_scale=start, growth_interval=3)
    fixed_outcomes, fixed_scales, fixed_values = train_on(contexts, fixed, 8)
    assert (fixed_outcomes, fixed_scales) == (outcomes, scales)
    assert fixed.state_dict() == auto.state_dict()
    # Scaling by a power of two is exact, and no gradient here is a float16 subnormal: the runs
    # agree bit for bit, on every device.
    for auto_per_device, fixed_per_device in zip(auto_values, fixed_values):
        for auto_value, fixed_value in zip(auto_per_device, fixed_per_device):
            assert np.array_equal(auto_value, fixed_value)
            assert np.array_equal(auto_value, auto_per_device[0])
