"""mxfp16.amp's conversions against what MXNet 1.9's own AMP tests assert
(tests/python/mkl/test_contrib_amp.py, bfloat16 on a CPU, and tests/python/gpu/test_contrib_amp.py,
float16), as this project's tests: the op lists, converted graphs against hand-built ones, the
errors, cast_optional_params and data_names, the dtypes of bound arguments, accuracy after
convert_model, the Module case, bucketing, RNNs and convert_hybrid_block.  Where MXNet's test
binds float16 on a GPU, these check the graph and its dtypes on the CPU (infer_type) and run its
CPU emulation; the real-model parts use a small ResNet-like graph built here (nothing downloads)."""
import json
from collections import Counter

import mxnet as mx
import numpy as np
import pytest

from mxfp16.amp import amp
from mxfp16.amp.lists import AmpArgumentError, AmpTypeError, BFLOAT16

DTYPES = ("float16", "bfloat16")
LOW = {"float16": np.float16, "bfloat16": BFLOAT16}


def _lists(dtype):
    module = amp.lists.symbol_fp16 if dtype == "float16" else amp.lists.symbol_bf16
    lp16 = module.FP16_FUNCS if dtype == "float16" else module.BF16_FUNCS
    lp16_fp32 = module.FP16_FP32_FUNCS if dtype == "float16" else module.BF16_FP32_FUNCS
    conditional = [entry[0] for entry in module.CONDITIONAL_FP32_FUNCS]
    return [lp16, lp16_fp32, module.FP32_FUNCS, module.WIDEST_TYPE_CASTS, conditional]


def _registered():
    return {name for name in mx.operator.get_all_registered_operators()
            if not name.startswith(("_backward", "_contrib_backward_"))}


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_registered_op_is_in_exactly_one_list(dtype):
    lists = _lists(dtype)
    for entries in lists:
        assert [op for op, n in Counter(entries).items() if n > 1] == []
    counts = Counter(op for entries in lists for op in entries)
    assert [op for op, n in counts.items() if n > 1] == []
    assert _registered() - set(counts) == set()


@pytest.mark.parametrize("dtype", DTYPES)
def test_lists_are_mxnets_with_mxfp16s_rows_each_with_a_reason(dtype):
    from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16
    ours = amp.lists.symbol_fp16 if dtype == "float16" else amp.lists.symbol_bf16
    theirs = symbol_fp16 if dtype == "float16" else symbol_bf16
    moved = {op: row for row in ours.MXFP16_ROWS for op in row.ops}
    assert all(row.reason for row in ours.MXFP16_ROWS)
    for name in ours.LIST_NAMES:
        for entry in getattr(theirs, name):  # every MXNet entry stays, unless a row moved it
            op = entry[0] if name == "CONDITIONAL_FP32_FUNCS" else entry
            assert entry in getattr(ours, name) or moved[op].into != name
        for entry in getattr(ours, name):  # every other entry comes from a row into this list
            if entry not in getattr(theirs, name):
                assert moved[entry].into == name
    assert ours.LOSS_OUTPUT_FUNCTIONS == theirs.LOSS_OUTPUT_FUNCTIONS


