"""Every layer class of mxnet.gluon.nn, gluon.rnn and gluon.contrib.nn, and GluonNLP 0.10's
attention cells, Transformer and BERT encoder blocks, cast to float16 (CPU emulation) and bfloat16:
forward and backward, float32 outputs, finite gradients; and the GPU graph (emulate=False) passes
type inference with float32 outputs and float16 GEMM weights.  The classes are discovered, so a new
one is not missed: each is swept or excepted with its reason and the user's workaround.

In bfloat16, RNN, LayerNorm, Dropout and Deconvolution run in float32 (MXNet AMP's bfloat16 pass
lists them so), which is why the fused RNN layers and the norms pass here in bfloat16 too.  All of
it runs in this process with oneDNN on: transposed convolutions included."""
import inspect

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn
from mxnet.gluon.contrib import nn as contrib_nn

import mxfp16
from mxfp16 import mxnet_internals
from mxfp16.casting.graph import internal_dtypes

nlp = pytest.importorskip("gluonnlp")


class Unroll(gluon.HybridBlock):
    """A recurrent cell unrolled over 4 steps of (N, T, C) input."""

    def __init__(self, cell, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.cell = cell

    def hybrid_forward(self, F, x):
        outputs, _ = self.cell.unroll(4, x, layout="NTC", merge_outputs=True)
        return outputs


def hybrid_sequential():
    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=6), nn.Activation("relu"))
    return net


def sequential():
    net = nn.Sequential()
    net.add(nn.Dense(4, in_units=6), nn.Dense(3, in_units=4))
    return net


def symbol_block():
    data = mx.sym.var("data")
    weight = mx.sym.var("fc_weight", shape=(4, 6))
    return gluon.SymbolBlock(mx.sym.FullyConnected(data, weight, num_hidden=4, no_bias=True,
                                                   name="fc"), [data])


def concurrent(cls):
    net = cls(axis=1)
    net.add(nn.Dense(4, in_units=6), nn.Dense(2, in_units=6))
    return net


def stacked(cls):
    cell = cls()
    cell.add(rnn.LSTMCell(5, input_size=6))
    cell.add(rnn.GRUCell(5, input_size=5))
    return cell


VEC, IMG1, IMG2, IMG3, SEQ = (2, 6), (2, 3, 8), (2, 3, 8, 8), (2, 3, 4, 4, 4), (2, 4, 6)

