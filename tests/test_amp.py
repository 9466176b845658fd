"""mxfp16.amp against MXNet AMP's documented behaviour, and loops that make the API calls of the
scripts that use it (GluonCV's SSD script, MXNet's AMP tutorial, GluonNLP's BERT finetuning)."""
import json
import math
import os
import sys
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxfp16
from conftest import horovod_missing, started_ahead
from mxfp16 import amp
from mxfp16.amp import session as amp_session


@pytest.fixture(autouse=True)
def _amp_reset():
    amp.reset()
    yield
    amp.reset()


def _net(in_units=4, norm=True):
    """Dense, BatchNorm (or an identity: per-device batch statistics differ), ReLU, Dense."""
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(8, in_units=in_units),
            gluon.nn.BatchNorm(in_channels=8) if norm else gluon.nn.HybridLambda("identity"),
            gluon.nn.Activation("relu"), gluon.nn.Dense(3, in_units=8))
    return net


def _data(batch=8, seed=0):
    rng = np.random.RandomState(seed)
    return mx.nd.array(rng.randn(batch, 4)), mx.nd.array(rng.randint(0, 3, batch))


def _step(net, trainer, x, y, ctx_list=None):
    ctx_list = list(ctx_list or [mx.cpu()])
    xs = gluon.utils.split_and_load(x, ctx_list)
    ys = gluon.utils.split_and_load(y, ctx_list)
    with autograd.record():
        losses = [gluon.loss.SoftmaxCELoss()(net(a), b) for a, b in zip(xs, ys)]
        with amp.scale_loss(losses, trainer) as scaled:
            autograd.backward(scaled)
    trainer.step(x.shape[0])
    return sum(float(loss.sum().asscalar()) for loss in losses) / x.shape[0]


def test_from_mxfp16_amp_import_amp_has_mxnet_amps_module_names():
    """GluonNLP's BERT scripts write `from mxnet.contrib.amp import amp`: the same line works."""
    from mxnet.contrib.amp import amp as mxnet_amp

    from mxfp16.amp import amp as module
    assert module.__name__ == "mxfp16.amp.amp"
    assert set(mxnet_amp.__all__) <= set(module.__all__)
    assert all(getattr(module, name) is getattr(amp, name) for name in module.__all__)


@pytest.mark.parametrize("order", ["init_first", "network_first"])
def test_networks_built_before_or_after_init_train_in_float16(order):
    if order == "network_first":
        net = _net()
        amp.init()
    else:
        amp.init()
        net = _net()
    net.initialize(mx.init.Xavier())
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    x, y = _data()
    losses = [_step(net, trainer, x, y) for _ in range(6)]
    assert net[0].weight.data().dtype == np.float16
    assert net[1].gamma.data().dtype == np.float32  # normalization stays float32
    assert trainer.optimizer.multi_precision
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert amp.loss_scaler(trainer).num_steps == 6


def test_scale_loss_yields_scaled_loss_or_list():
    amp.init()
    net = _net()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", update_on_kvstore=False)
    amp.init_trainer(trainer, loss_scale=128)
    loss = mx.nd.array([1.5, -2.0])
    with amp.scale_loss(loss, trainer) as scaled:
        assert scaled.asnumpy().tolist() == [192.0, -256.0]
    with amp.scale_loss([loss, loss * 2], trainer) as scaled:
        assert isinstance(scaled, list)
        assert [s.asnumpy().tolist() for s in scaled] == [[192.0, -256.0], [384.0, -512.0]]


def _scaled_backward_beside_float32():
    """A float32 network, and the same weights under amp (static scale 1024) after one
    scale_loss backward: ``(x, y, reference, net, trainer)``."""
    x, y = _data()
    reference = _net()
    reference.initialize(mx.init.Xavier())
    values = [v.data().copy() for v in reference.collect_params().values()]
    amp.init()
    net = _net()
    net.initialize()
    for param, value in zip(net.collect_params().values(), values):
        param.set_data(value)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer, loss_scale=1024)
    with autograd.record():
        loss = gluon.loss.SoftmaxCELoss()(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    return x, y, reference, net, trainer


def test_unscale_then_clip_then_step_matches_float32():
    x, y, reference, net, trainer = _scaled_backward_beside_float32()
    amp.unscale(trainer)
    with autograd.record():
        ref_loss = gluon.loss.SoftmaxCELoss()(reference(x), y)
    ref_loss.backward()
    grad, ref_grad = net[3].weight.grad().asnumpy(), reference[3].weight.grad().asnumpy()
    np.testing.assert_allclose(grad, ref_grad, rtol=2e-2, atol=2e-3)  # unscaled, float16 values
    grads = [p.grad() for p in net.collect_params().values() if p.grad_req != "null"]
    norm = mxfp16.clip_global_norm(grads, 1e9)  # gluon.utils.clip_global_norm's float16 drop-in
    mxfp16.clip_global_norm(grads, 0.5 * norm)  # clipping to half the unscaled norm, in place
    before = net[3].weight.data().asnumpy().astype("float32")
    trainer.step(x.shape[0])
    step = net[3].weight.data().asnumpy().astype("float32") - before
    np.testing.assert_allclose(step, -0.1 * 0.5 * ref_grad / x.shape[0], rtol=5e-2, atol=2e-4)
    with autograd.record():
        loss = gluon.loss.SoftmaxCELoss()(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    amp.unscale(trainer)
    with pytest.raises(RuntimeError, match="divided by the loss scale twice"):
        amp.unscale(trainer)


def test_gluons_clip_global_norm_compares_the_true_norm_while_the_scale_is_held():
    """The unchanged gluon.utils.clip_global_norm between scale_loss and step, without unscale:
    float16 and float32 gradients on a CPU, the true norm compared with max_norm, the gradients
    left scaled for the step, which then moves the weights as float32's clipped step does."""
    x, y, reference, net, trainer = _scaled_backward_beside_float32()
    with autograd.record():
        ref_loss = gluon.loss.SoftmaxCELoss()(reference(x), y)
    ref_loss.backward()
    ref_grads = [p.grad().asnumpy() for p in reference.collect_params().values()
                 if p.grad_req != "null"]
    ref_norm = float(np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in ref_grads)))
    grads = [p.grad() for p in net.collect_params().values() if p.grad_req != "null"]
    assert {g.dtype.__name__ for g in grads} == {"float16", "float32"}
    scaled_grad = net[3].weight.grad().asnumpy().astype("float32")
    norm = gluon.utils.clip_global_norm(grads, 0.5 * ref_norm)
    assert norm == pytest.approx(ref_norm, rel=1e-2)
    np.testing.assert_allclose(net[3].weight.grad().asnumpy(), scaled_grad * 0.5 * ref_norm / norm,
                               rtol=2e-3, atol=1e-2)  # still scaled by 1024
    before = net[3].weight.data().asnumpy().astype("float32")
    trainer.step(x.shape[0])
    step = net[3].weight.data().asnumpy().astype("float32") - before
    np.testing.assert_allclose(step, -0.1 * 0.5 * ref_grads[-2] / x.shape[0], rtol=5e-2,
                               atol=2e-4)