def test_lists_extended_before_a_conversion_change_it():
    """As with MXNet: code that moves an op to FP32_FUNCS before converting gets it in float32."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    net = mx.sym.relu(fc, name="act")
    net = mx.sym.FullyConnected(net, num_hidden=2, name="fc2")
    before = amp.convert_symbol(net, data_names=["data"])
    assert _internal_dtype(before, "act_output", data="float32") == np.float16
    lists = amp.lists.symbol_fp16
    lists.FP16_FP32_FUNCS.remove("relu")
    lists.FP32_FUNCS.append("relu")
    try:
        after = amp.convert_symbol(net, data_names=["data"])
        assert _internal_dtype(after, "act_output", data="float32") == np.float32
        assert _internal_dtype(after, "fc_output", data="float32") == np.float16
    finally:
        lists.FP32_FUNCS.remove("relu")
        lists.FP16_FP32_FUNCS.append("relu")
    assert not amp.lists.lists_extended("float16")


def test_list_functions_return_the_lists_themselves():
    assert amp.list_fp32_ops("float16") is amp.lists.symbol_fp16.FP32_FUNCS
    assert amp.list_lp16_ops(BFLOAT16) is amp.lists.symbol_bf16.BF16_FUNCS
    assert "batch_dot" in amp.list_lp16_ops("float16")  # mxfp16's GEMM row
    assert "batch_dot" in amp.list_fp32_ops("bfloat16")  # no bfloat16 CPU kernel
    assert amp.list_lp16_use_fp32_params("bfloat16")["BatchNorm"][1] == "gamma"


def same_structure(first, second):
    """Whether two graphs compute the same: ops, attributes, casts included (MXNet's
    same_symbol_structure reads tojson(), which leaves amp_cast nodes out), wiring and input names."""
    def signature(sym):
        graph = json.loads(sym.tojson(remove_amp_cast=False))
        nodes = graph["nodes"]

        def node_signature(entry):
            node = nodes[entry[0]]
            if node["op"] == "null":
                return ("var", node["name"])
            attrs = tuple(sorted((k, v) for k, v in node.get("attrs", {}).items()
                                 if not k.startswith("__")))
            return (node["op"], attrs, entry[1], tuple(node_signature(e) for e in node["inputs"]))
        return [node_signature(head) for head in graph["heads"]]
    return signature(first) == signature(second)


def _fc_plus_sin():
    x, y = mx.sym.var("x"), mx.sym.var("y")
    return mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True) + mx.sym.sin(y), x, y


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_symbol_gives_the_hand_built_graph(dtype):
    res, x, y = _fc_plus_sin()
    converted = amp.convert_symbol(res, target_dtype=dtype, target_dtype_ops=["FullyConnected"],
                                   fp32_ops=["sin"])
    low = "float16" if dtype == "float16" else BFLOAT16
    fc = mx.sym.FullyConnected(mx.sym.amp_cast(x, dtype=low), mx.sym.amp_cast(y, dtype=low),
                               num_hidden=10, no_bias=True)
    expected = mx.sym.amp_cast(fc, dtype="float32") + mx.sym.sin(y)
    assert same_structure(converted, expected)
    assert not same_structure(converted, res)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lists", [
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["elemwise_add"]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype_ops=["Activation"], fp32_ops=["Activation"],
         conditional_fp32_ops=[("Activation", "act_type", ["selu"])]),
    dict(target_dtype_ops=["FullyConnected"], fp32_ops=["FullyConnected"]),
    dict(fp32_ops=["NoSuchOp"]),
    dict(fp32_ops="sin"),
    dict(conditional_fp32_ops=[("Activation", "act_type", "selu")]),
    dict(fp32_ops=["Convolution"]),  # Convolution stays in the default lp16 list
])
def test_invalid_op_lists_raise_assertion_and_value_errors(dtype, lists):
    res, _, _ = _fc_plus_sin()
    with pytest.raises(AssertionError) as assertion:
        amp.convert_symbol(res, target_dtype=dtype, **lists)
    with pytest.raises(ValueError) as value:
        amp.convert_symbol(res, target_dtype=dtype, **lists)
    assert str(assertion.value) == str(value.value)
    assert "_ops" in str(value.value) and "\n" not in str(value.value)


def test_other_invalid_arguments_raise_both_kinds():
    res, _, _ = _fc_plus_sin()
    with pytest.raises(AmpArgumentError, match="target_dtype='float64'"):
        amp.convert_symbol(res, target_dtype="float64")
    with pytest.raises(AmpArgumentError, match="excluded_sym_names"):
        amp.convert_symbol(res, excluded_sym_names="sin0")
    with pytest.raises(AmpTypeError):
        amp.convert_model(res, [], {})
    with pytest.raises(AmpTypeError):
        amp.convert_symbol(mx.nd.ones(1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_conditional_fp32_ops_satisfied_and_not(dtype):
    x, y = mx.sym.var("x"), mx.sym.var("y")
    fc = mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True)
    unmet = amp.convert_symbol(fc, target_dtype=dtype, target_dtype_ops=[], fp32_ops=["sin"],
                               conditional_fp32_ops=[("FullyConnected", "no_bias", ["False"])])
    # FullyConnected reads x and y as they are (MXNet's pass adds a float32 amp_cast, a no-op,
    # after it, which MXNet's same_symbol_structure does not see)
    plain = mx.sym.FullyConnected(x, y, num_hidden=10, no_bias=True)
    assert same_structure(unmet, mx.sym.amp_cast(plain, dtype="float32"))
    met = amp.convert_symbol(fc, target_dtype=dtype, target_dtype_ops=[], fp32_ops=["sin"],
                             conditional_fp32_ops=[("FullyConnected", "no_bias", ["True"])])
    expected = mx.sym.FullyConnected(mx.sym.amp_cast(x, dtype="float32"),
                                     mx.sym.amp_cast(y, dtype="float32"), num_hidden=10,
                                     no_bias=True)
    assert same_structure(met, expected)


def _bound_dtypes(sym, **shapes):
    return [array.dtype for array in
            sym.simple_bind(mx.cpu(), grad_req="null", **shapes).arg_arrays]


@pytest.mark.parametrize("dtype", DTYPES)
def test_inputs_read_by_casts_take_their_dtype_with_cast_optional_params(dtype):
    low = LOW[dtype]
    data = mx.sym.var("data")
    to_low, to_fp32 = mx.sym.amp_cast(data, dtype=low), mx.sym.amp_cast(data, dtype="float32")
    mixed = amp.convert_symbol(mx.sym.Group([to_low, to_fp32]), target_dtype=dtype, data_names=[],
                               cast_optional_params=True)
    assert _bound_dtypes(mixed, data=(1, 2)) == [np.float32]
    both = amp.convert_symbol(mx.sym.Group([to_low, mx.sym.amp_cast(data, dtype=low)]),
                              target_dtype=dtype, data_names=[], cast_optional_params=True)
    assert _bound_dtypes(both, data=(1, 2)) == [low]


@pytest.mark.parametrize("dtype", DTYPES)
def test_amp_multicast_inputs_as_mxnet_types_them(dtype):
    low = LOW[dtype]
    lists = dict(target_dtype_ops=[], fp32_ops=[], cast_optional_params=True, target_dtype=dtype)
    out = mx.sym.amp_multicast(mx.sym.var("data", dtype="float32"), mx.sym.var("data2", dtype=low),
                               num_outputs=2)
    converted = amp.convert_symbol(out, target_dtype=dtype, cast_optional_params=True)
    assert _bound_dtypes(converted, data=(1, 2), data2=(1, 2))[0] == low
    out = mx.sym.amp_multicast(mx.sym.var("data", dtype="float32"),
                               mx.sym.elemwise_add(mx.sym.var("data2", dtype=low),
                                                   mx.sym.var("data3", dtype=low)),
                               num_outputs=2)
    shapes = dict(data=(1, 2), data2=(1, 2), data3=(1, 2))
    assert _bound_dtypes(amp.convert_symbol(out, **lists), **shapes)[0] == np.float32
    out = mx.sym.amp_multicast(mx.sym.var("data", dtype=low), mx.sym.var("data2", dtype="float32"),
                               mx.sym.var("data3"), num_outputs=3)
    assert _bound_dtypes(amp.convert_symbol(out, **lists), **shapes)[2] == np.float32
    for first in (low, "float32"):  # an input a cast to low precision also reads ends up so
        data = mx.sym.var("data", dtype=first)
        second = mx.sym.var("data2", dtype="float32" if first is low else low)
        out = mx.sym.Group([mx.sym.amp_multicast(data, second, num_outputs=2),
                            mx.sym.amp_cast(data, dtype=low)])
        assert _bound_dtypes(amp.convert_symbol(out, **lists), data=(1, 2), data2=(1, 2))[0] == low


def test_split_of_a_concat_of_untyped_inputs_converts():
    data, data2 = mx.sym.var("data"), mx.sym.var("data2")
    data._set_attr(__dtype__="-1")
    data2._set_attr(__dtype__="-1")
    out = mx.sym.split(mx.sym.concat(data, data2), axis=1, num_outputs=2)
    converted = amp.convert_symbol(out)
    assert len(converted.list_outputs()) == 2


def _resnet_like():
    """A small graph with the names MXNet's tests read (stage2_unit1_conv2, fc1, softmax)."""
    net = mx.sym.var("data")
    for name, filters in (("stage1_unit1_conv1", 8), ("stage2_unit1_conv2", 16)):
        net = mx.sym.Convolution(net, num_filter=filters, kernel=(3, 3), pad=(1, 1), name=name)
        net = mx.sym.BatchNorm(net, fix_gamma=False, name=name.replace("conv", "bn"))
        net = mx.sym.Activation(net, act_type="relu")
    net = mx.sym.Pooling(net, kernel=(1, 1), global_pool=True, pool_type="avg")
    net = mx.sym.FullyConnected(mx.sym.flatten(net), num_hidden=10, name="fc1")
    return mx.sym.SoftmaxOutput(net, name="softmax")


