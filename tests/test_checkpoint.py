"""mxfp16.train.state.checkpoint: MXNet-format files + JSON, atomic saves, crashes mid-save, bad
checkpoints."""
import json
import os

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.train.state import checkpoint
from mxfp16.models import block_to_network
from mxfp16.train.state.checkpoint import (CheckpointError, checkpoint_paths, find_checkpoint,
                                     load_checkpoint, save_checkpoint, saved_epochs)
from mxfp16.train.state.resume import check_fits


def trained_state(dtype="float16", steps=2):
    """A tiny network trained a few steps: (network, trainer, scaler)."""
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(8, in_units=4), nn.BatchNorm(in_channels=8), nn.Dense(3, in_units=8))
    net.initialize(mx.init.Xavier())
    net16 = mxfp16.cast_block(net, dtype)
    trainer = mxfp16.make_trainer(net.collect_params(), "adam", dtype, learning_rate=0.01)
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 10, growth_interval=1)
    x, y = mx.nd.array(np.random.RandomState(0).randn(6, 4)), mx.nd.array([0, 1, 2, 0, 1, 2])
    for _ in range(steps):
        with autograd.record():
            loss = scaler.scale(gluon.loss.SoftmaxCrossEntropyLoss()(net16(x), y))
        loss.backward()
        scaler.step(trainer, 6)
    return net, trainer, scaler


def save(prefix, epoch, net, trainer, scaler, **meta):
    return save_checkpoint(prefix, epoch, block_to_network(net), trainer.save_states, scaler,
                           num_update=trainer.optimizer.num_update, **meta)


@pytest.mark.slow
def test_save_writes_mxnet_files_and_load_restores_everything(tmp_path):
    net, trainer, scaler = trained_state()
    prefix = str(tmp_path / "run" / "tiny")
    paths = save(prefix, 3, net, trainer, scaler, config={"network": "tiny"})
    # The pair is an ordinary float32 MXNet checkpoint.
    symbol, arg_params, aux_params = mx.model.load_checkpoint(prefix, 3)
    assert sorted(arg_params) == sorted(net.collect_params().keys() - set(aux_params))
    assert {v.dtype for v in arg_params.values()} == {np.float32}
    assert net[0].weight.dtype == np.float16
    np.testing.assert_array_equal(arg_params["net_dense0_weight"].asnumpy(),
                                  net[0].weight.data().astype("float32").asnumpy())
    loaded = load_checkpoint(prefix)
    assert (loaded.epoch, loaded.name, loaded.states_path) == (3, prefix + "-0003", paths.states)
    assert loaded.meta["loss_scaler"] == scaler.state_dict() == {
        "loss_scale": 2.0 ** 12, "num_steps": 2, "num_skipped": 0, "consecutive_skips": 0,
        "growth_tracker": 0}
    assert loaded.meta["num_update"] == 2 and loaded.meta["config"] == {"network": "tiny"}
    assert loaded.network.symbol.tojson() == symbol.tojson()
    restored = mxfp16.make_trainer(net.collect_params(), "adam", "float16", learning_rate=0.01)
    restored.load_states(loaded.states_path)
    assert restored.optimizer.num_update == 2


def test_find_checkpoint_takes_prefix_epoch_or_the_latest_epoch(tmp_path):
    net, trainer, scaler = trained_state(steps=1)
    prefix = str(tmp_path / "r")
    for epoch in (1, 2, 10):
        save(prefix, epoch, net, trainer, scaler)
    assert saved_epochs(prefix) == [1, 2, 10]
    assert find_checkpoint(prefix) == (prefix, 10, 0)
    assert find_checkpoint(prefix + "-0002") == (prefix, 2, 0)
    with pytest.raises(CheckpointError, match=r"no checkpoint .*r-0003"):
        find_checkpoint(prefix + "-0003")


def test_a_writer_failing_mid_save_leaves_the_previous_checkpoint(tmp_path):
    net, trainer, scaler = trained_state()
    prefix = str(tmp_path / "r")
    save(prefix, 1, net, trainer, scaler)
    before = sorted(os.listdir(tmp_path))

    def dies_half_way(path):
        with open(path, "wb") as out:
            out.write(b"half a state file")
        raise KeyboardInterrupt  # the process is stopped while writing

    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(prefix, 2, block_to_network(net), dies_half_way, scaler)
    assert sorted(os.listdir(tmp_path)) == before  # no new file, no temporary file left
    assert load_checkpoint(prefix).epoch == 1


def test_a_kill_between_renames_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    net, trainer, scaler = trained_state()
    prefix = str(tmp_path / "r")
    save(prefix, 1, net, trainer, scaler)
    renamed = []
    real_replace = os.replace

    def killed_after_two(src, dst):
        if len(renamed) == 2:
            raise KeyboardInterrupt
        renamed.append(dst)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", killed_after_two)
    with pytest.raises(KeyboardInterrupt):
        save(prefix, 2, net, trainer, scaler)
    monkeypatch.undo()
    assert os.path.exists(checkpoint_paths(prefix, 2).params)  # renamed before the kill ...
    assert not os.path.exists(checkpoint_paths(prefix, 2).meta)  # ... but never completed
    assert load_checkpoint(prefix).epoch == 1
    with pytest.raises(CheckpointError, match="no .*r-0002.json: its save was interrupted"):
        load_checkpoint(prefix + "-0002")