def test_overflow_on_one_device_skips_the_step_on_every_device():
    devices = [mx.cpu(0), mx.cpu(1)]
    amp.init()
    net = _net()
    net.initialize(mx.init.Xavier(), ctx=devices)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer, loss_scale="dynamic:1024")
    x, y = _data()
    _step(net, trainer, x, y, devices)  # casts and runs one clean step
    before = [w.asnumpy() for w in net[0].weight.list_data()]
    xs, ys = gluon.utils.split_and_load(x, devices), gluon.utils.split_and_load(y, devices)
    with autograd.record():
        losses = [gluon.loss.SoftmaxCELoss()(net(a), b) for a, b in zip(xs, ys)]
        with amp.scale_loss(losses, trainer) as scaled:
            autograd.backward(scaled)
    net[3].weight.list_grad()[1][0, 0] = np.inf  # device 1 only
    trainer.step(x.shape[0])
    for array, old in zip(net[0].weight.list_data(), before):
        np.testing.assert_array_equal(array.asnumpy(), old)
    scaler = amp.loss_scaler(trainer)
    assert (scaler.loss_scale, scaler.num_skipped, scaler.num_steps) == (512.0, 1, 2)


def test_two_devices_train_like_one():
    x, y = _data(seed=3)
    weights = []
    for devices in ([mx.cpu(0)], [mx.cpu(0), mx.cpu(1)]):
        amp.reset()
        amp.init()
        mx.random.seed(7)
        net = _net(norm=False)
        net.initialize(mx.init.Xavier(), ctx=devices)
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.2},
                                update_on_kvstore=False)
        amp.init_trainer(trainer, loss_scale=256)
        for _ in range(3):
            _step(net, trainer, x, y, devices)
        weights.append(net[3].weight.data(devices[0]).asnumpy().astype("float32"))
    np.testing.assert_allclose(weights[0], weights[1], rtol=1e-2, atol=2e-3)


def test_update_on_kvstore_true_is_refused_and_optimizer_too():
    amp.init()
    net = _net()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", update_on_kvstore=True)
    with pytest.raises(ValueError, match="update_on_kvstore=False"):
        amp.init_trainer(trainer)
    with pytest.raises(TypeError, match="takes the gluon.Trainer"):
        amp.init_trainer(mx.optimizer.SGD())
    devices = [mx.cpu(0), mx.cpu(1)]  # gluon.Trainer's default then updates on its kvstore
    net.collect_params().reset_ctx(devices)
    trainer = gluon.Trainer(net.collect_params(), "sgd")
    amp.init_trainer(trainer)
    before = net[0].weight.data().asnumpy()
    with pytest.raises(RuntimeError, match=r"update_on_kvstore=False"):
        _step(net, trainer, *_data(), devices)
    np.testing.assert_array_equal(net[0].weight.data().asnumpy(), before.astype("float16"))


def test_api_before_init_and_bad_dtype():
    net = _net()
    net.initialize()
    with pytest.raises(RuntimeError, match=r"call amp.init\(\) first"):
        amp.init_trainer(gluon.Trainer(net.collect_params(), "sgd"))
    with pytest.raises(ValueError, match="target_dtype='float64'.*float16 or bfloat16"):
        amp.init("float64")
    with pytest.raises(ValueError, match="none of MXNet AMP's lists"):
        amp.init(fp32_ops=["NoSuchOp"])


def test_bfloat16_trains_without_loss_scaling():
    amp.init(target_dtype="bfloat16")
    net = _net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    x, y = _data()
    losses = [_step(net, trainer, x, y) for _ in range(6)]
    assert amp.loss_scaler(trainer).loss_scale == 1.0
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]


def test_checkpoints_stay_float32_and_load_back(tmp_path):
    amp.init()
    net = _net()
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    x, y = _data()
    _step(net, trainer, x, y)
    net.save_parameters(str(tmp_path / "net.params"))
    trainer.save_states(str(tmp_path / "net.states"))
    saved = mx.nd.load(str(tmp_path / "net.params"))
    assert {v.dtype for v in saved.values()} == {np.float32}
    net.load_parameters(str(tmp_path / "net.params"))
    assert net[0].weight.data().dtype == np.float16
    scale = amp.loss_scaler(trainer).loss_scale
    amp.loss_scaler(trainer).load_state_dict({"loss_scale": 2.0})
    trainer.load_states(str(tmp_path / "net.states"))
    _step(net, trainer, x, y)  # the scaler takes back the state saved with the optimizer
    assert amp.loss_scaler(trainer).num_steps == 2
    assert amp.loss_scaler(trainer).loss_scale == scale
    amp.reset()
    plain = _net()
    plain.load_parameters(str(tmp_path / "net.params"))
    assert plain[0].weight.data().dtype == np.float32


