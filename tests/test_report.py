"""Tests of mxfp16.report: each analysis on small networks with hand-computed numbers, and the
Tensor Core check and precision map on ResNet-50 (shape inference only, fast)."""
import json

import mxnet as mx
import numpy as np
import pytest
from mxnet import autograd
from mxnet.gluon import nn

from mxfp16 import cast_symbol
from mxfp16.models import get_network
from mxfp16.report import ReportConfig, build_report, parse_shape, parse_size, render_markdown, \
    render_text, save_report
from mxfp16.models import strip_loss_head
from mxfp16.report.graph_info import inspect_graph
from mxfp16.report.memory import activation_bytes, max_batch_size, memory_report, parameter_bytes
from mxfp16.report.precision_map import precision_map
from mxfp16.diagnose.probes import add_gradient_probes
from mxfp16.report.sequence import input_vocabulary
from mxfp16.report.speedup import (GPU_SPECS, PUBLISHED_SPEEDUPS, estimate_speedup, layer_time,
                                   rnn_forward_flops)
from mxfp16.report.tensor_cores import check_tensor_cores
from mxfp16.report.underflow import (FLOAT16_MIN_SUBNORMAL, HISTOGRAM_EXPONENTS, gradient_stats,
                                     gradient_underflow, random_batches, recommend_loss_scale)


def _symbol(net):
    return net(mx.sym.var("data"))


def _analyse(net, data_shape):
    sym = _symbol(net)
    info = inspect_graph(sym, {"data": data_shape})
    return sym, info, check_tensor_cores(info, sym, data_shape[0])


def _misaligned_net():
    """conv 8->30, conv 30->61, conv 61->64, dense 64->16: three layers break the rule."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(30, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(61, 3, padding=1), nn.Activation("relu"), nn.Conv2D(64, 1),
            nn.GlobalAvgPool2D(), nn.Dense(16))
    return net


def test_tensor_cores_lists_exactly_the_misaligned_layers():
    net = _misaligned_net()
    _, _, report = _analyse(net, (8, 8, 6, 6))
    conv0, conv1, conv2 = (f"{net[i].name}_fwd" for i in (0, 3, 5))
    assert report["violations"] == [conv0, conv1, conv2]
    by_name = {layer["name"]: layer for layer in report["layers"]}
    assert by_name[conv0]["suggestions"] == {"out_channels": 32}
    assert by_name[conv1]["suggestions"] == {"in_channels": 32, "out_channels": 64}
    assert by_name[conv2]["suggestions"] == {"in_channels": 64}
    assert by_name[conv1]["dims"] == {"batch": 8, "in_channels": 30, "out_channels": 61}
    dense = by_name[f"{net[7].name}_fwd"]
    assert dense["eligible"] and dense["dims"] == {"M": 8, "N": 16, "K": 64}
    assert report["batch_size_ok"] and not any(layer["padded_by_cudnn"] for layer in report["layers"])


def test_tensor_cores_batch_size_is_checked_for_every_layer():
    net = _misaligned_net()
    _, _, report = _analyse(net, (12, 8, 6, 6))
    assert not report["batch_size_ok"] and report["suggested_batch_size"] == 16
    assert len(report["violations"]) == len(report["layers"]) == 4
    dense = report["layers"][-1]
    assert dense["violations"] == {"M": 12} and dense["suggestions"] == {"M": 16}


def test_tensor_cores_grouped_depthwise_and_deconvolution():
    net = nn.HybridSequential()
    net.add(nn.Conv2D(48, 3, padding=1, groups=4),  # 48 -> 48 in 4 groups: 12 channels per group
            nn.Conv2D(48, 3, padding=1, groups=48),  # depthwise
            nn.Conv2DTranspose(30, 2, strides=2))
    _, _, report = _analyse(net, (8, 48, 4, 4))
    grouped, depthwise, deconv = report["layers"]
    assert grouped["dims"] == {"batch": 8, "in_channels": 12, "out_channels": 12}
    assert grouped["suggestions"] == {"in_channels": 64, "out_channels": 64}  # 16 per group x 4
    assert not depthwise["eligible"] and depthwise["suggestions"] == {}
    assert "depthwise" in depthwise["note"]
    assert deconv["op"] == "Deconvolution" and deconv["suggestions"] == {"out_channels": 32}
    assert deconv["output_shape"] == [8, 30, 8, 8]


def test_resnet50_batch_256_breaks_the_rule_only_at_the_rgb_stem():
    sym = _symbol(get_network("resnet50_v1"))
    info = inspect_graph(sym, {"data": (256, 3, 224, 224)})
    report = check_tensor_cores(info, sym, 256)
    assert len(report["layers"]) == 54  # 53 convolutions + the classifier
    broken = [layer for layer in report["layers"] if not layer["eligible"]]
    assert [layer["name"] for layer in broken] == report["violations"]
    (stem,) = broken
    assert stem["input_shape"] == [256, 3, 224, 224] and stem["weight_shape"] == [64, 3, 7, 7]
    assert stem["violations"] == {"in_channels": 3} and stem["suggestions"] == {"in_channels": 8}
    assert stem["padded_by_cudnn"] and "cuDNN pads" in stem["note"]


def test_resnet50_precision_map():
    sym = _symbol(get_network("resnet50_v1"))
    report = precision_map(sym, cast_symbol(sym, "float16", emulate=False))
    assert report["ops"]["Convolution"] == {"float16": 53}
    assert report["ops"]["BatchNorm"] == {"float16": 53}  # float16 data, float32 parameters
    assert report["casts"] == {"inserted": 2, "to_float16": 1, "to_float32": 1}
    assert report["float32_ops"] == 0 and report["float16_ops"] == len(report["layers"])


def test_precision_map_keeps_softmax_and_layernorm_in_float32():
    data = mx.sym.var("data")
    fc = mx.sym.FullyConnected(data, num_hidden=8, name="fc")
    norm = mx.sym.LayerNorm(fc, mx.sym.var("ln_gamma"), mx.sym.var("ln_beta"), name="ln")
    sym = mx.sym.softmax(mx.sym.FullyConnected(norm, num_hidden=4, name="fc2"), name="sm")
    report = precision_map(sym, cast_symbol(sym, "float16", emulate=False))
    dtypes = {layer["name"]: layer["dtype"] for layer in report["layers"]}
    assert dtypes == {"fc": "float16", "ln": "float32", "fc2": "float16", "sm": "float32"}
    assert report["casts"]["to_float32"] == 2 and report["casts"]["to_float16"] == 2


def _small_net():
    """conv 4->8 (3x3, bias) + BatchNorm(8) + dense 512->10 on 4x8x8 inputs."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1, in_channels=4), nn.BatchNorm(in_channels=8), nn.Dense(10))
    return net


