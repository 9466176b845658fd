"""cast_block, cast_symbol and cast_params: dtypes, numerics, idempotence, bad input."""
import json
import warnings

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn
from gluoncv.nn.dropblock import DropBlock
from mxnet.gluon.model_zoo import vision

import mxfp16
from conftest import slow_except
from mxfp16.models import get_network
from mxfp16.casting.graph import MARK, count_ops


def dtype_name(param):
    return np.dtype(param.dtype).name


def norm_net():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.InstanceNorm(), nn.Conv2D(8, 3, padding=1), nn.GroupNorm(num_groups=2),
            nn.Flatten(), nn.Dense(16), nn.LayerNorm(), nn.Dense(3))
    net.initialize()
    return net


NORM_SUFFIXES = ("gamma", "beta", "running_mean", "running_var")


@pytest.mark.parametrize("mode", ["full", "amp"])
@pytest.mark.parametrize("emulate", [True, False])
def test_cast_block_parameter_dtypes(mode, emulate):
    net = norm_net()
    mxfp16.cast_block(net, "float16", emulate=emulate, mode=mode)
    for name, param in net.collect_params().items():
        expected = "float32" if name.endswith(NORM_SUFFIXES) else "float16"
        assert dtype_name(param) == expected, name


def test_cast_block_float32_returns_the_block_unchanged():
    net = norm_net()
    assert mxfp16.cast_block(net, "float32") is net
    assert {dtype_name(p) for p in net.collect_params().values()} == {"float32"}


def test_bfloat16_keeps_float32_master_parameters():
    net = norm_net()
    net16 = mxfp16.cast_block(net, "bfloat16")
    assert {dtype_name(p) for p in net.collect_params().values()} == {"float32"}
    out = net16(mx.nd.random.uniform(shape=(2, 3, 8, 8)))
    assert out.dtype == np.float32


@pytest.mark.parametrize("input_dtype", ["float32", "float16", "float64"])
@pytest.mark.parametrize("hybridize", [False, True])
def test_cast_block_accepts_float_inputs_and_returns_float32(input_dtype, hybridize):
    net = norm_net()
    if hybridize:
        net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 8, 8))
    ref = net(x)
    net16 = mxfp16.cast_block(net, "float16")
    if hybridize:
        net16.hybridize()
    out = net16(x.astype(input_dtype))
    assert out.dtype == np.float32
    assert np.allclose(out.asnumpy(), ref.asnumpy(), rtol=2e-2, atol=2e-2)


def relative_error(out, ref):
    return float(np.abs(out - ref).max() / np.abs(ref).max())


@pytest.mark.slow
def test_resnet50_float16_matches_float32_forward_and_backward():
    mx.random.seed(1)
    net = vision.resnet50_v1(classes=10)
    net.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(2, 3, 64, 64))
    label = mx.nd.array([1, 7])
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    def forward_backward(block):
        with autograd.record(train_mode=False):
            out = block(x)
            loss = loss_fn(out, label)
        loss.backward()
        return out.asnumpy(), net.output.weight.grad().astype("float32").asnumpy()

    ref_out, ref_grad = forward_backward(net)
    net16 = mxfp16.cast_block(net, "float16")
    assert dtype_name(net.features[0].weight) == "float16"
    assert dtype_name(net.features[1].gamma) == "float32"
    out, grad = forward_backward(net16)
    assert relative_error(out, ref_out) < 1e-2
    assert relative_error(grad, ref_grad) < 1e-2


def test_cast_block_of_symbolblock_imported_from_float32_checkpoint(tmp_path):
    net = norm_net()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 8, 8))
    ref = net(x)
    net.export(str(tmp_path / "net"))
    imported = gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data"],
                                         str(tmp_path / "net-0000.params"))
    net16 = mxfp16.cast_block(imported, "float16")
    weights = [p for n, p in imported.collect_params().items() if n.endswith("weight")]
    assert weights and all(dtype_name(p) == "float16" for p in weights)
    assert np.allclose(net16(x).asnumpy(), ref.asnumpy(), rtol=2e-2, atol=2e-2)


#: Every classification network of MXNet's gluon.model_zoo.vision.
ZOO = [f"resnet{depth}_v{version}" for version in (1, 2) for depth in (18, 34, 50, 101, 152)] + \
    [f"vgg{depth}{bn}" for depth in (11, 13, 16, 19) for bn in ("", "_bn")] + ["alexnet"] + \
    [f"densenet{depth}" for depth in (121, 161, 169, 201)] + \
    ["squeezenet1.0", "squeezenet1.1", "inceptionv3"] + \
    [f"mobilenet{width}" for width in ("1.0", "0.75", "0.5", "0.25")] + \
    [f"mobilenetv2_{width}" for width in ("1.0", "0.75", "0.5", "0.25")]
