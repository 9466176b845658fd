"""The GluonCV and MXNet-example flags whose meaning needs a run to check: GluonCV's optimizer
state (--resume-states), -j for image folders, --num-training-samples for the lr schedule, and the
flags of the example's common/fit.py and common/data.py."""
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxfp16.train.loop as loop
from conftest import load_script_main, write_image_folder
from mxfp16.models import get_network
from mxfp16.train.cli.gluoncv_states import reorder_states

SHORT = ["--num-epochs", "1", "--max-batches", "2", "--batch-size", "4", "--disp-batches", "1"]
SMALL = ["--model", "cifar_resnet20_v1", "--image-shape", "3,32,32", "--num-classes", "4",
         "--top-k", "2"]

#: Every flag of MXNet's example common/fit.py (add_fit_args) and common/data.py (add_data_args,
#: add_data_aug_args), with a value it takes there.
EXAMPLE_FLAGS = {
    "--network": "resnet-v1", "--num-layers": "20", "--gpus": "", "--kv-store": "device",
    "--num-epochs": "2", "--lr": "0.1", "--lr-factor": "0.1", "--lr-step-epochs": "1",
    "--initializer": "default", "--optimizer": "sgd", "--mom": "0.9", "--wd": "0.0001",
    "--batch-size": "4", "--disp-batches": "20", "--model-prefix": "runs/r20", "--save-period": "1",
    "--monitor": "0", "--load-epoch": "1", "--top-k": "0", "--loss": "ce", "--test-io": "0",
    "--dtype": "float32", "--gc-type": "none", "--gc-threshold": "0.5", "--macrobatch-size": "0",
    "--warmup-epochs": "0", "--warmup-strategy": "linear", "--profile-worker-suffix": "",
    "--profile-server-suffix": "", "--use-imagenet-data-augmentation": "1",
    "--data-train": "train.rec", "--data-train-idx": "", "--data-val": "val.rec", "--data-val-idx": "",
    "--rgb-mean": "123.68,116.779,103.939", "--rgb-std": "1,1,1", "--pad-size": "0",
    "--fill-value": "127", "--image-shape": "3,32,32", "--num-classes": "4",
    "--num-examples": "8", "--data-nthreads": "4", "--benchmark": "1", "--use-python-iter": "1",
    "--use-gpu-augmenter": "0", "--random-crop": "1", "--random-mirror": "1",
    "--max-random-h": "0", "--max-random-s": "0", "--max-random-l": "0",
    "--min-random-aspect-ratio": "0.75", "--max-random-aspect-ratio": "1.33",
    "--max-random-rotate-angle": "0", "--max-random-shear-ratio": "0", "--max-random-scale": "1",
    "--min-random-scale": "1", "--max-random-area": "1", "--min-random-area": "0.08",
    "--min-crop-size": "-1", "--max-crop-size": "-1", "--brightness": "0", "--contrast": "0",
    "--saturation": "0", "--pca-noise": "0", "--random-resized-crop": "0",
}


def error_of(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


def structural(name):
    """A parameter's name without its network's prefix (cifarresnetv10_ or cifarresnetv11_)."""
    return name.split("_", 1)[1]


def snapshot(state):
    """An optimizer state's values now (training goes on updating the arrays in place)."""
    return tuple(map(snapshot, state)) if isinstance(state, (tuple, list)) else state.asnumpy()


def gluoncv_run(folder, steps=3, optimizer="sgd"):
    """What GluonCV's train_imagenet.py saves, float32: net.save_parameters and the states of a
    plain gluon.Trainer over net.collect_params() after a few momentum steps."""
    net = get_network("cifar_resnet20_v1", num_classes=4)
    net.initialize(mx.init.Xavier())
    trainer = gluon.Trainer(net.collect_params(), optimizer,
                            {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4})
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data, labels = mx.nd.random.uniform(shape=(4, 3, 32, 32)), mx.nd.array([0, 1, 2, 3])
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(data), labels)
        loss.backward()
        trainer.step(4)
    params, states = os.path.join(folder, "net-0002.params"), os.path.join(folder, "net-0002.states")
    net.save_parameters(params)
    trainer.save_states(states)
    names = sorted(net.collect_params().keys())
    momenta = {structural(names[i]): state.asnumpy()
               for i, state in trainer._updaters[0].states.items()}
    weights = {structural(name): param.data().asnumpy()
               for name, param in net.collect_params().items()}
    return params, states, momenta, weights


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_gluoncv_resume_states_restores_the_momenta(tmp_path, monkeypatch, capsys, dtype):
    params, states, momenta, weights = gluoncv_run(str(tmp_path))
    loaded = {}

    def spy(trainer, *args, **kwargs):
        load_gluoncv_states(trainer, *args, **kwargs)
        loaded["states"] = {structural(trainer._params[i].name): snapshot(state)
                            for i, state in trainer._updaters[0].states.items()}
        loaded["num_update"] = trainer.optimizer.num_update
    load_gluoncv_states = loop.load_gluoncv_states
    monkeypatch.setattr(loop, "load_gluoncv_states", spy)
    argv = SMALL + ["--allow-pickle", "--resume-params", params, "--resume-states", states,
                    "--resume-epoch", "2",
                    "--num-epochs", "3", "--benchmark", "1", "--num-examples", "12",
                    "--batch-size", "4", "--dtype", dtype, "--optimizer", "sgd"]
    assert load_script_main("train_imagenet")(argv) == 0
    assert "the optimizer state of " + states in capsys.readouterr().out
    assert loaded["num_update"] == 2 * 3  # --resume-epoch 2 of 3 batches: the schedule's position
    assert set(loaded["states"]) == set(momenta) and len(momenta) == 65
    for name, state in loaded["states"].items():
        float16_weight = dtype == "float16" and "batchnorm" not in name
        assert isinstance(state, tuple) == float16_weight, name
        if float16_weight:  # (momentum, float32 master weight)
            momentum, master = state
            assert master.dtype == np.float32
            assert np.array_equal(master, weights[name])
        else:  # float32, and BatchNorm's gamma and beta (float32 in float16 training)
            momentum = state
        assert momentum.dtype == np.float32
        assert np.array_equal(momentum, momenta[name]), name


