"""Calls that differ between training and inference are traced per mode, with the inputs of that
call (GluonCV's Faster R-CNN takes gt boxes in training only; YOLOv3 takes targets in training
and returns losses when recording); and the dtype rules detection needs, on tiny graphs."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon
from mxnet.gluon import nn

import mxfp16
from mxfp16.casting.graph import internal_dtypes


class TrainsWithTargets(gluon.HybridBlock):
    """Faster R-CNN's convention: ``net(x)`` in inference, ``net(x, gt)`` in training; called in
    training without ``gt`` it fails, as GluonCV's does ('NoneType' has no attribute ...)."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)
        self.traced = []

    def hybrid_forward(self, F, x, gt=None):
        self.traced.append((autograd.is_training(), autograd.is_recording(), gt is not None))
        out = self.dense(x)
        if autograd.is_training():
            return F.square(out - gt.reshape((0, -1))).sum(axis=1)
        return out


class VariadicTargets(gluon.HybridBlock):
    """YOLOv3's convention: ``net(x, *targets)``; one input in inference (more is a TypeError),
    losses when recording, raw predictions when only training."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with self.name_scope():
            self.dense = nn.Dense(3, in_units=4)

    def hybrid_forward(self, F, x, *targets):
        if targets and not autograd.is_training():
            raise TypeError("inference only needs one input")
        out = self.dense(x)
        if autograd.is_training() and autograd.is_recording():
            return F.square(out - targets[0]).sum(axis=1), F.abs(out - targets[1]).sum(axis=1)
        return out, [out * 2, out * 3]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_training_call_with_targets_is_traced_at_that_call_with_its_inputs(dtype):
    net = TrainsWithTargets()
    net.initialize()
    x, gt = mx.nd.ones((2, 4)), mx.nd.zeros((2, 3))
    cast = mxfp16.cast_block(net, dtype)
    assert net.traced == [(False, False, False)]  # inference only: no call was guessed
    assert cast(x).shape == (2, 3)
    with autograd.record():
        loss = cast(x, gt)
    loss.backward()
    assert net.traced[-1] == (True, True, True) and loss.shape == (2,)
    assert net.dense.weight.grad().astype("float32").abs().sum().asscalar() > 0
    assert cast(x).dtype == np.float32  # inference still runs the inference graph


def test_variadic_targets_trace_each_mode_and_recording_state():
    net = VariadicTargets()
    net.initialize()
    x, t = mx.nd.ones((2, 4)), mx.nd.zeros((2, 3))
    cast = mxfp16.cast_block(net, "float16")
    out, extra = cast(x)  # inference: the nesting of its own outputs
    assert out.shape == (2, 3) and len(extra) == 2
    with autograd.train_mode():  # training, not recording: raw predictions (GluonCV's transforms)
        raw, raw_extra = cast(x)
    assert len(raw_extra) == 2
    with autograd.record():
        losses = cast(x, t, t)
    assert len(losses) == 2 and all(loss.shape == (2,) for loss in losses)
    with pytest.raises(TypeError, match="inference mode: inference only needs one input"):
        cast(x, t, t)


def test_closed_signature_still_traces_training_when_cast():
    net = nn.HybridSequential()
    net.add(nn.Dense(3, in_units=4), nn.Dropout(0.5))
    net.initialize()
    cast = mxfp16.cast_block(net, "float16")
    assert cast.graphs[1] is None and cast._plain_modes[True] == cast._plain_modes[False]


def detection_head():
    """A GEMM, then box arithmetic and NMS after it, and an int64 shape cast back to float."""
    data = mx.sym.var("data")
    anchors = mx.sym.var("anchors", shape=(1, 4, 4), init=mx.init.Constant(100))
    pred = mx.sym.FullyConnected(data, num_hidden=16, name="fc").reshape((1, 4, 4))
    boxes = mx.sym.broadcast_add(mx.sym.exp(pred) * 10, anchors, name="decode")
    size = mx.sym.cast(mx.sym.shape_array(data).slice_axis(axis=0, begin=1, end=2), "float32")
    boxes = mx.sym.broadcast_minimum(boxes, size * 100, name="clip")
    scores = mx.sym.sigmoid(mx.sym.slice_axis(pred, axis=-1, begin=0, end=1), name="score")
    return mx.sym.contrib.box_nms(mx.sym.concat(scores, boxes, dim=-1), coord_start=1,
                                  score_index=0, name="nms")


def test_after_the_last_gemm_boxes_and_nms_stay_float32_on_the_gpu_graph():
    gpu = mxfp16.cast_symbol(detection_head(), "float16", emulate=False)
    types = internal_dtypes(gpu, ["data"])
    assert types["fc_weight"] == "float16" and types["anchors"] == "float32"
    assert types["decode_output"] == types["clip_output"] == "float32"
    assert types["nms_output0"] == "float32"


@pytest.mark.parametrize("dtype, mode", [("float16", "full"), ("float16", "amp"),
                                         ("bfloat16", "full")])
def test_detection_head_runs_with_integer_shapes_and_float32_boxes(dtype, mode):
    sym = detection_head()
    cast = mxfp16.cast_symbol(sym, dtype, mode=mode)
    args = {"data": mx.nd.ones((1, 8)) * 0.1, "fc_weight": mx.nd.ones((16, 8)) * 0.01,
            "fc_bias": mx.nd.zeros(16), "anchors": mx.nd.ones((1, 4, 4)) * 2000.5}
    reference = sym.bind(mx.cpu(), args).forward()[0].asnumpy()
    types = internal_dtypes(cast, ["data"])
    args = {name: value.astype(types.get(name, "float32")) for name, value in args.items()}
    out = cast.bind(mx.cpu(), args).forward()[0]
    assert out.dtype == np.float32
    # Coordinates near 2000: float16 would step by 1-2 px; float32 keeps them within 1e-3 px.
    assert np.abs(out.asnumpy() - reference).max() < 1e-2, (out.asnumpy(), reference)
