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
    "_contrib_BilinearResize2D_none": "kept from the grid list; no such op in 1.9.1",
}


def test_every_op_in_the_table_is_one_mxnet_registers_or_is_named_why_not():
    registered = set(mx.operator.get_all_registered_operators())
    named = {op for entry in rules.OP_RULES for op in entry.ops}
    assert named - registered == set(OTHER_BUILDS), named - registered
