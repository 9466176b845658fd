"""Float16 training reaches float32 accuracy on real data (scikit-learn's handwritten digits)."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits

import mxfp16

STEPS = 300
BATCH = 32


def digits():
    images, labels = load_digits(return_X_y=True)
    rng = np.random.RandomState(0)
    order = rng.permutation(len(labels))
    images = (images[order] / 16.0).reshape(-1, 1, 8, 8).astype("float32")
    labels = labels[order].astype("float32")
    return (images[:1400], labels[:1400]), (images[1400:], labels[1400:])


def small_cnn():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.MaxPool2D(2), nn.Conv2D(32, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(10))
    return net


def train_and_test(dtype):
    (train_x, train_y), (test_x, test_y) = digits()
    mx.random.seed(0)
    net = small_cnn()
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype)
    net.hybridize()
    # The step decay lets the BatchNorm running statistics settle: without it, eval-mode accuracy
    # swings by several points with the trajectory (skipping 4 early steps in float32 does that too).
    schedule = mx.lr_scheduler.MultiFactorScheduler(step=[200], factor=0.1, base_lr=0.1)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", dtype, momentum=0.9,
                                  lr_scheduler=schedule)
    scaler = mxfp16.make_loss_scaler(None, dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    rng = np.random.RandomState(0)
    for _ in range(STEPS):
        idx = rng.randint(0, len(train_y), BATCH)
        with autograd.record():
            loss = scaler.scale(loss_fn(net(mx.nd.array(train_x[idx])), mx.nd.array(train_y[idx])))
        loss.backward()
        scaler.step(trainer, BATCH)
    predictions = net(mx.nd.array(test_x)).argmax(axis=1).asnumpy()
    return float((predictions == test_y).mean()), scaler


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_low_precision_reaches_float32_accuracy(dtype):
    reference, _ = train_and_test("float32")
    accuracy, scaler = train_and_test(dtype)
    assert reference > 0.9
    assert accuracy >= reference - 0.02
    if dtype == "float16":
        assert scaler.num_steps == STEPS and scaler.num_skipped < 20
