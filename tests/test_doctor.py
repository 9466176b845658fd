"""``python -m mxfp16.doctor``: the real (CPU-only) machine, and GPU machines made of recorded
nvidia-smi output, a faked ``mx.runtime.Features`` and a faked GPU count."""
import json
import os
import pathlib
import platform
import stat
import subprocess
import sys
import types

import mxnet as mx
import numpy as np
import pytest

import mxfp16
from mxfp16.doctor import ENV_VARS, diagnose
from mxfp16.doctor.__main__ import main
from mxfp16.doctor.probe import (merge_gpus, parse_cpuinfo, parse_nvidia_smi, read_cpu,
                                 read_versions, run_nvidia_smi)
from mxfp16.doctor.render import render_text
from mxfp16.doctor.rules import bfloat16_native, find_problems

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: ``nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv,noheader``
#: on a machine with a V100, a T4 and an A100 (driver R525, whose nvidia-smi knows compute_cap).
SMI_V100_T4_A100 = ("Tesla V100-SXM2-16GB, 16384 MiB, 7.0, 525.85.12\n"
                    "Tesla T4, 15360 MiB, 7.5, 525.85.12\n"
                    "NVIDIA A100-SXM4-40GB, 40960 MiB, 8.0, 525.85.12\n")

#: The same query on a Pascal GeForce (no Tensor Cores).
SMI_GTX1080 = "NVIDIA GeForce GTX 1080, 8192 MiB, 6.1, 525.85.12\n"

#: An R450 driver's nvidia-smi rejects compute_cap; the query without it gives three columns.
SMI_V100_OLD_DRIVER = "Tesla V100-SXM2-16GB, 16160 MiB, 450.80.02\n"

#: The keys of a report, in JSON.
REPORT_KEYS = {"mxnet_version", "mxnet_distribution", "mxnet_import_error", "numpy_version",
               "gluoncv_version", "mxfp16_version", "python_version", "cuda_build", "features",
               "nvidia_driver", "gpus", "cpu", "env", "float16_mode", "bfloat16_native",
               "horovod", "warnings"}

CPU_ONLY_WARNING = (
    "MXNet 1.9.1 is a CPU-only build: float16 runs as CPU emulation, which computes every GEMM in "
    "float32 and rounds its inputs and outputs to float16, so it reproduces a GPU run's float16 "
    "numerics but trains slower than float32. Fix for NVIDIA GPUs: pip uninstall mxnet; "
    "pip install -e \".[cu112]\" (mxnet-cu112, CUDA 11.2, NVIDIA driver >= 460.27.03)")

#: The problem numpy 1.26.4 is, under MXNet 1.9.1.
NUMPY_1_26_WARNING = ("numpy 1.26.4 is too new: MXNet 1.9.1 reads numpy.bool (removed in numpy 1.24) "
                      "and numpy.PZERO (removed in 2.0), and fails to import. Fix: pip install "
                      "\"numpy<1.24\" (mxfp16's install pins it)")

#: What the CPU-only warning adds on a CPU that runs bfloat16 natively.
BFLOAT16_HINT = "; for speed on this CPU, train in bfloat16, which it runs natively"


def cpu_flags():
    with open("/proc/cpuinfo") as info:
        line = next(line for line in info if line.startswith("flags"))
    return set(line.split(":", 1)[1].split())


def smi_gpus_as_mxnet(smi_text):
    """What MXNet would report for the GPUs of a recorded nvidia-smi output."""
    return [{"memory_mib": gpu["memory_mib"], "compute_capability": gpu["compute_capability"]}
            for gpu in parse_nvidia_smi(smi_text)]


