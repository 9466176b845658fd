"""A float16 graph that says, when it runs on a CPU, why it cannot run there and what to do.

MXNet's CPU backend has no float16 matrix multiply: bound on a CPU, a float16 Convolution or
FullyConnected fails at its first forward with "FP16 gemm on cpu not implemented!" (or "float16
fully connected layer is currently only supported by CuDNN").  The graphs ``convert_symbol`` and
``convert_model`` return are such graphs wherever they are made (a model converted on a CPU
build host for a GPU server).  :class:`Float16Graph` binds on a CPU as MXNet's graph does (MXNet
1.9's own ``test_module_backward_compatibility`` binds one to read its parameters' dtypes), and
its executors' first forward there raises mxfp16's one line, where MXNet's would fail.
"""
import mxnet as mx

from ..casting.graph import GraphRewriter, internal_dtypes
from ..casting.rules import GEMM_OPS


def float16_gemms(sym, data_names):
    """The matrix-multiply ops (by op name, sorted) that ``sym`` runs in float16."""
    types = internal_dtypes(sym, data_names)
    found = set()
    for node in GraphRewriter(sym, drop_inserted=False).old_nodes:
        if node["op"] in GEMM_OPS and types.get(f"{node['name']}_output") == "float16":
            found.add(node["op"])
    return sorted(found)


def cpu_error(ops):
    """The one-line error for float16 matrix multiplies ``ops`` on a CPU."""
    return mx.base.MXNetError(
        f"mxfp16: this graph runs {', '.join(ops)} in float16, and MXNet's CPU backend has no "
        "float16 matrix multiply: run it on a GPU (mx.gpu()), or convert with emulate=True for "
        "float16 emulated on the CPU (float32 compute, float16 rounding)")


class _CpuFloat16Executor(mx.executor.Executor):
    """An executor of a :class:`Float16Graph` bound on a CPU: everything an executor has (its
    arrays and their dtypes), but a forward raises :func:`cpu_error` before MXNet's kernels
    would fail."""

    def forward(self, is_train=False, **kwargs):
        raise cpu_error(self._float16_gemms)


def _typed_inputs(sym):
    """The inputs type inference starts from: float32 for those without ``__dtype__`` (data, as
    MXNet AMP's conversion leaves it), the others by their attribute."""
    attrs = sym.attr_dict()
    return [name for name in sym.list_inputs() if "__dtype__" not in attrs.get(name, {})]


class Float16Graph(mx.sym.Symbol):
    """A ``Symbol`` that binds anywhere, as MXNet's does, whose executors on a CPU raise
    :func:`cpu_error` for its float16 matrix multiplies at their forward; on a GPU it runs as
    any Symbol."""

    __slots__ = ()

    def _guard(self, executor, ctx):
        if getattr(ctx, "device_type", None) == "cpu":
            ops = float16_gemms(self, _typed_inputs(self))
            if ops:
                executor.__class__ = _CpuFloat16Executor
                executor._float16_gemms = ops
        return executor

    def simple_bind(self, ctx, *args, **kwargs):
        return self._guard(super().simple_bind(ctx, *args, **kwargs), ctx)

    def bind(self, ctx, *args, **kwargs):
        return self._guard(super().bind(ctx, *args, **kwargs), ctx)


def guarded(sym, data_names):
    """``sym`` as a :class:`Float16Graph` when it runs matrix multiplies in float16, else itself."""
    if float16_gemms(sym, data_names):
        sym.__class__ = Float16Graph
    return sym
