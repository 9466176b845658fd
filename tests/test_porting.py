"""Porting a Gluon training script to float16 is a handful of mechanical edits.

The script below is GluonCV's scripts/classification/imagenet/train_imagenet.py condensed (its
RecordIO path, split_and_load over devices, label smoothing, mixup, ``l.backward()`` outside
``record()``, ``save_parameters`` / ``save_states`` and resume), with a ``main(argv)`` instead of
module-level code and ``cpu(i)`` devices standing in for GPUs.  :data:`PORT_EDITS` are the only
changes the port makes; the test writes both versions into ``tmp_path`` and runs them.
"""
import importlib.util

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import get_model

import mxfp16

ORIGINAL_SCRIPT = '''\
import argparse

import mxnet as mx
import numpy as np
from mxnet import autograd as ag
from mxnet import gluon, nd
from gluoncv.model_zoo import get_model


def parse_args(argv):
    parser = argparse.ArgumentParser(description='Train a model for image classification.')
    for name in ('--rec-train', '--rec-train-idx', '--rec-val', '--rec-val-idx'):
        parser.add_argument(name, type=str, required=True)
    parser.add_argument('--batch-size', type=int, default=4, help='per device')
    parser.add_argument('--dtype', type=str, default='float32')
    parser.add_argument('--num-devices', type=int, default=1)
    parser.add_argument('--num-epochs', type=int, default=1)
    parser.add_argument('--lr', type=float, default=0.01)
    parser.add_argument('--momentum', type=float, default=0.9)
    parser.add_argument('--wd', type=float, default=0.0001)
    parser.add_argument('--mode', type=str, default='hybrid')
    parser.add_argument('--model', type=str, default='cifar_resnet20_v1')
    parser.add_argument('--input-size', type=int, default=16)
    parser.add_argument('--classes', type=int, default=4)
    parser.add_argument('--mixup', action='store_true')
    parser.add_argument('--mixup-alpha', type=float, default=0.2)
    parser.add_argument('--label-smoothing', action='store_true')
    parser.add_argument('--no-wd', action='store_true')
    parser.add_argument('--save-dir', type=str, default='params')
    parser.add_argument('--resume-epoch', type=int, default=0)
    parser.add_argument('--resume-params', type=str, default='')
    parser.add_argument('--resume-states', type=str, default='')
    return parser.parse_args(argv)


def get_data_rec(opt, batch_size):
    common = dict(batch_size=batch_size, data_shape=(3, opt.input_size, opt.input_size),
                  preprocess_threads=1, mean_r=123.68, mean_g=116.779, mean_b=103.939,
                  std_r=58.393, std_g=57.12, std_b=57.375)
    train_data = mx.io.ImageRecordIter(path_imgrec=opt.rec_train, path_imgidx=opt.rec_train_idx,
                                       shuffle=True, rand_mirror=True, random_resized_crop=True,
                                       **common)
    val_data = mx.io.ImageRecordIter(path_imgrec=opt.rec_val, path_imgidx=opt.rec_val_idx,
                                     shuffle=False, **common)
    return train_data, val_data


def batch_fn(batch, ctx):
    data = gluon.utils.split_and_load(batch.data[0], ctx_list=ctx, batch_axis=0)
    label = gluon.utils.split_and_load(batch.label[0], ctx_list=ctx, batch_axis=0)
    return data, label


def label_transform(label, classes, eta=0.0):
    ind = label.astype('int')
    res = nd.zeros((ind.shape[0], classes), ctx=label.context)
    res += eta / classes
    res[nd.arange(ind.shape[0], ctx=label.context), ind] = 1 - eta + eta / classes
    return res


def test(net, ctx, val_data, opt):
    val_data.reset()
    acc_top1 = mx.metric.Accuracy()
    for batch in val_data:
        data, label = batch_fn(batch, ctx)
        outputs = [net(X.astype(opt.dtype, copy=False)) for X in data]
        acc_top1.update(label, outputs)
    return 1 - acc_top1.get()[1]


def main(argv=None):
    opt = parse_args(argv)
    context = [mx.cpu(i) for i in range(opt.num_devices)]
    batch_size = opt.batch_size * len(context)
    classes = opt.classes
    optimizer = 'nag'
    optimizer_params = {'learning_rate': opt.lr, 'wd': opt.wd, 'momentum': opt.momentum}
    if opt.dtype != 'float32':
        optimizer_params['multi_precision'] = True

    net = get_model(opt.model, classes=classes, pretrained=False)
    net.cast(opt.dtype)
    if opt.resume_params:
        net.load_parameters(opt.resume_params, ctx=context)
    else:
        net.initialize(mx.init.MSRAPrelu(), ctx=context)
    if opt.mode == 'hybrid':
        net.hybridize(static_alloc=True, static_shape=True)
    if opt.no_wd:
        for k, v in net.collect_params('.*beta|.*gamma|.*bias').items():
            v.wd_mult = 0.0

    train_data, val_data = get_data_rec(opt, batch_size)
    trainer = gluon.Trainer(net.collect_params(), optimizer, optimizer_params)
    if opt.resume_states:
        trainer.load_states(opt.resume_states)
    if opt.label_smoothing or opt.mixup:
        L = gluon.loss.SoftmaxCrossEntropyLoss(sparse_label=False)
    else:
        L = gluon.loss.SoftmaxCrossEntropyLoss()
    eta = 0.1 if opt.label_smoothing else 0.0

    losses = []
    for epoch in range(opt.resume_epoch, opt.num_epochs):
        train_data.reset()
        for i, batch in enumerate(train_data):
            data, label = batch_fn(batch, context)
            if opt.mixup:
                lam = np.random.beta(opt.mixup_alpha, opt.mixup_alpha)
                data = [lam * X + (1 - lam) * X[::-1] for X in data]
                label = [lam * label_transform(Y, classes, eta)
                         + (1 - lam) * label_transform(Y[::-1], classes, eta) for Y in label]
            elif opt.label_smoothing:
                label = [label_transform(Y, classes, eta) for Y in label]

            with ag.record():
                outputs = [net(X.astype(opt.dtype, copy=False)) for X in data]
                loss = [L(yhat, y.astype(opt.dtype, copy=False)) for yhat, y in zip(outputs, label)]
            for l in loss:
                l.backward()
            trainer.step(batch_size)
            losses.append(sum(l.mean().asscalar() for l in loss) / len(loss))

        val_error = test(net, context, val_data, opt)
        net.save_parameters('%s/imagenet-%s-%d.params' % (opt.save_dir, opt.model, epoch))
        trainer.save_states('%s/imagenet-%s-%d.states' % (opt.save_dir, opt.model, epoch))
    return dict(net=net, trainer=trainer, losses=losses, val_error=val_error)
'''

