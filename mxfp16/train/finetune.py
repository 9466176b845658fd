"""Fine-tuning: a pretrained float32 network with a new classifier, trained in float16.

The network comes from the model zoo's pretrained weights or from an MXNet checkpoint (a Module's
``prefix-symbol.json`` + ``prefix-NNNN.params``, a Gluon ``export``, or a checkpoint of
``scripts/train_imagenet.py``).  Its classifier (the last FullyConnected or Convolution layer) is
replaced by one with ``num_classes`` outputs, which works for any zoo classification network; the rest
is the backbone, which can be frozen or trained at a lower learning rate.  Training then runs as in
:func:`mxfp16.train.loop.train`: cast_block or cast_symbol + cast_params, loss scaling, checkpoints.
"""
import dataclasses
import json
import logging

import mxnet as mx

from ..models import (DATA_INPUT, MXNET_ZOO_MODELS, Network, block_to_network, checkpoint_files,
                      default_initializer, get_network, load_mxnet_checkpoint, mxnet_zoo_checkpoint)
from .state.checkpoint import CheckpointError, check_finite, verify_mxnet_files
from .loop import train

log = logging.getLogger("mxfp16.train")

#: Layers a classifier can end with, and the attribute holding their number of outputs.
CLASSIFIER_OPS = {"FullyConnected": "num_hidden", "Convolution": "num_filter"}


def zoo_network(name, root):
    """The model zoo's pretrained float32 network ``name`` (weights read from ``root``).

    Raises
    ------
    ValueError
        For an unknown name.
    FileNotFoundError
        When the weights are not in ``root`` and cannot be downloaded, naming the file to put there.
    """
    return block_to_network(get_network(name, pretrained=True, root=root))


def checkpoint_network(prefix, epoch):
    """The float32 network of the MXNet checkpoint ``prefix-symbol.json`` + ``prefix-EPOCH.params``
    (:func:`mxfp16.models.load_mxnet_checkpoint`), with the flags to check in its error.

    Raises
    ------
    mxfp16.train.state.checkpoint.CheckpointError
        If the files are missing or unreadable.
    """
    verify_mxnet_files(prefix, epoch)
    try:
        network = load_mxnet_checkpoint(prefix, epoch)
    except (OSError, ValueError) as error:
        symbol_file, params_file = checkpoint_files(prefix, epoch)
        reason = str(error).split(":")[0]
        raise CheckpointError(f"MXNet checkpoint {prefix!r} epoch {epoch} cannot be loaded "
                              f"({reason}): expected {symbol_file} and {params_file}; check "
                              "--pretrained-model and --load-epoch") from None
    check_finite({**network.arg_params, **network.aux_params},
                 f"MXNet checkpoint {checkpoint_files(prefix, epoch)[1]}")
    return network


def _replace_last_layer(symbol, num_classes):
    """The graph with its last FullyConnected/Convolution giving ``num_classes`` outputs, and the
    names of that layer's parameters."""
    graph = json.loads(symbol.tojson(remove_amp_cast=False))
    nodes = graph["nodes"]
    layers = [i for i, node in enumerate(nodes) if node["op"] in CLASSIFIER_OPS]
    if not layers:
        raise ValueError("the network has no FullyConnected or Convolution layer to replace with a "
                         f"{num_classes}-class classifier: pass a classification network")
    layer = nodes[layers[-1]]
    layer["attrs"][CLASSIFIER_OPS[layer["op"]]] = str(num_classes)
    head = []
    for source, _, _ in layer["inputs"]:
        node = nodes[source]
        if node["op"] == "null" and node["name"] != DATA_INPUT:
            node.get("attrs", {}).pop("__shape__", None)  # the old class count's shape
            head.append(node["name"])
    return mx.sym.load_json(json.dumps(graph)), head


def _classifier_after(symbol, layer, num_classes):
    """The graph cut after ``layer`` (MXNet's ``--layer-before-fullc``) with a new FullyConnected
    classifier, and that classifier's parameter names."""
    internals = symbol.get_internals()
    output = f"{layer}_output"
    if output not in internals.list_outputs():
        layers = [name[:-len("_output")] for name in internals.list_outputs()
                  if name.endswith("_output")]
        raise ValueError(f"--layer-before-fullc {layer}: the network has no layer {layer!r}; its "
                         f"last layers are {', '.join(layers[-4:])}")
    body = internals[output]
    name = "fc" if "fc_weight" not in body.list_arguments() else "fc_new"
    classifier = mx.sym.FullyConnected(body, num_hidden=num_classes, name=name)
    return classifier, [f"{name}_weight", f"{name}_bias"]


