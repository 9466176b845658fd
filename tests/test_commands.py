"""Users' commands run unchanged: MXNet's float16 guide, the example README's train_imagenet.py,
fine-tune.py and train_cifar10.py, and GluonCV's published ImageNet recipes, with the flags as
published, data pointed at small files made here and sizes overridden by appended flags.  Device
flags are replaced by their CPU equivalents (``--gpus 0`` dropped, ``--num-gpus 0``)."""
import importlib.util
import os
import re

import mxnet as mx
import numpy as np
import pytest

from conftest import SCRIPTS_DIR, load_script_main, write_image_folder
from mxfp16.train.cli.config import Cifar10Config, FineTuneConfig, TrainConfig
from mxfp16.train.data.augmentation import FINE_TUNE_RECIPE, IMAGENET_RECIPE
from mxfp16.train.schedule import make_lr_scheduler

#: Appended to every run: one short epoch.
SHORT = ["--num-epochs", "1", "--max-batches", "2", "--batch-size", "4", "--disp-batches", "1"]


def script(name):
    return load_script_main(name)


def parse(name, argv, config_type=TrainConfig):
    """The checked config a script builds from ``argv``."""
    spec = importlib.util.spec_from_file_location(f"parser_{name}",
                                                  os.path.join(SCRIPTS_DIR, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return config_type(**vars(module.get_args_parser().parse_args(argv))).checked()


def error_of(capsys):
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


@pytest.fixture(scope="module")
def imagenet_folder(tmp_path_factory):
    """GluonCV's ImageNet layout: train/ and val/ of 4 class folders."""
    root = tmp_path_factory.mktemp("imagenet")
    write_image_folder(str(root / "train"), images_per_class=4)
    write_image_folder(str(root / "val"), images_per_class=2, seed=1)
    return str(root)


@pytest.mark.parametrize("argv, zoo_name", [
    (["--network", "resnet-v1", "--num-layers", "50"], "resnet50_v1"),
    (["--network", "resnet", "--num-layers", "50"], "resnet50_v2"),
    (["--network", "resnet", "--num-layers", "110", "--image-shape", "3,28,28"],
     "cifar_resnet110_v2"),
    (["--network", "resnet-v1", "--num-layers", "20", "--image-shape", "3,32,32"],
     "cifar_resnet20_v1"),
    (["--network", "resnext", "--num-layers", "101"], "resnext101_32x4d"),
    (["--network", "vgg", "--num-layers", "16"], "vgg16"),
    (["--network", "vgg", "--num-layers", "19", "--batch-norm"], "vgg19_bn"),
    (["--model", "vgg16", "--batch-norm"], "vgg16_bn"),
    (["--network", "inception-v3"], "inceptionv3"),
    (["--network", "mobilenet"], "mobilenet1.0"),
    (["--network", "mobilenetv2"], "mobilenetv2_1.0"),
    (["--network", "alexnet"], "alexnet"),
    (["--network", "googlenet"], "googlenet"),
    (["--model", "resnet50_v1b"], "resnet50_v1b"),
])
def test_example_network_names_map_to_the_zoo_network_of_the_same_architecture(argv, zoo_name):
    config = parse("train_imagenet", argv)
    assert config.network == zoo_name
    if argv[1] != zoo_name and argv[0] == "--network":
        assert f"is the model zoo's {zoo_name}" in config.notes[0]


@pytest.mark.parametrize("name, closest", [("inception-bn", "googlenet, inceptionv3"),
                                           ("inception-v4", "inceptionv3, xception"),
                                           ("inception-resnet-v2", "inceptionv3, xception")])
def test_example_networks_the_zoo_lacks_name_the_closest_in_one_line(capsys, name, closest):
    assert script("train_imagenet")(["--network", name, "--benchmark", "1"] + SHORT) == 2
    line = error_of(capsys)
    assert name in line and closest in line


@pytest.mark.slow
def test_mxnet_float16_guide_command(capsys):
    guide = ["--network", "resnet-v1", "--num-layers", "50", "--benchmark", "1",
             "--batch-size", "256", "--dtype", "float16"]
    config = parse("train_imagenet", guide)
    assert (config.network, config.dtype, config.batch_size, config.synthetic) == \
        ("resnet50_v1", "float16", 256, True)
    small = ["--num-layers", "18", "--image-shape", "3,64,64", "--num-examples", "8"] + SHORT
    assert script("train_imagenet")(guide + small) == 0
    out = capsys.readouterr().out
    assert "--network resnet-v1 --num-layers 18 is the model zoo's resnet18_v1" in out
    assert out.strip().splitlines()[-1].startswith("resnet18_v1 float16 (gluon): 1 epoch")


@pytest.mark.slow
def test_example_readme_train_imagenet_on_records_with_augmentation_level_3(rec_files, capsys):
    readme = ["--network", "resnet", "--num-layers", "50", "--data-train", rec_files.train_rec,
              "--data-val", rec_files.val_rec, "--batch-size", "64"]
    level3 = ["--random-crop", "1", "--random-mirror", "1", "--max-random-h", "36",
              "--max-random-s", "50", "--max-random-l", "50", "--max-random-rotate-angle", "10",
              "--max-random-shear-ratio", "0.1", "--max-random-aspect-ratio", "0.25"]
    small = ["--num-layers", "18", "--image-shape", "3,36,36", "--num-classes", "4",
             "--top-k", "2"] + SHORT
    config = parse("train_imagenet", readme + level3 + small)
    aug = config.augmentation
    assert config.network == "resnet18_v2"
    assert (aug.random_crop, aug.random_resized_crop, aug.max_random_h, aug.max_random_rotate_angle,
            aug.max_random_aspect_ratio, aug.brightness) == (1, 0, 36, 10, 0.25, 0.4)
    assert script("train_imagenet")(readme + level3 + small) == 0
    assert "RecordIO" in capsys.readouterr().out


def test_example_readme_train_cifar10(rec_files, capsys):
    readme = ["--network", "resnet", "--num-layers", "110", "--batch-size", "128"]
    small = ["--num-layers", "20", "--data-train", rec_files.train_rec, "--data-val",
             rec_files.val_rec, "--num-classes", "4", "--top-k", "2"] + SHORT
    config = parse("train_cifar10", readme + small, Cifar10Config)
    assert (config.network, config.image_shape, config.lr, config.lr_step_epochs) == \
        ("cifar_resnet20_v2", (3, 28, 28), 0.05, (200, 250))
    aug = config.augmentation
    assert (aug.pad_size, aug.random_crop, aug.max_random_h, aug.max_random_s) == (4, 1, 36, 50)
    assert script("train_cifar10")(readme + small) == 0
    assert "is the model zoo's cifar_resnet20_v2" in capsys.readouterr().out


def test_train_cifar10_without_its_data_files_says_which_file(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert script("train_cifar10")(["--num-layers", "20"] + SHORT) == 2
    assert "data/cifar10_train.rec" in error_of(capsys)


def write_mxnet_zoo_model(folder, name, epoch=0):
    """A tiny float32 MXNet checkpoint shaped like the example zoo's: ... flatten0 -> fc1 ->
    softmax, saved as ``folder/NAME-symbol.json`` and ``folder/NAME-0000.params``."""
    net = mx.sym.Convolution(mx.sym.var("data"), num_filter=8, kernel=(3, 3), pad=(1, 1),
                             name="conv0")
    net = mx.sym.Activation(mx.sym.BatchNorm(net, name="bn0"), act_type="relu", name="relu0")
    net = mx.sym.Pooling(net, global_pool=True, pool_type="avg", kernel=(1, 1), name="pool0")
    net = mx.sym.FullyConnected(mx.sym.Flatten(net, name="flatten0"), num_hidden=10, name="fc1")
    net = mx.sym.SoftmaxOutput(net, name="softmax")
    arg_shapes, _, aux_shapes = net.infer_shape(data=(1, 3, 32, 32))
    rng = np.random.RandomState(0)
    args = {name: mx.nd.array(rng.normal(0, 0.1, shape)) for name, shape in
            zip(net.list_arguments(), arg_shapes) if name not in ("data", "softmax_label")}
    aux = {name: mx.nd.ones(shape) if "var" in name else mx.nd.zeros(shape)
           for name, shape in zip(net.list_auxiliary_states(), aux_shapes)}
    os.makedirs(folder, exist_ok=True)
    mx.model.save_checkpoint(os.path.join(folder, name), epoch, net, args, aux)


@pytest.mark.parametrize("layer, head", [(None, "fc1_weight, fc1_bias"),
                                         ("flatten0", "fc_weight, fc_bias")])
def test_example_readme_fine_tune_from_mxnet_model_zoo(rec_files, tmp_path, monkeypatch, capsys,
                                                        layer, head):
    monkeypatch.chdir(tmp_path)
    write_mxnet_zoo_model("model", "imagenet1k-resnet-50")
    readme = ["--pretrained-model", "imagenet1k-resnet-50", "--data-train", rec_files.train_rec,
              "--data-val", rec_files.val_rec, "--batch-size", "16", "--num-classes", "256",
              "--num-examples", "15240", "--network", "resnet", "--num-layers", "50"]
    small = ["--num-classes", "4", "--image-shape", "3,32,32", "--top-k", "2"] + SHORT + \
        (["--layer-before-fullc", layer] if layer else [])
    config = parse("fine_tune", readme + small, FineTuneConfig)
    assert (config.lr, config.wd, config.augmentation) == \
        (0.01, 0.0, FINE_TUNE_RECIPE.__class__(**{**FINE_TUNE_RECIPE.__dict__, "resize": 37}))
    assert script("fine_tune")(readme + small) == 0
    out = capsys.readouterr().out
    assert f"new 4-class classifier {head};" in out
    assert "checkpoint model/imagenet1k-resnet-50-0000" in out


def test_fine_tune_missing_mxnet_zoo_model_names_both_files(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    argv = ["--pretrained-model", "imagenet11k-resnet-152", "--benchmark", "1",
            "--model-root", str(tmp_path / "store")] + SHORT
    assert script("fine_tune")(argv) == 2
    line = error_of(capsys)
    assert "imagenet11k-resnet-152-symbol.json and imagenet11k-resnet-152-0000.params" in line
    assert str(tmp_path / "model") in line and str(tmp_path / "store") in line


#: GluonCV's published recipes (model zoo .sh files), data flags pointed at the test's files.
GLUONCV_RECIPES = {
    "resnet50_v1b": ["--mode", "hybrid", "--lr", "0.4", "--lr-mode", "cosine", "--num-epochs",
                     "120", "--batch-size", "128", "--num-gpus", "8", "-j", "60",
                     "--warmup-epochs", "5", "--use-rec", "--last-gamma", "--no-wd",
                     "--label-smoothing", "--mixup", "--dtype", "float16"],
    "mobilenet1.0": ["--mode", "hybrid", "--lr", "0.4", "--lr-mode", "cosine", "--num-epochs",
                     "120", "--batch-size", "128", "--num-gpus", "8", "-j", "60", "--use-rec",
                     "--dtype", "float16", "--warmup-epochs", "5", "--no-wd",
                     "--label-smoothing"],
}
#: Smaller network of the same family, for the test.
SMALLER = {"resnet50_v1b": "resnet18_v1b", "mobilenet1.0": "mobilenet0.25"}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(GLUONCV_RECIPES))
def test_gluoncv_recipes_on_records(model, rec_files, tmp_path, capsys):
    save_dir, log_file = str(tmp_path / f"params_{model}"), str(tmp_path / f"{model}.log")
    recipe = ["--rec-train", rec_files.train_rec, "--rec-train-idx", rec_files.train_idx,
              "--rec-val", rec_files.val_rec, "--rec-val-idx", rec_files.val_idx,
              "--model", model] + GLUONCV_RECIPES[model] + \
        ["--save-dir", save_dir, "--logging-file", log_file]
    cpu = ["--num-gpus", "0", "-j", "2"]
    small = ["--model", SMALLER[model], "--input-size", "32", "--num-classes", "4", "--top-k",
             "2", "--num-epochs", "2", "--warmup-epochs", "1", "--max-batches", "2",
             "--batch-size", "4"]
    config = parse("train_imagenet", recipe + cpu)
    assert (config.network, config.lr, config.lr_mode, config.num_epochs, config.warmup_epochs,
            config.dtype, config.no_wd, config.label_smoothing, config.data_nthreads) == \
        (model, 0.4, "cosine", 120, 5, "float16", True, 0.1, 2)
    assert config.model_prefix == os.path.join(save_dir, f"imagenet-{model}")
    assert config.mixup == (model == "resnet50_v1b") == config.network_settings.get("last_gamma",
                                                                                   False)
    assert script("train_imagenet")(recipe + cpu + small) == 0
    assert os.path.isfile(os.path.join(save_dir, f"imagenet-{SMALLER[model]}-0002.params"))
    assert "Epoch[1] train loss" in open(log_file).read()
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        f"{SMALLER[model]} float16 (gluon): 2 epochs")


@pytest.mark.slow
def test_gluoncv_resnet18_v1_recipe_on_an_imagenet_folder(imagenet_folder, tmp_path, capsys):
    recipe = ["--batch-size", "64", "--num-gpus", "4", "-j", "32", "--mode", "hybrid",
              "--num-epochs", "150", "--lr", "0.1", "--momentum", "0.9", "--wd", "0.0001",
              "--lr-decay", "0.1", "--lr-decay-epoch", "30,60,90", "--model", "resnet18_v1"]
    cpu = ["--num-gpus", "0", "-j", "2", "--data-dir", imagenet_folder, "--num-classes", "4",
           "--top-k", "2"]
    config = parse("train_imagenet", recipe + cpu)
    assert (config.lr_step_epochs, config.lr_factor, config.mom, config.wd) == \
        ((30, 60, 90), 0.1, 0.9, 0.0001)
    assert config.num_data_workers == 2  # DataLoader worker processes decode the folder
    assert script("train_imagenet")(recipe + cpu + ["--input-size", "32", "--mode", "imperative"]
                                    + SHORT) == 0
    assert "image folder" in capsys.readouterr().out


def test_gluoncv_schedule_flags():
    config = parse("train_imagenet", ["--model", "resnet18_v1", "--num-epochs", "10",
                                      "--lr-decay-period", "3", "--warmup-lr", "0.01",
                                      "--warmup-epochs", "2", "--mixup", "--mixup-off-epoch", "2",
                                      "--amp"])
    assert config.lr_step_epochs == (3, 6, 9) and config.warmup_lr == 0.01
    assert (config.dtype, config.loss_scale) == ("float16", "dynamic")
    scheduler = make_lr_scheduler(0.1, "step", 10, 4, config.lr_step_epochs,
                                  warmup_epochs=2, warmup_lr=0.01)
    assert round(scheduler(1), 6) == 0.01 and round(scheduler(9), 6) == 0.1


@pytest.mark.parametrize("argv, words", [
    (["--teacher", "resnet152_v1d"], "distillation is not supported"),
    (["--temperature", "20"], "distillation is not supported"),
    (["--hard-weight", "0.5"], "distillation is not supported"),
    (["--kv-store", "nccl"], "--kv-store nccl needs MXNet built with NCCL"),
    (["--gc-type", "2bit"], "--gc-type '2bit' is not supported"),
    (["--use-pretrained", "--num-classes", "4"], "use scripts/fine_tune.py"),
    (["--amp", "--dtype", "bfloat16"], "--amp trains in float16"),
    (["--input-size", "64", "--image-shape", "3,32,32"], "disagree"),
    (["--mode", "imperative", "--api", "module"], "needs --api gluon"),
    (["--loss", "hinge"], "--loss 'hinge' is not supported"),
    (["--load-epoch", "3"], "pass --model-prefix too"),
    (["--max-random-h", "200"], "--max-random-h must be in [0, 180]"),
    (["--model", "mobilenet0.25", "--last-gamma"], "does not take the settings last_gamma=True"),
])
def test_unsupported_or_conflicting_flags_give_one_error_line(capsys, argv, words):
    base = ["--model", "cifar_resnet20_v1", "--benchmark", "1", "--image-shape", "3,32,32",
            "--num-examples", "8"] + SHORT
    assert script("train_imagenet")(base + argv) == 2
    assert words in error_of(capsys)


def test_a_rehearsal_shortened_by_max_batches_keeps_the_warmup_of_the_full_command(capsys):
    """The guide's rehearsal (--max-batches 4 --num-epochs 2) of a command with --warmup-epochs 5
    runs inside the warm-up and says so; a full run with that warm-up is still an error."""
    base = ["--model", "cifar_resnet20_v1", "--benchmark", "1", "--image-shape", "3,32,32",
            "--num-examples", "8", "--batch-size", "4", "--num-classes", "4", "--top-k", "2",
            "--warmup-epochs", "5", "--lr-mode", "cosine", "--lr", "0.2", "--num-epochs", "2"]
    assert script("train_imagenet")(base + ["--max-batches", "2"]) == 0
    out = capsys.readouterr().out
    assert ("--warmup-epochs 5 with --num-epochs 2 (--max-batches 2: a rehearsal): the run ends "
            "inside the warm-up, its learning rate rising as in the full run's first 2 epoch(s), "
            "below --lr 0.2") in out
    assert script("train_imagenet")(base) == 2
    assert "--warmup-epochs 5 leaves no epoch after the warm-up of --num-epochs 2: lower it (a " \
        "rehearsal shortened with --max-batches N keeps it)" in error_of(capsys)


def test_example_and_gluoncv_ways_of_resuming(tmp_path, capsys):
    prefix = str(tmp_path / "run" / "r20")
    base = ["--network", "resnet-v1", "--num-layers", "20", "--image-shape", "3,32,32",
            "--benchmark", "1", "--num-examples", "8", "--num-classes", "4", "--top-k", "2",
            "--batch-size", "4", "--model-prefix", prefix]
    assert script("train_imagenet")(base + ["--num-epochs", "1"]) == 0
    assert script("train_imagenet")(base + ["--num-epochs", "2", "--load-epoch", "1"]) == 0
    out = capsys.readouterr().out
    assert f"resuming {prefix}-0001" in out and "starting at epoch 1" in out
    gluoncv = base + ["--num-epochs", "3", "--resume-params", prefix + "-0002.params",
                      "--resume-states", prefix + "-0002.states", "--resume-epoch", "2"]
    assert script("train_imagenet")(gluoncv) == 0
    assert "starting at epoch 2" in capsys.readouterr().out


def test_test_io_reads_the_data_and_trains_nothing(rec_files, tmp_path, capsys):
    argv = ["--data-train", rec_files.train_rec, "--num-classes", "4", "--image-shape", "3,32,32",
            "--test-io", "1", "--model-prefix", str(tmp_path / "none")] + SHORT
    assert script("train_imagenet")(argv) == 0
    assert "--test-io: read 2 batches of 4" in capsys.readouterr().out
    assert not any(name.endswith(".params") for name in os.listdir(tmp_path))


def test_example_flags_that_log_a_note(capsys):
    argv = ["--model", "cifar_resnet20_v1", "--benchmark", "1", "--image-shape", "3,32,32",
            "--num-examples", "8", "--loss", "ce", "--monitor", "1", "--initializer", "xavier",
            "--kv-store", "local", "--top-k", "0", "--num-classes", "4"] + SHORT
    assert script("train_imagenet")(argv) == 0
    out = capsys.readouterr().out
    assert "--loss ce: the softmax cross-entropy loss is logged" in out
    assert "--monitor 1: every 1 batches, the root mean square of every parameter" in out
    assert re.search(r"Batch:\s+2\s+cifarresnetv10_dense0_weight [0-9.]+", out)
    assert "--top-k 0 (MXNet's example: no top-k report): top-1 only" in out


def test_explicit_augmentation_flags_override_the_recipe_only_where_given():
    config = parse("train_imagenet", ["--brightness", "0.1", "--pca-noise", "0.1"])
    assert config.augmentation == IMAGENET_RECIPE.__class__(
        **{**IMAGENET_RECIPE.__dict__, "brightness": 0.1, "pca_noise": 0.1})
    tuned = parse("fine_tune", ["--random-resized-crop", "1"], FineTuneConfig).augmentation
    assert (tuned.random_resized_crop, tuned.min_random_area, tuned.brightness) == (1, 0.08, 0.0)


def test_use_rec_alone_reads_gluoncv_default_files():
    config = parse("train_imagenet", ["--model", "resnet18_v1", "--use-rec"])
    rec_dir = os.path.expanduser(os.path.join("~", ".mxnet", "datasets", "imagenet", "rec"))
    assert (config.data_train, config.data_train_idx, config.data_val, config.data_val_idx) == \
        tuple(os.path.join(rec_dir, name) for name in ("train.rec", "train.idx", "val.rec",
                                                       "val.idx"))


def test_mixup_stops_for_the_last_mixup_off_epochs(monkeypatch):
    from mxfp16.train import loop
    lambdas = []
    monkeypatch.setattr(loop, "mixup_data", lambda x, lam: lambdas.append(lam) or x)

    class Api:
        scaler = type("Scaler", (), {"loss_scale": 1.0, "num_skipped": 0})()
        optimizer = type("Optimizer", (), {"lr_scheduler": None, "learning_rate": 0.1,
                                           "num_update": 0})()

        def split(self, array):
            return [array]

        def train_step(self, data, targets, batch_size):
            return [mx.nd.zeros((4, 3))], [mx.nd.zeros(4)], True

    from mxfp16.train.data import synthetic_iter
    for epoch in (0, 1):
        loop.train_one_epoch(Api(), synthetic_iter(4, (3, 4, 4), 3, 2), num_classes=3,
                             batch_size=4, num_batches=2, epoch=epoch, mixup_alpha=0.2,
                             mixup_until=1)
    assert all(lam < 1 for lam in lambdas[:2]) and lambdas[2:] == [1.0, 1.0]


def test_gluoncv_resume_from_its_own_parameter_file(tmp_path, capsys):
    from mxfp16.models import get_network
    net = get_network("cifar_resnet20_v1", num_classes=4)
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))
    params = str(tmp_path / "imagenet-cifar_resnet20_v1-0.params")
    net.save_parameters(params)
    argv = ["--model", "cifar_resnet20_v1", "--resume-params", params, "--resume-epoch", "1",
            "--num-epochs", "2",
            "--benchmark", "1", "--image-shape", "3,32,32", "--num-examples", "8",
            "--num-classes", "4", "--top-k", "2", "--batch-size", "4"]
    assert script("train_imagenet")(argv) == 0
    out = capsys.readouterr().out
    assert "GluonCV's weights, training continues at epoch 1" in out
    assert "the optimizer state starts afresh" in out
    assert "starting at epoch 1" in out and "Epoch[0]" not in out
    assert script("train_imagenet")(argv[:1] + ["mobilenet0.25"] + argv[2:]) == 2
    assert "does not hold the parameters of --model mobilenet0.25" in error_of(capsys)


