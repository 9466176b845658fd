"""``--bench``: a few seconds of GEMM timing, float32 against each low-precision dtype that runs
natively on the devices present (bfloat16 on CPUs with AVX512-BF16 or AMX, float16 on GPUs).

The GEMM is a square ``FullyConnected`` (``size x size`` data times a ``size x size`` weight), the
operator a float16 network's dense layers run; ``dot`` has no bfloat16 kernel on CPU in MXNet 1.9.
"""
import time

import mxnet as mx
import numpy as np

#: NDArray dtype of bfloat16 in MXNet 1.9 (numpy has none): what ``NDArray.astype`` takes.
BFLOAT16 = np.dtype([("bfloat16", np.uint16)])

#: Matrix side per device type: compute-bound, yet a few milliseconds per GEMM.
GEMM_SIZE = {"cpu": 1024, "gpu": 4096}

#: Timed repetitions after the warm-up, and the seconds after which fewer are enough.
REPEATS, BUDGET_SECONDS = 5, 0.5


def time_gemm(ctx, dtype, size, repeats=REPEATS, budget=BUDGET_SECONDS):
    """Best time in seconds of one ``size``-cubed GEMM in ``dtype`` on ``ctx``, after a warm-up.

    Parameters
    ----------
    ctx : mx.Context
    dtype : {'float32', 'float16', 'bfloat16'}
    size : int
    repeats : int
        Timed runs, each ended by ``mx.nd.waitall()``; fewer once ``budget`` seconds are spent.
    budget : float

    Returns
    -------
    float

    Examples
    --------
    >>> time_gemm(mx.cpu(), 'float32', 64, repeats=2) > 0
    True
    """
    dtype = BFLOAT16 if dtype == "bfloat16" else dtype
    data = mx.nd.random.uniform(shape=(size, size), ctx=ctx).astype(dtype)
    weight = mx.nd.random.uniform(shape=(size, size), ctx=ctx).astype(dtype)
    mx.nd.FullyConnected(data, weight, num_hidden=size, no_bias=True)
    mx.nd.waitall()
    times = []
    while len(times) < repeats and sum(times) < budget:
        start = time.perf_counter()
        mx.nd.FullyConnected(data, weight, num_hidden=size, no_bias=True)
        mx.nd.waitall()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_plan(report):
    """``(device name, context, low-precision dtypes)`` for each device of a report: the CPU (with
    bfloat16 when it is native) and every GPU MXNet uses (with float16)."""
    plan = [("cpu", mx.cpu(), ["bfloat16"] if report["bfloat16_native"] else [])]
    if report["float16_mode"] == "gpu":
        plan += [(f"gpu{gpu['index']}", mx.gpu(gpu["index"]), ["float16"])
                 for gpu in report["gpus"] if gpu["source"] == "mxnet"]
    return plan


def run_bench(report, sizes=None):
    """Time the GEMM of every dtype of :func:`bench_plan`, against float32 on the same device.

    Parameters
    ----------
    report : dict
        A report of :func:`mxfp16.doctor.diagnose`.
    sizes : dict of str to int, optional
        Matrix side per device type (default :data:`GEMM_SIZE`).

    Returns
    -------
    list of dict
        One row per device and dtype: ``device``, ``dtype``, ``size``, ``seconds``, ``tflops``
        and ``ratio_to_float32`` (float32 time / this dtype's time: above 1 is faster).

    Examples
    --------
    >>> rows = run_bench({"bfloat16_native": False, "float16_mode": "cpu-emulation"}, {"cpu": 64})
    >>> [(row["device"], row["dtype"], row["ratio_to_float32"]) for row in rows]
    [('cpu', 'float32', 1.0)]
    """
    sizes = sizes or GEMM_SIZE
    rows = []
    for device, ctx, dtypes in bench_plan(report):
        size = sizes[ctx.device_type]
        float32_seconds = time_gemm(ctx, "float32", size)
        for dtype in ["float32"] + dtypes:
            seconds = float32_seconds if dtype == "float32" else time_gemm(ctx, dtype, size)
            rows.append({"device": device, "dtype": dtype, "size": size, "seconds": seconds,
                         "tflops": 2 * size**3 / seconds / 1e12,
                         "ratio_to_float32": float32_seconds / seconds})
    return rows
