"""float16 (CPU emulation, and the GPU graph by type inference) and bfloat16 for sequence models:
Gluon's fused RNN layers and unrolled cells, self-attention, GluonNLP 0.10's BERT, Transformer and
language models; cast blocks called exactly like the originals; training a few steps with the loss
falling; gradient clipping of an RNN with the loss scale accounted for."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn, rnn

import mxfp16
from mxfp16 import mxnet_internals
from mxfp16.casting.graph import internal_dtypes

nlp = pytest.importorskip("gluonnlp")

T, N, C, H = 5, 3, 8, 16  # steps, batch, input size, hidden size


def float16_weights_in_gpu_graph(net, data_names):
    """Types the GPU graph (emulate=False) gives the parameters: name -> dtype name."""
    gpu = mxfp16.cast_block(net, "float16", emulate=False)
    sym = gpu.graphs[0]
    return {name: np.dtype(dtype).name for name, dtype in
            internal_dtypes(sym, data_names).items() if name in net.collect_params()}


RNN_LAYERS = [
    ("lstm", dict()), ("gru", dict()), ("rnn_relu", dict(activation="relu")),
    ("rnn_tanh", dict(activation="tanh")),
]


def rnn_layer(kind, num_layers=1, bidirectional=False, layout="TNC", **extra):
    cls = {"lstm": rnn.LSTM, "gru": rnn.GRU}.get(kind, rnn.RNN)
    kwargs = dict(num_layers=num_layers, bidirectional=bidirectional, layout=layout,
                  input_size=C, **extra)
    if cls is rnn.RNN:
        kwargs["activation"] = kind.split("_")[1]
    layer = cls(H, **kwargs)
    mx.random.seed(0)
    layer.initialize(mx.init.Xavier())
    return layer


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind, num_layers, bidirectional, layout", [
    ("lstm", 2, True, "TNC"), ("gru", 1, False, "NTC"), ("rnn_relu", 2, False, "TNC"),
    ("rnn_tanh", 1, True, "NTC")])
def test_fused_rnn_layers_run_forward_and_backward_close_to_float32(
        kind, num_layers, bidirectional, layout, dtype):
    reference = rnn_layer(kind, num_layers, bidirectional, layout)
    x = mx.nd.random.uniform(-1, 1, (T, N, C) if layout == "TNC" else (N, T, C))
    expected = reference(x).asnumpy()
    layer = rnn_layer(kind, num_layers, bidirectional, layout)
    cast = mxfp16.cast_block(layer, dtype)
    x.attach_grad()
    with autograd.record():
        out = cast(x)
    out.backward()
    assert out.dtype == np.float32 and x.grad.dtype == np.float32
    tolerance = 2e-2 if dtype == "float16" else 8e-2
    np.testing.assert_allclose(out.asnumpy(), expected, atol=tolerance, rtol=tolerance)
    assert np.isfinite(x.grad.asnumpy()).all()


@pytest.mark.parametrize("kind", ["lstm", "gru"])
def test_rnn_begin_states_given_or_left_out_one_dtype_on_a_gpu(kind):
    layer = rnn_layer(kind, num_layers=2)
    types = float16_weights_in_gpu_graph(layer, ["data"])
    assert set(types.values()) == {"float16"}, types  # data, parameters and states alike
    cast = mxfp16.cast_block(layer, "float16")
    x = mx.nd.ones((T, N, C))
    states = layer.begin_state(N)
    out, new_states = cast(x, states)  # called as the layer: (output, states)
    assert out.shape == (T, N, H) and len(new_states) == len(states)
    assert [s.shape for s in new_states] == [s.shape for s in states]
    assert all(s.dtype == np.float32 for s in [out] + list(new_states))
    np.testing.assert_allclose(cast(x).asnumpy(), out.asnumpy(), atol=1e-6)  # zero states


class UnrolledCells(gluon.HybridBlock):
    """LSTMCell unrolled; stacked, residual and bidirectional cells."""

    def __init__(self, which, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            if which == "lstm":
                self.cell = rnn.LSTMCell(H, input_size=C)
            elif which == "stacked":
                self.cell = rnn.HybridSequentialRNNCell()
                self.cell.add(rnn.LSTMCell(H, input_size=C))
                self.cell.add(rnn.ResidualCell(rnn.GRUCell(H, input_size=H)))
            else:
                self.cell = rnn.BidirectionalCell(rnn.LSTMCell(H, input_size=C),
                                                  rnn.GRUCell(H, input_size=C))

    def hybrid_forward(self, F, x):
        outputs, _ = self.cell.unroll(T, x, layout="NTC", merge_outputs=True)
        return outputs


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("which", ["lstm", "stacked", "bidirectional"])
def test_unrolled_cells_cast_and_train(which, dtype):
    net = UnrolledCells(which)
    mx.random.seed(1)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(-1, 1, (N, T, C))
    expected = net(x).asnumpy()
    cast = mxfp16.cast_block(net, dtype)
    with autograd.record():
        out = cast(x)
    out.backward()
    tolerance = 2e-2 if dtype == "float16" else 8e-2
    np.testing.assert_allclose(out.asnumpy(), expected, atol=tolerance, rtol=tolerance)
    grads = [p.grad() for p in net.collect_params().values() if p.grad_req != "null"]
    assert all(np.isfinite(g.asnumpy()).all() for g in grads)


class SelfAttention(gluon.HybridBlock):
    """softmax(Q K^T / sqrt(d)) V, then LayerNorm: softmax and LayerNorm in float32 between GEMMs."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.qkv = nn.Dense(3 * H, flatten=False, in_units=C)
            self.norm = nn.LayerNorm(in_channels=H)

    def hybrid_forward(self, F, x):
        q, k, v = F.split(self.qkv(x), num_outputs=3, axis=-1)
        scores = F.softmax(F.batch_dot(q, k, transpose_b=True) / np.sqrt(H), axis=-1)
        return self.norm(F.batch_dot(scores, v))


