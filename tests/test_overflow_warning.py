"""The early overflow warning (issue 37, part 3): when it fires, what it says, and that the Trainer,
mxfp16.amp, the Module helpers and the scripts say it within a few steps, with the fix as code.

The trigger and the warning's text are checked on fakes of the locator's report (its contract:
culprits with path, op, phase, max_abs; keep_float32); the paths through the real locator on the
issue's attention case and a heavily weighted loss.
"""
import collections
import logging

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from conftest import load_script_main
from mxfp16 import overflow_warning as warning
from mxfp16.module import MODULE_FIXES, overflow_alarm
from mxfp16.scaling.watch import LOSS_NOT_FINITE, SKIPS_AT_SAFE_SCALE, SkipWatch

Report = collections.namedtuple("Report", "culprits keep_float32")
Culprit = collections.namedtuple("Culprit", "path op phase max_abs op_type")


def culprit(path, op, phase="forward", max_abs=1.43e5, op_type="batch_dot"):
    """A culprit as mxfp16.find_overflow reports it (``op_type='parameter'`` for a value the
    network is given: an input or a parameter)."""
    return Culprit(path, op, phase, max_abs, op_type)


def steps(watch, scaler, outcomes):
    """Feed ``(scale, finite)`` steps to ``watch`` as a scaler would see them; the reasons."""
    reasons = []
    for scale, finite in outcomes:
        scaler.update(finite)
        reasons.append(watch.due(scaler, scale, finite))
    return reasons


def test_the_classic_start_halving_to_where_the_gradients_fit_never_fires():
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 16)
    watch = SkipWatch(scaler)
    outcomes = [(2.0 ** (16 - k), False) for k in range(6)] + [(2.0 ** 10, True)]
    assert steps(watch, scaler, outcomes) == [None] * 7
    # after a clean step at 1024, three skips in a row at or below it fire, once
    assert steps(watch, scaler, [(1024.0, False), (512.0, False), (256.0, False),
                                 (128.0, False)]) == [None, None, SKIPS_AT_SAFE_SCALE, None]


def test_a_skip_after_the_scale_grew_is_not_suspect_nor_are_skips_broken_by_clean_steps():
    scaler = mxfp16.DynamicLossScaler(init_scale=1024.0)
    watch = SkipWatch(scaler)
    outcomes = [(1024.0, True), (2048.0, False), (1024.0, False), (1024.0, True),
                (1024.0, False), (512.0, False), (512.0, True)]
    assert steps(watch, scaler, outcomes) == [None] * 7  # 2048 > 1024, then clean steps between


def test_the_auto_start_measured_is_the_reference():
    scaler = mxfp16.DynamicLossScaler(init_scale="auto")
    watch = SkipWatch(scaler)
    scaler.start_from(3.0)  # measured at the first step: 2048
    assert steps(watch, scaler, [(1.0, True)]) == [None] and watch.reference() == 2048.0
    assert steps(watch, scaler, [(2048.0, False), (1024.0, False), (512.0, False)]) == \
        [None, None, SKIPS_AT_SAFE_SCALE]


def test_skips_at_scale_1_waiting_for_the_auto_start_fire_and_a_static_scale_counts_every_skip():
    scaler = mxfp16.DynamicLossScaler(init_scale="auto")
    watch = SkipWatch(scaler)
    assert steps(watch, scaler, [(1.0, False), (0.5, False), (0.25, False)])[-1] == \
        SKIPS_AT_SAFE_SCALE
    static = mxfp16.StaticLossScaler(2.0 ** 14)
    watch = SkipWatch(static)
    assert steps(watch, static, [(2.0 ** 14, False)] * 3) == [None, None, SKIPS_AT_SAFE_SCALE]


