"""mxfp16.Trainer: a drop-in for gluon.Trainer, loss scaling, skipped steps, states files."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16 import mxnet_internals

TWO_CPUS = [mx.cpu(0), mx.cpu(1)]


def small_net(ctx, seed=0):
    """Dense-BatchNorm-Dense, initialized alike for a given seed."""
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, in_units=6, activation="relu"), nn.BatchNorm(in_channels=16),
            nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    return net


def batches(num, batch_size=8, seed=1):
    rng = np.random.RandomState(seed)
    return [(mx.nd.array(rng.uniform(-1, 1, (batch_size, 6))),
             mx.nd.array(rng.randint(0, 3, batch_size))) for _ in range(num)]


def losses(net, data, label, ctx):
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    xs = gluon.utils.split_and_load(data, ctx)
    ys = gluon.utils.split_and_load(label, ctx)
    return [loss_fn(net(x), y) for x, y in zip(xs, ys)]


def weights(net, trained_only=False):
    """Every parameter on every device, as numpy arrays, in the network's order; ``trained_only``
    leaves out the ones the forward pass moves (BatchNorm's running statistics)."""
    return [[d.asnumpy() for d in p.list_data()] for p in net.collect_params().values()
            if not (trained_only and p.grad_req == "null")]


def optimizer_states(trainer):
    """Every updater's states as nested numpy arrays."""
    def as_numpy(state):
        if isinstance(state, (tuple, list)):
            return [as_numpy(s) for s in state]
        return state.asnumpy() if isinstance(state, mx.nd.NDArray) else state
    return [{i: as_numpy(s) for i, s in u.states.items()}
            for u in mxnet_internals.trainer_updaters(trainer)]


def assert_same(a, b):
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for key in a:
            assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    else:
        assert a == b


@pytest.mark.parametrize("ctx", [[mx.cpu(0)], TWO_CPUS], ids=["one-device", "two-devices"])
@pytest.mark.parametrize("optimizer, params", [
    ("sgd", {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}),
    ("adam", {"learning_rate": 0.01}),
])
def test_float32_trainer_is_gluon_trainer_bit_for_bit(ctx, optimizer, params):
    nets = [small_net(ctx), small_net(ctx)]
    trainers = [gluon.Trainer(nets[0].collect_params(), optimizer, dict(params)),
                mxfp16.Trainer(nets[1].collect_params(), optimizer, dict(params), dtype="float32")]
    for data, label in batches(5):
        with autograd.record():
            gluon_losses = losses(nets[0], data, label, ctx)
        for loss in gluon_losses:
            loss.backward()
        trainers[0].step(data.shape[0])
        with autograd.record():
            ours = losses(nets[1], data, label, ctx)
        trainers[1].backward(ours)
        assert trainers[1].step(data.shape[0]) is True
    assert_same(weights(nets[0]), weights(nets[1]))
    assert (trainers[1].loss_scale, trainers[1].num_skipped) == (1.0, 0)


def scaled_recipe_weights(net, steps, scale):
    """The existing recipe: make_trainer + StaticLossScaler, scale(loss).backward(), scaler.step."""
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float16", learning_rate=0.5,
                                  momentum=0.9)
    scaler = mxfp16.StaticLossScaler(scale)
    for data, label in batches(steps):
        with autograd.record():
            scaled = scaler.scale(losses(net, data, label, [mx.cpu()]))
        autograd.backward(scaled)
        scaler.step(trainer, data.shape[0])
    return weights(net)


@pytest.mark.parametrize("inside_record", [True, False])
def test_float16_trainer_matches_the_scaler_recipe_exactly(inside_record):
    expected = scaled_recipe_weights(mxfp16.cast_block(small_net([mx.cpu()]), "float16"), 4, 128)
    net = mxfp16.cast_block(small_net([mx.cpu()]), "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9},
                             dtype="float16", loss_scale=128)
    for data, label in batches(4):
        with autograd.record():
            loss = losses(net, data, label, [mx.cpu()])
            if inside_record:
                trainer.backward(loss)
        if not inside_record:
            for item in loss:  # one NDArray at a time, as `l.backward()` loops do
                trainer.backward(item)
        assert trainer.step(data.shape[0])
    assert_same(expected, weights(net))


