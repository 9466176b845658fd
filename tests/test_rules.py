"""The per-op dtype rules as a table: rows are checked, and a row added changes what casting does."""
import mxnet as mx
import numpy as np
import pytest

import mxfp16
from mxfp16.casting import rules
from mxfp16.casting.graph import internal_dtypes


def test_every_row_names_a_known_rule_and_a_reason():
    for entry in rules.OP_RULES:
        assert entry.rule in rules.RULES and entry.reason and entry.ops, entry


@pytest.mark.parametrize("args, message", [
    (("relu", "fast", "why"), "unknown dtype rule 'fast'"),
    (("take", "index", "ids"), "names its input positions"),
    (("relu", "grid", ""), "has no reason"),
])
def test_a_bad_row_is_refused_with_the_fix(args, message):
    with pytest.raises(ValueError, match=message):
        rules.row(*args)


def test_views_follow_the_table():
    assert rules.NORM_OPS_WITH_FLOAT16_DATA < rules.NORM_OPS
    assert rules.NORM_OPS - rules.NORM_OPS_WITH_FLOAT16_DATA < rules.FLOAT32_OPS
    assert rules.INDEX_INPUTS["Embedding"] == (0,) and rules.INDEX_INPUTS["take"] == (1,)
    assert rules.applies("float32", {"op": "Activation", "attrs": {"act_type": "softrelu"}})
    assert not rules.applies("float32", {"op": "Activation", "attrs": {"act_type": "relu"}})


def test_a_row_added_for_an_op_changes_its_dtype(monkeypatch):
    data = mx.sym.var("data")
    net = mx.sym.FullyConnected(mx.sym.sin(mx.sym.FullyConnected(data, num_hidden=4, name="fc0")),
                                num_hidden=2, name="fc1")
    before = internal_dtypes(mxfp16.cast_symbol(net, "float16", emulate=False), ["data"])
    sin = [name for name in before if name.startswith("sin") and name.endswith("_output")][0]
    assert before[sin] == "float16"
    table = rules.OP_RULES + [rules.row("sin", "float32", "a test row")]
    monkeypatch.setattr(rules, "OP_RULES", table)
    after = internal_dtypes(mxfp16.cast_symbol(net, "float16", emulate=False), ["data"])
    assert after[sin] == "float32" and np.dtype(after["fc1_weight"]).name == "float16"


#: Op names in the table that this MXNet 1.9.1 CPU build does not register, and why they are there.
OTHER_BUILDS = {
    "CuDNNBatchNorm": "registered by CUDA builds only",
    "masked_softmax": "MXNet 2.0's name (GluonNLP 1.x graphs)",
    "masked_log_softmax": "MXNet 2.0's name (GluonNLP 1.x graphs)",
    "_npi_dot": "numpy-interface name of MXNet 2.0",
    "_npx_masked_softmax": "the NumPy interface's masked softmax of MXNet 2.0",
    "_npx_masked_log_softmax": "the NumPy interface's masked log-softmax of MXNet 2.0",
    "_contrib_BilinearResize2D_none": "kept from the grid list; no such op in 1.9.1",
}


def test_every_op_in_the_table_is_one_mxnet_registers_or_is_named_why_not():
    registered = set(mx.operator.get_all_registered_operators())
    named = {op for entry in rules.OP_RULES for op in entry.ops}
    assert named - registered == set(OTHER_BUILDS), named - registered


def small_first_layers():
    """mobilenet0.25's first layers at a tiny size: 8-channel convolutions, each with BatchNorm
    and relu, then 16-channel ones (the last read by no other, so that BatchNorm and relu
    before it are not the graph's float32 tail)."""
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, strides=2, padding=1, in_channels=3), nn.BatchNorm(in_channels=8),
            nn.Activation("relu"), nn.Conv2D(8, 3, padding=1, groups=8, in_channels=8),
            nn.BatchNorm(in_channels=8), nn.Activation("relu"), nn.Conv2D(16, 1, in_channels=8),
            nn.BatchNorm(in_channels=16), nn.Activation("relu"), nn.Conv2D(16, 1, in_channels=16))
    return net


def test_bfloat16_runs_convolutions_of_fewer_than_16_channels_in_float32():
    """Row 'bfloat16_float32': oneDNN's bfloat16 kernels block channels by 16, so the 8-channel
    convolutions, and the BatchNorm and relu they feed, run in float32; the 16-channel
    convolution, its BatchNorm (float32 statistics) and relu in bfloat16."""
    assert rules.applies("bfloat16_float32", {"op": "Convolution", "attrs": {"num_filter": "8"}})
    assert not rules.applies("bfloat16_float32",
                             {"op": "Convolution", "attrs": {"num_filter": "16"}})
    net = small_first_layers()
    net.initialize()
    cast = mxfp16.cast_block(net, "bfloat16")
    types = internal_dtypes(cast.graphs[0], cast.data_names)
    outputs = [types[f"{layer.name}_fwd_output"] for layer in net]
    assert outputs == ["float32"] * 6 + ["void16"] * 4  # numpy names bfloat16 void16
    assert np.dtype(types[f"{net[7].name}_gamma"]).name == "float32"


def test_bfloat16_small_convolutions_train_like_float32():
    """Gradients of the cast network match float32's within bfloat16's resolution (the one
    bfloat16 convolution), and BatchNorm's running statistics move as in float32."""
    from mxnet import autograd
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (4, 3, 16, 16)))
    grads, stats = [], []
    for dtype in ("float32", "bfloat16"):
        mx.random.seed(0)
        net = small_first_layers()
        net.initialize(mx.init.Xavier())
        cast = mxfp16.cast_block(net, dtype)
        with autograd.record():
            loss = (cast(x) ** 2).sum()
        loss.backward()
        grads.append([layer.weight.grad().astype("float32").asnumpy() for layer in net[::3]])
        stats.append(net[1].running_mean.data().asnumpy())
    for got, want in zip(*grads):
        np.testing.assert_allclose(got, want, rtol=2 ** -5, atol=2 ** -5 * np.abs(want).max())
    np.testing.assert_allclose(stats[1], stats[0], rtol=1e-6, atol=1e-7)
