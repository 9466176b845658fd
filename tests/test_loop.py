"""mxfp16.train.loop with both APIs (gluon_api, module_api): overflow storms, data selection and
sharding, the per-parameter settings (frozen, lr_mult, no weight decay), targets and metrics."""
import logging

import mxnet as mx
import numpy as np
import pytest

import mxfp16
from conftest import PoisonedIter
from mxfp16 import mxnet_internals
from mxfp16.models import Network, new_network
from mxfp16.train import gluon_api, loop, metrics, module_api
from mxfp16.train.data import DataError, load_data, synthetic_iter

IMAGE_SHAPE = (3, 16, 16)
BATCH = 8


def poisoned_iter(num_batches, poisoned):
    return PoisonedIter(num_batches, poisoned, BATCH, IMAGE_SHAPE)


@pytest.fixture(scope="module")
def network():
    mx.random.seed(0)
    return new_network("cifar_resnet20_v1", 4, IMAGE_SHAPE)


def run_epoch(api_type, network, scaler, data):
    extra = {} if api_type is gluon_api.GluonAPI else \
        dict(data_shape=(BATCH,) + IMAGE_SHAPE, num_classes=4)
    api = api_type(network, scaler, ctx=[mx.cpu()], dtype="float16", kvstore="device",
                   optimizer="sgd", optimizer_params={"learning_rate": 0.01}, **extra)
    stats = loop.train_one_epoch(api, data, num_classes=4, batch_size=BATCH, num_batches=8)
    return stats, api.optimizer


@pytest.mark.parametrize("api_type", [gluon_api.GluonAPI, module_api.ModuleAPI],
                         ids=["gluon", "module"])
def test_an_overflow_storm_is_skipped_counted_and_logged_and_training_goes_on(
        network, api_type, caplog):
    scaler = mxfp16.DynamicLossScaler(init_scale=16.0, growth_interval=1000)
    with caplog.at_level(logging.WARNING, logger="mxfp16"):
        stats, optimizer = run_epoch(api_type, network, scaler, poisoned_iter(8, poisoned=(2, 3, 4)))
    assert stats["skipped_steps"] == scaler.num_skipped == 3
    assert scaler.loss_scale == 2.0  # 16 halved three times
    assert optimizer.num_update == 5  # the other five steps updated the weights
    assert scaler.consecutive_skips == 0 and np.isfinite(stats["train_loss"])
    warnings = [r.getMessage() for r in caplog.records if "gradient overflow" in r.getMessage()]
    assert warnings == [  # logged at 1, 2, 4, ... overflows in a row
        "Epoch[0] Batch[2] gradient overflow: step skipped, loss scale now 8 "
        "(1 skipped in a row, 1 in all)",
        "Epoch[0] Batch[3] gradient overflow: step skipped, loss scale now 4 "
        "(2 skipped in a row, 2 in all)"]


def test_a_storm_that_never_ends_collapses(network):
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0, min_scale=1.0, max_consecutive_skips=3)
    with pytest.raises(mxfp16.LossScaleCollapse, match="3 steps in a row overflowed"):
        run_epoch(gluon_api.GluonAPI, network, scaler, poisoned_iter(8, poisoned=range(8)))


def test_load_data_chooses_the_source_and_shards_records_evenly(rec_files, image_folder):
    common = dict(batch_size=5, image_shape=IMAGE_SHAPE, num_classes=4, num_threads=1)
    data = load_data(data_train=rec_files.train_rec, data_val=rec_files.val_rec, **common)
    assert data.batches_per_epoch == 8 and data.val is not None  # ceil(36 / 5)
    # Two workers: 18 records each, 3 whole batches, so both take the same number of steps.
    shard = load_data(data_train=rec_files.train_rec, num_parts=2, part_index=1, **common)
    assert shard.batches_per_epoch == 3 and shard.val is None
    assert load_data(synthetic=True, num_examples=23, max_batches=3,
                              **common).batches_per_epoch == 3
    folder = load_data(data_dir=str(image_folder), val_fraction=0.25, **common)
    assert folder.batches_per_epoch == 8 and "4 classes, 36 training" in folder.description
    with pytest.raises(DataError, match="has 4 classes but --num-classes is 3: pass "
                                        "--num-classes 4"):
        load_data(data_dir=str(image_folder), **dict(common, num_classes=3))
    # Two workers of a folder: 36 training images, every other one each, 4 batches of 5.
    halves = [load_data(data_dir=str(image_folder), val_fraction=0.25, num_parts=2,
                                 part_index=part, **common) for part in (0, 1)]
    assert [half.batches_per_epoch for half in halves] == [4, 4]