def next_step_weights(tmp_path, load_states):
    """The weights after the step that follows a GluonCV run: GluonCV's own trainer's, and an
    mxfp16 run's (float32) from the saved files, with or without the optimizer state."""
    from mxfp16 import StaticLossScaler
    from mxfp16.models import block_to_network
    from mxfp16.train.gluon_api import GluonAPI
    from mxfp16.train.cli.gluoncv_states import load_gluoncv_states
    net = get_network("cifar_resnet20_v1", num_classes=4)
    net.initialize(mx.init.Xavier())
    settings = {"learning_rate": 0.1, "momentum": 0.9, "wd": 1e-4}
    trainer = gluon.Trainer(net.collect_params(), "sgd", settings)
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()
    data, labels = mx.nd.random.uniform(shape=(4, 3, 32, 32)), mx.nd.array([0, 1, 2, 3])

    def gluoncv_step():
        with autograd.record():
            loss = loss_fn(net(data), labels)
        loss.backward()
        trainer.step(4)
    for _ in range(3):
        gluoncv_step()
    states = str(tmp_path / "net.states")
    trainer.save_states(states)
    network = block_to_network(net)
    api = GluonAPI(network, StaticLossScaler(1, enabled=False), ctx=[mx.cpu()], dtype="float32",
                   kvstore="device", optimizer="sgd", optimizer_params=settings)
    if load_states:
        load_gluoncv_states(api.trainer, states, tuple(sorted(net.collect_params().keys())),
                            dtype="float32", master_values=network.arg_params, allow_pickle=True)
    gluoncv_step()
    api.train_step([data], [labels], 4)
    name = sorted(net.collect_params().keys())[4]  # conv0_weight
    return net.collect_params()[name].data().asnumpy(), \
        api.block.collect_params()[name].data().asnumpy()


def test_the_step_after_gluoncv_resume_states_is_gluoncv_s_next_step(tmp_path):
    gluoncv, resumed = next_step_weights(tmp_path, load_states=True)
    assert np.allclose(resumed, gluoncv, rtol=1e-5, atol=1e-7)
    gluoncv, fresh = next_step_weights(tmp_path, load_states=False)  # the momenta matter here
    assert not np.allclose(fresh, gluoncv, rtol=1e-5, atol=1e-7)


def test_gluoncv_states_are_matched_by_name_and_checked(tmp_path, capsys):
    assert reorder_states({0: "b", 1: "a"}, ("b", "a"), ["a", "b"], "x") == {1: "b", 0: "a"}
    params, states, _, _ = gluoncv_run(str(tmp_path), steps=1)
    argv = SMALL + ["--allow-pickle", "--resume-params", params, "--resume-states", states,
                    "--resume-epoch", "1",
                    "--benchmark", "1", "--num-examples", "8"] + SHORT[2:]
    main = load_script_main("train_imagenet")
    assert main(argv + ["--num-epochs", "2", "--optimizer", "nag"]) == 2
    assert "holds the state of a sgd optimizer and --optimizer is nag" in error_of(capsys)
    assert main(argv + ["--num-epochs", "2", "--api", "module"]) == 2
    assert "resume it with --api gluon" in error_of(capsys)
    assert main(argv + ["--num-epochs", "2", "--resume-states", str(tmp_path / "no.states")]) == 2
    assert "not found" in error_of(capsys)
    assert main(SMALL + ["--resume-states", states, "--allow-pickle", "--benchmark", "1",
                         "--num-epochs", "2"]) == 2
    assert "pass the parameter file saved with it too" in error_of(capsys)


