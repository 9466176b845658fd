"""Networks by name, from GluonCV's model zoo (which holds MXNet's ``gluon.model_zoo.vision`` ones
too), and the one loader of plain MXNet checkpoints."""
import difflib
import json
import os
import re
from dataclasses import dataclass, field

import mxnet as mx
from gluoncv import model_zoo as gcv_zoo
from gluoncv.model_zoo import model_store as gcv_store

from . import mxnet_internals, numpy_interface
from .dtypes import LABELLED_HEADS
from .numpy_interface import legacy

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


#: MXNet example names (``--network`` of example/image-classification, its ``symbols/`` files)
#: whose zoo network does not depend on ``--num-layers``.
EXAMPLE_FIXED_NETWORKS = {"alexnet": "alexnet", "googlenet": "googlenet",
                          "inception-v3": "inceptionv3", "mobilenet": "mobilenet1.0",
                          "mobilenetv2": "mobilenetv2_1.0"}

#: MXNet example networks the zoo does not have, and the closest zoo networks to use instead.
EXAMPLE_NETWORKS_NOT_IN_ZOO = {
    "inception-bn": ("googlenet", "inceptionv3"),
    "inception-v4": ("inceptionv3", "xception"),
    "inception-resnet-v2": ("inceptionv3", "xception", "se_resnext101_32x4d"),
    "lenet": ("cifar_resnet20_v1", "mobilenet0.25"),
    "mlp": ("cifar_resnet20_v1", "mobilenet0.25"),
}

#: Example networks whose zoo name carries ``--num-layers``: name -> zoo pattern.
EXAMPLE_LAYERED_NETWORKS = {"resnet-v1": "resnet{}_v1", "resnet": "resnet{}_v2",
                            "resnext": "resnext{}_32x4d", "vgg": "vgg{}"}

#: Side (pixels) up to which the example's ``symbols/resnet.py`` builds its CIFAR ResNet.
CIFAR_IMAGE_SIDE = 32


def example_network_names():
    """The ``--network`` names of MXNet's example/image-classification that map to a zoo network."""
    return sorted(set(EXAMPLE_FIXED_NETWORKS) | set(EXAMPLE_LAYERED_NETWORKS))


def resolve_network_name(name, num_layers=None, image_side=None, batch_norm=False):
    """The model-zoo name of an MXNet example network (``--network NAME --num-layers N``), or
    ``name`` itself when the zoo knows it.

    ``resnet-v1`` is ``resnet{N}_v1`` and ``resnet`` is ``resnet{N}_v2``; for images of side <=
    :data:`CIFAR_IMAGE_SIDE` both are the CIFAR ResNets (``cifar_resnet{N}_v2``), as the example's
    ``symbols/resnet.py`` builds them.  ``resnext`` is ``resnext{N}_32x4d``, ``vgg`` is ``vgg{N}``
    (``vgg{N}_bn`` with ``batch_norm``), ``inception-v3`` is ``inceptionv3``.

    Parameters
    ----------
    name : str
        A zoo name or an example name.
    num_layers : int, optional
        ``--num-layers``, needed by the layered example networks.
    image_side : int, optional
        The smaller side of the input images.
    batch_norm : bool
        VGG with batch normalization.

    Returns
    -------
    str
        A model-zoo name.

    Raises
    ------
    ValueError
        For an example network the zoo does not have (naming the closest zoo networks), a missing or
        unavailable ``num_layers``, or an unknown name.

    Examples
    --------
    >>> resolve_network_name('resnet-v1', 50), resolve_network_name('resnet', 110, image_side=28)
    ('resnet50_v1', 'cifar_resnet110_v2')
    >>> resolve_network_name('vgg', 16, batch_norm=True), resolve_network_name('inception-v3')
    ('vgg16_bn', 'inceptionv3')
    """
    if name in EXAMPLE_NETWORKS_NOT_IN_ZOO:
        raise ValueError(f"MXNet example network {name!r} has no model-zoo equivalent: use the "
                         f"closest zoo networks, {', '.join(EXAMPLE_NETWORKS_NOT_IN_ZOO[name])}")
    if name in EXAMPLE_FIXED_NETWORKS:
        return EXAMPLE_FIXED_NETWORKS[name]
    if name in EXAMPLE_LAYERED_NETWORKS:
        zoo_name = _layered_network(name, num_layers, image_side)
    else:
        zoo_name = name
    if batch_norm and zoo_name.startswith("vgg") and not zoo_name.endswith("_bn"):
        zoo_name += "_bn"
    return check_network_name(zoo_name)