def test_convert_bucketing_module_runs_every_bucket_in_float16():
    def sym_gen(key):
        data = mx.sym.var("data")
        net = mx.sym.FullyConnected(data, num_hidden=8, name="fc1")
        net = mx.sym.Activation(net, act_type="relu")
        net = mx.sym.FullyConnected(net, num_hidden=3, name="fc2")
        return mx.sym.SoftmaxOutput(net, name="softmax"), ("data",), ("softmax_label",)

    module = mx.mod.BucketingModule(sym_gen, default_bucket_key=4, context=mx.cpu())
    module.bind([("data", (2, 4))], [("softmax_label", (2,))])
    module.init_params(mx.init.Xavier())
    converted = amp.convert_bucketing_module(module, cast_optional_params=True)
    batch = mx.io.DataBatch([mx.nd.ones((2, 4))], [mx.nd.zeros(2)], bucket_key=4,
                            provide_data=[("data", (2, 4))],
                            provide_label=[("softmax_label", (2,))])
    outputs = []
    for mod in (module, converted):
        mod.forward(batch, is_train=False)
        outputs.append(mod.get_outputs()[0].asnumpy())
    np.testing.assert_allclose(outputs[1], outputs[0], rtol=1e-2, atol=1e-3)
    args, _ = converted.get_params()
    assert args["fc1_weight"].dtype == np.float16


def _tutorial_conv_net():
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, num_filter=4, kernel=(3, 3), name="conv0")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(net, num_hidden=3, name="fc1")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def test_tutorial_convert_model_with_op_lists():
    """The tutorial's last example: only Convolution in float16, cast_optional_params=True; the
    float16 graph's parameters, and its CPU emulation (emulate=True) running it."""
    sym = _tutorial_conv_net()
    mod = mx.mod.Module(sym, context=mx.cpu())
    mod.bind([("data", (1, 3, 8, 8))], [("softmax_label", (1,))])
    mod.init_params(mx.init.Xavier())
    arg_params, aux_params = mod.get_params()
    options = dict(target_dtype_ops=["Convolution"], fp32_ops=["SoftmaxOutput", "FullyConnected"],
                   cast_optional_params=True)
    _, gpu_args, _ = amp.convert_model(sym, arg_params, aux_params, **options)
    assert gpu_args["conv0_weight"].dtype == np.float16
    assert gpu_args["fc1_bias"].dtype == np.float32
    result_sym, result_args, result_aux = amp.convert_model(sym, arg_params, aux_params,
                                                            emulate=True, **options)
    amp_mod = mx.mod.Module(result_sym, data_names=["data"], label_names=["softmax_label"],
                            context=mx.cpu())
    amp_mod.bind(data_shapes=[["data", (1, 3, 8, 8)]], label_shapes=[["softmax_label", (1,)]])
    amp_mod.set_params(result_args, result_aux)
    batch = mx.io.DataBatch(data=[mx.nd.ones((1, 3, 8, 8))], label=[mx.nd.ones((1,))])
    amp_mod.forward(batch)
    mod.forward(batch, is_train=False)
    np.testing.assert_allclose(amp_mod.get_outputs()[0].asnumpy(),
                               mod.get_outputs()[0].asnumpy(), rtol=1e-2, atol=1e-3)


def test_tutorial_convert_hybrid_block_keeps_the_original():
    from gluoncv.model_zoo import get_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = get_model("resnet18_v1", classes=4)
        model.initialize()
        model.hybridize()
        expected = model(mx.nd.ones((1, 3, 32, 32)))
        converted = amp.convert_hybrid_block(model)
    result = converted.forward(mx.nd.ones((1, 3, 32, 32), dtype=np.float32))
    np.testing.assert_allclose(result.asnumpy(), expected.asnumpy(), rtol=5e-2, atol=5e-2)
    assert model.features[0].weight.data().dtype == np.float32


def _ssd(size):
    from gluoncv.model_zoo import get_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = get_model("ssd_300_mobilenet0.25_voc", pretrained_base=False,
                        norm_layer=gluon.nn.BatchNorm)
        net.initialize()
    return net


