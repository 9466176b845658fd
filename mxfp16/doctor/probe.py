"""Reading the machine: versions, MXNet's build features, the GPUs, the CPU's instruction sets and
the float16 mode.

MXNet is imported here only, by :func:`import_mxnet`, which turns a failing import into a reason;
the readers that need MXNet take the module it returns, and the others work without it.

Each reader of the operating system has a pure parsing half (:func:`parse_cpuinfo`,
:func:`parse_nvidia_smi`, :func:`merge_gpus`, :func:`cuda_version`) that the tests feed with
recorded text, so the GPU branches are tested on machines without a GPU.
"""
import platform
import re
import shutil
import subprocess
import warnings

import numpy as np

from .. import __version__
from .rules import has_tensor_cores

#: Report key -> the /proc/cpuinfo flags that must all be present.  AVX-512 and F16C make float16
#: emulation's rounding fast; AVX512-BF16 and AMX run bfloat16 GEMMs natively; AVX512-FP16 is
#: float16 arithmetic, which MXNet 1.9 does not use.
CPU_FLAGS = {"avx512": ("avx512f",), "avx512_bf16": ("avx512_bf16",),
             "amx": ("amx_bf16", "amx_tile"), "f16c": ("f16c",), "avx512_fp16": ("avx512_fp16",)}

#: The nvidia-smi queries, tried in order: older nvidia-smi versions reject ``compute_cap``.
NVIDIA_SMI_QUERIES = (("name", "memory.total", "compute_cap", "driver_version"),
                      ("name", "memory.total", "driver_version"))


def import_mxnet():
    """``(mxnet, None)``, or ``(None, reason)`` when ``import mxnet`` fails.

    The reason is the error's type and first line, e.g. ``"AttributeError: module 'numpy' has no
    attribute 'bool'."`` under numpy 1.24 or newer, or ``"ModuleNotFoundError: No module named
    'mxnet'"``; ``OSError`` is a shared library of MXNet's that does not load.

    Examples
    --------
    >>> mx, reason = import_mxnet()
    >>> mx.__version__, reason
    ('1.9.1', None)
    """
    try:
        with warnings.catch_warnings():  # numpy's warnings on the way to MXNet's failure
            warnings.simplefilter("ignore", (DeprecationWarning, FutureWarning))
            import mxnet
    except (ImportError, AttributeError, OSError) as error:
        lines = str(error).splitlines()
        return None, type(error).__name__ + (f": {lines[0]}" if lines else "")
    return mxnet, None


def distribution_version(name):
    """The installed version of a pip distribution, or ``None`` (not installed, or Python 3.7)."""
    try:
        from importlib import metadata
    except ImportError:
        return None
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def mxnet_distribution():
    """The pip wheel that installed MXNet (``'mxnet'``, ``'mxnet-cu112'``...), or ``None``."""
    try:
        from importlib import metadata
    except ImportError:
        return None
    names = sorted(dist.metadata["Name"].lower().replace("_", "-")
                   for dist in metadata.distributions() if dist.metadata["Name"])
    return next((name for name in names if re.fullmatch(r"mxnet(-cu\d+)?(mkl)?", name)), None)


def cuda_version(distribution):
    """The CUDA version an MXNet wheel is built for, from its name.

    Examples
    --------
    >>> cuda_version('mxnet-cu112'), cuda_version('mxnet-cu102'), cuda_version('mxnet')
    ('11.2', '10.2', None)
    """
    match = re.fullmatch(r"mxnet-cu(\d+)(\d)(mkl)?", distribution or "")
    return f"{match.group(1)}.{match.group(2)}" if match else None


def read_versions(mx):
    """Versions of MXNet (and its wheel), numpy, GluonCV, mxfp16 and Python, as report keys.

    Parameters
    ----------
    mx : module or None
        MXNet, from :func:`import_mxnet`; without it the MXNet version is its wheel's (``None``
        when no wheel is installed).

    Examples
    --------
    >>> mx, _ = import_mxnet()
    >>> versions = read_versions(mx)
    >>> versions["mxnet_version"], versions["numpy_version"] == np.__version__
    ('1.9.1', True)
    >>> read_versions(None)["mxnet_version"]
    '1.9.1'
    """
    distribution = mxnet_distribution()
    mxnet_version = mx.__version__ if mx else distribution and distribution_version(distribution)
    return {"mxnet_version": mxnet_version, "mxnet_distribution": distribution,
            "numpy_version": np.__version__, "gluoncv_version": distribution_version("gluoncv"),
            "mxfp16_version": __version__, "python_version": platform.python_version()}


