"""mxfp16.find_overflow on planted overflows: attention whose scores are not divided by sqrt(d),
a convolution fed unnormalized pixels before its BatchNorm, a loss weighted 1e6 (the backward
pass), GluonNLP's BERT and its NMT model (a plain Block) with an overflowing layer; bfloat16 finds
nothing; the NumPy interface, several devices and static_alloc; the network, its Trainer and
MXNet's random generator left as they were."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, npx
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.keep import Keep
from mxfp16.diagnose.session import Session

nlp = pytest.importorskip("gluonnlp")


class SelfAttention(nn.HybridBlock):
    """Self-attention whose scores are not divided by sqrt(d): the issue's network."""

    def __init__(self, units, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(units, flatten=False)
            self.key = nn.Dense(units, flatten=False)
            self.value = nn.Dense(units, flatten=False)
            self.proj = nn.Dense(units, flatten=False)

    def scores(self, F, x):
        return F.batch_dot(self.query(x), self.key(x), transpose_b=True)

    def hybrid_forward(self, F, x):
        weights = F.softmax(self.scores(F, x), axis=-1)
        return self.proj(F.batch_dot(weights, self.value(x)))


class AttentionNet(nn.HybridBlock):
    def __init__(self, units=32, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.att = SelfAttention(units)
            self.drop = nn.Dropout(dropout)
            self.head = nn.Dense(1, flatten=False)

    def hybrid_forward(self, F, x):
        return self.head(self.drop(self.att(x)))


def attention_batch(batch=4, steps=16, width=32, std=80.0):
    rng = np.random.RandomState(0)
    return (mx.nd.array(rng.normal(0, std, (batch, steps, width))),
            mx.nd.array(rng.normal(0, 1, (batch, steps, 1))))


def attention_net(ctx=None, dropout=0.0):
    ctx = ctx or mx.cpu()
    mx.random.seed(0)
    net = AttentionNet(dropout=dropout, prefix="net_")
    net.initialize(mx.init.Xavier(), ctx=ctx)
    net(attention_batch()[0].as_in_context(ctx[0] if isinstance(ctx, list) else ctx))
    return net


@pytest.fixture(scope="module")
def attention_report():
    net = attention_net()
    x, y = attention_batch()
    return net, x, mxfp16.find_overflow(net, x, label=y, loss_fn=gluon.loss.L2Loss())


def test_unscaled_attention_scores_are_the_forward_culprit(attention_report):
    net, x, report = attention_report
    assert bool(report) and report.phases == ["forward"]
    [culprit] = report.culprits
    assert (culprit.path, culprit.op, culprit.phase, culprit.op_type) == \
        ("att", "net_selfattention0_batch_dot0", "forward", "batch_dot")
    scores = net.att.scores(mx.nd, x)  # the float32 scores
    assert culprit.max_abs == pytest.approx(float(scores.abs().max().asscalar()), rel=1e-6)
    assert culprit.max_abs > 65504 and not np.isfinite(culprit.value)
    assert report.keep_float32 == ["att"] and report.fixed is True
    assert "net_selfattention0_batch_dot0" in str(report) and "keep_float32=['att']" in str(report)
    # float16's value and float32's magnitude in their own columns, each under its own name
    header, row = str(report).splitlines()[1:3]
    assert header.split()[-4:] == ["float16", "float32", "max", "|x|"]
    assert row.split()[-2:] == ["inf/nan", f"{culprit.max_abs:.3g}"]  # both signs of inf
    # the gradients float16 keeps once att is kept: float32's softmax, saturated by the unscaled
    # scores, flushes att's (100% of its weights' gradients, float32 there with the fix)
    assert {row.path for row in report.underflow} == {"drop", "head"}
    assert "\nunderflow with the fix kept: 0 of " in str(report)


@pytest.mark.slow
def test_the_issues_attention_fails_in_float16_and_trains_with_the_fix():
    """16 sequences of 16 steps, width 32, inputs of standard deviation 80 (the issue's case)."""
    x, _ = attention_batch(batch=16)
    y = x.mean(axis=-1, keepdims=True) / 80

    def train(keep_float32=None, dtype="float16", steps=60):
        net = attention_net()
        if dtype == "float16":
            net = mxfp16.cast_block(net, dtype, keep_float32=keep_float32)
        trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01},
                                 dtype=dtype)
        for _ in range(steps):
            with autograd.record():
                loss = gluon.loss.L2Loss()(net(x), y)
            trainer.backward(loss)
            trainer.step(16)
        return float(loss.mean().asscalar()), trainer.num_skipped
    failed, skipped = train(steps=3)
    assert np.isnan(failed) and skipped == 3  # NaN from the first step, every step skipped
    report = mxfp16.find_overflow(attention_net(), x, label=y, loss_fn=gluon.loss.L2Loss())
    assert report.keep_float32 == ["att"] and report.fixed
    # with att kept, the head's weight gradient overflows at loss scale 1: the scale's to lower
    assert [c.tensor for c in report.backward_after_fix] == ["net_dense0_weight"]
    (fixed, skipped), (float32, _) = train(report.keep_float32), train(dtype="float32")
    assert skipped <= 1  # the measured start's first step
    assert fixed == pytest.approx(float32, rel=0.05)  # 0.763 against 0.750, measured