def test_unscaled_backward_is_refused_with_the_fix_and_scale_is_the_manual_form():
    net = mxfp16.cast_block(small_net([mx.cpu()]), "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             dtype="float16", loss_scale=64)
    (data, label), = batches(1)
    with autograd.record():
        loss = losses(net, data, label, [mx.cpu()])
    for item in loss:
        item.backward()  # the line a port forgot to change
    with pytest.raises(RuntimeError, match=r"scale 64.*trainer\.backward\(loss\)"):
        trainer.step(8)
    with autograd.record():
        scaled = trainer.scale(losses(net, data, label, [mx.cpu()]))
    autograd.backward(scaled)
    assert trainer.step(8) and trainer.num_steps == 1
    with pytest.raises(RuntimeError, match="did not come from trainer.backward"):
        trainer.step(8)  # one scaled backward per step


def test_dtype_and_scaling_follow_the_parameters():
    half = mxfp16.cast_block(small_net([mx.cpu()]), "float16")
    trainer = mxfp16.Trainer(half.collect_params(), "sgd", {"learning_rate": 0.1})
    assert (trainer.dtype, trainer.optimizer.multi_precision, trainer.scaler.enabled) == \
        ("float16", True, True)
    full = mxfp16.Trainer(small_net([mx.cpu()]).collect_params(), "sgd", {"learning_rate": 0.1})
    assert (full.dtype, full.optimizer.multi_precision, full.scaler.enabled, full.loss_scale) == \
        ("float32", False, False, 1.0)
    with pytest.raises(ValueError, match=r"dtype='float32' but parameter\(s\) .* are float16"):
        mxfp16.Trainer(half.collect_params(), "sgd", dtype="float32")


def test_multi_precision_is_accepted_when_it_agrees_and_refused_when_it_contradicts():
    params = mxfp16.cast_block(small_net([mx.cpu()]), "float16").collect_params()
    trainer = mxfp16.Trainer(params, "nag", {"learning_rate": 0.1, "multi_precision": True},
                             dtype="float16")
    assert trainer.optimizer.multi_precision is True
    with pytest.raises(ValueError, match="multi_precision=False contradicts dtype='float16'.*"
                                         "remove multi_precision"):
        mxfp16.Trainer(params, "nag", {"multi_precision": False}, dtype="float16")
    float32_params = small_net([mx.cpu()]).collect_params()
    with pytest.raises(ValueError, match="multi_precision=True contradicts dtype='float32'"):
        mxfp16.Trainer(float32_params, "nag", {"multi_precision": True}, dtype="float32")


def test_optimizer_object_is_accepted_as_in_gluon():
    params = mxfp16.cast_block(small_net([mx.cpu()]), "float16").collect_params()
    sgd = mx.optimizer.SGD(learning_rate=0.2, multi_precision=True)
    assert mxfp16.Trainer(params, sgd, dtype="float16").optimizer is sgd
    with pytest.raises(ValueError, match="multi_precision=False contradicts"):
        mxfp16.Trainer(params, mx.optimizer.SGD(), dtype="float16")
    with pytest.raises(ValueError, match="set them on the object"):
        mxfp16.Trainer(params, sgd, {"learning_rate": 0.1}, dtype="float16")


def test_update_on_kvstore_is_refused_only_while_the_loss_is_scaled():
    params = mxfp16.cast_block(small_net(TWO_CPUS), "float16").collect_params()
    with pytest.raises(ValueError, match="update_on_kvstore=True.*loss_scale=1"):
        mxfp16.Trainer(params, "sgd", dtype="float16", update_on_kvstore=True)
    trainer = mxfp16.Trainer(params, "sgd", dtype="float16", update_on_kvstore=True,
                             loss_scale=1)
    assert not trainer.scaler.enabled


def test_overflow_on_one_device_skips_every_device_and_keeps_all_state():
    net = mxfp16.cast_block(small_net(TWO_CPUS), "float16")
    scaler = mxfp16.DynamicLossScaler(init_scale=1024.0)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1, "momentum": 0.9},
                             dtype="float16", loss_scale=scaler)
    (data, label), (data2, label2) = batches(2)
    with autograd.record():
        loss = losses(net, data, label, TWO_CPUS)
    trainer.backward(loss)
    assert trainer.step(8)
    before_weights, before_states = weights(net, trained_only=True), optimizer_states(trainer)
    assert len(before_states) == 2 and before_states[0]  # momentum and master on both devices
    with autograd.record():
        loss = losses(net, data2, label2, TWO_CPUS)
    trainer.backward(loss)
    grad = net.collect_params()[next(iter(net.collect_params()))].grad(mx.cpu(1))
    grad[0] = float("inf")  # one value, on the second device only
    assert trainer.step(8) is False
    assert_same(before_weights, weights(net, trained_only=True))
    assert_same(before_states, optimizer_states(trainer))
    assert (trainer.loss_scale, trainer.num_steps, trainer.num_skipped) == (512.0, 2, 1)


