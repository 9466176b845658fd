"""MXNet's NumPy interface (``from mxnet import np, npx; npx.set_np()``) where mxfp16 meets it.

mxfp16's own array work (loss-scale factors, overflow checks, norms, master weights) calls MXNet's
legacy operators, which refuse ``mx.np.ndarray`` ("legacy operator which can only accept legacy
ndarrays").  Every such call takes :func:`legacy` views: ``as_nd_ndarray()`` shares the memory and
the autograd history (zero copy), and :func:`like` hands a result back as an ``mx.np.ndarray``
where the caller gave one.  A network of the NumPy interface is traced with numpy symbols
(:func:`input_symbol`) in the semantics it was cast in (:func:`semantics`).
"""
import contextlib
import re

import mxnet as mx

__all__ = ["is_numpy", "legacy", "as_numpy", "like", "numpy_mode", "input_symbol", "legacy_symbol",
           "numpy_symbol", "semantics", "save_arrays", "load_arrays", "FrontEndError",
           "front_end_error"]

#: How MXNet's front end refuses an array of the other interface (its ``_verify_*`` checks).
_WRONG_FRONT_END = re.compile(r"(numpy operator which can only accept MXNet numpy ndarrays"
                              r"|legacy operator which can only accept legacy ndarrays)")


def numpy_mode():
    """Whether the NumPy interface is on (``npx.set_np()``, or inside ``mx.util.np_array()``)."""
    return mx.util.is_np_array()


def is_numpy(value):
    """Whether ``value`` is an ``mx.np.ndarray``.

    Examples
    --------
    >>> import mxnet as mx
    >>> is_numpy(mx.np.ones(2)), is_numpy(mx.nd.ones(2))
    (True, False)
    """
    return isinstance(value, mx.np.ndarray)


def legacy(array):
    """``array`` as a legacy ``NDArray``: the same memory and autograd history (no copy) for an
    ``mx.np.ndarray``, the array itself otherwise.

    Examples
    --------
    >>> import mxnet as mx
    >>> x = mx.np.zeros(2)
    >>> view = legacy(x)
    >>> view[:] = 3
    >>> type(view).__name__, x.tolist()
    ('NDArray', [3.0, 3.0])
    """
    return array.as_nd_ndarray() if isinstance(array, mx.np.ndarray) else array


def as_numpy(array):
    """``array`` as an ``mx.np.ndarray`` (no copy).

    Examples
    --------
    >>> import mxnet as mx
    >>> type(as_numpy(mx.nd.ones(2))).__name__
    'ndarray'
    """
    return array if is_numpy(array) else array.as_np_ndarray()


def like(result, template):
    """``result`` as an ``mx.np.ndarray`` when ``template`` is one (no copy), else as it is; nested
    lists and tuples are converted item by item against the same template.

    Examples
    --------
    >>> import mxnet as mx
    >>> type(like(mx.nd.ones(2), mx.np.ones(1))).__name__
    'ndarray'
    """
    if isinstance(result, (list, tuple)):
        return type(result)(like(item, template) for item in result)
    if is_numpy(template) and isinstance(result, mx.nd.NDArray) and not is_numpy(result):
        return result.as_np_ndarray()
    return result


def input_symbol(name, numpy=False):
    """A data input of a traced graph: a numpy symbol for a NumPy-interface block."""
    sym = mx.sym.var(name)
    return sym.as_np_ndarray() if numpy else sym


def legacy_symbol(sym):
    """A numpy symbol as a legacy Symbol of the same graph (a shallow copy); others unchanged."""
    return sym.as_nd_ndarray() if isinstance(sym, mx.sym.Symbol) else sym


def numpy_symbol(sym, numpy=True):
    """A legacy Symbol as a numpy symbol of the same graph when ``numpy`` (a shallow copy)."""
    return sym.as_np_ndarray() if numpy else sym


@contextlib.contextmanager
def semantics(numpy):
    """Run the body with the NumPy interface on (``numpy=True``) or off, shapes and arrays both,
    whatever the process's mode: a network is traced in the mode it was cast in."""
    if numpy:  # MXNet refuses numpy arrays without numpy shapes: shapes on first, off last
        with mx.util.np_shape(True), mx.util.np_array(True):
            yield
    else:
        with mx.util.np_array(False), mx.util.np_shape(False):
            yield


def save_arrays(filename, arrays):
    """Save ``{name: array}`` as Gluon's ``save_parameters`` does in the current front end:
    ``npx.save`` of ``mx.np.ndarray`` with the NumPy interface on, ``nd.save`` of NDArrays
    otherwise (either kind of array given).

    Examples
    --------
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> path = os.path.join(tempfile.mkdtemp(), 'w.params')
    >>> save_arrays(path, {'w': mx.np.ones((2, 3))})  # legacy mode: a legacy file
    >>> mx.nd.load(path)['w'].shape
    (2, 3)
    """
    if numpy_mode():
        mx.npx.save(filename, {key: as_numpy(value) for key, value in arrays.items()})
    else:
        mx.nd.save(filename, {key: legacy(value) for key, value in arrays.items()})


def load_arrays(filename):
    """``{name: array}`` of a parameter file written in either front end, as arrays of the current
    one.  Gluon's ``load_parameters`` reads legacy files with the NumPy interface on; this reads the
    reverse too, which MXNet refuses ("ndarray was saved in np shape semantics, must be loaded in
    the same semantics").

    Examples
    --------
    >>> import os, tempfile
    >>> import mxnet as mx
    >>> path = os.path.join(tempfile.mkdtemp(), 'w.params')
    >>> with mx.util.np_shape(True), mx.util.np_array(True):
    ...     mx.npx.save(path, {'w': mx.np.ones((2, 3))})  # Gluon's numpy-mode save_parameters
    >>> loaded = load_arrays(path)  # in legacy mode
    >>> type(loaded['w']).__name__, loaded['w'].shape
    ('NDArray', (2, 3))
    """
    numpy = numpy_mode()
    try:
        loaded = mx.npx.load(filename) if numpy else mx.nd.load(filename)
    except mx.base.MXNetError as error:
        if "is_np_shape" not in str(error):
            raise
        with mx.util.np_array(False), mx.util.np_shape(not numpy):
            loaded = mx.nd.load(filename)
    if not isinstance(loaded, dict):
        return {}
    return {key: value.as_np_ndarray() if numpy else legacy(value)
            for key, value in loaded.items()}


class FrontEndError(TypeError):
    """A block traced in the other front end than its layers' (NumPy interface or legacy)."""


def front_end_error(error, block):
    """A :class:`FrontEndError` (a ``TypeError``) that names the fix when ``error`` is MXNet
    refusing an array or symbol of the other front end while tracing ``block``; None for
    another error."""
    if not _WRONG_FRONT_END.search(str(error)):
        return None
    name = type(block).__name__
    if "numpy operator" in str(error):
        fix = (f"{name} calls NumPy-interface operators (F.npx.*, F.np.*): call "
               "`npx.set_np()` before cast_block, as before building and calling the network")
    else:
        fix = (f"{name} calls legacy operators (F.relu, F.FullyConnected, mx.nd.*) but was cast "
               "with the NumPy interface on: cast it with `npx.reset_np()` (or inside "
               "`mx.util.np_array(False)`), or write its hybrid_forward with F.np / F.npx")
    return FrontEndError(f"{name} cannot be traced in this front end: {fix}. MXNet said: "
                     f"{' '.join(str(error).split())[:300]}")