#: class name -> (a new instance, the input shape; "tokens" for integer ids of shape (2, 5)).
SWEEP = {
    "Activation": (lambda: nn.Activation("relu"), VEC),
    "AvgPool1D": (nn.AvgPool1D, IMG1), "AvgPool2D": (nn.AvgPool2D, IMG2),
    "AvgPool3D": (nn.AvgPool3D, IMG3),
    "BatchNorm": (lambda: nn.BatchNorm(in_channels=3), IMG2),
    "BatchNormReLU": (lambda: nn.BatchNormReLU(in_channels=3), IMG2),
    "Conv1D": (lambda: nn.Conv1D(4, 3, in_channels=3), IMG1),
    "Conv2D": (lambda: nn.Conv2D(4, 3, in_channels=3), IMG2),
    "Conv3D": (lambda: nn.Conv3D(4, 3, in_channels=3), IMG3),
    # Transposed convolutions train in-process with oneDNN on: emulation runs them as
    # Convolutions, bfloat16 feeds them their float32 weight directly (mxfp16.casting.transposed).
    "Conv1DTranspose": (lambda: nn.Conv1DTranspose(4, 3, in_channels=3), IMG1),
    "Conv2DTranspose": (lambda: nn.Conv2DTranspose(4, 4, strides=2, padding=1, in_channels=3),
                        IMG2),
    "Conv3DTranspose": (lambda: nn.Conv3DTranspose(4, 3, strides=2, in_channels=3), IMG3),
    "Dense": (lambda: nn.Dense(4, in_units=6), VEC),
    "Dropout": (lambda: nn.Dropout(0.5), VEC),
    "ELU": (nn.ELU, VEC), "GELU": (nn.GELU, VEC), "SELU": (nn.SELU, VEC),
    "Swish": (nn.Swish, VEC), "LeakyReLU": (lambda: nn.LeakyReLU(0.1), VEC),
    "PReLU": (nn.PReLU, VEC),
    "Embedding": (lambda: nn.Embedding(10, 4), "tokens"),
    "Flatten": (nn.Flatten, IMG1),
    "GlobalAvgPool1D": (nn.GlobalAvgPool1D, IMG1), "GlobalAvgPool2D": (nn.GlobalAvgPool2D, IMG2),
    "GlobalAvgPool3D": (nn.GlobalAvgPool3D, IMG3), "GlobalMaxPool1D": (nn.GlobalMaxPool1D, IMG1),
    "GlobalMaxPool2D": (nn.GlobalMaxPool2D, IMG2), "GlobalMaxPool3D": (nn.GlobalMaxPool3D, IMG3),
    "MaxPool1D": (nn.MaxPool1D, IMG1), "MaxPool2D": (nn.MaxPool2D, IMG2),
    "MaxPool3D": (nn.MaxPool3D, IMG3),
    "GroupNorm": (lambda: nn.GroupNorm(num_groups=3), IMG2),
    "InstanceNorm": (lambda: nn.InstanceNorm(in_channels=3), IMG2),
    "LayerNorm": (lambda: nn.LayerNorm(in_channels=6), VEC),
    "HybridLambda": (lambda: nn.HybridLambda(lambda F, x: F.tanh(x)), VEC),
    "HybridSequential": (hybrid_sequential, VEC),
    "Sequential": (sequential, VEC),
    "SymbolBlock": (symbol_block, VEC),
    "ReflectionPad2D": (lambda: nn.ReflectionPad2D(1), IMG2),
    "RNN": (lambda: rnn.RNN(5, input_size=6, layout="NTC"), SEQ),
    "LSTM": (lambda: rnn.LSTM(5, input_size=6, layout="NTC", num_layers=2), SEQ),
    "GRU": (lambda: rnn.GRU(5, input_size=6, layout="NTC", bidirectional=True), SEQ),
    "RNNCell": (lambda: Unroll(rnn.RNNCell(5, input_size=6)), SEQ),
    "LSTMCell": (lambda: Unroll(rnn.LSTMCell(5, input_size=6)), SEQ),
    "GRUCell": (lambda: Unroll(rnn.GRUCell(5, input_size=6)), SEQ),
    "DropoutCell": (lambda: Unroll(rnn.DropoutCell(0.5)), SEQ),
    "ZoneoutCell": (lambda: Unroll(rnn.ZoneoutCell(rnn.LSTMCell(5, input_size=6), 0.2, 0.2)),
                    SEQ),
    "ResidualCell": (lambda: Unroll(rnn.ResidualCell(rnn.GRUCell(6, input_size=6))), SEQ),
    "BidirectionalCell": (lambda: Unroll(rnn.BidirectionalCell(rnn.LSTMCell(5, input_size=6),
                                                               rnn.GRUCell(5, input_size=6))),
                          SEQ),
    "HybridSequentialRNNCell": (lambda: Unroll(stacked(rnn.HybridSequentialRNNCell)), SEQ),
    "Concurrent": (lambda: concurrent(contrib_nn.Concurrent), VEC),
    "HybridConcurrent": (lambda: concurrent(contrib_nn.HybridConcurrent), VEC),
    "Identity": (contrib_nn.Identity, VEC),
    "PixelShuffle1D": (lambda: contrib_nn.PixelShuffle1D(2), (2, 4, 3)),
    "PixelShuffle2D": (lambda: contrib_nn.PixelShuffle2D(2), (2, 4, 3, 3)),
    "PixelShuffle3D": (lambda: contrib_nn.PixelShuffle3D(2), (2, 8, 2, 2, 2)),
    "SyncBatchNorm": (lambda: contrib_nn.SyncBatchNorm(in_channels=3), IMG2),
}

#: class name -> why it is not swept, and what a user does instead.
EXCEPTIONS = {
    "Block": "abstract base class",
    "HybridBlock": "abstract base class",
    "RecurrentCell": "abstract base class of the cells",
    "HybridRecurrentCell": "abstract base class of the hybrid cells",
    "ModifierCell": "abstract base class of DropoutCell, ZoneoutCell and ResidualCell",
    "Lambda": "a plain Block running Python per call, with nothing to cast: use HybridLambda",
    "SequentialRNNCell": "a plain (non-hybrid) container of cells: use HybridSequentialRNNCell",
    "SparseEmbedding": "a plain Block calling the sparse embedding op imperatively: use "
                       "nn.Embedding(sparse_grad=True) (see docs/sequence_models.md, sparse Embedding)",
}


def discovered():
    """Every public Block subclass of the three modules, by name."""
    return {name for module in (nn, rnn, contrib_nn) for name, value in vars(module).items()
            if inspect.isclass(value) and issubclass(value, gluon.Block)
            and not name.startswith("_")}


def test_every_layer_class_is_swept_or_excepted_with_a_reason():
    found = discovered()
    assert found == set(SWEEP) | set(EXCEPTIONS), (found - set(SWEEP) - set(EXCEPTIONS),
                                                   (set(SWEEP) | set(EXCEPTIONS)) - found)
    assert not set(SWEEP) & set(EXCEPTIONS)