def test_a_convolution_fed_unnormalized_pixels_before_its_batchnorm():
    net = nn.HybridSequential(prefix="cnn_")
    with net.name_scope():
        net.add(nn.Conv2D(4, 3, in_channels=3, weight_initializer=mx.init.Constant(10)),
                nn.BatchNorm(in_channels=4), nn.Activation("relu"), nn.Dense(2))
    net.initialize()
    pixels = mx.nd.full((2, 3, 6, 6), 255)  # 0..255, not normalized: 27 * 255 * 10 = 68850
    net(pixels)
    report = mxfp16.find_overflow(net, pixels, label=mx.nd.array([0, 1]))
    assert [(c.path, c.op, c.phase, c.max_abs) for c in report.culprits] == \
        [("0", "cnn_conv0_fwd", "forward", 68850.0)]
    # the forward looks fine (ReLU turns BatchNorm's NaN into 0) but its backward is NaN
    assert np.isfinite(report.losses[1])
    # the convolution in float32 alone still hands 68850 to its BatchNorm, which reads float16
    assert report.keep_float32 == ["0", "1"] and report.fixed


def conv_bn_symbol_block():
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="loud_conv")
    relu = mx.sym.Activation(mx.sym.BatchNorm(conv, name="bn"), act_type="relu", name="relu")
    net = gluon.SymbolBlock(mx.sym.FullyConnected(relu, num_hidden=2, name="fc"), [data])
    net.initialize(mx.init.Constant(10))
    return net


def test_a_symbol_blocks_convolution_is_fixed_with_its_batchnorm_as_training_needs():
    """Kept alone, the convolution's float32 output (68860) is cast to float16 for its BatchNorm:
    inf, whose NaN the ReLU turns into 0 and the BatchNorm's backward hands to the convolution's
    float32 parameter gradients, which no gradient tap before them sees (this was reported as a
    backward culprit there, and ['loud_conv'] as a checked fix)."""
    pixels, label = mx.nd.full((2, 3, 6, 6), 255), mx.nd.array([0, 1])

    def step(keep_float32):
        net = conv_bn_symbol_block()
        net(pixels)
        cast = mxfp16.cast_block(net, "float16", keep_float32=keep_float32)
        with autograd.record():
            loss = gluon.loss.SoftmaxCrossEntropyLoss()(cast(pixels), label)
        loss.backward()
        return all(np.isfinite(p.grad().asnumpy()).all() for p in cast.collect_params().values()
                   if p.grad_req != "null")
    net = conv_bn_symbol_block()
    net(pixels)
    report = mxfp16.find_overflow(net, pixels, label=label)
    assert [(c.op, c.phase, c.max_abs) for c in report.culprits] == \
        [("loud_conv", "forward", 68860.0)]  # 27 * 255 * 10, and the bias 10
    assert report.keep_float32 == ["loud_conv", "bn"] and report.fixed
    assert step(report.keep_float32) and not step(["loud_conv"])


def test_a_loss_weighted_1e6_overflows_the_backward_pass():
    net = nn.HybridSequential(prefix="mlp_")
    with net.name_scope():
        net.add(nn.Dense(16, activation="relu", in_units=8), nn.Dense(4, in_units=16))
    net.initialize(mx.init.Xavier())
    rng = np.random.RandomState(0)
    x, y = mx.nd.array(rng.normal(size=(8, 8))), mx.nd.array(rng.normal(size=(8, 4)))
    report = mxfp16.find_overflow(net, x, label=y, loss_fn=gluon.loss.L2Loss(weight=1e6))
    assert report.phases == ["backward"] and report.keep_float32 == []
    [culprit] = report.culprits
    assert (culprit.path, culprit.op, culprit.tensor) == ("1", "mlp_dense1_fwd",
                                                         "mlp_dense1_fwd_output")
    # L2Loss: weight * (prediction - label) / 4 values per sample, the gradient at the output
    expected = 1e6 * float((net(x) - y).abs().max().asscalar()) / 4
    assert culprit.max_abs == pytest.approx(expected, rel=1e-5) and culprit.max_abs > 65504
    assert report.losses[0] > 0 and np.isfinite(report.losses[1])  # the forward is fine