#: A sample of GluonCV's classification families (its zoo holds MXNet's too).
GLUONCV_ZOO = ["resnet50_v1d", "resnext50_32x4d", "se_resnet18_v1", "mobilenetv3_small",
               "darknet53", "xception", "senet_154", "resnest14", "cifar_resnet20_v1"]


def input_size(name):
    """The smallest convenient input side: pooling windows fix it for some networks."""
    if name == "inceptionv3":
        return 299
    if name.startswith(("densenet", "squeezenet")):
        return 224
    return 32 if name.startswith(("cifar", "vgg")) else 64


#: The networks that the fast tier casts: the smallest of each family.
FAST_ZOO = ("resnet18_v1", "resnet18_v2", "mobilenet0.25", "mobilenetv2_0.25", "squeezenet1.1",
            "cifar_resnet20_v1")


@pytest.mark.parametrize("name", slow_except(ZOO + GLUONCV_ZOO, FAST_ZOO))
def test_model_zoo_networks_cast_and_run(name):
    net = get_network(name, num_classes=10)
    net.initialize()
    size = input_size(name)
    x = mx.nd.random.uniform(shape=(1, 3, size, size))
    net16 = mxfp16.cast_block(net, "float16")
    params = net.collect_params()
    halves = [n for n, p in params.items() if dtype_name(p) == "float16"]
    assert halves and all(not n.endswith(NORM_SUFFIXES) for n in halves)
    out = net16(x)
    assert out.shape == (1, 10) and out.dtype == np.float32
    assert np.isfinite(out.asnumpy()).all()


def softmax_net(num_hidden=4):
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, num_filter=8, kernel=(3, 3), name="conv")
    net = mx.sym.BatchNorm(net, name="bn")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=num_hidden, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


def argument_types(sym):
    arg_types, _, aux_types = sym.infer_type(data="float32")
    names = sym.list_arguments() + sym.list_auxiliary_states()
    return {n: np.dtype(t).name for n, t in zip(names, arg_types + aux_types)}


def test_cast_symbol_gpu_graph_follows_the_float16_guide():
    cast = mxfp16.cast_symbol(softmax_net(), "float16", emulate=False)
    types = argument_types(cast)
    assert types["conv_weight"] == types["fc_weight"] == types["fc_bias"] == "float16"
    assert types["bn_gamma"] == types["bn_moving_var"] == "float32"
    assert types["data"] == types["softmax_label"] == "float32"
    nodes = json.loads(cast.tojson(remove_amp_cast=False))["nodes"]
    casts = [(n["attrs"]["dtype"], nodes[n["inputs"][0][0]]["name"]) for n in nodes
             if n["op"] == "Cast"]
    assert sorted(casts) == [("float16", "data"), ("float32", "fc")]


@pytest.mark.parametrize("emulate", [True, False])
@pytest.mark.parametrize("mode", ["full", "amp"])
def test_casting_twice_adds_no_casts(emulate, mode):
    once = mxfp16.cast_symbol(softmax_net(), "float16", emulate=emulate, mode=mode)
    twice = mxfp16.cast_symbol(once, "float16", emulate=emulate, mode=mode)
    def casts(sym):
        return count_ops(sym, "Cast") + count_ops(sym, "amp_cast")

    assert casts(twice) == casts(once) > 0
    assert once.tojson(remove_amp_cast=False) == twice.tojson(remove_amp_cast=False)


def test_cast_symbol_of_a_graph_with_its_own_casts():
    """The MXNet example symbols with dtype='float16' cast the data and the logits themselves."""
    data = mx.sym.Cast(mx.sym.var("data"), dtype="float16")
    net = mx.sym.FullyConnected(data, num_hidden=4, name="fc")
    net = mx.sym.SoftmaxOutput(mx.sym.Cast(net, dtype="float32"), name="softmax")
    gpu = mxfp16.cast_symbol(net, "float16", emulate=False)
    assert count_ops(gpu, "Cast") == 2 and argument_types(gpu)["fc_weight"] == "float16"
    emulated = mxfp16.cast_symbol(net, "float16", emulate=True)
    assert argument_types(emulated)["fc_weight"] == "float16"
    nodes = json.loads(emulated.tojson())["nodes"]
    # The graph's own casts became roundings: every Cast left is one mxfp16 inserted.
    assert all(MARK in n.get("attrs", {}) for n in nodes if n["op"] == "Cast")