def test_plain_gluon_trainer_on_two_devices_gets_a_clear_error_from_the_scaler():
    net = mxfp16.cast_block(small_net(TWO_CPUS), "float16")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"multi_precision": True})
    scaler = mxfp16.StaticLossScaler(128)
    (data, label), = batches(1)
    with autograd.record():
        scaled = scaler.scale(losses(net, data, label, TWO_CPUS))
    autograd.backward(scaled)
    with pytest.raises(RuntimeError, match=r"updates the weights on its kvstore.*mxfp16\.Trainer"
                                           r".*update_on_kvstore=False"):
        scaler.step(trainer, 8)


def reference_grad_norm():
    """The global gradient norm of the first batch, computed in float32."""
    net = small_net([mx.cpu()])
    (data, label), = batches(1)
    with autograd.record():
        loss = losses(net, data, label, [mx.cpu()])
    autograd.backward(loss)
    grads = [p.grad() for p in net.collect_params().values() if p.grad_req != "null"]
    return float(np.sqrt(sum(float((g ** 2).sum().asscalar()) for g in grads)))


@pytest.mark.parametrize("how", ["clip_global_norm", "allreduce_grads"])
def test_gradient_clipping_compares_the_unscaled_norm(how):
    expected = reference_grad_norm()
    net = mxfp16.cast_block(small_net([mx.cpu()]), "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             dtype="float16", loss_scale=1024)
    (data, label), = batches(1)
    with autograd.record():
        loss = losses(net, data, label, [mx.cpu()])
    trainer.backward(loss)
    if how == "clip_global_norm":
        norm = trainer.clip_global_norm(expected / 2)
        assert trainer.step(8)
    else:  # Gluon's manual recipe: allreduce_grads, read the (now unscaled) gradients, update
        trainer.allreduce_grads()
        grads = [p.grad().astype("float32") for p in net.collect_params().values()
                 if p.grad_req != "null"]
        norm = float(np.sqrt(sum(float((g ** 2).sum().asscalar()) for g in grads)))
        assert trainer.update(8)
    assert norm == pytest.approx(expected, rel=1e-2)


def test_learning_rate_as_in_gluon():
    trainer = mxfp16.Trainer(small_net([mx.cpu()]).collect_params(), "sgd",
                             {"learning_rate": 0.25})
    assert trainer.learning_rate == 0.25
    trainer.set_learning_rate(0.125)
    assert trainer.learning_rate == trainer.optimizer.learning_rate == 0.125
    assert isinstance(trainer, gluon.Trainer)


def train_steps(net, trainer, data_batches, ctx):
    """Steps of an mxfp16.Trainer, or of a gluon.Trainer the way Gluon scripts run them."""
    for data, label in data_batches:
        with autograd.record():
            loss = losses(net, data, label, ctx)
        if isinstance(trainer, mxfp16.Trainer):
            trainer.backward(loss)
        else:
            autograd.backward(loss)
        trainer.step(data.shape[0])


def new_float16_run(ctx, scaler):
    net = mxfp16.cast_block(small_net(ctx, seed=7), "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.05, "momentum": 0.9},
                             dtype="float16", loss_scale=scaler)
    return net, trainer


@pytest.mark.parametrize("ctx", [[mx.cpu(0)], TWO_CPUS], ids=["one-device", "two-devices"])
def test_resume_restores_weights_optimizer_state_and_loss_scale_exactly(ctx, tmp_path):
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=2)
    net, trainer = new_float16_run(ctx, scaler)
    data = batches(5)
    train_steps(net, trainer, data[:3], ctx)
    net.save_parameters(str(tmp_path / "net.params"))
    trainer.save_states(str(tmp_path / "net.states"))
    resumed_net, resumed = new_float16_run(ctx, mxfp16.DynamicLossScaler(init_scale=1.0))
    resumed_net.load_parameters(str(tmp_path / "net.params"), ctx=ctx)
    resumed.load_states(str(tmp_path / "net.states"))
    # Trained weights exactly; BatchNorm's running statistics are saved averaged over the devices.
    assert_same(weights(net, trained_only=True), weights(resumed_net, trained_only=True))
    assert_same(optimizer_states(trainer), optimizer_states(resumed))
    assert resumed.scaler.state_dict() == trainer.scaler.state_dict()
    assert resumed.loss_scale == 2.0 ** 11  # grew once after two clean steps
    assert resumed.optimizer.num_update == trainer.optimizer.num_update == 3
    train_steps(net, trainer, data[3:], ctx)
    train_steps(resumed_net, resumed, data[3:], ctx)
    assert_same(weights(net, trained_only=True), weights(resumed_net, trained_only=True))