@pytest.mark.parametrize("dtype, mode", [("float16", "full"), ("float16", "amp"),
                                         ("bfloat16", "full")])
def test_self_attention_casts_with_float32_softmax_in_the_middle(dtype, mode):
    net = SelfAttention()
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(-1, 1, (N, T, C))
    expected = net(x).asnumpy()
    cast = mxfp16.cast_block(net, dtype, mode=mode)
    with autograd.record():
        out = cast(x)
    out.backward()
    np.testing.assert_allclose(out.asnumpy(), expected, atol=6e-2, rtol=6e-2)
    if dtype == "float16":
        types = float16_weights_in_gpu_graph(net, ["data"])
        assert types[net.qkv.weight.name] == "float16"
        assert types[net.norm.gamma.name] == "float32"


def tiny_bert(use_classifier=False):
    encoder = nlp.model.BERTEncoder(num_layers=2, units=16, hidden_size=32, max_length=16,
                                    num_heads=2)
    bert = nlp.model.BERTModel(encoder, vocab_size=40, token_type_vocab_size=2, units=16,
                               embed_size=16, use_decoder=False, use_classifier=False)
    return nlp.model.BERTClassifier(bert, num_classes=3) if use_classifier else bert


def bert_batch():
    rng = np.random.RandomState(0)
    tokens = mx.nd.array(rng.randint(0, 40, (4, 8)))
    types = mx.nd.array(rng.randint(0, 2, (4, 8)))
    valid = mx.nd.array([8, 5, 3, 8])
    return tokens, types, valid


@pytest.mark.parametrize("dtype, mode", [("float16", "full"), ("float16", "amp"),
                                         ("bfloat16", "full")])
def test_bert_called_as_gluonnlp_calls_it(dtype, mode):
    bert = tiny_bert()
    mx.random.seed(2)
    bert.initialize(mx.init.Normal(0.02))
    tokens, types, valid = bert_batch()
    expected_seq, expected_pooled = (out.asnumpy() for out in bert(tokens, types, valid))
    cast = mxfp16.cast_block(bert, dtype, mode=mode)  # no input_names
    seq, pooled = cast(tokens, types, valid)
    assert seq.dtype == pooled.dtype == np.float32
    tolerance = 5e-2 if dtype == "float16" else 1.5e-1
    np.testing.assert_allclose(seq.asnumpy(), expected_seq, atol=tolerance, rtol=tolerance)
    np.testing.assert_allclose(pooled.asnumpy(), expected_pooled, atol=tolerance, rtol=tolerance)
    seq_all, _ = cast(tokens, types)  # valid_length left out, as GluonNLP allows
    assert seq_all.shape == seq.shape


def test_a_call_the_original_does_not_take_names_both_signatures():
    layer = rnn_layer("lstm")
    cast = mxfp16.cast_block(layer, "float16")
    x = mx.nd.ones((T, N, C))
    with pytest.raises(TypeError, match=r"the cast network takes what LSTM\(inputs, states=None, "
                                        r"sequence_length=None\) takes, called with \(NDArray\(5, 3, "
                                        r"8\), NDArray\(1\), NDArray\(1\), NDArray\(1\)\)"):
        cast(x, mx.nd.ones(1), mx.nd.ones(1), mx.nd.ones(1))