def make_input(shape):
    rng = np.random.RandomState(0)
    if shape == "tokens":
        return mx.nd.array(rng.randint(0, 10, (2, 5)))
    return mx.nd.array(rng.uniform(-1, 1, shape))


def arrays(out):
    return [a for item in out for a in arrays(item)] if isinstance(out, (list, tuple)) else [out]


def build(factory):
    mx.random.seed(0)
    block = factory()
    block.initialize(mx.init.Xavier())
    return block


def check(factory, shape, dtype, backward=True):
    block = build(factory)
    x = make_input(shape)
    if shape != "tokens":
        x.attach_grad()  # layers without parameters: the input's gradient
    cast = mxfp16.cast_block(block, dtype)
    with autograd.record():
        outputs = arrays(cast(x))
        totals = [out.sum() for out in outputs]
    assert all(out.dtype == np.float32 for out in outputs), [out.dtype for out in outputs]
    if backward:
        autograd.backward(totals)
        grads = [p.grad() for p in block.collect_params().values() if p.grad_req != "null"]
        assert all(np.isfinite(g.astype("float32").asnumpy()).all() for g in grads)
    assert all(np.isfinite(out.asnumpy()).all() for out in outputs)


#: (class, dtype) that MXNet 1.9.1 cannot run on this CPU, with the error and the workaround.
KNOWN_LIMITS = {
    ("BatchNormReLU", "bfloat16"): "MXNet 1.9.1's fused BatchNormReLU crashes (segmentation "
                                   "fault) on bfloat16 input on the CPU: use BatchNorm followed "
                                   "by Activation('relu')",
}


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(SWEEP))
def test_layer_casts_runs_and_trains(name, dtype):
    if (name, dtype) in KNOWN_LIMITS:
        pytest.skip(KNOWN_LIMITS[name, dtype])
    check(*SWEEP[name], dtype)


#: Swept classes without a GPU graph of their own.
NO_GRAPH = {
    "Sequential": "a plain Block: cast_block casts its HybridBlock children in place (swept)",
    "Concurrent": "as Sequential",
}


def test_exception_tables_name_swept_classes():
    assert {name for name, _ in KNOWN_LIMITS} <= set(SWEEP)
    assert set(NO_GRAPH) <= set(SWEEP)


@pytest.mark.parametrize("name", sorted(set(SWEEP) - set(NO_GRAPH)))
def test_gpu_graph_passes_type_inference_with_float32_outputs(name):
    factory, shape = SWEEP[name]
    block = build(factory)
    cast = mxfp16.cast_block(block, "float16", emulate=False)
    graph = cast.graphs[0]
    _, out_types, _ = graph.infer_type(**{n: np.float32 for n in cast.data_names})
    assert out_types and all(t == np.float32 for t in out_types), out_types
    types = internal_dtypes(graph, cast.data_names)
    weights = [p.name for p in block.collect_params().values() if p.name.endswith("weight")]
    gemm = name.startswith(("Conv", "Dense", "RNN", "LSTM", "GRU", "Embedding", "Symbol",
                            "HybridSequential", "HybridConcurrent", "Bidirectional", "Residual",
                            "Zoneout"))
    if gemm:  # GEMM weights run in float16 on a GPU (Tensor Cores), whatever the container
        assert weights and all(np.dtype(types[w]) == np.float16 for w in weights if w in types)


def nlp_discovered():
    """GluonNLP 0.10's attention cells, Transformer and seq2seq blocks, and BERT's encoder and
    attention blocks, by name (its models are trained in test_sequence_models.py)."""
    model = nlp.model
    found = set()
    for module in (model.attention_cell, model.transformer, model.seq2seq_encoder_decoder,
                   model.bert):
        for name, value in vars(module).items():
            if inspect.isclass(value) and issubclass(value, gluon.Block) \
                    and value.__module__ == module.__name__ and not name.startswith("_") \
                    and (module is not model.bert or "Encoder" in name or "Attention" in name):
                found.add(name)
    return found


def nlp_factories():
    cells, transformer, bert = (nlp.model.attention_cell, nlp.model.transformer,
                                nlp.model.bert)
    sizes = dict(units=6, hidden_size=12, num_heads=2)
    stack = dict(num_layers=1, max_length=8, **sizes)
    return {
        "DotProductAttentionCell": lambda: cells.DotProductAttentionCell(scaled=True),
        "MLPAttentionCell": lambda: cells.MLPAttentionCell(units=6),
        "MultiHeadAttentionCell": lambda: cells.MultiHeadAttentionCell(
            cells.DotProductAttentionCell(), query_units=6, key_units=6, value_units=6,
            num_heads=2),
        "PositionwiseFFN": lambda: transformer.PositionwiseFFN(units=6, hidden_size=12),
        "TransformerEncoderCell": lambda: transformer.TransformerEncoderCell(**sizes),
        "TransformerEncoder": lambda: transformer.TransformerEncoder(**stack),
        "TransformerDecoderCell": lambda: transformer.TransformerDecoderCell(**sizes),
        "TransformerDecoder": lambda: transformer.TransformerDecoder(**stack),
        "BERTEncoderCell": lambda: bert.BERTEncoderCell(**sizes),
        "DotProductSelfAttentionCell": lambda: bert.DotProductSelfAttentionCell(units=6,
                                                                                num_heads=2),
        "BERTEncoder": lambda: bert.BERTEncoder(**stack),
    }