def gpu_machine(monkeypatch, smi_text, environ, mxnet_sees_gpus=True, numpy_version="1.23.5"):
    """The report of an mxnet-cu112 machine whose GPUs nvidia-smi describes as ``smi_text``:
    ``mx.runtime.Features`` says CUDA, CUDNN and NCCL, ``mx.context.num_gpus`` counts the GPUs."""
    features = {name: types.SimpleNamespace(enabled=feature.enabled)
                for name, feature in mx.runtime.Features().items()}
    for name in ("CUDA", "CUDNN", "NCCL"):
        features[name] = types.SimpleNamespace(enabled=True)
    monkeypatch.setattr(mx.runtime, "Features", lambda: features)
    mxnet_gpus = smi_gpus_as_mxnet(smi_text) if mxnet_sees_gpus else []
    monkeypatch.setattr(mx.context, "num_gpus", lambda: len(mxnet_gpus))
    versions = dict(read_versions(mx), mxnet_distribution="mxnet-cu112", numpy_version=numpy_version)
    return diagnose(environ=environ, nvidia_smi=smi_text, mxnet_gpus=mxnet_gpus,
                    versions=versions)


@pytest.mark.skipif(mx.context.num_gpus() > 0, reason="describes the CPU-only test machine")
def test_real_machine_report():
    report = diagnose(environ={})
    assert set(report) == REPORT_KEYS
    assert report["gpus"] == []
    assert report["nvidia_driver"] is None
    assert report["float16_mode"] == "cpu-emulation"
    assert report["features"]["MKLDNN"] is True and report["features"]["CUDA"] is False
    assert report["cpu"]["avx512_bf16"] == ("avx512_bf16" in cpu_flags())
    assert report["cpu"]["avx512"] == ("avx512f" in cpu_flags())
    assert report["bfloat16_native"] == ("avx512_bf16" in cpu_flags() or "amx_bf16" in cpu_flags())
    assert (report["mxnet_version"], report["mxnet_distribution"]) == ("1.9.1", "mxnet")
    assert report["numpy_version"] == np.__version__
    assert report["gluoncv_version"] == "0.10.5.post0"
    assert report["mxfp16_version"] == mxfp16.__version__
    assert report["python_version"] == platform.python_version()
    assert report["cuda_build"] is None
    assert report["env"] == {name: None for name in ENV_VARS}
    assert report["warnings"] == [
        CPU_ONLY_WARNING + (BFLOAT16_HINT if report["bfloat16_native"] else "")]