def test_emulated_symbol_trains_with_module():
    sym = mxfp16.cast_symbol(softmax_net(), "float16", emulate=True)
    assert argument_types(sym)["conv_weight"] == "float16"
    mod = mx.mod.Module(sym, context=mx.cpu())
    batch = mx.io.DataBatch([mx.nd.random.uniform(shape=(8, 3, 6, 6))], [mx.nd.arange(8) % 4])
    mod.bind(data_shapes=[("data", (8, 3, 6, 6))], label_shapes=[("softmax_label", (8,))])
    mod.init_params(mx.init.Xavier())
    mod.init_optimizer(optimizer=mxfp16.make_optimizer("sgd", "float16", batch_size=8,
                                                       learning_rate=0.5))
    before = mod.get_params()[0]["fc_weight"].asnumpy()
    for _ in range(3):
        mod.forward_backward(batch)
        mod.update()
    after = mod.get_params()[0]["fc_weight"]
    assert after.dtype == np.float16 and not np.array_equal(before, after.asnumpy())


def test_cast_params_converts_checkpoint_dtypes():
    sym = mxfp16.cast_symbol(softmax_net(), "float16", emulate=False)
    arg_shapes, _, aux_shapes = sym.infer_shape(data=(1, 3, 6, 6))
    args = {n: mx.nd.ones(s) for n, s in zip(sym.list_arguments(), arg_shapes)
            if n not in ("data", "softmax_label")}
    aux = {n: mx.nd.ones(s) for n, s in zip(sym.list_auxiliary_states(), aux_shapes)}
    new_args, new_aux = mxfp16.cast_params(args, aux, sym)
    assert {n: v.dtype.__name__ for n, v in new_args.items()} == {
        "conv_weight": "float16", "conv_bias": "float16", "bn_gamma": "float32",
        "bn_beta": "float32", "fc_weight": "float16", "fc_bias": "float16"}
    assert {v.dtype.__name__ for v in new_aux.values()} == {"float32"}


def test_cast_params_names_missing_and_unexpected_parameters():
    sym = mxfp16.cast_symbol(softmax_net(), "float16", emulate=False)
    args = {"conv_weight": mx.nd.ones((8, 3, 3, 3)), "stray_weight": mx.nd.ones(1)}
    with pytest.raises(ValueError, match="fc_weight"):
        mxfp16.cast_params(args, {}, sym)
    with pytest.raises(ValueError, match="stray_weight"):
        mxfp16.cast_params(args, {}, sym, allow_missing=True)
    new_args, _ = mxfp16.cast_params(args, {}, sym, allow_missing=True, allow_extra=True)
    assert list(new_args) == ["conv_weight"]


@pytest.mark.parametrize("bad", ["float8", "int8", "double"])
def test_unknown_dtype_names_value_and_choices(bad):
    with pytest.raises(ValueError, match=rf"{bad}.*float32, float16, bfloat16"):
        mxfp16.cast_block(norm_net(), bad)
    with pytest.raises(ValueError, match=rf"{bad}.*float32, float16, bfloat16"):
        mxfp16.cast_symbol(softmax_net(), bad)


def test_unknown_mode_names_choices():
    with pytest.raises(ValueError, match="'half'.*full, amp"):
        mxfp16.cast_symbol(softmax_net(), mode="half")


def test_wrong_argument_types_name_the_value():
    with pytest.raises(TypeError, match="HybridBlock, got str 'resnet50_v1'"):
        mxfp16.cast_block("resnet50_v1")
    with pytest.raises(TypeError, match="Symbol, got HybridSequential"):
        mxfp16.cast_symbol(norm_net())
    with pytest.raises(ValueError, match=r"'images'.*data_names"):
        mxfp16.cast_symbol(softmax_net(), data_names=["images"])


def test_emulate_true_is_float16_only():
    with pytest.raises(ValueError, match="float16 only"):
        mxfp16.cast_symbol(softmax_net(), "bfloat16", emulate=True)


SYMBOL_FAMILIES = ["resnet18_v1", "resnext50_32x4d", "vgg11", "alexnet", "googlenet", "inceptionv3",
                   "mobilenet0.25", "densenet121", "squeezenet1.0"]


