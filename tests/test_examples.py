"""The scripts of examples/: each one's --help, and each one trained at a tiny size to its summary line.

The examples run in this process (their ``main(argv)``), as the scripts' tests do: importing MXNet
once keeps the whole file within seconds.  One test runs a script file as a user would.
"""
import ast
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import EXAMPLES_DIR, load_example

EXAMPLES = ("lstm_language_model", "dcgan", "gluon_image_classification",
            "module_image_classification", "bert_classifier", "preemptible_loop", "ssd_detection",
            "numpy_interface", "overflow_debugging")
IMAGE_EXAMPLES = ("gluon_image_classification", "module_image_classification")


def run_example(name, argv, capsys):
    """Run the example; return its exit code, the printed lines and its summary's key=value pairs."""
    code = load_example(name).main(argv)
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith(f"{name}: "), lines[-1]
    summary = dict(re.findall(r"(\S+)=(\S+)", lines[-1]))
    return code, lines, summary


def epoch_values(lines, key):
    """The float after ``key`` on each ``epoch N:`` line."""
    return [float(re.search(rf"{key} ([-\d.e+]+)", line).group(1))
            for line in lines if line.startswith("epoch ")]


@pytest.mark.parametrize("name", EXAMPLES)
def test_help_lists_every_flag_kebab_case_with_its_default(name, capsys):
    if name == "bert_classifier":
        pytest.importorskip("gluonnlp")
    example = load_example(name)
    with pytest.raises(SystemExit) as exit_info:
        example.main(["--help"])
    assert exit_info.value.code == 0
    assert "--dtype {float32,float16,bfloat16}" in capsys.readouterr().out
    actions = [a for a in example.get_args_parser()._actions if a.dest != "help"]
    assert {"--gpus", "--cpus", "--dtype"} <= {flag for a in actions for flag in a.option_strings}
    for action in actions:
        assert all(re.fullmatch(r"--[a-z0-9]+(-[a-z0-9]+)*", f) for f in action.option_strings)
        assert "(default: " in action.help, action.option_strings


@pytest.mark.parametrize("dtype, cpus", [("float32", "1"), ("float16", "1"), ("float16", "2"),
                                         ("bfloat16", "1")])
def test_lstm_language_model_learns_the_docstrings(dtype, cpus, capsys):
    code, lines, summary = run_example("lstm_language_model", [
        "--dtype", dtype, "--cpus", cpus, "--num-chars", "8000", "--hidden-size", "32", "--embed-size", "16",
        "--batch-size", "16", "--num-epochs", "2", "--lr", "0.01"], capsys)
    assert code == 0
    val = epoch_values(lines, "val loss")
    assert val[-1] < val[0] < 4.6  # below log(96), the loss of a uniform guess
    assert summary["dtype"] == dtype
    assert int(summary["vocab"]) % 8 == 0  # padded for Tensor Cores
    assert summary["skipped"] == "0"


@pytest.mark.slow
@pytest.mark.parametrize("dtype, shared", [("float32", False), ("float16", False),
                                           ("float16", True), ("bfloat16", False)])
def test_dcgan_generates_digits_closer_to_real_ones(dtype, shared, capsys):
    code, _, summary = run_example("dcgan", [
        "--dtype", dtype, "--num-epochs", "2", "--ngf", "32", "--ndf", "32", "--lr", "0.001"] +
        (["--shared-scaler"] if shared else []), capsys)
    assert code == 0
    assert float(summary["nn_dist"]) < 0.8 * float(summary["nn_dist_start"])
    assert np.isfinite([float(summary["d_loss"]), float(summary["g_loss"])]).all()
    if dtype == "float16":  # dynamic scaling: a power of two; shared, both Trainers see one scale
        assert math.log2(float(summary["g_scale"])).is_integer()
        assert (summary["g_scale"] == summary["d_scale"]) or not shared
    else:
        assert (summary["g_scale"], summary["d_scale"]) == ("1", "1")


@pytest.mark.slow
@pytest.mark.parametrize("name", IMAGE_EXAMPLES)
@pytest.mark.parametrize("dtype, cpus", [("float32", "1"), ("float16", "1"), ("float16", "2"),
                                         ("bfloat16", "1")])
def test_image_examples_learn_the_digits(name, dtype, cpus, capsys):
    code, lines, summary = run_example(name, ["--dtype", dtype, "--cpus", cpus, "--num-epochs", "3"],
                                       capsys)
    assert code == 0
    assert float(summary["val_acc"]) > 0.6  # 10 classes: a guess is 0.1; 0.84 to 0.98 seen
    losses = epoch_values(lines, "train loss")
    assert losses[-1] < losses[0]
    scale = float(summary["loss_scale"])
    assert math.log2(scale).is_integer() and (scale > 1) == (dtype == "float16")


@pytest.mark.parametrize("name", IMAGE_EXAMPLES)
def test_image_examples_run_on_synthetic_images_of_any_shape(name, capsys):
    code, _, summary = run_example(name, [
        "--data", "synthetic", "--image-shape", "3,12,12", "--num-classes", "4",
        "--num-examples", "40", "--batch-size", "8", "--num-epochs", "1"], capsys)
    assert (code, summary["dtype"], summary["epochs"]) == (0, "float16", "1")


@pytest.mark.slow
def test_overflow_debugging_names_the_scores_block_and_its_fix_reaches_float32s_loss(capsys):
    code, lines, summary = run_example("overflow_debugging", ["--num-epochs", "20"], capsys)
    assert code == 0 and summary["keep_float32"] == "['0']" and summary["culprits"] == "1"
    assert summary["float16_loss"] == "nan" and summary["skipped"] == "0"
    assert abs(float(summary["fixed_loss"]) - float(summary["float32_loss"])) <= 2e-4
    assert "   loss nan after 20 steps, 20 skipped" in lines