def test_main_json_is_valid_and_complete(capsys):
    assert main(["--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert set(report) == REPORT_KEYS
    assert set(report["cpu"]) == {"model", "avx512", "avx512_bf16", "amx", "f16c", "avx512_fp16"}
    assert all(isinstance(enabled, bool) for enabled in report["features"].values())


def test_main_text_has_every_section(capsys):
    assert main([]) == 0
    heads = [line.split(":")[0] for line in capsys.readouterr().out.splitlines()
             if line and not line.startswith(" ")]
    assert heads == ["Versions", "MXNet build", "Horovod", "GPUs", "CPU", "float16", "bfloat16",
                     "Environment (MXNet 1.9 variables that change float16 numerics or speed)",
                     heads[-1]]
    assert heads[-1].startswith("Problems")


@pytest.mark.slow
def test_bench_gives_measured_ratios(capsys):
    assert main(["--json", "--bench"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {(row["device"], row["dtype"]): row for row in report["bench"]}
    assert rows[("cpu", "float32")]["ratio_to_float32"] == 1.0
    expected = [("cpu", "float32")] + ([("cpu", "bfloat16")] if report["bfloat16_native"] else [])
    assert list(rows) == expected
    assert all(row["ratio_to_float32"] > 0 and row["size"] == 1024 for row in rows.values())


@pytest.mark.parametrize("argv, message", [
    (["--bogus"], "error: unrecognized arguments: --bogus\n"),
    (["extra"], "error: unrecognized arguments: extra\n"),
])
def test_bad_flag_is_one_error_line_and_exit_2(capsys, argv, message):
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    assert capsys.readouterr() == ("", message)


def test_parse_recorded_nvidia_smi():
    assert parse_nvidia_smi(SMI_V100_T4_A100) == [
        {"name": "Tesla V100-SXM2-16GB", "memory_mib": 16384, "compute_capability": "7.0",
         "driver_version": "525.85.12"},
        {"name": "Tesla T4", "memory_mib": 15360, "compute_capability": "7.5",
         "driver_version": "525.85.12"},
        {"name": "NVIDIA A100-SXM4-40GB", "memory_mib": 40960, "compute_capability": "8.0",
         "driver_version": "525.85.12"}]
    assert parse_nvidia_smi(SMI_V100_OLD_DRIVER) == [
        {"name": "Tesla V100-SXM2-16GB", "memory_mib": 16160, "compute_capability": None,
         "driver_version": "450.80.02"}]
    assert parse_nvidia_smi("Tesla T4, [N/A], [N/A], 525.85.12") == [
        {"name": "Tesla T4", "memory_mib": None, "compute_capability": None,
         "driver_version": "525.85.12"}]
    assert parse_nvidia_smi("") == []


def test_tensor_cores_by_compute_capability():
    gpus = merge_gpus([], parse_nvidia_smi(SMI_V100_T4_A100 + SMI_GTX1080))
    assert [(gpu["name"], gpu["tensor_cores_float16"], gpu["tensor_cores_bfloat16"])
            for gpu in gpus] == [("Tesla V100-SXM2-16GB", True, False), ("Tesla T4", True, False),
                                 ("NVIDIA A100-SXM4-40GB", True, True),
                                 ("NVIDIA GeForce GTX 1080", False, False)]
    assert [gpu["index"] for gpu in gpus] == [0, 1, 2, 3]


def test_mxnet_gpus_named_by_nvidia_smi_only_when_counts_agree():
    smi = parse_nvidia_smi(SMI_V100_T4_A100)
    mxnet_gpus = [{"memory_mib": 16384, "compute_capability": None}]
    assert merge_gpus(mxnet_gpus, smi) == [{
        "index": 0, "name": "GPU 0", "memory_mib": 16384, "compute_capability": None,
        "tensor_cores_float16": None, "tensor_cores_bfloat16": None, "source": "mxnet"}]
    assert merge_gpus(mxnet_gpus, smi[:1])[0]["name"] == "Tesla V100-SXM2-16GB"
    assert merge_gpus(mxnet_gpus, smi[:1])[0]["compute_capability"] == "7.0"


def test_gpu_machine_report_and_text(monkeypatch):
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, {"MXNET_SAFE_ACCUMULATION": "1"})
    assert report["float16_mode"] == "gpu"
    assert (report["cuda_build"], report["nvidia_driver"]) == ("11.2", "525.85.12")
    assert [gpu["source"] for gpu in report["gpus"]] == ["mxnet"] * 3
    assert report["warnings"] == []
    lines = render_text(report).splitlines()
    assert lines[lines.index("GPUs:      3, NVIDIA driver 525.85.12") + 1:][:3] == [
        "  0: Tesla V100-SXM2-16GB, 16384 MiB, compute capability 7.0, Tensor Cores: float16 yes, "
        "bfloat16 no (via mxnet)",
        "  1: Tesla T4, 15360 MiB, compute capability 7.5, Tensor Cores: float16 yes, bfloat16 no "
        "(via mxnet)",
        "  2: NVIDIA A100-SXM4-40GB, 40960 MiB, compute capability 8.0, Tensor Cores: float16 yes, "
        "bfloat16 yes (via mxnet)"]
    assert ("float16:   gpu: float16 operators on the GPU (Tensor Cores where the GPU has them)"
            in lines)


def test_horovod_without_mxnet_support_is_a_problem_with_its_fix():
    error = "Horovod has not been built with MXNet support enabled."
    report = diagnose(environ={}, nvidia_smi="", mxnet_gpus=[],
                      horovod={"version": "0.28.1", "mxnet": False, "error": error})
    problem = [warning for warning in report["warnings"] if warning.startswith("Horovod")]
    assert problem == [
        "Horovod 0.28.1 was built without MXNet: --kv-store horovod and launch.py --launcher "
        f"horovod cannot run (import horovod.mxnet: {error}). Fix: pip uninstall -y horovod, then "
        "reinstall it after MXNet with HOROVOD_WITH_MXNET=1 and --no-cache-dir "
        "--no-build-isolation (the README's second command shows the line)"]
    assert "Horovod:   0.28.1, WITHOUT MXNet support (see Problems)" in render_text(report)


@pytest.mark.parametrize("horovod, line", [
    ({"version": None, "mxnet": None, "error": None},
     "Horovod:   not installed (optional, for --kv-store horovod: the README's second command"),
    ({"version": "0.28.1", "mxnet": True, "error": None}, "Horovod:   0.28.1, with MXNet support")])
def test_horovod_line(horovod, line):
    report = diagnose(environ={}, nvidia_smi="", mxnet_gpus=[], horovod=horovod)
    assert not any(warning.startswith("Horovod") for warning in report["warnings"])
    assert line in render_text(report)


def test_horovod_read_from_the_machine():
    found = diagnose(environ={}, nvidia_smi="", mxnet_gpus=[])["horovod"]
    try:
        import horovod.mxnet  # noqa: F401
    except ImportError:
        assert found["mxnet"] is not True
    else:
        assert found["mxnet"] is True and found["version"] is not None


def test_bench_rows_in_text(monkeypatch):
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, {"MXNET_SAFE_ACCUMULATION": "1"})
    report["bench"] = [
        {"device": "gpu0", "dtype": "float32", "size": 4096, "seconds": 0.0125, "tflops": 11.0,
         "ratio_to_float32": 1.0},
        {"device": "gpu0", "dtype": "float16", "size": 4096, "seconds": 0.0025, "tflops": 55.0,
         "ratio_to_float32": 5.0}]
    assert render_text(report).splitlines()[-3:] == [
        "GEMM benchmark (square FullyConnected, best of the timed runs):",
        "  gpu0  float32   n=4096     12.50 ms   11.000 TFLOP/s   1.00x float32",
        "  gpu0  float16   n=4096      2.50 ms   55.000 TFLOP/s   5.00x float32"]


def test_warning_for_numpy_1_24(monkeypatch):
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, {"MXNET_SAFE_ACCUMULATION": "1"},
                         numpy_version="1.24.0")
    assert report["warnings"] == [
        "numpy 1.24.0 is too new: MXNet 1.9.1 reads numpy.bool (removed in numpy 1.24) and "
        "numpy.PZERO (removed in 2.0), and fails to import. Fix: pip install \"numpy<1.24\" "
        "(mxfp16's install pins it)"]


def test_warning_for_gpu_without_tensor_cores(monkeypatch):
    report = gpu_machine(monkeypatch, SMI_GTX1080, {"MXNET_SAFE_ACCUMULATION": "1"})
    assert report["warnings"] == [
        "GPU 0 (NVIDIA GeForce GTX 1080, compute capability 6.1) has no Tensor Cores: float16 "
        "halves memory there but does not speed up GEMMs. Fix: train in float32 on it, or use a "
        "GPU of compute capability 7.0 or above (V100, T4, A100, ...) for float16"]


@pytest.mark.parametrize("mxnet_sees_gpus", [True, False])
def test_warning_for_driver_older_than_the_builds_cuda(monkeypatch, mxnet_sees_gpus):
    report = gpu_machine(monkeypatch, SMI_V100_OLD_DRIVER, {"MXNET_SAFE_ACCUMULATION": "1"},
                         mxnet_sees_gpus=mxnet_sees_gpus)
    assert report["gpus"][0]["compute_capability"] is None  # neither MXNet (faked) nor nvidia-smi
    assert report["warnings"] == [
        "NVIDIA driver 450.80.02 is older than CUDA 11.2 (mxnet-cu112) needs: NVIDIA's table lists "
        "driver >= 460.27.03 for CUDA 11.2. Fix: upgrade the driver to 460.27.03 or later, or "
        "install an MXNet wheel built for an older CUDA"]


def test_warning_for_cuda_build_without_driver(monkeypatch):
    report = gpu_machine(monkeypatch, "", {}, mxnet_sees_gpus=False)
    assert report["float16_mode"] == "cpu-emulation"
    assert report["warnings"] == [
        "MXNet is built with CUDA 11.2 (mxnet-cu112) but finds no GPU and nvidia-smi reports none: "
        "float16 will run as CPU emulation. Fix: install NVIDIA driver >= 460.27.03 and make the "
        "GPUs visible (CUDA_VISIBLE_DEVICES, docker --gpus), or install the CPU build (pip "
        "uninstall mxnet-cu112; pip install -e \".[cpu]\")"]


def test_warning_for_gpus_that_mxnet_does_not_see(monkeypatch):
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, {"CUDA_VISIBLE_DEVICES": ""},
                         mxnet_sees_gpus=False)
    assert report["float16_mode"] == "cpu-emulation"
    assert report["warnings"] == [
        "nvidia-smi lists 3 GPU(s) but MXNet, built with CUDA 11.2 (mxnet-cu112), sees none: "
        "float16 will run as CPU emulation. Fix: check CUDA_VISIBLE_DEVICES (now '') and that the "
        "CUDA libraries load (python -c \"import mxnet; print(mxnet.context.num_gpus())\")"]


