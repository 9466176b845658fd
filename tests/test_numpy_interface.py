"""MXNet's NumPy interface (``npx.set_np()``): the seven model families of "Dive into Deep Learning"
(tests/numpy_models.py) cast, trained, checkpointed and type-checked in float16 and bfloat16;
mxfp16.amp, the clipping drop-ins and checkpoints across the two front ends.

The NumPy interface is process-wide: every test here turns it on and the fixture turns it off
again, so the rest of the suite runs in the legacy front end.
"""
import json

import mxnet as mx
import numpy as onp
import pytest
from mxnet import autograd, gluon, npx
from mxnet.gluon import nn

import mxfp16
from mxfp16 import amp, mxnet_internals
from mxfp16.casting.deploy import float32_value
from mxfp16.casting.graph import internal_dtypes
from mxfp16.casting.rules import NUMPY_NO_BFLOAT16_KERNEL
from mxfp16.numpy_interface import FrontEndError
from numpy_models import FAMILIES, MLP

DTYPES = ("float16", "bfloat16")

#: How MXNet names the dtypes in inferred types (numpy has no bfloat16: void16).
TYPE_NAMES = {"float16": "float16", "bfloat16": "void16"}

#: Ops whose outputs run in the low-precision dtype in the GPU graph of every family.
GEMMS = ("FullyConnected", "Convolution", "RNN", "batch_dot")


@pytest.fixture(autouse=True)
def numpy_mode():
    """The NumPy interface on for the test, off afterwards whatever happens."""
    npx.set_np()
    try:
        yield
    finally:
        amp.reset()
        npx.reset_np()


def built(name):
    """The family's float32 network (Xavier, seed 0, shapes known) and its batch."""
    family = FAMILIES[name]
    mx.random.seed(0)
    net = family.build()
    net.initialize(mx.init.Xavier())
    inputs, targets = family.batch()
    net(*inputs)
    return net, inputs, targets


def masters(net):
    """The float32 value (the optimizer's master copy where it holds one) of each parameter."""
    return {name: float32_value(param).asnumpy() for name, param in net.collect_params().items()}


def train(net, dtype, inputs, targets, loss_fn, steps=6):
    """``steps`` of Adam through mxfp16.Trainer on one batch; the losses and the last outputs."""
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, dtype=dtype)
    losses = []
    for _ in range(steps):
        with autograd.record():
            outputs = net(*inputs)
            loss = loss_fn(outputs, targets)
        trainer.backward(loss)
        trainer.step(1)
        losses.append(float(loss.mean()))
        if isinstance(inputs[-1], list):  # the LM's states carry into the next batch
            inputs = inputs[:-1] + ([state.detach() for state in outputs[1]],)
    return losses, outputs


def flat(outputs):
    """The arrays of a (nested) output."""
    if isinstance(outputs, (list, tuple)):
        return [array for item in outputs for array in flat(item)]
    return [outputs]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_trains_and_its_checkpoint_loads_into_a_fresh_float32_model(name, dtype, tmp_path):
    net, inputs, targets = built(name)
    before = masters(net)
    cast = mxfp16.cast_block(net, dtype)
    losses, outputs = train(cast, dtype, inputs, targets, FAMILIES[name].loss)
    for output in flat(outputs):  # np arrays in, np arrays out (states too), float32
        assert isinstance(output, mx.np.ndarray) and output.dtype == onp.float32
    assert losses[-1] < losses[0], losses
    after = masters(cast)
    assert any(not onp.array_equal(after[key], before[key]) for key in before)

    path = str(tmp_path / "net.params")
    cast.save_parameters(path)
    fresh = FAMILIES[name].build()
    fresh.load_parameters(path)  # numpy mode, float32, no option
    keys = mxnet_internals.block_param_keys(fresh)
    assert sorted(keys) == sorted(cast.param_keys)
    for key, param in keys.items():
        assert isinstance(param.data(), mx.np.ndarray) and param.data().dtype == onp.float32
        onp.testing.assert_array_equal(param.data().asnumpy(), after[cast.param_keys[key].name])
    expected = flat(cast(*inputs))[0].asnumpy()
    tolerance = 0.05 if dtype == "float16" else 0.15
    onp.testing.assert_allclose(flat(fresh(*inputs))[0].asnumpy(), expected,
                                rtol=tolerance, atol=tolerance * onp.abs(expected).max())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gpu_graph_types(name, dtype):
    net, inputs, _ = built(name)
    gpu = mxfp16.cast_block(net, dtype, emulate=False)
    block, _, _ = gpu._new_variant(list(inputs), training=True)  # traced, not run (no GPU)
    graph_inputs, graph = mxnet_internals.symbol_block_graph(block)
    names = [symbol.name for symbol in graph_inputs]
    _, out_types, _ = graph.infer_type(**{name: onp.float32 for name in names})
    assert all(onp.dtype(t) == onp.float32 for t in out_types)
    dtypes = internal_dtypes(graph, names)
    nodes = mxnet_internals.graph_json(graph)["nodes"]
    expected = dict.fromkeys(GEMMS, TYPE_NAMES[dtype])
    if dtype == "bfloat16":  # MXNet 1.9.1's CPU kernels (rules.BFLOAT16_FLOAT32_GEMMS), and
        expected.update(RNN="float32", batch_dot="float32")  # convolutions of < 16 channels
        expected["Convolution"] = lambda node: "float32" if int(node["attrs"]["num_filter"]) < 16 \
            else "void16"
    gemms = [node for node in nodes if node["op"] in GEMMS]
    assert gemms and all(dtypes[f"{node['name']}_output"] == (
        expected[node["op"]](node) if callable(expected[node["op"]]) else expected[node["op"]])
        for node in gemms), {node["name"]: dtypes[f"{node['name']}_output"] for node in gemms}
    norms = [name for name in net.collect_params() if name.endswith(("gamma", "beta",
                                                                     "running_mean"))]
    assert all(dtypes[name] == "float32" for name in norms if name in dtypes)
    if dtype == "float16":  # float16 weights; bfloat16 casts float32 parameters in the graph
        weights = [name for name in net.collect_params() if name.endswith("weight")
                   and "layernorm" not in name and "batchnorm" not in name]
        assert weights and {dtypes[name] for name in weights} == {"float16"}