def _layered_network(name, num_layers, image_side):
    if num_layers is None:
        raise ValueError(f"MXNet example network {name!r} needs --num-layers, e.g. --network "
                         f"{name} --num-layers 50")
    pattern = EXAMPLE_LAYERED_NETWORKS[name]
    if name.startswith("resnet") and image_side is not None and image_side <= CIFAR_IMAGE_SIDE:
        pattern = "cifar_" + pattern
    zoo_name = pattern.format(num_layers)
    if zoo_name not in network_names():
        matcher = re.compile(re.escape(pattern).replace(r"\{\}", r"(\d+)") + "$")
        layers = sorted(int(m.group(1)) for m in map(matcher.match, network_names()) if m)
        raise ValueError(f"--network {name} --num-layers {num_layers}: the model zoo has no "
                         f"{zoo_name} (it has --num-layers {', '.join(map(str, layers))} of "
                         f"{pattern.format('N')})")
    return zoo_name


def model_root(root=DEFAULT_MODEL_ROOT):
    """The folder GluonCV reads pretrained weights from: ``$MXNET_HOME/models`` when ``MXNET_HOME``
    is set (GluonCV's rule), else ``root``."""
    if "MXNET_HOME" in os.environ:
        return os.path.join(os.environ["MXNET_HOME"], "models")
    return os.path.expanduser(root)


def pretrained_file(name, root=DEFAULT_MODEL_ROOT):
    """The file GluonCV's model store loads ``name``'s pretrained weights from."""
    return os.path.join(model_root(root), f"{name}-{gcv_store.short_hash(name)}.params")


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
        Uninitialized unless ``pretrained``.  Its parameter names are the same in every call
        (each network gets a fresh name scope).

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
    # A fresh name scope gives the same parameter names (``resnetv10_conv0_weight``) in every call,
    # so a checkpoint saved by one process loads by name into a network built by another.
    with mx.name.NameManager():
        if not pretrained:
            return gcv_zoo.get_model(name, classes=num_classes, **kwargs)
        return _pretrained(name, root, **kwargs)


def _pretrained(name, root, **kwargs):
    path = pretrained_file(name, root)
    existed = os.path.exists(path)
    try:
        return gcv_zoo.get_model(name, pretrained=True, root=root, **kwargs)
    except (OSError, mx.base.MXNetError, AssertionError, ValueError) as err:
        if existed and not isinstance(err, OSError):
            raise
        problem = "fail the model store's checksum" if existed else "are missing"
        raise FileNotFoundError(
            f"pretrained weights for {name!r} {problem} and could not be downloaded "
            f"({type(err).__name__}): put the file {os.path.basename(path)} in {model_root(root)} "
            f"(from a machine with internet: python -c \"import gluoncv; "
            f"gluoncv.model_zoo.get_model('{name}', pretrained=True)\", then copy "
            f"~/.mxnet/models/{os.path.basename(path)})") from None


#: The input name of every network graph (MXNet's convention for image classification).
DATA_INPUT = "data"


def default_initializer():
    """Initializer of new networks and new classifier heads: He (MSRA) initialization, as GluonCV's
    ImageNet recipe uses."""
    return mx.init.MSRAPrelu()


@dataclass
class Network:
    """A float32 classification network as a graph plus its parameter values, for either API.

    Both APIs train from this one description: Gluon wraps ``symbol`` in a ``SymbolBlock``, Module
    adds a ``SoftmaxOutput`` head.  Checkpoints store exactly these three things.

    Attributes
    ----------
    symbol : mx.sym.Symbol
        The float32 graph from the ``data`` input to the logits (no softmax).
    arg_params, aux_params : dict of str to NDArray
        float32 values of every parameter of ``symbol`` (arguments and auxiliary states).
    fixed_param_names : tuple of str
        Parameters that are not trained (a frozen backbone).
    lr_mult : dict of str to float
        Learning-rate multipliers by parameter name (parameters not named train at 1).
    block_prefixes : dict of str to str
        ``{block path: Gluon prefix}`` of the Gluon network the graph was traced from
        (``{'features.3': 'resnetv10_stage1_'}``), which names the graph's ops: how
        ``--keep-float32 features.3`` finds them; empty for a graph read from a checkpoint.
    """

    symbol: mx.sym.Symbol
    arg_params: dict
    aux_params: dict
    fixed_param_names: tuple = ()
    lr_mult: dict = field(default_factory=dict)
    block_prefixes: dict = field(default_factory=dict)

    @property
    def param_names(self):
        """Names of the trainable arguments (every argument but the data input)."""
        return [name for name in self.symbol.list_arguments() if name != DATA_INPUT]