@pytest.mark.parametrize("value, warned", [(None, "unset"), ("0", "'0'"), ("1", None)])
def test_warning_for_safe_accumulation_on_gpus(monkeypatch, value, warned):
    environ = {} if value is None else {"MXNET_SAFE_ACCUMULATION": value}
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, environ)
    assert report["env"]["MXNET_SAFE_ACCUMULATION"] == value
    expected = [] if warned is None else [
        f"MXNET_SAFE_ACCUMULATION is {warned}: float16 reductions on the GPU (softmax, norms, "
        "sums) accumulate in float16 and lose precision. Fix: export MXNET_SAFE_ACCUMULATION=1"]
    assert report["warnings"] == expected


def test_no_safe_accumulation_warning_under_emulation():
    report = diagnose(environ={}, nvidia_smi="", mxnet_gpus=[])
    assert not any("MXNET_SAFE_ACCUMULATION" in warning for warning in report["warnings"])


def test_warnings_for_tensor_core_switch_and_onednn_name(monkeypatch):
    environ = {"MXNET_SAFE_ACCUMULATION": "1", "MXNET_CUDA_ALLOW_TENSOR_CORE": "0",
               "MXNET_ONEDNN_ENABLED": "0"}
    report = gpu_machine(monkeypatch, SMI_V100_T4_A100, environ)
    assert report["warnings"] == [
        "MXNET_CUDA_ALLOW_TENSOR_CORE is '0': float16 GEMMs cannot use the Tensor Cores. Fix: "
        "unset MXNET_CUDA_ALLOW_TENSOR_CORE",
        "MXNET_ONEDNN_ENABLED='0' has no effect: it is MXNet 2.0's name. Fix: set "
        "MXNET_MKLDNN_ENABLED=0 for MXNet 1.9"]