def _boxes_batch(anchors, size, batch, seed):
    """``(images, cls_targets, box_targets)`` through GluonCV's SSD train transform, from images
    with one bright box each (class 0 or 1)."""
    from gluoncv.data.transforms.presets.ssd import SSDDefaultTrainTransform
    transform = SSDDefaultTrainTransform(size, size, anchors)
    rng = np.random.RandomState(seed)
    samples = []
    for _ in range(batch):
        image = mx.nd.array(rng.randint(0, 60, (size, size, 3)), dtype="uint8")
        x0, y0 = rng.randint(0, size // 2, 2)
        image[y0:y0 + size // 3, x0:x0 + size // 3] = 230
        label = np.array([[x0, y0, x0 + size // 3, y0 + size // 3, rng.randint(2), 0]], "float32")
        samples.append(transform(image, label))
    return [mx.nd.stack(*[sample[i] for sample in samples]) for i in range(3)]


def _ssd_amp_step(net, mbox_loss, trainer, batch, ctx):
    """One step as GluonCV's train_ssd.py --amp and MXNet's AMP tutorial take it (the same calls
    in the same order): per-device forward, SSDMultiBoxLoss, scale_loss, backward, step(1).
    Returns the summed and class losses."""
    data, cls_targets, box_targets = [gluon.utils.split_and_load(b, ctx_list=ctx, batch_axis=0)
                                      for b in batch]
    with autograd.record():
        cls_preds, box_preds = [], []
        for x in data:
            cls_pred, box_pred, _ = net(x)
            cls_preds.append(cls_pred)
            box_preds.append(box_pred)
        sum_loss, cls_loss, _ = mbox_loss(cls_preds, box_preds, cls_targets, box_targets)
        with amp.scale_loss(sum_loss, trainer) as scaled_loss:
            autograd.backward(scaled_loss)
    trainer.step(1)
    return sum_loss, cls_loss


@pytest.mark.slow
def test_gluoncv_ssd_script_loop(tmp_path):
    """train_ssd.py --amp's calls, in its order: init, network, anchors (float32, before the
    Trainer), Trainer(update_on_kvstore=False), init_trainer, hybridize(static_alloc=True,
    static_shape=True), scale_loss over the list of losses, step(1), validation, save_params."""
    import gluoncv as gcv
    size, ctx = 128, [mx.cpu()]
    amp.init()
    mx.random.seed(1)
    net = _ssd(size)
    net.collect_params().reset_ctx(ctx[0])
    with autograd.train_mode():
        _, _, anchors = net(mx.nd.zeros((1, 3, size, size), ctx[0]))
    batch = _boxes_batch(anchors.as_in_context(mx.cpu()), size, 2, seed=0)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.01, "wd": 0.0005, "momentum": 0.9},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    mbox_loss = gcv.loss.SSDMultiBoxLoss()
    net.hybridize(static_alloc=True, static_shape=True)
    losses = []
    for _ in range(4):
        sum_loss, cls_loss = _ssd_amp_step(net, mbox_loss, trainer, batch, ctx)
        losses.append(float(sum_loss[0].mean().asscalar()))
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert net.class_predictors[0].predictor.weight.data().dtype == np.float16
    net.set_nms(nms_thresh=0.45, nms_topk=400)
    ids, scores, bboxes = net(batch[0])
    assert ids.shape[:2] == scores.shape[:2] == bboxes.shape[:2] and bboxes.dtype == np.float32
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # save_params is deprecated; the script calls it
        net.save_params(str(tmp_path / "ssd.params"))
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "ssd.params")).values()} == {np.float32}


@pytest.mark.slow
def test_mxnet_amp_tutorial_training_loop():
    """The tutorial's training code: a network built before init() and one after, synthetic
    targets, Trainer(update_on_kvstore=False), init_trainer, scale_loss, step(1)."""
    import gluoncv as gcv
    size, ctx = 128, [mx.cpu()]
    _ssd(size)  # the tutorial's float32 run builds one first
    amp.init()
    net = _ssd(size)
    net.collect_params().reset_ctx(ctx)
    net.hybridize(static_alloc=True, static_shape=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"learning_rate": 0.001, "wd": 0.0005, "momentum": 0.9},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    mbox_loss = gcv.loss.SSDMultiBoxLoss()
    with autograd.train_mode():
        num_anchors = net(mx.nd.zeros((1, 3, size, size)))[2].shape[1]
    rng = np.random.RandomState(0)
    batch = [mx.nd.array(rng.uniform(-1, 1, (2, 3, size, size))),
             mx.nd.array(rng.randint(0, 2, (2, num_anchors))),  # the tutorial's uniform(0, 1)
             mx.nd.array(rng.uniform(0, 1, (2, num_anchors, 4)))]  # as targets, made learnable
    ce_metric = mx.metric.Loss("CrossEntropy")
    losses = []
    for _ in range(3):
        sum_loss, cls_loss = _ssd_amp_step(net, mbox_loss, trainer, batch, ctx)
        ce_metric.update(0, [loss * 2 for loss in cls_loss])
        losses.append(float(sum_loss[0].mean().asscalar()))
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert math.isfinite(ce_metric.get()[1])
    assert amp.loss_scaler(trainer).num_steps == 3


def _bert_finetune(dtype, threshold=None, steps=12):
    """finetune_classifier.py's calls in its order (--dtype float16: the AMP ones) on a tiny random
    BERT: init, model, hybridize(static_alloc=True), Trainer('bertadam', its default epsilon 1e-6,
    update_on_kvstore=False), init_trainer, set_learning_rate, scale_loss, allreduce_grads,
    nlp.utils.clip_grad_global_norm(params, 1), update(1).  ``threshold``: finetune_squad.py's
    form instead, ``norm_clip = threshold * trainer._amp_loss_scaler.loss_scale`` read inside the
    scale_loss block.  Returns the losses, the clipping calls' norms in float32 units, the
    training accuracy, the model and the trainer."""
    import gluonnlp as nlp
    amp.reset()
    if dtype == "float16":
        amp.init()
    mx.random.seed(2)
    encoder = nlp.model.BERTEncoder(num_layers=1, units=16, hidden_size=32, max_length=16,
                                    num_heads=2, dropout=0.0, output_attention=False,
                                    output_all_encodings=False)
    bert = nlp.model.BERTModel(encoder, 30, token_type_vocab_size=2, units=16, embed_size=16,
                               word_embed=None, use_pooler=True, use_decoder=False,
                               use_classifier=False)
    model = nlp.model.BERTClassifier(bert, dropout=0.1, num_classes=2)
    model.initialize(mx.init.Normal(0.02))
    loss_function = gluon.loss.SoftmaxCELoss()
    model.hybridize(static_alloc=True)
    loss_function.hybridize(static_alloc=True)
    all_model_params = model.collect_params()
    trainer = gluon.Trainer(all_model_params, "bertadam",
                            {"learning_rate": 5e-3, "epsilon": 1e-6, "wd": 0.01},
                            update_on_kvstore=False)
    if dtype == "float16":
        amp.init_trainer(trainer)
    for _, v in model.collect_params(".*beta|.*gamma|.*bias").items():
        v.wd_mult = 0.0
    params = [p for p in all_model_params.values() if p.grad_req != "null"]
    rng = np.random.RandomState(0)
    label = mx.nd.array(rng.randint(0, 2, 16), dtype="int32")
    input_ids = mx.nd.array(rng.randint(3, 15, (16, 6)) + 15 * label.asnumpy()[:, None])
    segment_ids, valid_length = mx.nd.zeros((16, 6)), mx.nd.full((16,), 6)
    losses, norms = [], []
    for _ in range(steps):
        trainer.set_learning_rate(5e-3)
        with mx.autograd.record():
            out = model(input_ids, segment_ids, valid_length.astype("float32"))
            ls = loss_function(out, label).mean()
            if dtype == "float16":
                with amp.scale_loss(ls, trainer) as scaled_loss:
                    mx.autograd.backward(scaled_loss)
                    if threshold:
                        norm_clip = threshold * trainer._amp_loss_scaler.loss_scale
            else:
                ls.backward()
                norm_clip = threshold
        trainer.allreduce_grads()
        if threshold:  # the norm it returns is in norm_clip's (scaled) units
            norms.append(nlp.utils.clip_grad_global_norm(params, norm_clip).asscalar()
                         * threshold / norm_clip)
        else:
            norms.append(nlp.utils.clip_grad_global_norm(params, 1).asscalar())
        trainer.update(1)
        losses.append(float(ls.asscalar()))
    predicted = model(input_ids, segment_ids, valid_length).argmax(axis=1)
    accuracy = float((predicted == label.astype("float32")).mean().asscalar())
    return losses, norms, accuracy, model, trainer


def test_gluonnlp_bert_finetune_loop_clips_and_learns_like_float32(tmp_path):
    """finetune_classifier.py clips with max_norm 1 between allreduce_grads and update while the
    gradients still hold the loss scale: the routed nlp.utils.clip_grad_global_norm compares the
    true norm with 1 (mxnet#15738), so float16 learns as float32 does.  Clipping the scaled
    gradients to norm 1 (MXNet AMP) left the loss at 0.62-0.69 after 12 steps, accuracy 0.62."""
    import gluonnlp as nlp
    ref_losses, ref_norms, ref_accuracy, _, _ = _bert_finetune("float32")
    losses, norms, accuracy, model, trainer = _bert_finetune("float16")
    assert ref_accuracy == accuracy == 1.0 and ref_losses[-1] < 0.01
    # float32's gradients stay below norm 1: the scaled ones (x 2**15) would all be clipped
    assert max(ref_norms) < 1 < min(ref_norms) * amp.loss_scaler(trainer).loss_scale
    np.testing.assert_allclose(norms, ref_norms, rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-2, atol=2e-3)
    assert amp.loss_scaler(trainer).loss_scale > 1 and amp.loss_scaler(trainer).num_skipped == 0
    nlp.utils.save_parameters(model, str(tmp_path / "model_bert.params"))
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "model_bert.params")).values()} == \
        {np.float32}
    nlp.utils.load_parameters(model, str(tmp_path / "model_bert.params"))
    assert model.classifier[-1].weight.data().dtype == np.float16