SHAPE = (2, 3, 8, 8)


@pytest.fixture(scope="module")
def resnet_like():
    sym = _resnet_like()
    mod = mx.mod.Module(sym, context=mx.cpu())
    mod.bind([("data", SHAPE)], [("softmax_label", (SHAPE[0],))], for_training=False)
    mx.random.seed(0)
    mod.init_params(mx.init.Xavier(magnitude=2))
    args, aux = mod.get_params()
    batch = mx.io.DataBatch([mx.nd.random.uniform(shape=SHAPE)], [mx.nd.zeros(SHAPE[0])])
    mod.forward(batch, is_train=False)
    return sym, args, aux, batch, mod.get_outputs()[0].asnumpy()


def _arg_dtypes(sym, **input_dtypes):
    arg_types, _, aux_types = sym.infer_type(**input_dtypes)
    names = sym.list_arguments() + sym.list_auxiliary_states()
    return {name: np.dtype(t) for name, t in zip(names, arg_types + aux_types)}


def _run(sym, args, aux, batch):
    mod = mx.mod.Module(sym, data_names=["data"], label_names=["softmax_label"],
                        context=mx.cpu())
    mod.bind([("data", SHAPE)], [("softmax_label", (SHAPE[0],))], for_training=False)
    mod.set_params(args, aux)
    mod.forward(batch, is_train=False)
    return mx.nd.amp_cast(mod.get_outputs()[0], dtype="float32").asnumpy(), mod


