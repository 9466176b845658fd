"""The human-readable form of a doctor report (``--json`` prints the report dict itself)."""
import textwrap

from .envvars import ENV_VARS

#: Build features that decide where float16 can run, always shown on or off.
KEY_FEATURES = ("CUDA", "CUDNN", "NCCL", "TENSORRT", "MKLDNN")

#: How the text names a build feature, where MXNet's name is not the one users know.
FEATURE_NAMES = {"MKLDNN": "MKLDNN (oneDNN)"}

#: CPU report key -> the name the text uses.
CPU_NAMES = {"avx512": "AVX-512", "avx512_bf16": "AVX512-BF16", "amx": "AMX", "f16c": "F16C",
             "avx512_fp16": "AVX512-FP16"}

#: What each float16 mode means, as the text says it.
FLOAT16_MODES = {
    "gpu": "float16 operators on the GPU (Tensor Cores where the GPU has them)",
    "cpu-emulation": "float32 GEMMs whose inputs and outputs are rounded to float16 "
                     "(the numerics of a GPU run, not its speed)",
}

WIDTH = 100


def _wrap(line, indent):
    """``line`` folded at :data:`WIDTH` columns, later lines indented by ``indent``."""
    return textwrap.fill(line, WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _yes_no(value):
    return {True: "yes", False: "no", None: "unknown"}[value]


def _version_lines(report):
    wheel = report["mxnet_distribution"]
    wheel = f"wheel {wheel}" if wheel else "not from pip"
    versions = [f"Versions:  mxnet {report['mxnet_version']} ({wheel}), numpy "
                f"{report['numpy_version']}, gluoncv {report['gluoncv_version']}",
                f"           mxfp16 {report['mxfp16_version']}, Python {report['python_version']}"]
    if report["mxnet_import_error"]:
        return versions + [_wrap(f"MXNet build: unknown, import mxnet fails: "
                                 f"{report['mxnet_import_error']}", "  ")]
    features = report["features"]
    also = [name for name, on in features.items() if on and name not in KEY_FEATURES]
    return versions + ["MXNet build: " + ", ".join(f"{FEATURE_NAMES.get(name, name)} "
                                                   f"{_yes_no(features.get(name))}"
                                                   for name in KEY_FEATURES),
                       _wrap("  also built with: " + ", ".join(also), "    "),
                       _wrap(_horovod_line(report), "           ")]


def _horovod_line(report):
    horovod = report.get("horovod") or {}
    if horovod.get("version") is None:
        return ("Horovod:   not installed (optional, for --kv-store horovod: the README's second "
                "command installs it)")
    support = {True: "with MXNet support", False: "WITHOUT MXNet support (see Problems)",
               None: "MXNet support unknown"}[horovod.get("mxnet")]
    return f"Horovod:   {horovod['version']}, {support}"


def _gpu_lines(report):
    if not report["gpus"]:
        mxnet = "MXNet does not import" if report["mxnet_import_error"] else "MXNet sees no GPU"
        return [f"GPUs:      none ({mxnet}; nvidia-smi lists none)"]
    driver = report["nvidia_driver"] or "unknown"
    lines = [f"GPUs:      {len(report['gpus'])}, NVIDIA driver {driver}"]
    for gpu in report["gpus"]:
        memory = f"{gpu['memory_mib']} MiB" if gpu["memory_mib"] is not None else "memory unknown"
        lines.append(f"  {gpu['index']}: {gpu['name']}, {memory}, compute capability "
                     f"{gpu['compute_capability'] or 'unknown'}, Tensor Cores: float16 "
                     f"{_yes_no(gpu['tensor_cores_float16'])}, bfloat16 "
                     f"{_yes_no(gpu['tensor_cores_bfloat16'])} (via {gpu['source']})")
    return lines


def _cpu_lines(report):
    cpu = report["cpu"]
    sets = ", ".join(f"{name} {_yes_no(cpu[key])}" for key, name in CPU_NAMES.items())
    return [f"CPU:       {cpu['model'] or 'unknown'}; {sets}"]


def _precision_lines(report):
    mode = report["float16_mode"]
    if mode is None:
        return ["float16:   unknown: MXNet does not import",
                "bfloat16:  unknown: MXNet does not import"]
    units = [CPU_NAMES[key] for key in ("avx512_bf16", "amx") if report["cpu"][key]]
    bfloat16 = (f"native on this CPU (oneDNN with {' and '.join(units)})"
                if report["bfloat16_native"] else
                "not native on this CPU (needs oneDNN and AVX512-BF16 or AMX)")
    return [_wrap(f"float16:   {mode}: {FLOAT16_MODES[mode]}", "           "),
            f"bfloat16:  {bfloat16}"]


def _env_lines(report):
    lines = ["Environment (MXNet 1.9 variables that change float16 numerics or speed):"]
    for name, var in ENV_VARS.items():
        value = report["env"].get(name)
        default = f" (default {var.default})" if var.default else ""
        shown = f"unset{default}" if value is None else repr(value)
        lines += [f"  {name} = {shown}",
                  _wrap(f"      {var.reason}; advice: {var.advice}", "      ")]
    return lines


def _problem_lines(report):
    problems = report["warnings"]
    if not problems:
        return ["Problems:  none"]
    return [f"Problems ({len(problems)}):"] + [_wrap(f"  - {problem}", "    ")
                                               for problem in problems]


def _bench_lines(report):
    rows = report.get("bench")
    if rows == [] and report["mxnet_import_error"]:
        return ["GEMM benchmark: not run, MXNet does not import"]
    if not rows:
        return []
    lines = ["GEMM benchmark (square FullyConnected, best of the timed runs):"]
    for row in rows:
        lines.append(f"  {row['device']:<5} {row['dtype']:<9} n={row['size']:<5} "
                     f"{row['seconds'] * 1e3:8.2f} ms {row['tflops']:8.3f} TFLOP/s "
                     f"{row['ratio_to_float32']:6.2f}x float32")
    return lines


def render_text(report):
    """The report as text: versions and build, GPUs, CPU, precision modes, environment, problems
    and (after ``--bench``) the GEMM timings.

    Parameters
    ----------
    report : dict
        As :func:`mxfp16.doctor.diagnose` builds it.

    Returns
    -------
    str

    Examples
    --------
    >>> from mxfp16.doctor import diagnose
    >>> text = render_text(diagnose(environ={}, nvidia_smi="", mxnet_gpus=[]))
    >>> [line.split(":")[0] for line in text.splitlines() if line.startswith(("GPUs", "CPU"))]
    ['GPUs', 'CPU']
    """
    sections = [_version_lines(report), _gpu_lines(report) + _cpu_lines(report)
                + _precision_lines(report), _env_lines(report), _problem_lines(report),
                _bench_lines(report)]
    return "\n\n".join("\n".join(lines) for lines in sections if lines)
