"""Train a character-level LSTM language model in float16 (or bfloat16) with mxfp16.

The text is the docstrings of Python's standard library, so nothing downloads.  The recipe is the
mixed-precision paper's language-model one: float16 weights and activations, float32 master weights,
float32 softmax and loss, dynamic loss scaling, gradient clipping by global norm of the unscaled
gradients.  The vocabulary is padded to a multiple of 8 so the output layer runs on Tensor Cores.

    python examples/lstm_language_model.py --dtype float16
    python examples/lstm_language_model.py --dtype float16 --gpus 0 --hidden-size 1024 --num-epochs 20

``--export PREFIX`` writes the trained model for deployment (``mxfp16.export``: the float32 graph
with the float32 master weights, and the float16 GPU graph; both also as ONNX files when onnx<1.19
is installed) and evaluates the float32 files reloaded as plain MXNet does, in float32 and cast to
float16.

It ends with one line: ``lstm_language_model: dtype=float16 epochs=... train_loss=... val_ppl=...``.
"""
import math
import time

import mxnet as mx
import numpy as np
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

import mxfp16
from mxfp16 import onnx_export
from common import UsageError, check_positive, devices, make_parser, run, stdlib_docstrings


class CharLM(gluon.HybridBlock):
    """Embedding -> LSTM -> a Dense decoder over the vocabulary, at every time step."""

    def __init__(self, vocab_size, embed_size, hidden_size, num_layers, dropout, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = nn.Embedding(vocab_size, embed_size)
            self.lstm = rnn.LSTM(hidden_size, num_layers, layout="NTC", dropout=dropout)
            self.decoder = nn.Dense(vocab_size, flatten=False)

    def hybrid_forward(self, F, data):
        return self.decoder(self.lstm(self.embedding(data)))


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=3, batch_size=32, lr=0.002)
    add = parser.add_argument
    add("--seq-len", type=int, default=32, help="characters per training sequence (default: 32)")
    add("--num-chars", type=int, default=0,
        help="characters of the corpus to use, 0 for all of it (about 200000) (default: 0)")
    add("--embed-size", type=int, default=64, help="embedding size (default: 64)")
    add("--hidden-size", type=int, default=256, help="LSTM hidden size (default: 256)")
    add("--num-layers", type=int, default=1, help="LSTM layers (default: 1)")
    add("--dropout", type=float, default=0.0, help="dropout between LSTM layers (default: 0)")
    add("--clip", type=float, default=1.0, help="gradient global-norm clip (default: 1)")
    add("--export", default="", help="after training, write PREFIX-symbol.json + PREFIX-0000.params "
        "(float32, plain MXNet) and PREFIX-float16-... (the float16 GPU graph) with mxfp16.export, "
        "and evaluate the float32 files reloaded, in float32 and in float16 (default: none)")
    return parser


def load_corpus(num_chars, multiple=8):
    """The corpus as character ids, the vocabulary padded to a multiple of ``multiple``."""
    text = "\n\n".join(doc for _, doc in stdlib_docstrings())
    text = "".join(c if c.isascii() else "?" for c in text)
    text = text[:num_chars] if num_chars else text
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    vocab_size = int(math.ceil(len(chars) / multiple) * multiple)
    return np.array([index[c] for c in text], dtype=np.float32), vocab_size


def sequences(ids, seq_len, batch_size, shuffle, seed=0):
    """Batches of (input, next character) sequences, as NDArrays of shape (batch, seq_len).
    Training (``shuffle``) drops the last partial batch; evaluation keeps it."""
    count = (len(ids) - 1) // seq_len
    data = ids[:count * seq_len].reshape(count, seq_len)
    label = ids[1:count * seq_len + 1].reshape(count, seq_len)
    order = np.random.RandomState(seed).permutation(count) if shuffle else np.arange(count)
    last = count - batch_size + 1 if shuffle else count
    for start in range(0, max(last, 0), batch_size):
        rows = order[start:start + batch_size]
        yield mx.nd.array(data[rows]), mx.nd.array(label[rows])


def train_one_epoch(net, trainer, loss_fn, batches, ctx, clip):
    """One pass over the batches; returns the mean training loss of the steps taken."""
    total, steps = 0.0, 0
    for data, label in batches:
        datas = gluon.utils.split_and_load(data, ctx)
        labels = gluon.utils.split_and_load(label, ctx)
        with autograd.record():
            losses = [loss_fn(net(x), y) for x, y in zip(datas, labels)]
        trainer.backward(losses)
        # clip_global_norm measures the unscaled gradients (inf when they overflowed: then
        # step() skips the update and lowers the loss scale)
        trainer.clip_global_norm(clip * len(ctx))
        if trainer.step(data.shape[0]):
            total += sum(loss.mean().asscalar() for loss in losses) / len(losses)
            steps += 1
    return total / max(steps, 1)


