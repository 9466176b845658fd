"""keep_float32 of cast_block and cast_symbol: the kept blocks' ops in float32 with float32
parameters, casts only where they meet float16 ops (the GPU graph's dtypes by infer_type), in
mode 'full' and 'amp', float16 and bfloat16, the legacy and the NumPy front end, HybridBlocks,
plain Blocks and SymbolBlocks; the planted overflows fixed in the CPU emulation; float32
checkpoints a plain float32 network loads; export and cast_params; the refusals at the cast."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon, npx
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.deploy import param_dtypes
from mxfp16.casting.graph import internal_dtypes

LOW = {"float16": "float16", "bfloat16": "void16"}  # numpy's name of MXNet's bfloat16


class Attention(nn.HybridBlock):
    """Self-attention whose scores are not divided by sqrt(d): the issue's planted overflow."""

    def __init__(self, width=8, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(width, flatten=False, in_units=width)
            self.key = nn.Dense(width, flatten=False, in_units=width)

    def hybrid_forward(self, F, x):
        scores = F.batch_dot(self.query(x), self.key(x), transpose_b=True)
        return F.batch_dot(F.softmax(scores), x)


class Net(nn.HybridBlock):
    """float16 layers on both sides of the attention, so a kept attention meets float16 twice."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.embed = nn.Dense(8, flatten=False, in_units=4)
            self.att = Attention()
            self.out = nn.Dense(3, in_units=32)

    def hybrid_forward(self, F, x):
        return self.out(self.att(self.embed(x)))


def network(seed=0):
    mx.random.seed(seed)
    net = Net(prefix="net_")
    net.initialize(mx.init.Xavier())
    return net


def inputs(scale=1.0, shape=(2, 4, 4)):
    return mx.nd.array(np.random.RandomState(1).normal(0, scale, shape), dtype="float32")


KEPT = ["net_attention0_dense0_fwd", "net_attention0_dense1_fwd", "net_attention0_batch_dot0",
        "net_attention0_softmax0", "net_attention0_batch_dot1"]


def kept_inputs(sym, names):
    """The dtypes of every input of the ops ``names``, as the graph infers them."""
    types = internal_dtypes(sym, ["data"])
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]

    def dtype(entry):
        node = nodes[entry[0]]
        return types[node["name"]] if node["op"] == "null" else \
            types.get(f"{node['name']}_output", types.get(f"{node['name']}_output{entry[1]}"))
    return {dtype(entry) for node in nodes if node["name"] in names for entry in node["inputs"]}


def graph_dtypes(sym):
    """``({op name: output dtype}, [output dtypes of the casts of values, not of parameters])``."""
    types = internal_dtypes(sym, ["data"])
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    ops = {n["name"]: types.get(n["name"] + "_output") for n in nodes
           if n["op"] not in ("null", "Cast", "amp_cast")}
    params = {n["name"] for n in nodes if n["op"] == "null" and n["name"] != "data"}
    casts = [types[n["name"] + "_output"] for n in nodes if n["op"] in ("Cast", "amp_cast")
             and nodes[n["inputs"][0][0]]["name"] not in params]
    return ops, casts


@pytest.mark.parametrize("mode", ["full", "amp"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_the_gpu_graph_runs_the_kept_block_in_float32(mode, dtype):
    net = network()
    cast = mxfp16.cast_block(net, dtype, emulate=False, mode=mode, keep_float32=["att"])
    ops, casts = graph_dtypes(cast.graphs[0])
    low = LOW[dtype]
    assert ops == {"net_dense0_fwd": low, **{name: "float32" for name in KEPT},
                   "net_dense1_fwd": low}
    assert kept_inputs(cast.graphs[0], KEPT) == {"float32"}
    # the data into embed, embed's output into the attention (one cast for its three readers),
    # the attention's output into out, out's output: nothing inside the kept block
    assert sorted(casts) == sorted([low, "float32", low, "float32"])
    dtypes = param_dtypes(cast.graphs[0])
    assert {name: t for name, t in dtypes.items() if "attention0" in name} == {
        f"net_attention0_dense{i}_{p}": "float32" for i in (0, 1) for p in ("weight", "bias")}
    assert dtypes["net_dense0_weight"] == (low if dtype == "float16" else "float32")
    assert cast.keep_float32 == ("att", "att.query", "att.key") and cast.kept_ops == KEPT
    assert np.dtype(net.att.query.weight.dtype) == np.float32


def test_a_kept_block_fixes_the_planted_overflow_in_float16():
    x = inputs(scale=300.0)
    reference = network()(x).asnumpy()
    overflowing = mxfp16.cast_block(network(), "float16")
    with pytest.warns(RuntimeWarning, match="holds inf or NaN"):
        assert not np.isfinite(overflowing(x).asnumpy()).all()
    net = network()
    kept = mxfp16.cast_block(net, "float16", keep_float32=[net.att])
    out = kept(x).asnumpy()
    assert np.isfinite(out).all() and np.abs(out - reference).max() < 0.02 * np.abs(reference).max()
    with autograd.record():
        loss = kept(x).sum()
    loss.backward()
    grads = {name: p.grad() for name, p in net.collect_params().items()}
    assert all(np.isfinite(g.asnumpy()).all() for g in grads.values())
    assert grads["net_attention0_dense0_weight"].dtype == np.float32
    assert grads["net_dense1_weight"].dtype == np.float16


class ConvNet(nn.HybridBlock):
    """A convolution fed unnormalized inputs (beyond 65504) before its BatchNorm."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.conv = nn.Conv2D(4, 3, padding=1, in_channels=1)
            self.norm = nn.BatchNorm(in_channels=4)
            self.head = nn.Dense(2, in_units=64)

    def hybrid_forward(self, F, x):
        return self.head(self.norm(self.conv(x)))


def test_a_kept_first_layer_reads_the_data_unrounded_in_the_emulation():
    mx.random.seed(0)
    net = ConvNet(prefix="c_")
    net.initialize(mx.init.Xavier())
    x = inputs(scale=1e5, shape=(2, 1, 4, 4))
    with autograd.train_mode():  # BatchNorm normalizes by the batch's statistics
        reference = net(x).asnumpy()
        conv_only = mxfp16.cast_block(net, "float16", keep_float32=["conv"])(x).asnumpy()
    assert not np.isfinite(conv_only).all()  # BatchNorm reads the convolution's output in float16
    gpu = mxfp16.cast_block(net, "float16", emulate=False, keep_float32=["conv", "norm"]).graphs[0]
    assert graph_dtypes(gpu)[0] == {"c_conv0_fwd": "float32", "c_batchnorm0_fwd": "float32",
                                    "c_dense0_fwd": "float16"}
    with autograd.train_mode():
        out = mxfp16.cast_block(net, "float16", keep_float32=["conv", "norm"])(x).asnumpy()
    assert np.isfinite(out).all() and np.abs(out - reference).max() < 0.01 * np.abs(reference).max()


def test_the_checkpoint_is_the_float32_networks(tmp_path):
    net = network()
    cast = mxfp16.cast_block(net, "float16", keep_float32=["att.key", "out"])
    path = str(tmp_path / "net.params")
    cast.save_parameters(path)
    saved = mx.nd.load(path)
    assert sorted(saved) == sorted(f"{b}.{p}" for b in ("embed", "att.query", "att.key", "out")
                                   for p in ("weight", "bias"))
    assert {np.dtype(v.dtype) for v in saved.values()} == {np.dtype("float32")}
    plain = Net(prefix="other_")
    plain.load_parameters(path)  # no option
    x = inputs()
    np.testing.assert_allclose(plain(x).asnumpy(), network()(x).asnumpy(), rtol=1e-3, atol=1e-3)
    cast.load_parameters(path)
    assert np.dtype(net.att.key.weight.dtype) == np.float32
    assert np.dtype(net.att.query.weight.dtype) == np.float16


def test_export_and_cast_params_keep_the_kept_parameters_float32(tmp_path):
    cast = mxfp16.cast_block(network(), "float16", keep_float32=["out"])
    symbol_file, params_file = cast.export(str(tmp_path / "net"), dtype="float16")
    dtypes = param_dtypes(mx.sym.load(symbol_file))
    assert dtypes["net_dense1_weight"] == "float32" and dtypes["net_dense0_weight"] == "float16"
    assert mx.nd.load(params_file)["arg:net_dense1_weight"].dtype == np.float32
    sym = mx.sym.FullyConnected(mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=3,
                                                      name="fc1"), num_hidden=2, name="fc2")
    args = {"fc1_weight": mx.nd.ones((3, 4)), "fc1_bias": mx.nd.zeros(3),
            "fc2_weight": mx.nd.ones((2, 3)), "fc2_bias": mx.nd.zeros(2)}
    cast_sym = mxfp16.cast_symbol(sym, "float16", emulate=False, keep_float32="fc2")
    converted, _ = mxfp16.cast_params(args, {}, cast_sym)
    assert {k: np.dtype(v.dtype).name for k, v in converted.items()} == {
        "fc1_weight": "float16", "fc1_bias": "float16", "fc2_weight": "float32",
        "fc2_bias": "float32"}


