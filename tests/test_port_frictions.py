"""What porting GluonNLP's and MXNet's own scripts to mxfp16 ran into, one test each.

GluonNLP 0.10's ``scripts/language_model/word_language_model.py`` (AWD-LSTM, ``--ntasgd``) and
``scripts/bert/finetune_classifier.py`` (``bertadam``): the script lines quoted below are theirs.
"""
import gluonnlp as nlp
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.signature import ImperativeCallError

VOCAB = 20


def awd_lstm(train=True, drop=(0.4, 0.5, 0.2, 0.65, 0.1)):
    kind = nlp.model.train.AWDRNN if train else nlp.model.AWDRNN
    return kind("lstm", VOCAB, 8, 8, 1, False, *drop)


def test_cast_block_keeps_the_originals_prefix_name_and_structure():
    model = awd_lstm()
    model.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(model, "float16")
    assert (net.prefix, net._prefix, net.name) == (model.prefix, model.prefix, model.name)
    text = repr(net)
    assert text.startswith("CastBlock(dtype='float16',\n  AWDRNN(") and "LSTM(8 -> 8, TNC)" in text
    assert "Symbol" not in text


def test_ntasgd_averaging_idiom_saves_weights_the_cast_evaluation_model_loads(tmp_path):
    """word_language_model.py --ntasgd: names without ``model._prefix``, loaded by model_eval."""
    model_eval = mxfp16.cast_block(awd_lstm(train=False), "float16")
    model = awd_lstm()
    model.initialize(mx.init.Xavier())
    model = mxfp16.cast_block(model, "float16")
    with autograd.record():  # the averaging starts after epochs of training
        model(mx.nd.ones((3, 2)), model.begin_state(2, func=mx.nd.zeros))
    parameters = model.collect_params()
    param_dict_avg = {k.split(model._prefix)[1]: v.data().copy() for k, v in parameters.items()}
    assert "hybridsequential0_embedding0_weight" in param_dict_avg
    path = str(tmp_path / "avg.params")
    mx.nd.save(path, param_dict_avg)
    model_eval.load_parameters(path, mx.cpu())
    for name, value in param_dict_avg.items():
        loaded = model_eval.collect_params()[model_eval.prefix + name].data()
        assert loaded.dtype == value.dtype and np.array_equal(loaded.asnumpy(), value.asnumpy())


def test_gluonnlps_bertadam_is_accepted_and_keeps_master_weights():
    assert mxfp16.make_optimizer("bertadam", "float16").multi_precision
    given = mx.optimizer.create("bertadam", learning_rate=1e-4, multi_precision=True)
    assert mxfp16.make_optimizer(given, "float16") is given
    dense = nn.Dense(2, in_units=3)
    dense.initialize(mx.init.One())
    net = mxfp16.cast_block(dense, "float16")
    trainer = mxfp16.Trainer(net.collect_params(), "bertadam", {"learning_rate": 1e-4},
                             loss_scale=8)
    for _ in range(3):
        with autograd.record():
            loss = net(mx.nd.ones((4, 3))).sum()
        trainer.backward(loss)
        assert trainer.step(4)
    master = mxfp16.optimizers.master_copies(dense.weight)[0].asnumpy()
    weight = dense.weight.data().asnumpy()
    assert master.dtype == np.float32 and np.all(master < 1.0)
    assert np.array_equal(master.astype(np.float16), weight)  # the weight is the copy rounded
    assert not np.array_equal(master, weight.astype(np.float32))  # which holds more


def test_a_registered_optimizer_without_master_weights_gets_one_clear_error():
    @mx.optimizer.register
    class NoMasterCopy(mx.optimizer.SGD):  # pylint: disable=unused-variable
        def create_state_multi_precision(self, index, weight):
            return self.create_state(index, weight)

        def update_multi_precision(self, index, weight, grad, state):
            self.update(index, weight, grad, state)

    try:
        assert not mxfp16.optimizers.keeps_master_weights("nomastercopy")
        with pytest.raises(ValueError, match=r"'nomastercopy' keeps no float32 master weights "
                                             r"with multi_precision=True \(its multi-precision "
                                             r"state holds no float32 copy.*choose one that "
                                             r"keeps them: .*bertadam"):
            mxfp16.make_optimizer("nomastercopy", "float16")
        assert mxfp16.make_optimizer("nomastercopy", "float32").multi_precision is False
    finally:
        del mx.optimizer.Optimizer.opt_registry["nomastercopy"]