# Hand count of _small_net: conv 8*4*3*3 + 8 = 296, BatchNorm gamma + beta 16 (trainable) and
# running mean + var 16 (aux), dense 10*512 + 10 = 5130.  296 + 5130 = 5426 become float16.
TRAINABLE, HALF, AUX = 296 + 16 + 5130, 296 + 5130, 16
# Activations per sample, by the documented model: data 4*8*8 = 256, conv 512, BN 512, dense 10;
# float16 adds the data's float16 copy (256) and the logits' float32 copy (10).
ACT32 = (256 + 512 + 512 + 10) * 4
ACT16 = 256 * 4 + 256 * 2 + 512 * 2 + 512 * 2 + 10 * 2 + 10 * 4


@pytest.mark.parametrize("optimizer, states", [("sgd", 1), ("adam", 2), ("none", 0)])
def test_parameter_bytes_by_hand(optimizer, states):
    sym = _symbol(_small_net())
    shapes = {"data": (2, 4, 8, 8)}
    p32 = parameter_bytes(inspect_graph(sym, shapes), optimizer=optimizer)
    p16 = parameter_bytes(inspect_graph(cast_symbol(sym, "float16", emulate=False), shapes),
                          optimizer=optimizer)
    assert p32 == {"weights": 4 * TRAINABLE, "gradients": 4 * TRAINABLE, "master_weights": 0,
                   "optimizer_state": 4 * states * TRAINABLE, "aux": 4 * AUX,
                   "total": (8 + 4 * states) * TRAINABLE + 4 * AUX, "num_parameters": TRAINABLE}
    weights16 = 2 * HALF + 4 * (TRAINABLE - HALF)  # BatchNorm gamma and beta stay float32
    assert p16 == {"weights": weights16, "gradients": weights16, "master_weights": 4 * HALF,
                   "optimizer_state": 4 * states * TRAINABLE, "aux": 4 * AUX,
                   "total": 2 * weights16 + 4 * HALF + 4 * states * TRAINABLE + 4 * AUX,
                   "num_parameters": TRAINABLE}