def test_gluonnlp_squad_threshold_times_loss_scale_clips_like_float32():
    """finetune_squad.py reads trainer._amp_loss_scaler.loss_scale inside the scale_loss block and
    clips with norm_clip = 1.0 * size * loss_scale (MXNet AMP's scaled units): the routed function
    takes that threshold in scaled units, so clipping and training match float32's."""
    ref_losses, ref_norms, _, _, _ = _bert_finetune("float32", threshold=0.3)
    losses, norms, _, _, trainer = _bert_finetune("float16", threshold=0.3)
    assert amp.loss_scaler(trainer).loss_scale > 1
    assert sum(norm > 0.3 for norm in ref_norms) >= 3  # the clipping bites
    np.testing.assert_allclose(norms, ref_norms, rtol=2e-2, atol=2e-3)
    np.testing.assert_allclose(losses, ref_losses, rtol=5e-2, atol=2e-3)


def test_reset_restores_the_clipping_functions_and_float32_calls_keep_their_results():
    import gluonnlp as nlp
    originals = (gluon.utils.clip_global_norm, nlp.utils.clip_grad_global_norm,
                 nlp.utils.parameter.clip_grad_global_norm)
    amp.init()
    routed = (gluon.utils.clip_global_norm, nlp.utils.clip_grad_global_norm,
              nlp.utils.parameter.clip_grad_global_norm)
    assert routed[0] is not originals[0] and routed[1] is routed[2] is not originals[1]
    rng = np.random.RandomState(0)
    values = [rng.randn(5).astype("float32") * 3, rng.randn(2, 3).astype("float32")]
    arrays = [mx.nd.array(v) for v in values]
    expected = [mx.nd.array(v) for v in values]
    assert routed[0](arrays, 1.0) == originals[0](expected, 1.0)
    for array, reference in zip(arrays, expected):
        assert np.array_equal(array.asnumpy(), reference.asnumpy())
    def params_of(prefix):
        params = [gluon.Parameter(f"{prefix}{index}", shape=value.shape)
                  for index, value in enumerate(values)]
        for param, value in zip(params, values):
            param.initialize()
            param.grad()[:] = value
        return params

    params, expected_params = params_of("routed"), params_of("original")
    assert routed[1](params, 1.0).asscalar() == originals[1](expected_params, 1.0).asscalar()
    for param, reference in zip(params, expected_params):
        assert np.array_equal(param.grad().asnumpy(), reference.grad().asnumpy())
    amp.reset()
    assert all(now is then for now, then in zip(
        (gluon.utils.clip_global_norm, nlp.utils.clip_grad_global_norm,
         nlp.utils.parameter.clip_grad_global_norm), originals))


