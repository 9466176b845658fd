"""scripts/train_imagenet.py end to end on small data made here: float16 learns with both APIs,
checkpoints are MXNet files and resume exactly (also after a save killed half-way), every bad input
gives one ``error:`` line and exit code 2."""
import json
import os
import re

import mxnet as mx
import pytest

from conftest import load_script_main, write_image_folder
from mxfp16.train.state import checkpoint
from mxfp16.train.cli.config import TrainConfig, contexts

#: A float16 run that learns the colour classes (chance: 25%) in five epochs: top-1 0.75 to 1.0
#: with seeds 0 to 3, for both APIs.
LEARNING = ["--network", "cifar_resnet20_v1", "--image-shape", "3,32,32", "--num-classes", "4",
            "--batch-size", "8", "--lr", "0.005", "--optimizer", "adam", "--lr-mode", "cosine",
            "--num-epochs", "5", "--top-k", "2", "--dtype", "float16", "--disp-batches", "5"]
#: Small and fast: for runs that test something other than learning.
QUICK = ["--network", "cifar_resnet20_v1", "--image-shape", "3,16,16", "--num-classes", "4",
         "--batch-size", "8", "--top-k", "2"]


@pytest.fixture(scope="module")
def train_imagenet():
    return load_script_main("train_imagenet")


@pytest.fixture(scope="module")
def learnable(tmp_path_factory):
    """24 JPEG images per class, and the .rec files scripts/prepare_data.py builds from them
    (72 training, 24 validation images)."""
    root = tmp_path_factory.mktemp("learnable")
    folder = write_image_folder(str(root / "images"), images_per_class=24)
    assert load_script_main("prepare_data")([folder, str(root / "rec"), "--train-ratio", "0.75"]) == 0
    return folder, str(root / "rec")


def records(folder, event="epoch"):
    with open(os.path.join(folder, "metrics.jsonl")) as lines:
        return [r for r in map(json.loads, lines) if r["event"] == event]


@pytest.mark.slow
@pytest.mark.parametrize("api, source", [("gluon", "folder"), ("module", "records")])
def test_float16_loss_falls_and_accuracy_rises_well_above_chance(
        train_imagenet, learnable, tmp_path, capsys, api, source):
    folder, rec_dir = learnable
    data = ["--data-dir", folder, "--val-fraction", "0.25"] if source == "folder" else \
        ["--data-train", f"{rec_dir}/train.rec", "--data-val", f"{rec_dir}/val.rec"]
    prefix = str(tmp_path / "run" / "r20")
    assert train_imagenet(LEARNING + data + ["--api", api, "--model-prefix", prefix]) == 0
    epochs = records(tmp_path / "run")
    assert [r["epoch"] for r in epochs] == [0, 1, 2, 3, 4]
    assert epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert epochs[-1]["top1"] >= 0.5 and epochs[-1]["topk"] >= epochs[-1]["top1"]
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith(f"cifar_resnet20_v1 float16 ({api}): 5 epochs, top-1 ")
    assert f"{epochs[-1]['num_skipped']} skipped steps" in summary and "img/s, loss scale" in summary
    assert "Epoch[4] train loss" in open(tmp_path / "run" / "train.log").read()
    # The checkpoint is a float32 MXNet checkpoint plus the optimizer state and the JSON file.
    symbol, arg_params, _ = mx.model.load_checkpoint(prefix, 5)
    assert symbol.infer_shape(data=(1, 3, 32, 32))[1] == [(1, 4)]
    assert {v.dtype.__name__ for v in arg_params.values()} == {"float32"}
    assert os.path.getsize(prefix + "-0005.states") > 0
    assert json.load(open(prefix + "-0005.json"))["loss_scaler"]["loss_scale"] == \
        epochs[-1]["loss_scale"]


