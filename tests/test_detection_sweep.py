"""GluonCV 0.10's detection, segmentation and pose model-zoo families at tiny sizes, cast to float16
(CPU emulation) and bfloat16: a training step with each family's own targets and losses, as
GluonCV's training scripts compute them, and a loss that one update lowers; inference with the
float32 network's structure of outputs; the GPU graph (emulate=False) passes type inference with
float32 outputs and float16 GEMM weights.  The families are discovered from GluonCV's model zoo,
so a new one is not missed: each is swept or excepted with its reason."""
import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd, gluon

import mxfp16
from mxfp16 import mxnet_internals
from mxfp16.casting.boundary import Boundary
from mxfp16.casting.graph import GraphRewriter, internal_dtypes

gcv = pytest.importorskip("gluoncv")
from gluoncv import loss as gcv_loss  # noqa: E402
from gluoncv.model_zoo import get_model  # noqa: E402
from gluoncv.model_zoo import model_zoo as zoo  # noqa: E402

SIZE = 128
CROP = 32
GT_BOX = [[[10, 12, 60, 70], [50, 40, 120, 110]]]
GT_ID = [[[1], [3]]]


#: Segmentation networks, fed CROP-pixel crops (their output is resized to the crop size).
SEGMENTATION = ("gluoncv.model_zoo.fcn", "gluoncv.model_zoo.pspnet", "gluoncv.model_zoo.deeplabv3",
                "gluoncv.model_zoo.deeplabv3b_plus", "gluoncv.model_zoo.danet",
                "gluoncv.model_zoo.icnet", "gluoncv.model_zoo.fastscnn")


def image(module=None):
    size = CROP if module in SEGMENTATION else SIZE
    return mx.nd.array(np.random.RandomState(0).uniform(-1, 1, (1, 3, size, size)))


def rcnn(kind):
    """A tiny R-CNN on ResNet-18 with a small RoI sampling (the zoo configs sample 128-512 RoIs,
    minutes a step on a CPU)."""
    from gluoncv.model_zoo.rcnn.faster_rcnn import get_faster_rcnn
    from gluoncv.model_zoo.rcnn.mask_rcnn import get_mask_rcnn
    from gluoncv.model_zoo.resnetv1b import resnet18_v1b
    base = resnet18_v1b(pretrained=False, dilated=False, use_global_stats=True)
    features, top = gluon.nn.HybridSequential(), gluon.nn.HybridSequential()
    for layer in ("conv1", "bn1", "relu", "maxpool", "layer1", "layer2", "layer3"):
        features.add(getattr(base, layer))
    top.add(base.layer4)
    config = dict(name="tiny", dataset="tiny", pretrained=False, features=features,
                  top_features=top, classes=["a", "b", "c", "d"], short=SIZE, max_size=SIZE,
                  nms_thresh=0.3, nms_topk=50, post_nms=10, roi_mode="align", roi_size=(14, 14),
                  strides=16, clip=None, rpn_channel=64, base_size=16, scales=(2, 4, 8),
                  ratios=(0.5, 1, 2), alloc_size=(32, 32), rpn_nms_thresh=0.7,
                  rpn_train_pre_nms=200, rpn_train_post_nms=32, rpn_test_pre_nms=100,
                  rpn_test_post_nms=16, rpn_min_size=4, num_sample=16, pos_iou_thresh=0.5,
                  pos_ratio=0.25)
    if kind == "mask":
        return get_mask_rcnn(mask_channels=16, rcnn_max_dets=10, **config)
    return get_faster_rcnn(max_num_gt=4, **config)


#: GluonCV's FPN R-CNN configs (5 levels, 7x7 RoIs) with the small sampling of :func:`rcnn`.
TINY_FPN = dict(short=SIZE, max_size=SIZE, min_stage=2, max_stage=6, nms_thresh=0.3, nms_topk=50,
                post_nms=10, roi_mode="align", roi_size=(7, 7), strides=(4, 8, 16, 32, 64),
                clip=4.14, rpn_channel=64, base_size=16, scales=(2, 4, 8, 16, 32),
                ratios=(0.5, 1, 2), alloc_size=(64, 64), rpn_nms_thresh=0.7,
                rpn_train_pre_nms=200, rpn_train_post_nms=32, rpn_test_pre_nms=100,
                rpn_test_post_nms=16, rpn_min_size=1, num_sample=16, pos_iou_thresh=0.5,
                pos_ratio=0.25)


