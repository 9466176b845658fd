"""Importing mxfp16's MXNet-backed modules, with the one clear error for a numpy MXNet 1.9.1 cannot
import with.

MXNet 1.9.1 reads ``numpy.bool``, which numpy 1.24 removed (and ``numpy.PZERO``, which 2.0 removed),
so ``import mxnet`` fails there with an ``AttributeError`` from inside MXNet that names neither the
cause nor the fix.
"""
import importlib
import re

import numpy as np

#: The first numpy release MXNet 1.9.1 does not import with (``numpy.bool`` removed).
NUMPY_TOO_NEW = (1, 24)


def numpy_too_new(version):
    """Whether MXNet 1.9.1 fails to import with this numpy version.

    Parameters
    ----------
    version : str
        A numpy version, e.g. ``numpy.__version__``.

    Returns
    -------
    bool

    Examples
    --------
    >>> numpy_too_new('1.23.5'), numpy_too_new('1.24.0rc1'), numpy_too_new('2.0.1')
    (False, True, True)
    """
    return tuple(int(part) for part in re.findall(r"\d+", version)[:2]) >= NUMPY_TOO_NEW


def import_core(name):
    """Import a module of mxfp16 that imports MXNet, with a clear error when numpy is too new.

    Parameters
    ----------
    name : str
        The module's full name, e.g. ``'mxfp16.casting'``.

    Returns
    -------
    module

    Raises
    ------
    ImportError
        When MXNet fails to import under numpy 1.24 or newer: names the numpy version and the fix,
        chained from MXNet's own error. Any other import error is raised unchanged.

    Examples
    --------
    >>> import_core('mxfp16.casting').__name__
    'mxfp16.casting'
    """
    try:
        return importlib.import_module(name)
    except (ImportError, AttributeError) as error:
        if not numpy_too_new(np.__version__):
            raise
        numpy_version = ".".join(np.__version__.split(".")[:2])
        raise ImportError(
            f"mxfp16 needs MXNet 1.9.1, which does not import with numpy {numpy_version}: pip "
            "install 'numpy<1.24' (the install pins it); python -m mxfp16.doctor checks the rest"
        ) from error
