"""When float16 fails on a model of your own: the warning, the report, the fix, float32's loss.

The model is the self-attention a new user writes first: its scores are not divided by sqrt(d),
and its inputs are not normalized (standard deviation 80), so the scores reach about 1.6e5 in
float32, beyond float16's largest value, 65504, while every other activation stays below a few
hundred.  The script trains it four ways, each from the same starting weights, for --num-epochs Adam
steps on the same batch of sequences (the data set: one batch, an epoch one step):

1. float16, cast whole (``mxfp16.cast_block(net, 'float16')``): the loss is NaN from the first step;
   ``mxfp16.Trainer`` logs one warning at that step, naming the scores' block and the fix;
2. ``mxfp16.find_overflow(net, x, label=y, loss_fn=loss_fn)`` on the batch: the report, forward and
   backward;
3. float16 with the fix, ``cast_block(net, 'float16', keep_float32=report.keep_float32)``: the
   attention block runs in float32, the rest in float16;
4. float32, for reference.

    python examples/overflow_debugging.py                 # about 20 s on 2 cores

It ends with one line: ``overflow_debugging: culprits=... keep_float32=[...] float16_loss=nan
fixed_loss=... float32_loss=... skipped=...`` (``skipped`` is the fixed run's, 0).
"""
import logging

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from common import UsageError, check_positive, devices, make_parser, run


class SelfAttention(nn.HybridBlock):
    """Single-head self-attention whose scores are not divided by sqrt(d)."""

    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(width, flatten=False, use_bias=False)
            self.key = nn.Dense(width, flatten=False, use_bias=False)
            self.value = nn.Dense(width, flatten=False, use_bias=False)

    def hybrid_forward(self, F, x):
        scores = F.batch_dot(self.query(x), self.key(x), transpose_b=True)  # no / sqrt(d)
        return F.batch_dot(F.softmax(scores, axis=-1), self.value(x))


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=60, batch_size=16, lr=0.003)
    add = parser.add_argument
    add("--length", type=int, default=16, help="steps of each sequence (default: 16)")
    add("--width", type=int, default=32, help="features of each step (default: 32)")
    add("--input-std", type=float, default=80.0,
        help="standard deviation of the inputs (default: 80; about 20 and below fit float16)")
    return parser


def float32_network(args, seed, ctx):
    """Self-attention and a Dense output, its weights from ``seed`` (the output's small, so the
    loss starts at the targets' variance)."""
    mx.random.seed(seed)
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(SelfAttention(args.width), nn.Dense(1, flatten=False))
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net[1].initialize(mx.init.Normal(0.001), ctx=ctx, force_reinit=True)
    return net


def data(args, ctx):
    """``--batch-size`` sequences of ``--input-std``, and as targets what another network of the
    same kind (seed + 1) makes of them, scaled to a standard deviation of 0.3: the data set is this
    one batch, and an epoch one Adam step on it."""
    rng = np.random.RandomState(args.seed)
    x = mx.nd.array(rng.randn(args.batch_size, args.length, args.width) * args.input_std, ctx=ctx)
    teacher = float32_network(args, args.seed + 1, ctx)
    teacher[1].initialize(mx.init.Xavier(), ctx=ctx, force_reinit=True)
    y = teacher(x)
    return x, y * (0.3 / float(y.asnumpy().std()))


def network(args, x, dtype, keep_float32=None):
    """The float32 network from the seed's weights, cast to ``dtype`` (with ``keep_float32``)."""
    net = float32_network(args, args.seed, x.context)
    net(x)  # the shapes
    if dtype != "float32":
        net = mxfp16.cast_block(net, dtype, keep_float32=keep_float32)
    net.hybridize()
    return net


def train(net, dtype, x, y, args):
    """``--num-epochs`` Adam steps; the Trainer and the final loss on the batch."""
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr},
                             dtype=dtype)
    loss_fn = gluon.loss.L2Loss()
    for _ in range(args.num_epochs):
        with autograd.record():
            loss = loss_fn(net(x), y)
        trainer.backward(loss)
        trainer.step(x.shape[0])
    return trainer, float(loss_fn(net(x), y).mean().asscalar())


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "length", "width", "input_std", "lr")
    if args.dtype != "float16":
        raise UsageError(f"--dtype {args.dtype}: the example shows a float16 overflow, and "
                         f"{args.dtype} has float32's range; use --dtype float16")
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    x, y = data(args, devices(args.gpus, args.cpus)[0])
    print("1. float16, the whole network cast:")
    trainer, float16_loss = train(network(args, x, "float16"), "float16", x, y, args)
    print(f"   loss {float16_loss:.4f} after {args.num_epochs} steps, {trainer.num_skipped} "
          "skipped")
    print("2. mxfp16.find_overflow on the batch, with the loss:")
    report = mxfp16.find_overflow(network(args, x, "float16"), x, label=y,
                                  loss_fn=gluon.loss.L2Loss())
    print("\n".join("   " + line for line in str(report).splitlines()))
    if not report.keep_float32:
        raise UsageError(f"--input-std {args.input_std:g}: float16 does not overflow on this "
                         "batch (nothing to fix); raise it (the default 80 overflows)")
    print(f"3. float16 with keep_float32={report.keep_float32!r}:")
    fixed = network(args, x, "float16", keep_float32=report.keep_float32)
    trainer, fixed_loss = train(fixed, "float16", x, y, args)
    print(f"   loss {fixed_loss:.4f}, {trainer.num_skipped} skipped")
    _, float32_loss = train(network(args, x, "float32"), "float32", x, y, args)
    print(f"4. float32: loss {float32_loss:.4f}")
    print(f"overflow_debugging: culprits={len(report.culprits)} "
          f"keep_float32={report.keep_float32!r} float16_loss={float16_loss:.4f} "
          f"fixed_loss={fixed_loss:.4f} float32_loss={float32_loss:.4f} "
          f"skipped={trainer.num_skipped}")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
