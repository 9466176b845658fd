"""Casts in the float16 GPU graph of detectors: fewer than MXNet AMP's ``convert_hybrid_block``.

Two rules of :mod:`mxfp16.casting.boundary` keep casts out without changing a value: what is read
only for its shape (GluonCV's anchors ``slice_like(anchors, x * 0)``) runs in its input's dtype,
and layout ops (transpose, flatten, concat) before the float32 tail stay float16, so SSD's
predictions are cast once after their concat.
"""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.contrib import amp

import mxfp16
from mxfp16.casting.graph import internal_dtypes

pytest.importorskip("gluoncv")
from gluoncv.model_zoo import get_model  # noqa: E402

CAST_OPS = ("Cast", "amp_cast", "amp_multicast")


def cast_inputs(sym):
    """The input names of each cast node of ``sym`` (``amp_multicast`` casts several)."""
    nodes = json.loads(sym.tojson(remove_amp_cast=False))["nodes"]
    return [[nodes[entry[0]]["name"] for entry in node["inputs"]]
            for node in nodes if node["op"] in CAST_OPS]


def inserted(casts, own):
    """``casts`` without the graph's own casts ``own`` (each taken out once)."""
    casts = list(casts)
    for cast in own:
        casts.remove(cast)
    return casts


def gpu_casts(sym, names):
    cast = mxfp16.cast_symbol(sym, "float16", emulate=False, data_names=names)
    return inserted(cast_inputs(cast), cast_inputs(sym))


def test_shape_only_reads_and_layout_ops_need_no_cast_of_their_own():
    data = mx.sym.var("data")
    feature = mx.sym.relu(mx.sym.Convolution(data, kernel=(3, 3), num_filter=4, name="conv"),
                          name="feature")
    head = mx.sym.Convolution(feature, kernel=(1, 1), num_filter=2, name="pred")
    pred = mx.sym.flatten(mx.sym.transpose(head, axes=(0, 2, 3, 1)), name="flat")
    anchors = mx.sym.slice_like(mx.sym.var("anchors"), feature * 0, axes=(2, 3), name="anchor")
    box = mx.sym.flatten(mx.sym.Convolution(feature, kernel=(1, 1), num_filter=4, name="box"))
    preds = mx.sym.concat(pred, box, dim=1, name="cat")
    net = mx.sym.Group([mx.sym.sigmoid(preds, name="score"), anchors])
    # the data, and the concat (not its two inputs, nor the feature map for the anchors)
    assert gpu_casts(net, ["data"]) == [["data"], ["cat"]]
    cast = mxfp16.cast_symbol(net, "float16", emulate=False)
    types = internal_dtypes(cast, ["data"])
    assert types["anchor_output"] == types["anchors"] == types["score_output"] == "float32"
    assert types["cat_output"] == types["flat_output"] == "float16"
    # the same values as the float32-side arithmetic of the cast before the concat
    args = {"data": mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (1, 1, 6, 6))),
            "anchors": mx.nd.array(np.arange(64).reshape(1, 1, 8, 8)),
            "conv_weight": mx.nd.array(np.random.RandomState(1).uniform(-1, 1, (4, 1, 3, 3))),
            "conv_bias": mx.nd.zeros(4),
            "pred_weight": mx.nd.array(np.random.RandomState(2).uniform(-1, 1, (2, 4, 1, 1))),
            "pred_bias": mx.nd.zeros(2),
            "box_weight": mx.nd.array(np.random.RandomState(3).uniform(-1, 1, (4, 4, 1, 1))),
            "box_bias": mx.nd.zeros(4)}
    emulated = mxfp16.cast_symbol(net, "float16", emulate=True)
    score, box = emulated.eval(mx.cpu(), **args)
    assert box.dtype == np.float32 and box.shape == (1, 1, 4, 4)
    np.testing.assert_array_equal(box.asnumpy(), args["anchors"].asnumpy()[:, :, :4, :4])
    assert score.dtype == np.float32 and np.isfinite(score.asnumpy()).all()


def test_a_layout_chain_that_gathers_nothing_keeps_the_cast_before_it():
    """YOLOv3's prediction is reshaped, then sliced three ways: casting the three slices would
    take three casts where one before them does; the reshape gathers nothing, and keeps its cast
    (CenterNet's decoder, which reshapes its predictions for gather_nd, stays float32 so)."""
    conv = mx.sym.Convolution(mx.sym.var("data"), kernel=(1, 1), num_filter=6, name="conv")
    flat = mx.sym.reshape(conv, shape=(0, -1), name="flat")
    parts = [mx.sym.sigmoid(mx.sym.slice_axis(flat, axis=1, begin=i, end=i + 1)) for i in range(3)]
    assert gpu_casts(mx.sym.Group(parts), ["data"]) == [["data"], ["conv"]]


def traced(net, inputs):
    """The training-mode graph ``convert_hybrid_block`` converts, and its input names."""
    net.hybridize()
    with autograd.record():  # YOLOv3 computes its losses only while recording
        net(*inputs)
    variables, sym = net._cached_graph
    return sym, [variable.name for variable in variables]


def amp_casts(net, sym):
    converted = amp.convert_hybrid_block(net, target_dtype="float16", ctx=mx.cpu(),
                                         cast_optional_params=True)
    return inserted(cast_inputs(converted._cached_graph[1]), cast_inputs(sym))