@pytest.mark.slow
def test_gluon_trainer_reads_our_states_and_we_read_a_float32_gluon_run(tmp_path):
    net, trainer = new_float16_run([mx.cpu()], 256.0)
    train_steps(net, trainer, batches(2), [mx.cpu()])
    trainer.save_states(str(tmp_path / "ours.states"))
    plain = gluon.Trainer(net.collect_params(), "sgd", {"multi_precision": True})
    plain.load_states(str(tmp_path / "ours.states"))
    assert plain.optimizer.num_update == 2
    carried = getattr(plain.optimizer, mxfp16.trainer.SCALER_STATE_ATTRIBUTE)  # and ignored
    assert carried["loss_scale"] == 256.0 and carried["num_steps"] == 2

    float32_net = small_net([mx.cpu()], seed=7)
    float32_trainer = gluon.Trainer(float32_net.collect_params(), "sgd",
                                    {"learning_rate": 0.05, "momentum": 0.9})
    train_steps(float32_net, float32_trainer, batches(2), [mx.cpu()])
    float32_net.save_parameters(str(tmp_path / "float32.params"))
    float32_trainer.save_states(str(tmp_path / "float32.states"))
    resumed, resumed_trainer = new_float16_run([mx.cpu()], 256.0)
    resumed.load_parameters(str(tmp_path / "float32.params"))
    resumed_trainer.load_states(str(tmp_path / "float32.states"))
    assert resumed_trainer.optimizer.multi_precision and resumed_trainer.loss_scale == 256.0
    train_steps(resumed, resumed_trainer, batches(1), [mx.cpu()])
    first = next(iter(resumed.collect_params().values()))
    master = mxfp16.optimizers.master_copies(first)[0]
    assert np.array_equal(master.astype("float16").asnumpy(), first.data().asnumpy())