def test_a_parameter_shared_by_a_kept_and_a_cast_op_stays_float32():
    first = nn.Dense(4, in_units=4, prefix="first_")
    second = nn.Dense(4, in_units=4, prefix="second_", params=first.collect_params())
    net = nn.HybridSequential(prefix="tied_")
    net.add(first, second)
    net.initialize()
    gpu = mxfp16.cast_block(net, "float16", emulate=False, keep_float32=["1"]).graphs[0]
    assert graph_dtypes(gpu)[0] == {"first_fwd": "float16", "second_fwd": "float32"}
    assert param_dtypes(gpu) == {"first_weight": "float32", "first_bias": "float32"}
    out = mxfp16.cast_block(net, "float16", keep_float32=["1"])(mx.nd.ones((2, 4)))
    assert np.isfinite(out.asnumpy()).all()


def test_selectors_that_select_nothing_are_refused_at_the_cast():
    net = network()
    with pytest.raises(ValueError, match=r"^keep_float32 selector 'atn' matches no block: the "
                       r"nearest block paths and names are 'att'"):
        mxfp16.cast_block(net, "float16", keep_float32=["out", "atn"])
    with pytest.raises(ValueError, match="selector 'atn' matches no block"):
        mxfp16.cast_block(net, "float32", keep_float32="atn")  # checked in float32 too
    with pytest.raises(ValueError, match="selector 'Conv2D' matches no block"):
        mxfp16.cast_block(net, "bfloat16", keep_float32=nn.Conv2D)
    assert np.dtype(net.embed.weight.dtype) == np.float32  # nothing cast by a refused cast
    sym = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc1")
    with pytest.raises(ValueError, match=r"^keep_float32 selector 'fc2' selects no op of the "
                       r"graph: the nearest names are 'fc1'"):
        mxfp16.cast_symbol(sym, "float16", keep_float32=["fc2"])