def fpn_rcnn(kind):
    """A tiny FPN R-CNN on ResNet-18: ``custom_mask_rcnn_fpn``, or the double-head R-CNN of
    ``custom_faster_rcnn_fpn`` (the zoo's, in doublehead_rcnn) built with its own double head
    (``box_features=None``): given box features, as custom_faster_rcnn_fpn gives them, its
    forward fails in float32 too (``UnboundLocalError: cls_feat``, doublehead_rcnn.py:461)."""
    from gluoncv.model_zoo.rcnn.faster_rcnn.doublehead_rcnn import get_doublehead_rcnn
    from gluoncv.model_zoo.rcnn.faster_rcnn.faster_rcnn import custom_rcnn_fpn
    from gluoncv.model_zoo.rcnn.mask_rcnn.mask_rcnn import custom_mask_rcnn_fpn
    classes = ["a", "b", "c", "d"]
    if kind == "mask":
        return custom_mask_rcnn_fpn(classes, pretrained_base=False, num_fpn_filters=32,
                                    num_box_head_dense_filters=64, mask_channels=16,
                                    rcnn_max_dets=10, target_roi_scale=2, num_fcn_convs=1,
                                    **TINY_FPN)
    features, top, _ = custom_rcnn_fpn(False, "resnet18_v1b", gluon.nn.BatchNorm, None, None,
                                       None, 32, 4, 32, 64)
    return get_doublehead_rcnn("fpn_resnet18_v1b", "tiny", features=features, top_features=top,
                               classes=classes, box_features=None, max_num_gt=4, **TINY_FPN)


def ssd_loss(net, x):
    from gluoncv.model_zoo.ssd.target import SSDTargetGenerator
    with autograd.train_mode():
        cls_preds, _, anchors = net(x)
    cls_targets, box_targets, _ = SSDTargetGenerator()(
        anchors, cls_preds, mx.nd.array(GT_BOX), mx.nd.array(GT_ID))
    multibox = gcv_loss.SSDMultiBoxLoss()

    def loss(cast):
        cls_preds, box_preds, _ = cast(x)
        total, _, _ = multibox([cls_preds], [box_preds], [cls_targets], [box_targets])
        return total[0]
    return loss


def yolo_call(net, x):
    """YOLOv3's training call: the image, gt boxes and YOLOV3PrefetchTargetGenerator's targets,
    made from the float32 network as YOLO3DefaultTrainTransform makes them."""
    from gluoncv.model_zoo.yolo.yolo_target import YOLOV3PrefetchTargetGenerator
    with autograd.train_mode():
        _, anchors, offsets, feat_maps, _, _, _, _ = net(x)
    targets = YOLOV3PrefetchTargetGenerator(num_class=len(net.classes))(
        x * 0, feat_maps, anchors, offsets, mx.nd.array(GT_BOX), mx.nd.array(GT_ID), None)
    return (x, mx.nd.array(GT_BOX), *targets)


def yolo_loss(net, x):
    call = yolo_call(net, x)
    return lambda cast: sum(cast(*call))


def rcnn_call(net, x):
    return x, mx.nd.array(GT_BOX), mx.nd.array(GT_ID)