@pytest.mark.parametrize("name", slow_except(SYMBOL_FAMILIES, ["resnet18_v1"]))
def test_cast_symbol_of_gluon_exports_binds_and_trains_with_module(name, tmp_path):
    size = {"inceptionv3": 299, "vgg11": 32, "densenet121": 224, "squeezenet1.0": 224,
            "googlenet": 224}.get(name, 64)
    net = get_network(name, num_classes=10)
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((1, 3, size, size)))
    net.export(str(tmp_path / name))
    sym, args, aux = mx.model.load_checkpoint(str(tmp_path / name), 0)
    sym = mx.sym.SoftmaxOutput(sym, name="softmax")
    cast = mxfp16.cast_symbol(sym, "float16")
    types = argument_types(cast)
    assert {t for n, t in types.items() if n.endswith("weight")} == {"float16"}
    assert {t for n, t in types.items() if n.endswith(NORM_SUFFIXES)} <= {"float32"}
    args, aux = mxfp16.cast_params(args, aux, cast)
    mod = mx.mod.Module(cast, context=mx.cpu())
    mod.bind(data_shapes=[("data", (1, 3, size, size))], label_shapes=[("softmax_label", (1,))])
    mod.set_params(args, aux)
    mod.forward_backward(mx.io.DataBatch([mx.nd.ones((1, 3, size, size))], [mx.nd.ones(1)]))
    out = mod.get_outputs()[0].asnumpy()
    assert out.shape == (1, 10) and np.isfinite(out).all()


def symbol_api_net():
    """A graph written with the Symbol API the way MXNet's example symbols are: LRN (which MXNet's
    AMP lists keep in float32) between convolutions, an inception-style Concat, Dropout."""
    data = mx.sym.var("data")
    net = mx.sym.Convolution(data, num_filter=16, kernel=(3, 3), pad=(1, 1), name="conv1")
    net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.LRN(net, alpha=1e-4, beta=0.75, knorm=2, nsize=5, name="lrn1")
    branches = [mx.sym.Convolution(net, num_filter=8, kernel=(1, 1), name="branch1"),
                mx.sym.Pooling(net, kernel=(3, 3), stride=(1, 1), pad=(1, 1), pool_type="max")]
    net = mx.sym.Concat(*branches, name="concat")
    net = mx.sym.BatchNorm(net, fix_gamma=False, eps=2e-5, name="bn1")
    net = mx.sym.Pooling(net, global_pool=True, kernel=(7, 7), pool_type="avg")
    net = mx.sym.Dropout(mx.sym.Flatten(net), p=0.5)
    net = mx.sym.FullyConnected(net, num_hidden=4, name="fc")
    return mx.sym.SoftmaxOutput(net, name="softmax")


@pytest.mark.parametrize("emulate", [False, True])
def test_float32_ops_inside_the_graph_get_casts_both_ways(emulate):
    cast = mxfp16.cast_symbol(symbol_api_net(), "float16", emulate=emulate)
    internals = cast.get_internals()
    _, out_types, _ = internals.infer_type(data="float32")
    types = {n: np.dtype(t).name for n, t in zip(internals.list_outputs(), out_types)}
    assert types["lrn1_output"] == "float32"
    assert argument_types(cast)["branch1_weight"] == "float16"
    if not emulate:  # the GPU graph: float16 into the branch conv again, and into the concat
        assert types["branch1_output"] == types["concat_output"] == "float16"
        return
    mod = mx.mod.Module(cast, context=mx.cpu())
    mod.bind(data_shapes=[("data", (2, 3, 8, 8))], label_shapes=[("softmax_label", (2,))])
    mod.init_params(mx.init.Xavier())
    mod.forward_backward(mx.io.DataBatch([mx.nd.ones((2, 3, 8, 8))], [mx.nd.array([0, 3])]))
    assert np.isfinite(mod.get_outputs()[0].asnumpy()).all()


