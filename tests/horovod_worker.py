"""A rank of tests/test_horovod.py: float16 training with dynamic loss scaling on Horovod, through
``mxfp16.Trainer`` (Gluon) and ``mxfp16.module_step`` (Module), in one process.

    horovodrun -np 2 -H localhost:2 --gloo python tests/horovod_worker.py OUT_DIR [--die-at STEP]
    python tests/horovod_worker.py OUT_DIR          # the single-process reference (no Horovod)

Every step takes the global batch ``x[start:start + GLOBAL_BATCH]``; rank ``r`` of ``n`` trains on
its ``r``-th slice, the reference on all of it, so both see the same samples per step.  Initial
weights differ per rank (Horovod must broadcast rank 0's).  At :data:`INF_STEP` one sample of rank
1's slice is inf: only rank 1's local gradients overflow.  The Gluon Trainer clips by global norm.
Writes ``OUT_DIR/<api>-rank<r>-of<n>.npz``: final weights (``param:*``, float16 as trained, and
``master:*``, the float32 master weights for Gluon), skipped steps, the loss scale after each step,
the global norms measured, and (Gluon) the bytes the kvstore allreduced; under Horovod also
``compressed-rank<r>.npy``, float32 values summed with Horovod's fp16 compression, and
``gan-rank<r>.npz``, two Trainers' weights and the error of sharing a kvstore.
"""
import argparse
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
import mxfp16.distributed.horovod
from mxfp16 import module as mxmodule
from mxfp16 import mxnet_internals

NUM_SAMPLES, NUM_FEATURES, HIDDEN = 512, 8, 16
GLOBAL_BATCH = 32
NUM_STEPS = 16
INF_STEP = 6
OVERFLOW_RANK = 1
MAX_NORM = 2.0
DATA_SEED = 7


def make_data():
    """A linearly separable problem, the same on every rank."""
    rng = np.random.RandomState(DATA_SEED)
    x = rng.normal(size=(NUM_SAMPLES, NUM_FEATURES)).astype(np.float32)
    y = (x @ rng.normal(size=NUM_FEATURES) > 0).astype(np.float32)
    return x, y


def batches(x, y, rank, size):
    """This rank's slice of each step's global batch; inf in rank 1's slice at INF_STEP."""
    local = GLOBAL_BATCH // size
    for step in range(NUM_STEPS):
        start = (step * GLOBAL_BATCH) % (NUM_SAMPLES - GLOBAL_BATCH + 1)
        data = x[start:start + GLOBAL_BATCH].copy()
        if step == INF_STEP:
            data[OVERFLOW_RANK * (GLOBAL_BATCH // 2), 0] = np.inf
        label = y[start:start + GLOBAL_BATCH]
        yield step, data[rank * local:(rank + 1) * local], label[rank * local:(rank + 1) * local]


def compressed_values(rank):
    """float32 values that float16 rounds: 1/3 and 1/7 scaled per rank, and 70000 (> float16's max
    once summed)."""
    return np.array([(rank + 1) / 3, (rank + 1) / 7, 40000.0], dtype=np.float32)


def scaler():
    return mxfp16.DynamicLossScaler(init_scale="auto", growth_interval=4)


def train_gluon(kv, x, y, rank, size, die_at):
    mx.random.seed(100 + rank)
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(HIDDEN, activation="relu", in_units=NUM_FEATURES), nn.Dense(2, in_units=HIDDEN))
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5, "momentum": 0.9},
                             kvstore=kv, dtype="float16", loss_scale=scaler())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    record = {"skipped": [], "scales": [], "norms": []}
    for step, data, label in batches(x, y, rank, size):
        if step == die_at and rank == 1:
            os._exit(3)
        with autograd.record():
            loss = loss_fn(net(mx.nd.array(data)), mx.nd.array(label))
        trainer.backward(loss)
        record["norms"].append(trainer.clip_global_norm(MAX_NORM))
        if not trainer.step(GLOBAL_BATCH):
            record["skipped"].append(step)
        record["scales"].append(trainer.loss_scale)
    params = {f"param:{name}": p.data().asnumpy() for name, p in net.collect_params().items()}
    updater = mxnet_internals.trainer_updaters(trainer)[0]
    masters = {f"master:{index}": state[0].asnumpy() for index, state in updater.states.items()}
    return record, dict(params, **masters)


