"""Loss scaling reaches every gradient, also through ops whose backward ignores the head gradient.

GluonCV's segmentation losses are built on ``SoftmaxOutput``, whose backward starts the gradient
itself: a loss scale multiplied into the loss never reaches the network, and a step that divides by
the scale trains at 1/scale.  Each test compares one float16 update (SGD, momentum 0) with float32's.
"""
import mxnet as mx
import numpy as np
import pytest
from gluoncv.loss import MixSoftmaxCrossEntropyLoss
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16

CLASSES = 3


class TwoHeads(nn.HybridBlock):
    """A tiny segmentation network with an auxiliary head, as GluonCV's FCN returns (out, aux)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.body = nn.Conv2D(4, 3, padding=1, in_channels=2, activation="relu")
            self.head = nn.Conv2D(CLASSES, 1, in_channels=4)
            self.aux = nn.Conv2D(CLASSES, 1, in_channels=4)

    def hybrid_forward(self, F, x):
        features = self.body(x)
        return self.head(features), self.aux(features)


class SoftmaxOutputLoss(nn.HybridBlock):
    """A hybridizable cross-entropy on SoftmaxOutput, as Module-era code writes one."""

    def hybrid_forward(self, F, pred, label):
        prob = F.SoftmaxOutput(pred, label, multi_output=True, normalization="valid")
        return -F.mean(F.log(F.pick(prob, label, axis=1)), axis=0, exclude=True)


class MakeLossL2(nn.HybridBlock):
    """A squared error through MakeLoss, whose backward gives ones whatever comes in."""

    def hybrid_forward(self, F, pred, label):
        return F.MakeLoss(F.mean(F.square(pred - F.one_hot(label, CLASSES).transpose((0, 3, 1, 2)))))


def mix_loss(outputs, label):
    return MixSoftmaxCrossEntropyLoss(aux=True, aux_weight=0.4)(*outputs, label)


def softmax_output_loss(outputs, label, hybridize=False):
    loss_fn = SoftmaxOutputLoss()
    if hybridize:
        loss_fn.hybridize()
    return loss_fn(outputs[0], label)


def make_loss_l2(outputs, label):
    return MakeLossL2()(outputs[0], label)


def mixed_with_plain(outputs, label):
    """A head-ignoring loss plus an ordinary one: each reaches the gradients at the same scale."""
    plain = gluon.loss.SoftmaxCrossEntropyLoss(axis=1)(outputs[1], label)
    return mix_loss(outputs, label) + 0.5 * plain


LOSSES = {
    "gluoncv_mix": mix_loss,
    "softmax_output": softmax_output_loss,
    "softmax_output_hybridized": lambda o, y: softmax_output_loss(o, y, hybridize=True),
    "make_loss": make_loss_l2,
    "mixed": mixed_with_plain,
}


def data():
    rng = np.random.RandomState(0)
    return (mx.nd.array(rng.uniform(-1, 1, (2, 2, 5, 5))),
            mx.nd.array(rng.randint(0, CLASSES, (2, 5, 5))))


def one_update(loss_fn, dtype, loss_scale, hybridize=True, steps=1):
    """The weights before and after ``steps`` SGD steps (momentum 0), as float32 numpy arrays."""
    mx.random.seed(0)
    net = TwoHeads(prefix="net_")
    net.initialize(mx.init.Xavier())
    if dtype != "float32":
        net = mxfp16.cast_block(net, dtype)
    if hybridize:
        net.hybridize()
    params = net.collect_params()
    trainer = mxfp16.Trainer(params, "sgd", {"learning_rate": 1.0, "momentum": 0.0},
                             dtype=dtype, loss_scale=loss_scale)
    x, y = data()
    before = {k: p.data().astype("float32").asnumpy() for k, p in params.items()}
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y)
        trainer.backward(loss)
        assert trainer.step(x.shape[0])
    after = {k: p.data().astype("float32").asnumpy() for k, p in params.items()}
    return before, after, trainer


def assert_same_update(loss_fn, dtype, loss_scale, **kwargs):
    before32, after32, _ = one_update(loss_fn, "float32", None, **kwargs)
    before16, after16, trainer = one_update(loss_fn, dtype, loss_scale, **kwargs)
    for key in before32:
        step32 = after32[key] - before32[key]
        step16 = after16[key] - before16[key]
        if not step32.any():  # a head the loss does not use
            assert not step16.any(), key
            continue
        assert np.abs(step32).max() > 1e-3, key  # the step is well above float16's resolution
        # Within a few float16 steps of the weights (2**-10 relative), not 1/scale of the update.
        tolerance = 4 * 2.0 ** -10 * (np.abs(before32[key]).max() + np.abs(step32).max())
        np.testing.assert_allclose(step16, step32, atol=tolerance, rtol=0.02, err_msg=key)
    return trainer


@pytest.mark.parametrize("name", sorted(LOSSES))
def test_float16_update_through_a_head_ignoring_loss_matches_float32(name):
    assert_same_update(LOSSES[name], "float16", 1024.0)


def test_dynamic_scale_gluoncv_mix_loss_over_steps():
    """The scale changes after the 'auto' start: each step still takes float32's update."""
    before32, after32, _ = one_update(mix_loss, "float32", None, steps=3)
    before16, after16, trainer = one_update(mix_loss, "float16", "dynamic", steps=3)
    assert trainer.num_skipped == 0
    for key in before32:
        step32 = after32[key] - before32[key]
        tolerance = 8 * 2.0 ** -10 * (np.abs(before32[key]).max() + np.abs(step32).max())
        np.testing.assert_allclose(after16[key] - before16[key], step32, atol=tolerance,
                                   rtol=0.03, err_msg=key)