def kill_while_saving(epoch):
    """A stand-in for ``checkpoint._write_json`` that stops the process while epoch ``epoch`` is
    being saved, after its other files are written."""
    write_json = checkpoint._write_json

    def write(path, record):
        if record["epoch"] == epoch:
            raise KeyboardInterrupt
        write_json(path, record)
    return write


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_resume_after_a_killed_save_continues_exactly(train_imagenet, tmp_path, monkeypatch, api):
    prefix = str(tmp_path / "r")
    argv = QUICK + ["--benchmark", "1", "--num-examples", "64", "--num-epochs", "3", "--lr", "0.01",
                    "--optimizer", "adam", "--lr-step-epochs", "2", "--dtype", "float16",
                    "--api", api, "--model-prefix", prefix]
    monkeypatch.setattr(checkpoint, "_write_json", kill_while_saving(epoch=3))
    assert train_imagenet(argv) == 130  # a KeyboardInterrupt in the save: one line, no traceback
    monkeypatch.undo()
    assert checkpoint.saved_epochs(prefix) == [1, 2]
    saved = json.load(open(prefix + "-0002.json"))
    assert saved["lr"] == records(tmp_path)[1]["lr"] and saved["epoch"] == 2

    assert train_imagenet(argv + ["--resume", prefix]) == 0
    start = records(tmp_path, "start")[-1]
    assert (start["epoch"], start["lr"], start["loss_scale"], start["num_update"]) == \
        (2, saved["lr"], saved["loss_scaler"]["loss_scale"], saved["num_update"])
    before, after = records(tmp_path)[2], records(tmp_path)[3]
    assert before["epoch"] == after["epoch"] == 2
    for key in ("train_loss", "train_acc", "top1", "topk", "lr", "loss_scale", "num_skipped",
                "num_update"):
        assert after[key] == before[key], key  # the same epoch, computed again
    assert checkpoint.saved_epochs(prefix) == [1, 2, 3]


def test_a_collapsed_loss_scale_stops_with_one_line(train_imagenet, tmp_path, capsys):
    """A learning rate of 1e6 blows the weights up: every step overflows at the static scale of 128
    (a dynamic one would halve 33 times to its floor first, 2**-24)."""
    argv = QUICK + ["--benchmark", "1", "--num-examples", "400", "--batch-size", "4",
                    "--image-shape", "3,8,8", "--dtype", "float16", "--lr", "1e6",
                    "--loss-scale", "128", "--max-consecutive-skips", "3",
                    "--log-file", str(tmp_path / "run.log")]
    assert train_imagenet(argv) == 2
    captured = capsys.readouterr()
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("error: ") and "overflowed at the minimum loss scale 128" in \
        captured.err and "Lower the learning rate" in captured.err
    assert "--batch-size 4 is not a multiple of 8" in captured.out
    assert "gradient overflow: step skipped" in open(tmp_path / "run.log").read()


@pytest.mark.parametrize("api, extra", [
    ("gluon", ["--mixup", "--label-smoothing", "--no-wd", "--warmup-epochs", "1", "--lr-mode",
               "cosine"]),
    ("module", ["--mixup", "--label-smoothing", "0.2", "--no-wd", "--lr-mode", "poly"]),
])
def test_bfloat16_synthetic_runs_with_every_option(train_imagenet, tmp_path, capsys, api, extra):
    argv = QUICK + ["--dtype", "bfloat16", "--api", api, "--num-epochs", "2", "--max-batches", "2",
                    "--tensorboard", str(tmp_path / "tb"), "--log-file",
                    str(tmp_path / "logs" / "run.log")] + extra
    assert train_imagenet(argv) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        f"cifar_resnet20_v1 bfloat16 ({api}): 2 epochs, top-1 ")
    assert [r["batches"] for r in records(tmp_path / "logs")] == [2, 2]
    assert records(tmp_path / "logs")[-1]["loss_scale"] == 1.0  # no loss scaling for bfloat16
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))


@pytest.fixture(scope="module")
def small_checkpoint(train_imagenet, tmp_path_factory):
    prefix = str(tmp_path_factory.mktemp("small") / "r")
    assert train_imagenet(QUICK + ["--benchmark", "1", "--num-epochs", "1", "--max-batches", "1",
                                   "--model-prefix", prefix]) == 0
    return prefix