def language_model(kind):
    if kind == "standard":
        return nlp.model.StandardRNN("lstm", 50, 16, 16, 2, dropout=0, tie_weights=False)
    return nlp.model.AWDRNN("lstm", 50, 16, 16, 2, tie_weights=True, dropout=0, weight_drop=0,
                            drop_h=0, drop_i=0, drop_e=0)


@pytest.mark.parametrize("kind", ["standard", "awd"])
def test_language_model_called_with_nested_begin_states(kind):
    net = language_model(kind)
    mx.random.seed(3)
    net.initialize(mx.init.Xavier())
    tokens = mx.nd.array(np.random.RandomState(1).randint(0, 50, (8, 4)))
    states = net.begin_state(batch_size=4, func=mx.nd.zeros)
    expected, expected_states = net(tokens, states)
    cast = mxfp16.cast_block(net, "float16")
    out, new_states = cast(tokens, states)
    assert out.shape == expected.shape == (8, 4, 50)
    shapes = lambda s: [shapes(i) for i in s] if isinstance(s, (list, tuple)) else s.shape  # noqa: E731
    assert shapes(new_states) == shapes(expected_states)  # the same nesting
    np.testing.assert_allclose(out.asnumpy(), expected.asnumpy(), atol=3e-2, rtol=3e-2)


def transformer_encoder():
    return nlp.model.transformer.TransformerEncoder(num_layers=2, units=16, hidden_size=32,
                                                    max_length=16, num_heads=2)


def nmt_model():
    encoder, decoder, one_step = nlp.model.transformer.get_transformer_encoder_decoder(
        num_layers=1, units=16, hidden_size=32, num_heads=2, max_src_length=16, max_tgt_length=16)
    return nlp.model.translation.NMTModel(
        src_vocab=nlp.Vocab(nlp.data.count_tokens(list("abcdefghij"))),
        tgt_vocab=nlp.Vocab(nlp.data.count_tokens(list("abcdefghij"))), encoder=encoder,
        decoder=decoder, one_step_ahead_decoder=one_step, embed_size=16, prefix="nmt_")


class Classifier(gluon.HybridBlock):
    """A model with a class score per sample, for the training test."""

    def __init__(self, kind, **kwargs):
        super().__init__(**kwargs)
        self.kind = kind
        with self.name_scope():
            if kind == "bert":
                self.body = tiny_bert(use_classifier=True)
            elif kind == "transformer":
                self.embed = nn.Embedding(40, 16)
                self.body = transformer_encoder()
                self.out = nn.Dense(3, in_units=16)
            else:
                self.body = language_model(kind)
                self.out = nn.Dense(3, in_units=50)

    def hybrid_forward(self, F, tokens, types, valid):
        if self.kind == "bert":
            return self.body(tokens, types, valid)
        if self.kind == "transformer":
            encoded, _ = self.body(self.embed(tokens), None, valid)
            return self.out(F.mean(encoded, axis=1))
        scores, _ = self.body(F.transpose(tokens))  # (output, states)
        return self.out(F.mean(scores, axis=0))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("kind", ["bert", "transformer", "standard", "awd"])
def test_models_train_a_few_steps_with_the_loss_falling(kind, dtype):
    net = Classifier(kind)
    mx.random.seed(4)
    net.initialize(mx.init.Normal(0.05))
    cast = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.Trainer(cast.collect_params(), "adam", {"learning_rate": 0.03}, dtype=dtype)
    tokens, types, valid = bert_batch()
    labels = mx.nd.array([0, 1, 2, 1])
    losses = []
    for _ in range(15):
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(cast(tokens, types, valid), labels)
        trainer.backward(loss)
        trainer.step(4)
        losses.append(float(loss.mean().asscalar()))
    assert losses[-1] < 0.6 * losses[0], losses
    assert trainer.num_skipped <= 1  # at most the measured start's first step


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nmt_model_casts_part_by_part_and_trains(dtype):
    model = nmt_model()
    mx.random.seed(5)
    model.initialize(mx.init.Xavier())
    src = mx.nd.array(np.random.RandomState(2).randint(0, 10, (2, 6)))
    tgt = mx.nd.array(np.random.RandomState(3).randint(0, 10, (2, 5)))
    src_len, tgt_len = mx.nd.array([6, 4]), mx.nd.array([5, 3])
    expected = model(src, tgt, src_len, tgt_len)[0].asnumpy()
    assert mxfp16.cast_block(model, dtype) is model  # a gluon.Block: its HybridBlocks cast
    assert isinstance(model.encoder, mxfp16.casting.block.CastBlock)
    out = model(src, tgt, src_len, tgt_len)[0]
    assert out.dtype == np.float32
    tolerance = 5e-2 if dtype == "float16" else 1.5e-1
    np.testing.assert_allclose(out.asnumpy(), expected, atol=tolerance, rtol=tolerance)
    trainer = mxfp16.Trainer(model.collect_params(), "adam", {"learning_rate": 0.01}, dtype=dtype)
    losses = []
    for _ in range(10):
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(model(src, tgt, src_len, tgt_len)[0], tgt)
        trainer.backward(loss)
        trainer.step(2)
        losses.append(float(loss.mean().asscalar()))
    assert losses[-1] < 0.8 * losses[0], losses