def test_gluonnlp_imported_after_init_is_routed_by_init_trainer(monkeypatch):
    import types
    for name in ("gluonnlp.utils", "gluonnlp.utils.parameter"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    amp.init()  # GluonNLP not imported (as far as sys.modules shows)

    def clip_grad_global_norm(parameters, max_norm, check_isfinite=True):
        return "original"
    later = types.ModuleType("gluonnlp.utils")
    later.clip_grad_global_norm = clip_grad_global_norm
    monkeypatch.setitem(sys.modules, "gluonnlp.utils", later)
    net = _net()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", update_on_kvstore=False)
    amp.init_trainer(trainer)
    assert later.clip_grad_global_norm.__wrapped__ is clip_grad_global_norm
    assert later.clip_grad_global_norm(net.collect_params().values(), 1.0) == "original"  # float32
    amp.reset()
    assert later.clip_grad_global_norm is clip_grad_global_norm


def test_an_overflowing_norm_leaves_the_gradients_to_the_skipped_step():
    import gluonnlp as nlp
    amp.init()
    net = _net()
    net.initialize()
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer, loss_scale="dynamic:1024")
    x, y = _data()
    with autograd.record():
        loss = gluon.loss.SoftmaxCELoss()(net(x), y)
        with amp.scale_loss(loss, trainer) as scaled:
            autograd.backward(scaled)
    net[0].weight.grad()[0, 0] = np.inf
    before = net[3].weight.grad().asnumpy()
    weights = net[3].weight.data().asnumpy()
    params = list(net.collect_params().values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an overflow the step skips: no "nan or inf" warning
        norm = nlp.utils.clip_grad_global_norm(params, 1e-3)
    assert norm.asscalar() == np.inf
    assert np.array_equal(net[3].weight.grad().asnumpy(), before)  # left scaled, unclipped
    trainer.step(x.shape[0])
    assert np.array_equal(net[3].weight.data().asnumpy(), weights)
    assert amp.loss_scaler(trainer).num_skipped == 1 and amp.loss_scaler(trainer).loss_scale == 512


HOROVOD_TEST = "test_horovod_distributed_trainer_skips_on_every_rank"


@pytest.fixture(scope="module", autouse=True)
def horovod_job(request):
    """The 2-rank job of :data:`HOROVOD_TEST`, started with this module's first test
    (conftest.started_ahead): it trains on one core while the in-process tests here run."""
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.dirname(tests_dir)
    env = dict(os.environ, OMP_NUM_THREADS="1", MXNET_CPU_WORKER_NTHREADS="1",
               PYTHONPATH=os.pathsep.join([repo, tests_dir, os.environ.get("PYTHONPATH", "")]))
    command = ["horovodrun", "-np", "2", "-H", "localhost:2", "--gloo", sys.executable,
               os.path.join(tests_dir, "amp_horovod_worker.py")]
    test = HOROVOD_TEST if horovod_missing() is None else None
    with started_ahead(request, test, command, timeout=120, cwd=repo, env=env) as result:
        yield result


@pytest.mark.slow
@pytest.mark.skipif(horovod_missing() is not None, reason=str(horovod_missing()))
def test_horovod_distributed_trainer_skips_on_every_rank(horovod_job):
    """A script's own hvd.DistributedTrainer, 2 ranks over Gloo: an overflow on rank 1 only skips
    the step on both, which keep the same weights and the same scale."""
    job = horovod_job()
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    ranks = sorted((json.loads(line.split(":", 1)[1]) for line in job.stdout.splitlines()
                    if line.endswith("}") and "<stdout>:" in line), key=lambda r: r["rank"])
    assert [r["rank"] for r in ranks] == [0, 1]
    for rank in ranks:
        assert rank["skipped"] == [0, 0, 0, 1, 0, 0] and rank["dtype"] == "float16"
        assert rank["losses"][-1] < rank["losses"][0]
    assert ranks[0]["scale"] == ranks[1]["scale"]
    assert ranks[0]["weights"] == ranks[1]["weights"]


class _Scaled(gluon.HybridBlock):
    """A block with a setting its graph depends on, changed as GluonCV's ``set_nms`` does."""

    def __init__(self):
        super().__init__()
        self.factor = 1.0
        with self.name_scope():
            self.dense = gluon.nn.Dense(2, in_units=3)

    def set_factor(self, factor):
        self._clear_cached_op()
        self.factor = factor

    def hybrid_forward(self, F, x):
        return self.dense(x) * self.factor


def test_a_graph_changed_after_the_cast_is_traced_again(tmp_path):
    amp.init()
    net = _Scaled()
    net.initialize()
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", update_on_kvstore=False)
    amp.init_trainer(trainer)
    x = mx.nd.ones((1, 3))
    before = net(x).asnumpy()
    net.hybridize(static_alloc=True, static_shape=True)  # hybridize alone keeps the cast
    assert (net(x).asnumpy() == before).all()
    net.set_factor(4.0)
    net.save_parameters(str(tmp_path / "scaled.params"))  # still through the cast network
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "scaled.params")).values()} == \
        {np.float32}
    np.testing.assert_array_equal(net(x).asnumpy(), 4.0 * before)
    assert net.dense.weight.data().dtype == np.float16


def test_gradients_that_overflow_unscaled_train_below_scale_one():
    """A summed loss whose float16 gradients overflow at scale 1 (YOLOv3's objectness over all
    anchors): steps are skipped while the scale halves below 1, then the measured start fits it."""
    amp.init()
    mx.random.seed(5)
    net = _net(norm=False)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 1e-5},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    x = mx.nd.full((8, 4), 100.0)
    net(x)  # the cast: float16 weights from here on
    weights = []
    for _ in range(8):
        weights.append(net[3].weight.data().asnumpy())
        with autograd.record():
            loss = net(x).sum() * 1000.0  # float16 weight gradients of ~1e6 at scale 1
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        trainer.step(8)
    scaler = amp.loss_scaler(trainer)
    assert scaler.num_skipped >= 2 and scaler.loss_scale < 0.5  # 1 and 1/2 overflow at least
    np.testing.assert_array_equal(weights[0], weights[2])  # skipped: weights untouched
    assert (net[3].weight.data().asnumpy() != weights[0]).any()  # then steps update


