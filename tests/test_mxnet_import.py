"""``import mxfp16`` without MXNet, the public names on first use, and the one clear error when
numpy is too new for MXNet 1.9.1 (a fake ``mxnet`` that raises MXNet's own error, in a subprocess)."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

import mxfp16
from mxfp16.mxnet_import import import_core

ROOT = pathlib.Path(__file__).resolve().parents[1]

#: What ``import mxnet`` 1.9.1 raises under numpy 1.24 to 1.26 and under numpy 2 (the first line of
#: numpy's message).
NUMPY_BOOL_ERROR = "AttributeError(\"module 'numpy' has no attribute 'bool'.\")"
NUMPY_PZERO_ERROR = "AttributeError('`np.PZERO` was removed in the NumPy 2.0 release.')"

#: Prints, as JSON, how ``import mxfp16`` and the first use of a public name go.
PROGRAM = """
import json, sys, numpy
numpy.__version__ = sys.argv[1]
import mxfp16
result = {"mxnet_imported": "mxnet" in sys.modules}
for use in ("mxfp16.cast_block", "from mxfp16 import Trainer"):
    try:
        exec(use if use.startswith("from") else "x = " + use)
    except Exception as error:
        result[use] = [type(error).__name__, str(error), type(error.__cause__).__name__]
print(json.dumps(result))
"""


def run_program(tmp_path, numpy_version, error=None):
    """:data:`PROGRAM` under ``numpy_version``, with a fake ``mxnet`` raising ``error`` if given."""
    if error is not None:
        (tmp_path / "mxnet").mkdir()
        (tmp_path / "mxnet" / "__init__.py").write_text(f"raise {error}\n")
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", PROGRAM, numpy_version], cwd=ROOT, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_import_mxfp16_and_its_doctor_do_not_import_mxnet():
    program = ("import sys, mxfp16, mxfp16.doctor; "
               "print(sorted(name for name in sys.modules if name.split('.')[0] == 'mxnet'))")
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True)
    assert (done.returncode, done.stdout, done.stderr) == (0, "[]\n", "")


@pytest.mark.parametrize("numpy_version, error, shown", [("1.26.4", NUMPY_BOOL_ERROR, "1.26"),
                                                         ("2.0.2", NUMPY_PZERO_ERROR, "2.0")])
def test_numpy_too_new_is_one_clear_import_error(tmp_path, numpy_version, error, shown):
    result = run_program(tmp_path, numpy_version, error)
    message = (f"mxfp16 needs MXNet 1.9.1, which does not import with numpy {shown}: pip install "
               "'numpy<1.24' (the install pins it); python -m mxfp16.doctor checks the rest")
    assert result == {"mxnet_imported": False,
                      "mxfp16.cast_block": ["ImportError", message, "AttributeError"],
                      "from mxfp16 import Trainer": ["ImportError", message, "AttributeError"]}


def test_other_import_errors_are_raised_unchanged(tmp_path):
    result = run_program(tmp_path, "1.23.5", "OSError('libgfortran.so.5: cannot open')")
    assert result["mxfp16.cast_block"] == ["OSError", "libgfortran.so.5: cannot open", "NoneType"]


@pytest.mark.slow
def test_public_names_load_on_first_use(tmp_path):
    assert run_program(tmp_path, "1.23.5") == {"mxnet_imported": False}  # and no error on use
    from mxfp16 import Trainer, cast_block
    assert (cast_block, Trainer) == (import_core("mxfp16.casting").cast_block,
                                     import_core("mxfp16.trainer").Trainer)
    assert all(getattr(mxfp16, name) is not None for name in mxfp16.__all__)
    assert set(mxfp16.__all__) <= set(dir(mxfp16))
    assert mxfp16.optimizers.__name__ == "mxfp16.optimizers"  # core modules stay attributes
    with pytest.raises(AttributeError, match="module 'mxfp16' has no attribute 'nothing'"):
        mxfp16.nothing  # noqa: B018