def dropblock_net():
    """Conv - GluonCV DropBlock (Python branch on autograd.is_training()) - Dense."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), DropBlock(0.3, 3, 8, 8, 8), nn.Flatten(), nn.Dense(4))
    net.initialize()
    return net


def drops(block, x, inference_first=False):
    """(two training-mode forwards differ, two inference-mode forwards are equal)."""
    if inference_first:
        same = np.array_equal(block(x).asnumpy(), block(x).asnumpy())
    with autograd.record():
        first, second = block(x), block(x)
    if not inference_first:
        same = np.array_equal(block(x).asnumpy(), block(x).asnumpy())
    return not np.array_equal(first.asnumpy(), second.asnumpy()), same


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("hybridize", [False, True])
@pytest.mark.parametrize("inference_first", [False, True])
def test_dropblock_drops_in_training_mode_only(dtype, hybridize, inference_first):
    x = mx.nd.random.uniform(shape=(2, 3, 8, 8))
    reference = dropblock_net()  # float32, imperative: what the Python code says
    assert drops(reference, x, inference_first) == (True, True)
    net = mxfp16.cast_block(dropblock_net(), dtype)
    if hybridize:
        net.hybridize(static_alloc=True, static_shape=True)
    assert net.training_block is not None
    assert drops(net, x, inference_first) == (True, True)


@pytest.mark.parametrize("first_mode", ["training", "inference"])
def test_mxnet_hybridize_keeps_the_first_calls_branch_where_cast_blocks_keep_both(first_mode):
    """MXNet 1.9.1's float32 hybridized block traces once, in the mode of its first call."""
    x = mx.nd.random.uniform(shape=(2, 3, 8, 8))
    net = dropblock_net()
    net.hybridize()
    if first_mode == "training":
        assert drops(net, x) == (True, False)  # still drops in inference
    else:
        assert drops(net, x, inference_first=True) == (False, True)  # never drops in training


def test_dropout_of_a_symbol_graph_drops_in_training_mode_only():
    data = mx.sym.var("data")
    sym = mx.sym.FullyConnected(mx.sym.Dropout(data, p=0.5), num_hidden=4, name="fc")
    block = gluon.SymbolBlock(sym, [data])
    block.initialize()
    net = mxfp16.cast_block(block, "float16")
    assert net.training_block is None  # one graph: Dropout reads the mode when it runs
    assert drops(net, mx.nd.ones((4, 16))) == (True, True)


def test_training_graph_of_a_random_op_casts_for_the_gpu():
    """DropBlock's mask is float32 random data: the GPU graph casts it before float16 ops."""
    net = mxfp16.cast_block(dropblock_net(), "float16", emulate=False)
    training = net.graphs[1]
    _, out_types, _ = training.get_internals().infer_type(data="float32")
    assert np.dtype(out_types[-1]).name == "float32"


def test_hybridize_settings_are_carried_over_and_imperative_blocks_stay_so():
    net = norm_net()
    assert mxfp16.mxnet_internals.hybridize_flags(mxfp16.cast_block(net, "float16")) is None
    net.hybridize(static_alloc=True, static_shape=True)
    flags = mxfp16.mxnet_internals.hybridize_flags(mxfp16.cast_block(net, "float16"))
    assert flags["static_alloc"] is True and flags["static_shape"] is True


def test_cast_before_initialize_then_initialize_the_cast_network():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3), nn.BatchNorm(), nn.Dense(3))
    net16 = mxfp16.cast_block(net, "float16")
    net16.initialize(mx.init.MSRAPrelu(), ctx=[mx.cpu(0), mx.cpu(1)])
    out = net16(mx.nd.ones((2, 3, 8, 8), ctx=mx.cpu(1)))
    assert out.dtype == np.float32 and dtype_name(net[0].weight) == "float16"
    assert net[0].weight.data(mx.cpu(1)).dtype == np.float16


def cifar_net():
    from gluoncv.model_zoo import get_model
    return get_model("cifar_resnet20_v1", classes=10, pretrained=False)


def test_float16_checkpoint_loads_into_the_float32_network_with_no_option(tmp_path):
    net16 = mxfp16.cast_block(cifar_net(), "float16")
    net16.initialize(mx.init.Xavier())
    x = mx.nd.random.uniform(shape=(2, 3, 16, 16))
    out16 = net16(x).asnumpy()
    net16.save_parameters(str(tmp_path / "net.params"))
    assert {v.dtype for v in mx.nd.load(str(tmp_path / "net.params")).values()} == {np.float32}
    plain = cifar_net()
    plain.load_parameters(str(tmp_path / "net.params"))
    assert relative_error(plain(x).asnumpy(), out16) < 1e-2
    again = mxfp16.cast_block(cifar_net(), "float16")
    again.load_parameters(str(tmp_path / "net.params"))
    assert np.array_equal(again(x).asnumpy(), out16)


