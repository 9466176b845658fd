"""A float16 training loop of your own that survives preemption: SIGTERM or Ctrl-C saves and exits,
and running the same command again continues exactly where it stopped.

The model is a small MLP with dropout on scikit-learn's handwritten digits (no download), cast with
``mxfp16.cast_block`` and trained by an ``mxfp16.Trainer`` with dynamic loss scaling.  The lines
that make it preemptible:

* ``mxfp16.StopRequest()`` around the loop: a signal sets ``stop.requested`` instead of killing;
* ``mxfp16.seed_step(seed, step)`` first in every step: the step's random draws (dropout) depend on
  the step only;
* ``mxfp16.save_training_state(...)`` every ``--save-every`` steps and on a stop;
* ``mxfp16.load_training_state(...)`` at the start when ``--prefix`` has a state.

    python examples/preemptible_loop.py --dtype float16            # Ctrl-C it, run it again

It ends with one line: ``preemptible_loop: dtype=float16 steps=... resumed_from=... loss=...
accuracy=...``; a stop prints ``stopped by SIGTERM after step N: saved PREFIX-SSSSSSSS; ...`` and
exits with 143 (SIGTERM) or 130 (SIGINT).
"""
import os
import sys

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn
from sklearn.datasets import load_digits

import mxfp16
from common import check_positive, devices, make_parser, run


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=8, batch_size=64, lr=0.05)
    parser.add_argument("--prefix", default=os.path.join("runs", "preemptible", "state"),
                        help="where the training states go; an existing one is resumed "
                        "(default: runs/preemptible/state)")
    parser.add_argument("--save-every", type=int, default=20,
                        help="save the state every N steps (default: 20)")
    parser.add_argument("--log-every", type=int, default=10,
                        help="print the loss every N steps (default: 10)")
    return parser


def build(args, ctx):
    """The network and its Trainer, built the same way in every run (the state fits them)."""
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(128, activation="relu", in_units=64), nn.Dropout(0.2), nn.Dense(10))
    mx.random.seed(args.seed)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net = mxfp16.cast_block(net, args.dtype)
    net.hybridize(static_alloc=True, static_shape=len(ctx) == 1)
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": args.lr,
                                                           "momentum": 0.9}, dtype=args.dtype)
    return net, trainer


def batches(x, y, batch_size, seed, epoch):
    """The epoch's batches, shuffled by a generator of (seed, epoch): the same in every run."""
    order = np.random.RandomState([seed, epoch]).permutation(len(x))
    for start in range(0, len(x) - batch_size + 1, batch_size):
        index = order[start:start + batch_size]
        yield mx.nd.array(x[index]), mx.nd.array(y[index])


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "save_every", "log_every")
    ctx = devices(args.gpus, args.cpus)
    digits = load_digits()
    x, y = (digits.data / 16.0).astype("float32"), digits.target.astype("float32")
    net, trainer = build(args, ctx)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    steps_per_epoch = len(x) // args.batch_size
    step, resumed_from = 0, "none"
    if mxfp16.latest_training_state(args.prefix):  # an earlier run of this command stopped
        state = mxfp16.load_training_state(args.prefix, net, trainer)
        step, resumed_from = state.step, os.path.basename(state.name)
        print(f"resumed {state.name}: step {step}, loss scale {trainer.loss_scale:g}")
    with mxfp16.StopRequest() as stop:
        for epoch in range(step // steps_per_epoch, args.num_epochs):
            for index, (data, label) in enumerate(batches(x, y, args.batch_size, args.seed, epoch)):
                if epoch * steps_per_epoch + index < step:
                    continue  # done before the stop
                mxfp16.seed_step(args.seed, step)
                parts = gluon.utils.split_and_load(data, ctx)
                labels = gluon.utils.split_and_load(label, ctx)
                with autograd.record():
                    losses = [loss_fn(net(d), t) for d, t in zip(parts, labels)]
                trainer.backward(losses)
                trainer.step(args.batch_size)
                step += 1
                if step % args.log_every == 0:
                    mean = sum(float(loss.mean().asscalar()) for loss in losses) / len(losses)
                    print(f"step {step} loss {mean:.4f} loss scale {trainer.loss_scale:g}",
                          flush=True)
                if stop.requested or step % args.save_every == 0:
                    name = mxfp16.save_training_state(args.prefix, step, net, trainer,
                                                      extra={"epoch": epoch})
                if stop.requested:
                    print(f"stopped by {stop.signal_name} after step {step}: saved {name}; run "
                          "the same command again to resume", flush=True)
                    return stop.exit_code
    mxfp16.save_training_state(args.prefix, step, net, trainer, extra={"epoch": args.num_epochs})
    with autograd.predict_mode():
        scores = net(mx.nd.array(x).as_in_context(ctx[0]))
    accuracy = float((scores.argmax(axis=1) == mx.nd.array(y, ctx=ctx[0])).mean().asscalar())
    loss = float(loss_fn(scores, mx.nd.array(y, ctx=ctx[0])).mean().asscalar())
    print(f"preemptible_loop: dtype={args.dtype} steps={step} resumed_from={resumed_from} "
          f"loss={loss:.4f} accuracy={accuracy:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(run(main))
