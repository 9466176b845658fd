"""A fused "round through float16" operator for CPU emulation, built on first use.

``_mxfp16_round_float16`` computes ``float32(float16(x))`` in one elementwise pass (F16C vector
conversions, OpenMP over chunks; a bit-exact scalar path on CPUs without F16C) and rounds the
gradient the same way, so it replaces the ``Cast(float16) -> Cast(float32)`` pair that emulation
puts at every GEMM boundary (in a bound graph on a 16x256x56x56 tensor: a tenth of the pair's
forward time, a quarter of its backward).  It is an MXNet 1.9 extension-library operator
(``mxfp16/casting/csrc/round_float16.cc``, written against the ``lib_api.h`` that the mxnet wheel ships).

Why compile lazily rather than in ``setup.py``
----------------------------------------------
The library must be compiled against the headers of the mxnet that will load it, and ``setup.py``
cannot count on seeing that mxnet.  pip builds a project without ``pyproject.toml`` through PEP
517/660 in an isolated environment whenever the ``wheel`` package is absent (so with pip 23.2 on
this project's machines), and that environment hides the installed site-packages; in a fresh
environment ``pip install -e ".[cpu,test]"`` also builds mxfp16 before it installs mxnet, which
``.[cpu]`` or ``.[cu112]`` pulls in as a dependency.  Only pip's legacy, deprecated ``setup.py
develop`` path would see mxnet, and which path runs depends on pip's version and on what else is
installed.  An extension that is silently skipped, or built against one mxnet and run with another,
is worse than none.  So this module compiles the library the first time :func:`load` is called, with
the system C++ compiler (``$CXX``, default ``c++``), against the mxnet imported in this process,
into ``$XDG_CACHE_HOME/mxfp16/<key>/lib_round_float16.so`` (default ``~/.cache``).  ``<key>`` hashes
the source, mxnet's ``lib_api.h`` and ``lib_api.cc``, the mxnet version, the compiler and its flags,
so a changed source or a different mxnet builds anew and stale builds are never loaded.  A file lock
makes concurrent processes (parallel tests, distributed workers) compile once; the library is
written to a temporary name and renamed, so no process loads a half-written file.  The first build
takes about 8 s of CPU; later processes only load the cached library (about 0.5 s, mostly MXNet
regenerating its operator wrappers).  Without a compiler, or if anything else fails, :func:`load`
logs one warning and returns False, and callers keep the ``Cast`` pair.

Numerics match ``x.astype(numpy.float16).astype(numpy.float32)`` and the ``Cast`` pair bit for bit,
NaN payloads included (round to nearest even, overflow to inf from 65520, subnormals down to 2**-24,
signs of zeros and NaNs kept), so swapping one for the other changes no result.
Setting ``MXFP16_FASTROUND_SCALAR=1`` before the library loads forces the scalar path (for tests);
``MXFP16_FASTROUND=0`` makes emulation keep the ``Cast`` pair (:func:`wanted`).

Limitations of MXNet 1.9's extension operators that callers should know:

* the backward node receives ``(dy, x, y)``, so ``x`` and ``y`` stay alive until the backward pass,
  where the ``Cast`` pair keeps neither (a chain of six Convolution-BatchNorm-ReLU blocks rounded
  at every GEMM edge plans 165 MB instead of 122 MB);
* the operator always overwrites its output: it ignores ``grad_req='add'``, so do not feed it a
  variable whose gradient must be accumulated;
* a saved symbol that contains the operator can be loaded only after :func:`load`.
"""
import fcntl
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
import threading

import mxnet as mx

log = logging.getLogger(__name__)

#: Name of the registered operator: ``mx.nd._internal._mxfp16_round_float16(x)``,
#: ``mx.sym._internal._mxfp16_round_float16(x)``, or a graph JSON node's ``"op"``.
ROUND_OP = "_mxfp16_round_float16"

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "csrc", "round_float16.cc")
LIBRARY_NAME = "lib_round_float16.so"
#: -fopenmp links the libgomp that libmxnet.so already uses, so both share one thread pool setting
#: (OMP_NUM_THREADS).  No -mf16c: the F16C kernel has a target attribute and is chosen at run time.
CXX_FLAGS = ("-O3", "-std=c++14", "-shared", "-fPIC", "-fopenmp", "-Wl,-Bsymbolic")
COMPILE_TIMEOUT_S = 600


class _LoadState:
    """Whether this process has loaded the library: None (not tried yet), True or False."""
    lock = threading.Lock()
    loaded = None


def _mxnet_sources():
    """``(include_dir, lib_api_cc)`` of the imported mxnet; RuntimeError if its wheel lacks them."""
    root = os.path.dirname(os.path.abspath(mx.__file__))
    include_dir = os.path.join(root, "include")
    lib_api_cc = os.path.join(root, "src", "lib_api.cc")
    for path in (os.path.join(include_dir, "mxnet", "lib_api.h"), lib_api_cc):
        if not os.path.isfile(path):
            raise RuntimeError(f"mxnet {mx.__version__} at {root} has no {path}, which extension "
                               "libraries need; install the mxnet 1.9.1 wheel from PyPI")
    return include_dir, lib_api_cc


