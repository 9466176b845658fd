"""ONNX files from MXNet graphs, with MXNet 1.9.1's own exporter (``mx.onnx``), checked.

``mx.onnx`` imports ``onnx.mapping``, which onnx 1.19 removed: install ``onnx<1.19`` (the extra
``pip install -e ".[onnx]"``).  MXNet 1.9.1 translates its ops for ONNX opsets 12 and 13 only.
onnxruntime's wheels for Python 3.11 need numpy >= 1.24, which MXNet 1.9.1 cannot import, so
onnxruntime runs in an interpreter of its own (a venv): :func:`run_onnxruntime` calls it with the
inputs and outputs in ``.npy`` files.
"""
import json
import os
import subprocess
import tempfile

import mxnet as mx
import numpy as np

from .checkpoints.atomic import StagedFiles

#: The ONNX opset :func:`export_onnx` writes by default: the newest MXNet 1.9.1 translates to.
DEFAULT_OPSET = 13

#: What to install for ONNX export, in error messages.
ONNX_REQUIREMENT = "onnx<1.19"

_ORT_SCRIPT = """
import json, sys
import numpy as np
import onnxruntime as ort
model, inputs, output = sys.argv[1:4]
session = ort.InferenceSession(model, providers=["CPUExecutionProvider"])
feed = {i.name: np.load(inputs) for i in session.get_inputs()[:1]}
np.save(output, session.run(None, feed)[0])
print(json.dumps({"onnxruntime": ort.__version__, "numpy": np.__version__}))
"""


def import_onnx():
    """The ``onnx`` module, or ``RuntimeError`` saying what to install.

    Raises
    ------
    RuntimeError
        Without onnx, or with an onnx that MXNet 1.9.1's exporter cannot use (>= 1.19).
    """
    try:
        import onnx
    except ImportError:
        raise RuntimeError(f"ONNX export needs the onnx package: pip install '{ONNX_REQUIREMENT}' "
                           "(or pip install -e '.[onnx]')") from None
    try:
        from onnx import mapping  # noqa: F401  (mx.onnx's import)
    except ImportError:
        raise RuntimeError(f"onnx {onnx.__version__} has no onnx.mapping, which MXNet 1.9.1's "
                           f"exporter imports: pip install '{ONNX_REQUIREMENT}'") from None
    return onnx


def onnx_opsets():
    """The ONNX opsets MXNet's exporter translates its ops to (``(12, 13)`` in MXNet 1.9.1)."""
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
    return tuple(sorted(MXNetGraph.registry_))


def check_opset(opset):
    """Return ``opset`` if MXNet can export it, else raise ``ValueError`` naming those it can
    (``RuntimeError`` without a usable onnx package)."""
    import_onnx()
    opsets = onnx_opsets()
    if opset not in opsets:
        raise ValueError(f"ONNX opset {opset}: MXNet {mx.__version__} exports opsets "
                         f"{', '.join(map(str, opsets))} only; pass one of them (default "
                         f"{DEFAULT_OPSET})")
    return opset


