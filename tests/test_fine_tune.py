"""scripts/fine_tune.py end to end: float16 fine-tuning of a checkpoint the test trained itself
(Module checkpoint, Gluon export, zoo weights), a frozen backbone, and bad input."""
import json
import os
import re

import mxnet as mx
import numpy as np
import pytest
from gluoncv.model_zoo import model_store

from conftest import load_script_main, write_image_folder
from mxfp16.models import get_network, pretrained_file

TUNING = ["--image-shape", "3,32,32", "--num-classes", "4", "--batch-size", "8", "--top-k", "2",
          "--optimizer", "adam", "--lr", "0.005"]


@pytest.fixture(scope="module")
def fine_tune():
    return load_script_main("fine_tune")


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    """24 JPEG images for each of 4 colour classes (the new task)."""
    return write_image_folder(str(tmp_path_factory.mktemp("images")), images_per_class=24)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A 10-class float32 Module checkpoint trained by scripts/train_imagenet.py: ``prefix``."""
    prefix = str(tmp_path_factory.mktemp("base") / "base")
    argv = ["--network", "cifar_resnet20_v1", "--image-shape", "3,32,32", "--num-classes", "10",
            "--benchmark", "1", "--num-examples", "32", "--batch-size", "8", "--num-epochs", "1",
            "--api", "module", "--model-prefix", prefix]
    assert load_script_main("train_imagenet")(argv) == 0
    return prefix


def epochs(folder):
    with open(os.path.join(folder, "metrics.jsonl")) as lines:
        return [r for r in map(json.loads, lines) if r["event"] == "epoch"]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_fine_tunes_a_checkpoint_in_float16(fine_tune, base, images, tmp_path, capsys, api):
    prefix = str(tmp_path / "tuned")
    argv = TUNING + ["--pretrained-model", base, "--load-epoch", "1", "--data-dir", images,
                     "--val-fraction", "0.25", "--num-epochs", "4", "--lr-mode", "cosine",
                     "--lr-mult", "0.5",
                     "--api", api, "--model-prefix", prefix]
    assert fine_tune(argv) == 0
    out = capsys.readouterr().out
    # the checkpoint's names are relative to the zoo network's name scope (GluonCV loads them)
    assert "new 4-class classifier dense0_weight, dense0_bias; " \
           "backbone of 63 parameters at 0.5 x the learning rate" in out
    assert out.strip().splitlines()[-1].startswith(f"{base} float16 ({api}): 4 epochs, top-1 ")
    records = epochs(tmp_path)
    assert records[-1]["train_loss"] < records[0]["train_loss"]
    assert records[-1]["top1"] >= 0.5  # chance: 0.25; 0.75 to 1.0 with seeds 0 to 3
    _, arg_params, _ = mx.model.load_checkpoint(prefix, 4)
    assert arg_params["dense0_weight"].shape == (4, 64)


def test_freeze_backbone_trains_the_new_classifier_only(fine_tune, base, images, tmp_path):
    prefix = str(tmp_path / "frozen")
    argv = TUNING + ["--pretrained-model", base, "--load-epoch", "1", "--data-dir", images,
                     "--num-epochs", "1", "--max-batches", "4", "--freeze-backbone",
                     "--model-prefix", prefix]
    assert fine_tune(argv) == 0
    _, pretrained, _ = mx.model.load_checkpoint(base, 1)
    _, tuned, _ = mx.model.load_checkpoint(prefix, 1)
    for name, value in pretrained.items():
        if "dense0" in name:
            assert tuned[name].shape != value.shape
        else:  # unchanged, up to the float16 rounding of the cast (BatchNorm stays float32)
            dtype = np.float32 if "batchnorm" in name else np.float16
            np.testing.assert_array_equal(tuned[name].asnumpy(),
                                          value.asnumpy().astype(dtype).astype(np.float32))
    assert epochs(tmp_path)[-1]["num_update"] > 0  # the classifier did train


def test_fine_tunes_a_gluon_export(fine_tune, images, tmp_path):
    net = get_network("mobilenet0.25", num_classes=10)
    net.initialize(mx.init.Xavier())
    net.hybridize()
    net(mx.nd.zeros((1, 3, 32, 32)))
    net.export(str(tmp_path / "exported"), epoch=7)
    argv = TUNING + ["--pretrained-model", str(tmp_path / "exported"), "--load-epoch", "7",
                     "--data-dir", images, "--num-epochs", "1", "--max-batches", "2", "--api",
                     "module", "--log-file", str(tmp_path / "run.log")]
    assert fine_tune(argv) == 0
    assert epochs(tmp_path)[0]["batches"] == 2


@pytest.fixture
def model_root(tmp_path, monkeypatch):
    """An empty model store with no internet: GluonCV's download fails as it does offline."""
    monkeypatch.delenv("MXNET_HOME", raising=False)

    def offline(url, *args, **kwargs):
        raise ConnectionError(f"no internet to fetch {url}")

    monkeypatch.setattr(model_store, "download", offline)
    return tmp_path / "models"


def test_fine_tunes_zoo_weights_from_the_model_store(fine_tune, model_root, tmp_path, monkeypatch,
                                                     capsys):
    net = get_network("mobilenet0.25")  # stands in for the pretrained file: same names and shapes
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 3, 32, 32)))
    os.makedirs(model_root)
    net.save_parameters(pretrained_file("mobilenet0.25", str(model_root)))
    monkeypatch.setattr(model_store, "check_sha1", lambda path, sha1: True)
    argv = TUNING + ["--network", "mobilenet0.25", "--model-root", str(model_root), "--benchmark",
                     "1", "--num-epochs", "1", "--max-batches", "2"]
    assert fine_tune(argv) == 0
    assert "fine-tuning pretrained mobilenet0.25: new 4-class classifier mobilenet0_dense0_weight" \
        in capsys.readouterr().out


def test_missing_zoo_weights_say_where_to_put_them(fine_tune, model_root, capsys):
    argv = TUNING + ["--network", "resnet18_v1", "--model-root", str(model_root)]
    assert fine_tune(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith("error: pretrained weights for 'resnet18_v1' are missing and could not "
                          "be downloaded (ConnectionError): put the file "
                          f"{os.path.basename(pretrained_file('resnet18_v1'))} in {model_root}")


@pytest.mark.parametrize("flags, message", [
    (["--pretrained-model", "{tmp}/nothing", "--load-epoch", "3"],
     r"MXNet checkpoint '.*nothing' epoch 3 cannot be loaded .*expected .*nothing-symbol.json "
     r"and .*nothing-0003.params"),
    (["--pretrained-model", "{tmp}/nothing"], r"--pretrained-model .*nothing needs --load-epoch"),
    (["--lr-mult", "-1"], r"--lr-mult must be >= 0"),
    (["--network", "resnet51_v1"], r"--network: unknown network 'resnet51_v1'"),
])
def test_bad_input_gives_one_line_and_exit_code_2(fine_tune, tmp_path, capsys, flags, message):
    argv = TUNING + [flag.format(tmp=tmp_path) for flag in flags]
    assert fine_tune(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: ")
    assert re.search(message, err), err