def test_an_inf_loss_fires_at_once_and_is_read_only_on_a_skipped_step():
    scaler = mxfp16.DynamicLossScaler(init_scale=2.0 ** 16)
    watch = SkipWatch(scaler)
    nan_loss = [mx.nd.array([1.0, float("nan")])]
    assert watch.due(scaler, 2.0 ** 16, True, nan_loss) is None  # a clean step reads nothing
    assert watch.due(scaler, 2.0 ** 16, False, nan_loss) == LOSS_NOT_FINITE
    assert watch.fired == LOSS_NOT_FINITE


def test_the_warning_names_the_pass_the_culprits_and_the_fix_as_code_or_flags():
    report = Report([culprit("0", "net0_att0_batch_dot0"), culprit("0", "net0_att0_softmax0")],
                    ["0"])
    code = warning.compose("mxfp16.Trainer", LOSS_NOT_FINITE, 1, 1.0, report, bfloat16=True)
    assert code.splitlines() == [
        "mxfp16.Trainer: step 1 skipped: the loss is inf/NaN (loss scale 1).",
        "float16 overflows in the forward pass; mxfp16.find_overflow on the step's batch names:",
        "  forward  0: net0_att0_batch_dot0, 1.43e+05 in float32 beyond float16's 65504",
        "  forward  0: net0_att0_softmax0, 1.43e+05 in float32 beyond float16's 65504",
        "Fix: keep them in float32: mxfp16.cast_block(net, 'float16', keep_float32=['0'])",
        "  or train in bfloat16 (float32's range, native on these devices): "
        "mxfp16.cast_block(net, 'bfloat16') and mxfp16.Trainer(..., dtype='bfloat16')"]
    flags = warning.compose("mxfp16.train", SKIPS_AT_SAFE_SCALE, 3, 0.25, report,
                            fixes=warning.FLAGS)
    assert flags.splitlines()[0] == ("mxfp16.train: step 3 skipped: skipped steps in a row at or "
                                     "below a safe loss scale (loss scale 2**-2).")
    assert flags.splitlines()[-1] == "Fix: keep them in float32: --keep-float32 0"


def test_the_fix_keeps_what_the_network_keeps_already_and_names_ops_no_block_owns():
    class Kept:  # a cast network that keeps 'encoder.0' in float32
        keep_float32 = ("encoder.0",)

    report = Report([culprit("encoder.1", "enc1_dot0")], ["encoder.1"])
    assert warning.keep_selectors(report, Kept()) == ["encoder.0", "encoder.1"]
    graph = Report([culprit("", "fc1"), culprit("", "data", op_type="parameter")], ["fc1"])
    assert warning.keep_selectors(graph, None) == ["fc1"]
    text = warning.compose("mxfp16.module_step", LOSS_NOT_FINITE, 2, 1.0, graph,
                           fixes=MODULE_FIXES)
    assert text.splitlines()[-2:] == [
        "Fix: data exceed 65504, float16's largest value, before any op: normalize the inputs "
        "(or scale them down) before the network",
        "Fix: keep them in float32: mxfp16.cast_symbol(sym, 'float16', keep_float32=['fc1'])"]


def test_a_network_diverged_in_float32_too_is_told_to_lower_the_learning_rate_not_to_keep():
    report = Report([culprit("", "fc1_weight", max_abs=float("nan"), op_type="parameter"),
                     culprit("1", "net0_dense1_fwd", max_abs=float("inf"))], ["1"])
    assert warning.keep_selectors(report, None) == []
    text = warning.compose("mxfp16.train", LOSS_NOT_FINITE, 2, 128.0, report, bfloat16=True,
                           fixes=warning.FLAGS)
    assert "  forward  1: net0_dense1_fwd, inf/NaN in float32 too" in text
    assert text.splitlines()[-1] == (
        "Fix: float32 is inf/NaN there as well, so float16's range is not the cause (the weights "
        "or the data diverged): lower the learning rate, check the data for inf/NaN")