def test_parameter_settings_reach_both_apis(network):
    """Frozen parameters, learning-rate multipliers and --no-wd, in Gluon and in Module."""
    frozen = "cifarresnetv10_conv0_weight"
    tuned = Network(network.symbol, network.arg_params, network.aux_params,
                    fixed_param_names=(frozen,), lr_mult={frozen: 0.1})
    block, _ = gluon_api.gluon_network(tuned, [mx.cpu()], "float32", no_wd=True)
    params = block.collect_params()
    assert (params[frozen].grad_req, params[frozen].lr_mult, params[frozen].wd_mult) == \
        ("null", 0.1, 1.0)
    assert params["cifarresnetv10_dense0_bias"].wd_mult == 0.0
    assert params["cifarresnetv10_batchnorm0_gamma"].wd_mult == 0.0
    scaler = mxfp16.make_loss_scaler(None, "float32")
    module, optimizer = module_api.make_module(
        tuned, scaler, ctx=[mx.cpu()], dtype="float32", data_shape=(2,) + IMAGE_SHAPE,
        label_shape=(2,), kvstore="device", optimizer="sgd",
        optimizer_params={"learning_rate": 0.1}, no_wd=True)
    assert optimizer.lr_mult == {frozen: 0.1}
    assert optimizer.wd_mult["cifarresnetv10_dense0_bias"] == 0.0
    assert "cifarresnetv10_dense0_weight" not in optimizer.wd_mult
    assert frozen in mxnet_internals.current_module(module)._fixed_param_names


def test_soft_targets_for_label_smoothing_and_mixup():
    labels = mx.nd.array([0, 1, 3])
    smooth = metrics.make_targets(labels, 4, smoothing=0.2).asnumpy()
    np.testing.assert_allclose(smooth.sum(axis=1), 1.0, rtol=1e-6)
    np.testing.assert_allclose(smooth[0], [0.85, 0.05, 0.05, 0.05], rtol=1e-6)
    mixed = metrics.make_targets(labels, 4, mixup_lambda=0.7).asnumpy()
    np.testing.assert_allclose(mixed[0], [0.7, 0.0, 0.0, 0.3], rtol=1e-6)
    data = mx.nd.array([[1.0], [2.0], [4.0]])
    np.testing.assert_allclose(metrics.mixup_data(data, 0.5).asnumpy().ravel(), [2.5, 2.0, 2.5])


@pytest.fixture
def host_reads(monkeypatch):
    """Counts the reads of NDArrays back to the host (every wait on the engine goes through one)."""
    calls = {"reads": 0}
    asnumpy = mx.nd.NDArray.asnumpy

    def counted(self):
        calls["reads"] += 1
        return asnumpy(self)
    monkeypatch.setattr(mx.nd.NDArray, "asnumpy", counted)
    return calls


def reads_per_epoch(api_type, network, dtype, scaler, num_batches, host_reads):
    extra = {} if api_type is gluon_api.GluonAPI else \
        dict(data_shape=(BATCH,) + IMAGE_SHAPE, num_classes=4)
    api = api_type(network, scaler, ctx=[mx.cpu()], dtype=dtype, kvstore="device",
                   optimizer="sgd", optimizer_params={"learning_rate": 0.01}, **extra)
    data = synthetic_iter(BATCH, IMAGE_SHAPE, 4, num_batches, seed=1)
    host_reads["reads"] = 0
    loop.train_one_epoch(api, data, num_classes=4, batch_size=BATCH, num_batches=num_batches,
                         disp_batches=100)
    return host_reads["reads"]


@pytest.mark.parametrize("api_type", [gluon_api.GluonAPI, module_api.ModuleAPI],
                         ids=["gluon", "module"])
@pytest.mark.parametrize("dtype, scaler, reads_per_step", [
    ("float32", mxfp16.StaticLossScaler(1, enabled=False), 0),
    ("bfloat16", mxfp16.StaticLossScaler(1, enabled=False), 0),
    ("float16", mxfp16.DynamicLossScaler(init_scale=2.0 ** 8), 1),  # the overflow decision
], ids=["float32", "bfloat16", "float16"])
def test_a_step_waits_on_the_device_at_most_for_the_overflow_decision(
        network, api_type, dtype, scaler, reads_per_step, host_reads):
    """Metrics, losses and the progress bar are read at --disp-batches and at the end only."""
    short = reads_per_epoch(api_type, network, dtype, scaler, 2, host_reads)
    long = reads_per_epoch(api_type, network, dtype, scaler, 5, host_reads)
    assert long - short == 3 * reads_per_step