def block_to_network(block):
    """The :class:`Network` of an initialized Gluon block (shapes known): its graph and float32 values.

    Examples
    --------
    >>> import mxnet as mx
    >>> from mxnet.gluon import nn
    >>> block = nn.Dense(2, in_units=3, prefix='fc_')
    >>> block.initialize()
    >>> network = block_to_network(block)
    >>> sorted(network.arg_params), network.arg_params['fc_weight'].shape
    (['fc_bias', 'fc_weight'], (2, 3))
    """
    symbol = block(mx.sym.var(DATA_INPUT))
    params = block.collect_params()
    # The first device's copy: data() alone would look on the default context, not a GPU.
    arg_params = {name: params[name].list_data()[0].astype("float32")
                  for name in symbol.list_arguments() if name != DATA_INPUT}
    aux_params = {name: _device_mean(params[name].list_data()).astype("float32")
                  for name in symbol.list_auxiliary_states()}
    prefixes = {path: child.prefix for path, child in mxnet_internals.block_tree(block)}
    return Network(symbol, arg_params, aux_params, block_prefixes=prefixes)


def _device_mean(arrays):
    """The mean of an auxiliary state's copies, one per device (each device's BatchNorm keeps its
    own running statistics), as Gluon's ``save_parameters`` and Module's ``get_params`` save it."""
    if len(arrays) == 1:
        return arrays[0]
    return mx.nd.add_n(*[array.as_in_context(arrays[0].context) for array in arrays]) / len(arrays)


def new_network(name, num_classes, image_shape, initializer=None, pretrained=False,
                root=DEFAULT_MODEL_ROOT, **kwargs):
    """A freshly initialized model-zoo network (He initialization) as a :class:`Network`.

    Parameters
    ----------
    name : str
        Model-zoo name (see :func:`get_network`).
    num_classes : int
        Output classes.
    image_shape : tuple of int
        ``(3, height, width)``: one forward pass at this size fixes the parameter shapes.
    initializer : mx.init.Initializer, optional
        Default: :func:`default_initializer`.
    pretrained : bool
        Start from the zoo's pretrained weights in ``root`` instead (its 1000 ImageNet classes).
    root : str
        The model store folder of the pretrained weights.
    **kwargs
        Passed on to the zoo's constructor (GluonCV's ``last_gamma``, ``use_se``, ...).

    Returns
    -------
    Network

    Raises
    ------
    ValueError
        For an unknown name, or an image shape the network cannot take.

    Examples
    --------
    >>> network = new_network('mobilenet0.25', 4, (3, 32, 32))
    >>> network.symbol.infer_shape(data=(2, 3, 32, 32))[1]
    [(2, 4)]
    """
    try:
        block = get_network(name, num_classes, pretrained=pretrained, root=root, **kwargs)
    except TypeError:
        raise ValueError(f"network {name!r} does not take the settings "
                         f"{', '.join(f'{k}={v}' for k, v in sorted(kwargs.items()))}: leave "
                         "their flags out for this network") from None
    if not pretrained:
        block.initialize(initializer or default_initializer())
    try:
        block(mx.nd.zeros((1,) + tuple(image_shape)))
    except mx.base.MXNetError as error:
        reason = str(error).strip().splitlines()[0][:200]
        raise ValueError(f"network {name!r} cannot take images of shape {tuple(image_shape)} "
                         f"({reason}): pass a larger --image-shape, e.g. 3,224,224") from None
    return block_to_network(block)


def strip_loss_head(sym):
    """``sym`` without a final labelled loss head (``SoftmaxOutput`` and the like), else ``sym``.

    Examples
    --------
    >>> import mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=2, name='fc')
    >>> strip_loss_head(mx.sym.SoftmaxOutput(fc, name='softmax')).list_outputs()
    ['fc_output']
    """
    if len(sym.list_outputs()) != 1:
        return sym
    graph = json.loads(sym.tojson(remove_amp_cast=False))
    head = graph["nodes"][graph["heads"][0][0]]
    if head["op"] in LABELLED_HEADS:
        return sym.get_children()[0]
    return sym


#: Models of MXNet's example model zoo (``common/modelzoo.py``, ``fine-tune.py
#: --pretrained-model NAME``), saved as ``model/NAME-symbol.json`` + ``model/NAME-0000.params``.
MXNET_ZOO_MODELS = ("imagenet1k-inception-bn", "imagenet1k-resnet-18", "imagenet1k-resnet-34",
                    "imagenet1k-resnet-50", "imagenet1k-resnet-101", "imagenet1k-resnet-152",
                    "imagenet1k-resnext-50", "imagenet1k-resnext-101",
                    "imagenet1k-resnext-101-64x4d", "imagenet11k-resnet-152",
                    "imagenet11k-place365ch-resnet-152", "imagenet11k-place365ch-resnet-50")