def rcnn_loss(net, x, masks=False):
    """train_faster_rcnn.py's and train_mask_rcnn.py's losses: RPN objectness and boxes against
    RPNTargetGenerator's targets, RCNN classes and boxes against the network's own targets, and
    for Mask R-CNN the masks against its MaskTargetGenerator's."""
    from gluoncv.model_zoo.rcnn.rpn.rpn_target import RPNTargetGenerator
    box, label = mx.nd.array(GT_BOX), mx.nd.array(GT_ID)
    gt_masks = mx.nd.zeros((1, 2, SIZE, SIZE))
    gt_masks[0, 0, 12:70, 10:60] = 1
    gt_masks[0, 1, 40:110, 50:120] = 1
    rpn_targets = RPNTargetGenerator(num_sample=32, pos_iou_thresh=0.5, neg_iou_thresh=0.3)
    sigmoid, huber = gluon.loss.SigmoidBinaryCrossEntropyLoss(), gluon.loss.HuberLoss(rho=1 / 9.)
    softmax = gluon.loss.SoftmaxCrossEntropyLoss()

    def loss(cast):
        outputs = list(cast(x, box, label))
        mask_pred = outputs.pop(2) if masks else None
        (cls_pred, box_pred, roi, _, matches, rpn_score, rpn_box, anchors, cls_targets,
         box_targets, box_masks, *rest) = outputs
        with autograd.pause():  # FPN: the levels' anchors in order, as the RPN's predictions
            anchors = mx.nd.concat(*[a.reshape((-1, 4)) for a in flat(anchors)], dim=0)
            rpn_cls, rpn_box_t, rpn_mask = [mx.nd.array(t) for t in rpn_targets(
                box[0], anchors, SIZE, SIZE)]
        rpn_weight = (rpn_cls >= 0).expand_dims(0)
        total = sigmoid(rpn_score.squeeze(-1), (rpn_cls >= 1).expand_dims(0), rpn_weight).sum() \
            + huber(rpn_box, rpn_box_t.expand_dims(0), rpn_mask.expand_dims(0)).sum() \
            + softmax(cls_pred, cls_targets, cls_targets >= 0).sum() \
            + huber(box_pred, box_targets, box_masks).sum()
        if masks:  # the positive RoIs the mask head saw (indices), as train_mask_rcnn.py takes
            with autograd.pause():
                indices = rest[-1][0]
                mask_targets, mask_weights = net.mask_target(
                    roi[0].take(indices).expand_dims(0), gt_masks,
                    matches[0].take(indices).expand_dims(0),
                    cls_targets[0].take(indices).expand_dims(0))
            total = total + sigmoid(mask_pred, mask_targets, mask_weights).sum()
        return total
    return loss


def centernet_loss(net, x):
    from gluoncv.model_zoo.center_net.target_generator import CenterNetTargetGenerator
    size = SIZE // 4
    heatmap, wh, wh_mask, center, center_mask = [
        mx.nd.array(t).expand_dims(0) for t in CenterNetTargetGenerator(
            len(net.classes), size, size)(np.array(GT_BOX[0]) / 4., np.array(GT_ID[0])[:, 0])]
    focal, l1 = gcv_loss.HeatmapFocalLoss(from_logits=True), gcv_loss.MaskedL1Loss()

    def loss(cast):
        heatmap_pred, wh_pred, center_pred = cast(x)
        return focal(heatmap_pred, heatmap) + 0.1 * l1(wh, wh_pred, wh_mask) \
            + l1(center, center_pred, center_mask)
    return lambda cast: loss(cast).sum()


def summed_on_a_target(loss, x, flatten=False):
    """``loss`` of the cast network's outputs (flattened if asked) and one random class map of
    the crop, summed: the segmentation families' losses take their outputs so."""
    target = mx.nd.array(np.random.RandomState(1).randint(0, 3, (1, CROP, CROP)))
    outputs = (lambda cast: flat(cast(x))) if flatten else (lambda cast: cast(x))
    return lambda cast: loss(*outputs(cast), target).sum()


def segmentation_loss(net, x):
    return summed_on_a_target(gcv_loss.MixSoftmaxCrossEntropyLoss(aux=True), x)


def multi_loss(net, x):
    """DANet's three outputs against one target (SegmentationMultiLosses, as its script)."""
    return summed_on_a_target(gcv_loss.SegmentationMultiLosses(), x)


def icnet_loss(net, x):
    """ICNet's cascade of four outputs, each resized to the crop (ICNetLoss, as its script)."""
    return summed_on_a_target(gcv_loss.ICNetLoss(crop_size=CROP), x)


def plain_segmentation_loss(net, x):
    """One output, no aux head (DeepLabV3+)."""
    return summed_on_a_target(gcv_loss.MixSoftmaxCrossEntropyLoss(aux=False), x, flatten=True)