def test_mxnet_amps_own_scale_loss_works_with_the_trainer():
    """GluonCV's R-CNN ForwardBackwardTask calls mxnet.contrib.amp.scale_loss itself: with a
    Trainer given to mxfp16's init_trainer it scales by mxfp16's scale, updates like mxfp16's
    scale_loss, and an overflow is skipped."""
    from mxnet.contrib import amp as mxnet_amp
    x, y = _data()
    weights = []
    for scale_loss in (amp.scale_loss, mxnet_amp.scale_loss):
        amp.reset()
        amp.init()
        mx.random.seed(4)
        net = _net(norm=False)
        net.initialize(mx.init.Xavier())
        trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                                update_on_kvstore=False)
        amp.init_trainer(trainer, loss_scale=512)
        for step in range(3):
            with autograd.record():
                loss = gluon.loss.SoftmaxCELoss()(net(x), y)
                with scale_loss(loss, trainer) as scaled:
                    assert float(scaled.sum().asscalar()) == \
                        pytest.approx(512 * float(loss.sum().asscalar()), rel=1e-6)
                    autograd.backward(scaled)
            if step == 2:
                net[3].weight.grad()[0, 0] = np.inf
            trainer.step(x.shape[0])
        assert amp.loss_scaler(trainer).num_skipped == 1
        weights.append(net[3].weight.data().asnumpy())
    np.testing.assert_array_equal(weights[0], weights[1])