def grads_of(dtype_net):
    """A Dense (float16 when cast) then LayerNorm (float32 parameters): mixed gradients."""
    net = nn.HybridSequential()
    net.add(nn.Dense(4, in_units=3), nn.LayerNorm(in_channels=4))
    net.initialize(mx.init.Xavier(magnitude=3))
    if dtype_net != "float32":
        net = mxfp16.cast_block(net, dtype_net)
    with autograd.record():
        loss = (net(mx.nd.arange(6).reshape((2, 3))) * mx.nd.arange(4)).sum()
    return net, loss


def test_gluons_clip_global_norm_on_float16_gradients_has_a_drop_in():
    mx.random.seed(0)
    net, loss = grads_of("float16")
    loss.backward()
    grads = [p.grad() for p in net.collect_params().values()]
    assert {g.dtype.__name__ for g in grads} == {"float16", "float32"}
    expected = np.sqrt(sum(float((g.asnumpy().astype(np.float64) ** 2).sum()) for g in grads))
    norm = mxfp16.clip_global_norm(grads, 0.5)
    assert norm == pytest.approx(expected, rel=1e-6)
    clipped = mxfp16.scaling.clipping.global_norm(grads).asscalar()
    assert clipped == pytest.approx(0.5, rel=2e-3)  # each float16 value rounded once
    # gluon.utils.clip_global_norm fails here: "dot only supports float32/float64 for CPU" (an
    # asynchronous error, which MXNet would raise again in later tests).


def test_gluonnlps_clip_grad_global_norm_manual_form_has_a_drop_in():
    mx.random.seed(0)
    net, loss = grads_of("float16")
    params = list(net.collect_params().values())
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             loss_scale=1024)
    trainer.backward(loss)
    with pytest.raises(RuntimeError, match=r"hold the loss scale \(1024\).*allreduce_grads"):
        mxfp16.clip_grad_global_norm(params, 0.5)
    trainer.allreduce_grads()  # divides the loss scale out
    unscaled = mxfp16.scaling.clipping.global_norm([p.grad() for p in params]).asscalar()
    norm = mxfp16.clip_grad_global_norm(params, 0.5)
    assert norm.dtype == np.float32 and norm.asscalar() == pytest.approx(unscaled, rel=1e-6)
    assert unscaled > 1.0
    assert mxfp16.scaling.clipping.global_norm([p.grad() for p in params]).asscalar() == \
        pytest.approx(0.5, rel=2e-3)
    assert trainer.update(2)
    with pytest.raises(mx.base.MXNetError, match="requires uniform type"):  # what it replaces
        nlp.utils.parameter.clip_grad_global_norm.__wrapped__(params, 0.5)


def _numpy_norm(arrays):
    return np.sqrt(sum(float((a.asnumpy().astype(np.float64) ** 2).sum()) for a in arrays))


def test_gluons_and_gluonnlps_unchanged_clipping_work_with_an_mxfp16_trainer():
    """An mxfp16.Trainer routes gluon.utils.clip_global_norm and nlp.utils.clip_grad_global_norm:
    float16 and float32 gradients of a cast network are clipped on a CPU (the originals fail:
    "dot only supports float32/float64 for CPU", "requires uniform type"); while the Trainer
    holds them scaled, the error names what to call."""
    mx.random.seed(0)
    net, loss = grads_of("float16")
    params = list(net.collect_params().values())
    trainer = mxfp16.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                             loss_scale=1024)
    grads = [p.grad() for p in params]
    for step in range(2):
        trainer.backward(loss)
        with pytest.raises(RuntimeError, match=r"\(1024\).*trainer.clip_global_norm\(max_norm\)"):
            gluon.utils.clip_global_norm(grads, 0.5)
        with pytest.raises(RuntimeError, match=r"\(1024\).*allreduce_grads\(\) first"):
            nlp.utils.clip_grad_global_norm(params, 0.5)
        trainer.allreduce_grads()  # divides the loss scale out
        expected = _numpy_norm(grads)
        if step == 0:
            norm = gluon.utils.clip_global_norm(grads, 0.5)
            assert isinstance(norm, float)
        else:
            norm = nlp.utils.clip_grad_global_norm(params, 0.5).asscalar()
        assert expected > 1.0 and norm == pytest.approx(expected, rel=1e-6)
        assert _numpy_norm(grads) == pytest.approx(0.5, rel=2e-3)
        assert {g.dtype.__name__ for g in grads} == {"float16", "float32"}
        assert trainer.update(2)
        with autograd.record():
            loss = (net(mx.nd.arange(6).reshape((2, 3))) * mx.nd.arange(4)).sum()