def test_activation_bytes_and_largest_batch_by_hand():
    sym = _symbol(_small_net())
    shapes = {"data": (2, 4, 8, 8)}
    info32 = inspect_graph(sym, shapes)
    info16 = inspect_graph(cast_symbol(sym, "float16", emulate=False), shapes)
    assert activation_bytes(info32) == 2 * ACT32 and activation_bytes(info16) == 2 * ACT16
    report = memory_report(info32, info16, batch_size=2, gpu_bytes=parse_size("1MiB"))
    fixed = 12 * TRAINABLE + 4 * AUX  # sgd: the same in both dtypes (2 + 2 + 4 + 4 = 4 + 4 + 4)
    assert report["float32"]["parameters"]["total"] == report["float16"]["parameters"]["total"] == fixed
    assert report["float32"]["activations_per_sample"] == ACT32
    assert report["float16"]["activations_per_sample"] == ACT16
    assert report["float32"]["max_batch_size"] == (2 ** 20 - fixed) // ACT32 == 190
    assert report["float16"]["max_batch_size"] == (2 ** 20 - fixed) // ACT16 == 269
    assert report["float16"]["max_batch_size_multiple_of_8"] == 264
    assert max_batch_size(100, 200, 10) == 0


@pytest.mark.parametrize("text, expected", [
    ("16GiB", 16 * 2 ** 30), ("16GB", 16 * 10 ** 9), ("40G", 40 * 2 ** 30), ("512mib", 2 ** 29),
    ("1.5 KiB", 1536), ("1000", 1000), ("2TB", 2 * 10 ** 12)])
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "16XB", "GiB", "-4GiB", "0G", "16 Gibibytes", "1e3"])
def test_parse_size_rejects_with_the_value_and_the_forms(text):
    with pytest.raises(ValueError, match=r"cannot read the memory size .*16GiB, 16GB, 40G"):
        parse_size(text)


def test_parse_shape():
    assert parse_shape("3,32,48") == (3, 32, 48) and parse_shape([1, 2, 3]) == (1, 2, 3)
    for bad in ("3,224", "3,x,2", "0,2,2"):
        with pytest.raises(ValueError, match="channels,height,width"):
            parse_shape(bad)


def test_layer_time_roofline_arithmetic():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=1024, name="fc")
    shapes = {"data": (256, 1024)}
    layer32 = inspect_graph(fc, shapes).layers[0]
    cast = cast_symbol(fc, "float16", emulate=False)
    layer16 = [layer for layer in inspect_graph(cast, shapes).layers if layer.name == "fc"][0]
    flops = 2 * 256 * 1024 * 1024
    elements = 256 * 1024 + 1024 * 1024 + 1024 + 256 * 1024  # data, weight, bias, output
    v100 = GPU_SPECS["V100"]
    check = check_tensor_cores(inspect_graph(fc, shapes), fc, 256)["layers"][0]
    assert layer_time(layer32, v100, "float32") == (pytest.approx(3 * flops / 15.7e12), "compute")
    assert layer_time(layer16, v100, "float16", check) == (pytest.approx(3 * flops / 125e12),
                                                           "compute")
    # ineligible: the same layer at the FP32 rate, float16 bytes
    assert layer_time(layer16, v100, "float16", dict(check, eligible=False))[0] == \
        pytest.approx(3 * flops / 15.7e12)
    relu = inspect_graph(mx.sym.relu(mx.sym.var("data")), shapes).layers[0]
    assert layer_time(relu, v100, "float16") == (pytest.approx(3 * 2 * 4 * 256 * 1024 / 900e9),
                                                  "memory")
    assert elements * 4 / 900e9 < flops / 15.7e12  # the FC is compute-bound


def test_resnet50_speedup_estimate_and_published_numbers():
    sym = _symbol(get_network("resnet50_v1"))
    shapes = {"data": (256, 3, 224, 224)}
    info32 = inspect_graph(sym, shapes)
    info16 = inspect_graph(cast_symbol(sym, "float16", emulate=False), shapes)
    checks = {c["name"]: c for c in check_tensor_cores(info32, sym, 256)["layers"]}
    tf32 = {c["name"]: c for c in check_tensor_cores(info32, sym, 256, 4)["layers"]}
    estimate = estimate_speedup(info32, info16, checks, tf32, 256)
    assert set(estimate) == {"V100", "A100", "H100"}
    assert estimate["V100"]["step_s"]["tf32"] is None and estimate["V100"]["speedup_vs_tf32"] is None
    for gpu in estimate.values():
        assert 2 < gpu["speedup_vs_float32"] < 8
        total = sum(row["float16_s"] for row in gpu["layers"])
        assert gpu["step_s"]["float16"] == pytest.approx(total)
    assert 1.5 < estimate["A100"]["speedup_vs_tf32"] < 3
    published = {round(p.speedup, 2) for p in PUBLISHED_SPEEDUPS}
    assert published == {1.62, 1.82, 3.58, 3.23}
    assert round(11.8 / 7.3, 2) == 1.62 and round(1376 / 384, 2) == 3.58
    assert round(3410.5 / 1055.8, 2) == 3.23