def test_saved_float32_values_are_the_optimizers_master_weights(tmp_path):
    net = nn.Dense(4, in_units=8)
    net.initialize(mx.init.Constant(0.5))
    net16 = mxfp16.cast_block(net, "float16")
    trainer = mxfp16.Trainer(net16.collect_params(), "sgd", {"learning_rate": 1e-5},
                             dtype="float16", loss_scale=1)
    for _ in range(3):  # 3e-5 in all: less than half a float16 step (2**-13) below 0.5
        with autograd.record():
            loss = net16(mx.nd.ones((1, 8))).sum()
        trainer.backward(loss)
        trainer.step(1)
    master = mxfp16.optimizers.master_copies(net.weight)[0].asnumpy()
    assert np.all(net.weight.data().asnumpy() == 0.5) and np.all(master < 0.5)
    net16.save_parameters(str(tmp_path / "net.params"))
    assert np.array_equal(mx.nd.load(str(tmp_path / "net.params"))["weight"].asnumpy(), master)
    net16.save_parameters(str(tmp_path / "half.params"), dtype="float16")
    half = mx.nd.load(str(tmp_path / "half.params"))
    assert half["weight"].dtype == np.float16 and np.all(half["weight"].asnumpy() == 0.5)
    plain = nn.Dense(4, in_units=8)
    plain.load_parameters(str(tmp_path / "half.params"), cast_dtype=True)
    assert plain.weight.data().dtype == np.float32


def test_load_parameters_reads_float16_files_and_parameter_names(tmp_path):
    net = norm_net()
    net.hybridize()
    x = mx.nd.random.uniform(shape=(2, 3, 8, 8))
    ref = net(x).asnumpy()
    net.export(str(tmp_path / "net"))  # 'arg:conv0_weight', ...: the parameters' own names
    saved = mx.nd.load(str(tmp_path / "net-0000.params"))
    half = {k: v.astype("float16") for k, v in saved.items()}
    mx.nd.save(str(tmp_path / "half.params"), half)
    net16 = mxfp16.cast_block(net, "float16")
    net16.load_parameters(str(tmp_path / "half.params"))
    assert relative_error(net16(x).asnumpy(), ref) < 1e-2
    mx.nd.save(str(tmp_path / "part.params"), dict(list(half.items())[:2]))
    with pytest.raises(ValueError, match="has no value for parameter.*allow_missing=True"):
        net16.load_parameters(str(tmp_path / "part.params"))
    other = mxfp16.cast_block(norm_net(), "float16")  # other instance: other parameter names
    with pytest.raises(ValueError, match="holds .*arg:.*which this network does not have"):
        other.load_parameters(str(tmp_path / "half.params"), allow_missing=True)


def test_overflowing_outputs_warn_once_in_inference_and_never_in_training():
    net = nn.Dense(2, in_units=4)
    net.initialize(mx.init.Constant(20000.0))  # 4 x 20000 > 65504: inf in float16
    net16 = mxfp16.cast_block(net, "float16")
    x = mx.nd.ones((1, 4))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with autograd.record():
            net16(x)
        assert not caught
        net16(x)
        net16(x)
    assert [str(w.message).count("65504") for w in caught] == [1]
    assert caught[0].category is RuntimeWarning


def test_deferred_parameters_start_from_float32s_values_rounded():
    values = {}
    for dtype in ("float32", "float16"):
        net = nn.Dense(64)  # its weight's shape waits for the first input
        mx.random.seed(3)
        net.initialize(mx.init.Xavier())
        cast = mxfp16.cast_block(net, dtype)
        cast(mx.nd.ones((2, 32)))
        values[dtype] = net.weight.data()
    assert values["float16"].dtype == np.float16
    np.testing.assert_array_equal(values["float16"].asnumpy(),
                                  values["float32"].asnumpy().astype(np.float16))


def test_bfloat16_cast_after_an_inference_forward_trains():
    """An inference-mode forward leaves oneDNN's depthwise-convolution weights in its blocked
    layout; the bfloat16 graph's cast of them failed ('could not create a primitive descriptor
    for a reorder primitive': GluonCV's MobileNet SSD evaluated, then cast)."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1, in_channels=3), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(16, 3, padding=1, groups=16, in_channels=16), nn.GlobalAvgPool2D(),
            nn.Dense(2))
    net.initialize()
    x = mx.nd.random.uniform(shape=(1, 3, 16, 16))
    expected = net(x).asnumpy()
    cast = mxfp16.cast_block(net, "bfloat16")
    with autograd.record():
        loss = cast(x).sum()
    loss.backward()
    assert np.isfinite(net[0].weight.grad().asnumpy()).all()
    assert np.allclose(cast(x).asnumpy(), expected, rtol=0.05, atol=0.05)