@pytest.mark.parametrize("flags, hint", [("avx512f avx512_bf16", BFLOAT16_HINT), ("avx512f", "")])
def test_cpu_build_on_a_gpu_machine_names_the_gpus(flags, hint):
    report = diagnose(environ={}, nvidia_smi=SMI_V100_T4_A100, mxnet_gpus=[],
                      features={"CUDA": False, "MKLDNN": True}, cpuinfo=f"flags\t: {flags}\n")
    assert [gpu["source"] for gpu in report["gpus"]] == ["nvidia-smi"] * 3
    assert report["warnings"] == [f"this machine has 3 NVIDIA GPU(s), but {CPU_ONLY_WARNING}{hint}"]


def test_parse_cpuinfo_of_a_sapphire_rapids_and_of_nothing():
    text = ("processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
            "flags\t\t: fpu sse f16c avx512f avx512_bf16 avx512_fp16 amx_bf16 amx_tile amx_int8\n"
            "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n")
    assert parse_cpuinfo(text) == {"model": "Intel(R) Xeon(R) Platinum 8480+", "avx512": True,
                                   "avx512_bf16": True, "amx": True, "f16c": True,
                                   "avx512_fp16": True}
    assert parse_cpuinfo("") == {"model": None, "avx512": None, "avx512_bf16": None, "amx": None,
                                 "f16c": None, "avx512_fp16": None}