def train_module(kv, x, y, rank, size):
    mx.random.seed(200 + rank)
    data = mx.sym.var("data")
    hidden = mx.sym.relu(mx.sym.FullyConnected(data, num_hidden=HIDDEN, name="fc1"))
    logits = mx.sym.FullyConnected(hidden, num_hidden=2, name="fc2")
    sym = mxfp16.cast_symbol(mx.sym.SoftmaxOutput(logits, name="softmax"), "float16")
    loss_scaler = scaler()
    module = mxfp16.make_scaled_module(sym, loss_scaler)
    module.bind(data_shapes=[("data", (GLOBAL_BATCH // size, NUM_FEATURES))],
                label_shapes=[("softmax_label", (GLOBAL_BATCH // size,))])
    module.init_params(mx.init.Xavier())
    optimizer = mxfp16.make_optimizer("sgd", "float16", learning_rate=0.5, momentum=0.9)
    mxmodule.init_optimizer(module, optimizer, kv)
    record = {"skipped": [], "scales": [], "norms": []}
    for step, batch_x, batch_y in batches(x, y, rank, size):
        batch = mx.io.DataBatch([mx.nd.array(batch_x)], [mx.nd.array(batch_y)])
        if not mxmodule.module_step(module, batch, loss_scaler, optimizer, GLOBAL_BATCH,
                                    kvstore=kv):
            record["skipped"].append(step)
        record["scales"].append(loss_scaler.loss_scale)
    arg_params, _ = module.get_params()
    return record, {f"param:{name}": value.asnumpy() for name, value in arg_params.items()}


def train_two_trainers(rank):
    """A GAN's two Trainers (float32: no loss scaler waits between them), each with a kvstore of
    its own prefix; then the error of a third Trainer on the first one's kvstore."""
    mx.random.seed(300 + rank)
    nets = [nn.Dense(16, in_units=16), nn.Dense(16, in_units=16)]
    kvstores = [mxfp16.distributed.horovod.Horovod(prefix=prefix) for prefix in ("generator.", "discrim.")]
    trainers = []
    for net, kvstore in zip(nets, kvstores):
        net.initialize()
        trainers.append(mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                       kvstore=kvstore, dtype="float32"))
    for _ in range(10):
        for net, trainer in zip(nets, trainers):
            with autograd.record():
                loss = net(mx.nd.ones((4, 16)) * (rank + 1)).sum()
            trainer.backward(loss)
            trainer.step(8)
    try:
        mxfp16.Trainer(nets[1].collect_params(), "sgd", kvstore=kvstores[0])
        error = ""
    except ValueError as shared:
        error = str(shared)
    weights = {f"net{i}": net.weight.data().asnumpy() for i, net in enumerate(nets)}
    return error, weights


def main(argv=None):
    parser = argparse.ArgumentParser()
    parser.add_argument("out_dir")
    parser.add_argument("--die-at", type=int, default=-1)
    args = parser.parse_args(argv)
    under_horovod = "HOROVOD_RANK" in os.environ
    kv = mx.kv.create("horovod") if under_horovod else "device"  # registered by mxfp16.distributed.horovod
    rank, size = (kv.rank, kv.num_workers) if under_horovod else (0, 1)
    x, y = make_data()
    if under_horovod:  # float32 values sent with Horovod's fp16 compression
        compressed = mxfp16.distributed.horovod.Horovod(compression="fp16")
        values = mx.nd.array(compressed_values(rank))
        compressed.pushpull("compressed", values)
        np.save(os.path.join(args.out_dir, f"compressed-rank{rank}.npy"), values.asnumpy())
    if under_horovod:
        error, weights = train_two_trainers(rank)
        np.savez(os.path.join(args.out_dir, f"gan-rank{rank}.npz"), error=error, **weights)
    for api in ("gluon", "module"):
        if api == "gluon":
            record, arrays = train_gluon(kv, x, y, rank, size, args.die_at)
            record["bytes"] = kv.bytes_allreduced if under_horovod else 0
        else:
            record, arrays = train_module(kv, x, y, rank, size)
        np.savez(os.path.join(args.out_dir, f"{api}-rank{rank}-of{size}.npz"),
                 skipped=record["skipped"], scales=record["scales"], norms=record["norms"],
                 bytes=record.get("bytes", 0), **arrays)
    return 0


if __name__ == "__main__":
    sys.exit(main())