def test_recommend_loss_scale_arithmetic():
    assert recommend_loss_scale(1.0) == 4096.0  # 65504 / 8 = 8188 -> 2**12
    assert recommend_loss_scale(1.0, headroom=2) == 16384.0
    assert recommend_loss_scale(65504.0) == 1.0  # never below 1
    assert recommend_loss_scale(0.0) == 2.0 ** 24 and recommend_loss_scale(1e-12) == 2.0 ** 24
    assert recommend_loss_scale(float("inf")) == recommend_loss_scale(float("nan")) == 1.0
    with pytest.raises(ValueError, match="headroom must be >= 1"):
        recommend_loss_scale(1.0, headroom=0.5)


def test_gradient_stats_buckets():
    values = np.array([0.0, -2.0 ** -30, 2.0 ** -24, 3 * 2.0 ** -20, 1.0, -65505.0, np.inf])
    stats = gradient_stats(values)
    assert (stats["zeros"], stats["nonzero"], stats["nonfinite"]) == (1, 6, 1)
    assert (stats["underflow"], stats["subnormal"], stats["overflow"]) == (1, 2, 2)
    counts = dict(zip(HISTOGRAM_EXPONENTS, stats["counts"]))
    assert counts[-30] == counts[-24] == counts[-19] == counts[0] == counts[15] == 1
    assert sum(stats["counts"]) == 5 and stats["max_abs"] == 65505.0


def test_probe_gradient_equals_the_gradient_of_the_output():
    data = mx.sym.var("data")
    hidden = mx.sym.FullyConnected(data, num_hidden=5, name="fc1")
    out = mx.sym.FullyConnected(mx.sym.relu(hidden, name="r"), num_hidden=3, name="fc2")
    probed, probes, outputs = add_gradient_probes(out, {"fc1_output": "float16"})
    assert outputs == ["fc1_output"]
    rng = np.random.RandomState(0)
    args = {name: mx.nd.array(rng.standard_normal(shape)) for name, shape in
            zip(out.list_arguments(), out.infer_shape(data=(4, 6))[0])}
    arrays, grad = dict(args, **{probes[0]: mx.nd.zeros((4, 5))}), mx.nd.zeros((4, 5))
    executor = probed.bind(mx.cpu(), arrays, args_grad={probes[0]: grad},
                           grad_req={name: "write" if name == probes[0] else "null" for name in arrays})
    output = executor.forward(is_train=True)[0]
    executor.backward(out_grads=2 * output)  # the gradient of sum(output ** 2)
    h = mx.nd.FullyConnected(args["data"], args["fc1_weight"], args["fc1_bias"], num_hidden=5)
    h.attach_grad()
    with autograd.record():
        y = mx.nd.FullyConnected(mx.nd.relu(h), args["fc2_weight"], args["fc2_bias"], num_hidden=3)
        expected = mx.nd.sum(y ** 2)
    expected.backward()
    np.testing.assert_allclose(grad.asnumpy(), h.grad.asnumpy(), rtol=1e-5)