def test_a_gluoncv_float16_run_resumed_in_float32_trains_its_master_weights(tmp_path,
                                                                           monkeypatch):
    """GluonCV's --dtype float16 saves float16 weights and (momentum, float32 master) states;
    a float32 run continues from the master weights, not their float16 rounding."""
    import pickle
    params, states, momenta, weights = gluoncv_run(str(tmp_path), steps=1)
    net = get_network("cifar_resnet20_v1", num_classes=4)
    net.load_parameters(params)
    names = sorted(net.collect_params().keys())
    with open(states, "rb") as saved:
        float32_states, optimizer = pickle.load(saved)
    optimizer.multi_precision = True
    masters = {i: mx.nd.array(weights[structural(names[i])]) + 1e-4 for i in float32_states}
    with open(states, "wb") as out:  # SGD's multi-precision layout: (momentum, master)
        pickle.dump(({i: (state, masters[i]) for i, state in float32_states.items()},
                     optimizer), out)
    net.cast("float16")
    net.save_parameters(params)
    trained = {}

    def spy(trainer, *args, **kwargs):
        load_gluoncv_states(trainer, *args, **kwargs)
        trained.update({structural(p.name): p.data().asnumpy() for p in trainer._params})
    load_gluoncv_states = loop.load_gluoncv_states
    monkeypatch.setattr(loop, "load_gluoncv_states", spy)
    argv = SMALL + ["--allow-pickle", "--resume-params", params, "--resume-states", states,
                    "--resume-epoch", "1",
                    "--num-epochs", "2", "--benchmark", "1", "--num-examples", "8"] + SHORT[2:]
    assert load_script_main("train_imagenet")(argv) == 0
    for i in float32_states:
        assert np.array_equal(trained[structural(names[i])], masters[i].asnumpy())


def test_gluoncv_nag_states_continue_with_nag_when_no_optimizer_is_given(tmp_path, capsys):
    params, states, _, _ = gluoncv_run(str(tmp_path), steps=1, optimizer="nag")  # GluonCV's
    argv = SMALL + ["--allow-pickle", "--resume-params", params, "--resume-states", states,
                    "--resume-epoch", "1",
                    "--num-epochs", "2", "--benchmark", "1", "--num-examples", "8"] + SHORT[2:]
    assert load_script_main("train_imagenet")(argv) == 0
    out = capsys.readouterr().out
    assert "its nag optimizer continues (GluonCV's script trains with nag" in out
    assert "starting at epoch 1" in out


def test_num_data_workers_decodes_an_image_folder_in_worker_processes(tmp_path, monkeypatch,
                                                                       capsys):
    write_image_folder(str(tmp_path / "images"), images_per_class=4)
    from mxfp16.train.data import folders
    workers = []
    data_loader = folders.WorkerLoader  # a gluon.data.DataLoader

    def spy(*args, **kwargs):
        workers.append(kwargs.get("num_workers"))
        return data_loader(*args, **kwargs)
    monkeypatch.setattr(folders, "WorkerLoader", spy)
    argv = SMALL + ["--data-dir", str(tmp_path / "images"), "-j", "2", "--val-fraction", "0.25",
                    "--num-training-samples", "40"]  # the guide's GluonCV folder command
    assert load_script_main("train_imagenet")(argv + SHORT) == 0
    assert workers == [2, 2]  # training and validation
    out = capsys.readouterr().out
    assert "-j 2: 2 decoding threads for .rec files, 2 worker processes" in out
    assert "lr schedule: 10 batches per epoch" in out


def spy_on_fit(monkeypatch):
    """Replace the training by a record of the data's epoch and the optimizer's lr schedule."""
    seen = {}

    def spy(api, data, **kwargs):
        seen["batches"], seen["scheduler"] = data.batches_per_epoch, api.optimizer.lr_scheduler
        return {"epoch": 0, "top1": None, "topk": None, "img_per_sec": 0.0, "loss_scale": 1.0,
                "num_skipped": 0}
    monkeypatch.setattr(loop, "fit", spy)
    return seen


