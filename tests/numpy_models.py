"""Seven model families of "Dive into Deep Learning" (MXNet edition), written for MXNet's NumPy
interface as the book writes them (``F.npx.*``, ``F.np.*``), at tiny sizes: the networks
tests/test_numpy_interface.py casts, trains and checkpoints.

Each :class:`Family` builds its float32 network, a batch of inputs (``mx.np`` arrays) and the
loss of the network's outputs on that batch.  Build and call them with the NumPy interface on
(``npx.set_np()``).  The recurrent families pass their begin states explicitly: a hybridized
Gluon RNN layer called without states builds zero-batch states in numpy shape semantics.
"""
import math
from collections import namedtuple

import numpy as onp

from mxnet import gluon, np, npx
from mxnet.gluon import nn, rnn

from conftest import load_example

#: ``build()`` -> float32 network, ``batch()`` -> (inputs, targets), ``loss(outputs, targets)``.
Family = namedtuple("Family", ["build", "batch", "loss"])

VOCAB, STEPS, BATCH, HIDDEN = 12, 8, 4, 16
_ce = gluon.loss.SoftmaxCrossEntropyLoss()


class MLP(nn.HybridBlock):
    """d2l's multilayer perceptron with its hidden activation through ``F.npx.relu``."""

    def __init__(self, hidden=HIDDEN, outputs=4, **kwargs):
        super().__init__(**kwargs)
        self.hidden = nn.Dense(hidden)
        self.output = nn.Dense(outputs)

    def hybrid_forward(self, F, X):
        return self.output(F.npx.relu(self.hidden(X)))


def lenet(classes=4):
    """d2l's LeNet: sigmoid convolutions and average pooling."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(6, kernel_size=5, padding=2, activation="sigmoid"), nn.AvgPool2D(2, 2),
            nn.Conv2D(16, kernel_size=5, activation="sigmoid"), nn.AvgPool2D(2, 2),
            nn.Dense(32, activation="sigmoid"), nn.Dense(24, activation="sigmoid"),
            nn.Dense(classes))
    return net


#: d2l's residual block (two 3x3 convolutions with BatchNorm, an optional 1x1 shortcut): the one
#: examples/numpy_interface.py trains, so the tests cast the example's own block.
Residual = load_example("numpy_interface").Residual


def resnet(classes=4):
    """A small ResNet of d2l's residual blocks."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            Residual(8), Residual(16, use_1x1conv=True, strides=2),
            nn.GlobalAvgPool2D(), nn.Dense(classes))
    return net