@pytest.mark.parametrize("cpu, features, env, native", [
    ({"avx512_bf16": True, "amx": False}, {"MKLDNN": True}, {}, True),
    ({"avx512_bf16": False, "amx": True}, {"MKLDNN": True}, {}, True),
    ({"avx512_bf16": False, "amx": False}, {"MKLDNN": True}, {}, False),
    ({"avx512_bf16": True, "amx": False}, {"MKLDNN": False}, {}, False),
    ({"avx512_bf16": True, "amx": False}, {"MKLDNN": True}, {"MXNET_MKLDNN_ENABLED": "0"}, False),
    ({"avx512_bf16": None, "amx": None}, {"MKLDNN": True}, {}, False),
])
def test_bfloat16_native(cpu, features, env, native):
    assert bfloat16_native(cpu, features, env) is native


def write_fake_nvidia_smi(directory, knows_compute_cap):
    """An ``nvidia-smi`` that prints the recorded V100 line; an old one rejects compute_cap."""
    script = directory / "nvidia-smi"
    reject = 'case "$1" in *compute_cap*) echo "Field \\"compute_cap\\" is not a valid field ' \
             'to query." >&2; exit 2;; esac\n'
    line = SMI_V100_T4_A100.splitlines()[0] if knows_compute_cap else SMI_V100_OLD_DRIVER.strip()
    script.write_text("#!/bin/sh\n" + ("" if knows_compute_cap else reject) + f"echo '{line}'\n")
    script.chmod(script.stat().st_mode | stat.S_IXUSR)


@pytest.mark.parametrize("knows_compute_cap", [True, False])
def test_run_nvidia_smi_with_a_fake_executable(tmp_path, monkeypatch, knows_compute_cap):
    write_fake_nvidia_smi(tmp_path, knows_compute_cap)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    expected = SMI_V100_T4_A100.splitlines()[0] if knows_compute_cap else SMI_V100_OLD_DRIVER
    assert run_nvidia_smi().strip() == expected.strip()


