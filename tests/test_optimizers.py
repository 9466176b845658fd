"""make_optimizer / make_trainer: multi_precision, rescale_grad, float32 master weights."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import gluon
from mxnet.gluon import nn

import mxfp16


@pytest.mark.parametrize("dtype, multi", [("float32", False), ("float16", True),
                                          ("bfloat16", True)])
def test_multi_precision_only_for_low_precision(dtype, multi):
    assert mxfp16.make_optimizer("sgd", dtype).multi_precision is multi


def test_rescale_grad_folds_loss_scale_and_batch_size_exactly():
    assert mxfp16.make_optimizer("adam", "float16", loss_scale=1024, batch_size=32).rescale_grad \
        == 2.0 ** -15
    assert mxfp16.make_optimizer("sgd", "float16", loss_scale=8).rescale_grad == 0.125
    assert mxfp16.rescale_grad() == 1.0


def run_updates(name, multi_precision, steps=20):
    opt = mx.optimizer.create(name, learning_rate=1e-4, multi_precision=multi_precision, wd=0.0)
    weight = mx.nd.ones((4,), dtype="float16")
    grad = mx.nd.ones((4,), dtype="float16")
    state = opt.create_state_multi_precision(0, weight)
    for _ in range(steps):
        opt.update_multi_precision(0, weight, grad, state)
    return weight.asnumpy()


@pytest.mark.parametrize("name", ["sgd", "nag", "signum", "adam", "adamax", "nadam"])
def test_updates_below_float16_resolution_need_master_weights(name):
    # Each step moves 1.0 by ~1e-4, below half the float16 spacing at 1.0 (2**-11 = 4.9e-4).
    assert np.all(run_updates(name, multi_precision=False) == 1.0)
    kept = run_updates(name, multi_precision=True)
    assert np.all(kept < 1.0) and np.all(kept > 0.99)


@pytest.mark.parametrize("name", mxfp16.MULTI_PRECISION_OPTIMIZERS)
def test_every_listed_optimizer_keeps_a_float32_master_copy(name):
    opt = mxfp16.make_optimizer(name, "float16", learning_rate=0.01)
    weight = mx.nd.full((4, 4), 0.5, dtype="float16")
    state = opt.create_state_multi_precision(0, weight)
    flat = state if isinstance(state, (list, tuple)) else [state]
    masters = [s for s in flat if isinstance(s, mx.nd.NDArray) and s.dtype == np.float32
               and s.shape == weight.shape and np.all(s.asnumpy() == 0.5)]
    assert masters, f"{name} has no float32 master copy in its state"
    opt.update_multi_precision(0, weight, mx.nd.full((4, 4), 0.1, dtype="float16"), state)
    assert np.all(weight.asnumpy() == masters[0].asnumpy().astype("float16"))


def test_lamb_is_refused_because_its_master_copy_never_moves():
    """MXNet 1.9.1's mp_lamb_update_phase2 leaves the float32 copy as it was."""
    assert np.all(run_updates("lamb", multi_precision=True) == 1.0)
    with pytest.raises(ValueError, match="'lamb'"):
        mxfp16.make_optimizer("lamb", "float16")


def test_unknown_optimizer_names_the_supported_ones():
    with pytest.raises(ValueError, match="unknown optimizer 'adamw_fp8'.*import the package.*"
                                         "adam, adamax"):
        mxfp16.make_optimizer("adamw_fp8", "float16")


def test_arguments_set_by_make_optimizer_are_refused():
    with pytest.raises(ValueError, match="multi_precision"):
        mxfp16.make_optimizer("sgd", "float16", multi_precision=False)
    with pytest.raises(ValueError, match="loss_scale must be positive"):
        mxfp16.make_optimizer("sgd", "float16", loss_scale=0)
    with pytest.raises(ValueError, match="rescale_grad=0.5.*scale the loss"):
        mxfp16.make_optimizer("sgd", "float16", rescale_grad=0.5)


@pytest.mark.parametrize("dtype, agrees, contradicts", [
    ("float16", True, False), ("bfloat16", True, False), ("float32", False, True)])
def test_multi_precision_that_agrees_is_accepted(dtype, agrees, contradicts):
    assert mxfp16.make_optimizer("nag", dtype, multi_precision=agrees).multi_precision is agrees
    with pytest.raises(ValueError, match=rf"multi_precision={contradicts} contradicts "
                                         rf"dtype='{dtype}'.*remove multi_precision"):
        mxfp16.make_optimizer("nag", dtype, multi_precision=contradicts)