def _forward(exe, data, values):
    """Forward ``data`` through an executor holding ``values`` (parameters, in any dtype)."""
    for name, value in values.items():
        target = exe.arg_dict.get(name, exe.aux_dict.get(name))
        if target is not None:
            mx.nd.amp_cast(value, dtype=target.dtype).copyto(target)
    exe.forward(is_train=False, data=data)
    return mx.nd.amp_cast(exe.outputs[0], dtype="float32").asnumpy()


def _internal_dtype(sym, name, **input_dtypes):
    internals = sym.get_internals()
    types = dict(zip(internals.list_outputs(), internals.infer_type(**input_dtypes)[1]))
    return np.dtype(types[name])


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_symbol_of_a_real_model_by_default(dtype, resnet_like):
    sym, args, aux, batch, expected = resnet_like
    converted = amp.convert_symbol(sym, target_dtype=dtype)
    types = _arg_dtypes(converted, data="float32")
    # data_names None: every input is data, float32, cast where its ops want another dtype
    assert {types[name] for name in converted.list_arguments()} == {np.dtype(np.float32)}
    assert _internal_dtype(converted, "stage2_unit1_conv2_output", data="float32") == LOW[dtype]
    if dtype == "bfloat16":
        exe = converted.simple_bind(mx.cpu(), data=SHAPE, softmax_label=(2,), grad_req="null")
        output = _forward(exe, batch.data[0], dict(args, **aux))
        np.testing.assert_allclose(output, expected, rtol=0.1, atol=0.05)