def read_features(mx):
    """MXNet's build features (``mx.runtime.Features()``): name -> enabled; ``{}`` without MXNet.

    Examples
    --------
    >>> features = read_features(import_mxnet()[0])
    >>> sorted(name for name in ("CUDA", "MKLDNN", "TENSORRT") if name in features)
    ['CUDA', 'MKLDNN', 'TENSORRT']
    >>> read_features(None)
    {}
    """
    if mx is None:
        return {}
    return {name: feature.enabled for name, feature in mx.runtime.Features().items()}


def parse_cpuinfo(text):
    """The CPU model and the instruction sets of :data:`CPU_FLAGS` from /proc/cpuinfo's text.

    Parameters
    ----------
    text : str
        The contents of /proc/cpuinfo; ``''`` where there is none.

    Returns
    -------
    dict
        ``model`` (str or None) and one bool per :data:`CPU_FLAGS` key; the bools are ``None``
        when the text has no x86 ``flags`` line (another OS or architecture).

    Examples
    --------
    >>> cpu = parse_cpuinfo("model name\\t: Intel Xeon\\nflags\\t\\t: fpu f16c avx512f amx_tile\\n")
    >>> cpu["model"], cpu["avx512"], cpu["f16c"], cpu["avx512_bf16"], cpu["amx"]
    ('Intel Xeon', True, True, False, False)
    >>> parse_cpuinfo("")["avx512"] is None
    True
    """
    fields = {}
    for line in text.splitlines():
        key, colon, value = line.partition(":")
        if colon:
            fields.setdefault(key.strip(), value.strip())
    flags = set(fields["flags"].split()) if "flags" in fields else None
    cpu = {"model": fields.get("model name")}
    for key, needed in CPU_FLAGS.items():
        cpu[key] = None if flags is None else all(flag in flags for flag in needed)
    return cpu


def read_cpu(cpuinfo=None):
    """:func:`parse_cpuinfo` of ``cpuinfo`` (default: /proc/cpuinfo, ``''`` when unreadable); the
    model falls back to what :mod:`platform` says."""
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo") as info:
                cpuinfo = info.read()
        except OSError:
            cpuinfo = ""
    cpu = parse_cpuinfo(cpuinfo)
    cpu["model"] = cpu["model"] or platform.processor() or platform.machine() or None
    return cpu


