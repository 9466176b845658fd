"""mxfp16's own machinery never changes the numerics of an ordinary loss (issue 34).

The loss-head check, the boundary scale and the clipping routes exist for losses whose backward
ignores the head gradient.  For any other loss, training with them must give the weights that
training with them taken out gives, bit for bit: dropout inside and outside hybridized graphs
(GluonNLP's WeightDrop), plain Blocks, and hybridized blocks whose ``_CachedOp`` is gone at the
backward.  A zero-head-gradient probe run before the real backward (33d6280) broke this: MXNet's
Dropout passes the gradient unmasked from the second backward of a recorded graph on.
"""
import gluonnlp as nlp
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.scaling import boundary, heads

#: A power of two: an ordinary loss scaled at the head or at the boundary gives the same bits.
LOSS_SCALE = 1024.0
STEPS = 3
CLASSES = 4


class JointActivationRegularizationLoss(gluon.loss.Loss):
    """GluonNLP's word_language_model.py loss: cross-entropy plus AR and TAR."""

    def __init__(self, alpha=2.0, beta=1.0, **kwargs):
        super().__init__(None, None, **kwargs)
        self._loss = gluon.loss.SoftmaxCrossEntropyLoss()
        self._ar_loss = nlp.loss.ActivationRegularizationLoss(alpha)
        self._tar_loss = nlp.loss.TemporalActivationRegularizationLoss(beta)

    def hybrid_forward(self, F, out, target, states, dropped_states):
        loss = self._loss(out.reshape(-3, -1), target.reshape(-1,))
        return loss + self._ar_loss(*dropped_states) + self._tar_loss(*states)


def classifier():
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dropout(0.5),
            nn.Dense(CLASSES, in_units=16))
    net.initialize(mx.init.Xavier())
    return mxfp16.cast_block(net, "float16")


class PlainBlock(gluon.Block):
    """Not hybridizable: nd.Dropout before a cast network, a float32 Dense after it."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.body = classifier()
        self.head = nn.Dense(CLASSES, in_units=CLASSES)
        self.head.initialize(mx.init.Xavier())

    def forward(self, x):
        return self.head(self.body(mx.nd.Dropout(x, p=0.3)))


def data():
    rng = np.random.RandomState(0)
    return mx.nd.array(rng.randn(6, 8)), mx.nd.array(rng.randint(0, CLASSES, 6))


def hybridized_dropout():
    net = classifier()
    net.hybridize()
    x, y = data()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    return net, lambda: loss_fn(net(x), y)


def dropout_outside_the_graph():
    net = classifier()
    net.hybridize(static_alloc=True)
    x, y = data()
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    return net, lambda: loss_fn(net(mx.nd.Dropout(x, p=0.3)), y)


def plain_block():
    net = PlainBlock()
    x, y = data()
    loss_fn = gluon.loss.L2Loss()
    return net, lambda: loss_fn(net(x), mx.nd.one_hot(y, CLASSES))


def weight_drop():
    """AWD-LSTM as word_language_model.py trains it: WeightDrop's nd.Dropout on the h2h weights
    outside the hybridized graph, dropout on the embedding, between layers and on the output."""
    model = nlp.model.train.AWDRNN("lstm", 30, 8, 8, 2, False, 0.4, 0.5, 0.2, 0.65, 0.1)
    model.initialize(mx.init.Xavier())
    model.hybridize(static_alloc=True)
    net = mxfp16.cast_block(model, "float16")
    rng = np.random.RandomState(0)
    tokens = mx.nd.array(rng.randint(0, 30, (9, 3)))
    loss_fn = JointActivationRegularizationLoss()
    net(tokens[:-1], net.begin_state(3, func=mx.nd.zeros))  # the decoder's deferred shapes

    def loss():
        output, _, states, dropped = net(tokens[:-1], net.begin_state(3, func=mx.nd.zeros))
        return loss_fn(output, tokens[1:], states, dropped) / tokens[1:].size
    return net, loss


def rehybridized():
    """The block is hybridized again between its forward and the backward: its _CachedOp is gone
    and its graph cannot be read (the loss is then taken as head-ignoring: boundary scale)."""
    net, loss = hybridized_dropout()

    def loss_then_rehybridize():
        value = loss()
        net.hybridize()
        return value
    return net, loss_then_rehybridize


def loss_block_made_anew():
    """A hybridized loss block made in every step, gone at the backward."""
    net = classifier()
    net.hybridize()
    x, y = data()

    def loss():
        loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
        loss_fn.hybridize()
        return loss_fn(net(x), y)
    return net, loss


CASES = {fn.__name__: fn for fn in (hybridized_dropout, dropout_outside_the_graph, plain_block,
                                    weight_drop, rehybridized, loss_block_made_anew)}


def train(case):
    """The weights (float32 numpy) before and after STEPS float16 steps, clipped as scripts do."""
    mx.random.seed(0)
    net, loss_fn = CASES[case]()
    params = net.collect_params()
    trainer = mxfp16.Trainer(params, "sgd", {"learning_rate": 0.5}, dtype="float16",
                             loss_scale=LOSS_SCALE)
    before = [p.data().astype("float32").asnumpy() for p in params.values()]
    for step in range(STEPS):
        mxfp16.seed_step(1, step)  # the dropout masks of the step
        with autograd.record():
            loss = loss_fn()
        trainer.backward(loss)
        trainer.clip_global_norm(1.0)
        assert trainer.step(6)
    return before, [p.data().astype("float32").asnumpy() for p in params.values()]


def bypass_loss_head_machinery(patch):
    """Every loss taken as ordinary without looking, and no boundary factors: the scale goes in
    as the head gradient only."""
    patch.setattr(heads.HeadCheck, "ops", lambda self, *args: [])
    patch.setattr(boundary, "scale_outputs", lambda out: out)
    patch.setattr(boundary, "scale_inputs", lambda call: call)


@pytest.mark.parametrize("case", sorted(CASES))
def test_ordinary_losses_train_bit_identically_with_and_without_the_loss_head_machinery(case):
    before, with_machinery = train(case)
    with pytest.MonkeyPatch.context() as patch:
        bypass_loss_head_machinery(patch)
        _, without = train(case)
    assert any((a != b).any() for a, b in zip(before, with_machinery))  # it trained
    for index, (a, b) in enumerate(zip(with_machinery, without)):
        assert (a == b).all(), (case, index, np.abs(a - b).max())
