"""Data parallel training over two devices, rehearsed on CPU contexts (``--cpus 2``): float16 with
dynamic loss scaling in both APIs, an overflow on one device skipped by all, weights that stay
bit-identical across devices, checkpoints that do not depend on the number of devices, fine-tuning,
the kvstores, the device flags and their errors, and MXNET_SAFE_ACCUMULATION on GPUs."""
import json
import os
import re

import mxnet as mx
import numpy as np
import pytest

import mxfp16
from conftest import PoisonedIter, load_script_main
from mxfp16 import mxnet_internals
from mxfp16.models import new_network
from mxfp16.checkpoints.optimizer_states import read_optimizer_states
from mxfp16.train import loop, runner
from mxfp16.train.state import checkpoint
from mxfp16.train.cli import config
from mxfp16.train.cli.config import TrainConfig, device_line
from mxfp16.train.gluon_api import GluonAPI
from mxfp16.train.module_api import ModuleAPI

IMAGE_SHAPE = (3, 8, 8)
#: 4 batches of 8 per epoch (4 images per device on two devices).
SMALL = ["--network", "cifar_resnet20_v1", "--image-shape", "3,8,8", "--num-classes", "4",
         "--batch-size", "8", "--top-k", "2", "--benchmark", "1", "--num-examples", "32",
         "--disp-batches", "2"]
#: ... in float16 with dynamic loss scaling.
QUICK = SMALL + ["--dtype", "float16", "--loss-scale", "dynamic"]
TWO_CPUS_LINE = ("devices: cpu(0), cpu(1) (--cpus 2: a rehearsal of 2 GPUs on the CPU); "
                 "batch 8 per step, 4 per device")


@pytest.fixture(scope="module")
def train_imagenet():
    return load_script_main("train_imagenet")


@pytest.fixture
def runs(monkeypatch, tmp_path):
    """The API object of every run in the test, in order, and ``(params, states path)`` of its
    state when training started (``loop.fit`` wrapped)."""
    started = []
    fit = loop.fit

    def capture(api, data, **kwargs):
        network, save_states = api.snapshot()
        states = str(tmp_path / f"start-{len(started)}.states")
        save_states(states)
        started.append((api, network.arg_params, states))
        return fit(api, data, **kwargs)
    monkeypatch.setattr(loop, "fit", capture)
    return started


def saved_network(prefix, epoch):
    """The network of a checkpoint under the names training uses (the files' names are relative
    to the zoo network's scope)."""
    return checkpoint.load_checkpoint(checkpoint.checkpoint_name(prefix, epoch)).network


def trained_arrays(api):
    """``{name: [array on each device]}`` of the trained parameters (BatchNorm's running
    statistics are each device's own, as in MXNet)."""
    if isinstance(api, GluonAPI):
        return {name: param.list_data() for name, param in api.block.collect_params().items()
                if param.grad_req != "null"}
    arrays = mxnet_internals.module_arrays_per_device(api.module)
    return {name: arrays[name] for name in api.network.arg_params}


def device_copies(api, names):
    """``{name: [array on each device]}`` of the named parameters or auxiliary states."""
    if isinstance(api, GluonAPI):
        params = api.block.collect_params()
        return {name: params[name].list_data() for name in names}
    arrays = mxnet_internals.module_arrays_per_device(api.module)
    return {name: arrays[name] for name in names}


def flat(state):
    """The arrays of an optimizer state (nested tuples of NDArrays) as numpy arrays."""
    if state is None:
        return []
    if isinstance(state, (tuple, list)):
        return [array for item in state for array in flat(item)]
    return [state.asnumpy()]


def device_states(api):
    """Each device's optimizer state: ``[{param index: [numpy arrays]}, ...]``."""
    if isinstance(api, GluonAPI):
        return [{index: flat(state) for index, state in updater.states.items()}
                for updater in mxnet_internals.trainer_updaters(api.trainer)]
    states = mxnet_internals.module_updater(api.module).states
    num_devices = len(next(iter(trained_arrays(api).values())))
    return [{index // num_devices: flat(state) for index, state in states.items()
             if index % num_devices == device} for device in range(num_devices)]


def assert_devices_identical(api, num_devices=2):
    """Every device holds bit-identical weights and optimizer state (float32 master weights)."""
    arrays = trained_arrays(api)
    assert arrays and {len(copies) for copies in arrays.values()} == {num_devices}
    for name, copies in arrays.items():
        for copy in copies[1:]:
            assert np.array_equal(copies[0].asnumpy(), copy.asnumpy()), name
    states = device_states(api)
    assert len(states) == num_devices and states[0]
    for other in states[1:]:
        assert_states_equal(states[0], other)


