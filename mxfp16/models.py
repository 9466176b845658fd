"""Networks by name, from GluonCV's model zoo (which holds MXNet's ``gluon.model_zoo.vision`` ones too)."""
import difflib
import os

import mxnet as mx
from gluoncv import model_zoo as gcv_zoo
from gluoncv.model_zoo import model_store as gcv_store

#: Where pretrained weights are looked for (GluonCV's and MXNet's default model store).
DEFAULT_MODEL_ROOT = os.path.join(os.path.expanduser("~"), ".mxnet", "models")


def network_names():
    """Names :func:`get_network` accepts (GluonCV's model list, which includes MXNet's vision zoo)."""
    return sorted(gcv_zoo.get_model_list())


def check_network_name(name):
    """Return ``name`` if the model zoo knows it, or raise ``ValueError`` with the closest names."""
    names = network_names()
    if name not in names:
        close = difflib.get_close_matches(name, names, n=5, cutoff=0.5)
        hint = f"did you mean {', '.join(close)}?" if close else \
            "see gluoncv.model_zoo.get_model_list() for the full list"
        raise ValueError(f"unknown network {name!r}: {hint}")
    return name


def pretrained_file(name, root=DEFAULT_MODEL_ROOT):
    """The file GluonCV's model store loads ``name``'s pretrained weights from."""
    return os.path.join(os.path.expanduser(root), f"{name}-{gcv_store.short_hash(name)}.params")


def get_network(name, num_classes=1000, pretrained=False, root=DEFAULT_MODEL_ROOT, **kwargs):
    """A model-zoo network by name, optionally with its pretrained weights.

    Parameters
    ----------
    name : str
        A GluonCV / MXNet model-zoo name, e.g. ``'resnet50_v1'``.
    num_classes : int
        Output classes.  With ``pretrained=True`` the network keeps its pretrained 1000-class head;
        replace it for another number of classes (see ``scripts/fine_tune.py``).
    pretrained : bool
        Load pretrained float32 weights from ``root``.  Nothing is downloaded when they are there; with
        no internet a missing file raises ``FileNotFoundError`` naming the file to put there.
    root : str
        The model store folder.
    **kwargs
        Passed on to the zoo's constructor (for example ``thumbnail=True`` for small images).

    Returns
    -------
    gluon.HybridBlock
        Uninitialized unless ``pretrained``.

    Raises
    ------
    ValueError
        For an unknown name, listing the closest known names.
    FileNotFoundError
        When pretrained weights are missing and cannot be downloaded.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = get_network('resnet18_v1', num_classes=10)
    >>> net.initialize()
    >>> net(mx.nd.ones((1, 3, 32, 32))).shape
    (1, 10)
    """
    check_network_name(name)
    if not pretrained:
        return gcv_zoo.get_model(name, classes=num_classes, **kwargs)
    path = pretrained_file(name, root)
    try:
        return gcv_zoo.get_model(name, pretrained=True, root=root, **kwargs)
    except (OSError, mx.base.MXNetError, AssertionError, ValueError) as err:
        if os.path.exists(path):
            raise
        raise FileNotFoundError(
            f"pretrained weights for {name!r} are not in {root} and could not be downloaded "
            f"({type(err).__name__}): put the file {os.path.basename(path)} there "
            f"(from a machine with internet: python -c \"import gluoncv; "
            f"gluoncv.model_zoo.get_model('{name}', pretrained=True)\", then copy "
            f"~/.mxnet/models/{os.path.basename(path)})") from None