def test_float16_graphs_bind_on_a_cpu_and_refuse_the_forward_in_one_line(resnet_like):
    sym, args, aux, batch, expected = resnet_like
    converted = amp.convert_symbol(sym)
    exe = converted.simple_bind(mx.cpu(), data=SHAPE, softmax_label=(2,), grad_req="null")
    with pytest.raises(mx.base.MXNetError) as error:
        exe.forward(is_train=False, data=batch.data[0])
    message = str(error.value)
    assert "\n" not in message and "emulate=True" in message and "gemm" not in message
    assert "Convolution" in message and "FullyConnected" in message
    result, _, _ = amp.convert_model(sym, args, aux, target_dtype_ops=["Convolution"])
    with pytest.raises(mx.base.MXNetError, match="emulate=True"):
        _run(result, args, aux, batch)
    emulated = amp.convert_symbol(sym, emulate=True)
    exe = emulated.simple_bind(mx.cpu(), data=SHAPE, softmax_label=(2,), grad_req="null")
    output = _forward(exe, batch.data[0], dict(args, **aux))
    np.testing.assert_allclose(output, expected, rtol=1e-2, atol=2e-3)


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_symbol_with_data_names_and_cast_optional_params(dtype, resnet_like):
    sym, args, aux, batch, _ = resnet_like
    low = LOW[dtype]
    options = dict(target_dtype=dtype, target_dtype_ops=["Convolution"], data_names=["data"])
    optional = amp.convert_symbol(sym, cast_optional_params=True, **options)
    required = amp.convert_symbol(sym, cast_optional_params=False, **options)
    optional_types, required_types = _arg_dtypes(optional, data="float32"), _arg_dtypes(
        required, data="float32")
    assert optional_types["stage2_unit1_conv2_weight"] == low
    assert required_types["stage2_unit1_conv2_weight"] == np.float32
    for types in (optional_types, required_types):
        assert types["data"] == np.float32
        if dtype == "float16":  # an unlisted op (the FullyConnected) follows the float16 values
            assert types["fc1_weight"] == low
    if dtype == "bfloat16":  # binds and runs with the parameters in those dtypes, as MXNet's
        for converted in (optional, required):
            exe = converted.simple_bind(mx.cpu(), data=SHAPE, softmax_label=(2,),
                                        grad_req="null")
            assert np.isfinite(_forward(exe, batch.data[0], dict(args, **aux))).all()


def test_cast_optional_params_also_without_op_lists(resnet_like):
    sym, args, aux, _, _ = resnet_like
    for dtype in DTYPES:
        _, optional, _ = amp.convert_model(sym, args, aux, target_dtype=dtype,
                                           cast_optional_params=True)
        _, required, _ = amp.convert_model(sym, args, aux, target_dtype=dtype)
        assert optional["stage2_unit1_conv2_weight"].dtype == LOW[dtype]
        assert required["stage2_unit1_conv2_weight"].dtype == np.float32
        assert optional["stage2_unit1_bn2_gamma"].dtype == np.float32  # normalization stays


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_model_stores_parameters_in_the_graphs_dtypes(dtype, resnet_like):
    sym, args, aux, batch, expected = resnet_like
    low = LOW[dtype]
    for optional, conv_dtype in ((False, np.float32), (True, low)):
        result_sym, result_args, result_aux = amp.convert_model(
            sym, args, aux, target_dtype=dtype, target_dtype_ops=["Convolution"],
            cast_optional_params=optional, emulate=dtype == "float16")
        if dtype == "bfloat16":
            output, mod = _run(result_sym, result_args, result_aux, batch)
            assert mod._arg_params["stage2_unit1_conv2_weight"].dtype == conv_dtype
            np.testing.assert_allclose(output, expected, rtol=0.1, atol=0.05)
        else:  # the float16 graph's parameters; its CPU emulation runs
            _, real_args, _ = amp.convert_model(sym, args, aux, target_dtype_ops=["Convolution"],
                                                cast_optional_params=optional)
            assert real_args["stage2_unit1_conv2_weight"].dtype == conv_dtype
            output, _ = _run(result_sym, result_args, result_aux, batch)
            np.testing.assert_allclose(output, expected, rtol=1e-2, atol=2e-3)
    assert args["stage2_unit1_conv2_weight"].dtype == np.float32  # the checkpoint is untouched