def assert_states_equal(first, second):
    assert sorted(first) == sorted(second)
    for index in first:
        assert len(first[index]) == len(second[index])
        for a, b in zip(first[index], second[index]):
            assert a.dtype == b.dtype and np.array_equal(a, b), index


def saved_states(path):
    """``{param index: [numpy arrays]}`` of a checkpoint's optimizer-state file (either API)."""
    states = read_optimizer_states(path)[0]
    return {index: flat(state) for index, state in states.items()}


def assert_params_equal(first, second):
    assert sorted(first) == sorted(second)
    for name in first:
        assert np.array_equal(first[name].asnumpy(), second[name].asnumpy()), name


def first_log_line(folder):
    line = open(os.path.join(folder, "train.log")).readline()
    return re.sub(r"^\S+ \S+ INFO ", "", line.strip())


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_two_cpus_train_float16_with_dynamic_scaling_and_identical_devices(
        train_imagenet, runs, tmp_path, capsys, api):
    prefix = str(tmp_path / "r")
    assert train_imagenet(QUICK + ["--api", api, "--cpus", "2", "--num-epochs", "2",
                                   "--model-prefix", prefix]) == 0
    assert first_log_line(tmp_path) == TWO_CPUS_LINE
    trained = runs[-1][0]
    assert [a.context for a in next(iter(trained_arrays(trained).values()))] == \
        [mx.cpu(0), mx.cpu(1)]
    assert isinstance(trained.scaler, mxfp16.DynamicLossScaler)
    assert trained.optimizer.num_update == 8 - trained.scaler.num_skipped
    assert_devices_identical(trained)
    assert checkpoint.saved_epochs(prefix) == [1, 2]
    # BatchNorm's running statistics are each device's; the checkpoint holds their mean.
    statistics = device_copies(trained, trained.network.aux_params)
    saved = saved_network(prefix, 2).aux_params
    assert sorted(saved) == sorted(statistics)
    for name, (first, second) in statistics.items():
        assert np.array_equal(saved[name].asnumpy(), (first.asnumpy() + second.asnumpy()) / 2), name
    assert any(not np.array_equal(first.asnumpy(), second.asnumpy())
               for first, second in statistics.values())
    last = records(prefix)[-1]  # evaluated on both devices
    assert last["top1"] is not None and last["num_update"] == trained.optimizer.num_update
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        f"cifar_resnet20_v1 float16 ({api}): 2 epochs, top-1 ")