def test_overflow_debugging_refuses_a_dtype_with_float32s_range():
    with pytest.raises(ValueError, match=r"^--dtype bfloat16: the example shows a float16 "
                                         r"overflow, and bfloat16 has float32's range"):
        load_example("overflow_debugging").main(["--dtype", "bfloat16"])


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_numpy_interface_resnet_learns_the_digits_and_its_checkpoint_reloads(dtype, capsys):
    from mxnet import util
    code, lines, summary = run_example("numpy_interface", [
        "--dtype", dtype, "--num-epochs", "2", "--width", "8"], capsys)
    assert code == 0 and not util.is_np_array()  # the NumPy interface is off again
    assert float(summary["val_acc"]) > 0.5  # 10 classes: a guess is 0.1
    # the float32 model with the float32 checkpoint: the same predictions but for rounding
    assert abs(float(summary["reloaded_acc"]) - float(summary["val_acc"])) <= 0.01
    losses = epoch_values(lines, "train loss")
    assert losses[-1] < losses[0] and summary["skipped"] == "0"


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_bert_classifier_learns_which_module_a_sentence_documents(dtype, capsys):
    pytest.importorskip("gluonnlp")
    code, lines, summary = run_example("bert_classifier", [
        "--dtype", dtype, "--num-epochs", "4", "--num-layers", "1", "--units", "32",
        "--hidden-size", "64", "--max-len", "24", "--vocab-size", "500", "--dropout", "0",
        "--batch-size", "16", "--lr", "0.005"], capsys)
    assert code == 0
    losses = epoch_values(lines, "train loss")
    assert losses[-1] < 0.8 * losses[0] and losses[0] < 1.45  # log(4) = 1.39: a guess among 4
    # at this size validation accuracy is noisy (0.49 to 0.66 seen over seeds and dtypes; 0.94 at
    # the default size); the largest class is 42% of the sentences
    assert float(summary["val_acc"]) > 0.3
    assert (summary["classes"], summary["dtype"]) == ("4", dtype)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_ssd_detection_learns_the_digit_boxes(dtype, capsys):
    code, lines, summary = run_example("ssd_detection", [
        "--dtype", dtype, "--data-shape", "64", "--num-train", "64", "--num-val", "16",
        "--batch-size", "8", "--num-epochs", "2"], capsys)
    assert code == 0
    class_losses = epoch_values(lines, "class")
    assert class_losses[-1] < class_losses[0]  # 8 steps an epoch: the mAP is still near 0 here
    assert 0.0 <= float(summary["map"]) <= 1.0
    assert (summary["dtype"], summary["network"], summary["data_shape"]) == (dtype, "mobilenet0.25",
                                                                             "64")
    scale = float(summary["loss_scale"])
    assert math.log2(scale).is_integer() and (scale > 1) == (dtype == "float16")


def test_ssd_detection_names_a_bad_data_shape():
    with pytest.raises(ValueError, match=r"^--data-shape 100: pass a power of two >= 64, e\.g\. 128$"):
        load_example("ssd_detection").main(["--data-shape", "100"])


def test_the_examples_page_links_every_example_and_every_link_exists():
    page = open(os.path.join(os.path.dirname(EXAMPLES_DIR), "docs", "examples.md")).read()
    linked = set(re.findall(r"\(\.\./examples/([a-z_]+)\.py\)", page))
    scripts = {name[:-3] for name in os.listdir(EXAMPLES_DIR) if name.endswith(".py")}
    assert linked == set(EXAMPLES) and linked <= scripts


def test_examples_use_the_public_api_only():
    """An example is what a user writes: mxfp16's public names and mxfp16.models, never the
    training application (mxfp16.train) or the report's internals."""
    for name in os.listdir(EXAMPLES_DIR):
        if not name.endswith(".py"):
            continue
        tree = ast.parse(open(os.path.join(EXAMPLES_DIR, name)).read())
        modules = {alias.name for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names}
        modules |= {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        assert {m for m in modules if m.startswith("mxfp16.")} <= {"mxfp16.models"}, name


def test_ruff_checks_every_example():
    """tests/test_lint.py runs ruff over the repository: the examples must stay in its file list."""
    root = os.path.dirname(EXAMPLES_DIR)
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--show-files", "."], cwd=root,
                          capture_output=True, text=True, timeout=120)
    checked = {os.path.relpath(line.strip(), root) for line in done.stdout.splitlines()}
    scripts = {os.path.join("examples", name) for name in os.listdir(EXAMPLES_DIR)
               if name.endswith(".py")}
    assert scripts and scripts <= checked


@pytest.mark.skipif(__import__("mxnet").context.num_gpus() > 0, reason="a GPU is there")
def test_gpus_mxnet_cannot_see_are_a_usage_error():
    common = load_example("common")
    with pytest.raises(common.UsageError, match=r"--gpus 0: MXNet sees 0 GPU\(s\); leave --gpus out"):
        common.devices("0")


@pytest.mark.slow
def test_a_bad_flag_is_one_error_line_and_exit_code_2():
    result = subprocess.run([sys.executable, os.path.join(EXAMPLES_DIR, "lstm_language_model.py"),
                             "--gpus", "0", "--cpus", "2"], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --gpus 0 and --cpus 2 both choose the devices: pass one of them"]