def test_a_hybrid_forward_calling_nd_functions_fails_at_cast_time_naming_the_line():
    model = nlp.model.StandardRNN("lstm", VOCAB, 8, 8, 1, 0.4, False)  # nd.Dropout when > 0
    model.initialize()
    with pytest.raises(ImperativeCallError, match=r"StandardRNN.hybrid_forward calls an mxnet.nd "
                                                  r"function directly \(gluonnlp/model/"
                                                  r"language_model.py:\d+: `encoded = nd.Dropout"):
        mxfp16.cast_block(model, "float16")
    without = nlp.model.StandardRNN("lstm", VOCAB, 8, 8, 1, 0.0, False)
    without.initialize()
    net = mxfp16.cast_block(without, "float16")
    out, _ = net(mx.nd.ones((3, 2)), without.begin_state(2, func=mx.nd.zeros))
    assert out.shape == (3, 2, VOCAB)


def dropout_run(dtype, seed=3):
    """Masks of a hybridized network with Dropout, and the random draw after it."""
    mx.random.seed(seed)
    net = nn.HybridSequential()
    net.add(nn.Dense(64, in_units=8), nn.Dropout(0.5, axes=(0,)), nn.Dropout(0.3))
    net.initialize(mx.init.One())
    net.hybridize(static_alloc=True)
    net = mxfp16.cast_block(net, dtype)
    with autograd.record():
        out = net(mx.nd.ones((4, 8)))
    return out.asnumpy() != 0, mx.nd.random.uniform(shape=(4,)).asnumpy()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cast_networks_dropout_draws_float32s_masks_from_the_same_seed(dtype):
    masks, after = dropout_run("float32")
    cast_masks, cast_after = dropout_run(dtype)
    assert 0.2 < masks.mean() < 0.6
    assert np.array_equal(masks, cast_masks) and np.array_equal(after, cast_after)


def test_a_float16_dropout_outside_the_graph_draws_other_masks_as_the_guide_says():
    """GluonNLP's WeightDropParameter runs nd.Dropout on the float16 weight it returns: MXNet's
    CPU random generator draws float16 numbers as doubles (two 32-bit draws each), float32 ones
    as floats (one): other masks, and the stream left elsewhere."""
    draws = {}
    for dtype in ("float32", "float16", "float64"):
        mx.random.seed(1)
        with autograd.train_mode():
            dropped = mx.nd.Dropout(mx.nd.ones((64, 64), dtype=dtype), p=0.5)
        draws[dtype] = dropped.asnumpy() != 0, mx.nd.random.uniform(shape=(4,)).asnumpy()
    assert not np.array_equal(draws["float32"][0], draws["float16"][0])
    assert not np.array_equal(draws["float32"][1], draws["float16"][1])
    assert np.array_equal(draws["float16"][0], draws["float64"][0])  # both drawn as doubles
    assert np.array_equal(draws["float16"][1], draws["float64"][1])


def test_finetune_classifiers_update_trains_a_cast_bert_with_bertadam():
    """scripts/bert/finetune_classifier.py's step (bertadam; allreduce_grads, GluonNLP's clipping
    form, update), on a tiny random BERT, with the clipping drop-in."""
    encoder = nlp.model.BERTEncoder(num_layers=1, units=16, hidden_size=32, max_length=16,
                                    num_heads=2)
    bert = nlp.model.BERTModel(encoder, vocab_size=40, token_type_vocab_size=2, units=16,
                               embed_size=16, use_decoder=False, use_classifier=False)
    model = nlp.model.BERTClassifier(bert, num_classes=2, dropout=0.0)
    mx.random.seed(4)
    model.initialize(mx.init.Normal(0.02))
    model.hybridize(static_alloc=True)
    model = mxfp16.cast_block(model, "float16")
    rng = np.random.RandomState(0)
    input_ids = mx.nd.array(rng.randint(0, 40, (8, 8)))
    segment_ids, valid_length = mx.nd.zeros((8, 8)), mx.nd.array([8, 5, 3, 8, 6, 7, 8, 4])
    label = mx.nd.array(input_ids[:, 0].asnumpy() % 2)
    trainer = mxfp16.Trainer(model.collect_params(), "bertadam",
                             {"learning_rate": 5e-3, "epsilon": 1e-6, "wd": 0.01},
                             update_on_kvstore=False)
    params = [p for p in model.collect_params().values() if p.grad_req != "null"]
    loss_function = gluon.loss.SoftmaxCELoss()
    losses = []
    for _ in range(12):
        with mx.autograd.record():
            ls = loss_function(model(input_ids, segment_ids, valid_length), label).mean()
        trainer.backward(ls)
        trainer.allreduce_grads()
        mxfp16.clip_grad_global_norm(params, 1)
        assert trainer.update(1)
        losses.append(float(ls.asscalar()))
    assert np.all(np.isfinite(losses)) and losses[-1] < 0.5 * losses[0]