@pytest.mark.parametrize("api", ["gluon", "module"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_two_cpus_train_float32_and_bfloat16(train_imagenet, runs, tmp_path, api, dtype):
    assert train_imagenet(SMALL + ["--api", api, "--cpus", "2", "--dtype", dtype, "--num-epochs",
                                   "1", "--log-file", str(tmp_path / "train.log")]) == 0
    assert first_log_line(tmp_path) == TWO_CPUS_LINE
    trained = runs[-1][0]
    assert trained.optimizer.num_update == 4 and not trained.scaler.enabled
    assert_devices_identical(trained)


def half_poisoned_iter(num_batches, poisoned):
    """Batches of 8 whose second half, which lands on the second device, overflows in
    ``poisoned``."""
    return PoisonedIter(num_batches, poisoned, 8, IMAGE_SHAPE, first_row=4)


@pytest.mark.parametrize("api_type", [GluonAPI, ModuleAPI], ids=["gluon", "module"])
def test_an_overflow_on_one_device_skips_the_step_on_every_device(api_type):
    mx.random.seed(0)
    network = new_network("cifar_resnet20_v1", 4, IMAGE_SHAPE)
    extra = {} if api_type is GluonAPI else dict(data_shape=(8,) + IMAGE_SHAPE, num_classes=4)
    scaler = mxfp16.DynamicLossScaler(init_scale=16.0, growth_interval=1000)
    api = api_type(network, scaler, ctx=[mx.cpu(0), mx.cpu(1)], dtype="float16",
                   kvstore="device", optimizer="sgd",
                   optimizer_params={"learning_rate": 0.1, "momentum": 0.9}, **extra)
    before = {name: [a.asnumpy() for a in copies] for name, copies in trained_arrays(api).items()}
    poisoned = half_poisoned_iter(4, poisoned=(0,))
    first_half, second_half = api.split(poisoned.next().data[0])[0].split(2, axis=0) \
        if api_type is ModuleAPI else api.split(poisoned.next().data[0])
    assert np.abs(first_half.asnumpy()).max() < 1e3 <= np.abs(second_half.asnumpy()).max()

    stats = loop.train_one_epoch(api, poisoned, num_classes=4, batch_size=8, num_batches=1)
    assert stats["skipped_steps"] == scaler.num_skipped == 1 and scaler.loss_scale == 8.0
    assert api.optimizer.num_update == 0
    for name, copies in trained_arrays(api).items():  # no device moved a weight
        for device, array in enumerate(copies):
            assert np.array_equal(array.asnumpy(), before[name][device]), (name, device)

    stats = loop.train_one_epoch(api, half_poisoned_iter(3, poisoned=(1,)), num_classes=4,
                                 batch_size=8, num_batches=3)
    assert stats["skipped_steps"] == 1 and scaler.num_skipped == 2 and scaler.loss_scale == 4.0
    assert api.optimizer.num_update == 2
    assert_devices_identical(api)


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_a_checkpoint_does_not_depend_on_the_number_of_devices(train_imagenet, runs, tmp_path, api):
    """Two devices, resumed on two (exactly), on one, and back on two."""
    argv = QUICK + ["--api", api, "--optimizer", "adam", "--lr", "0.01"]
    two, one, back, again = (str(tmp_path / name / "r") for name in ("two", "one", "back", "again"))
    assert train_imagenet(argv + ["--cpus", "2", "--num-epochs", "2", "--model-prefix", two]) == 0
    assert train_imagenet(argv + ["--cpus", "2", "--num-epochs", "2", "--resume", two + "-0001",
                                  "--model-prefix", again]) == 0
    assert train_imagenet(argv + ["--num-epochs", "2", "--resume", two + "-0001",
                                  "--model-prefix", one]) == 0
    assert train_imagenet(argv + ["--cpus", "2", "--num-epochs", "3", "--resume", one,
                                  "--model-prefix", back]) == 0
    # Resumed on the same two devices: the same second epoch, bit for bit.
    assert_params_equal(mx.model.load_checkpoint(two, 2)[1], mx.model.load_checkpoint(again, 2)[1])
    assert_states_equal(saved_states(two + "-0002.states"), saved_states(again + "-0002.states"))
    # A two-device checkpoint holds what a one-device one does: the same parameters and states.
    two_states, one_states = saved_states(two + "-0002.states"), saved_states(one + "-0002.states")
    assert sorted(two_states) == sorted(one_states)
    assert [[a.shape for a in two_states[i]] for i in two_states] == \
        [[a.shape for a in one_states[i]] for i in two_states]
    # Loaded onto one device, then back onto two: weights, optimizer state and loss scale as saved.
    for (_, start_params, start_states), (prefix, epoch) in zip(runs[2:], ((two, 1), (one, 2))):
        assert_params_equal(start_params, saved_network(prefix, epoch).arg_params)
        assert_states_equal(saved_states(start_states),
                            saved_states(checkpoint.checkpoint_paths(prefix, epoch).states))
    for run, (prefix, epoch) in ((one, (two, 1)), (back, (one, 2))):
        saved = json.load(open(checkpoint.checkpoint_paths(prefix, epoch).meta))
        start = records(run, "start")[-1]
        assert (start["epoch"], start["loss_scale"], start["num_update"]) == \
            (epoch, saved["loss_scaler"]["loss_scale"], saved["num_update"])
    resumed = runs[3][0]
    assert_devices_identical(resumed)  # Adam counts the steps of both devices alike
    last = records(back)[-1]
    assert last["epoch"] == 2 and last["num_update"] == resumed.optimizer.num_update == \
        12 - last["num_skipped"]


def records(prefix, event="epoch"):
    with open(os.path.join(os.path.dirname(prefix), "metrics.jsonl")) as lines:
        return [r for r in map(json.loads, lines) if r["event"] == event]


@pytest.fixture(scope="module")
def pretrained(train_imagenet, tmp_path_factory):
    """A one-device float32 checkpoint of train_imagenet.py (4 classes), to fine-tune."""
    prefix = str(tmp_path_factory.mktemp("pretrained") / "r")
    assert train_imagenet(QUICK + ["--dtype", "float32", "--num-epochs", "1", "--max-batches", "1",
                                   "--model-prefix", prefix]) == 0
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_fine_tuning_a_checkpoint_on_two_cpus(pretrained, runs, tmp_path, api):
    prefix = str(tmp_path / "tuned")
    argv = QUICK + ["--num-classes", "3", "--pretrained-model", pretrained, "--load-epoch", "1",
                    "--cpus", "2", "--api", api, "--lr-mult", "0.1", "--num-epochs", "2",
                    "--model-prefix", prefix]
    assert load_script_main("fine_tune")(argv) == 0
    assert first_log_line(tmp_path) == TWO_CPUS_LINE
    assert_devices_identical(runs[-1][0])
    symbol = mx.model.load_checkpoint(prefix, 2)[0]
    assert symbol.infer_shape(data=(1,) + IMAGE_SHAPE)[1] == [(1, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_the_device_and_local_kvstores_agree(train_imagenet, tmp_path, api):
    params = {}
    for kv_store in ("device", "local"):
        prefix = str(tmp_path / kv_store / "r")
        assert train_imagenet(QUICK + ["--api", api, "--cpus", "2", "--num-epochs", "2",
                                       "--kv-store", kv_store, "--model-prefix", prefix]) == 0
        params[kv_store] = mx.model.load_checkpoint(prefix, 2)[1]
    # Both add the same two gradients (a + b == b + a in IEEE arithmetic): the same weights.
    assert_params_equal(params["device"], params["local"])


def test_num_gpus_takes_the_batch_per_device_and_gpus_the_total(monkeypatch):
    monkeypatch.setattr(config, "gpu_count", lambda: 2)
    gluoncv = TrainConfig(num_gpus=2, batch_size=8).checked()
    assert (gluoncv.gpus, gluoncv.num_gpus, gluoncv.batch_size) == ("0,1", None, 16)
    again = gluoncv.checked()  # a checked config checks again unchanged
    assert (again.gpus, again.num_gpus, again.batch_size) == ("0,1", None, 16)
    assert device_line(gluoncv) == "devices: gpu(0), gpu(1); batch 16 per step, 8 per device"
    mxnet_style = TrainConfig(gpus="0,1", batch_size=8).checked()
    assert (mxnet_style.gpus, mxnet_style.batch_size) == ("0,1", 8)
    rehearsal = TrainConfig(num_gpus=0, cpus=2, batch_size=4).checked()
    assert (rehearsal.gpus, rehearsal.cpus, rehearsal.batch_size) == ("", 2, 8)
    assert config.contexts(rehearsal.gpus, rehearsal.cpus) == [mx.cpu(0), mx.cpu(1)]
    assert TrainConfig(num_gpus=0, batch_size=8).checked().batch_size == 8
    assert device_line(TrainConfig().checked()) == \
        "devices: cpu(0); batch 128 per step, 128 per device"


DEVICE_ERRORS = [
    (0, False, ["--gpus", "0,1"],
     "--gpus 0,1 needs GPU 1 but MXNet finds 0 GPU(s) (mx.context.num_gpus() = 0; MXNet "
     f"{mx.__version__} is a CPU build (built without CUDA)): install MXNet's CUDA build (pip "
     'install -e ".[cu112]"), or pass no --gpus to train on the CPU with float16 emulated, or '
     "--cpus 2 instead to rehearse 2 devices on the CPU"),
    (1, True, ["--gpus", "0,1"],
     "--gpus 0,1 needs GPU 1 but MXNet finds 1 GPU(s) (mx.context.num_gpus() = 1; MXNet "
     f"{mx.__version__} is built with CUDA): make the GPUs visible (nvidia-smi, "
     "CUDA_VISIBLE_DEVICES; python -m mxfp16.doctor), or pass no --gpus"),
    (0, False, ["--num-gpus", "2"],
     "--num-gpus 2 needs GPU 1 but MXNet finds 0 GPU(s) (mx.context.num_gpus() = 0; MXNet "
     f"{mx.__version__} is a CPU build (built without CUDA)): install MXNet's CUDA build (pip "
     'install -e ".[cu112]"), or pass --num-gpus 0 to train on the CPU with float16 emulated, '
     "or --num-gpus 0 --cpus 2 to rehearse 2 devices on the CPU"),
    (0, False, ["--gpus", "0"],
     "--gpus 0 needs GPU 0 but MXNet finds 0 GPU(s) (mx.context.num_gpus() = 0; MXNet "
     f"{mx.__version__} is a CPU build (built without CUDA)): install MXNet's CUDA build (pip "
     'install -e ".[cu112]"), or pass no --gpus to train on the CPU with float16 emulated\n'),
    (2, True, ["--cpus", "2", "--gpus", "0,1"],
     "--cpus 2 and --gpus 0,1 both choose the devices: pass --gpus to train on GPUs, or --cpus "
     "to rehearse 2 devices on the CPU, not both"),
    (2, True, ["--gpus", "0,1", "--num-gpus", "2"],
     "--gpus 0,1 and --num-gpus 2 both choose the GPUs (MXNet's and GluonCV's flag): pass one; "
     "--batch-size is the total batch with --gpus, the batch per device with --num-gpus"),
    (2, True, ["--num-gpus", "2", "--cpus", "2"],
     "--cpus 2 and --num-gpus 2 both choose the devices: pass --num-gpus 2 to train on GPUs, or "
     "--num-gpus 0 --cpus 2 to rehearse 2 devices on the CPU"),
    (0, False, ["--num-gpus", "-1"], "--num-gpus must be >= 0 (0: the CPU), got -1"),
    (0, False, ["--cpus", "0"], "--cpus must be >= 1, got 0"),
    (0, False, ["--cpus", "3"],
     "--batch-size 8 does not split evenly over the 3 devices of --cpus 3: pass a multiple of 3"),
    (0, False, ["--cpus", "two"], "argument --cpus: invalid int value: 'two'"),
]


@pytest.mark.parametrize("script", ["train_imagenet", "fine_tune"])
@pytest.mark.parametrize("gpus_found, cuda, flags, message", DEVICE_ERRORS, ids=[
    "gpus-on-cpu-build", "fewer-gpus", "one-gpu-on-cpu-build", "num-gpus-on-cpu-build", "cpus-and-gpus",
    "gpus-and-num-gpus", "cpus-and-num-gpus", "negative-num-gpus", "no-cpus", "batch-split",
    "cpus-not-a-number"])
def test_device_errors_are_one_line_before_anything_is_built(
        monkeypatch, tmp_path, capsys, script, gpus_found, cuda, flags, message):
    monkeypatch.setattr(config, "gpu_count", lambda: gpus_found)
    monkeypatch.setattr(config, "cuda_built", lambda: cuda)
    argv = QUICK + flags + ["--model-prefix", str(tmp_path / "run" / "r")]
    assert load_script_main(script)(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: " + message) and len(err.strip().splitlines()) == 1, err
    assert not os.path.exists(tmp_path / "run")  # no log, no checkpoint folder


SAFE_ACCUMULATION = "MXNET_SAFE_ACCUMULATION"


def test_safe_accumulation_is_set_for_float16_on_gpus_unless_the_user_set_it():
    env = {}
    assert runner.use_safe_accumulation("float16", [mx.gpu(0), mx.gpu(1)], env) == (
        "set MXNET_SAFE_ACCUMULATION=1: float16 reductions (softmax, norms, sums) on the GPUs "
        "accumulate in float32; export MXNET_SAFE_ACCUMULATION=0 to keep float16 accumulation")
    assert env == {SAFE_ACCUMULATION: "1"}
    users = {SAFE_ACCUMULATION: "0"}
    assert runner.use_safe_accumulation("float16", [mx.gpu(0)], users).startswith(
        "MXNET_SAFE_ACCUMULATION='0' as set by you")
    assert users == {SAFE_ACCUMULATION: "0"}
    for dtype, ctx in (("float32", [mx.gpu(0)]), ("bfloat16", [mx.gpu(0)]),
                       ("float16", [mx.cpu(0), mx.cpu(1)])):
        env = {}
        assert runner.use_safe_accumulation(dtype, ctx, env) is None and env == {}


@pytest.mark.parametrize("users_value", [None, "0"])
def test_a_float16_run_on_gpus_sets_safe_accumulation_and_logs_it(
        train_imagenet, monkeypatch, tmp_path, users_value):
    """MXNet 'finds' two GPUs and the run trains on two CPU contexts instead."""
    monkeypatch.setattr(config, "gpu_count", lambda: 2)
    monkeypatch.setattr(loop, "contexts", lambda gpus, cpus: [mx.cpu(0), mx.cpu(1)])
    # setenv first: monkeypatch restores the variable (here: removes it) whatever the run sets.
    monkeypatch.setenv(SAFE_ACCUMULATION, users_value or "")
    if users_value is None:
        monkeypatch.delenv(SAFE_ACCUMULATION)
    log_file = tmp_path / "run.log"
    assert train_imagenet(QUICK + ["--gpus", "0,1", "--num-epochs", "1", "--max-batches", "1",
                                   "--log-file", str(log_file)]) == 0
    lines = [re.sub(r"^\S+ \S+ INFO ", "", line) for line in open(log_file).read().splitlines()]
    assert lines[0] == "devices: gpu(0), gpu(1); batch 8 per step, 4 per device"
    if users_value is None:
        assert os.environ[SAFE_ACCUMULATION] == "1"
        assert lines[1].startswith("set MXNET_SAFE_ACCUMULATION=1: float16 reductions")
    else:
        assert os.environ[SAFE_ACCUMULATION] == "0"
        assert lines[1].startswith("MXNET_SAFE_ACCUMULATION='0' as set by you")