#: The whole port: (original text, ported text), each original occurring exactly once.
PORT_EDITS = [
    ("from gluoncv.model_zoo import get_model\n",
     "from gluoncv.model_zoo import get_model\nimport mxfp16\n"),
    ("    net.cast(opt.dtype)\n", "    net = mxfp16.cast_block(net, opt.dtype)\n"),
    ("gluon.Trainer(net.collect_params(), optimizer, optimizer_params)",
     "mxfp16.Trainer(net.collect_params(), optimizer, optimizer_params, dtype=opt.dtype)"),
    ("            for l in loss:\n                l.backward()\n",
     "            trainer.backward(loss)\n"),
    ("L(yhat, y.astype(opt.dtype, copy=False))", "L(yhat, y)"),  # labels stay float32
]


def ported(script):
    for old, new in PORT_EDITS:
        assert script.count(old) == 1, old
        script = script.replace(old, new)
    return script


def load_main(path, text):
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(path.stem, str(path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.main


def arguments(rec_files, save_dir, *extra):
    return ["--rec-train", rec_files.train_rec, "--rec-train-idx", rec_files.train_idx,
            "--rec-val", rec_files.val_rec, "--rec-val-idx", rec_files.val_idx,
            "--save-dir", str(save_dir), *extra]


def batches_per_epoch(num_devices, batch_size=4, images=36):
    """The batches of one epoch: ImageRecordIter pads a partial last batch with the next epoch's
    images, and then leaves out the batch those images came from."""
    per_batch = batch_size * num_devices
    return {images // per_batch, -(-images // per_batch)}


def test_the_original_script_trains_in_float32(rec_files, tmp_path):
    main = load_main(tmp_path / "original.py", ORIGINAL_SCRIPT)
    result = main(arguments(rec_files, tmp_path, "--label-smoothing"))
    assert type(result["trainer"]).__name__ == "Trainer" and np.isfinite(result["losses"]).all()


@pytest.mark.parametrize("num_devices, mode, recipe", [
    (1, "hybrid", ["--label-smoothing"]),
    (1, "imperative", ["--mixup"]),
    (2, "hybrid", ["--mixup", "--label-smoothing", "--no-wd"]),
    (2, "imperative", []),
])
def test_the_ported_script_trains_in_float16(rec_files, tmp_path, num_devices, mode, recipe):
    main = load_main(tmp_path / "ported.py", ported(ORIGINAL_SCRIPT))
    result = main(arguments(rec_files, tmp_path, "--dtype", "float16", "--mode", mode,
                            "--num-devices", str(num_devices), *recipe))
    trainer, net = result["trainer"], result["net"]
    steps = len(result["losses"])
    assert steps in batches_per_epoch(num_devices) and np.isfinite(result["losses"]).all()
    assert isinstance(trainer, mxfp16.Trainer) and trainer.optimizer.multi_precision
    assert trainer.num_steps == steps
    assert trainer.optimizer.num_update == steps - trainer.num_skipped
    weights = [p for name, p in net.collect_params().items() if name.endswith("conv0_weight")]
    assert weights[0].list_data()[-1].dtype == np.float16
    assert len(weights[0].list_ctx()) == num_devices and net.training_block is None
    saved = mx.nd.load(str(tmp_path / "imagenet-cifar_resnet20_v1-0.params"))
    assert {array.dtype for array in saved.values()} == {np.float32}


def test_the_ports_checkpoint_loads_into_the_float32_model_and_predicts_alike(rec_files, tmp_path):
    mx.random.seed(0)
    main = load_main(tmp_path / "ported.py", ported(ORIGINAL_SCRIPT))
    net = main(arguments(rec_files, tmp_path, "--dtype", "float16"))["net"]
    plain = get_model("cifar_resnet20_v1", classes=4, pretrained=False)
    plain.load_parameters(str(tmp_path / "imagenet-cifar_resnet20_v1-0.params"))
    x = mx.nd.random.uniform(-2, 2, shape=(4, 3, 16, 16))
    expected, out = plain(x).asnumpy(), net(x).asnumpy()
    assert np.abs(out - expected).max() <= 2e-2 * np.abs(expected).max()
    assert (out.argmax(axis=1) == expected.argmax(axis=1)).mean() >= 0.75


def test_the_ported_script_resumes_its_loss_scale_and_optimizer(rec_files, tmp_path):
    main = load_main(tmp_path / "ported.py", ported(ORIGINAL_SCRIPT))
    first = main(arguments(rec_files, tmp_path, "--dtype", "float16"))["trainer"]
    saved_scale = first.loss_scale
    prefix = str(tmp_path / "imagenet-cifar_resnet20_v1-0")
    resumed = main(arguments(rec_files, tmp_path, "--dtype", "float16", "--num-epochs", "2",
                             "--resume-epoch", "1", "--resume-params", prefix + ".params",
                             "--resume-states", prefix + ".states"))["trainer"]
    steps, = batches_per_epoch(1)
    assert resumed.num_steps == 2 * steps  # the scaler's counters continue
    assert resumed.optimizer.num_update == first.optimizer.num_update + steps - \
        (resumed.num_skipped - first.num_skipped)
    assert resumed.num_skipped >= first.num_skipped and saved_scale > 1


def test_labels_cast_to_float16_break_the_float32_loss(rec_files, tmp_path):
    """Why the port keeps labels float32: dense labels (smoothing, mixup) meet float32 outputs."""
    script = ported(ORIGINAL_SCRIPT).replace("L(yhat, y)",
                                             "L(yhat, y.astype(opt.dtype, copy=False))")
    main = load_main(tmp_path / "labels.py", script)
    with pytest.raises(mx.base.MXNetError, match="float16|type"):
        main(arguments(rec_files, tmp_path, "--dtype", "float16", "--label-smoothing"))
