"""mxfp16.compare_precision, layer by layer against float32, and scripts/report.py --compare: exact
errors where float16's rounding is exact, the first layer beyond tolerance of a planted overflow,
bfloat16, the NumPy interface, and the script's one-line errors (its JSON and plot:
tests/test_report_script.py)."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet.gluon import nn

import mxfp16
from test_find_overflow import attention_batch, attention_net


def dense_net(weight):
    net = nn.HybridSequential(prefix="net_")
    with net.name_scope():
        net.add(nn.Dense(3, in_units=2), nn.Dense(1, in_units=3))
    net.initialize(mx.init.Constant(weight))
    return net


def test_errors_where_the_rounding_is_exact():
    report = mxfp16.compare_precision(dense_net(0.5), mx.nd.array([[1, 1000]]))
    first, second = report.layers
    assert (first.path, first.op, first.op_type, first.tensor, first.dtype) == \
        ("0", "net_dense0_fwd", "FullyConnected", "net_dense0_fwd_output", "float16")
    # 500.5 is a float16 value; 3 * 0.5 * 500.5 = 750.75 lies halfway between 750.5 and 751
    assert (first.max_abs, first.abs_error, first.rel_error) == (500.5, 0.0, 0.0)
    assert (second.max_abs, second.abs_error, second.rel_error) == (750.75, 0.25, 0.25 / 750.75)
    assert first.input_error == second.input_error == 0.0 and second.excess is None
    assert report.first is None and not report


def test_an_input_off_the_grid_explains_the_whole_error():
    net = nn.Dense(1, in_units=1, prefix="fc_", weight_initializer=mx.init.One())
    net.initialize()
    [layer] = mxfp16.compare_precision(net, mx.nd.array([[1000.3]])).layers
    # 1000.3 rounds to float16's 1000.5: the float32 layer on the rounded input errs as much
    assert layer.abs_error == layer.input_error == np.float32(1000.5) - np.float32(1000.3)
    assert layer.excess == 1.0


@pytest.fixture(scope="module")
def attention():
    return attention_net(), attention_batch(std=1.0)[0], attention_batch(std=80.0)[0]


def test_every_layer_in_execution_order_within_tolerance(attention):
    net, x, _ = attention
    report = mxfp16.compare_precision(net, x)
    assert [layer.op for layer in report.layers] == [
        "net_selfattention0_dense0_fwd", "net_selfattention0_dense1_fwd",
        "net_selfattention0_batch_dot0", "net_selfattention0_softmax0",
        "net_selfattention0_dense2_fwd", "net_selfattention0_batch_dot1",
        "net_selfattention0_dense3_fwd", "net_dropout0_identity0", "net_dense0_fwd"]
    assert [layer.path for layer in report.layers][:4] == ["att.query", "att.key", "att", "att"]
    assert report.layers[3].dtype == "float32"  # the softmax
    assert report.first is None and report.tolerance == 0.02
    assert all(0 < layer.rel_error < 0.01 for layer in report.layers)
    assert all(layer.excess > 1 for layer in report.layers if layer.op.endswith("dense0_fwd"))
    tight = mxfp16.compare_precision(net, x, tolerance=1e-5)  # settable
    assert tight.first.op == "net_selfattention0_dense0_fwd" and bool(tight)


def test_an_overflow_is_the_first_layer_beyond_tolerance(attention):
    net, _, loud = attention
    report = mxfp16.compare_precision(net, loud)
    assert (report.first.path, report.first.op) == ("att", "net_selfattention0_batch_dot0")
    assert report.first.rel_error == float("inf")
    assert "first beyond tolerance: net_selfattention0_batch_dot0 (att)" in str(report)
    assert json.loads(json.dumps(report.to_dict()))["first_beyond_tolerance"] == \
        "net_selfattention0_batch_dot0"


def test_bfloat16_within_its_tolerance(attention):
    net, x, _ = attention
    report = mxfp16.compare_precision(net, x, dtype="bfloat16")
    assert report.first is None and report.tolerance == 0.1
    assert {layer.dtype for layer in report.layers} == {"bfloat16", "float32"}
    float16 = mxfp16.compare_precision(net, x)
    assert report.layers[-1].rel_error > 3 * float16.layers[-1].rel_error  # 8 bits against 11


def test_the_numpy_interface():
    with mx.util.np_shape(True), mx.util.np_array(True):
        net = nn.Dense(1, in_units=1, prefix="fc_", weight_initializer=mx.init.One())
        net.initialize()
        [layer] = mxfp16.compare_precision(net, mx.np.array([[1000.3]])).layers
    assert layer.excess == 1.0


def test_refused_in_one_line(attention):
    net, x, _ = attention
    with pytest.raises(ValueError, match=r"tolerance=-1: give a positive number, .* "
                                         r"\(default 0.02 for float16\)"):
        mxfp16.compare_precision(net, x, tolerance=-1)
    with pytest.raises(ValueError, match=r"dtype='float32': compare_precision compares one of"):
        mxfp16.compare_precision(net, x, dtype="float32")


@pytest.mark.parametrize("flags, message", [
    (["--compare", "float32"], "argument --compare: invalid choice: 'float32'"),
    (["--compare", "float16", "--compare-tolerance", "0"], "compare_tolerance must be a positive"),
    (["--compare", "bfloat16", "--compare-batch-size", "0"], "compare_batch_size must be a"),
])
def test_the_report_script_refuses_bad_flags_in_one_line(flags, message, capsys, script_main):
    assert script_main("report")(["--network", "resnet18_v1", "--underflow-steps", "0"]
                                 + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and message in err and err.count("\n") == 1