def bad_files(tmp_path, rec_files):
    """Broken copies of the fixture's .rec/.idx and broken image folders."""
    truncated, corrupt, bad_index = (tmp_path / name for name in ("truncated", "corrupt", "badidx"))
    for stem in (truncated, corrupt, bad_index):
        with open(rec_files.train_rec, "rb") as source:
            data = source.read()
        if stem == truncated:
            data = data[:len(data) // 3]
        if stem == corrupt:
            data = b"\0" * 64 + data[64:]
        (tmp_path / f"{stem.name}.rec").write_bytes(data)
        index = open(rec_files.train_idx).read() if stem != bad_index else "not an index\n"
        (tmp_path / f"{stem.name}.idx").write_text(index)
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimages" / "cat").mkdir(parents=True)
    (tmp_path / "noimages" / "dog").mkdir()
    (tmp_path / "noimages" / "cat" / "1.jpg").write_bytes(b"")
    (tmp_path / "noimages" / "dog" / "notes.txt").write_text("no images here")


BAD_INPUTS = [
    (["--data-train", "{tmp}/missing.rec"], r"record file '.*missing.rec' not found"),
    (["--data-train", "{train_rec}", "--data-train-idx", "{tmp}/missing.idx"],
     r"index file '.*missing.idx' not found"),
    (["--data-train", "{tmp}/truncated.rec"], r"'.*truncated.rec' is truncated"),
    (["--data-train", "{tmp}/corrupt.rec"], r"'.*corrupt.rec' is truncated or corrupt"),
    (["--data-train", "{tmp}/badidx.rec"], r"index file .* line 1 is not 'key<TAB>offset'"),
    (["--data-dir", "{tmp}/empty"], r"image folder '.*empty' has no class sub-folders"),
    (["--data-dir", "{tmp}/noimages"], r"class folder '.*dog' has no images"),
    (["--data-train", "{train_rec}", "--num-classes", "3"],
     r"label 3 in batch \d+ .* not a class index in the valid range \[0, 3\)"),
    (["--network", "resnet51_v1"], r"--network: unknown network 'resnet51_v1': did you mean "
                                   r"resnet50_v1"),
    (["--dtype", "float8"], r"--dtype: unknown dtype 'float8': choose one of float32, float16"),
    (["--optimizer", "adamw"], r"--optimizer: unknown optimizer 'adamw': no optimizer is registered"),
    (["--resume", "{tmp}/never-0003"], r"no checkpoint '.*never-0003'"),
    (["--resume", "{checkpoint}", "--network", "mobilenet0.25"],
     r"checkpoint '.*r-0001' \(--network cifar_resnet20_v1 --num-classes 4\) does not fit the "
     r"network: \d+ missing parameter"),
    (["--resume", "{checkpoint}-0001", "--num-classes", "10"], r"does not fit the network: 2 of "
                                                                r"other shape"),
    (["--image-shape", "3,x"], r"argument --image-shape: '3,x' is not a comma-separated list"),
    (["--kv-store", "dist_sync"], r"--kv-store dist_sync needs the processes of a distributed job"),
    (["--gpus", "0,1", "--batch-size", "7"], r"--batch-size 7 does not split evenly over the 2"),
]


@pytest.mark.parametrize("flags, message", BAD_INPUTS, ids=[
    "missing-rec", "missing-idx", "truncated-rec", "corrupt-rec", "corrupt-idx", "empty-folder",
    "class-without-images", "label-out-of-range", "network", "dtype", "optimizer",
    "missing-checkpoint", "checkpoint-of-other-network", "checkpoint-of-other-classes",
    "bad-flag", "dist-without-launcher", "gpus-and-batch"])
def test_bad_input_gives_one_line_and_exit_code_2(train_imagenet, rec_files, small_checkpoint,
                                                   tmp_path, capsys, flags, message):
    bad_files(tmp_path, rec_files)
    values = dict(tmp=tmp_path, train_rec=rec_files.train_rec, checkpoint=small_checkpoint)
    argv = QUICK + ["--num-epochs", "1", "--max-batches", "1"] + [f.format(**values) for f in flags]
    assert train_imagenet(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


def test_config_resolves_gpu_contexts_and_defaults():
    assert contexts("") == [mx.cpu()] and contexts("0,1") == [mx.gpu(0), mx.gpu(1)]
    config = TrainConfig().checked()
    assert (config.network, config.api, config.dtype, config.synthetic) == \
        ("resnet50_v1", "gluon", "float32", True)
    assert TrainConfig(data_dir="x").synthetic is False and \
        TrainConfig(data_dir="x", benchmark=1).synthetic is True
    assert TrainConfig(dtype="fp16", optimizer="SGD").checked().dtype == "float16"


def test_help_exits_cleanly(train_imagenet, capsys):
    assert train_imagenet(["--help"]) == 0
    assert "--lr-step-epochs" in capsys.readouterr().out