def _compiler():
    """Absolute path of ``$CXX`` (default ``c++``), or RuntimeError if it is not on PATH."""
    name = os.environ.get("CXX") or "c++"
    path = shutil.which(name)
    if path is None:
        raise RuntimeError(f"no C++ compiler {name!r} on PATH; install g++ or set CXX")
    return path


def _build_key(compiler, include_dir, lib_api_cc):
    """A hex digest of everything the built library depends on."""
    digest = hashlib.sha256()
    for path in (SOURCE, os.path.join(include_dir, "mxnet", "lib_api.h"), lib_api_cc):
        with open(path, "rb") as source:
            digest.update(source.read())
    for text in (mx.__version__, compiler, platform.machine(), *CXX_FLAGS):
        digest.update(text.encode() + b"\0")
    return digest.hexdigest()[:16]


def _cache_root():
    """``$XDG_CACHE_HOME/mxfp16``, or ``~/.cache/mxfp16``."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "mxfp16")


def _compile(compiler, include_dir, lib_api_cc, target):
    """Compile the library to ``target`` through a temporary file, or raise RuntimeError."""
    directory = os.path.dirname(target)
    handle, partial = tempfile.mkstemp(suffix=".so", dir=directory)
    os.close(handle)
    command = [compiler, *CXX_FLAGS, "-I", include_dir, SOURCE, lib_api_cc, "-o", partial]
    log.info("mxfp16: compiling %s (once per mxnet version, about 10 s)", SOURCE)
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        if result.returncode != 0:
            build_log = os.path.join(directory, "build.log")
            with open(build_log, "w") as out:
                out.write(" ".join(command) + "\n" + result.stdout + result.stderr)
            raise RuntimeError(f"{os.path.basename(compiler)} exited with {result.returncode}, "
                               f"see {build_log}")
        os.replace(partial, target)
    finally:
        if os.path.exists(partial):
            os.remove(partial)


def _built_library():
    """Path of the compiled library, compiling it first if no process has (under a file lock)."""
    include_dir, lib_api_cc = _mxnet_sources()
    compiler = _compiler()
    directory = os.path.join(_cache_root(), _build_key(compiler, include_dir, lib_api_cc))
    target = os.path.join(directory, LIBRARY_NAME)
    if os.path.isfile(target):
        return target
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, "build.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not os.path.isfile(target):
            _compile(compiler, include_dir, lib_api_cc, target)
    return target


def load():
    """Build (on first use) and load the library that registers :data:`ROUND_OP`, once per process.

    Thread-safe; later calls return the first call's answer at once.  A failure (no compiler, a
    read-only cache, an mxnet without extension headers) is logged as one warning line.

    Returns
    -------
    bool
        True if :data:`ROUND_OP` is registered with MXNet, False if callers must keep the
        ``Cast(float16) -> Cast(float32)`` pair.

    Examples
    --------
    >>> x = mx.nd.array([0.1, 65520.0, 2.0 ** -25])
    >>> if load():
    ...     y = getattr(mx.nd._internal, ROUND_OP)(x)
    ... else:
    ...     y = mx.nd.Cast(mx.nd.Cast(x, dtype='float16'), dtype='float32')
    >>> y.asnumpy().tolist()
    [0.0999755859375, inf, 0.0]
    """
    with _LoadState.lock:
        if _LoadState.loaded is None:
            try:
                mx.library.load(_built_library(), verbose=False)
                _LoadState.loaded = True
            except (OSError, RuntimeError, subprocess.SubprocessError, mx.base.MXNetError) as err:
                reason = " ".join(str(err).split())
                log.warning("mxfp16: fast float16 rounding unavailable, emulation keeps the Cast "
                            "pair (%s: %s)", type(err).__name__, reason)
                _LoadState.loaded = False
        return _LoadState.loaded


def wanted():
    """Whether emulation should use the fused operator: unless ``MXFP16_FASTROUND=0``, and only
    where MXNet sees no GPU (the operator has a CPU kernel only; a graph emulated on a GPU machine,
    ``emulate=True``, may be bound to a GPU and keeps the ``Cast`` pair).

    Examples
    --------
    >>> import os
    >>> import mxnet as mx
    >>> wanted() == (os.environ.get("MXFP16_FASTROUND", "1") != "0" and mx.context.num_gpus() == 0)
    True
    """
    return os.environ.get("MXFP16_FASTROUND", "1") != "0" and mx.context.num_gpus() == 0


def available():
    """Whether :data:`ROUND_OP` is registered in this process; never builds or loads anything.

    Returns
    -------
    bool
        True once :func:`load` has succeeded, False before that or after it failed.

    Examples
    --------
    >>> load() == available()
    True
    """
    return bool(_LoadState.loaded)
