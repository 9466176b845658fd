"""Shared pieces of the sequence benchmarks: the character-level language model and its corpus (the
docstrings of Python's standard library), batches of sequences and the perplexity.

Imported as a sibling module, like ``bench_common``.
"""
import math

import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn, rnn

from bench_common import stdlib_text

#: Fraction of the corpus (its start) used for training; the rest is the validation text.
TRAIN_FRACTION = 0.9


class CharLM(gluon.HybridBlock):
    """Embedding -> LSTM -> Dense over the vocabulary at every time step."""

    def __init__(self, vocab_size, hidden, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = nn.Embedding(vocab_size, 64)
            self.lstm = rnn.LSTM(hidden, layout="NTC")
            self.decoder = nn.Dense(vocab_size, flatten=False)

    def hybrid_forward(self, F, data):
        return self.decoder(self.lstm(self.embedding(data)))


def corpus(num_chars):
    """``(train ids, validation ids, vocabulary size)`` of the first ``num_chars`` characters."""
    text = stdlib_text(num_chars)
    index = {c: i for i, c in enumerate(sorted(set(text)))}
    ids = np.array([index[c] for c in text], dtype=np.float32)
    vocab_size = int(math.ceil(len(index) / 8) * 8)  # a multiple of 8, as for Tensor Cores
    split = int(len(ids) * TRAIN_FRACTION)
    return ids[:split], ids[split:], vocab_size


def sequences(ids, seq_len):
    """``(inputs, next characters)``: non-overlapping rows of ``seq_len`` characters."""
    count = (len(ids) - 1) // seq_len
    return (ids[:count * seq_len].reshape(count, seq_len),
            ids[1:count * seq_len + 1].reshape(count, seq_len))


def perplexity(net, data, label, batch_size):
    """exp of the mean cross-entropy per character over every row of ``data``."""
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    total = 0.0
    for start in range(0, len(data), batch_size):
        loss = loss_fn(net(mx.nd.array(data[start:start + batch_size])),
                       mx.nd.array(label[start:start + batch_size]))
        total += float(loss.sum().asscalar()) * data.shape[1]
    return math.exp(total / data.size)
