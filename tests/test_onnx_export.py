"""ONNX export (mxfp16.onnx_export, scripts/export.py --onnx): the checker, the shapes, onnxruntime
where an interpreter with it is given, and the errors for what MXNet 1.9.1 cannot export.

Needs ``onnx<1.19`` (in ``.[test]`` and ``.[onnx]``); skipped visibly without it.  onnxruntime needs
numpy >= 1.24, which MXNet 1.9.1 cannot import, so it runs in its own venv, named by
``MXFP16_ONNXRUNTIME_PYTHON`` (see docs/deployment.md).
"""
import importlib.util
import re
import sys

import mxnet as mx
import pytest

import mxfp16
from conftest import load_script_main
from mxfp16.models import new_network
from mxfp16.onnx_export import default_onnxruntime_python, import_onnx, onnx_summary
from mxfp16.train.gluon_api import gluon_network

needs_onnx = pytest.mark.skipif(
    importlib.util.find_spec("onnx") is None,
    reason="onnx is not installed: pip install 'onnx<1.19' (or pip install -e '.[test]')")


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    """A float32 CIFAR ResNet-20 (4 classes) exported as an MXNet pair: its prefix."""
    mx.random.seed(0)
    block, _ = gluon_network(new_network("cifar_resnet20_v1", 4, (3, 16, 16)), [mx.cpu()],
                             "float32")
    prefix = str(tmp_path_factory.mktemp("onnx") / "net")
    mxfp16.export(block, prefix)
    return prefix


def run_export(exported, tmp_path, capsys, *flags):
    code = load_script_main("export")(["--model-prefix", exported, "--image-shape", "3,16,16",
                                       "--output", str(tmp_path / "out"), *flags])
    captured = capsys.readouterr()
    return code, captured.out.strip().splitlines()[-1] if code == 0 else captured.err


def test_a_missing_or_too_new_onnx_is_one_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "onnx", None)
    with pytest.raises(RuntimeError, match=r"pip install 'onnx<1.19'"):
        import_onnx()


@needs_onnx
def test_the_onnx_file_passes_the_checker_with_the_networks_shapes(exported, tmp_path, capsys):
    code, line = run_export(exported, tmp_path, capsys, "--onnx")
    assert code == 0, line
    assert re.search(r"ONNX float32 \S+out.onnx \(opset 13, checker passed, input "
                     r"\[None, 3, 16, 16\]", line), line
    summary = onnx_summary(str(tmp_path / "out.onnx"))
    assert summary["inputs"] == {"data": [None, 3, 16, 16]}
    assert summary["initializers"] == 107 and summary["dtypes"] == ["float32"]
    assert summary["opset"] == 13 and len(summary["outputs"]) == 1


@needs_onnx
def test_onnxruntime_reproduces_mxnets_outputs(exported, tmp_path, capsys):
    python = default_onnxruntime_python()
    if not python:
        pytest.skip("no onnxruntime interpreter: set MXFP16_ONNXRUNTIME_PYTHON to the python of a "
                    "venv with onnxruntime (it needs numpy>=1.24, MXNet 1.9.1 numpy<1.24)")
    code, line = run_export(exported, tmp_path, capsys, "--onnx", "--opset", "12",
                            "--onnxruntime-python", python)
    assert code == 0, line
    found = re.search(r"onnxruntime [\d.]+: max difference ([\d.e+-]+), agreement 1.0000", line)
    assert found and float(found.group(1)) < 1e-4, line


@needs_onnx
@pytest.mark.parametrize("flags, message", [
    (["--onnx", "--opset", "11"], r"ONNX opset 11: MXNet 1.9.1 exports opsets 12, 13 only"),
    (["--onnx", "--dtype", "float16"],
     r"cannot write this graph at opset 13 \(.*BatchNormalization.*\): export the float32 graph"),
])
def test_what_mxnet_cannot_export_is_one_error_line(exported, tmp_path, capsys, flags, message):
    code, err = run_export(exported, tmp_path, capsys, *flags)
    assert code == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


@needs_onnx
def test_float32_and_float16_with_onnx_write_the_float32_file_and_skip_the_float16_one(
        exported, tmp_path, capsys):
    """The guide's export command on a BatchNorm network: MXNet cannot write its float16 graph to
    ONNX, so that file is skipped with a note, and everything else is written."""
    code, line = run_export(exported, tmp_path, capsys, "--onnx", "--dtype", "float32,float16")
    assert code == 0, line
    assert re.search(r"ONNX float32 \S+out.onnx \(opset 13, checker passed", line), line
    assert re.search(r"ONNX float16 skipped \(MXNet's ONNX exporter cannot write this graph at "
                     r"opset 13 \(.*BatchNormalization.*\); \S+out.onnx is the ONNX file to deploy\)",
                     line), line
    assert line.endswith("out-preprocessing.json")
    written = sorted(path.name for path in tmp_path.iterdir())
    assert "out.onnx" in written and "out-float16.onnx" not in written
    assert {"out-float16-symbol.json", "out-preprocessing.json"} <= set(written)