def test_a_forward_culprit_the_locator_found_no_fix_for_is_not_called_a_backward_one():
    report = Report([culprit("", "loud_fc")], [])  # fixed False: no blocks found
    text = warning.compose("mxfp16.module_step", LOSS_NOT_FINITE, 1, 1.0, report,
                           fixes=MODULE_FIXES)
    assert text.splitlines()[-1] == (
        "Fix: mxfp16.find_overflow found no blocks to keep that fix them on this batch: keep them "
        "and the ops reading their values in float32, starting with mxfp16.cast_symbol(sym, "
        "'float16', keep_float32=['loud_fc']), or normalize what feeds them")


def test_a_backward_overflow_says_the_scale_goes_below_1_and_an_empty_report_what_to_check():
    report = Report([culprit("1", "net0_dense1_backward", "backward", 7e5)], [])
    text = warning.compose("mxfp16.Trainer", SKIPS_AT_SAFE_SCALE, 3, 0.25, report,
                           scaler=mxfp16.DynamicLossScaler())
    assert "float16 overflows in the backward pass" in text
    assert text.splitlines()[-1] == (
        "Fix: the gradients overflow at this loss scale; dynamic scaling halves it on skipped "
        "steps, below 1 if need be (down to 2**-24), and a run that then trains needs nothing "
        "more. Else scale the loss down, or keep these blocks in float32: "
        "mxfp16.cast_block(net, 'float16', keep_float32=['1'])")
    empty = warning.compose("mxfp16.train", SKIPS_AT_SAFE_SCALE, 3, 1.0, Report([], []))
    assert empty.endswith("nothing overflows float16 there at this loss scale; check the data for "
                          "inf/NaN, or lower the learning rate")
    forward = warning.compose("mxfp16.Trainer", SKIPS_AT_SAFE_SCALE, 3, 1.0, Report([], []),
                              forward_only=True, scaler=mxfp16.DynamicLossScaler())
    assert "its forward pass does not overflow float16, so the gradients did; without the loss " \
        "the backward was not run: mxfp16.find_overflow(net, *batch, label=..., loss_fn=...)" in \
        forward and forward.endswith("(down to 2**-24): a run that then trains needs nothing more")


def test_no_batch_a_poisoned_batch_and_a_failing_locator_each_give_one_sentence():
    assert "no network cast by mxfp16.cast_block ran" in warning.locate(None, 1.0)[1]
    poisoned = warning.Batch(None, (mx.nd.array([float("inf")]),), {})
    assert warning.locate(poisoned, 1.0) == (
        None, "the batch's inputs themselves hold inf/NaN: check the data")
    loud = warning.Batch(None, (mx.nd.array([1.0, -9e4]), mx.nd.array([3], dtype="int32")), {})
    assert warning.locate(loud, 1.0) == (
        None, "the batch's inputs reach 9e+04, beyond float16's 65504, before any op: normalize "
              "them (or scale them down) before the network")

    def failing(net, *inputs, **options):
        raise TypeError("find_overflow takes a Gluon network (a Block), got Symbol\nmore")

    batch = warning.Batch(None, (mx.nd.ones(2),), {})
    assert warning.locate(batch, 1.0, failing) == (
        None, "mxfp16.find_overflow could not run on this network: find_overflow takes a Gluon "
              "network (a Block), got Symbol")


def test_the_alarm_locates_once_logs_once_and_a_collapse_carries_the_report(caplog):
    found = []

    def find(net, *inputs, **options):
        found.append(options)
        return Report([culprit("0", "net0_att0_batch_dot0")], ["0"])

    scaler = mxfp16.StaticLossScaler(8.0, max_consecutive_skips=4)
    alarm = warning.OverflowAlarm(scaler, "mxfp16.Trainer", find=find)
    batch = lambda: warning.Batch("net", (mx.nd.ones(2),), {})  # noqa: E731
    with caplog.at_level(logging.WARNING, logger="mxfp16"):
        reasons = []
        for _ in range(3):
            scaler.update(False)
            reasons.append(alarm.after_step(scaler, 8.0, False, batch))
        with pytest.raises(mxfp16.LossScaleCollapse) as caught:
            scaler.update(False)
    assert reasons == [None, None, SKIPS_AT_SAFE_SCALE] and found == [{"loss_scale": 8.0}]
    assert [r.getMessage() for r in caplog.records] == [alarm.message]
    collapse = alarm.collapsed(caught.value, scaler, 8.0, batch)
    assert collapse.report is alarm.report and str(collapse).endswith(alarm.message)
    assert str(collapse).startswith("4 steps in a row overflowed at the minimum loss scale 8")
    assert len(found) == 1  # not located again