def test_a_symbol_block_is_selected_by_its_op_names_or_the_blocks_it_came_from():
    net = network()
    graph = gluon.SymbolBlock(net(mx.sym.var("data")), mx.sym.var("data"),
                              params=net.collect_params())
    by_name = mxfp16.cast_block(graph, "float16", emulate=False, keep_float32=["net_attention0"])
    assert by_name.kept_ops == KEPT and by_name.keep_float32 == ()
    by_block = mxfp16.cast_block(graph, "float16", emulate=False, keep_float32=[net.att])
    assert by_block.kept_ops == KEPT
    assert graph_dtypes(by_block.graphs[0])[0]["net_attention0_softmax0"] == "float32"
    with pytest.raises(TypeError, match="selector Attention .a class. on a graph without its blocks"):
        mxfp16.cast_block(graph, "float16", keep_float32=[Attention])


class PlainNet(gluon.Block):
    """GluonNLP's NMTModel style: Python code between HybridBlocks."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.encoder = Net()
            self.head = nn.Dense(2, in_units=3)

    def forward(self, x):
        return self.head(self.encoder(x) * 0.5)


def test_a_plain_block_keeps_blocks_inside_its_parts_and_whole_parts(tmp_path):
    mx.random.seed(0)
    net = PlainNet()
    net.initialize()
    x = inputs(scale=300.0)
    reference = net(x).asnumpy()
    mxfp16.cast_block(net, "float16", keep_float32=["encoder.att", "head"])
    assert net.keep_float32 == ("encoder.att", "encoder.att.query", "encoder.att.key", "head")
    assert isinstance(net.head, nn.Dense) and np.dtype(net.head.weight.dtype) == np.float32
    assert net.encoder.keep_float32 == ("att", "att.query", "att.key")
    out = net(x).asnumpy()
    assert np.isfinite(out).all() and np.abs(out - reference).max() < 0.02 * np.abs(reference).max()
    path = str(tmp_path / "plain.params")
    net.save_parameters(path)
    assert {np.dtype(v.dtype) for v in mx.nd.load(path).values()} == {np.dtype("float32")}
    PlainNet().load_parameters(path)  # the float32 network, no option


class NumpyAttention(nn.HybridBlock):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.query = nn.Dense(8, flatten=False, in_units=8)

    def hybrid_forward(self, F, x):
        query = self.query(x)
        return F.npx.softmax(F.np.matmul(query, F.np.swapaxes(query, 1, 2)))


@pytest.fixture
def numpy_mode():
    npx.set_np()
    yield
    npx.reset_np()


def test_the_numpy_interface(numpy_mode):
    mx.random.seed(0)
    net = nn.HybridSequential(prefix="n_")
    with net.name_scope():
        net.add(NumpyAttention(), nn.Dense(3, in_units=64))
    net.initialize()
    x = mx.np.array(np.random.RandomState(0).normal(0, 80, (2, 8, 8)), dtype="float32")
    reference = net(x).asnumpy()
    gpu = mxfp16.cast_block(net, "float16", emulate=False, keep_float32=[NumpyAttention])
    ops, casts = graph_dtypes(gpu.graphs[0])
    assert ops == {"n_numpyattention0_dense0_fwd": "float32", "n_numpyattention0_swapaxes0":
                   "float32", "n_numpyattention0_matmul0": "float32",
                   "n_numpyattention0_softmax0": "float32", "n_dense0_fwd": "float16"}
    assert sorted(casts) == ["float16", "float32"]
    cast = mxfp16.cast_block(net, "float16", keep_float32=[NumpyAttention])
    out = cast(x)
    assert isinstance(out, mx.np.ndarray)
    assert np.abs(out.asnumpy() - reference).max() < 0.01 * np.abs(reference).max()


@pytest.mark.slow
def test_the_scripts_networks_keep_their_blocks_by_path_in_both_apis(caplog):
    from mxfp16.models import Network, block_to_network
    from mxfp16.train.cli.config import TrainConfig
    from mxfp16.train.gluon_api import gluon_network
    from mxfp16.train.keep_float32 import network_keep
    from mxfp16.train.module_api import make_module

    graph = block_to_network(network())
    assert graph.block_prefixes == {"embed": "net_dense0_", "att": "net_attention0_",
                                      "att.query": "net_attention0_dense0_",
                                      "att.key": "net_attention0_dense1_", "out": "net_dense1_"}
    with caplog.at_level("INFO", logger="mxfp16.train.keep_float32"):
        keep = network_keep(graph, TrainConfig(keep_float32="att,out").checked().keep_float32)
    assert caplog.messages == ["--keep-float32: kept in float32: att (5 ops), out (1 op)"]
    block, _ = gluon_network(graph, [mx.cpu()], "float16", keep_float32=keep)
    module, _ = make_module(graph, mxfp16.DynamicLossScaler(), ctx=[mx.cpu()], dtype="float16",
                            data_shape=(2, 4, 4), label_shape=(2,), kvstore="device",
                            optimizer="sgd", optimizer_params={"learning_rate": 0.1},
                            keep_float32=keep)
    args = module.get_params()[0]
    for name, param in block.collect_params().items():
        expected = "float16" if name.startswith("net_dense0_") else "float32"
        assert (np.dtype(param.dtype).name, np.dtype(args[name].dtype).name) == (expected,) * 2
    without_blocks = Network(graph.symbol, graph.arg_params, graph.aux_params)
    assert kept_ops_of(network_keep(without_blocks, ["net_attention0*"]), graph.symbol) == KEPT
    with pytest.raises(ValueError, match=r"^--keep-float32 att,outt: keep_float32 selector "
                       r"'outt' matches no block: the nearest block paths and names are 'out'"):
        network_keep(graph, ("att", "outt"))
    with pytest.raises(ValueError, match=r"^--keep-float32 'att,,out' has an empty selector"):
        TrainConfig(keep_float32=("att", "", "out")).checked()


def kept_ops_of(keep, sym):
    from mxfp16.casting.keep import kept_ops
    return kept_ops(sym, keep)


@pytest.mark.slow
def test_a_script_selector_matching_nothing_is_one_error_line(script_main, capsys):
    argv = ["--network", "cifar_resnet20_v1", "--image-shape", "3,8,8", "--num-classes", "2",
            "--batch-size", "2", "--top-k", "1", "--benchmark", "1", "--num-epochs", "1",
            "--max-batches", "1", "--dtype", "float16", "--keep-float32", "features.4.O"]
    assert script_main("train_imagenet")(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "error: --keep-float32 features.4.O: keep_float32 selector 'features.4.O' matches no "
        "block: the nearest block paths and names are ")


def test_amp_conversions_keep_blocks_through_excluded_sym_names():
    from mxfp16 import amp

    net = network()
    net.hybridize()
    net(inputs())
    by_name = amp.convert_hybrid_block(net, ctx=mx.cpu(), cast_optional_params=True,
                                       excluded_sym_names=["net_attention0_dense0_fwd"])
    by_block = amp.convert_hybrid_block(net, ctx=mx.cpu(), cast_optional_params=True,
                                        keep_float32=[net.att])
    dtypes = [{name: np.dtype(p.dtype).name for name, p in block.collect_params().items()}
              for block in (by_name, by_block)]
    assert {n for n, t in dtypes[0].items() if t == "float32"} == {
        "net_attention0_dense0_weight", "net_attention0_dense0_bias"}  # MXNet's meaning
    assert {n for n, t in dtypes[1].items() if t == "float32"} == {
        f"net_attention0_dense{i}_{p}" for i in (0, 1) for p in ("weight", "bias")}
    assert np.isfinite(by_block(inputs(300.0)).asnumpy()).all()
    with pytest.raises(ValueError, match="selector 'atn' matches no block"):
        amp.convert_hybrid_block(net, ctx=mx.cpu(), keep_float32=["atn"])
    sym = net(mx.sym.var("data"))
    assert amp.convert_symbol(sym, data_names=["data"], keep_float32="net_attention0").tojson() \
        == amp.convert_symbol(sym, data_names=["data"], excluded_sym_names=KEPT).tojson()


def test_amp_init_keeps_blocks_and_fp32_ops_in_the_networks_it_casts():
    from mxfp16 import amp
    from mxfp16.amp import session

    amp.init(fp32_ops=["batch_dot"], keep_float32=["out"])
    try:
        net, other = network(), network()
        keep = session.current().keep_for(net)
        gpu = mxfp16.cast_block(net, "float16", emulate=False, keep_float32=keep).graphs[0]
        assert graph_dtypes(gpu)[0] == {"net_dense0_fwd": "float16", "net_attention0_dense0_fwd":
                                        "float16", "net_attention0_dense1_fwd": "float16",
                                        "net_attention0_batch_dot0": "float32",
                                        "net_attention0_softmax0": "float32",
                                        "net_attention0_batch_dot1": "float32",
                                        "net_dense1_fwd": "float32"}
        trainer = gluon.Trainer(other.collect_params(), "sgd", {"learning_rate": 0.1},
                                update_on_kvstore=False)
        amp.init_trainer(trainer)
        other(inputs())  # its first call casts it
        assert np.dtype(other.out.weight.dtype) == np.float32
        assert np.dtype(other.embed.weight.dtype) == np.float16
    finally:
        amp.reset()
    with pytest.raises(TypeError, match="selector 3 .int."):
        amp.init(keep_float32=[3])
    amp.reset()