def pose_loss(net, x):
    heatmap = mx.nd.array(np.random.RandomState(1).uniform(0, 1, (1, 17, SIZE // 4, SIZE // 4)))
    l2 = gluon.loss.L2Loss()
    return lambda cast: l2(cast(x), heatmap).sum()


def segmentation(name, **kwargs):
    """A segmentation network for CROP-pixel crops (its output is resized to the crop size)."""
    kwargs = dict(dict(aux=True), **kwargs)
    return lambda: get_model(name, pretrained_base=False, crop_size=CROP, base_size=CROP,
                             height=CROP, width=CROP, **kwargs)


def alpha_pose():
    """AlphaPose's SE-ResNet-50 and pixel-shuffle (DUC) head; the zoo has only ResNet-101's."""
    from gluoncv.model_zoo.alpha_pose.fast_pose import get_alphapose
    return get_alphapose("resnet50_v1b", "coco", 17, pretrained_base=False)


#: model-zoo module -> (a new tiny network, ``(net, x) -> loss(cast)``: the targets, computed
#: from the float32 network as GluonCV's data transforms do, and the loss of the cast network).
SWEEP = {
    "gluoncv.model_zoo.ssd.presets": (
        lambda: get_model("ssd_300_mobilenet0.25_voc", pretrained_base=False), ssd_loss),
    "gluoncv.model_zoo.yolo.yolo3": (
        lambda: get_model("yolo3_mobilenet0.25_voc", pretrained_base=False), yolo_loss),
    "gluoncv.model_zoo.rcnn.faster_rcnn.predefined_models": (lambda: rcnn("faster"), rcnn_loss),
    "gluoncv.model_zoo.rcnn.mask_rcnn.predefined_models": (
        lambda: rcnn("mask"), lambda net, x: rcnn_loss(net, x, masks=True)),
    "gluoncv.model_zoo.center_net.center_net": (
        lambda: get_model("center_net_resnet18_v1b_voc", pretrained_base=False), centernet_loss),
    "gluoncv.model_zoo.fcn": (segmentation("fcn_resnet50_voc"), segmentation_loss),
    "gluoncv.model_zoo.pspnet": (segmentation("psp_resnet50_ade"), segmentation_loss),
    "gluoncv.model_zoo.deeplabv3": (segmentation("deeplab_resnet50_ade"), segmentation_loss),
    "gluoncv.model_zoo.simple_pose.simple_pose_resnet": (
        lambda: get_model("simple_pose_resnet18_v1b", pretrained_base=False), pose_loss),
    "gluoncv.model_zoo.rcnn.mask_rcnn.mask_rcnn": (
        lambda: fpn_rcnn("mask"), lambda net, x: rcnn_loss(net, x, masks=True)),
    "gluoncv.model_zoo.rcnn.faster_rcnn.doublehead_rcnn": (lambda: fpn_rcnn("double"), rcnn_loss),
    "gluoncv.model_zoo.deeplabv3b_plus": (
        segmentation("deeplab_v3b_plus_wideresnet_citys", aux=False), plain_segmentation_loss),
    "gluoncv.model_zoo.danet": (segmentation("danet_resnet50_citys", aux=False), multi_loss),
    "gluoncv.model_zoo.icnet": (segmentation("icnet_resnet50_citys", aux=False), icnet_loss),
    "gluoncv.model_zoo.fastscnn": (segmentation("fastscnn_citys"), segmentation_loss),
    "gluoncv.model_zoo.simple_pose.mobile_pose": (
        lambda: get_model("mobile_pose_mobilenetv3_small", pretrained_base=False), pose_loss),
    "gluoncv.model_zoo.alpha_pose.fast_pose": (alpha_pose, pose_loss),
}

#: GluonCV's FPN R-CNNs mask the RoIs of the other pyramid levels with batch index -1 before
#: ROIAlign; MXNet 1.9.1's CPU ROIAlign then writes one zero (roi_align.cc:170, ``top_data[n] =
#: 0; continue``) and leaves the rest of that RoI's output uninitialized, so on a CPU their pooled
#: features hold whatever the memory pool held, in every dtype (float32 too: 5e32 seen in a
#: two-op float32 graph; 1.2e17 in the float16 FPN Mask R-CNN's, whose loss is then NaN).  The
#: GPU kernel zeroes such RoIs.  Their values are not checked here; casting, the output structure
#: and the GPU graphs (training graphs included) are.
UNDEFINED_ON_CPU = {
    "gluoncv.model_zoo.rcnn.mask_rcnn.mask_rcnn": "FPN Mask R-CNN",
    "gluoncv.model_zoo.rcnn.faster_rcnn.doublehead_rcnn": "FPN double-head R-CNN",
}

#: (module, dtype, mode) whose training is not run here: the reason.  Casting and inference are
#: still swept, and the GPU graph below.  Each trained (3 steps, loss falling) when run by hand.
TRAINING_LIMITS = {
    **{(module, dtype, mode): f"{name}: MXNet's CPU ROIAlign leaves masked RoIs uninitialized "
       "(UNDEFINED_ON_CPU)" for module, name in UNDEFINED_ON_CPU.items()
       for dtype, mode in (("float16", "full"), ("bfloat16", "full"), ("float16", "amp"))},
}

#: Families whose float16 training keeps the backbone fixed (``grad_req='null'``) and trains the
#: rest (pyramid pooling or ASPP, attention, the cascade's branches, the decoder, the heads, their
#: losses): the float16 step's cost grows with the parameters trained (49M for PSPNet: 17 s a test,
#: 16:38 UTC; DeepLabV3+'s WideResNet-38, 137M: 3 CPU seconds a step, 0.9 s with it fixed).  FCN's
#: float16 training trains the dilated ResNet-50 that PSPNet, DeepLabV3, DANet and ICNet share, and
#: every bfloat16 training trains its backbone.  Module -> the backbone's layers.
RESNET_BACKBONE = ("conv1", "bn1", "layer1", "layer2", "layer3", "layer4")
FIXED_BACKBONE = {
    "gluoncv.model_zoo.pspnet": RESNET_BACKBONE,
    "gluoncv.model_zoo.deeplabv3": RESNET_BACKBONE,
    "gluoncv.model_zoo.danet": RESNET_BACKBONE,
    "gluoncv.model_zoo.icnet": RESNET_BACKBONE,
    "gluoncv.model_zoo.deeplabv3b_plus": ("mod1", "mod2", "mod3", "mod4", "mod5", "mod6", "mod7"),
}


def fix_backbone(net, module):
    for layer in FIXED_BACKBONE[module]:
        getattr(net, layer).collect_params().setattr("grad_req", "null")


#: (module, dtype, mode) not run here: the reason.  Empty: every family trains in every dtype and
#: mode (DeepLabV3+, ICNet, DANet and AlphaPose in float16 emulation add about 55 s).
NOT_RUN = {}

#: (module, mode) whose GPU graph is not type-checked here: the reason.
GPU_GRAPH_NOT_RUN = {}

#: Dense-prediction modules not swept here: why.
EXCEPTIONS = {}

#: Model-zoo modules of other tasks (classification, video, depth, tracking, int8).
OTHER_TASKS = ("action_recognition", "monodepthv2", "siamrpn", "quantized", "smot")


def discovered():
    """The model-zoo modules of dense prediction (detection, segmentation, pose)."""
    dense = ("ssd", "yolo3", "rcnn", "center_net", "fcn", "pspnet", "deeplab", "danet", "icnet",
             "fastscnn", "pose")
    modules = {function.__module__ for function in zoo._models.values()}
    return {m for m in modules if any(word in m for word in dense)
            and not any(word in m for word in OTHER_TASKS)}


def test_every_dense_prediction_family_is_swept_or_excepted_with_a_reason():
    found = discovered()
    assert found == set(SWEEP) | set(EXCEPTIONS), (found - set(SWEEP) - set(EXCEPTIONS),
                                                   (set(SWEEP) | set(EXCEPTIONS)) - found)
    assert {module for module, *_ in (*TRAINING_LIMITS, *NOT_RUN, *GPU_GRAPH_NOT_RUN)} <= set(SWEEP)


def build(module):
    mx.random.seed(0)
    net = SWEEP[module][0]()
    net.initialize()
    return net


def flat(out):
    return [a for item in out for a in flat(item)] if isinstance(out, (list, tuple)) else [out]


#: Families whose training call takes other inputs than inference: (net, x) -> the call.
TRAINING_CALLS = {
    "gluoncv.model_zoo.yolo.yolo3": yolo_call,
    "gluoncv.model_zoo.rcnn.faster_rcnn.predefined_models": rcnn_call,
    "gluoncv.model_zoo.rcnn.mask_rcnn.predefined_models": rcnn_call,
    "gluoncv.model_zoo.rcnn.mask_rcnn.mask_rcnn": rcnn_call,
    "gluoncv.model_zoo.rcnn.faster_rcnn.doublehead_rcnn": rcnn_call,
}


@pytest.mark.slow
@pytest.mark.parametrize("dtype, mode", [("float16", "full"), ("bfloat16", "full"),
                                         ("float16", "amp")])
@pytest.mark.parametrize("module", sorted(SWEEP))
def test_family_casts_trains_and_infers(module, dtype, mode):
    if (module, dtype, mode) in NOT_RUN:
        pytest.skip(NOT_RUN[module, dtype, mode])
    net, x = build(module), image(module)
    reference = flat(net(x))  # float32 inference: the structure the cast network keeps
    train = (module, dtype, mode) not in TRAINING_LIMITS
    if dtype == "float16" and module in FIXED_BACKBONE:
        fix_backbone(net, module)
    loss = SWEEP[module][1](net, x)
    cast = mxfp16.cast_block(net, dtype, mode=mode)
    outputs = flat(cast(x))
    assert module in UNDEFINED_ON_CPU or all(np.isfinite(o.asnumpy()).all() for o in outputs)
    assert_structure(outputs, reference)
    if train:
        trained = {n: p for n, p in cast.collect_params().items() if p.grad_req != "null"}
        trainer = mxfp16.Trainer(trained, "sgd", {"learning_rate": 0.001})
        with autograd.record():
            value = loss(cast)
        trainer.backward(value)
        trainer.step(1)
        with autograd.record():  # a training call as the first (YOLOv3 returns losses so)
            after = loss(cast)
        # One update lowers every family's loss (by 0.04% for MobilePose to 83% for YOLOv3).
        losses = [float(value.asscalar()), float(after.asscalar())]
        assert np.isfinite(losses).all() and losses[1] < losses[0], losses
        if module in TRAINING_CALLS:  # training traced a graph of its own, and made parameters
            assert_structure(flat(cast(x)), reference)
    # A few steps into training, an untrained detector's decoded boxes reach 1e16 in float32 too
    # (SSD after four: exp of the box regression): finiteness is checked before training.


def assert_structure(outputs, reference):
    """The cast network's inference outputs have the float32 network's shapes and dtypes."""
    assert [o.shape for o in outputs] == [r.shape for r in reference]
    assert all(o.dtype == r.dtype for o, r in zip(outputs, reference))


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["full", "amp"])
@pytest.mark.parametrize("module", sorted(SWEEP))
def test_family_gpu_graph_runs_gemms_in_float16_with_float32_boxes(module, mode):
    if (module, mode) in GPU_GRAPH_NOT_RUN:
        pytest.skip(GPU_GRAPH_NOT_RUN[module, mode])
    # Cast as initialized, before any forward (the shapes deferred, as a user's
    # ``net.initialize(); cast_block(net)``): type inference needs no values; the training test
    # above casts after a float32 forward.
    net, x = build(module), image(module)
    call = TRAINING_CALLS[module](net, x) if module in TRAINING_CALLS else None
    cast = mxfp16.cast_block(net, "float16", emulate=False, mode=mode)
    graphs = [(graph, cast.data_names) for graph in cast.graphs if graph is not None]
    if call is not None:  # the training graph, traced as that call needs (not run)
        with autograd.record():
            block, _, _ = cast._new_variant(call, training=True)
        inputs, graph = mxnet_internals.symbol_block_graph(block)
        graphs.append((graph, [symbol.name for symbol in inputs]))
    for graph, names in graphs:
        _, out_types, _ = graph.infer_type(**{n: np.float32 for n in names})
        types = internal_dtypes(graph, names)
        assert out_types and all(t == np.float32 for t in out_types), out_types
        weights = [n for n in net.collect_params() if n.endswith("conv0_weight") and n in types]
        assert weights and all(types[n] == "float16" for n in weights)
        # values read only for their shape (the anchor generator's x * 0) keep the feature's dtype
        rw = GraphRewriter(graph)
        shape_only = {rw.old_nodes[i]["name"] + "_output" for i in Boundary(rw).shape_only}
        boxes = [name for name in types if name.endswith("output") and name not in shape_only
                 and ("box_nms" in name or "anchor" in name or "decoder" in name)]
        assert all(types[name] != "float16" for name in boxes), [(n, types[n]) for n in boxes]