# --- the paths, through the real locator ---

class SelfAttention(nn.HybridBlock):
    """The issue's self-attention: scores not divided by sqrt(d)."""

    def __init__(self, width, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(width, flatten=False, use_bias=False)
            self.key = nn.Dense(width, flatten=False, use_bias=False)
            self.value = nn.Dense(width, flatten=False, use_bias=False)

    def hybrid_forward(self, F, x):
        scores = F.batch_dot(self.query(x), self.key(x), transpose_b=True)
        return F.batch_dot(F.softmax(scores, axis=-1), self.value(x))


WIDTH = 32


def float32_attention(seed=0):
    """Self-attention and a Dense output whose weights start small (the loss starts at the
    targets' variance)."""
    mx.random.seed(seed)
    net = nn.HybridSequential()
    with net.name_scope():
        net.add(SelfAttention(WIDTH), nn.Dense(1, flatten=False))
    net.initialize(mx.init.Xavier())
    net[1].initialize(mx.init.Normal(0.001), force_reinit=True)
    return net


def attention(dtype="float16", **cast):
    net = float32_attention()
    net(BATCH[0])  # the shapes
    net = mxfp16.cast_block(net, dtype, **cast) if dtype != "float32" else net
    net.hybridize()
    return net


def _batch():
    """16 sequences of 16 steps, width 32, inputs of standard deviation 80 (the issue's); the
    targets another such network's outputs, scaled to a standard deviation of 0.3."""
    x = mx.nd.array(np.random.RandomState(0).randn(16, 16, WIDTH) * 80)
    teacher = float32_attention(seed=1)
    teacher[1].initialize(mx.init.Xavier(), force_reinit=True)
    y = teacher(x)
    return x, y * (0.3 / float(y.asnumpy().std()))


BATCH = _batch()


def train(net, dtype, steps, scaler=None, weight=1.0):
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.003},
                             dtype=dtype, loss_scale=scaler)
    loss_fn = gluon.loss.L2Loss()
    x, y = BATCH
    for _ in range(steps):
        with autograd.record():
            loss = loss_fn(net(x), y) * weight
        trainer.backward(loss)
        trainer.step(x.shape[0])
    return trainer, float(loss_fn(net(x), y).mean().asscalar())


