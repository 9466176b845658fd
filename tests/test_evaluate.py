"""scripts/evaluate.py and scripts/export.py on every kind of checkpoint, tiny runs made here; the
training scripts' checkpoints loaded the ways users load them (GluonCV's ``get_model(name)
.load_parameters``, ``SymbolBlock.imports``, ``mx.model.load_checkpoint``) in a process without
mxfp16; the LSTM language model's export and float16 inference."""
import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap

import mxnet as mx
import numpy as np
import pytest

from conftest import SCRIPTS_DIR, load_script_main
from test_examples import run_example

RUN = ["--network", "cifar_resnet20_v1", "--image-shape", "3,16,16", "--num-classes", "4",
       "--batch-size", "8", "--num-epochs", "1", "--max-batches", "2", "--dtype", "float16",
       "--lr", "0.05"]

#: Loads the scripts' checkpoints as a GluonCV user does, in plain MXNet + GluonCV.
ZOO_LOAD = """
import json, sys
import mxnet as mx, numpy as np
from gluoncv import model_zoo
out = {}
for path in sys.argv[1:]:
    model_zoo.get_model("cifar_resnet20_v1", classes=4)  # another scope count: cifarresnetv11_
    net = model_zoo.get_model("cifar_resnet20_v1", classes=4)
    net.load_parameters(path + "-0001.params")
    weight = net.collect_params()[net.prefix + "conv0_weight"].data().asnumpy()
    mx.gluon.SymbolBlock.imports(path + "-symbol.json", ["data"], path + "-0001.params")
    sym, args, aux = mx.model.load_checkpoint(path, 1)
    out[path] = {"prefix": net.prefix, "off_grid": int((weight.astype(np.float16) != weight).sum()),
                 "count": len(args) + len(aux)}
assert "mxfp16" not in sys.modules
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(image_folder, tmp_path_factory):
    """A float16 run of each API on the image folder: ``{api: prefix}``."""
    train = load_script_main("train_imagenet")
    prefixes = {}
    for api in ("gluon", "module"):
        prefixes[api] = str(tmp_path_factory.mktemp(api) / "r20")
        assert train(RUN + ["--api", api, "--data-dir", str(image_folder),
                            "--model-prefix", prefixes[api]]) == 0
    return prefixes


@pytest.fixture(scope="module")
def evaluate():
    return load_script_main("evaluate")


@pytest.fixture(scope="module")
def export():
    return load_script_main("export")


def summary(capsys):
    captured = capsys.readouterr()
    return captured.out.strip().splitlines()[-1], captured.err


@pytest.mark.slow
def test_checkpoints_load_into_the_zoo_network_with_the_master_weights(runs):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(ZOO_LOAD), *runs.values()],
                          capture_output=True, text=True, env=env, cwd="/", timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    for api, prefix in runs.items():
        assert loaded[prefix]["prefix"] in ("cifarresnetv11_", "cifarresnetv13_")  # any scope
        assert loaded[prefix]["off_grid"] > 0, api  # float32 masters, not float16-rounded values
        assert loaded[prefix]["count"] == 107


@pytest.mark.parametrize("kind", ["checkpoint", "epoch_on_records", "params_file", "export"])
def test_evaluate_scores_each_kind_of_checkpoint_in_float32_and_float16(
        runs, evaluate, export, image_folder, rec_files, tmp_path, capsys, kind):
    prefix = runs["gluon"]
    folder = ["--data-dir", str(image_folder), "--val-fraction", "0.25"]
    argv = {"checkpoint": ["--checkpoint", prefix] + folder,
            "epoch_on_records": ["--checkpoint", prefix + "-0001", "--data-val", rec_files.val_rec],
            "params_file": ["--network", "cifar_resnet20_v1", "--params-file",
                            prefix + "-0001.params", "--num-classes", "4", "--image-shape",
                            "3,16,16"] + folder,
            "export": ["--model-prefix", str(tmp_path / "deploy-float16"), "--image-shape",
                       "3,16,16", "--num-batches", "1"]}[kind]
    if kind == "export":  # the float16 GPU graph, evaluated from its float32 form
        assert export(["--checkpoint", prefix, "--output", str(tmp_path / "deploy"), "--dtype",
                       "float16"]) == 0
        capsys.readouterr()
    assert evaluate(argv + ["--dtype", "float32,float16", "--top-k", "2"]) == 0
    line, _ = summary(capsys)
    images = {"checkpoint": 12, "epoch_on_records": 12, "params_file": 12, "export": 32}[kind]
    assert re.fullmatch(rf"\S+ on .+ \({images} images\): float32 top-1 [\d.]+ top-2 [\d.]+ "
                        r"\([\d.]+ img/s\); float16 \(emulated on CPU\) top-1 [\d.]+ top-2 [\d.]+ "
                        r"agreement with float32 [\d.]+ \([\d.]+ img/s\)", line), line


@pytest.mark.slow
def test_the_checkpoint_and_its_params_file_score_alike(runs, evaluate, image_folder, capsys):
    folder = ["--data-dir", str(image_folder), "--val-fraction", "0.25", "--dtype", "float32"]
    scores = []
    for model in (["--checkpoint", runs["module"]],
                  ["--network", "cifar_resnet20_v1", "--params-file",
                   runs["module"] + "-0001.params", "--num-classes", "4",
                   "--image-shape", "3,16,16"]):
        assert evaluate(model + folder) == 0
        scores.append(summary(capsys)[0].split(": ", 1)[1])
    assert scores[0].split(" (")[0] == scores[1].split(" (")[0]  # same accuracy: same weights


def test_benchmark_gives_throughput_by_batch_size_for_each_dtype(runs, evaluate, capsys):
    assert evaluate(["--checkpoint", runs["gluon"], "--benchmark", "--batch-sizes", "1,4",
                     "--num-batches", "2", "--dtype", "float32,bfloat16"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    table = [line for line in lines if re.match(r"\s+\d+ \| [\d.]+ \| [\d.]+$", line)]
    assert [int(row.split("|")[0]) for row in table] == [1, 4]
    assert re.fullmatch(r"r20-0001 inference img/s at 3x16x16 on cpu\(0\), by batch size: "
                        r"1: float32 [\d.]+, bfloat16 [\d.]+; 4: float32 [\d.]+, bfloat16 [\d.]+",
                        lines[-1]), lines[-1]


def test_export_writes_checked_graphs_and_the_preprocessing(runs, export, tmp_path, capsys):
    out = str(tmp_path / "deploy" / "r20")
    assert export(["--checkpoint", runs["gluon"], "--output", out,
                   "--dtype", "float32,float16"]) == 0
    line, _ = summary(capsys)
    assert "float32 " in line and "outputs reproduced (max difference 0)" in line
    assert "107 parameters, dtypes as the graph infers them (23 float16, 84 float32)" in line
    prep = json.load(open(out + "-preprocessing.json"))
    assert prep["resize_shorter_side"] == 19 and prep["center_crop"] == [16, 16]  # 16 / 0.875
    assert prep["mean"] == [123.68, 116.779, 103.939] and prep["crop_ratio"] == 0.875
    args = mx.model.load_checkpoint(out + "-float16", 0)[1]
    assert {v.dtype.__name__ for v in args.values()} == {"float16", "float32"}


def test_an_exported_pair_is_benchmarked_with_the_preprocessing_export_wrote(runs, export,
                                                                             evaluate, tmp_path,
                                                                             capsys):
    out = str(tmp_path / "deploy" / "r20")
    assert export(["--checkpoint", runs["gluon"], "--output", out, "--dtype", "float32,float16"]) == 0
    for prefix in (out, out + "-float16"):  # the float16 pair reads its float32 twin's file
        assert evaluate(["--model-prefix", prefix, "--benchmark", "--batch-sizes", "1",
                         "--num-batches", "1", "--dtype", "float32"]) == 0
        line, _ = summary(capsys)
        assert " inference img/s at 3x16x16 on cpu(0)" in line, line
    assert evaluate(["--model-prefix", out, "--benchmark", "--batch-sizes", "1", "--num-batches",
                     "1", "--dtype", "float32", "--image-shape", "3,20,20"]) == 0
    assert " at 3x20x20 " in summary(capsys)[0]  # the flag still wins


BAD = [
    (["--network", "resnet18_v1", "--params-file", "{gluon}-0001.params"],
     r"does not hold the parameters of --network resnet18_v1 with --num-classes 1000"),
    (["--checkpoint", "{gluon}", "--network", "mobilenet0.25"],
     r"--network mobilenet0.25: the checkpoint r20-0001 is of cifar_resnet20_v1"),
    (["--model-prefix", "{gluon}", "--load-epoch", "7"],
     r"--load-epoch 7: the epochs saved are 1; pass one of them"),
    (["--checkpoint", "{gluon}-0003"], r"no checkpoint .*r20-0003"),
    (["--checkpoint", "{gluon}", "--dtype", "float8"], r"--dtype float8: "),
    (["--checkpoint", "{gluon}", "--num-classes", "10"], r"the model has 4 classes"),
    ([], r"no model given: pass one of --checkpoint"),
    (["--checkpoint", "{gluon}", "--gpus", "0"], r"--gpus 0 needs GPU 0 but MXNet finds 0 GPU"),
]


@pytest.mark.parametrize("flags, message", BAD)
def test_bad_input_gives_one_line_and_exit_code_2(runs, evaluate, capsys, flags, message):
    if "--gpus" in flags and mx.context.num_gpus():
        pytest.skip("this machine has the GPU")
    assert evaluate([f.format(**runs) for f in flags]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and err.startswith("error: "), err
    assert re.search(message, err), err


@pytest.mark.parametrize("name", ["evaluate", "export"])
def test_every_flag_is_kebab_case_and_says_its_default(name):
    spec = importlib.util.spec_from_file_location(f"help_{name}", os.path.join(SCRIPTS_DIR,
                                                                               f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    actions = [a for a in module.get_args_parser()._actions if a.option_strings[0] != "-h"]
    assert [a.option_strings[0] for a in actions if "(default: " not in (a.help or "")] == []
    assert all(re.fullmatch(r"--?[a-z0-9]+(-[a-z0-9]+)*", flag)
               for a in actions for flag in a.option_strings)


@pytest.mark.slow
def test_lstm_language_model_exports_and_runs_in_float16(tmp_path, capsys):
    prefix = str(tmp_path / "lm")
    code, lines, _ = run_example("lstm_language_model", [
        "--dtype", "float16", "--num-chars", "6000", "--hidden-size", "32", "--embed-size", "16",
        "--batch-size", "16", "--num-epochs", "1", "--export", prefix], capsys)
    assert code == 0
    export_line = lines[-2]
    ppl32, ppl16 = map(float, re.findall(r"val_ppl=([\d.]+)", export_line))
    assert abs(ppl16 - ppl32) < 0.02 * ppl32 and "float16 (emulated on CPU)" in export_line
    args, aux = mx.model.load_checkpoint(prefix + "-float16", 0)[1:]
    assert {k: v.dtype.__name__ for k, v in args.items()} == {k: "float16" for k in args}
    assert {v.dtype.__name__ for v in mx.model.load_checkpoint(prefix, 0)[1].values()} == \
        {"float32"}
    # The block's prefix counts the CharLMs made before it in this process (charlm0, charlm1, ...).
    weight = next(name for name in args if name.endswith("_dense0_weight"))
    np.testing.assert_array_equal(  # the float16 weights are the float32 ones rounded
        mx.model.load_checkpoint(prefix, 0)[1][weight].astype("float16").asnumpy(),
        args[weight].asnumpy())
    if importlib.util.find_spec("onnx") is None:
        assert "onnx: not written" in export_line
        return
    from mxfp16.onnx_export import onnx_summary, run_onnxruntime, compare_outputs
    summaries = [onnx_summary(f"{prefix}{suffix}.onnx") for suffix in ("", "-float16")]
    assert [s["inputs"] for s in summaries] == [{"data": [None, 32]}] * 2
    assert [[t for t in s["dtypes"] if t.startswith("float")] for s in summaries] == \
        [["float32"], ["float16"]]  # weights; int64 shape constants beside them
    python = os.environ.get("MXFP16_ONNXRUNTIME_PYTHON")
    if python:  # onnxruntime reproduces MXNet's float32 logits, float16 within its rounding
        data = np.random.RandomState(0).randint(0, 64, (2, 32)).astype(np.float32)
        plain = mx.gluon.SymbolBlock.imports(prefix + "-symbol.json", ["data"],
                                             prefix + "-0000.params")
        reference = plain(mx.nd.array(data)).asnumpy()
        for suffix, tolerance in (("", 1e-5), ("-float16", 1e-2)):
            outputs = run_onnxruntime(python, f"{prefix}{suffix}.onnx", data)[0]
            assert compare_outputs(reference, outputs)[0] < tolerance * max(
                1.0, np.abs(reference).max())
