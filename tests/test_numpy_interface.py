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
from mxfp16.numpy_interface import FrontEndError, load_arrays
from mxfp16.scaling.clipping import global_norm
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
    """``steps`` of Adam through mxfp16.Trainer on one batch (a recurrent network's gradients
    clipped, its states carried); the losses and the last outputs."""
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 0.01}, dtype=dtype)
    losses = []
    for _ in range(steps):
        with autograd.record():
            outputs = net(*inputs)
            loss = loss_fn(outputs, targets)
        trainer.backward(loss)
        if isinstance(inputs[-1], list):  # d2l clips an RNN's gradients (unscaled norm)
            assert trainer.clip_global_norm(1.0) > 0
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


@pytest.mark.slow
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


@pytest.mark.parametrize("dtype, mode", [("float16", "full"), ("float16", "amp"),
                                         ("bfloat16", "full")])
@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_family_gpu_graph_types(name, dtype, mode):
    net, inputs, _ = built(name)
    gpu = mxfp16.cast_block(net, dtype, emulate=False, mode=mode)
    block, _, _ = gpu._new_variant(list(inputs), training=True)  # traced, not run (no GPU)
    graph_inputs, graph = mxnet_internals.symbol_block_graph(block)
    names = [symbol.name for symbol in graph_inputs]
    _, out_types, _ = graph.infer_type(**{name: onp.float32 for name in names})
    assert all(onp.dtype(t) == onp.float32 for t in out_types)
    dtypes = internal_dtypes(graph, names)
    nodes = mxnet_internals.graph_json(graph)["nodes"]
    expected = dict.fromkeys(GEMMS, TYPE_NAMES[dtype])
    if mode == "amp":  # MXNet AMP's own choices: batch_dot widest-type, RNN weights as given
        expected = dict.fromkeys(("FullyConnected", "Convolution"), "float16")
    if dtype == "bfloat16":  # MXNet 1.9.1's CPU kernels (rules.BFLOAT16_FLOAT32_GEMMS), and
        expected.update(RNN="float32", batch_dot="float32")  # convolutions of < 16 channels
        expected["Convolution"] = lambda node: "float32" if int(node["attrs"]["num_filter"]) < 16 \
            else "void16"
    gemms = [node for node in nodes if node["op"] in expected]
    assert gemms and all(dtypes[f"{node['name']}_output"] == (
        expected[node["op"]](node) if callable(expected[node["op"]]) else expected[node["op"]])
        for node in gemms), {node["name"]: dtypes[f"{node['name']}_output"] for node in gemms}
    norms = [name for name in net.collect_params() if name.endswith(("gamma", "beta",
                                                                     "running_mean"))]
    assert all(dtypes[name] == "float32" for name in norms if name in dtypes)
    if (dtype, mode) == ("float16", "full"):  # bfloat16 casts float32 parameters in the graph
        weights = [name for name in net.collect_params() if name.endswith("weight")
                   and "layernorm" not in name and "batchnorm" not in name]
        assert weights and {dtypes[name] for name in weights} == {"float16"}


@pytest.mark.parametrize("dtype", DTYPES)
def test_amp_trains_a_numpy_mode_network(dtype, tmp_path):
    amp.init(dtype)
    net, inputs, targets = built("mlp")
    trainer = gluon.Trainer(net.collect_params(), "sgd", {"learning_rate": 0.5})
    amp.init_trainer(trainer)
    losses = []
    for _ in range(5):
        with autograd.record():
            outputs = net(*inputs)
            loss = FAMILIES["mlp"].loss(outputs, targets)
            with amp.scale_loss(loss, trainer) as scaled:
                autograd.backward(scaled)
        amp.unscale(trainer)  # the script's own clipping, unchanged, on np gradients
        gluon.utils.clip_global_norm([p.grad() for p in net.collect_params().values()], 10.0)
        trainer.step(1)
        losses.append(float(loss.mean()))
    assert isinstance(outputs, mx.np.ndarray) and outputs.dtype == onp.float32
    assert onp.dtype(net.hidden.weight.dtype).name == ("float16" if dtype == "float16" else
                                                       "float32")
    assert losses[-1] < losses[0] and amp.loss_scaler(trainer).num_skipped == 0
    path = str(tmp_path / "mlp.params")
    net.save_parameters(path)  # float32, as the float32 network writes it in numpy mode
    fresh = MLP()
    fresh.load_parameters(path)
    assert fresh.hidden.weight.data().dtype == onp.float32
    converted = amp.convert_hybrid_block(fresh_hybridized(path), target_dtype=dtype)
    out = converted(*inputs)
    assert isinstance(out, mx.np.ndarray) and out.dtype == onp.float32


