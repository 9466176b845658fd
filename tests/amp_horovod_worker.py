"""One rank of tests/test_amp.py's Horovod job: a script's own ``hvd.DistributedTrainer`` under
``from mxfp16 import amp``, an overflow on the last rank only at step ``INF_STEP``; prints one JSON
line with the rank's losses, skipped steps, loss scale and weights."""
import json

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import horovod.mxnet as hvd
from mxfp16 import amp

INF_STEP = 3
NUM_STEPS = 6


def main():
    hvd.init()
    amp.init()
    mx.random.seed(0)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=4, activation="relu"), gluon.nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    params = net.collect_params()
    hvd.broadcast_parameters(params, root_rank=0)
    trainer = hvd.DistributedTrainer(params, "sgd", {"learning_rate": 0.5})
    amp.init_trainer(trainer)
    rng = np.random.RandomState(hvd.rank())
    x, y = mx.nd.array(rng.randn(8, 4)), mx.nd.array(rng.randint(0, 3, 8))
    losses, skipped = [], []
    for step in range(NUM_STEPS):
        with autograd.record():
            loss = gluon.loss.SoftmaxCELoss()(net(x), y)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        if step == INF_STEP and hvd.rank() == hvd.size() - 1:
            net[1].weight.grad()[0, 0] = np.inf
        before = amp.loss_scaler(trainer).num_skipped
        trainer.step(8)
        skipped.append(amp.loss_scaler(trainer).num_skipped - before)
        losses.append(float(loss.mean().asscalar()))
    print(json.dumps({"rank": hvd.rank(), "losses": losses, "skipped": skipped,
                      "scale": amp.loss_scaler(trainer).loss_scale,
                      "weights": net[1].weight.data().asnumpy().astype("float32").tolist(),
                      "dtype": net[0].weight.data().dtype.__name__}))


if __name__ == "__main__":
    main()