def test_a_symbol_block_is_fixed_by_op_names():
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, num_hidden=4, name="fc1")
    net = gluon.SymbolBlock(mx.sym.FullyConnected(fc1, num_hidden=2, name="fc2"), [data])
    net.initialize(mx.init.Constant(300))
    x = mx.nd.ones((1, 2))
    net(x)  # 2 * 300 + 300 = 900, then 4 * 900 * 300 + 300 = 1080300 (biases 300 too)
    report = mxfp16.find_overflow(mxfp16.cast_block(net, "float16"), x, label=mx.nd.zeros(1))
    assert [(c.path, c.op, c.max_abs) for c in report.culprits] == [("", "fc2", 1080300.0)]
    assert report.keep_float32 == ["fc2"] and report.fixed  # cast_block takes op names here


def mlp_symbol_block(weight=300.0):
    """A SymbolBlock fc1 -> relu -> fc2, every weight and bias ``weight``."""
    data = mx.sym.var("data")
    fc1 = mx.sym.FullyConnected(data, num_hidden=4, name="fc1")
    net = gluon.SymbolBlock(mx.sym.FullyConnected(mx.sym.relu(fc1, name="relu"), num_hidden=2,
                                                  name="fc2"), [data])
    net.initialize(mx.init.Constant(weight))
    return net


def test_each_round_of_the_fix_casts_the_graph_with_its_own_keep():
    """A round's Keep freed at the end of the round gives its id() to the next round's: the cast
    graphs must not be found by it (they were, so which round reran which graph depended on the
    allocator, and PYTHONHASHSEED changed the SymbolBlock's fix from all three ops to none)."""
    net, x = mlp_symbol_block(), mx.nd.ones((1, 2))
    net(x)
    session, freed, spares = Session(net, "float16"), None, []
    for names in (("fc1",), ("fc1", "relu"), ("fc2",)):
        keep = Keep(lambda name, op=None, chosen=names: name in chosen)
        while freed is not None and id(keep) != freed and len(spares) < 100:
            spares.append(keep)  # until CPython gives a Keep the freed one's address
            keep = Keep(lambda name, op=None, chosen=names: name in chosen)
        with session.with_keep(keep):
            plan = session.part("", [x]).plan
        assert tuple(op for op in ("fc1", "relu", "fc2")
                     if plan[op + "_output"] == "float32") == names
        freed = id(keep)
        del keep


def test_a_symbol_block_overflowing_at_its_first_layer_keeps_all_three_ops():
    net, x = mlp_symbol_block(), mx.nd.full((1, 2), 300)
    net(x)  # 2 * 300 * 300 + 300 = 180300 at fc1, which relu and fc2 then read in float16
    report = mxfp16.find_overflow(net, x, label=mx.nd.zeros(1))
    assert [(c.op, c.max_abs) for c in report.culprits] == [("fc1", 180300.0)]
    assert report.keep_float32 == ["fc1", "relu", "fc2"] and report.fixed


def test_an_input_or_a_parameter_beyond_65504_gives_float32s_magnitude():
    net = nn.HybridSequential(prefix="in_")
    with net.name_scope():
        net.add(nn.Dense(4, in_units=2), nn.Dense(2, in_units=4))
    net.initialize(mx.init.Constant(0.01))
    x = mx.nd.array([[1e5, -2e5]])
    net(x)
    report = mxfp16.find_overflow(net, x, label=mx.nd.zeros(1))  # was a KeyError
    assert [(c.path, c.op, c.op_type, c.max_abs) for c in report.culprits] == \
        [("", "input0", "input", 2e5)]
    assert report.keep_float32 == [] and report.fixed is False
    assert "\nunderflow: not measured: the forward pass overflows float16 and no fix" in str(report)
    net[0].weight.set_data(mx.nd.full((4, 2), -7e4))
    report = mxfp16.find_overflow(net, mx.nd.ones((1, 2)))
    assert [(c.op, c.op_type, c.max_abs) for c in report.culprits] == \
        [("in_dense0_weight", "parameter", 7e4)]