def test_num_training_samples_sets_the_epoch_of_the_lr_schedule(tmp_path, monkeypatch, capsys):
    write_image_folder(str(tmp_path / "images"), images_per_class=4)  # 4 classes: 12 + 4 images
    seen = spy_on_fit(monkeypatch)
    argv = SMALL + ["--data-dir", str(tmp_path / "images"), "--val-fraction", "0.25",
                    "--num-training-samples", "40", "--batch-size", "4", "--num-epochs", "3",
                    "--lr-step-epochs", "1", "--lr", "0.1"]
    load_script_main("train_imagenet")(argv)
    out = capsys.readouterr().out
    assert "lr schedule: 10 batches per epoch (--num-training-samples 40 // batch 4)" in out
    assert "the lr schedule's epoch is 40 // --batch-size batches" in out
    assert seen["batches"] == 3  # the data's own epoch: 12 training images in batches of 4
    assert [round(seen["scheduler"](n), 6) for n in (10, 11)] == [0.1, 0.01]


@pytest.mark.parametrize("extra, schedule_batches", [
    (["--num-examples", "30"], 8),  # MXNet fit.py: ceil(30 / 1 worker / batch 4)
    ([], 3),  # no flag: the data's own epoch, 12 training images in batches of 4
])
def test_num_examples_sets_the_lr_schedule_epoch_as_mxnet_fit_does(tmp_path, monkeypatch, capsys,
                                                                   extra, schedule_batches):
    write_image_folder(str(tmp_path / "images"), images_per_class=4)
    seen = spy_on_fit(monkeypatch)
    argv = SMALL + ["--data-dir", str(tmp_path / "images"), "--val-fraction", "0.25",
                    "--batch-size", "4", "--num-epochs", "3", "--lr-step-epochs", "1",
                    "--lr", "0.1"] + extra
    assert load_script_main("train_imagenet")(argv) == 0
    assert seen["batches"] == 3
    last, first = schedule_batches, schedule_batches + 1  # last update of epoch 0, first of 1
    assert [round(seen["scheduler"](n), 6) for n in (last, first)] == [0.1, 0.01]
    assert ("lr schedule: 8 batches per epoch" in capsys.readouterr().out) == bool(extra)


def test_every_flag_of_the_mxnet_example_is_recognised():
    parser = load_script_main("train_imagenet").__globals__["get_args_parser"]()
    for flag, value in EXAMPLE_FLAGS.items():
        assert parser.parse_args([flag, value]) is not None, flag  # no "unrecognized arguments"


def test_example_poly_schedule_pow2_is_the_poly_lr_mode():
    from mxfp16.train.cli.config import TrainConfig
    parser = load_script_main("train_imagenet").__globals__["get_args_parser"]()
    config = TrainConfig(**vars(parser.parse_args(["--lr-step-epochs", "pow2"]))).checked()
    assert (config.lr_mode, config.lr_step_epochs) == ("poly", ())
    assert any("MXNet's PolyScheduler" in note for note in config.notes)


@pytest.mark.parametrize("argv, words", [
    (["--lr-step-epochs", "pow3"], "mxfp16's poly schedule has power 2"),
    (["--warmup-strategy", "power2"], "mxfp16's warm-up (--warmup-epochs, from --warmup-lr) is "
                                      "linear"),
    (["--profile-server-suffix", "server.json"], "does not profile the kvstore servers"),
    (["--optimizer", "lbsgd", "--macrobatch-size", "64"], "pass --batch-size 64"),
    (["--macrobatch-size", "-1"], "--macrobatch-size must be >= 0"),
    (["-j", "-1"], "--num-data-workers must be >= 0"),
    # MXNet's profiler deletes its file first: given /dev/null, it would replace the device
    (["--profile-worker-suffix", os.devnull], "--profile-worker-suffix /dev/null: MXNet's "
                                              "profiler deletes the file it is given"),
])
def test_example_flags_that_cannot_apply_are_one_error_line(capsys, argv, words):
    base = SMALL + ["--benchmark", "1", "--num-examples", "8"] + SHORT
    assert load_script_main("train_imagenet")(base + argv) == 2
    assert words in error_of(capsys)


def test_example_flags_accepted_with_their_meaning(tmp_path, capsys):
    profile = str(tmp_path / "profile.json")
    argv = SMALL + ["--benchmark", "1", "--num-examples", "8", "--warmup-strategy", "linear",
                    "--macrobatch-size", "256", "--use-python-iter", "1",
                    "--use-gpu-augmenter", "1", "--use-imagenet-data-augmentation", "1",
                    "--profile-worker-suffix", profile] + SHORT
    assert load_script_main("train_imagenet")(argv) == 0
    out = capsys.readouterr().out
    for words in ("--macrobatch-size 256: read by MXNet's lbsgd only",
                  "--use-python-iter 1: the .rec files are read by ImageRecordIter",
                  "--use-gpu-augmenter 1: the augmentation runs on the CPU",
                  "--use-imagenet-data-augmentation 1: the ImageNet recipe",
                  f"profile of the training written to {profile}"):
        assert words in out
    assert os.path.getsize(profile) > 0
