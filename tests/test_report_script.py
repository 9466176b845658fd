"""End-to-end tests of scripts/report.py's main() on tiny checkpoints made in the test."""
import json
import math

import mxnet as mx
import pytest
from mxnet.gluon import nn

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture
def report_main(script_main):
    return script_main("report")


def _tiny_net():
    """conv 3->8 (the RGB stem), conv 8->12 and dense 12->4 (N = 4, K = 12) break the rule."""
    net = nn.HybridSequential()
    net.add(nn.Conv2D(8, 3, padding=1), nn.BatchNorm(), nn.Activation("relu"),
            nn.Conv2D(12, 3, padding=1), nn.GlobalAvgPool2D(), nn.Dense(4))
    net.initialize()
    net.hybridize()
    net(mx.nd.ones((1, 3, 8, 8)))
    return net


def _module_checkpoint(net, prefix, epoch):
    """A Module-style checkpoint: the network under a SoftmaxOutput head."""
    sym = mx.sym.SoftmaxOutput(net(mx.sym.var("data")), name="softmax")
    params = {name: param.data() for name, param in net.collect_params().items()}
    aux_names = set(sym.list_auxiliary_states())
    mx.model.save_checkpoint(prefix, epoch, sym,
                             {k: v for k, v in params.items() if k not in aux_names},
                             {k: v for k, v in params.items() if k in aux_names})


@pytest.mark.parametrize("kind", ["gluon_export", "module_checkpoint"])
def test_main_writes_json_markdown_and_plots(kind, report_main, tmp_path, capsys):
    prefix = str(tmp_path / "tiny")
    if kind == "gluon_export":
        _tiny_net().export(prefix, epoch=1)
    else:
        _module_checkpoint(_tiny_net(), prefix, 1)
    out = tmp_path / "out"
    code = report_main(["--checkpoint", prefix, "--epoch", "1", "--image-shape", "3,8,8",
                        "--batch-size", "16", "--gpu", "A100", "--gpu-mem", "40G",
                        "--underflow-steps", "2", "--underflow-batch-size", "2",
                        "--compare", "float16", "--compare-batch-size", "2",
                        "--json", str(out / "report.json"), "--markdown", str(out / "report.md"),
                        "--plots", str(out / "plots")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "Float16 precision report: tiny" in captured.out and "wrote " in captured.out
    report = json.loads((out / "report.json").read_text())
    cores = report["tensor_cores"]
    broken = [layer["suggestions"] for layer in cores["layers"] if not layer["eligible"]]
    assert broken == [{"in_channels": 8}, {"out_channels": 16}, {"N": 8, "K": 16}]
    assert cores["layers"][0]["padded_by_cudnn"]  # the 3-channel first layer
    assert report["memory"]["gpu_bytes"] == 40 * 2 ** 30
    assert list(report["speedup"]["gpus"]) == ["A100"]
    scale = report["underflow"]["recommended_scale"]
    assert scale >= 1 and scale == 2 ** round(math.log2(scale))
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# Float16 precision report: tiny")
    assert "## 5. Activation-gradient underflow" in markdown and "| layer | op |" in markdown
    compare = report["compare"]  # every op of the graph, in float16 against float32
    assert compare["dtype"] == "float16" and compare["first_beyond_tolerance"] is None
    assert [layer["op_type"] for layer in compare["layers"]][:3] == \
        ["Convolution", "BatchNorm", "Activation"]
    assert "## 6. Layer by layer against float32" in markdown and "Every layer is within it." \
        in captured.out
    for name in ("gradient_histogram.png", "layer_times_A100.png", "error_by_layer.png"):
        assert (out / "plots" / name).read_bytes()[:8] == PNG_MAGIC


def test_lstm_language_model_report_suggests_the_padded_vocabulary(report_main, capsys):
    code = report_main(["--network", "lstm_lm", "--vocab-size", "33278", "--hidden-size", "650",
                        "--embed-size", "650", "--batch-size", "32", "--gpu", "V100",
                        "--underflow-steps", "0"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Input 32x35 (batch size 32)" in out and "float16 seq/s" in out
    assert "N 33278 -> 33280" in out and "hidden_size 650 -> 656" in out
    assert "vocabulary 33278 -> 33280, embed_size 650 -> 656" in out


def test_a_saved_language_model_is_reported_with_its_sequence_length(report_main, tmp_path,
                                                                      capsys):
    from mxfp16.report.sequence import LSTMLanguageModel
    net = LSTMLanguageModel(vocab_size=50, embed_size=16, hidden_size=24, num_layers=1)
    net.initialize()
    net.hybridize()
    net(mx.nd.zeros((2, 5)))
    prefix = str(tmp_path / "lm")
    net.export(prefix, epoch=3)
    code = report_main(["--checkpoint", prefix, "--epoch", "3", "--seq-len", "6", "--batch-size",
                        "8", "--gpu", "V100", "--underflow-steps", "1", "--underflow-batch-size", "2"])
    out = capsys.readouterr().out
    assert code == 0
    assert "Input 8x6 (batch size 8)" in out and "Layers breaking the rule: " in out
    assert "N 50 -> 56" in out and "5. Activation-gradient underflow" in out


@pytest.mark.parametrize("args, message", [
    (["--network", "resnet5O_v1"], "unknown network 'resnet5O_v1'"),
    (["--image-shape", "3,224"], "bad image shape '3,224'"),
    (["--gpu", "P100"], "unknown GPU 'P100'"),
    (["--gpu-mem", "16 gigs"], "cannot read the memory size '16 gigs'"),
    (["--batch-size", "many"], "invalid int value: 'many'"),
    (["--optimizer", "lbfgs"], "unknown optimizer 'lbfgs'"),
    (["--checkpoint", "MISSING"], "checkpoint file MISSING-symbol.json not found"),
    (["--network", "vgg11", "--image-shape", "3,8,8", "--underflow-steps", "0"],
     "shape inference failed"),
    (["--network", "lstm_lm", "--hidden-size", "-1"], "hidden_size must be a positive whole number"),
    (["--network", "resnet18_v1", "--seq-len", "8"], "Input data should be 4D"),
])
def test_bad_input_is_one_error_line_and_exit_2(args, message, report_main, tmp_path, capsys,
                                                monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert report_main(args) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message in lines[0]
    assert captured.out == ""