def test_float32_takes_any_mxnet_optimizer():
    assert type(mxfp16.make_optimizer("lamb", "float32")).__name__ == "LAMB"


def float16_params():
    net = nn.Dense(2, in_units=3)
    net.initialize()
    return mxfp16.cast_block(net, "float16").collect_params()


def test_make_trainer_takes_gluon_trainers_arguments():
    trainer = mxfp16.make_trainer(float16_params(), "nag",
                                  {"learning_rate": 0.1, "multi_precision": True}, "device")
    assert trainer.optimizer.multi_precision and type(trainer.optimizer).__name__ == "NAG"
    trainer.allreduce_grads()
    with pytest.raises(ValueError, match="remove update_on_kvstore=True"):
        mxfp16.make_trainer(float16_params(), "sgd", {}, update_on_kvstore=True)
    with pytest.raises(ValueError, match="multi_precision=False contradicts"):
        mxfp16.make_trainer(float16_params(), "sgd", {"multi_precision": False})


def test_make_trainer_updates_on_workers():
    net = nn.Dense(2, in_units=3)
    net.initialize()
    trainer = mxfp16.make_trainer(net.collect_params(), "sgd", "float16", learning_rate=0.1,
                                  momentum=0.9)
    assert trainer.optimizer.multi_precision and trainer.learning_rate == 0.1
    trainer.allreduce_grads()  # raises if the update ran on the kvstore


def updated_state(name, weight):
    """An optimizer state after one multi-precision update of ``weight`` (float16)."""
    opt = mxfp16.make_optimizer(name, "float16", learning_rate=1e-4)
    state = opt.create_state_multi_precision(0, weight)
    opt.update_multi_precision(0, weight, mx.nd.full(weight.shape, 0.1, dtype="float16"), state)
    return opt, state


@pytest.mark.parametrize("name", mxfp16.MULTI_PRECISION_OPTIMIZERS)
def test_master_weight_is_the_float32_copy_the_update_moved(name):
    weight = mx.nd.full((4, 4), 0.5, dtype="float16")
    opt, state = updated_state(name, weight)
    master = mxfp16.optimizers.master_weight(opt, state)
    assert master.dtype == np.float32 and master.shape == (4, 4)
    assert np.all(master.astype("float16").asnumpy() == weight.asnumpy())
    assert not np.all(master.asnumpy() == 0.5)  # below float16 resolution: only the copy moved


@pytest.mark.parametrize("name", mxfp16.MULTI_PRECISION_OPTIMIZERS)
def test_states_of_a_float32_run_get_a_master_copy_and_lose_it_again(name):
    weight = mx.nd.full((4, 4), 0.5, dtype="float16")
    opt, state = updated_state(name, weight)
    updater = mx.optimizer.get_updater(opt)
    param = gluon.Parameter("w", shape=(4, 4), dtype="float16")
    param.initialize(init=mx.init.Constant(0.5))
    plain = opt.create_state(0, weight.astype("float32"))
    updater.states = {0: plain}
    mxfp16.optimizers.adapt_states(updater, [param])
    structure = mxfp16.optimizers._structure
    assert structure(updater.states[0]) == structure(state)
    assert np.all(mxfp16.optimizers.master_weight(opt, updater.states[0]).asnumpy() == 0.5)
    param.cast("float32")
    mxfp16.optimizers.adapt_states(updater, [param])
    assert structure(updater.states[0]) == structure(plain)


def test_an_optimizer_whose_constructor_needs_arguments_is_probed_from_the_instance():
    @mx.optimizer.register
    class ScaledSGD(mx.optimizer.SGD):  # its own multi-precision path (SGD's): probed
        def __init__(self, factor, **kwargs):
            super().__init__(**kwargs)
            self.factor = factor

    try:
        with pytest.raises(ValueError, match="'scaledsgd'.*constructor needs arguments: pass an "
                                             "instance"):
            mxfp16.make_optimizer("scaledsgd", "float16")
        given = ScaledSGD(0.5, multi_precision=True)
        assert mxfp16.make_optimizer(given, "float16") is given
        assert mxfp16.optimizers.keeps_master_weights(given)
    finally:
        del mx.optimizer.Optimizer.opt_registry["scaledsgd"]
