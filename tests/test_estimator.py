"""Gluon's Fit API (gluon.contrib.estimator.Estimator) in float16 and bfloat16 through
mxfp16.BatchProcessor: loss scaling, float32 values for the handlers, float32 checkpoints."""
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon, npx
from mxnet.gluon import nn
from mxnet.gluon.contrib.estimator import (BatchEnd, CheckpointHandler, EarlyStoppingHandler,
                                           Estimator)

import mxfp16

#: The loss scale each dtype trains at here: float16's dynamic default, and a static scale for
#: bfloat16 (off by default there) so that its steps go through the scaling too.
LOSS_SCALES = {"float16": "dynamic", "bfloat16": 128.0}


def network(seed=0):
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, in_units=8, activation="relu"), nn.BatchNorm(in_channels=16),
            nn.Dense(3, in_units=16))
    net.initialize(mx.init.Xavier())
    return net


def loader(num=128, batch_size=32):
    """A learnable 3-class problem: the class is the argmax of a fixed linear map."""
    rng = np.random.RandomState(0)
    x = rng.randn(num, 8).astype("float32")
    y = (x @ rng.randn(8, 3)).argmax(axis=1).astype("float32")
    array = mx.np.array if mx.util.is_np_array() else mx.nd.array  # the front end that is on
    return gluon.data.DataLoader(gluon.data.ArrayDataset(array(x), array(y)),
                                 batch_size=batch_size)


class Recorder(BatchEnd):
    """What the Estimator's handlers are given at each batch end: dtypes and losses."""

    def __init__(self):
        self.dtypes, self.losses = set(), []

    def batch_end(self, estimator, *args, **kwargs):
        for name in ("pred", "loss", "label"):
            self.dtypes.update((name, np.dtype(a.dtype).name) for a in kwargs[name])
        self.losses.append(np.concatenate([loss.asnumpy() for loss in kwargs["loss"]]))


def estimator(net, dtype, **kwargs):
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, dtype=dtype,
                             loss_scale=LOSS_SCALES[dtype])
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer, context=mx.cpu(),
                    batch_processor=mxfp16.BatchProcessor(), **kwargs)
    est.logger.disabled = True
    return est


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_estimator_trains_with_float32_checkpoints(dtype, tmp_path):
    net = mxfp16.cast_block(network(), dtype)
    est = estimator(net, dtype)
    recorder = Recorder()
    checkpoints = CheckpointHandler(str(tmp_path), model_prefix="net", epoch_period=1)
    est.fit(loader(), epochs=4, event_handlers=[checkpoints, recorder])
    first, last = np.mean(recorder.losses[:4]), np.mean(recorder.losses[-4:])
    assert last < 0.8 * first, (first, last)
    assert recorder.dtypes == {("pred", "float32"), ("loss", "float32"), ("label", "float32")}
    assert est.trainer.num_steps == 16 and est.trainer.loss_scale > 1
    params = str(tmp_path / "net-epoch3batch16.params")
    saved = mx.nd.load(params)
    assert sorted(saved) == sorted(mxfp16.mxnet_internals.block_param_keys(network()))
    assert {np.dtype(value.dtype).name for value in saved.values()} == {"float32"}
    fresh = network(seed=9)
    fresh.load_parameters(params)  # the float32 network, no option
    x = next(iter(loader()))[0]
    np.testing.assert_allclose(fresh(x).asnumpy(), net(x).asnumpy(), atol=5e-2, rtol=5e-2)
    resumed = mxfp16.Trainer(fresh.collect_params(), "adam", dtype="float32")
    resumed.load_states(str(tmp_path / "net-epoch3batch16.states"))
    states = mxfp16.Trainer(net.collect_params(), "adam", dtype=dtype,
                            loss_scale=LOSS_SCALES[dtype])
    states.load_states(str(tmp_path / "net-epoch3batch16.states"))
    assert states.loss_scale == est.trainer.loss_scale  # the scaler's state is in the checkpoint


@pytest.fixture
def numpy_mode():
    """The NumPy interface on for the test, off afterwards."""
    npx.set_np()
    try:
        yield
    finally:
        npx.reset_np()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_numpy_mode_estimator_trains_with_float32_checkpoints(numpy_mode, dtype, tmp_path):
    # MXNet 1.9.1's own metrics refuse mx.np arrays: the processor hands the handlers legacy views
    net = mxfp16.cast_block(network(), dtype)
    est = estimator(net, dtype)
    recorder = Recorder()
    est.fit(loader(), epochs=4, event_handlers=[recorder, CheckpointHandler(
        str(tmp_path), model_prefix="net")])
    first, last = np.mean(recorder.losses[:4]), np.mean(recorder.losses[-4:])
    assert last < 0.8 * first, (first, last)
    assert recorder.dtypes == {("pred", "float32"), ("loss", "float32"), ("label", "float32")}
    params = str(tmp_path / "net-epoch3batch16.params")
    saved = npx.load(params)
    assert {np.dtype(value.dtype).name for value in saved.values()} == {"float32"}
    fresh = network(seed=9)
    fresh.load_parameters(params)  # the numpy-mode float32 network, no option
    x = next(iter(loader()))[0]
    np.testing.assert_allclose(fresh(x).asnumpy(), net(x).asnumpy(), atol=5e-2, rtol=5e-2)