@pytest.mark.slow
def test_ssd_gpu_graph_casts_fewer_than_mxnet_amp():
    """MXNet AMP's tutorial SSD: mxfp16 casts the images and the two concatenated predictions
    (3 casts); AMP's convert_hybrid_block 5 cast nodes converting 10 tensors."""
    net = get_model("ssd_300_mobilenet0.25_voc", pretrained_base=False)
    net.initialize()
    sym, names = traced(net, [mx.nd.zeros((1, 3, 64, 64))])
    assert cast_inputs(sym) == []
    ours = gpu_casts(sym, names)
    assert ours[0] == ["data"] and len(ours) == 3 and all(len(c) == 1 for c in ours), ours
    # the class and box predictions, after their concat (the block's prefix counts SSDs made)
    assert sorted(c[0].split("_", 1)[1] for c in ours[1:]) == ["concat0", "concat1"], ours
    theirs = amp_casts(net, sym)
    assert (len(theirs), sum(len(c) for c in theirs)) == (5, 10), theirs
    assert len(ours) < len(theirs)


def test_yolo3_gpu_graph_casts_fewer_than_mxnet_amp():
    """GluonCV's YOLOv3 with its in-network losses: the images and one cast per prediction head
    (its feature maps, read for their shape by the offsets, need none); AMP converts the losses'
    arithmetic op by op (dozens of casts)."""
    from gluoncv.model_zoo.mobilenet import get_mobilenet
    from gluoncv.model_zoo.yolo.yolo3 import get_yolov3
    from gluoncv.model_zoo.yolo.yolo_target import YOLOV3PrefetchTargetGenerator

    features = get_mobilenet(multiplier=0.25, pretrained=False).features
    stages = [features[:33], features[33:69], features[69:-2]]
    anchors = [[10, 13, 16, 30, 33, 23], [30, 61, 62, 45, 59, 119], [116, 90, 156, 198, 373, 326]]
    net = get_yolov3("mobilenet0.25", stages, [32, 16, 16], anchors, [8, 16, 32], ["a", "b"], "")
    net.initialize()
    x, gt_box = mx.nd.zeros((1, 3, 64, 64)), mx.nd.array([[[8, 8, 40, 40]]])
    with autograd.train_mode():
        _, anchor, offsets, feat_maps, _, _, _, _ = net(x)
    targets = YOLOV3PrefetchTargetGenerator(num_class=2)(
        x * 0, feat_maps, anchor, offsets, gt_box, mx.nd.array([[[1]]]), None)
    sym, names = traced(net, [x, gt_box, *targets])
    ours = gpu_casts(sym, names)
    assert ours[0] == [names[0]] and len(ours) == 4, ours
    assert all(c[0].endswith("_conv0_fwd") for c in ours[1:]), ours
    assert len(ours) < len(amp_casts(net, sym))


def test_amp_mode_passes_take_and_pick_of_computed_values_through_mxnet_amp():
    """MXNet 1.9.1's float16 AMP pass fails on a take (or pick) of a computed value (Faster
    R-CNN's target sampler and box features); cast_symbol hands the pass a stand-in and puts the
    op back: attributes kept, output in its data's dtype, index read as it is."""
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    index = mx.sym.argmax(fc, axis=1, name="index")
    taken = mx.sym.take(fc, index, axis=0, mode="wrap", name="taken")
    net = mx.sym.Group([mx.sym.FullyConnected(taken, num_hidden=2, name="head"),
                        mx.sym.pick(fc, index, axis=1, name="picked")])
    with pytest.raises(mx.base.MXNetError, match="Index type must be set for take"):
        amp.convert_symbol(net, target_dtype="float16", data_names=["data"])
    cast = mxfp16.cast_symbol(net, "float16", emulate=False, mode="amp")
    nodes = json.loads(cast.tojson(remove_amp_cast=False))["nodes"]
    by_name = {node["name"]: node for node in nodes}
    assert by_name["taken"]["op"] == "take" and by_name["picked"]["op"] == "pick"
    assert by_name["taken"]["attrs"] == {"axis": "0", "mode": "wrap"}
    assert [nodes[e[0]]["name"] for e in by_name["taken"]["inputs"]][1] == "index"
    types = internal_dtypes(cast, ["data"])
    assert types["taken_output"] == types["head_output"] == "float16"  # no cast between them
    assert types["index_output"] == types["picked_output"] == "float32"  # pick: float32 tail
    args = {"data": mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (3, 5)))}
    args.update({name: mx.nd.array(np.random.RandomState(1).uniform(-1, 1, shape))
                 for name, shape in zip(net.list_arguments(), net.infer_shape(data=(3, 5))[0])
                 if name != "data"})
    expected = [out.asnumpy() for out in net.eval(ctx=mx.cpu(), **args)]
    emulated = mxfp16.cast_symbol(net, "float16", emulate=True, mode="amp")
    got = [out.asnumpy() for out in emulated.eval(ctx=mx.cpu(), **args)]
    assert all(np.allclose(g, e, rtol=1e-2, atol=1e-2) for g, e in zip(got, expected))


def test_a_graph_mxnet_amp_cannot_convert_raises_one_error_naming_mode_full(monkeypatch):
    from mxfp16.casting import amp_graph

    def fail(*args, **kwargs):
        raise mx.base.MXNetError("Check failed: something in the pass")
    monkeypatch.setattr(amp_graph.amp, "convert_symbol", fail)
    net = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc")
    with pytest.raises(mx.base.MXNetError, match="cannot convert this graph to float16 "
                       r"\(Check failed: something in the pass\): cast with mode='full'"):
        mxfp16.cast_symbol(net, "float16", emulate=False, mode="amp")
