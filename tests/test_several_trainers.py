"""Several mxfp16.Trainers in one training step (a GAN's generator and discriminator), each with its
own loss scaler or one scaler shared, and sparse Embedding gradients in float16."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

import mxfp16


def dense_net(units, in_units, seed):
    mx.random.seed(seed)
    net = nn.Dense(units, in_units=in_units)
    net.initialize(mx.init.Uniform(0.5))
    return mxfp16.cast_block(net, "float16")


def backward(trainer, net, data):
    with autograd.record():
        loss = net(data).sum()
    trainer.backward(loss)


def weights(net):
    return {name: p.data().asnumpy().copy() for name, p in net.collect_params().items()}


def test_a_shared_scaler_unscales_each_step_by_the_scale_of_its_own_backward():
    """D overflows and backs the shared scale off (1024 -> 512) after G's backward ran at 1024:
    G's update still divides by 1024 and equals G trained with a scaler of its own."""
    data = mx.nd.ones((4, 3))
    shared = mxfp16.DynamicLossScaler(init_scale=1024)
    gen, disc = dense_net(2, 3, seed=1), dense_net(2, 3, seed=2)
    gen_trainer = mxfp16.Trainer(gen.collect_params(), "sgd", {"learning_rate": 0.1},
                                 loss_scale=shared)
    disc_trainer = mxfp16.Trainer(disc.collect_params(), "sgd", {"learning_rate": 0.1},
                                  loss_scale=shared)
    disc_before = weights(disc)
    backward(gen_trainer, gen, data)
    backward(disc_trainer, disc, data * np.inf)  # overflows: inf * weights
    assert disc_trainer.step(4) is False
    assert shared.loss_scale == 512.0
    assert gen_trainer.step(4) is True

    alone = dense_net(2, 3, seed=1)
    alone_trainer = mxfp16.Trainer(alone.collect_params(), "sgd", {"learning_rate": 0.1},
                                   loss_scale=mxfp16.DynamicLossScaler(init_scale=1024))
    backward(alone_trainer, alone, data)
    assert alone_trainer.step(4) is True
    for (name, value), expected in zip(weights(gen).items(), weights(alone).values()):
        assert np.array_equal(value, expected), name
    for name, value in weights(disc).items():
        assert np.array_equal(value, disc_before[name]), name  # the skipped step changed nothing
    assert (shared.num_steps, shared.num_skipped) == (2, 1)


def test_own_scalers_keep_apart():
    data = mx.nd.ones((4, 3))
    gen, disc = dense_net(2, 3, seed=1), dense_net(2, 3, seed=2)
    gen_trainer = mxfp16.Trainer(gen.collect_params(), "adam", {"learning_rate": 0.01},
                                 loss_scale="dynamic:256")
    disc_trainer = mxfp16.Trainer(disc.collect_params(), "adam", {"learning_rate": 0.01},
                                  loss_scale="dynamic:256")
    backward(disc_trainer, disc, data * np.inf)
    backward(gen_trainer, gen, data)
    assert (disc_trainer.step(4), gen_trainer.step(4)) == (False, True)
    assert (disc_trainer.loss_scale, gen_trainer.loss_scale) == (128.0, 256.0)


def test_a_step_begun_but_not_taken_does_not_leak_into_the_next():
    """unscale() (through allreduce_grads) without update(), then a new backward: the next step
    divides by its own scale once, not by a stale one."""
    data = mx.nd.ones((4, 3))
    net, twin = dense_net(2, 3, seed=1), dense_net(2, 3, seed=1)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1}, loss_scale=64)
    twin_trainer = mxfp16.Trainer(twin.collect_params(), "sgd", {"learning_rate": 0.1},
                                  loss_scale=64)
    backward(trainer, net, data)
    trainer.allreduce_grads()  # abandoned: no update
    backward(trainer, net, data)
    backward(twin_trainer, twin, data)
    assert trainer.step(4) and twin_trainer.step(4)
    for value, expected in zip(weights(net).values(), weights(twin).values()):
        assert np.array_equal(value, expected)


def embedding_net(sparse_grad, dtype):
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Embedding(100, 8, sparse_grad=sparse_grad), nn.Dense(2, flatten=False, in_units=8))
    net.initialize(mx.init.Uniform(0.5))
    return net, mxfp16.cast_block(net, dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_sparse_embedding_gradients_train_as_dense_ones(dtype):
    """Embedding(sparse_grad=True) in a cast network: row_sparse gradients, the same weights as
    dense gradients after three momentum steps, and rows never looked up untouched."""
    tokens = mx.nd.array([[1, 2, 3], [3, 7, 1]])
    results = []
    for sparse in (True, False):
        net, cast = embedding_net(sparse, dtype)
        before = net[0].weight.data().astype("float32").asnumpy()
        trainer = mxfp16.Trainer(cast.collect_params(), "sgd",
                                 {"learning_rate": 0.5, "momentum": 0.9}, dtype=dtype)
        for _ in range(3):
            backward(trainer, cast, tokens)
            assert trainer.step(2)
        assert net[0].weight.grad().stype == ("row_sparse" if sparse else "default")
        results.append(net[0].weight.data().astype("float32").asnumpy())
    assert np.array_equal(results[0], results[1])
    untouched = [row for row in range(100) if row not in (1, 2, 3, 7)]
    assert np.array_equal(results[0][untouched], before[untouched])
    assert not np.array_equal(results[0][[1, 2, 3, 7]], before[[1, 2, 3, 7]])
