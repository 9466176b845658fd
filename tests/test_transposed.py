"""Transposed convolutions as convolutions (mxfp16.casting.transposed), against Deconvolution."""
import json

import mxnet as mx
import numpy as np
import pytest

from mxfp16.casting.transposed import deconvolution_as_convolution

#: (data shape, Deconvolution attributes): 1-3 spatial dims, strides, pads, output padding,
#: dilation, groups, no bias, and a pad beyond the kernel's reach.
CASES = {
    "1d": ((2, 3, 7), dict(kernel=(3,), num_filter=4)),
    "2d_dcgan": ((2, 3, 4, 4), dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=5,
                                    no_bias=True)),
    "2d_adj": ((1, 2, 5, 4), dict(kernel=(3, 3), stride=(2, 3), pad=(1, 0), adj=(1, 2),
                                  num_filter=3)),
    "2d_dilate_groups": ((2, 4, 5, 5), dict(kernel=(3, 2), stride=(2, 1), dilate=(2, 1),
                                            num_group=2, num_filter=6)),
    "2d_one_channel": ((2, 3, 3, 3), dict(kernel=(4, 4), stride=(2, 2), pad=(1, 1), num_filter=1)),
    "2d_wide_pad": ((1, 2, 6, 6), dict(kernel=(2, 2), stride=(3, 3), pad=(2, 2), num_filter=2)),
    "3d": ((1, 2, 3, 3, 3), dict(kernel=(3, 3, 3), stride=(2, 2, 2), pad=(1, 1, 1), num_filter=2)),
}


def run(sym, shape, seed=0):
    """Outputs and every argument's gradient of ``sym`` for random data, weights and head
    gradients (the same for both graphs, from ``seed``)."""
    rng = np.random.RandomState(seed)
    arg_shapes, out_shapes, _ = sym.infer_shape(data=shape)
    args = {name: mx.nd.array(rng.uniform(-1, 1, s))
            for name, s in zip(sym.list_arguments(), arg_shapes)}
    grads = {name: mx.nd.zeros(s) for name, s in zip(sym.list_arguments(), arg_shapes)}
    exe = sym.bind(mx.cpu(), args, args_grad=grads)
    out = exe.forward(is_train=True)[0].asnumpy()
    exe.backward([mx.nd.array(rng.uniform(-1, 1, out_shapes[0]))])
    return out, {name: grad.asnumpy() for name, grad in grads.items()}


@pytest.mark.parametrize("name", sorted(CASES))
def test_convolution_form_matches_deconvolution_forward_and_backward(name):
    shape, attrs = CASES[name]
    groups = attrs.get("num_group", 1)
    weight = mx.sym.var("up_weight", shape=(shape[1], attrs["num_filter"] // groups) +
                        attrs["kernel"]) if groups > 1 else None  # else inferred from the data
    deconv = mx.sym.Deconvolution(mx.sym.var("data"), weight=weight, name="up", **attrs)
    conv = deconvolution_as_convolution(deconv)
    assert "Deconvolution" not in conv.tojson()
    assert conv.list_arguments() == deconv.list_arguments()
    assert conv.list_outputs() == deconv.list_outputs()
    expected_out, expected_grads = run(deconv, shape)
    out, grads = run(conv, shape)
    assert out.shape == expected_out.shape
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    for key in expected_grads:  # the same sums of the same products, added in another order
        np.testing.assert_allclose(grads[key], expected_grads[key], rtol=1e-5, atol=1e-5,
                                   err_msg=key)


def test_target_shape_and_other_ops_are_left_alone():
    data = mx.sym.var("data")
    kept = mx.sym.Deconvolution(data, kernel=(3, 3), stride=(2, 2), target_shape=(9, 9),
                                num_filter=2, name="fixed")
    relu = mx.sym.relu(kept)
    assert deconvolution_as_convolution(relu).tojson() == relu.tojson()


def cast_graph(dtype, emulate=None):
    """A DCGAN-like transposed convolution and its cast (itself for float32)."""
    import mxfp16
    from mxnet.gluon import nn
    mx.random.seed(0)
    block = nn.Conv2DTranspose(3, 4, strides=2, padding=1, in_channels=2)
    block.initialize(mx.init.Xavier())
    if dtype == "float32":
        return block, block
    return block, mxfp16.cast_block(block, dtype, emulate=emulate)


def test_gpu_graph_keeps_deconvolution_and_the_cpu_graphs_feed_no_op_output_as_weight():
    from mxfp16.casting.graph import count_ops
    _, gpu = cast_graph("float16", emulate=False)
    assert count_ops(gpu.graphs[0], "Deconvolution") == 1  # cuDNN's transposed convolution
    _, emulated = cast_graph("float16")
    assert count_ops(emulated.graphs[0], "Deconvolution") == 0
    _, bf16 = cast_graph("bfloat16")
    graph = json.loads(bf16.graphs[0].tojson(remove_amp_cast=False))
    deconv, = [node for node in graph["nodes"] if node["op"] == "Deconvolution"]
    weight = graph["nodes"][deconv["inputs"][1][0]]
    assert weight["op"] == "null" and weight["name"].endswith("weight")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cast_transposed_convolution_trains_like_float32(dtype):
    """Gradients of the cast layer, in this process with oneDNN on, match float32's within the
    dtype's resolution."""
    from mxnet import autograd
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 2, 5, 5)))
    grads = []
    for kind in ("float32", dtype):
        block, cast = cast_graph(kind)
        with autograd.record():
            loss = (cast(x) ** 2).sum()
        loss.backward()
        grads.append(block.weight.grad().astype("float32").asnumpy())
    resolution = 2.0 ** -10 if dtype == "float16" else 2.0 ** -7
    np.testing.assert_allclose(grads[1], grads[0], rtol=8 * resolution,
                               atol=8 * resolution * np.abs(grads[0]).max())