def replace_classifier(network, num_classes, image_shape, layer_before_fullc=None):
    """``network`` with a new, freshly initialized classifier of ``num_classes`` outputs.

    Parameters
    ----------
    network : mxfp16.models.Network
        A float32 classification network.
    num_classes : int
    image_shape : tuple of int
        ``(3, height, width)``, to infer the new layer's shapes.
    layer_before_fullc : str, optional
        Put the new classifier (a FullyConnected named ``fc``) after this layer, MXNet's
        fine-tune.py rule (e.g. ``flatten0``); default: replace the last FullyConnected or
        Convolution layer.

    Returns
    -------
    tuple
        ``(Network, head_names)``: the new network (backbone values kept) and the names of the new
        classifier's parameters.

    Raises
    ------
    ValueError
        If the network has no FullyConnected or Convolution layer.

    Examples
    --------
    >>> from mxfp16.models import new_network
    >>> network = new_network('mobilenet0.25', 1000, (3, 32, 32))
    >>> tuned, head = replace_classifier(network, 4, (3, 32, 32))
    >>> head, tuned.arg_params[head[0]].shape
    (['mobilenet0_dense0_weight', 'mobilenet0_dense0_bias'], (4, 256))
    """
    if layer_before_fullc:
        symbol, head = _classifier_after(network.symbol, layer_before_fullc, num_classes)
    else:
        symbol, head = _replace_last_layer(network.symbol, num_classes)
    shapes = dict(zip(symbol.list_arguments(),
                      symbol.infer_shape(**{DATA_INPUT: (1,) + tuple(image_shape)})[0]))
    init = default_initializer()
    arg_params = {k: v for k, v in network.arg_params.items() if k in shapes and k not in head}
    auxiliary = set(symbol.list_auxiliary_states())
    for name in head:
        arg_params[name] = mx.nd.zeros(shapes[name])
        init(mx.init.InitDesc(name), arg_params[name])
    aux_params = {k: v for k, v in network.aux_params.items() if k in auxiliary}
    return Network(symbol, arg_params, aux_params, block_prefixes=network.block_prefixes), head


def pretrained_network(config):
    """``(network, description)`` of the pretrained network a fine-tuning run starts from: MXNet's
    model zoo (``--pretrained-model imagenet1k-resnet-50``, :func:`mxfp16.models.mxnet_zoo_checkpoint`,
    as MXNet's fine-tune.py looks names up first), an MXNet checkpoint (``--pretrained-model PREFIX
    --load-epoch N``) or the model zoo's ``--network`` weights."""
    if config.pretrained_model in MXNET_ZOO_MODELS:
        prefix, epoch = mxnet_zoo_checkpoint(config.pretrained_model, config.model_root)
    elif config.pretrained_model:
        prefix, epoch = config.pretrained_model, config.load_epoch
    else:
        return zoo_network(config.network, config.model_root), f"pretrained {config.network}"
    if config.network != type(config)().network or config.num_layers is not None:
        log.info("--network %s is not used: the network is --pretrained-model's", config.network)
    return checkpoint_network(prefix, epoch), f"checkpoint {prefix}-{epoch:04d}"


def fine_tune(config, metrics_path=None):
    """Fine-tune the pretrained network a checked :class:`~mxfp16.train.cli.config.FineTuneConfig` names.

    The backbone (every parameter but the new classifier's) is frozen with
    ``config.freeze_backbone``, else trained at ``config.lr_mult`` times the learning rate.

    Returns
    -------
    dict
        The last epoch record, as :func:`mxfp16.train.loop.train` returns it.

    Raises
    ------
    ValueError, FileNotFoundError
        For a missing or unusable pretrained network, or any error :func:`~mxfp16.train.loop.train`
        raises.
    """
    network, source = pretrained_network(config)
    network, head = replace_classifier(network, config.num_classes, config.image_shape,
                                       config.layer_before_fullc)
    backbone = [name for name in network.param_names if name not in head]
    network = dataclasses.replace(
        network, fixed_param_names=tuple(backbone) if config.freeze_backbone else (),
        lr_mult={name: config.lr_mult for name in backbone} if config.lr_mult != 1 else {})
    log.info("fine-tuning %s: new %d-class classifier %s; backbone of %d parameters %s", source,
             config.num_classes, ", ".join(head), len(backbone),
             "frozen" if config.freeze_backbone else f"at {config.lr_mult:g} x the learning rate")
    return train(config, network=network, metrics_path=metrics_path)