def test_truncated_or_foreign_files_are_reported_not_loaded(tmp_path):
    net, trainer, scaler = trained_state()
    prefix = str(tmp_path / "r")
    paths = save(prefix, 1, net, trainer, scaler)
    with open(paths.params, "r+b") as params:
        params.truncate(100)
    with pytest.raises(CheckpointError, match=r"r-0001.params' has 100 bytes, not \d+: .*incomplete"):
        load_checkpoint(prefix)
    with open(paths.meta, "w") as meta:
        json.dump({"epoch": 1}, meta)
    with pytest.raises(CheckpointError, match="not an mxfp16 checkpoint file"):
        load_checkpoint(prefix)


def test_checkpoints_without_scaler_state_or_checksums_still_load_with_a_note(tmp_path, caplog):
    net, trainer, scaler = trained_state()
    paths = save(str(tmp_path / "r"), 1, net, trainer, scaler)
    meta = json.load(open(paths.meta))
    for key in (mxfp16.LossScaler.state_dict_key, "sha256", "marker_sha256"):  # an old checkpoint
        del meta[key]
    json.dump(meta, open(paths.meta, "w"))
    assert mxfp16.LossScaler.state_dict_key not in load_checkpoint(str(tmp_path / "r")).meta
    assert [r.getMessage() for r in caplog.records if "checksums" in r.getMessage()] == [
        f"checkpoint {tmp_path / 'r'}-0001 was saved without checksums (before mxfp16's checkpoint "
        "version 2): loaded without verifying its files"]


def test_check_fits_names_missing_unexpected_and_reshaped_parameters():
    expected = {"a": mx.nd.zeros((2, 3)), "b": mx.nd.zeros(4), "c": mx.nd.zeros(1)}
    check_fits(dict(expected), expected, "ckpt", "fix it")
    saved = {"a": mx.nd.zeros((5, 3)), "b": mx.nd.zeros(4), "z": mx.nd.zeros(1)}
    with pytest.raises(CheckpointError) as error:
        check_fits(saved, expected, "checkpoint 'x'", "resume with the right --network")
    assert str(error.value) == (
        "checkpoint 'x' does not fit the network: 1 missing parameter(s) (c); 1 unexpected "
        "parameter(s) (z); 1 of other shape (a (5, 3) vs (2, 3)); resume with the right --network")


def test_checkpoint_module_writes_through_temporary_files(tmp_path, monkeypatch):
    """Every file reaches its name by os.replace from a temporary file in the same folder."""
    net, trainer, scaler = trained_state()
    moves = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (moves.append((src, dst)),
                                                           real_replace(src, dst)))
    paths = save(str(tmp_path / "r"), 1, net, trainer, scaler)
    assert [dst for _, dst in moves] == [paths.symbol, paths.params, paths.states, paths.meta]
    assert all(os.path.dirname(src) == os.path.dirname(dst) and ".tmp-" in src
               for src, dst in moves)
    assert checkpoint.CHECKPOINT_FORMAT == json.load(open(paths.meta))["format"]


def test_mid_epoch_checkpoints_are_ordered_by_position_and_named_on_resume(tmp_path):
    net, trainer, scaler = trained_state(steps=1)
    prefix = str(tmp_path / "r")
    save(prefix, 1, net, trainer, scaler)
    save_checkpoint(prefix, 1, block_to_network(net), trainer.save_states, scaler, batch=250)
    assert checkpoint.saved_positions(prefix) == [(1, 0), (1, 250)]
    assert saved_epochs(prefix) == [1]  # MXNet's epoch files only
    latest = load_checkpoint(prefix)
    assert (latest.epoch, latest.batch, latest.name) == (1, 250, prefix + "-0001+000250")
    assert latest.meta["batch"] == 250
    assert find_checkpoint(prefix + "-0001+000250") == (prefix, 1, 250)
    assert load_checkpoint(prefix + "-0001").batch == 0
    save(prefix, 2, net, trainer, scaler)
    assert find_checkpoint(prefix) == (prefix, 2, 0)  # the epoch's end comes after its batches


def test_a_checkpoint_cut_short_is_passed_over_for_the_one_before(tmp_path, caplog):
    net, trainer, scaler = trained_state(steps=1)
    prefix = str(tmp_path / "r")
    save(prefix, 1, net, trainer, scaler)
    save_checkpoint(prefix, 1, block_to_network(net), trainer.save_states, scaler, batch=7)
    params = checkpoint_paths(prefix, 1, 7).params
    with open(params, "r+b") as cut:  # the machine died before the disk had all of it
        cut.truncate(os.path.getsize(params) // 2)
    assert load_checkpoint(prefix).name == prefix + "-0001"
    assert "checkpoint %s-0001+000007 is passed over: checkpoint file" % prefix in caplog.text
    with pytest.raises(CheckpointError, match=r"r-0001\+000007.params' has \d+ bytes, not \d+"):
        load_checkpoint(prefix + "-0001+000007")  # named: an error, not another checkpoint
