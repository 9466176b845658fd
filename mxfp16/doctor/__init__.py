"""``python -m mxfp16.doctor``: is this machine ready for a long float16 job?

It reports the versions and MXNet's build features, the GPUs (compute capability, Tensor Cores for
float16 and bfloat16), the CPU's instruction sets for bfloat16 and float16 emulation, the float16
mode ``mxfp16.cast_block`` will use, the environment variables that change float16 numerics or
speed, and the problems found, each with its fix; ``--json`` for tools, ``--bench`` for a few
seconds of GEMM timing.  It never fails for want of a GPU or of nvidia-smi, nor of an MXNet that
imports: MXNet 1.9.1 does not import with numpy 1.24 or newer, and the doctor then reports that,
with its fix, and everything it can read without MXNet.

Layout: :mod:`.probe` reads the machine, :mod:`.rules` judges a report (pure functions),
:mod:`.render` prints it, :mod:`.bench` times GEMMs and :mod:`.__main__` is the command line.
:func:`diagnose` ties them together and takes every input of the machine as an argument, so tests
fake GPUs, drivers and build features.
"""
import os

from .envvars import ENV_VARS, read_env
from .probe import (cuda_version, float16_mode, import_mxnet, merge_gpus, parse_nvidia_smi,
                    read_cpu, read_features, read_horovod, read_mxnet_gpus, read_versions,
                    run_nvidia_smi)
from .rules import bfloat16_native, find_problems

__all__ = ["diagnose", "ENV_VARS", "bfloat16_native_on"]


def bfloat16_native_on(device_types, environ=None, features=None, cpuinfo=None):
    """Whether bfloat16 trains natively on every one of these devices, as the doctor judges it:
    what the overflow warning asks before it suggests bfloat16 (float32's range) as a fix.

    MXNet 1.9.1 has bfloat16 kernels on CPUs only (oneDNN; its AMP casts to bfloat16 on CPU
    contexts and to float16 on GPUs), so every device must be a CPU where
    :func:`mxfp16.doctor.rules.bfloat16_native` holds (oneDNN, AVX512-BF16 or AMX).

    Parameters
    ----------
    device_types : iterable of str
        ``'cpu'``, ``'gpu'``, ... (``Context.device_type``); none gives False.
    environ, features, cpuinfo
        As for :func:`diagnose` (read from the machine when None).

    Returns
    -------
    bool

    Examples
    --------
    >>> avx512_bf16 = "flags\\t: avx512f avx512_bf16\\n"
    >>> bfloat16_native_on(['cpu'], {}, {"MKLDNN": True}, avx512_bf16)
    True
    >>> bfloat16_native_on(['cpu', 'gpu'], {}, {"MKLDNN": True}, avx512_bf16)
    False
    >>> bfloat16_native_on(['cpu'], {}, {"MKLDNN": True}, "flags\\t: avx512f\\n")
    False
    """
    device_types = set(device_types)
    if not device_types or device_types != {"cpu"}:
        return False
    if features is None:
        features = read_features(import_mxnet()[0])
    env = read_env(os.environ if environ is None else environ)
    return bfloat16_native(read_cpu(cpuinfo), features, env)


def diagnose(environ=None, features=None, cpuinfo=None, nvidia_smi=None, mxnet_gpus=None,
             versions=None, horovod=None):
    """Gather the facts of this machine and the problems they show.

    Every argument left at ``None`` is read from the machine.  Where ``import mxnet`` fails, the
    report says why (``mxnet_import_error``) and what MXNet would have told is ``None``, ``{}`` or
    ``[]``.

    Parameters
    ----------
    environ : mapping of str to str, optional
        The environment (default ``os.environ``).
    features : dict of str to bool, optional
        MXNet's build features (default ``mx.runtime.Features()``).
    cpuinfo : str, optional
        The text of /proc/cpuinfo.
    nvidia_smi : str, optional
        The output of ``nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version
        --format=csv,noheader``; ``''`` for a machine without it.
    mxnet_gpus : list of dict, optional
        The GPUs MXNet sees, as :func:`mxfp16.doctor.probe.read_mxnet_gpus` gives them.
    versions : dict, optional
        As :func:`mxfp16.doctor.probe.read_versions` gives them.
    horovod : dict, optional
        As :func:`mxfp16.doctor.probe.read_horovod` gives it.

    Returns
    -------
    dict
        JSON-ready: ``mxnet_version``, ``mxnet_distribution``, ``mxnet_import_error`` (``None``
        when MXNet imports), ``numpy_version``, ``gluoncv_version``, ``mxfp16_version``,
        ``python_version``, ``cuda_build``, ``features``, ``nvidia_driver``, ``gpus``, ``cpu``,
        ``env``, ``float16_mode``, ``bfloat16_native``, ``horovod`` and ``warnings``.

    Examples
    --------
    >>> report = diagnose(environ={}, nvidia_smi="", mxnet_gpus=[])
    >>> report["gpus"], report["env"]["MXNET_SAFE_ACCUMULATION"], report["nvidia_driver"]
    ([], None, None)
    >>> report["float16_mode"] in ("gpu", "cpu-emulation")
    True
    """
    environ = os.environ if environ is None else environ
    mx, import_error = import_mxnet()
    report = dict(read_versions(mx) if versions is None else versions)
    report["mxnet_import_error"] = import_error
    report["cuda_build"] = cuda_version(report["mxnet_distribution"])
    report["features"] = read_features(mx) if features is None else dict(features)
    smi_gpus = parse_nvidia_smi(run_nvidia_smi() if nvidia_smi is None else nvidia_smi)
    report["nvidia_driver"] = smi_gpus[0]["driver_version"] if smi_gpus else None
    mxnet_gpus = read_mxnet_gpus(mx) if mxnet_gpus is None else mxnet_gpus
    report["gpus"] = merge_gpus(mxnet_gpus, smi_gpus)
    report["cpu"] = read_cpu(cpuinfo)
    report["env"] = read_env(environ)
    report["float16_mode"] = float16_mode(mx)
    report["bfloat16_native"] = (None if mx is None else
                                 bfloat16_native(report["cpu"], report["features"], report["env"]))
    report["horovod"] = read_horovod(mx) if horovod is None else dict(horovod)
    report["warnings"] = find_problems(report)
    return report