def test_imperative_network_and_loss():
    assert_same_update(mix_loss, "float16", 1024.0, hybridize=False)


def test_ordinary_loss_is_scaled_as_before():
    """The control: a loss whose ops pass the head gradient on is scaled by the loss scale (the
    float16 update matches float32's), and nothing is scaled twice."""
    def plain(outputs, label):
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss(axis=1)
        return loss_fn(outputs[0], label) + 0.4 * loss_fn(outputs[1], label)
    assert_same_update(plain, "float16", 1024.0)


def test_raw_scaler_refuses_a_head_ignoring_loss():
    x = mx.nd.ones((2, 3))
    x.attach_grad()
    with autograd.record():
        loss = mx.nd.MakeLoss(x.sum())
    with pytest.raises(RuntimeError, match="MakeLoss, whose backward ignores the head gradient"):
        mxfp16.StaticLossScaler(128).scale(loss)
    assert mxfp16.StaticLossScaler(1).scale(loss).asscalar() == 6.0  # scale 1: nothing lost


def test_probe_keeps_accumulated_gradients_and_runs_once(monkeypatch):
    """The probe of a hybridized loss restores gradients that accumulate (grad_req='add'), and a
    training loop pays it once per graph."""
    from mxfp16 import loss_heads
    calls = []
    probe = loss_heads._probe
    monkeypatch.setattr(loss_heads, "_probe", lambda *a: calls.append(1) or probe(*a))
    net = nn.Dense(3, in_units=4)
    net.initialize()
    net.hybridize()
    loss_fn = SoftmaxOutputLoss()
    loss_fn.hybridize()
    net.weight.grad_req = "add"
    net.weight.grad()[:] = 7.0
    check = loss_heads.HeadCheck()
    for _ in range(3):
        with autograd.record():
            loss = loss_fn(net(mx.nd.ones((2, 4))).reshape((2, 3, 1)), mx.nd.zeros((2, 1)))
        assert check.ops([loss], [net.weight.grad()]) == ["a hybridized block"]
        assert (net.weight.grad().asnumpy() == 7.0).all()
    assert len(calls) == 1


def test_trainer_logs_once(caplog):
    with caplog.at_level("WARNING", logger="mxfp16.trainer"):
        one_update(mix_loss, "float16", 1024.0, steps=2)
    messages = [r.getMessage() for r in caplog.records if "SoftmaxOutput" in r.getMessage()]
    assert len(messages) == 1 and "back-propagated unscaled" in messages[0]