@pytest.mark.parametrize("name", ["train_imagenet", "fine_tune", "train_cifar10"])
def test_every_flag_says_its_default_in_help(name):
    spec = importlib.util.spec_from_file_location(f"help_{name}", os.path.join(SCRIPTS_DIR,
                                                                               f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    missing = [action.option_strings[0] for action in module.get_args_parser()._actions
               if action.option_strings[0] != "-h" and "(default: " not in (action.help or "")]
    assert missing == []


def test_gluoncv_use_pretrained_starts_from_the_zoo_weights(tmp_path, monkeypatch, capsys):
    from gluoncv.model_zoo import model_store

    from mxfp16.models import get_network, new_network, pretrained_file
    monkeypatch.delenv("MXNET_HOME", raising=False)
    net = get_network("mobilenet0.25")  # stands in for the pretrained file: same names and shapes
    net.initialize(mx.init.Constant(0.01))
    net(mx.nd.zeros((1, 3, 32, 32)))
    net.save_parameters(pretrained_file("mobilenet0.25", str(tmp_path)))
    monkeypatch.setattr(model_store, "check_sha1", lambda path, sha1: True)
    argv = ["--model", "mobilenet0.25", "--use-pretrained", "--model-root", str(tmp_path),
            "--benchmark", "1", "--input-size", "32", "--num-examples", "8", "--lr", "1e-9"] + SHORT
    assert script("train_imagenet")(argv) == 0
    config = parse("train_imagenet", argv)
    network = new_network(config.network, config.num_classes, config.image_shape,
                          **config.network_settings)
    assert np.allclose(network.arg_params["mobilenet0_conv0_weight"].asnumpy(), 0.01)


def test_example_load_epoch_continues_from_an_mxnet_example_checkpoint(tmp_path, capsys):
    write_mxnet_zoo_model(str(tmp_path), "resnet", epoch=2)  # as MXNet's fit saves: resnet-0002.*
    argv = ["--network", "resnet-v1", "--num-layers", "20", "--model-prefix",
            str(tmp_path / "resnet"), "--load-epoch", "2", "--num-epochs", "3", "--benchmark", "1",
            "--image-shape", "3,32,32", "--num-examples", "8", "--batch-size", "4",
            "--top-k", "2"]
    assert script("train_imagenet")(argv + ["--num-classes", "4"]) == 2
    assert "has 10 classes: pass --num-classes 10" in error_of(capsys)
    assert script("train_imagenet")(argv + ["--num-classes", "10"]) == 0
    out = capsys.readouterr().out
    assert "the weights of MXNet's checkpoint" in out and "starting at epoch 2" in out
    symbol, arg_params, _ = mx.model.load_checkpoint(str(tmp_path / "resnet"), 3)
    assert "fc1_weight" in arg_params