def _gluon_net():
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2D(16, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.GlobalAvgPool2D(), nn.Dense(4))
    net.initialize(mx.init.Xavier(), ctx=mx.cpu())
    net.hybridize()
    return net


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_hybrid_block_on_a_cpu(dtype):
    net = _gluon_net()
    x = mx.nd.random.uniform(shape=SHAPE)
    expected = net(x).asnumpy()
    tolerance = dict(rtol=1e-2, atol=2e-3) if dtype == "float16" else dict(rtol=0.1, atol=0.05)
    for lists in ({}, {"target_dtype_ops": ["Convolution"]}):
        converted = amp.convert_hybrid_block(net, target_dtype=dtype, ctx=mx.cpu(), **lists)
        for _ in range(2):
            output = mx.nd.amp_cast(converted(x), dtype="float32").asnumpy()
            np.testing.assert_allclose(output, expected, **tolerance)
    assert net[0].weight.data().dtype == np.float32


@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_hybrid_block_of_a_symbol_block_with_a_label_input(dtype, resnet_like, tmp_path):
    sym, args, aux, batch, expected = resnet_like
    mx.model.save_checkpoint(str(tmp_path / "net"), 0, sym, args, aux)
    net = mx.gluon.SymbolBlock.imports(str(tmp_path / "net-symbol.json"), ["data", "softmax_label"],
                                       str(tmp_path / "net-0000.params"))
    net.hybridize()
    net(batch.data[0], batch.label[0])
    low = LOW[dtype]
    kinds = {False: np.float32, True: low}
    for optional, conv_dtype in kinds.items():
        converted = amp.convert_hybrid_block(net, target_dtype=dtype,
                                             target_dtype_ops=["Convolution"], ctx=mx.cpu(),
                                             cast_optional_params=optional)
        for _ in range(2):
            output = converted(batch.data[0], batch.label[0])
            np.testing.assert_allclose(output.asnumpy(), expected, rtol=0.1, atol=0.05)
        if dtype == "bfloat16":  # a float16 one is emulated on the CPU: float32 parameters
            weight = converted.collect_params()["stage2_unit1_conv2_weight"]
            assert weight.dtype == conv_dtype
            assert weight.data().dtype == conv_dtype
        else:  # the real float16 graph's parameter, as a GPU ctx would hold it
            real = amp.convert_symbol(sym, target_dtype_ops=["Convolution"],
                                      data_names=["data", "softmax_label"],
                                      cast_optional_params=optional)
            assert _arg_dtypes(real, data="float32", softmax_label="float32")[
                "stage2_unit1_conv2_weight"] == conv_dtype
    with pytest.raises(mx.base.MXNetError, match="emulate=True"):
        amp.convert_hybrid_block(net, ctx=mx.cpu(), emulate=False)


def _conv_accuracy(dtype, data_shape, kernel, num_filter, pad, no_bias, cast_optional_params):
    conv = mx.sym.Convolution(mx.sym.var("data"), kernel=kernel, num_filter=num_filter, pad=pad,
                              no_bias=no_bias, name="conv2d")
    return _accuracy(conv, dtype, data_shape, ["Convolution"], cast_optional_params)