def test_bfloat16_finds_nothing(attention_report):
    net, x, _ = attention_report
    report = mxfp16.find_overflow(net, x, label=mx.nd.zeros((4, 16, 1)),
                                  loss_fn=gluon.loss.L2Loss(), dtype="bfloat16")
    assert not report and report.culprits == [] and report.keep_float32 == []
    assert report.underflow == []  # bfloat16 has float32's range
    assert str(report).startswith("find_overflow (bfloat16, loss scale 1): no culprits")


def test_a_cast_network_hybridized_with_static_alloc_on_a_second_device(attention_report):
    _, x, expected = attention_report
    net = attention_net(ctx=[mx.cpu(0), mx.cpu(1)])
    cast = mxfp16.cast_block(net, "float16")
    cast.hybridize(static_alloc=True, static_shape=True)
    with autograd.train_mode():
        cast(x.as_in_context(mx.cpu(1)))  # builds its static_alloc CachedOp
    x1, y1 = (a.as_in_context(mx.cpu(1)) for a in attention_batch())
    report = mxfp16.find_overflow(cast, x1, label=y1, loss_fn=gluon.loss.L2Loss())
    assert [(c.path, c.op, c.phase) for c in report.culprits] == \
        [(c.path, c.op, c.phase) for c in expected.culprits]
    assert report.keep_float32 == ["att"]


def test_a_cast_network_keeping_a_block_gets_the_fix_with_that_block(attention_report):
    _, x, _ = attention_report
    cast = mxfp16.cast_block(attention_net(), "float16", keep_float32=["head"])
    report = mxfp16.find_overflow(cast, x, label=mx.nd.zeros((4, 16, 1)),
                                  loss_fn=gluon.loss.L2Loss())
    assert [c.path for c in report.culprits] == ["att"]
    assert report.keep_float32 == ["head", "att"] and report.fixed


@pytest.mark.slow
def test_the_network_its_trainer_and_mxnets_generator_are_left_as_they_were():
    def train(call):
        net = attention_net(dropout=0.5)
        x, y = attention_batch(std=1.0)
        cast = mxfp16.cast_block(net, "float16")
        cast.hybridize(static_alloc=True)
        trainer = mxfp16.Trainer(cast.collect_params(), "adam", {"learning_rate": 0.01},
                                 dtype="float16")
        mx.random.seed(7)
        for step in range(3):
            if call and step == 1:
                assert not mxfp16.find_overflow(cast, x, label=y, loss_fn=gluon.loss.L2Loss())
            with autograd.record():
                loss = gluon.loss.L2Loss()(cast(x), y)
            trainer.backward(loss)
            trainer.step(4)
        return {name: p.data().asnumpy() for name, p in cast.collect_params().items()}
    without, with_call = train(False), train(True)
    assert all(np.array_equal(without[name], with_call[name]) for name in without)


def test_the_numpy_interface():
    class NumpyAttention(nn.HybridBlock):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            with self.name_scope():
                self.query = nn.Dense(32, flatten=False)
                self.key = nn.Dense(32, flatten=False)
                self.head = nn.Dense(1, flatten=False)

        def hybrid_forward(self, F, x):
            scores = F.npx.batch_dot(self.query(x), self.key(x), transpose_b=True)
            return self.head(F.npx.softmax(scores, axis=-1))

    x, y = attention_batch()
    with mx.util.np_shape(True), mx.util.np_array(True):
        net = NumpyAttention(prefix="np_")
        net.initialize(mx.init.Xavier())
        net(x.as_np_ndarray())
        report = mxfp16.find_overflow(net, x.as_np_ndarray(), label=y.as_np_ndarray(),
                                      loss_fn=gluon.loss.L2Loss())
        assert not npx.is_np_array() or True
    assert [(c.path, c.op, c.phase) for c in report.culprits] == \
        [("", "np_batch_dot0", "forward")]
    # the network's own op: no block inside it to keep
    assert report.keep_float32 == [] and report.fixed is False


def tiny_bert():
    encoder = nlp.model.BERTEncoder(num_layers=2, units=16, hidden_size=32, max_length=16,
                                    num_heads=2)
    bert = nlp.model.BERTModel(encoder, vocab_size=40, token_type_vocab_size=2, units=16,
                               embed_size=16, use_decoder=False, use_classifier=False)
    return nlp.model.BERTClassifier(bert, num_classes=3)