def evaluate(net, loss_fn, batches, ctx):
    """The mean cross-entropy per character over the batches, in nats."""
    total, count = 0.0, 0
    for data, label in batches:
        loss = loss_fn(net(data.as_in_context(ctx[0])), label.as_in_context(ctx[0]))
        total += loss.sum().asscalar()
        count += loss.size
    return total / max(count, 1)


def export_and_reload(net, prefix, loss_fn, val_batches, ctx):
    """Export the trained network, reload the float32 files as plain MXNet does, and evaluate them
    in float32 and cast to float16 (emulated on a CPU); write the float16 GPU graph from that cast.
    Returns the line the example prints."""
    symbol_file, params_file = mxfp16.export(net, prefix)  # float32 graph, float32 master weights
    plain = gluon.SymbolBlock.imports(symbol_file, ["data"], params_file, ctx=ctx[0])
    ppl32 = math.exp(evaluate(plain, loss_fn, val_batches(), ctx))
    net16 = mxfp16.cast_block(plain, "float16")
    ppl16 = math.exp(evaluate(net16, loss_fn, val_batches(), ctx))
    files16 = mxfp16.export(net16, prefix + "-float16", dtype="float16")  # the GPU graph
    where = " (emulated on CPU)" if mx.context.num_gpus() == 0 else ""
    return (f"export: {symbol_file} val_ppl={ppl32:.2f} reloaded; float16{where} "
            f"val_ppl={ppl16:.2f}; float16 GPU graph {files16[0]}; "
            + export_onnx((symbol_file, params_file), files16, prefix, next(val_batches())[0].shape))


def export_onnx(files32, files16, prefix, input_shape):
    """Both graphs as ONNX files (no BatchNorm here, so float16 exports too), checked by
    ``onnx.checker``; a note instead when onnx is not installed."""
    try:
        onnx_export.import_onnx()
    except RuntimeError as missing:
        return f"onnx: not written ({missing})"
    written = [onnx_export.export_onnx(mx.sym.load(symbol_file), mx.nd.load(params_file),
                                       f"{prefix}{suffix}.onnx", input_shape)
               for (symbol_file, params_file), suffix in ((files32, ""), (files16, "-float16"))]
    return "onnx: " + ", ".join(written) + " (checker passed)"


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "seq_len", "hidden_size", "clip")
    if args.num_chars < 0:
        raise UsageError(f"--num-chars {args.num_chars}: pass 0 for the whole corpus or a size > 0")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    ids, vocab_size = load_corpus(args.num_chars)
    split = int(len(ids) * 0.9)
    train_ids, val_ids = ids[:split], ids[split:]
    if len(train_ids) <= args.seq_len * args.batch_size or len(val_ids) <= args.seq_len:
        raise UsageError(f"--num-chars {args.num_chars} is too short for --batch-size "
                         f"{args.batch_size} x --seq-len {args.seq_len}: pass more characters (or 0 "
                         "for all) or smaller batches")

    net = CharLM(vocab_size, args.embed_size, args.hidden_size, args.num_layers, args.dropout)
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net.hybridize(static_alloc=True)
    net = mxfp16.cast_block(net, args.dtype)  # float32 returns the network unchanged
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr},
                             dtype=args.dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    start = time.time()
    for epoch in range(args.num_epochs):
        train_loss = train_one_epoch(net, trainer, loss_fn,
                                     sequences(train_ids, args.seq_len, args.batch_size, True,
                                               args.seed + epoch), ctx, args.clip)
        val_loss = evaluate(net, loss_fn, sequences(val_ids, args.seq_len, args.batch_size, False),
                            ctx)
        print(f"epoch {epoch}: train loss {train_loss:.3f}, val loss {val_loss:.3f}, "
              f"val perplexity {math.exp(val_loss):.2f}, loss scale {trainer.loss_scale:g}")
    if args.export:
        print(export_and_reload(net, args.export, loss_fn,
                                lambda: sequences(val_ids, args.seq_len, args.batch_size, False),
                                ctx))
    print(f"lstm_language_model: dtype={args.dtype} epochs={args.num_epochs} vocab={vocab_size} "
          f"train_loss={train_loss:.3f} val_ppl={math.exp(val_loss):.2f} "
          f"loss_scale={trainer.loss_scale:g} skipped={trainer.num_skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
