"""The jobs the training scripts run: the notes of a resolved command, then the training, or
(MXNet example's ``--test-io 1``) a measurement of the data reading alone."""
import logging
import time

import mxnet as mx

from ..models import block_to_network, get_network
from .data import load_data
from .state.checkpoint import check_finite
from .cli.compat import mxnet_checkpoint_start
from .finetune import checkpoint_network, fine_tune
from .loop import data_settings, train

log = logging.getLogger("mxfp16.train")


def _log_notes(config):
    for note in config.notes:
        log.info(note)


def measure_io(config, metrics_path=None):
    """Read one epoch of training data as MXNet's example ``--test-io 1`` does, logging the speed
    every ``--disp-batches`` batches; nothing is trained.

    Returns
    -------
    dict
        ``epoch`` (0), ``batches`` and ``img_per_sec`` (for the summary line).
    """
    data = load_data(**data_settings(config))
    data.train.reset()
    start = tic = time.time()
    batches = 0
    for batches, batch in enumerate(data.train, 1):
        batch.data[0].wait_to_read()
        if batches % config.disp_batches == 0:
            log.info("Batch [%d]\tSpeed: %.2f samples/sec", batches - 1,
                     config.disp_batches * config.batch_size / (time.time() - tic))
            tic = time.time()
        if batches >= data.batches_per_epoch:
            break
    speed = batches * config.batch_size / max(time.time() - start, 1e-9)
    log.info("--test-io: read %d batches of %d at %.1f img/s (%s); nothing trained", batches,
             config.batch_size, speed, data.description)
    return {"epoch": 0, "batches": batches, "img_per_sec": speed}


def gluoncv_network(config):
    """The network of ``--model`` with the weights of a parameter file GluonCV saved
    (``net.save_parameters``, GluonCV's ``--resume-params``), and its parameter names in the
    order of GluonCV's ``gluon.Trainer(net.collect_params(), ...)`` (its ``.states`` keys).

    Raises
    ------
    ValueError
        If the file does not hold ``--model``'s parameters.
    """
    settings = {k: v for k, v in config.network_settings.items() if k in ("last_gamma", "use_se")}
    block = get_network(config.network, config.num_classes, **settings)
    try:
        block.load_parameters(config.resume_params, cast_dtype=True)  # GluonCV's float16 too
    except (AssertionError, mx.base.MXNetError) as error:
        reason = " ".join(str(error).split())[:160]
        raise ValueError(f"--resume-params {config.resume_params} does not hold the parameters of "
                         f"--model {config.network} with --num-classes {config.num_classes} "
                         f"({reason}): pass the --model it was trained with") from None
    network = block_to_network(block)
    check_finite({**network.arg_params, **network.aux_params},
                 f"--resume-params {config.resume_params}")
    return network, tuple(sorted(block.collect_params().keys()))


def train_job(config, metrics_path=None):
    """``scripts/train_imagenet.py``'s job: :func:`mxfp16.train.loop.train`, or :func:`measure_io`.

    A GluonCV parameter file (``--resume-params`` that is not a checkpoint of mxfp16), or a
    checkpoint of MXNet's example (``--model-prefix`` + ``--load-epoch`` without mxfp16's JSON
    file) gives the starting weights; the loop starts at that epoch.
    """
    _log_notes(config)
    if config.test_io:
        return measure_io(config, metrics_path)
    network, states_order = None, None
    if config.resume_params and not config.resume:
        network, states_order = gluoncv_network(config)
    elif mxnet_checkpoint_start(config):
        network = checkpoint_network(*mxnet_checkpoint_start(config))
        outputs = network.symbol.infer_shape(data=(1,) + tuple(config.image_shape))[1][0]
        if outputs != (1, config.num_classes):
            raise ValueError(f"the checkpoint of --model-prefix {config.model_prefix} --load-epoch "
                             f"{config.load_epoch} has {outputs[-1]} classes: pass --num-classes "
                             f"{outputs[-1]}")
    return train(config, network=network, metrics_path=metrics_path, states_order=states_order)


def fine_tune_job(config, metrics_path=None):
    """``scripts/fine_tune.py``'s job: :func:`mxfp16.train.finetune.fine_tune`, or
    :func:`measure_io`."""
    _log_notes(config)
    if config.test_io:
        return measure_io(config, metrics_path)
    return fine_tune(config, metrics_path=metrics_path)
