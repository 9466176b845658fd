"""What the gathered facts mean for float16: Tensor Cores, native bfloat16 and the problems to fix.

Every function here is pure: it reads a report dict (see :func:`mxfp16.doctor.diagnose`), never the
machine, so each rule is tested with made-up machines.
"""
import re

from ..mxnet_import import numpy_too_new

#: Lowest compute capability whose Tensor Cores run each dtype: float16 from Volta (7.0; Turing
#: 7.5 too), bfloat16 from Ampere (8.0).
TENSOR_CORE_MIN_CAPABILITY = {"float16": (7, 0), "bfloat16": (8, 0)}

#: Lowest Linux driver for the CUDA versions of the MXNet 1.9.1 wheels (mxnet-cu102, -cu110,
#: -cu112, -cu117), from NVIDIA's "CUDA Toolkit and Corresponding Driver Versions" table in the
#: CUDA Toolkit release notes.
CUDA_MIN_DRIVER = {"10.2": "440.33", "11.0": "450.36.06", "11.2": "460.27.03", "11.7": "515.43.04"}


def version_tuple(text):
    """The leading numbers of a version string: ``'460.27.03'`` -> ``(460, 27, 3)``.

    Examples
    --------
    >>> version_tuple('1.24.0rc1'), version_tuple('7.5'), version_tuple('n/a')
    ((1, 24, 0), (7, 5), ())
    """
    match = re.match(r"\d+(\.\d+)*", text.strip())
    return tuple(int(part) for part in match.group(0).split(".")) if match else ()


def has_tensor_cores(compute_capability, dtype):
    """Whether a GPU of this compute capability has Tensor Cores for ``dtype``.

    Parameters
    ----------
    compute_capability : str or None
        ``'7.0'``, ``'8.6'``...; ``None`` when unknown.
    dtype : {'float16', 'bfloat16'}

    Returns
    -------
    bool or None
        ``None`` when the compute capability is unknown.

    Examples
    --------
    >>> has_tensor_cores('7.5', 'float16'), has_tensor_cores('7.5', 'bfloat16')
    (True, False)
    >>> has_tensor_cores('6.1', 'float16'), has_tensor_cores(None, 'float16')
    (False, None)
    """
    if not compute_capability:
        return None
    return version_tuple(compute_capability) >= TENSOR_CORE_MIN_CAPABILITY[dtype]


def bfloat16_native(cpu, features, env):
    """Whether MXNet runs bfloat16 GEMMs natively on this CPU: oneDNN (MKLDNN) is built in and not
    switched off, and the CPU has AVX512-BF16 or AMX instructions.

    Examples
    --------
    >>> bfloat16_native({"avx512_bf16": True, "amx": False}, {"MKLDNN": True}, {})
    True
    >>> bfloat16_native({"avx512_bf16": True}, {"MKLDNN": True}, {"MXNET_MKLDNN_ENABLED": "0"})
    False
    """
    onednn = bool(features.get("MKLDNN")) and env.get("MXNET_MKLDNN_ENABLED") != "0"
    return onednn and bool(cpu.get("avx512_bf16") or cpu.get("amx"))


def cuda_label(report):
    """``'CUDA 11.2 (mxnet-cu112)'``, or ``'CUDA (mxnet)'`` when the wheel does not say."""
    cuda = f"CUDA {report['cuda_build']}" if report.get("cuda_build") else "CUDA"
    return f"{cuda} ({report.get('mxnet_distribution') or 'mxnet'})"


def check_numpy(report):
    """numpy >= 1.24 breaks ``import mxnet`` 1.9.1."""
    version = report["numpy_version"]
    if not numpy_too_new(version):
        return []
    return [f"numpy {version} is too new: MXNet 1.9.1 reads numpy.bool (removed in numpy 1.24) and "
            "numpy.PZERO (removed in 2.0), and fails to import. Fix: pip install \"numpy<1.24\" "
            "(mxfp16's install pins it)"]


