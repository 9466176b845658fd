"""Loss scalers: exact scale arithmetic, skipped steps, agreement with unscaled runs, state."""
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
    for expected in [2 ** 22, 2 ** 22, 2 ** 23, 2 ** 23, 2 ** 23, 2 ** 24, 2 ** 24, 2 ** 24, 2 ** 24]:
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
    scaler = DynamicLossScaler(init_scale=2.0, max_consecutive_skips=5)
    scaler.update(False)  # 2 -> 1, the minimum
    for _ in range(3):
        scaler.update(False)
    with pytest.raises(LossScaleCollapse, match="5 steps in a row overflowed.*minimum loss scale 1"):
        scaler.update(False)


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
    ({"init_scale": 0}, "scale must be a positive"),
    ({"growth_factor": 1.0}, "growth_factor must be > 1"),
    ({"backoff_factor": 1.5}, "backoff_factor"),
    ({"growth_interval": 0}, "growth_interval"),
    ({"init_scale": 2.0 ** 30}, "min_scale <= init_scale <= max_scale"),
])
def test_bad_scaler_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        DynamicLossScaler(**kwargs)


def test_make_loss_scaler_defaults_and_parsing():
    assert isinstance(mxfp16.make_loss_scaler(None, "float16"), DynamicLossScaler)
    assert not mxfp16.make_loss_scaler(None, "float32").enabled
    assert not mxfp16.make_loss_scaler(None, "bfloat16").enabled
    assert mxfp16.make_loss_scaler("512", "float16").loss_scale == 512.0
    with pytest.raises(ValueError, match="'huge'.*dynamic"):
        mxfp16.make_loss_scaler("huge", "float16")
    with pytest.raises(ValueError, match="positive"):
        mxfp16.make_loss_scaler("-8", "float16")


def small_net(seed=0, dtype="float32", ctx=mx.cpu()):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier(), ctx=ctx)
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
    return {n.split("_", 1)[1]: p.data().astype("float32").asnumpy()
            for n, p in block.collect_params().items()}


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
                  zip(gluon.utils.split_and_load(x, contexts), gluon.utils.split_and_load(y, contexts))]
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