def export_onnx(sym, params, onnx_file, input_shape, opset=DEFAULT_OPSET):
    """Write ``sym`` with ``params`` as an ONNX model (batch dimension dynamic) and check it.

    Parameters
    ----------
    sym : mx.sym.Symbol
        A graph with one input ``data`` (float32), e.g. :func:`mxfp16.export`'s.
    params : dict of str to NDArray
        Its parameters (``arg:``/``aux:`` prefixes allowed).
    onnx_file : str
    input_shape : tuple of int
        ``(batch, C, H, W)``; the batch is left dynamic in the file.
    opset : int
        One of :func:`onnx_opsets`.

    Returns
    -------
    str
        ``onnx_file``, written atomically after ``onnx.checker.check_model(full_check=True)``
        (which also type-checks every node) passed.

    Raises
    ------
    RuntimeError
        Without a usable onnx package, or when MXNet cannot translate the graph or the result fails
        the checker (the message names the node).
    ValueError
        For an opset MXNet cannot export.
    """
    onnx = import_onnx()
    check_opset(opset)
    from mxnet.onnx.mx2onnx._export_onnx import MXNetGraph
    params = {(k[4:] if k.startswith(("arg:", "aux:")) else k): v for k, v in params.items()}
    dynamic = [(None,) + tuple(input_shape[1:])]
    try:
        graph = MXNetGraph().create_onnx_graph_proto(
            sym, params, [tuple(input_shape)], [onnx.TensorProto.FLOAT], opset_version=opset,
            dynamic=True, dynamic_input_shapes=dynamic)
        model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", opset)])
        onnx.checker.check_model(model, full_check=True)
    except (AttributeError, KeyError, ValueError, TypeError, AssertionError,
            onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as error:
        reason = " ".join(str(error).split())[:240]
        raise RuntimeError(f"MXNet's ONNX exporter cannot write this graph at opset {opset} "
                           f"({reason}): export the float32 graph to ONNX (a float16 graph keeps "
                           "normalization parameters float32, which opsets 12-13 do not "
                           "allow)") from None
    folder = os.path.dirname(os.path.abspath(onnx_file))
    with StagedFiles(folder) as staged:
        staged.write(onnx_file, lambda path: onnx.save(model, path))
    return onnx_file


def onnx_summary(onnx_file):
    """``{'opset', 'inputs', 'outputs', 'initializers', 'dtypes'}`` of an ONNX file: the graph's
    data inputs and outputs with their shapes (``None`` for dynamic), as the checker sees them."""
    onnx = import_onnx()
    model = onnx.load(onnx_file)
    onnx.checker.check_model(model, full_check=True)
    names = {init.name for init in model.graph.initializer}

    def shape(value):
        return [d.dim_value if d.HasField("dim_value") else None
                for d in value.type.tensor_type.shape.dim]
    return {"opset": model.opset_import[0].version,
            "inputs": {v.name: shape(v) for v in model.graph.input if v.name not in names},
            "outputs": {v.name: shape(v) for v in model.graph.output},
            "initializers": len(names),
            "dtypes": sorted({onnx.helper.tensor_dtype_to_np_dtype(i.data_type).name
                              for i in model.graph.initializer})}


def run_onnxruntime(python, onnx_file, data):
    """Run ``onnx_file`` on ``data`` with onnxruntime in the interpreter ``python`` (a venv with
    onnxruntime, see the module notes); return ``(outputs, versions)``.

    Raises
    ------
    RuntimeError
        If the interpreter cannot run it, with its last error line.
    """
    with tempfile.TemporaryDirectory() as folder:
        inputs, outputs = os.path.join(folder, "in.npy"), os.path.join(folder, "out.npy")
        np.save(inputs, np.asarray(data, dtype=np.float32))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        try:
            done = subprocess.run([python, "-c", _ORT_SCRIPT, onnx_file, inputs, outputs],
                                  capture_output=True, text=True, env=env, timeout=600)
        except OSError as error:
            raise RuntimeError(f"onnxruntime interpreter {python!r} cannot be started ({error}): "
                               "pass the python of a venv with onnxruntime") from None
        if done.returncode:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise RuntimeError(f"onnxruntime ({python}) failed on {onnx_file}: {last[:240]}")
        return np.load(outputs), json.loads(done.stdout.strip().splitlines()[-1])


def default_onnxruntime_python():
    """``$MXFP16_ONNXRUNTIME_PYTHON``, the interpreter of a venv with onnxruntime, or None."""
    return os.environ.get("MXFP16_ONNXRUNTIME_PYTHON") or None


def compare_outputs(reference, outputs):
    """``(largest absolute difference, share of equal arg-max classes)`` of two ``(N, K)``
    arrays.

    Examples
    --------
    >>> compare_outputs(np.array([[0.0, 1.0]]), np.array([[0.0, 1.5]]))
    (0.5, 1.0)
    """
    reference, outputs = np.asarray(reference, np.float64), np.asarray(outputs, np.float64)
    agreement = float((reference.argmax(-1) == outputs.argmax(-1)).mean())
    return float(np.abs(reference - outputs).max()), agreement


__all__ = ["DEFAULT_OPSET", "export_onnx", "onnx_opsets", "check_opset", "onnx_summary",
           "run_onnxruntime", "compare_outputs", "import_onnx", "default_onnxruntime_python"]