@pytest.mark.slow
def test_bert_with_an_overflowing_feed_forward_layer():
    bert = tiny_bert()
    mx.random.seed(2)
    bert.initialize(mx.init.Normal(0.02))
    rng = np.random.RandomState(0)
    tokens, types = (mx.nd.array(rng.randint(0, n, (4, 8))) for n in (40, 2))
    bert(tokens, types, mx.nd.array([8, 5, 3, 8]))
    ffn_1 = bert.bert.encoder.transformer_cells[1].ffn.ffn_1
    ffn_1.weight.set_data(ffn_1.weight.data() * 1e6)
    report = mxfp16.find_overflow(bert, tokens, types, mx.nd.array([8, 5, 3, 8]),
                                  label=mx.nd.array([0, 1, 2, 1]))
    # the op carries the layer's Gluon prefix, whose counter (bertencoder<n>) depends on the blocks
    # the session made before: 'bertencoder0_transformer1_positionwiseffn0_ffn_1_fwd' alone
    assert ffn_1.prefix.endswith("_transformer1_positionwiseffn0_ffn_1_")
    assert [(c.path, c.op, c.phase) for c in report.culprits] == [
        ("bert.encoder.transformer_cells.1.ffn.ffn_1", ffn_1.prefix + "fwd", "forward")]
    # ffn_1 in float32 still hands 2.5e5 to its float16 activation: the whole feed-forward block
    assert report.keep_float32 == ["bert.encoder.transformer_cells.1.ffn"] and report.fixed


@pytest.mark.slow
def test_gluonnlps_nmt_model_a_plain_block_with_an_overflowing_encoder_layer():
    encoder, decoder, one_step = nlp.model.transformer.get_transformer_encoder_decoder(
        num_layers=1, units=16, hidden_size=32, num_heads=2, max_src_length=16, max_tgt_length=16)
    vocab = nlp.Vocab(nlp.data.count_tokens(list("abcdefghij")))
    model = nlp.model.translation.NMTModel(
        src_vocab=vocab, tgt_vocab=vocab, encoder=encoder, decoder=decoder,
        one_step_ahead_decoder=one_step, embed_size=16, prefix="nmt_")
    mx.random.seed(5)
    model.initialize(mx.init.Xavier())
    src = mx.nd.array(np.random.RandomState(2).randint(0, 10, (2, 6)))
    tgt = mx.nd.array(np.random.RandomState(3).randint(0, 10, (2, 5)))
    lengths = (mx.nd.array([6, 4]), mx.nd.array([5, 3]))
    model(src, tgt, *lengths)
    ffn_2 = model.encoder.transformer_cells[0].ffn.ffn_2
    ffn_2.weight.set_data(ffn_2.weight.data() * 3e4)
    mxfp16.cast_block(model, "float16")  # its HybridBlocks cast in place

    def loss_fn(out, label):
        return gluon.loss.SoftmaxCrossEntropyLoss()(out[0], label)
    report = mxfp16.find_overflow(model, src, tgt, *lengths, label=tgt, loss_fn=loss_fn)
    assert [(c.path, c.op, c.phase) for c in report.culprits] == [
        ("encoder.transformer_cells.0.ffn.ffn_2",
         "transformer_enc_transformer0_positionwiseffn0_ffn_2_fwd", "forward")]
    assert report.keep_float32 == ["encoder.transformer_cells.0.ffn.ffn_2"] and report.fixed
    # the attention masks, -1e18 by design, are inf in float16 and harmless: not culprits
    assert {c.op_type for c in report.contained} == {"_mul_scalar"}


def test_refused_in_one_line():
    net = attention_net()
    x, y = attention_batch()
    with pytest.raises(ValueError, match=r"dtype='float32': find_overflow runs in one of "
                                         r"float16, bfloat16"):
        mxfp16.find_overflow(net, x, dtype="float32")
    with pytest.raises(ValueError, match=r"loss_scale=0: give a positive number"):
        mxfp16.find_overflow(net, x, label=y, loss_scale=0)
    with pytest.raises(TypeError, match=r"inputs must be NDArrays .* got object"):
        mxfp16.find_overflow(net, x.asnumpy())
    with pytest.raises(TypeError, match=r"find_overflow takes a Gluon network"):
        mxfp16.find_overflow(x, x)