def _underflowing_net():
    """Two convolutions and a dense layer with 1e-3 weights: the gradients that reach the first
    layers are ~1e-9, below float16's smallest subnormal."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.Activation("relu"), nn.Conv2D(8, 3, padding=1),
            nn.GlobalAvgPool2D(), nn.Dense(4))
    net.initialize(mx.init.Normal(1e-3))
    return net


def test_underflow_is_reduced_by_the_recommended_scale():
    net = _underflowing_net()
    result = gradient_underflow(net, random_batches((4, 3, 8, 8), 4, steps=2))
    at_1, scaled = result["scale_1"], result["recommended"]
    assert at_1["underflow_fraction"] > 0.1
    assert scaled["underflow_fraction"] < at_1["underflow_fraction"]
    assert result["recommended_scale"] > 1 and scaled["loss_scale"] == result["recommended_scale"]
    largest = max(at_1["max_abs"], at_1["weight_grad_max"])
    scale = result["recommended_scale"]
    assert largest * scale * 8 <= 65504 < largest * scale * 16  # the largest power of two
    assert scaled["skipped_steps"] == at_1["skipped_steps"] == 0 and scaled["overflow"] == 0
    assert at_1["nonzero"] == sum(at_1["counts"]) + at_1["nonfinite"]
    assert at_1["underflow"] == sum(c for e, c in zip(result["exponents"], at_1["counts"])
                                    if 2.0 ** (e + 1) <= FLOAT16_MIN_SUBNORMAL)
    # one probe per float16 output, in graph order: conv, relu, conv, pooling, dense
    assert [row["output"] for row in result["layers"]] == [f"{block.name}_fwd_output" for block in net]


def test_underflow_weight_gradients_grow_with_the_training_batch():
    batches = random_batches((4, 3, 8, 8), 4, steps=1)
    small = gradient_underflow(_underflowing_net(), batches)
    large = gradient_underflow(_underflowing_net(), batches, training_batch_size=4 * 64)
    assert large["training_batch_size"] == 256
    assert large["recommended_scale"] < small["recommended_scale"]


def test_strip_loss_head():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=2, name="fc")
    assert strip_loss_head(mx.sym.SoftmaxOutput(fc, name="softmax")).list_outputs() == ["fc_output"]
    assert strip_loss_head(fc).list_outputs() == ["fc_output"]


@pytest.mark.slow
def test_build_render_and_save_report(tmp_path):
    config = ReportConfig("resnet18_v1", image_shape=(3, 16, 16), batch_size=8, num_classes=8,
                          gpus=("v100", "H100"), underflow_steps=1, underflow_batch_size=2)
    report = build_report(config)
    assert config.gpu_bytes == GPU_SPECS["V100"].memory and list(report["speedup"]["gpus"]) == \
        ["V100", "H100"]
    assert len(report["tensor_cores"]["violations"]) == 1 and report["speedup"]["published"] == []
    text = render_text(report)
    for title in ("1. Tensor Core eligibility", "2. Precision map", "3. Memory", "4. Estimated GPU",
                  "5. Activation-gradient underflow"):
        assert title in text and f"## {title}" in render_markdown(report)
    written = save_report(report, str(tmp_path / "r.json"), str(tmp_path / "r.md"),
                          str(tmp_path / "plots"))
    assert [p.rsplit("/", 1)[-1] for p in written] == [
        "r.json", "r.md", "gradient_histogram.png", "layer_times_V100.png", "layer_times_H100.png"]
    assert json.loads((tmp_path / "r.json").read_text())["network"] == "resnet18_v1"


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": ("P100",)}, "unknown GPU 'P100': choose one of V100, A100, H100"),
    ({"optimizer": "lbfgs"}, "unknown optimizer 'lbfgs'"),
    ({"batch_size": 0}, "batch_size must be a positive"),
    ({"underflow_steps": -1}, "underflow_steps must be >= 0"),
    ({"image_shape": (3, 224)}, "bad image shape"),
])
def test_report_config_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        ReportConfig(**kwargs)


def test_too_small_image_is_a_value_error():
    with pytest.raises(ValueError, match="shape inference failed"):
        build_report(ReportConfig("vgg11", image_shape=(3, 8, 8), batch_size=8,
                                  underflow_steps=0))


# Sequence models: the built-in LSTM language model (report.sequence), shape inference only unless
# underflow_steps is given.

def _lm_report(vocab, embed, hidden, batch_size=32, **kwargs):
    return build_report(ReportConfig("lstm_lm", vocab_size=vocab, embed_size=embed,
                                     hidden_size=hidden, batch_size=batch_size, gpus=("V100",),
                                     **dict({"underflow_steps": 0}, **kwargs)))


def _by_op(cores):
    return {layer["op"]: layer for layer in cores["layers"] + cores["embeddings"]}


def test_lstm_lm_wikitext2_sizes_break_the_rule_at_vocabulary_embedding_and_hidden():
    """GluonNLP's standard_lstm_lm_650 on WikiText-2: vocabulary 33278, 650 units, batch 32 x 35."""
    report = _lm_report(33278, 650, 650)
    assert report["data_shape"] == [32, 35]
    layers = _by_op(report["tensor_cores"])
    assert layers["FullyConnected"]["dims"] == {"M": 32 * 35, "N": 33278, "K": 650}
    assert layers["FullyConnected"]["suggestions"] == {"N": 33280, "K": 656}
    assert layers["RNN"]["dims"] == {"batch": 32, "input_size": 650, "hidden_size": 650}
    assert layers["RNN"]["suggestions"] == {"input_size": 656, "hidden_size": 656}
    assert layers["Embedding"]["dims"] == {"vocabulary": 33278, "embed_size": 650}
    assert layers["Embedding"]["suggestions"] == {"vocabulary": 33280, "embed_size": 656}
    assert not any(layer["eligible"] for layer in layers.values())
    # embedding V*E, two LSTM layers of 4H gates over (input + hidden) plus two biases, decoder H*V + V
    lstm = 2 * (4 * 650 * (650 + 650) + 2 * 4 * 650)
    assert report["memory"]["float32"]["parameters"]["num_parameters"] == \
        33278 * 650 + lstm + 650 * 33278 + 33278