def warnings_of(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


@pytest.mark.slow
def test_the_trainer_names_the_scores_block_and_the_forward_pass_at_the_first_step(caplog):
    with caplog.at_level(logging.WARNING, logger="mxfp16"):
        trainer, _ = train(attention(), "float16", 2)
    report = trainer.overflow_report
    assert [(c.path, c.phase) for c in report.culprits] == [("0", "forward")]
    assert report.culprits[0].op.endswith("batch_dot0") and report.culprits[0].max_abs > 65504
    (message,) = warnings_of(caplog)
    assert message.startswith("mxfp16.Trainer: step 1 skipped: the loss is inf/NaN (loss scale 1).")
    assert "float16 overflows in the forward pass" in message
    assert "Fix: keep them in float32 (checked on this batch: its forward pass then fits " \
        "float16): mxfp16.cast_block(net, 'float16', keep_float32=['0'])" in message


@pytest.mark.slow
def test_the_fix_the_warning_gives_trains_to_float32s_loss_with_no_step_skipped():
    broken, _ = train(attention(), "float16", 1)
    fixed, loss = train(attention(keep_float32=broken.overflow_report.keep_float32), "float16", 60)
    _, float32_loss = train(attention("float32"), "float32", 60)
    assert fixed.num_skipped == 0 and fixed.overflow_report is None
    assert loss == pytest.approx(float32_loss, rel=1e-3)  # 0.0378 both; 0.0450 at the start


@pytest.mark.slow
def test_a_collapse_carries_the_report_and_the_warning():
    scaler = mxfp16.DynamicLossScaler("auto", min_scale=0.25, max_consecutive_skips=3)
    with pytest.raises(mxfp16.LossScaleCollapse) as caught:
        train(attention(), "float16", 3, scaler=scaler)
    assert [c.path for c in caught.value.report.culprits] == ["0"]
    assert str(caught.value).startswith("3 steps in a row overflowed at the minimum loss scale "
                                        "2**-2") and "keep_float32=['0']" in str(caught.value)


def regression(dtype):
    """A Dense network whose forward pass stays in float16's range on ``BATCH``."""
    mx.random.seed(0)
    net = nn.HybridSequential()
    net.add(nn.Dense(32, activation="tanh", flatten=False), nn.Dense(1, flatten=False))
    net.initialize(mx.init.Xavier())
    net = mxfp16.cast_block(net, dtype) if dtype != "float32" else net
    net.hybridize()
    return net


@pytest.mark.slow
def test_a_loss_weighted_1e6_trains_below_scale_1_without_collapse_as_float32_does(caplog):
    with caplog.at_level(logging.WARNING, logger="mxfp16"):
        trainer, loss = train(regression("float16"), "float16", 40, weight=1e6)
    # the gradients overflow float16 unscaled: the scale halves below 1 (each halving a skipped
    # step) until they fit, the 'auto' start is measured there and the steps update
    assert trainer.loss_scale < 2.0 ** -10 and 0 < trainer.num_skipped < 20
    _, float32_loss = train(regression("float32"), "float32", 40 - trainer.num_skipped,
                            weight=1e6)
    assert loss == pytest.approx(float32_loss, rel=0.02)  # 0.2091 against 0.2078
    (message,) = warnings_of(caplog)
    assert "its forward pass does not overflow float16, so the gradients did" in message


@pytest.mark.slow
def test_mxfp16_amp_says_it_with_amp_init_as_the_fix(caplog):
    from mxfp16 import amp
    amp.init()
    try:
        net = float32_attention()
        net.hybridize()
        trainer = gluon.Trainer(net.collect_params(), "adam", {"learning_rate": 0.003},
                                update_on_kvstore=False)
        amp.init_trainer(trainer)
        x, y = BATCH
        with caplog.at_level(logging.WARNING, logger="mxfp16"):
            for _ in range(2):
                with autograd.record():
                    loss = gluon.loss.L2Loss()(net(x), y)
                    with amp.scale_loss(loss, trainer) as scaled:
                        autograd.backward(scaled)
                trainer.step(x.shape[0])
    finally:
        amp.reset()
    (message,) = warnings_of(caplog)
    assert message.startswith("mxfp16.amp: step 1 skipped: the loss is inf/NaN")
    assert "): amp.init(keep_float32=['0'])" in message


def dense_symbol():
    """A Module's graph whose first layer passes 65504; the LayerNorm after it (float32 data)
    brings its values back."""
    data = mx.sym.var("data")
    loud = mx.sym.FullyConnected(data, num_hidden=16, name="loud_fc")
    hidden = mx.sym.relu(mx.sym.LayerNorm(loud, axis=-1, name="ln"), name="relu")
    return mx.sym.SoftmaxOutput(mx.sym.FullyConnected(hidden, num_hidden=4, name="fc"),
                                name="softmax")


def test_module_step_locates_with_the_loss_head_and_names_the_op(caplog):
    sym = dense_symbol()
    scaler = mxfp16.make_loss_scaler(None, "float16")
    module = mxfp16.make_scaled_module(mxfp16.cast_symbol(sym, "float16"), scaler)
    module.bind(data_shapes=[("data", (8, 10))], label_shapes=[("softmax_label", (8,))])
    rng = np.random.RandomState(0)
    module.init_params(arg_params={"loud_fc_weight": mx.nd.array(rng.randn(16, 10) * 1e4),
                                   "loud_fc_bias": mx.nd.zeros(16),
                                   "ln_gamma": mx.nd.ones(16), "ln_beta": mx.nd.zeros(16),
                                   "fc_weight": mx.nd.array(rng.randn(4, 16) * 0.1),
                                   "fc_bias": mx.nd.zeros(4)})
    optimizer = mxfp16.make_optimizer("sgd", "float16", learning_rate=0.1)
    mxfp16.init_optimizer(module, optimizer)
    batch = mx.io.DataBatch([mx.nd.array(rng.randn(8, 10))], [mx.nd.array(rng.randint(0, 4, 8))])
    with caplog.at_level(logging.WARNING, logger="mxfp16"):
        assert mxfp16.module_step(module, batch, scaler, optimizer, 8) is False
    report = overflow_alarm(module, scaler).report
    assert [(c.path, c.op, c.phase) for c in report.culprits] == [("", "loud_fc", "forward")]
    (message,) = warnings_of(caplog)
    assert "Fix: keep them in float32 (checked on this batch: its forward pass then fits float16): " \
           "mxfp16.cast_symbol(sym, 'float16', keep_float32=['loud_fc'])" in message


@pytest.fixture(scope="module")
def loud_checkpoint(tmp_path_factory):
    """A Module checkpoint whose first convolution's outputs pass 65504 on the scripts'
    synthetic images (uniform in [-1, 1)); LayerNorm after it (float32 data) brings them back."""
    prefix = str(tmp_path_factory.mktemp("loud") / "loud")
    data = mx.sym.var("data")
    conv = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), pad=(1, 1), name="loud_conv")
    body = mx.sym.Activation(mx.sym.LayerNorm(conv, axis=1, name="ln"), act_type="relu")
    pooled = mx.sym.Flatten(mx.sym.Pooling(body, global_pool=True, pool_type="avg",
                                           kernel=(1, 1)))
    logits = mx.sym.FullyConnected(pooled, num_hidden=10, name="fc")
    rng = np.random.RandomState(0)
    arg_params = {"loud_conv_weight": mx.nd.array(rng.randn(8, 3, 3, 3) * 1e4),
                  "loud_conv_bias": mx.nd.zeros(8), "ln_gamma": mx.nd.ones(8),
                  "ln_beta": mx.nd.zeros(8), "fc_weight": mx.nd.array(rng.randn(10, 8) * 0.1),
                  "fc_bias": mx.nd.zeros(10)}
    mx.model.save_checkpoint(prefix, 1, logits, arg_params, {})
    return prefix


@pytest.mark.slow
@pytest.mark.parametrize("api", ["gluon", "module"])
def test_a_script_prints_the_warning_with_the_flag_that_fixes_it(loud_checkpoint, capsys, api):
    argv = ["--pretrained-model", loud_checkpoint, "--load-epoch", "1", "--image-shape", "3,8,8",
            "--num-classes", "4", "--benchmark", "1", "--num-examples", "32", "--batch-size", "8",
            "--num-epochs", "1", "--api", api]
    fine_tune = load_script_main("fine_tune")
    assert fine_tune(argv) == 0
    out = capsys.readouterr().out
    assert "WARNING mxfp16.train: step 3 skipped: skipped steps in a row at or below a safe " \
           "loss scale (loss scale 2**-2)." in out
    assert "  forward  loud_conv, " in out and "float16): --keep-float32 " \
           "loud_conv\n" in out
    assert fine_tune(argv + ["--keep-float32", "loud_conv"]) == 0  # the flag the warning gave
    out = capsys.readouterr().out
    assert "mxfp16.train: step" not in out and out.strip().endswith(", 0 skipped steps")
