"""Sequence models in the report: a built-in LSTM language model, and batches of token ids.

``lstm_lm`` is the classic word-level LSTM language model (embedding, stacked LSTM, a Dense output
layer over the vocabulary, as GluonNLP's ``standard_lstm_lm_650`` and the mixed-precision paper's
bigLSTM are built), at the sizes a report asks for.  Its defaults are GluonNLP's medium model on
WikiText-2: vocabulary 33278, embedding and hidden size 650, 2 layers, 35 steps.  Those are exactly
the sizes the Tensor Core rule flags: 33278 and 650 are not multiples of 8 (33280 and 656 are).
"""
import mxnet as mx
import numpy as np
from mxnet import gluon
from mxnet.gluon import nn, rnn

#: Built-in sequence networks the report knows by name.
SEQUENCE_NETWORKS = ("lstm_lm",)

#: GluonNLP's ``standard_lstm_lm_650`` on WikiText-2, and its BPTT length.
LSTM_LM_SIZES = {"vocab_size": 33278, "embed_size": 650, "hidden_size": 650, "num_layers": 2}
DEFAULT_SEQ_LEN = 35


class LSTMLanguageModel(gluon.HybridBlock):
    """Token ids (batch, time) -> next-token logits (batch, time, vocab_size).

    Examples
    --------
    >>> import mxnet as mx
    >>> net = LSTMLanguageModel(vocab_size=10, embed_size=4, hidden_size=8, num_layers=1)
    >>> net.initialize()
    >>> net(mx.nd.zeros((2, 3))).shape
    (2, 3, 10)
    """

    def __init__(self, vocab_size, embed_size, hidden_size, num_layers, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embedding = nn.Embedding(vocab_size, embed_size)
            self.lstm = rnn.LSTM(hidden_size, num_layers, layout="NTC", input_size=embed_size)
            self.decoder = nn.Dense(vocab_size, flatten=False, in_units=hidden_size)

    def hybrid_forward(self, F, data):
        return self.decoder(self.lstm(self.embedding(data)))


def sequence_network(name, vocab_size=None, embed_size=None, hidden_size=None, num_layers=None):
    """A built-in sequence network by name, its sizes defaulting to :data:`LSTM_LM_SIZES`.

    Raises
    ------
    ValueError
        For an unknown name or a size that is not a positive whole number.

    Examples
    --------
    >>> net = sequence_network('lstm_lm', vocab_size=100)
    >>> net.decoder._units, net.lstm._hidden_size
    (100, 650)
    """
    if name not in SEQUENCE_NETWORKS:
        raise ValueError(f"unknown sequence network {name!r}: choose one of "
                         f"{', '.join(SEQUENCE_NETWORKS)}")
    given = {"vocab_size": vocab_size, "embed_size": embed_size, "hidden_size": hidden_size,
             "num_layers": num_layers}
    sizes = {key: LSTM_LM_SIZES[key] if value is None else value for key, value in given.items()}
    for key, value in sizes.items():
        if int(value) != value or value < 1:
            raise ValueError(f"{key} must be a positive whole number, got {value!r}")
    return LSTMLanguageModel(**{key: int(value) for key, value in sizes.items()})


def input_vocabulary(info):
    """The vocabulary of the first Embedding of a graph (what its token ids index).

    Raises
    ------
    ValueError
        If the graph has no Embedding: its input is not token ids.
    """
    for layer in info.layers:
        if layer.op == "Embedding":
            return layer.inputs[1].shape[0]
    raise ValueError("a sequence length was given but the network has no Embedding: the report "
                     "feeds sequences of token ids; drop --seq-len for a network on images")


def random_token_batches(batch_size, seq_len, vocab_size, num_classes, steps, seed=0):
    """``steps`` batches of uniform token ids (batch, seq_len) and next-token labels of the same shape.

    Examples
    --------
    >>> [(data.shape, label.shape) for data, label in random_token_batches(4, 5, 10, 10, steps=1)]
    [((4, 5), (4, 5))]
    """
    rng = np.random.RandomState(seed)
    return [(mx.nd.array(rng.randint(0, vocab_size, size=(batch_size, seq_len))),
             mx.nd.array(rng.randint(0, num_classes, size=(batch_size, seq_len))))
            for _ in range(steps)]