def _accuracy(sym, dtype, data_shape, ops, cast_optional_params):
    mod = mx.mod.Module(sym, label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[("data", data_shape)], for_training=False)
    mod.init_params()
    data = mx.nd.random.uniform(low=0, high=100, shape=data_shape)
    mod.forward(mx.io.DataBatch([data]), is_train=False)
    expected = mod.get_outputs()[0].asnumpy()
    args, aux = mod.get_params()
    low_sym, low_args, low_aux = amp.convert_model(
        sym, args, aux, target_dtype=dtype, target_dtype_ops=ops,
        cast_optional_params=cast_optional_params, emulate=dtype == "float16")
    low_mod = mx.mod.Module(low_sym, label_names=None, context=mx.cpu())
    low_mod.bind(data_shapes=[("data", data_shape)], for_training=False)
    low_mod.set_params(low_args, low_aux)
    low_mod.forward(mx.io.DataBatch([data]), is_train=False)
    output = mx.nd.amp_cast(low_mod.get_outputs()[0], dtype="float32").asnumpy()
    # MXNet's tolerance: |out - ref| <= 0.2 + 0.1 |ref|, on values of size ~100
    np.testing.assert_allclose(output, expected, rtol=1e-1, atol=2e-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, kernel, filters, pad, no_bias, optional", [
    ((3, 4, 28, 28), (3, 3), 128, (1, 1), True, False),
    ((32, 10, 28, 28), (1, 1), 16, (0, 0), True, True),
    ((8, 56, 14, 14), (3, 3), 28, (1, 1), False, False),
])
def test_convolution_accuracy_after_convert_model(dtype, shape, kernel, filters, pad, no_bias,
                                                  optional):
    mx.random.seed(1)
    _conv_accuracy(dtype, shape, kernel, filters, pad, no_bias, optional)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, hidden, optional", [((64, 32), 1000, False),
                                                     ((40, 32), 10, True)])
def test_fully_connected_accuracy_after_convert_model(dtype, shape, hidden, optional):
    mx.random.seed(2)
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=hidden, name="fc")
    _accuracy(fc, dtype, shape, ["FullyConnected"], optional)


@pytest.mark.parametrize("dtype", DTYPES)
def test_module_keeps_the_dtypes_convert_model_gives(dtype):
    """MXNet's module backward-compatibility case: Module must not overwrite the inferred dtypes."""
    conv = mx.sym.Convolution(mx.sym.var("data"), num_filter=10, kernel=(2, 3), stride=(1, 1))
    bn = mx.sym.BatchNorm(conv, eps=0.001, momentum=0.9, fix_gamma=False,
                          use_global_stats=False, output_mean_var=False, name="conv0_batchnorm")
    fc = mx.sym.FullyConnected(bn, num_hidden=10, name="fullyconnected")
    mod = mx.mod.Module(fc, data_names=["data"], label_names=None, context=mx.cpu())
    mod.bind(data_shapes=[["data", (1, 3, 16, 16)]])
    mod.init_params()
    args, aux = mod.get_params()
    assert {np.dtype(v.dtype) for v in list(args.values()) + list(aux.values())} == {
        np.dtype(np.float32)}
    sym, args, aux = amp.convert_model(fc, args, aux, target_dtype=dtype,
                                       target_dtype_ops=["Convolution"])
    assert args["fullyconnected_weight"].dtype == LOW[dtype]
    converted = mx.mod.Module(sym, data_names=["data"], label_names=None, context=mx.cpu())
    converted.bind(data_shapes=[["data", (1, 3, 16, 16)]])  # the real float16 graph, as MXNet's
    converted.set_params(args, aux)
    assert converted.get_params()[0]["fullyconnected_weight"].dtype == LOW[dtype]
    if dtype == "float16":  # its forward on a CPU says why it cannot run, in one line
        with pytest.raises(mx.base.MXNetError, match=r"^mxfp16: this graph runs Convolution, "
                           r"FullyConnected in float16, .*emulate=True[^\n]*$"):
            converted.forward(mx.io.DataBatch([mx.nd.ones((1, 3, 16, 16))]), is_train=False)


BUCKETS = [5, 10, 20]
VOCAB, HIDDEN, BATCH = 30, 16, 8


def _sentences(count, seed):
    rng = np.random.RandomState(seed)
    return [list(rng.randint(1, VOCAB, size=rng.randint(3, max(BUCKETS)))) for _ in range(count)]