#: Where MXNet's example downloads its zoo models, relative to the current folder.
MXNET_ZOO_FOLDER = "model"


def mxnet_zoo_checkpoint(name, root=DEFAULT_MODEL_ROOT):
    """``(prefix, epoch)`` of the MXNet model-zoo model ``name``: ``model/NAME`` in the current
    folder, else ``NAME`` in the model root (``root``, or ``$MXNET_HOME/models``), epoch 0.

    Raises
    ------
    FileNotFoundError
        Naming the two files and where to put them (nothing is downloaded).

    Examples
    --------
    >>> mxnet_zoo_checkpoint('imagenet1k-resnet-50', root='/nonexistent')  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    FileNotFoundError: MXNet model-zoo model 'imagenet1k-resnet-50' not found: put ...
    """
    folders = (MXNET_ZOO_FOLDER, model_root(root))
    for folder in folders:
        prefix = os.path.join(folder, name)
        if all(os.path.isfile(path) for path in checkpoint_files(prefix, 0)):
            return prefix, 0
    symbol_file, params_file = (os.path.basename(path) for path in checkpoint_files(name, 0))
    raise FileNotFoundError(
        f"MXNet model-zoo model {name!r} not found: put {symbol_file} and {params_file} (from "
        f"data.mxnet.io/models, on a machine with internet) in {os.path.abspath(folders[0])} or "
        f"{folders[1]}")


def checkpoint_files(prefix, epoch):
    """The symbol and parameter files of the MXNet checkpoint ``prefix`` at ``epoch``.

    ``mx.model.save_checkpoint`` (Module) and ``HybridBlock.export`` (Gluon) both write
    ``PREFIX-symbol.json`` and ``PREFIX-EPOCH.params`` (epoch with 4 digits).

    Examples
    --------
    >>> checkpoint_files('runs/resnet', 3)
    ('runs/resnet-symbol.json', 'runs/resnet-0003.params')
    """
    return f"{prefix}-symbol.json", f"{prefix}-{int(epoch):04d}.params"


def load_mxnet_checkpoint(prefix, epoch):
    """The float32 :class:`Network` of an MXNet checkpoint, its labelled loss head cut off.

    The one loader of plain MXNet checkpoints: a Module's ``save_checkpoint``, a Gluon ``export``
    or a checkpoint of ``scripts/train_imagenet.py``.

    Parameters
    ----------
    prefix : str
        ``PREFIX`` of ``PREFIX-symbol.json`` and ``PREFIX-EPOCH.params``.
    epoch : int

    Raises
    ------
    FileNotFoundError
        Naming the missing file.
    ValueError
        If a file cannot be read as an MXNet checkpoint.

    Examples
    --------
    >>> import os, tempfile, mxnet as mx
    >>> fc = mx.sym.FullyConnected(mx.sym.var('data'), num_hidden=10, name='fc')
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'module')
    >>> mx.model.save_checkpoint(prefix, 3, mx.sym.SoftmaxOutput(fc, name='softmax'),
    ...                          {'fc_weight': mx.nd.ones((10, 5)), 'fc_bias': mx.nd.zeros(10)}, {})
    >>> network = load_mxnet_checkpoint(prefix, 3)  # the softmax head is cut off
    >>> network.symbol.list_outputs(), sorted(network.arg_params)
    (['fc_output'], ['fc_bias', 'fc_weight'])
    """
    files = checkpoint_files(prefix, epoch)
    for path in files:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"checkpoint file {path} not found: an MXNet checkpoint is the "
                                    f"two files {files[0]} and {files[1]}")
    try:  # the params file of either front end (a NumPy-interface export writes np shapes)
        symbol, saved = mx.sym.load(files[0]), numpy_interface.load_arrays(files[1])
        arg_params = {k[4:]: legacy(v) for k, v in saved.items() if k.startswith("arg:")}
        aux_params = {k[4:]: legacy(v) for k, v in saved.items() if k.startswith("aux:")}
    except mx.base.MXNetError as error:
        reason = str(error).strip().splitlines()[0][:160]
        raise ValueError(f"MXNet checkpoint {prefix!r} epoch {epoch} cannot be loaded ({reason}): "
                         f"expected {files[0]} and {files[1]} as MXNet writes them") from None
    symbol = strip_loss_head(symbol)
    arguments, auxiliary = set(symbol.list_arguments()), set(symbol.list_auxiliary_states())
    return Network(symbol, {k: v.astype("float32") for k, v in arg_params.items() if k in arguments},
                   {k: v.astype("float32") for k, v in aux_params.items() if k in auxiliary})