def test_early_stopping_sees_the_float32_losses():
    net = mxfp16.cast_block(network(), "float16")
    est = estimator(net, "float16")
    recorder = Recorder()
    monitor = est.train_metrics[-1]  # the training loss
    # never improving by 10: stops at the end of the second epoch
    stopping = EarlyStoppingHandler(monitor, min_delta=10, patience=0, mode="min")
    est.fit(loader(), epochs=10, event_handlers=[stopping, recorder])
    assert stopping.stopped_epoch == 1 and len(recorder.losses) == 8
    assert np.isfinite(stopping.best)
    # the loss metric averages the float32 losses the handlers were given
    assert monitor.get()[1] == pytest.approx(float(np.concatenate(recorder.losses[4:]).mean()),
                                             rel=1e-6)


def test_a_cast_plain_block_trains_and_checkpoints_in_float32(tmp_path):
    class Net(gluon.Block):  # a plain Block: Python between its HybridBlocks
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.body, self.head = network(), nn.Dense(3, in_units=3)

        def forward(self, x):
            return self.head(self.body(x) * 0.5)

    mx.random.seed(0)
    net = Net()
    net.head.initialize()
    mxfp16.cast_block(net, "float16")
    est = estimator(net, "float16")
    est.fit(loader(), epochs=1, event_handlers=[CheckpointHandler(str(tmp_path),
                                                                  model_prefix="net")])
    path = str(tmp_path / "net-epoch0batch4.params")
    assert {np.dtype(v.dtype).name for v in mx.nd.load(path).values()} == {"float32"}
    Net().load_parameters(path)


def test_the_refusal_names_the_estimator_route():
    net = mxfp16.cast_block(network(), "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             dtype="float16")
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer)
    est.logger.disabled = True
    with pytest.raises(RuntimeError, match=r"Estimator's default batch processor calls "
                       r"loss.backward\(\) itself: pass Estimator\(\.\.\., trainer=trainer, "
                       r"batch_processor=mxfp16.BatchProcessor\(\)\)"):
        est.fit(loader(), epochs=1)
    x, y = next(iter(loader()))  # outside an Estimator: the loop's own fix, no Estimator
    with mx.autograd.record():
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(net(x), y)
    loss.backward()
    with pytest.raises(RuntimeError) as error:
        trainer.step(x.shape[0])
    assert "Estimator" not in str(error.value)
    assert str(error.value).endswith("with `trainer.backward(loss)`")


def test_a_gluon_trainer_is_refused_with_the_fix():
    net = mxfp16.cast_block(network(), "float16")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1})
    est = Estimator(net, gluon.loss.SoftmaxCrossEntropyLoss(), trainer=trainer,
                    batch_processor=mxfp16.BatchProcessor())
    est.logger.disabled = True
    with pytest.raises(TypeError, match=r"Trainer does not have: pass Estimator\(\.\.\., "
                       r"trainer=mxfp16.Trainer\("):
        est.fit(loader(), epochs=1)


@pytest.mark.slow
def test_checkpoint_handler_resumes_a_float16_run(tmp_path):
    net = mxfp16.cast_block(network(), "float16")
    first = estimator(net, "float16")
    first.fit(loader(), epochs=2, event_handlers=[CheckpointHandler(str(tmp_path),
                                                                    model_prefix="net")])
    saved = mx.nd.load(str(tmp_path / "net-epoch1batch8.params"))
    net2 = mxfp16.cast_block(network(seed=5), "float16")
    second = estimator(net2, "float16")
    resume = CheckpointHandler(str(tmp_path), model_prefix="net", resume_from_checkpoint=True)
    second.fit(loader(), epochs=3, event_handlers=[resume])  # epoch 2 only, from the file
    assert second.trainer.num_steps == first.trainer.num_steps + 4  # the scaler's state resumed
    assert sorted(os.listdir(tmp_path))[-3:] == ["net-epoch2batch12.params",
                                                 "net-epoch2batch12.states", "net-symbol.json"]
    resumed = mx.nd.load(str(tmp_path / "net-epoch2batch12.params"))
    assert sorted(resumed) == sorted(saved)