class RNNModel(nn.HybridBlock):
    """d2l's recurrent language model: one-hot tokens, an LSTM, a dense output per step;
    ``net(X, state)`` returns ``(output, state)`` to carry into the next batch."""

    def __init__(self, vocab_size=VOCAB, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        self.rnn = rnn.LSTM(hidden)
        self.dense = nn.Dense(vocab_size, flatten=False)

    def hybrid_forward(self, F, inputs, state):
        X = F.npx.one_hot(inputs.T, self.vocab_size)
        Y, state = self.rnn(X, state)
        return self.dense(Y), state

    def begin_state(self, *args, **kwargs):
        return self.rnn.begin_state(*args, **kwargs)


class Seq2Seq(nn.HybridBlock):
    """d2l's GRU encoder-decoder: the decoder starts from the encoder's final state and reads it
    as context at every step."""

    def __init__(self, vocab=VOCAB, embed=8, hidden=HIDDEN, **kwargs):
        super().__init__(**kwargs)
        self.enc_embedding = nn.Embedding(vocab, embed)
        self.enc_rnn = rnn.GRU(hidden)
        self.dec_embedding = nn.Embedding(vocab, embed)
        self.dec_rnn = rnn.GRU(hidden)
        self.dense = nn.Dense(vocab, flatten=False)

    def hybrid_forward(self, F, enc_X, dec_X, enc_state):
        _, state = self.enc_rnn(self.enc_embedding(enc_X).swapaxes(0, 1), enc_state)
        X = self.dec_embedding(dec_X).swapaxes(0, 1)
        context = state[0] + F.np.zeros_like(X[:, :, :1])
        out, _ = self.dec_rnn(F.np.concatenate((X, context), axis=2), state)
        return self.dense(out).swapaxes(0, 1)


def masked_softmax(F, scores, valid_lens):
    """d2l's masked softmax: keys past each query's valid length get -1e6 before the softmax."""
    masked = F.npx.sequence_mask(scores.swapaxes(1, 2), valid_lens, use_sequence_length=True,
                                 value=-1e6, axis=1)
    return F.npx.softmax(masked.swapaxes(1, 2), axis=-1)


class MultiHeadAttention(nn.HybridBlock):
    """d2l's multi-head scaled dot-product attention with valid lengths."""

    def __init__(self, num_hiddens, num_heads, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = num_heads
        self.W_q, self.W_k, self.W_v, self.W_o = (
            nn.Dense(num_hiddens, use_bias=False, flatten=False) for _ in range(4))
        self.scale = 1 / math.sqrt(num_hiddens // num_heads)

    def _split(self, F, X):
        X = F.npx.reshape(X, (-2, -2, self.num_heads, -1)).transpose(0, 2, 1, 3)
        return F.npx.reshape(X, (-5, -2, -2))

    def hybrid_forward(self, F, queries, keys, values, valid_lens):
        q, k, v = (self._split(F, W(X)) for W, X in
                   ((self.W_q, queries), (self.W_k, keys), (self.W_v, values)))
        scores = F.npx.batch_dot(q, k, transpose_b=True) * self.scale
        weights = masked_softmax(F, scores, F.np.repeat(valid_lens, self.num_heads))
        out = F.npx.reshape(F.npx.batch_dot(weights, v), (-6, -1, self.num_heads, -2, -2))
        return self.W_o(F.npx.reshape(out.transpose(0, 2, 1, 3), (-2, -2, -5)))


class EncoderBlock(nn.HybridBlock):
    """d2l's Transformer encoder block: attention and a position-wise FFN, each add & norm."""

    def __init__(self, num_hiddens=HIDDEN, ffn_hiddens=32, num_heads=2, **kwargs):
        super().__init__(**kwargs)
        self.attention = MultiHeadAttention(num_hiddens, num_heads)
        self.ln1, self.ln2 = nn.LayerNorm(), nn.LayerNorm()
        self.dense1 = nn.Dense(ffn_hiddens, flatten=False, activation="relu")
        self.dense2 = nn.Dense(num_hiddens, flatten=False)

    def hybrid_forward(self, F, X, valid_lens):
        Y = self.ln1(self.attention(X, X, X, valid_lens) + X)
        return self.ln2(self.dense2(self.dense1(Y)) + Y)


class TransformerEncoder(nn.HybridBlock):
    """d2l's Transformer encoder (learned positions, as BERT's), mean-pooled into a classifier."""

    def __init__(self, classes=2, layers=2, **kwargs):
        super().__init__(**kwargs)
        self.embedding = nn.Embedding(VOCAB, HIDDEN)
        self.pos_embedding = self.params.get("pos_embedding", shape=(1, STEPS, HIDDEN))
        self.blks = nn.HybridSequential()
        for _ in range(layers):
            self.blks.add(EncoderBlock())
        self.output = nn.Dense(classes)

    def hybrid_forward(self, F, X, valid_lens, pos_embedding):
        X = self.embedding(X) * math.sqrt(HIDDEN) + pos_embedding
        for blk in self.blks:
            X = blk(X, valid_lens)
        return self.output(F.np.mean(X, axis=1))


class BERTModel(nn.HybridBlock):
    """d2l's BERT: the encoder, the masked-LM head (on the positions to predict, gathered by a
    one-hot batch_dot, which hybridizes) and the next-sentence head on the first token."""

    def __init__(self, layers=2, **kwargs):
        super().__init__(**kwargs)
        self.token_embedding = nn.Embedding(VOCAB, HIDDEN)
        self.segment_embedding = nn.Embedding(2, HIDDEN)
        self.pos_embedding = self.params.get("pos_embedding", shape=(1, STEPS, HIDDEN))
        self.blks = nn.HybridSequential()
        for _ in range(layers):
            self.blks.add(EncoderBlock())
        self.mlm = nn.HybridSequential()
        self.mlm.add(nn.Dense(HIDDEN, flatten=False, activation="relu"), nn.LayerNorm(),
                     nn.Dense(VOCAB, flatten=False))
        self.hidden = nn.Dense(HIDDEN, activation="tanh")
        self.nsp = nn.Dense(2)

    def hybrid_forward(self, F, tokens, segments, valid_lens, pred_positions, pos_embedding):
        X = self.token_embedding(tokens) + self.segment_embedding(segments) + pos_embedding
        for blk in self.blks:
            X = blk(X, valid_lens)
        picked = F.npx.batch_dot(F.npx.one_hot(pred_positions, STEPS), X)
        return self.mlm(picked), self.nsp(self.hidden(X[:, 0, :]))


def _tokens(shape, seed):
    return np.array(onp.random.RandomState(seed).randint(1, VOCAB, size=shape), dtype="float32")


def _classes(batch, count=4):
    return np.array([i % count for i in range(batch)], dtype="float32")


def _lm_batch():
    tokens = _tokens((BATCH, STEPS + 1), 1)
    state = [np.zeros((1, BATCH, HIDDEN)), np.zeros((1, BATCH, HIDDEN))]
    return (tokens[:, :-1], state), tokens[:, 1:]


def _lm_loss(outputs, Y):
    output, _ = outputs
    return _ce(output, Y.T)


def _seq2seq_batch():
    source, target = _tokens((BATCH, STEPS), 2), _tokens((BATCH, STEPS), 3)
    valid = np.array([8, 5, 3, 6], dtype="float32")
    return (source, target, np.zeros((1, BATCH, HIDDEN))), (target, valid)


def masked_ce(pred, targets):
    """d2l's MaskedSoftmaxCELoss: cross-entropy of the steps within each valid length."""
    label, valid_len = targets
    weights = npx.sequence_mask(np.expand_dims(np.ones_like(label), axis=-1), valid_len, True,
                                axis=1)
    return _ce(pred, label, weights)


def _transformer_batch():
    valid = np.array([3, 8, 5, 1], dtype="float32")
    return (_tokens((BATCH, STEPS), 4), valid), _classes(BATCH, 2)


def _bert_batch():
    tokens = _tokens((BATCH, STEPS), 5)
    segments = np.array([[0] * 4 + [1] * 4] * BATCH, dtype="float32")
    valid = np.array([8, 6, 7, 5], dtype="float32")
    positions = np.array([[1, 2], [3, 4], [2, 5], [1, 3]], dtype="float32")
    mlm_labels = _tokens((BATCH, 2), 6)
    return (tokens, segments, valid, positions), (mlm_labels, _classes(BATCH, 2))


def _bert_loss(outputs, targets):
    mlm, nsp = outputs
    return _ce(mlm, targets[0]).mean() + _ce(nsp, targets[1]).mean()


def _images(shape, seed=0):
    return np.array(onp.random.RandomState(seed).uniform(size=shape), dtype="float32")


#: The seven families, by name.
FAMILIES = {
    "mlp": Family(MLP, lambda: ((_images((BATCH * 2, 10)),), _classes(BATCH * 2)),
                  lambda out, y: _ce(out, y)),
    "lenet": Family(lenet, lambda: ((_images((BATCH, 1, 16, 16)),), _classes(BATCH)),
                    lambda out, y: _ce(out, y)),
    "resnet": Family(resnet, lambda: ((_images((BATCH, 3, 8, 8)),), _classes(BATCH)),
                     lambda out, y: _ce(out, y)),
    "lstm_lm": Family(RNNModel, _lm_batch, _lm_loss),
    "gru_seq2seq": Family(Seq2Seq, _seq2seq_batch, masked_ce),
    "transformer": Family(TransformerEncoder, _transformer_batch, lambda out, y: _ce(out, y)),
    "bert": Family(BERTModel, _bert_batch, _bert_loss),
}