def run_nvidia_smi(timeout=10):
    """The output of ``nvidia-smi --query-gpu=... --format=csv,noheader`` with the first query of
    :data:`NVIDIA_SMI_QUERIES` that succeeds; ``''`` without nvidia-smi or when it fails."""
    executable = shutil.which("nvidia-smi")
    if executable is None:
        return ""
    for fields in NVIDIA_SMI_QUERIES:
        command = [executable, f"--query-gpu={','.join(fields)}", "--format=csv,noheader"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except (OSError, subprocess.TimeoutExpired):
            return ""
        if done.returncode == 0:
            return done.stdout
    return ""


def _field(value):
    """An nvidia-smi value, ``None`` for ``[N/A]`` and the like."""
    return None if not value or value.startswith("[") else value


def parse_nvidia_smi(text):
    """One dict per GPU line of :func:`run_nvidia_smi`'s output (either query).

    Returns
    -------
    list of dict
        ``name``, ``memory_mib`` (int or None), ``compute_capability`` (str or None) and
        ``driver_version``.

    Examples
    --------
    >>> parse_nvidia_smi("Tesla T4, 15360 MiB, 7.5, 470.57.02\\n")
    [{'name': 'Tesla T4', 'memory_mib': 15360, 'compute_capability': '7.5', \
'driver_version': '470.57.02'}]
    >>> parse_nvidia_smi("Tesla T4, 15360 MiB, 450.80.02")[0]["compute_capability"] is None
    True
    """
    gpus = []
    for line in text.strip().splitlines():
        values = [_field(value.strip()) for value in line.split(",")]
        if len(values) == 3:
            values.insert(2, None)
        if len(values) != 4:
            continue
        name, memory, capability, driver = values
        memory_mib = int(memory.split()[0]) if memory and memory.split()[0].isdigit() else None
        gpus.append({"name": name, "memory_mib": memory_mib, "compute_capability": capability,
                     "driver_version": driver})
    return gpus


def _compute_capability(mx, index):
    """``'7.0'`` for GPU ``index`` through ``mx.util.get_cuda_compute_capability``, or ``None``."""
    try:
        capability = mx.util.get_cuda_compute_capability(mx.gpu(index))
    except (OSError, RuntimeError, ValueError):
        return None
    return f"{capability // 10}.{capability % 10}"


def _memory_mib(mx, index):
    """Total memory of GPU ``index`` in MiB through ``mx.context.gpu_memory_info``, or ``None``."""
    try:
        return mx.context.gpu_memory_info(index)[1] // 2**20
    except mx.base.MXNetError:
        return None


def read_mxnet_gpus(mx):
    """The GPUs MXNet sees (``mx.context.num_gpus()``), in MXNet's order.

    Parameters
    ----------
    mx : module or None
        MXNet, from :func:`import_mxnet`.

    Returns
    -------
    list of dict
        ``memory_mib`` and ``compute_capability`` of each (``None`` where CUDA does not answer);
        ``[]`` for a CPU build, a machine without GPUs or without MXNet.

    Examples
    --------
    >>> mx, _ = import_mxnet()
    >>> len(read_mxnet_gpus(mx)) == mx.context.num_gpus()
    True
    """
    if mx is None:
        return []
    try:
        count = mx.context.num_gpus()
    except mx.base.MXNetError:
        return []
    return [{"memory_mib": _memory_mib(mx, index),
             "compute_capability": _compute_capability(mx, index)}
            for index in range(count)]


def gpu_entry(index, name, memory_mib, compute_capability, source):
    """One GPU of the report, with its Tensor Cores for float16 and bfloat16."""
    return {"index": index, "name": name, "memory_mib": memory_mib,
            "compute_capability": compute_capability,
            "tensor_cores_float16": has_tensor_cores(compute_capability, "float16"),
            "tensor_cores_bfloat16": has_tensor_cores(compute_capability, "bfloat16"),
            "source": source}


def merge_gpus(mxnet_gpus, smi_gpus):
    """The report's GPUs: MXNet's where it sees any (named by nvidia-smi when both list as many),
    else nvidia-smi's.

    Examples
    --------
    >>> smi = parse_nvidia_smi("GeForce GTX 1080, 8119 MiB, 6.1, 460.27.03")
    >>> gpu = merge_gpus([], smi)[0]
    >>> gpu["name"], gpu["tensor_cores_float16"], gpu["source"]
    ('GeForce GTX 1080', False, 'nvidia-smi')
    >>> merge_gpus([{"memory_mib": 16160, "compute_capability": "7.0"}], [])[0]["name"]
    'GPU 0'
    """
    if not mxnet_gpus:
        return [gpu_entry(index, gpu["name"], gpu["memory_mib"], gpu["compute_capability"],
                          "nvidia-smi") for index, gpu in enumerate(smi_gpus)]
    named = smi_gpus if len(smi_gpus) == len(mxnet_gpus) else [{}] * len(mxnet_gpus)
    return [gpu_entry(index, smi.get("name") or f"GPU {index}", gpu["memory_mib"],
                      gpu["compute_capability"] or smi.get("compute_capability"), "mxnet")
            for index, (gpu, smi) in enumerate(zip(mxnet_gpus, named))]


def read_horovod(mx):
    """Horovod, the second distributed engine (``--kv-store horovod``): its version and whether it
    was built with MXNet support.

    Parameters
    ----------
    mx : module or None
        MXNet, from :func:`import_mxnet`; without it Horovod's MXNet support is unknown.

    Returns
    -------
    dict
        ``version`` (``None`` when Horovod is not installed), ``mxnet`` (``True``, ``False`` or
        ``None`` for unknown) and ``error``: why ``horovod.mxnet`` does not import, else ``None``.

    Examples
    --------
    >>> horovod = read_horovod(None)
    >>> sorted(horovod), horovod["mxnet"]
    (['error', 'mxnet', 'version'], None)
    """
    version = distribution_version("horovod")
    if version is None or mx is None:
        return {"version": version, "mxnet": None, "error": None}
    try:
        import horovod.mxnet  # noqa: F401  (loads Horovod's MXNet extension)
    except ImportError as error:
        return {"version": version, "mxnet": False, "error": " ".join(str(error).split())}
    return {"version": version, "mxnet": True, "error": None}


def float16_mode(mx):
    """``'gpu'`` or ``'cpu-emulation'``: what ``mxfp16.cast_block(net, 'float16')`` does here, by
    :func:`mxfp16.resolve_emulate`'s own rule; ``None`` without MXNet.

    Examples
    --------
    >>> mx, _ = import_mxnet()
    >>> float16_mode(mx) == ('gpu' if mx.context.num_gpus() else 'cpu-emulation')
    True
    >>> float16_mode(None) is None
    True
    """
    if mx is None:
        return None
    from ..casting.emulation import resolve_emulate
    return "cpu-emulation" if resolve_emulate(None, "float16") else "gpu"