@pytest.mark.slow
def test_gluoncv_yolo3_script_loop(tmp_path):
    """train_yolo3.py --amp's calls, in its order: init, network (pretrained_base=False), the
    train transform's call of the network (float32, before the Trainer), Trainer('sgd',
    kvstore='local', update_on_kvstore=False), init_trainer, hybridize(), the 7-input training
    call, scale_loss over the list of summed losses, step(batch_size), validation after set_nms,
    save_parameters."""
    from gluoncv.data.transforms.presets.yolo import YOLO3DefaultTrainTransform
    from gluoncv.model_zoo import get_model
    import random
    size, ctx = 96, [mx.cpu()]
    amp.init()
    mx.random.seed(3)
    np.random.seed(3)  # the transform's random crops, flips and colours
    random.seed(3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = get_model("yolo3_mobilenet0.25_voc", pretrained_base=False)
        net.initialize()
    transform = YOLO3DefaultTrainTransform(size, size, net)
    rng = np.random.RandomState(0)
    samples = []
    for _ in range(2):
        image = mx.nd.array(rng.randint(0, 60, (size, size, 3)), dtype="uint8")
        x0, y0 = rng.randint(0, size // 2, 2)
        image[y0:y0 + size // 3, x0:x0 + size // 3] = 230
        label = np.array([[x0, y0, x0 + size // 3, y0 + size // 3, rng.randint(2), 0]],
                         "float32")
        samples.append(transform(image, label))
    batch = [mx.nd.stack(*[sample[i] for sample in samples]) for i in range(7)]
    net.collect_params().reset_ctx(ctx)
    trainer = gluon.Trainer(net.collect_params(), "sgd",
                            {"wd": 0.0005, "momentum": 0.9, "learning_rate": 0.001},
                            kvstore="local", update_on_kvstore=False)
    amp.init_trainer(trainer)
    net.hybridize()
    losses = []
    for _ in range(4):
        data = gluon.utils.split_and_load(batch[0], ctx_list=ctx, batch_axis=0)
        fixed_targets = [gluon.utils.split_and_load(batch[it], ctx_list=ctx, batch_axis=0)
                         for it in range(1, 6)]
        gt_boxes = gluon.utils.split_and_load(batch[6], ctx_list=ctx, batch_axis=0)
        sum_losses = []
        with autograd.record():
            for ix, x in enumerate(data):
                obj_loss, center_loss, scale_loss, cls_loss = net(
                    x, gt_boxes[ix], *[ft[ix] for ft in fixed_targets])
                sum_losses.append(obj_loss + center_loss + scale_loss + cls_loss)
            with amp.scale_loss(sum_losses, trainer) as scaled_loss:
                autograd.backward(scaled_loss)
        trainer.step(2)
        losses.append(float(sum_losses[0].mean().asscalar()))
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    net.set_nms(nms_thresh=0.45, nms_topk=400)
    ids, scores, bboxes = net(batch[0])
    assert bboxes.dtype == np.float32 and ids.shape[:2] == bboxes.shape[:2]
    net.save_parameters(str(tmp_path / "yolo3.params"))
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "yolo3.params")).values()} == \
        {np.float32}


def test_an_optimizer_without_master_weights_is_refused():
    amp.init()
    net = _net()
    net.initialize()
    with pytest.raises(ValueError, match="keeps no float32 master weights"):
        amp.init_trainer(gluon.Trainer(net.collect_params(), "lamb", update_on_kvstore=False))


def test_a_softmaxoutput_loss_is_scaled_at_the_cast_networks_boundary():
    """A loss whose backward ignores the head gradient (SoftmaxOutput, GluonCV's segmentation
    losses) is yielded as it is; its scale enters at the boundary of the network amp cast, so the
    gradients hold the scale and the step divides by it: the update is the unscaled one."""
    amp.init()
    mx.random.seed(6)
    net = _net(norm=False)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer, loss_scale=1024)
    x, y = _data()
    net(x)  # the cast
    before = net[3].weight.data().asnumpy().astype("float32")
    with autograd.record():
        out = mx.nd.SoftmaxOutput(net(x), y)
        with amp.scale_loss(out, trainer) as scaled:
            assert scaled is out
            autograd.backward(scaled)
    grad = net[3].weight.grad().asnumpy().astype("float32") / 1024
    trainer.step(x.shape[0])
    step = net[3].weight.data().asnumpy().astype("float32") - before
    np.testing.assert_allclose(step, -0.1 * grad / x.shape[0], rtol=2e-2, atol=2e-4)


def _tiny_faster_rcnn():
    """GluonCV's faster_rcnn_resnet50_v1b_voc at 64-96 pixels with 32 RoIs pooled to 7 x 7 (the
    zoo's 600 pixels and 128 RoIs of 14 x 14 take minutes a step on a CPU; the RoI head's
    layer4 costs most)."""
    from gluoncv.model_zoo import get_model
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net = get_model("faster_rcnn_resnet50_v1b_voc", pretrained_base=False)
    net.short, net.max_size = 64, 96
    net._roi_size = (7, 7)
    net._num_sample = net.sampler._num_sample = 32  # the box encoder keeps the zoo's 32 positives
    net.sampler._max_pos = 8
    net._rpn_test_post_nms = 32
    net.rpn._train_pre_nms, net.rpn._train_post_nms = 256, 64
    net.rpn._test_pre_nms, net.rpn._test_post_nms = 256, 32
    net.sampler._num_proposal = 64
    return net


@pytest.mark.slow
def test_gluoncv_faster_rcnn_script_loop(tmp_path):
    """train_faster_rcnn.py --amp's calls, in its order: init, network, initialize, reset_ctx,
    net.cast('float16') and the BatchNorm dtype lines, the train transform and batchify (which
    call the network, before the Trainer), Trainer(update_on_kvstore=False), init_trainer,
    hybridize, GluonCV's ForwardBackwardTask (whose forward_backward calls mxnet.contrib.amp's
    own scale_loss), step(batch_size), save_parameters."""
    import random
    from gluoncv.data.batchify import FasterRCNNTrainBatchify
    from gluoncv.data.transforms.presets.rcnn import FasterRCNNDefaultTrainTransform
    from gluoncv.model_zoo.rcnn.faster_rcnn.data_parallel import ForwardBackwardTask
    ctx = [mx.cpu()]
    amp.init()
    mx.random.seed(8)
    np.random.seed(8)
    random.seed(8)
    net = _tiny_faster_rcnn()
    for param in net.collect_params().values():
        if param._data is None:
            param.initialize()
    net.collect_params().reset_ctx(ctx)
    net.cast("float16")
    net.collect_params(".*batchnorm.*").setattr("dtype", "float32")
    net.collect_train_params().setattr("grad_req", "write")
    transform = FasterRCNNDefaultTrainTransform(net.short, net.max_size, net)
    rng = np.random.RandomState(0)
    image = mx.nd.array(rng.randint(0, 60, (64, 96, 3)), dtype="uint8")
    image[14:48, 20:70] = 230
    label = np.array([[20, 14, 70, 48, 1, 0]], "float32")
    batch = FasterRCNNTrainBatchify(net, 1)([transform(image, label)])
    trainer = gluon.Trainer(net.collect_train_params(), "sgd",
                            {"learning_rate": 0.001, "wd": 1e-4, "momentum": 0.9},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    task = ForwardBackwardTask(
        net, trainer, gluon.loss.SigmoidBinaryCrossEntropyLoss(from_sigmoid=False),
        gluon.loss.HuberLoss(rho=1 / 9.), gluon.loss.SoftmaxCrossEntropyLoss(),
        gluon.loss.HuberLoss(rho=1.0), mix_ratio=1.0, amp_enabled=True)
    net.hybridize(static_alloc=False)
    losses = []
    for _ in range(4):
        shards = [[x.as_in_context(ctx[0]) for x in (b if isinstance(b, (list, tuple)) else [b])]
                  for b in batch]  # the script's split_and_load
        result = task.forward_backward(list(zip(*shards))[0])
        trainer.step(1)
        losses.append(float(result[0].asscalar() + result[2].asscalar()))
    assert all(math.isfinite(loss) for loss in losses) and losses[-1] < losses[0]
    assert net.class_predictor.weight.data().dtype == np.float16
    net.save_parameters(str(tmp_path / "faster_rcnn.params"))
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "faster_rcnn.params")).values()} == \
        {np.float32}


def _live_cached_ops(block):
    """The CachedOps held by ``block`` and every block below it."""
    found, blocks = [], [block]
    while blocks:
        current = blocks.pop()
        found += [current._cached_op] if getattr(current, "_cached_op", None) is not None else []
        blocks.extend(current._children.values())
    return found


def test_a_traced_again_network_frees_the_old_graphs_memory_at_once():
    """GluonCV's validation calls set_nms every epoch, which makes the cast network be traced
    again: the old one's CachedOps (static_alloc buffers) are dropped then, not when Python's
    cycle collector reaches them (train_ssd.py --amp grew to 10-12 GB over validated epochs)."""
    amp.init()
    net = _net()
    net.initialize()
    net.hybridize(static_alloc=True)
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.1},
                            update_on_kvstore=False)
    amp.init_trainer(trainer)
    x, y = _data()
    old = []
    for _ in range(3):
        _step(net, trainer, x, y)
        old.append(amp_session.current().adopted(net))
        assert _live_cached_ops(old[-1])
        net._clear_cached_op()  # what set_nms does
    net(x).wait_to_read()
    assert amp_session.current().adopted(net) not in old
    assert _live_cached_ops(amp_session.current().adopted(net))
    assert [_live_cached_ops(cast) for cast in old] == [[], [], []]