def global_norm(params, divisor=1.0):
    return np.sqrt(sum(float((p.grad().astype("float32") ** 2).sum().asscalar())
                       for p in params)) / divisor


def clipped_language_model_step(dtype, max_norm):
    """One backward of a 2-layer LSTM language model (the same initial weights and batch in every
    dtype), then ``clip_global_norm(max_norm)``: (the norm it returns, the unscaled norm measured
    before and after clipping).  float16 scales the loss by 2**12."""
    net = language_model("standard")
    mx.random.seed(6)
    net.initialize(mx.init.Xavier())
    cast = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.Trainer(cast.collect_params(), "sgd", {"learning_rate": 0.1}, dtype=dtype,
                             loss_scale=2.0 ** 12 if dtype == "float16" else None)
    tokens = mx.nd.array(np.random.RandomState(4).randint(0, 50, (8, 4)))
    target = mx.nd.array(np.random.RandomState(5).randint(0, 50, (8, 4)))
    with autograd.record():
        scores, _ = cast(tokens)  # (output, states), as the original
        loss = gluon.loss.SoftmaxCrossEntropyLoss()(scores, target)
    trainer.backward(loss)
    params = [p for p in cast.collect_params().values() if p.grad_req != "null"]
    scale = trainer.scaler.loss_scale
    before = global_norm(params, scale)
    norm = trainer.clip_global_norm(max_norm)
    after = global_norm(params, scale)
    assert trainer.step(4)
    return norm, before, after


@pytest.mark.parametrize("ratio", [0.5, 2.0])  # max_norm below the float32 norm, and above it
def test_rnn_gradient_clipping_measures_the_unscaled_norm_as_float32_does(ratio):
    norm32, _, _ = clipped_language_model_step("float32", 1e9)
    max_norm = ratio * norm32
    norm32, before32, after32 = clipped_language_model_step("float32", max_norm)
    norm16, before16, after16 = clipped_language_model_step("float16", max_norm)
    assert norm16 == pytest.approx(before16, rel=1e-4)  # the unscaled norm, not 2**12 times it
    assert norm16 == pytest.approx(norm32, rel=2e-3)  # float16 emulation of the same step
    assert (norm16 > max_norm) == (norm32 > max_norm) == (ratio < 1)  # the same decision
    if ratio < 1:
        assert after32 == pytest.approx(max_norm, rel=1e-5)
        assert after16 == pytest.approx(max_norm, rel=2e-3)  # float16 gradients, 2**-11 each
    else:
        assert (after32, after16) == (before32, before16)  # nothing clipped


def test_bert_gpu_graph_runs_its_gemms_in_float16():
    bert = tiny_bert(use_classifier=True)
    bert.initialize(mx.init.Normal(0.02))
    gpu = mxfp16.cast_block(bert, "float16", emulate=False)
    tokens, types, valid = bert_batch()
    inference, positions, _ = gpu._new_variant([tokens, types, valid])  # the 3-input call
    inputs, graph = mxnet_internals.symbol_block_graph(inference)
    names = [symbol.name for symbol in inputs]
    dtypes = internal_dtypes(graph, names)
    dense = [name for name in bert.collect_params() if name.endswith("weight")
             and "layernorm" not in name and name in dtypes]
    assert dense and all(dtypes[name] == "float16" for name in dense), dtypes
    _, out_types, _ = graph.infer_type(**{name: np.float32 for name in names})
    assert positions == [0, 1, 2] and all(t == np.float32 for t in out_types)