def fresh_hybridized(path):
    """A float32 MLP with the checkpoint's values, hybridized and called once (its graph)."""
    net = MLP()
    net.load_parameters(path)
    net.hybridize()
    net(*FAMILIES["mlp"].batch()[0])
    return net


def test_clipping_drop_ins_take_numpy_gradients():
    net, inputs, targets = built("mlp")
    cast = mxfp16.cast_block(net, "float16")
    with autograd.record():
        loss = FAMILIES["mlp"].loss(cast(*inputs), targets)
    loss.backward()
    grads = [param.grad() for param in cast.collect_params().values()]
    assert all(isinstance(grad, mx.np.ndarray) for grad in grads)
    norm = mxfp16.clip_global_norm(grads, 1e-3)
    assert norm > 1e-3
    after = global_norm(grads)
    assert isinstance(after, mx.np.ndarray)
    onp.testing.assert_allclose(float(after), 1e-3, rtol=1e-2)  # float16 gradients, rounded


def legacy_mlp():
    """The legacy front end's twin of numpy_models.MLP: the same layers, names and shapes."""
    class LegacyMLP(nn.HybridBlock):
        def __init__(self):
            super().__init__()
            self.hidden = nn.Dense(16)
            self.output = nn.Dense(4)

        def hybrid_forward(self, F, X):
            return self.output(F.relu(self.hidden(X)))
    return LegacyMLP()


def test_checkpoints_cross_the_front_ends(tmp_path):
    net, inputs, targets = built("mlp")
    cast = mxfp16.cast_block(net, "float16")
    train(cast, "float16", inputs, targets, FAMILIES["mlp"].loss, steps=2)
    numpy_file, legacy_file = str(tmp_path / "numpy.params"), str(tmp_path / "legacy.params")
    cast.save_parameters(numpy_file)  # numpy mode: npx.save's format, as Gluon writes here
    expected = masters(cast)
    rounded = {name: value.astype("float16").astype("float32") for name, value in expected.items()}
    npx.reset_np()  # a legacy-mode process
    twin = legacy_mlp()
    twin.initialize()
    twin16 = mxfp16.cast_block(twin, "float16")
    twin16.load_parameters(numpy_file)  # which plain Gluon refuses here ("np shape semantics")
    for key, param in twin16.param_keys.items():  # float16 values (no optimizer: no masters)
        onp.testing.assert_array_equal(float32_value(param).asnumpy(),
                                       rounded[cast.param_keys[key].name])
    twin16.save_parameters(legacy_file)
    npx.set_np()  # and back: a numpy-mode float32 model and cast model read the legacy file
    fresh = MLP()
    fresh.load_parameters(legacy_file)
    fresh16 = mxfp16.cast_block(MLP(), "float16")
    fresh16.initialize()
    fresh16.load_parameters(legacy_file)
    for key, param in mxnet_internals.block_param_keys(fresh).items():
        onp.testing.assert_array_equal(param.data().asnumpy(), rounded[cast.param_keys[key].name])
        onp.testing.assert_array_equal(float32_value(fresh16.param_keys[key]).asnumpy(),
                                       rounded[cast.param_keys[key].name])


def test_a_block_of_the_other_front_end_is_refused_at_the_cast_with_the_fix():
    legacy_pool = nn.HybridLambda(lambda F, x: F.relu(x))  # no parameters
    with pytest.raises(FrontEndError, match=r"legacy operators .*`npx.reset_np\(\)`"):
        mxfp16.cast_block(legacy_pool, "float16")
    npx.reset_np()
    numpy_relu = nn.HybridLambda(lambda F, x: F.npx.relu(x))
    with pytest.raises(FrontEndError, match=r"NumPy-interface operators .*`npx.set_np\(\)`"):
        mxfp16.cast_block(numpy_relu, "float16")


@pytest.mark.parametrize("layer", [nn.AvgPool2D(), nn.Activation("relu"), nn.Dropout(0.5)])
def test_blocks_without_parameters_cast_and_run(layer):
    cast = mxfp16.cast_block(layer, "float16")
    x = mx.np.ones((2, 3, 4, 4))
    out = cast(x)
    assert isinstance(out, mx.np.ndarray) and out.dtype == onp.float32


def test_a_state_list_given_as_one_array_names_the_unbound_input():
    net, inputs, _ = built("lstm_lm")
    cast = mxfp16.cast_block(net, "float16")  # the plain call fails: traced at the first call
    assert cast.graphs[0].list_arguments() != []
    with pytest.raises(TypeError, match=r"leaves \['lstm\d+_rnn\d+_state_cell'\] unbound"):
        cast(inputs[0], inputs[1][0])  # h without c


