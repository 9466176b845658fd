"""Transposed convolutions as convolutions (mxfp16.casting.transposed), against Deconvolution."""

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
    "2d_phases_bias_adj": ((2, 3, 4, 5), dict(kernel=(6, 6), stride=(3, 3), pad=(2, 2),
                                              adj=(1, 2), num_filter=2, no_bias=False)),
    "2d_stride_kernel": ((2, 3, 3, 3), dict(kernel=(2, 2), stride=(2, 2), num_filter=2)),
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


@pytest.mark.parametrize("known", [False, True])
@pytest.mark.parametrize("name", sorted(CASES))
def test_convolution_form_matches_deconvolution_forward_and_backward(name, known):
    """With the weight's shape known (as Gluon's are), 2D strides of the kernel's divisors take
    the phase form (one Convolution per output phase, no zeros); else the zero-upsampled form."""
    shape, attrs = CASES[name]
    groups = attrs.get("num_group", 1)
    # Gluon's weights have known shapes once initialized; the others are inferred from the data
    weight = mx.sym.var("up_weight", shape=(shape[1], attrs["num_filter"] // groups) +
                        attrs["kernel"]) if known or groups > 1 else None
    if known and not attrs.get("no_bias", True):
        attrs = dict(attrs, bias=mx.sym.var("up_bias", shape=(attrs["num_filter"],)))
    deconv = mx.sym.Deconvolution(mx.sym.var("data"), weight=weight, name="up", **attrs)
    conv = deconvolution_as_convolution(deconv)
    assert "Deconvolution" not in conv.tojson()
    phases = known and name in ("2d_dcgan", "2d_phases_bias_adj", "2d_stride_kernel",
                                "2d_one_channel")
    assert ("depth_to_space" in conv.tojson()) == phases
    assert conv.list_arguments() == deconv.list_arguments()
    assert len(conv.list_outputs()) == 1
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


def cast_graph(dtype, emulate=None, channels=16):
    """A DCGAN-like transposed convolution and its cast (itself for float32)."""
    import mxfp16
    from mxnet.gluon import nn
    mx.random.seed(0)
    block = nn.Conv2DTranspose(channels, 4, strides=2, padding=1, in_channels=2)
    block.initialize(mx.init.Xavier())
    if dtype == "float32":
        return block, block
    return block, mxfp16.cast_block(block, dtype, emulate=emulate)


def test_gpu_graph_keeps_deconvolution_and_the_cpu_graphs_run_convolutions():
    from mxfp16.casting.graph import count_ops, internal_dtypes
    _, gpu = cast_graph("float16", emulate=False)
    assert count_ops(gpu.graphs[0], "Deconvolution") == 1  # cuDNN's transposed convolution
    _, emulated = cast_graph("float16")
    assert count_ops(emulated.graphs[0], "Deconvolution") == 0
    block, bf16 = cast_graph("bfloat16")
    assert count_ops(bf16.graphs[0], "Deconvolution") == 0
    types = internal_dtypes(bf16.graphs[0], bf16.data_names)
    bfloat16 = "void16"  # numpy has no bfloat16: MXNet reports it as void16
    assert types[f"{block.name}_fwd_output"] == bfloat16  # Convolution has a bfloat16 kernel
    block, bf16 = cast_graph("bfloat16", channels=3)  # 3 x 2 x 2 phases: fewer than 16 channels
    types = internal_dtypes(bf16.graphs[0], bf16.data_names)
    assert types[f"{block.name}_fwd_output"] == "float32"  # rules row 'bfloat16_float32'


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_one_output_channel_from_many_trains_cast(dtype):
    """MXNet 1.9.1's oneDNN Deconvolution fails with one output channel and 16 or more input
    channels even in float32 ('could not create a primitive descriptor for a reorder
    primitive'); the cast layer, a Convolution, trains."""
    import mxfp16
    from mxnet import autograd
    from mxnet.gluon import nn
    block = nn.Conv2DTranspose(1, 4, strides=2, padding=1, in_channels=32)
    block.initialize()
    cast = mxfp16.cast_block(block, dtype)
    with autograd.record():
        loss = cast(mx.nd.ones((4, 32, 4, 4))).sum()
    loss.backward()
    assert cast(mx.nd.ones((4, 32, 4, 4))).shape == (4, 1, 8, 8)
    assert np.isfinite(block.weight.grad().astype("float32").asnumpy()).all()


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


def test_bfloat16_deconvolution_with_target_shape_trains_on_its_weight_variable():
    """Not rewritten (its output size is target_shape's): it runs in float32 with its float32
    weight fed directly, not through a Cast, which oneDNN's backward cannot take."""
    import mxfp16
    from mxnet import autograd, gluon
    data = mx.sym.var("data")
    up = mx.sym.Deconvolution(data, kernel=(3, 3), stride=(2, 2), target_shape=(9, 9),
                              num_filter=2, name="up")
    net = gluon.SymbolBlock(up, [data])
    net.initialize()
    cast = mxfp16.cast_block(net, "bfloat16")
    with autograd.record():
        loss = cast(mx.nd.ones((2, 3, 4, 4))).sum()
    loss.backward()
    assert cast(mx.nd.ones((2, 3, 4, 4))).shape == (2, 2, 9, 9)
    assert net.collect_params()["up_weight"].grad().sum().asscalar() == 1728.0  # 2 * 9 * 4 * 4 * 3


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_deferred_weight_shapes_take_the_zero_upsampled_form_and_train(dtype):
    """Without in_channels the weights wait for the first batch: the graph must infer their
    shapes from the data, which the zero-upsampled form's transpose and reverse do."""
    import mxfp16
    from mxnet import autograd
    from mxnet.gluon import nn
    net = nn.HybridSequential()
    net.add(nn.Conv2DTranspose(4, 4, strides=2, padding=1), nn.Activation("relu"),
            nn.Conv2DTranspose(1, 4, strides=2, padding=1))
    net.initialize()
    cast = mxfp16.cast_block(net, dtype)
    assert "depth_to_space" not in cast.graphs[0].tojson()
    with autograd.record():
        loss = cast(mx.nd.ones((2, 3, 4, 4))).sum()
    loss.backward()
    assert [p.shape for p in net.collect_params().values()][0] == (3, 4, 4, 4)
    assert all(np.isfinite(p.grad().astype("float32").asnumpy()).all()
               for p in net.collect_params().values())


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_simple_pose_deconvolution_head_trains_cast(dtype):
    """GluonCV's SimplePose (three Conv2DTranspose layers after a ResNet) trains on heatmaps in
    this process, oneDNN on: the loss falls over three steps."""
    import mxfp16
    from gluoncv.model_zoo import get_model
    from mxnet import autograd
    mx.random.seed(0)
    net = get_model("simple_pose_resnet18_v1b", pretrained=False, pretrained_base=False)
    net.initialize()
    cast = mxfp16.cast_block(net, dtype)
    # A static scale: this test is about the transposed convolutions training, not about the
    # dynamic scaler, whose measured start (65536) lets this tiny network's float16 gradients
    # overflow at the third step (BatchNorm over 2 values a channel amplifies any rounding) and
    # skip it, as it should.
    trainer = mxfp16.Trainer(net.collect_params(), "adam", {"learning_rate": 1e-3}, dtype=dtype,
                             loss_scale=1024 if dtype == "float16" else None)
    x = mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (2, 3, 32, 32)))
    losses = []
    for _ in range(3):
        with autograd.record():
            heatmaps = cast(x)
            loss = ((heatmaps - 0.5) ** 2).mean()
        trainer.backward(loss)
        assert trainer.step(2)
        losses.append(loss.asscalar())
    assert heatmaps.shape == (2, 17, 8, 8) and heatmaps.dtype == np.float32
    assert losses[2] < losses[0], losses