def test_lstm_lm_padded_to_multiples_of_8_is_eligible_everywhere():
    cores = _lm_report(33280, 512, 512)["tensor_cores"]
    assert cores["violations"] == [] and cores["embedding_violations"] == []
    assert [layer["op"] for layer in cores["layers"]] == ["RNN", "FullyConnected"]


def test_rnn_runs_at_the_fp32_rate_in_mxnet_and_counts_its_gate_gemms():
    """MXNet 1.9.1's RNN op has no Tensor Core math: the same time in float16 as in float32 while
    compute-bound; the decoder, eligible, gets faster."""
    rows = {row["op"]: row for row in
            _lm_report(33280, 512, 512)["speedup"]["gpus"]["V100"]["layers"]}
    # one layer's input and recurrent GEMMs over 4 gates, for both layers, 35 steps of batch 32
    assert rows["RNN"]["forward_flops"] == 2 * 2 * 35 * 32 * 4 * 512 * (512 + 512)
    assert rows["RNN"]["float16_s"] == rows["RNN"]["float32_s"]
    assert rows["FullyConnected"]["float16_s"] < rows["FullyConnected"]["float32_s"] / 4


def test_lstm_lm_gradient_underflow_and_recommended_scale():
    report = _lm_report(40, 16, 16, batch_size=8, seq_len=5, num_layers=1, underflow_steps=1,
                        underflow_batch_size=4)
    underflow = report["underflow"]
    scale = underflow["recommended_scale"]
    assert scale >= 1 and np.log2(scale).is_integer()
    assert underflow["recommended"]["underflow_fraction"] <= underflow["scale_1"]["underflow_fraction"]
    assert underflow["scale_1"]["skipped_steps"] == underflow["recommended"]["skipped_steps"] == 0
    assert "5. Activation-gradient underflow" in render_text(report)


def test_report_config_sequence_length():
    assert ReportConfig("lstm_lm").seq_len == 35
    assert ReportConfig("resnet50_v1").seq_len is None
    with pytest.raises(ValueError, match="seq_len must be a positive"):
        ReportConfig("lstm_lm", seq_len=0)
    with pytest.raises(ValueError, match="vocab_size must be a positive whole number, got 0"):
        _lm_report(0, 16, 16)


def test_sequence_length_on_a_network_without_embedding_is_a_value_error():
    fc = mx.sym.FullyConnected(mx.sym.var("data"), num_hidden=4, name="fc")
    with pytest.raises(ValueError, match="the network has no Embedding"):
        input_vocabulary(inspect_graph(fc, {"data": (2, 5)}))


def test_rnn_flops_of_a_bidirectional_two_layer_gru():
    """Layer 1 reads 8 inputs, layer 2 the 2 x 16 outputs of both directions; 3 gates of 16."""
    gru = mx.gluon.rnn.GRU(16, num_layers=2, bidirectional=True, input_size=8)
    gru.initialize()
    info = inspect_graph(gru(mx.sym.var("data")), {"data": (5, 4, 8)})
    layer = next(layer for layer in info.layers if layer.op == "RNN")
    per_direction = 2 * 5 * 4 * 3 * 16
    assert rnn_forward_flops(layer) == 2 * per_direction * ((8 + 16) + (32 + 16))
    check = check_tensor_cores(info, gru(mx.sym.var("data")), 4)["layers"][0]
    assert check["dims"] == {"batch": 4, "input_size": 8, "hidden_size": 16}
    assert check["eligible"] is False and check["suggestions"] == {"batch": 8}