def check_mxnet_import(report):
    """``import mxnet`` fails for another reason than numpy (which :func:`check_numpy` names)."""
    error = report.get("mxnet_import_error")
    if not error or numpy_too_new(report["numpy_version"]):
        return []
    if not report.get("mxnet_distribution"):
        return [f"MXNet is not installed ({error}). Fix: pip install -e \".[cpu]\", or "
                "pip install -e \".[cu112]\" for NVIDIA GPUs"]
    return [f"MXNet {report['mxnet_version']} ({report['mxnet_distribution']}) is installed but does "
            f"not import ({error}). Fix: run python -c \"import mxnet\" to see the whole error; "
            "a library it cannot load needs its system package, a broken install pip install "
            f"--force-reinstall {report['mxnet_distribution']}==1.9.1"]


def check_tensor_cores(report):
    """Every GPU without float16 Tensor Cores (compute capability below 7.0)."""
    return [f"GPU {gpu['index']} ({gpu['name']}, compute capability {gpu['compute_capability']}) "
            "has no Tensor Cores: float16 halves memory there but does not speed up GEMMs. Fix: "
            "train in float32 on it, or use a GPU of compute capability 7.0 or above "
            "(V100, T4, A100, ...) for float16"
            for gpu in report["gpus"] if gpu["tensor_cores_float16"] is False]


def check_cuda_driver(report):
    """A CUDA build of MXNet without a driver, or with a driver older than its CUDA needs."""
    if not report["features"].get("CUDA"):
        return []
    build, driver = cuda_label(report), report.get("nvidia_driver")
    needed = CUDA_MIN_DRIVER.get(report.get("cuda_build"))
    if not report["gpus"]:
        wanted = f"NVIDIA driver >= {needed}" if needed else "an NVIDIA driver"
        wheel = report.get("mxnet_distribution") or "mxnet"
        return [f"MXNet is built with {build} but finds no GPU and nvidia-smi reports none: "
                f"float16 will run as CPU emulation. Fix: install {wanted} and make the GPUs "
                "visible (CUDA_VISIBLE_DEVICES, docker --gpus), or install the CPU build "
                f"(pip uninstall {wheel}; pip install -e \".[cpu]\")"]
    if driver and needed and version_tuple(driver) < version_tuple(needed):
        return [f"NVIDIA driver {driver} is older than {build} needs: NVIDIA's table lists driver "
                f">= {needed} for CUDA {report['cuda_build']}. Fix: upgrade the driver to "
                f"{needed} or later, or install an MXNet wheel built for an older CUDA"]
    if all(gpu["source"] == "nvidia-smi" for gpu in report["gpus"]):
        return [f"nvidia-smi lists {len(report['gpus'])} GPU(s) but MXNet, built with {build}, "
                "sees none: float16 will run as CPU emulation. Fix: check CUDA_VISIBLE_DEVICES "
                f"(now {report['env'].get('CUDA_VISIBLE_DEVICES')!r}) and that the CUDA libraries "
                "load (python -c \"import mxnet; print(mxnet.context.num_gpus())\")"]
    return []


def check_safe_accumulation(report):
    """Float16 on GPUs with MXNET_SAFE_ACCUMULATION other than 1."""
    value = report["env"].get("MXNET_SAFE_ACCUMULATION")
    if report["float16_mode"] != "gpu" or value == "1":
        return []
    shown = "unset" if value is None else f"{value!r}"
    return [f"MXNET_SAFE_ACCUMULATION is {shown}: float16 reductions on the GPU (softmax, norms, "
            "sums) accumulate in float16 and lose precision. Fix: export MXNET_SAFE_ACCUMULATION=1"]


def check_tensor_core_switch(report):
    """Float16 on GPUs with Tensor Cores switched off by MXNET_CUDA_ALLOW_TENSOR_CORE=0."""
    if report["float16_mode"] != "gpu" or report["env"].get("MXNET_CUDA_ALLOW_TENSOR_CORE") != "0":
        return []
    return ["MXNET_CUDA_ALLOW_TENSOR_CORE is '0': float16 GEMMs cannot use the Tensor Cores. "
            "Fix: unset MXNET_CUDA_ALLOW_TENSOR_CORE"]


