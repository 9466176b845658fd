"""The environment variables that change float16 numerics or speed in MXNet 1.9.

Names, defaults and meanings follow MXNet's environment-variable FAQ
(``docs/static_site/src/pages/api/faq/env_var.md`` in apache/mxnet) and the names the MXNet 1.9.1
library reads; ``MXFP16_FASTROUND`` is mxfp16's own (:mod:`mxfp16.casting.fastround`).
"""
from collections import namedtuple

#: One variable: MXNet's default, why it matters for float16 (one line), and what to set.
EnvVar = namedtuple("EnvVar", "default reason advice")

#: Variable name -> :class:`EnvVar`, in the order the report prints them.
ENV_VARS = {
    "MXNET_SAFE_ACCUMULATION": EnvVar(
        "0", "float16 reductions (softmax, norms, sums) accumulate in float16 unless it is 1",
        "set 1 for float16 on GPUs"),
    "MXNET_CUDA_ALLOW_TENSOR_CORE": EnvVar(
        "1", "0 keeps float16 GEMMs off the Tensor Cores, which removes their speed-up",
        "leave unset (1)"),
    "MXNET_CUDA_TENSOR_OP_MATH_ALLOW_CONVERSION": EnvVar(
        "0", "1 silently runs float32 convolutions and RNNs in float16 on Tensor Cores",
        "leave 0 so that a float32 baseline stays float32"),
    "MXNET_CUDNN_AUTOTUNE_DEFAULT": EnvVar(
        "1", "cuDNN convolution algorithm search: 0 none, 1 within the workspace, 2 fastest",
        "1; 0 can leave float16 convolutions on slow algorithms"),
    "MXNET_CUDNN_LIB_CHECKING": EnvVar(
        "1", "warns when the loaded cuDNN differs from the one MXNet was built with",
        "leave 1"),
    "MXNET_CUDA_LIB_CHECKING": EnvVar(
        "1", "warns when the loaded CUDA libraries differ from the ones MXNet was built with",
        "leave 1"),
    "MXNET_ENFORCE_DETERMINISM": EnvVar(
        "0", "1 restricts cuDNN to deterministic algorithms, often slower ones",
        "1 only to chase a float16 divergence"),
    "MXNET_USE_FUSION": EnvVar(
        "1", "fuses pointwise ops on GPUs (CUDA builds), saving float16 memory traffic",
        "leave 1"),
    "MXNET_ENABLE_GPU_P2P": EnvVar(
        "1", "peer-to-peer GPU copies for the 'device' kvstore's gradient exchange",
        "leave 1; 0 only if P2P copies hang"),
    "MXNET_GPU_MEM_POOL_TYPE": EnvVar(
        "Naive", "GPU memory pool: Naive, Round or Unpooled",
        "Round when a larger float16 batch fragments memory"),
    "MXNET_GPU_WORKER_NTHREADS": EnvVar(
        "2", "operators that run at once on each GPU", "leave 2"),
    "MXNET_EXEC_BULK_EXEC_TRAIN": EnvVar(
        "1", "runs the training graph in bulk segments, fewer gaps between kernel launches",
        "leave 1; 0 only for per-operator profiling"),
    "MXNET_BACKWARD_DO_MIRROR": EnvVar(
        "0", "1 recomputes activations in backward: 30-50% less memory, about 5% slower",
        "1 only when even the float16 batch does not fit"),
    "MXNET_ENGINE_TYPE": EnvVar(
        "ThreadedEnginePerDevice", "NaiveEngine runs every op synchronously (debugging only)",
        "leave unset for training"),
    "MXNET_CPU_WORKER_NTHREADS": EnvVar(
        "1", "CPU operators that run at once; each also uses OMP_NUM_THREADS threads",
        "leave 1 and tune OMP_NUM_THREADS"),
    "OMP_NUM_THREADS": EnvVar(
        "all cores", "threads of each CPU operator: emulated float16 and bfloat16 GEMMs run here",
        "the physical cores per training process"),
    "MXNET_KVSTORE_REDUCTION_NTHREADS": EnvVar(
        "4", "CPU threads that sum large gradient arrays across devices of one machine",
        "leave 4"),
    "MXNET_SUBGRAPH_BACKEND": EnvVar(
        "MKLDNN in oneDNN builds",
        "oneDNN graph fusion on CPU (Conv+BN+ReLU); NONE switches it off",
        "leave unset"),
    "MXNET_MKLDNN_ENABLED": EnvVar(
        "1", "0 switches oneDNN off: CPU GEMMs fall back to BLAS and bfloat16 stops being native",
        "leave 1"),
    "MXNET_ONEDNN_ENABLED": EnvVar(
        None, "MXNet 2.0's name for MXNET_MKLDNN_ENABLED; MXNet 1.9 ignores it",
        "use MXNET_MKLDNN_ENABLED"),
    "CUDA_VISIBLE_DEVICES": EnvVar(
        "all GPUs", "which GPUs MXNet sees, renumbered from 0", "unset, or the GPUs of this job"),
    "MXFP16_FASTROUND": EnvVar(
        "1", "mxfp16's fused float16 rounding for CPU emulation; 0 keeps the slower Cast pairs",
        "leave 1"),
}


def read_env(environ):
    """The current value of every variable of :data:`ENV_VARS` (``None`` when unset).

    Parameters
    ----------
    environ : mapping of str to str
        The environment, e.g. ``os.environ``.

    Returns
    -------
    dict of str to str or None

    Examples
    --------
    >>> env = read_env({"MXNET_SAFE_ACCUMULATION": "1", "HOME": "/root"})
    >>> env["MXNET_SAFE_ACCUMULATION"], env["OMP_NUM_THREADS"], "HOME" in env
    ('1', None, False)
    """
    return {name: environ.get(name) for name in ENV_VARS}