def nlp_call(name, block):
    """The arguments GluonNLP's own code passes ``block`` (BERT's blocks are time-major)."""
    mask = mx.nd.ones((2, 3, 4))
    query, memory, valid = make_input((2, 3, 6)), make_input((2, 4, 6)), mx.nd.array([4, 2])
    if name.endswith("AttentionCell") and name != "DotProductSelfAttentionCell":
        return query, memory, None, mask
    if name == "TransformerDecoder":  # the states its encoder hands it
        return query, block.init_state_from_encoder(memory, valid)
    return {"PositionwiseFFN": (memory,),
            "TransformerEncoderCell": (memory, mx.nd.ones((2, 4, 4))),
            "TransformerEncoder": (memory, None, valid),
            "TransformerDecoderCell": (query, memory, mx.nd.ones((2, 3, 3)), mask),
            "BERTEncoderCell": (make_input((4, 2, 6)), None),
            "DotProductSelfAttentionCell": (make_input((4, 2, 6)), None),
            "BERTEncoder": (make_input((4, 2, 6)), None, valid)}[name]


#: GluonNLP class name -> why it is not swept, and what a user does instead.
NLP_EXCEPTIONS = {
    "AttentionCell": "abstract base class of the attention cells",
    "Seq2SeqEncoder": "abstract base class (TransformerEncoder is swept)",
    "Seq2SeqDecoder": "abstract base class (TransformerDecoder is swept)",
    "Seq2SeqOneStepDecoder": "abstract base class",
    "TransformerOneStepDecoder": "its forward runs NDArray code (mx.nd.concat of the previous "
                                 "steps' inputs), which no graph can trace: the cast block's "
                                 "call fails with a TypeError naming the signature. It is "
                                 "beam search's decoder; train with TransformerDecoder (swept), "
                                 "which shares its parameters",
}


def test_every_gluonnlp_attention_and_encoder_class_is_swept_or_excepted():
    found = nlp_discovered()
    assert found == set(nlp_factories()) | set(NLP_EXCEPTIONS), (
        found - set(nlp_factories()) - set(NLP_EXCEPTIONS),
        (set(nlp_factories()) | set(NLP_EXCEPTIONS)) - found)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("name", sorted(nlp_factories()))
def test_gluonnlp_block_casts_runs_and_trains(name, dtype):
    block = build(nlp_factories()[name])
    call = nlp_call(name, block)
    call[0].attach_grad()  # the dot-product cell has no parameters
    cast = mxfp16.cast_block(block, dtype)
    with autograd.record():
        outputs = [out for out in arrays(cast(*call)) if out is not None]
        totals = [out.sum() for out in outputs if out.size]
    autograd.backward(totals)
    assert all(out.dtype == np.float32 for out in outputs), [out.dtype for out in outputs]
    assert outputs[0].shape[-1] == 6 and np.isfinite(outputs[0].asnumpy()).all()
    grads = [call[0].grad] + [p.grad() for p in block.collect_params().values()
                              if p.grad_req != "null"]
    assert all(np.isfinite(g.astype("float32").asnumpy()).all() for g in grads)


@pytest.mark.parametrize("name", sorted(nlp_factories()))
def test_gluonnlp_gpu_graph_runs_its_gemms_in_float16(name):
    block = build(nlp_factories()[name])
    cast = mxfp16.cast_block(block, "float16", emulate=False)
    call = nlp_call(name, block)
    graph_block, _, _ = cast._new_variant(call)  # traced as the call needs, not run
    inputs, graph = mxnet_internals.symbol_block_graph(graph_block)
    names = [symbol.name for symbol in inputs]
    _, out_types, _ = graph.infer_type(**{n: np.float32 for n in names})
    assert out_types and all(t == np.float32 for t in out_types), out_types
    types = internal_dtypes(graph, names)
    weights = [n for n in block.collect_params() if n.endswith("weight")
               and "layernorm" not in n and n in types]
    assert all(types[n] == "float16" for n in weights), types
    assert weights or name == "DotProductAttentionCell"