def _language_model():
    """An LSTM language model in a BucketingModule, trained a little on the CPU; its last batch
    comes from a bucket other than the default one."""
    cell = mx.rnn.LSTMCell(num_hidden=HIDDEN, prefix="lstm_")

    def sym_gen(seq_len):
        embed = mx.sym.Embedding(mx.sym.var("data"), input_dim=VOCAB, output_dim=HIDDEN,
                                 name="embed")
        cell.reset()
        outputs, _ = cell.unroll(seq_len, inputs=embed, merge_outputs=True)
        pred = mx.sym.FullyConnected(mx.sym.Reshape(outputs, shape=(-1, HIDDEN)),
                                     num_hidden=VOCAB, name="pred")
        label = mx.sym.Reshape(mx.sym.var("softmax_label"), shape=(-1,))
        return (mx.sym.SoftmaxOutput(pred, label, ignore_label=-1, use_ignore=True,
                                     name="softmax"), ("data",), ("softmax_label",))

    train = mx.rnn.BucketSentenceIter(_sentences(200, 0), BATCH, buckets=BUCKETS,
                                      invalid_label=-1)
    model = mx.mod.BucketingModule(sym_gen, default_bucket_key=train.default_bucket_key,
                                   context=mx.cpu())
    mx.random.seed(3)
    model.fit(train, num_epoch=1, optimizer="sgd", optimizer_params={"learning_rate": 0.1},
              initializer=mx.init.Xavier())
    small = next(batch for batch in train if batch.bucket_key != train.default_bucket_key)
    model.forward(small, is_train=False)  # the current bucket is not the default one
    return model


def _val_iter():
    return mx.rnn.BucketSentenceIter(_sentences(64, 1), BATCH, buckets=BUCKETS, invalid_label=-1)


@pytest.fixture(scope="module")
def language_model():
    model = _language_model()
    return model, model.score(_val_iter(), mx.metric.Perplexity(-1))[0][1]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", DTYPES)
def test_convert_bucketing_module_predicts_and_trains_in_every_bucket(dtype, language_model):
    model, perplexity = language_model
    converted = amp.convert_bucketing_module(model, target_dtype=dtype)
    val = _val_iter()
    converted.bind(val.provide_data, val.provide_label, for_training=False)
    converted_perplexity = converted.score(val, mx.metric.Perplexity(-1))[0][1]
    assert abs(converted_perplexity - perplexity) < 0.05 * perplexity
    args, _ = converted.get_params()
    assert args["pred_weight"].dtype == np.float32  # behind a cast: cast_optional_params=False
    converted.bind(val.provide_data, val.provide_label, for_training=True)  # rebinds to train
    converted.init_optimizer(optimizer="sgd", optimizer_params={"learning_rate": 0.1})
    seen = set()
    val.reset()
    before = converted.get_params()[0]["pred_weight"].astype("float32").asnumpy()
    for batch in val:
        converted.forward_backward(batch)
        converted.update()
        seen.add(batch.bucket_key)
    after = converted.get_params()[0]["pred_weight"].astype("float32").asnumpy()
    assert seen == set(BUCKETS)
    assert np.isfinite(after).all() and not np.array_equal(after, before)


def test_convert_bucketing_module_real_float16_graph_refuses_a_cpu_forward(language_model):
    model, _ = language_model
    converted = amp.convert_bucketing_module(model, emulate=False)  # binds, as MXNet's
    with pytest.raises(mx.base.MXNetError, match=r"^mxfp16: this graph runs .* in float16, "
                       ".*emulate=True"):
        converted.forward(next(iter(_val_iter())), is_train=False)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rnn_conversion(dtype):
    from mxnet.gluon import nn, rnn
    model = nn.HybridSequential()
    model.add(rnn.LSTM(hidden_size=10, num_layers=2, bidirectional=True))
    model.add(nn.Dense(2))
    model.initialize()
    model.hybridize()
    x = mx.nd.ones((2, 3, 4))
    expected = model(x).asnumpy()
    converted = amp.convert_hybrid_block(model, target_dtype=dtype, ctx=mx.cpu())
    output = mx.nd.amp_cast(converted(x), dtype="float32").asnumpy()
    np.testing.assert_allclose(output, expected, atol=1e-2, rtol=1e-2)
    inputs, sym = model._cached_graph
    real = amp.convert_symbol(sym, target_dtype=dtype, data_names=[inputs[0].name],
                              cast_optional_params=True)
    types = _arg_dtypes(real, **{inputs[0].name: "float32"})
    rnn_params = [name for name in types if name.endswith("rnn_param_concat0_output")
                  or "l0_i2h_weight" in name]
    assert rnn_params and all(types[name] == (np.float16 if dtype == "float16" else np.float32)
                              for name in rnn_params)