def check_cpu_build(report):
    """A CPU-only MXNet: float16 is emulated, and says how to get the GPU build."""
    if report.get("mxnet_import_error") or report["features"].get("CUDA"):
        return []
    gpus = f"this machine has {len(report['gpus'])} NVIDIA GPU(s), but " if report["gpus"] else ""
    bfloat16 = ("; for speed on this CPU, train in bfloat16, which it runs natively"
                if report["bfloat16_native"] else "")
    return [f"{gpus}MXNet {report['mxnet_version']} is a CPU-only build: float16 runs as CPU "
            "emulation, which computes every GEMM in float32 and rounds its inputs and outputs to "
            "float16, so it reproduces a GPU run's float16 numerics but trains slower than "
            "float32. Fix for NVIDIA GPUs: pip uninstall mxnet; pip install -e \".[cu112]\" "
            f"(mxnet-cu112, CUDA 11.2, NVIDIA driver >= {CUDA_MIN_DRIVER['11.2']}){bfloat16}"]


def check_onednn_name(report):
    """MXNET_ONEDNN_ENABLED set: MXNet 1.9 reads MXNET_MKLDNN_ENABLED instead."""
    value = report["env"].get("MXNET_ONEDNN_ENABLED")
    if value is None:
        return []
    return [f"MXNET_ONEDNN_ENABLED={value!r} has no effect: it is MXNet 2.0's name. "
            f"Fix: set MXNET_MKLDNN_ENABLED={value} for MXNet 1.9"]


def check_horovod(report):
    """Horovod installed without MXNet support: ``--kv-store horovod`` cannot run.

    Examples
    --------
    >>> check_horovod({"horovod": {"version": "0.28.1", "mxnet": False, "error": "..."}})[0][:44]
    'Horovod 0.28.1 was built without MXNet: --kv'
    >>> check_horovod({"horovod": {"version": None, "mxnet": None, "error": None}})
    []
    """
    horovod = report.get("horovod") or {}
    if horovod.get("mxnet") is not False:
        return []
    return [f"Horovod {horovod['version']} was built without MXNet: --kv-store horovod and "
            f"launch.py --launcher horovod cannot run (import horovod.mxnet: {horovod['error']}). "
            "Fix: pip uninstall -y horovod, then reinstall it after MXNet with HOROVOD_WITH_MXNET=1 "
            "and --no-cache-dir --no-build-isolation (the README's second command shows the line)"]


#: The checks :func:`find_problems` runs, in the order their warnings are listed.
CHECKS = (check_numpy, check_mxnet_import, check_cpu_build, check_cuda_driver, check_tensor_cores,
          check_safe_accumulation, check_tensor_core_switch, check_onednn_name, check_horovod)


def find_problems(report):
    """Every problem of a report, each as one sentence that ends with its fix.

    Parameters
    ----------
    report : dict
        As :func:`mxfp16.doctor.diagnose` builds it (its ``warnings`` are not read).

    Returns
    -------
    list of str

    Examples
    --------
    >>> report = {"numpy_version": "1.24.1", "mxnet_version": "1.9.1", "features": {"CUDA": True},
    ...           "cuda_build": "11.2", "mxnet_distribution": "mxnet-cu112",
    ...           "nvidia_driver": "470.57.02", "float16_mode": "gpu", "bfloat16_native": False,
    ...           "env": {"MXNET_SAFE_ACCUMULATION": "1"},
    ...           "gpus": [{"index": 0, "name": "Tesla V100-SXM2-16GB", "source": "mxnet",
    ...                     "compute_capability": "7.0", "tensor_cores_float16": True}]}
    >>> [problem.split(":")[0] for problem in find_problems(report)]
    ['numpy 1.24.1 is too new']
    """
    return [problem for check in CHECKS for problem in check(report)]