class Totals(nn.HybridBlock):
    """A layer and a reduction (F.np.sum), which MXNet 1.9.1 cannot run in bfloat16 on a CPU."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.dense = nn.Dense(8, flatten=False)

    def hybrid_forward(self, F, x):
        return F.np.sum(self.dense(x), axis=-1)


def test_a_numpy_op_without_a_bfloat16_kernel_runs_in_float32():
    x = mx.np.random.uniform(size=(2, 3, 16))
    # MXNet's own error for _np_sum of a bfloat16 value (a graph: the NumPy interface cannot
    # make a bfloat16 array), the error the guide names
    data = mx.sym.var("x")
    half = json.loads(mx.sym.amp_cast(data, dtype="float16", name="half").tojson(
        remove_amp_cast=False))
    half["nodes"][1]["attrs"]["dtype"] = "bfloat16"  # Python's amp_cast refuses 'bfloat16'
    half = mx.sym.load_json(json.dumps(half)).as_np_ndarray()
    summed = mx.sym.amp_cast(mx.sym.np.sum(half, axis=-1).as_nd_ndarray(), dtype="float32")
    block = gluon.SymbolBlock(summed.as_np_ndarray(), [data.as_np_ndarray()])
    with pytest.raises(mx.base.MXNetError, match="Unknown type enum 12"):
        block(x).wait_to_read()
    assert "_np_sum" in NUMPY_NO_BFLOAT16_KERNEL
    net = Totals()
    net.initialize()
    cast = mxfp16.cast_block(net, "bfloat16")
    out = cast(x)
    graph = cast.graphs[0]
    dtypes = internal_dtypes(graph, ["data"])
    sums = [node["name"] for node in mxnet_internals.graph_json(graph)["nodes"]
            if node["op"] == "_np_sum"]
    assert sums and all(dtypes[f"{name}_output"] == "float32" for name in sums)
    assert isinstance(out, mx.np.ndarray) and out.shape == (2, 3)
    assert dtypes[[n["name"] for n in mxnet_internals.graph_json(graph)["nodes"]
                   if n["op"] == "FullyConnected"][0] + "_output"] == "void16"


def test_export_and_report_of_a_numpy_mode_network(tmp_path):
    from mxfp16.report import ReportConfig, build_report
    net, inputs, _ = built("resnet")
    expected = net(*inputs).asnumpy()
    cast = mxfp16.cast_block(net, "float16")
    prefix = str(tmp_path / "resnet")
    cast.export(prefix)  # float32 graph and master weights
    plain = gluon.SymbolBlock.imports(f"{prefix}-symbol.json", ["data"], f"{prefix}-0000.params")
    # the cast rounded the weights to float16 once: their float32 masters start there
    onp.testing.assert_allclose(plain(*inputs).asnumpy(), expected, rtol=1e-2, atol=1e-2)
    saved = load_arrays(f"{prefix}-0000.params")  # fine-tuning: float32 values in the cast dtypes
    args = {key[4:]: value for key, value in saved.items() if key.startswith("arg:")}
    aux = {key[4:]: value for key, value in saved.items() if key.startswith("aux:")}
    args16, aux16 = mxfp16.cast_params(args, aux, mxfp16.cast_symbol(
        mx.sym.load(f"{prefix}-symbol.json"), "float16", emulate=False))
    assert {onp.dtype(value.dtype).name for value in args16.values()} == {"float16", "float32"}
    assert {onp.dtype(value.dtype).name for value in aux16.values()} == {"float32"}
    npx.reset_np()  # the report runs in the legacy front end, on the numpy-mode files
    report = build_report(ReportConfig(network=None, checkpoint=prefix, image_shape=(3, 8, 8),
                                       batch_size=8, num_classes=4, underflow_steps=0))
    assert report["precision"] and len(report["tensor_cores"]["layers"]) == 7


def test_the_doctor_runs_with_the_numpy_interface_on():
    from mxfp16.doctor import diagnose
    from mxfp16.doctor.bench import run_bench
    report = diagnose()
    assert report["mxnet_import_error"] is None
    rows = run_bench(report, {"cpu": 64})  # its GEMMs: legacy arrays, whatever the mode
    assert [row["dtype"] for row in rows][0] == "float32" and all(row["seconds"] > 0 for row in rows)


def test_a_failed_deferred_trace_names_the_first_failure_too():
    net, inputs, _ = built("lstm_lm")
    cast = mxfp16.cast_block(net, "float16")
    with pytest.raises(TypeError, match=r"at the cast, the call with plain inputs failed too: "
                                        r"TypeError: .*unbound"):
        cast(inputs[0], inputs[1][0])