def detach(hidden):
    return [detach(h) for h in hidden] if isinstance(hidden, (list, tuple)) else hidden.detach()


def test_the_awd_lstm_scripts_calls_train_a_cast_model_on_two_devices(tmp_path):
    """word_language_model.py's calls in its order, with the six edits of the guide: split over
    two devices, detached hidden states, trainer.backward, trainer.clip_global_norm, NT-ASGD's
    averaged weights saved by name and loaded into the cast evaluation model."""
    context = [mx.cpu(0), mx.cpu(1)]
    mx.random.seed(7)
    drop = (0.1, 0.1, 0.1, 0.1, 0.0)  # the script's dropouts, smaller for a short run
    model_eval = mxfp16.cast_block(awd_lstm(False, drop), "float16")
    model = awd_lstm(True, drop)
    model.initialize(mx.init.Xavier(), ctx=context)
    model.hybridize(static_alloc=True)
    model = mxfp16.cast_block(model, "float16")
    trainer = mxfp16.Trainer(model.collect_params(), "sgd", {"learning_rate": 10, "momentum": 0,
                                                             "wd": 0}, update_on_kvstore=False)
    loss = gluon.loss.SoftmaxCrossEntropyLoss()
    corpus = mx.nd.array(np.tile(np.arange(VOCAB), 16)[:, None] * np.ones((1, 4)))  # (T, batch)
    parameters = model.collect_params()
    hiddens = [model.begin_state(2, func=mx.nd.zeros, ctx=ctx) for ctx in context]
    param_dict_avg, losses = None, []
    for step, i in enumerate(range(0, len(corpus) - 11, 10)):
        data, target = corpus[i:i + 10], corpus[i + 1:i + 11]
        data_list = gluon.utils.split_and_load(data, context, batch_axis=1, even_split=True)
        target_list = gluon.utils.split_and_load(target, context, batch_axis=1, even_split=True)
        hiddens = detach(hiddens)
        Ls = []
        with autograd.record():
            for j, (X, y, h) in enumerate(zip(data_list, target_list, hiddens)):
                output, h, _, _ = model(X, h)
                Ls.append(loss(output.reshape(-3, -1), y.reshape(-1,)) / (len(context) * X.size))
                hiddens[j] = h
        trainer.backward(Ls)
        trainer.clip_global_norm(0.25)
        if step == 8:
            param_dict_avg = {k.split(model._prefix)[1]: v.data(context[0]).copy()
                              for k, v in parameters.items()}
        trainer.step(1)
        if param_dict_avg is not None:
            for name, param_avg in param_dict_avg.items():
                param_avg[:] += 0.5 * (parameters[f"{model._prefix}{name}"].data(context[0])
                                       - param_avg)
        losses.append(sum(float(L.sum().asscalar()) for L in Ls))
    assert np.all(np.isfinite(losses)) and np.mean(losses[-4:]) < 0.6 * np.mean(losses[:4])
    path = str(tmp_path / "model.params.val.params")
    mx.nd.save(path, param_dict_avg)
    model_eval.load_parameters(path, context)
    hidden = model_eval.begin_state(batch_size=4, func=mx.nd.zeros, ctx=context[0])
    output, _ = model_eval(corpus[:10], hidden)
    assert output.shape == (10, 4, VOCAB) and np.all(np.isfinite(output.asnumpy()))
