"""A worker of tests/test_distributed.py: float16 Gluon training on a ``dist_sync`` kvstore.

Run by the launcher with the DMLC environment: ``python tests/dist_worker.py OUT_DIR``.  Every
worker trains a small float16 network (CPU emulation) on its shard of a linearly separable problem
with :func:`mxfp16.make_trainer` and a :class:`mxfp16.DynamicLossScaler`; at step
:data:`INF_STEP` the batch of the worker with rank 0 holds an inf, so the aggregated gradient
overflows for everyone.  Writes ``OUT_DIR/worker-<rank>.npz``: the final parameters (``param:*``),
the per-step losses and the indices of the skipped steps, the local and aggregated gradients of the
first layer's weight at :data:`GRAD_STEPS`, the accuracy on the whole data set, the rank and the
number of workers.
"""
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.distributed import kvstore

NUM_SAMPLES, NUM_FEATURES = 512, 8
BATCH_SIZE = 16  # per worker
NUM_STEPS = 40
INF_STEP = 12
#: Steps whose local and aggregated gradients are recorded: the first, the second (a server that
#: accumulated instead of replacing its sums would show there) and the last.
GRAD_STEPS = (0, 1, NUM_STEPS - 1)
DATA_SEED = 7


def make_data():
    """The same data set on every worker: labels from a fixed hyperplane, with a margin of 0.2."""
    rng = np.random.RandomState(DATA_SEED)
    x = rng.normal(size=(4 * NUM_SAMPLES, NUM_FEATURES)).astype(np.float32)
    margin = x @ rng.normal(size=NUM_FEATURES) / np.sqrt(NUM_FEATURES)
    keep = np.abs(margin) > 0.2
    return x[keep][:NUM_SAMPLES], (margin[keep][:NUM_SAMPLES] > 0).astype(np.float32)


def make_net(rank):
    """A float16 two-layer network; its initial weights differ per rank (the kvstore must
    broadcast rank 0's for the workers to agree)."""
    mx.random.seed(100 + rank)
    net = nn.HybridSequential()
    net.add(nn.Dense(16, activation="relu", in_units=NUM_FEATURES), nn.Dense(2, in_units=16))
    net.initialize(mx.init.Xavier())
    return mxfp16.cast_block(net, "float16")


def train(net, trainer, scaler, x, y, kv, record):
    """NUM_STEPS steps over this worker's shard; fills ``record`` with losses, skips, gradients."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    weight = [param for name, param in net.collect_params().items() if name.endswith("weight")][0]
    for step in range(NUM_STEPS):
        start = (step * BATCH_SIZE) % (len(x) - BATCH_SIZE + 1)
        data = x[start:start + BATCH_SIZE].copy()
        if step == INF_STEP and kv.rank == 0:
            data[0, 0] = np.inf
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(data)), mx.nd.array(y[start:start + BATCH_SIZE]))
            scaled = scaler.scale(loss)
        scaled.backward()
        if step in GRAD_STEPS:
            record["local_grads"].append(weight.grad().asnumpy().copy())
        if not scaler.step(trainer, batch_size=BATCH_SIZE * kv.num_workers):
            record["skipped"].append(step)
        if step == 0:
            record["start_scale"] = scaler.loss_scale
        if step in GRAD_STEPS:
            record["aggregated_grads"].append(weight.grad().asnumpy().copy())
        record["losses"].append(float(loss.mean().asscalar()))


def main(out_dir):
    kv = mx.kv.create("dist_sync")
    x, y = make_data()
    shard_x, shard_y = x[kv.rank::kv.num_workers], y[kv.rank::kv.num_workers]
    net = make_net(kv.rank)
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float16", kvstore=kv,
                                  learning_rate=0.5, momentum=0.9)
    kvstore.sync_initial_weights(trainer)
    # The start measured from the first step's gradients, summed over the workers.
    scaler = mxfp16.DynamicLossScaler(init_scale="auto", growth_interval=10)
    record = {"losses": [], "skipped": [], "local_grads": [], "aggregated_grads": []}
    train(net, trainer, scaler, shard_x, shard_y, kv, record)
    accuracy = float((net(mx.nd.array(x)).asnumpy().argmax(axis=1) == y).mean())
    params = {f"param:{name}": param.data().asnumpy() for name, param in
              net.collect_params().items()}
    np.savez(f"{out_dir}/worker-{kv.rank}.npz", losses=record["losses"], skipped=record["skipped"],
             local_grads=record["local_grads"], aggregated_grads=record["aggregated_grads"],
             accuracy=accuracy, rank=kv.rank, num_workers=kv.num_workers,
             loss_scale=scaler.loss_scale, start_scale=record["start_scale"], **params)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