def test_run_nvidia_smi_without_it(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    assert run_nvidia_smi() == ""


def test_env_table_has_one_line_reasons():
    assert all(var.reason and "\n" not in var.reason and var.advice for var in ENV_VARS.values())
    assert list(ENV_VARS)[0] == "MXNET_SAFE_ACCUMULATION"


def run_doctor_without_mxnet(tmp_path, *flags, error="AttributeError(NUMPY_BOOL)",
                             numpy_version="1.26.4"):
    """``python -m mxfp16.doctor FLAGS`` in a process whose ``import mxnet`` raises ``error``, as
    MXNet 1.9.1 does under numpy >= 1.24 (a fake ``mxnet`` first on the path), with a faked
    ``numpy.__version__`` and the V100 of a fake nvidia-smi on ``PATH``."""
    fake = tmp_path / "mxnet"
    fake.mkdir()
    (fake / "__init__.py").write_text(
        "NUMPY_BOOL = \"module 'numpy' has no attribute 'bool'.\\n`np.bool` was a deprecated "
        f"alias for the builtin `bool`.\"\nraise {error}\n")
    write_fake_nvidia_smi(tmp_path, knows_compute_cap=True)
    program = (f"import runpy, numpy; numpy.__version__ = {numpy_version!r}; "
               "runpy.run_module('mxfp16.doctor', run_name='__main__', alter_sys=True)")
    env = dict(os.environ, PYTHONPATH=str(tmp_path), MXNET_SAFE_ACCUMULATION="1",
               PATH=f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    return subprocess.run([sys.executable, "-c", program, *flags], cwd=ROOT, env=env,
                          capture_output=True, text=True)


def test_doctor_json_when_numpy_breaks_mxnet(tmp_path):
    done = run_doctor_without_mxnet(tmp_path, "--json", "--bench")
    assert (done.returncode, done.stderr) == (0, "")
    report = json.loads(done.stdout)
    assert set(report) == REPORT_KEYS | {"bench"}
    assert report["mxnet_import_error"] == "AttributeError: module 'numpy' has no attribute 'bool'."
    assert report["warnings"] == [NUMPY_1_26_WARNING]
    assert (report["mxnet_version"], report["mxnet_distribution"]) == ("1.9.1", "mxnet")
    assert report["numpy_version"] == "1.26.4"
    assert report["python_version"] == platform.python_version()
    assert (report["features"], report["float16_mode"], report["bfloat16_native"]) == ({}, None,
                                                                                        None)
    assert report["bench"] == []
    assert report["cpu"] == read_cpu()
    assert report["env"]["MXNET_SAFE_ACCUMULATION"] == "1"
    assert [(gpu["name"], gpu["tensor_cores_float16"], gpu["source"])
            for gpu in report["gpus"]] == [("Tesla V100-SXM2-16GB", True, "nvidia-smi")]


def test_doctor_text_when_numpy_breaks_mxnet(tmp_path):
    done = run_doctor_without_mxnet(tmp_path)
    assert (done.returncode, done.stderr) == (0, "")
    assert "Traceback" not in done.stdout
    lines = done.stdout.splitlines()
    assert lines[2] == ("MXNet build: unknown, import mxnet fails: AttributeError: module 'numpy' has "
                        "no attribute 'bool'.")
    assert lines[-3:] == [
        "Problems (1):",
        "  - numpy 1.26.4 is too new: MXNet 1.9.1 reads numpy.bool (removed in numpy 1.24) and "
        "numpy.PZERO",
        "    (removed in 2.0), and fails to import. Fix: pip install \"numpy<1.24\" (mxfp16's "
        "install pins it)"]
    assert "float16:   unknown: MXNet does not import" in lines


def test_doctor_names_another_import_failure(tmp_path):
    done = run_doctor_without_mxnet(
        tmp_path, "--json", numpy_version="1.23.5",
        error="OSError('libgfortran.so.5: cannot open shared object file: No such file or "
              "directory')")
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(done.stdout)["warnings"] == [
        "MXNet 1.9.1 (mxnet) is installed but does not import (OSError: libgfortran.so.5: cannot "
        "open shared object file: No such file or directory). Fix: run python -c \"import mxnet\" "
        "to see the whole error; a library it cannot load needs its system package, a broken "
        "install pip install --force-reinstall mxnet==1.9.1"]


def test_warning_when_mxnet_is_not_installed():
    report = {"numpy_version": "1.23.5", "mxnet_version": None, "mxnet_distribution": None,
              "mxnet_import_error": "ModuleNotFoundError: No module named 'mxnet'", "features": {},
              "cuda_build": None, "nvidia_driver": None, "gpus": [], "env": {},
              "float16_mode": None, "bfloat16_native": None}
    assert find_problems(report) == [
        "MXNet is not installed (ModuleNotFoundError: No module named 'mxnet'). Fix: pip install -e "
        "\".[cpu]\", or pip install -e \".[cu112]\" for NVIDIA GPUs"]
