"""Train a small GluonNLP BERT classifier in float16 (or bfloat16) with mxfp16.

The task is made from text on every machine: sentences of the docstrings of a few Python
standard-library modules, each labelled by its module (which module's documentation is this
sentence from?).  The model is GluonNLP 0.10's ``BERTModel`` built from scratch (no pretrained
download) under its ``BERTClassifier``, called as GluonNLP's fine-tuning scripts call it:
``net(token_ids, token_types, valid_length)``.  Install GluonNLP with ``pip install -e ".[nlp]"``.

    python examples/bert_classifier.py --dtype float16
    python examples/bert_classifier.py --dtype float16 --gpus 0 --num-layers 4 --units 256

It ends with one line: ``bert_classifier: dtype=float16 ... val_acc=...``.
"""
import math
import re
import time
from collections import Counter

import gluonnlp as nlp
import mxnet as mx
import numpy as np
from mxnet import autograd, gluon

import mxfp16
from common import UsageError, check_positive, devices, fit, make_parser, run, stdlib_docstrings

#: The modules whose sentences are the classes: documentation of different subjects.
CLASSES = ("json", "logging", "subprocess", "threading")

PAD, UNK, CLS = "[PAD]", "[UNK]", "[CLS]"


def get_args_parser():
    parser = make_parser(__doc__.split("\n\n")[0], epochs=10, batch_size=32, lr=0.001)
    add = parser.add_argument
    add("--num-layers", type=int, default=2, help="Transformer layers (default: 2)")
    add("--units", type=int, default=64, help="model width (default: 64)")
    add("--hidden-size", type=int, default=128, help="feed-forward width (default: 128)")
    add("--num-heads", type=int, default=4, help="attention heads (default: 4)")
    add("--max-len", type=int, default=32, help="tokens per sentence, [CLS] included (default: 32)")
    add("--vocab-size", type=int, default=2000,
        help="most frequent words kept, padded to a multiple of 8 (default: 2000)")
    add("--dropout", type=float, default=0.1, help="dropout (default: 0.1)")
    return parser


def load_sentences():
    """(words, label) pairs: the sentences of 4 words or more of each module in CLASSES."""
    samples = []
    for name, doc in stdlib_docstrings(CLASSES):
        for sentence in re.split(r"(?<=[.!?:])\s+|\n\s*\n", doc):
            words = re.findall(r"[a-z]+|[0-9]+|[^\sa-z0-9]", sentence.lower())
            if len(words) >= 4:
                samples.append((words, CLASSES.index(name)))
    return samples


def make_vocab(samples, size, multiple=8):
    """Word -> id: the special tokens, then the most frequent words; the size a multiple of 8."""
    counts = Counter(word for words, _ in samples for word in words)
    size = int(math.ceil(size / multiple) * multiple)
    words = [PAD, UNK, CLS] + [word for word, _ in counts.most_common(size - 3)]
    return {word: index for index, word in enumerate(words)}, size


def encode(samples, vocab, max_len):
    """Token ids (N, max_len), token types (N, max_len), valid lengths (N,) and labels (N,)."""
    tokens = np.zeros((len(samples), max_len), dtype=np.float32)  # PAD is 0
    lengths = np.zeros(len(samples), dtype=np.float32)
    for row, (words, _) in enumerate(samples):
        ids = [vocab[CLS]] + [vocab.get(word, vocab[UNK]) for word in words][:max_len - 1]
        tokens[row, :len(ids)] = ids
        lengths[row] = len(ids)
    labels = np.array([label for _, label in samples], dtype=np.float32)
    return tokens, np.zeros_like(tokens), lengths, labels


def build_model(args, vocab_size):
    encoder = nlp.model.BERTEncoder(num_layers=args.num_layers, units=args.units,
                                    hidden_size=args.hidden_size, max_length=args.max_len,
                                    num_heads=args.num_heads, dropout=args.dropout)
    bert = nlp.model.BERTModel(encoder, vocab_size=vocab_size, token_type_vocab_size=2,
                               units=args.units, embed_size=args.units, use_pooler=True,
                               use_decoder=False, use_classifier=False)
    return nlp.model.BERTClassifier(bert, num_classes=len(CLASSES), dropout=args.dropout)


def train_one_epoch(net, trainer, loss_fn, train_data, ctx):
    """One pass; returns the mean loss of the steps taken."""
    total, steps = 0.0, 0
    for batch in train_data:
        parts = [gluon.utils.split_and_load(array, ctx) for array in batch]
        with autograd.record():
            losses = [loss_fn(net(tokens, types, length), label)
                      for tokens, types, length, label in zip(*parts)]
        trainer.backward(losses)
        trainer.clip_global_norm(1.0 * len(ctx))  # measured on the unscaled gradients
        if trainer.step(batch[0].shape[0]):
            total += sum(loss.mean().asscalar() for loss in losses) / len(losses)
            steps += 1
    return total / max(steps, 1)


def evaluate(net, val_data, ctx):
    metric = mx.metric.Accuracy()
    for tokens, types, length, label in val_data:
        out = net(tokens.as_in_context(ctx[0]), types.as_in_context(ctx[0]),
                  length.as_in_context(ctx[0]))
        metric.update([label], [out])
    return metric.get()[1]


def load_data(args):
    samples = load_sentences()
    order = np.random.RandomState(args.seed).permutation(len(samples))
    split = int(len(samples) * 0.8)
    train = [samples[i] for i in order[:split]]
    vocab, vocab_size = make_vocab(train, args.vocab_size)
    train_set = gluon.data.ArrayDataset(*encode(train, vocab, args.max_len))
    val_set = gluon.data.ArrayDataset(*encode([samples[i] for i in order[split:]], vocab,
                                              args.max_len))
    return (gluon.data.DataLoader(train_set, args.batch_size, shuffle=True, last_batch="discard"),
            gluon.data.DataLoader(val_set, args.batch_size), vocab_size, len(samples))


def main(argv=None):
    args = get_args_parser().parse_args(argv)
    check_positive(args, "num_epochs", "batch_size", "lr", "num_layers", "units", "hidden_size",
                   "num_heads", "vocab_size")
    if args.max_len < 2:
        raise UsageError(f"--max-len {args.max_len}: pass 2 or more ([CLS] and one word)")
    if args.units % args.num_heads:
        raise UsageError(f"--units {args.units} is not a multiple of --num-heads {args.num_heads}: "
                         "each head takes units / num_heads")
    ctx = devices(args.gpus, args.cpus)
    mx.random.seed(args.seed)
    np.random.seed(args.seed)  # the DataLoader shuffles with numpy
    train_data, val_data, vocab_size, num_samples = load_data(args)

    net = build_model(args, vocab_size)
    net.initialize(mx.init.Normal(0.02), ctx=ctx)
    net.hybridize(static_alloc=True)
    # called as before: net(tokens, token_types, valid_length); LayerNorm, softmax and the loss
    # stay float32
    net = mxfp16.cast_block(net, args.dtype)
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": args.lr},
                             dtype=args.dtype)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    start = time.time()
    train_loss, val_acc = fit(train_one_epoch, evaluate, args.num_epochs, net, trainer, loss_fn,
                              train_data, val_data, ctx)
    print(f"bert_classifier: dtype={args.dtype} epochs={args.num_epochs} sentences={num_samples} "
          f"classes={len(CLASSES)} train_loss={train_loss:.3f} val_acc={val_acc:.3f} "
          f"loss_scale={trainer.loss_scale:g} skipped={trainer.num_skipped} "
          f"time={time.time() - start:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(run(main))
