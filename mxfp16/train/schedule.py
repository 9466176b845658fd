"""Learning-rate schedules: linear warm-up then step, cosine or poly decay (GluonCV's schedulers).

The schedule is a pure function of the optimizer's update count (``num_update``), which the
optimizer state of a checkpoint carries, so a resumed run continues the schedule where it stopped.
The same scheduler object drives a Gluon ``Trainer`` and a ``Module``.  As everywhere in MXNet, a
step skipped for a gradient overflow is not an update and does not advance the schedule: epochs of
the schedule end a few steps later than the data's (one per skipped step, a few dozen in a run).
"""
import math

from gluoncv.utils import LRScheduler, LRSequential

from ..optimizers import MOMENTUM_OPTIMIZERS

#: Learning-rate schedules after the warm-up (``--lr-mode``).
LR_MODES = ("step", "cosine", "poly")

#: Exponent of the poly schedule, ``lr * (1 - t / T) ** POLY_POWER`` (GluonCV's default).
POLY_POWER = 2


def make_lr_scheduler(lr, lr_mode, num_epochs, batches_per_epoch, step_epochs=(), factor=0.1,
                      warmup_epochs=0, warmup_lr=0.0):
    """The learning-rate scheduler of a run, indexed by update count.

    Parameters
    ----------
    lr : float
        The base learning rate (reached at the end of the warm-up).
    lr_mode : {'step', 'cosine', 'poly'}
        ``step`` multiplies the rate by ``factor`` at each of ``step_epochs``; ``cosine`` and ``poly``
        decay it to 0 at the end of training.
    num_epochs : int
        Epochs of the whole run (warm-up included).
    batches_per_epoch : int
        Updates per epoch.
    step_epochs : sequence of int
        Epochs (counted from the start of training) at which the step schedule decays.
    factor : float
        Step decay factor.
    warmup_epochs : int
        Epochs of linear warm-up from ``warmup_lr`` to ``lr``; when they are ``num_epochs`` or more
        (a rehearsal shortened with ``--max-batches``), the run ends inside the warm-up.
    warmup_lr : float
        The rate the warm-up starts at (GluonCV's ``--warmup-lr``).

    Returns
    -------
    mx.lr_scheduler.LRScheduler
        Give it to the optimizer as ``lr_scheduler``; ``scheduler(n)`` is the rate of update ``n``
        (MXNet numbers updates from 1).

    Raises
    ------
    ValueError
        For an unknown mode.

    Examples
    --------
    >>> sched = make_lr_scheduler(0.1, 'step', num_epochs=3, batches_per_epoch=10, step_epochs=[2])
    >>> [round(sched(n), 4) for n in (1, 20, 21, 30)]  # update 21 is the first of epoch 2
    [0.1, 0.1, 0.01, 0.01]
    >>> sched = make_lr_scheduler(0.4, 'cosine', num_epochs=2, batches_per_epoch=5, warmup_epochs=1)
    >>> [round(sched(n), 2) for n in (1, 3, 5, 6, 10)]
    [0.0, 0.2, 0.4, 0.4, 0.0]
    >>> sched = make_lr_scheduler(0.4, 'cosine', num_epochs=2, batches_per_epoch=5, warmup_epochs=4)
    >>> [round(sched(n), 2) for n in (1, 10)]  # the first 2 of 4 warm-up epochs
    [0.0, 0.19]
    """
    if lr_mode not in LR_MODES:
        raise ValueError(f"unknown lr mode {lr_mode!r}: choose one of {', '.join(LR_MODES)}")
    # GluonCV's schedulers divide by (iterations - 1): give each phase at least two.
    per_epoch = max(int(batches_per_epoch), 2)
    schedulers = []
    if warmup_epochs:
        schedulers.append(LRScheduler("linear", base_lr=warmup_lr, target_lr=lr, nepochs=warmup_epochs,
                                      iters_per_epoch=per_epoch))
    if num_epochs > warmup_epochs:  # else a shortened rehearsal that ends inside the warm-up
        schedulers.append(LRScheduler(lr_mode, base_lr=lr, target_lr=0.0,
                                      nepochs=num_epochs - warmup_epochs, iters_per_epoch=per_epoch,
                                      step_epoch=[e - warmup_epochs for e in step_epochs],
                                      step_factor=factor, power=POLY_POWER))
    scheduler = _FromFirstUpdate(schedulers)
    scheduler.base_lr = lr  # what the optimizer sets; unused, but it warns when they differ
    return scheduler


class _FromFirstUpdate(LRSequential):
    """GluonCV's schedulers count updates from 0, MXNet's optimizers from 1: shift by one, so the
    first update of epoch ``e`` is the first at epoch ``e``'s rate."""

    def __call__(self, num_update):
        return super().__call__(max(int(num_update) - 1, 0))


def optimizer_params(*, optimizer, lr, mom, wd, lr_mode, lr_step_epochs, lr_factor, warmup_epochs,
                     num_epochs, batches_per_epoch, num_update=0, warmup_lr=0.0):
    """Keyword arguments of :func:`mxfp16.make_optimizer` for a run, the schedule included.

    ``mom`` is passed only to optimizers that take a momentum; ``num_update`` (updates already
    done, when resuming) becomes ``begin_num_update``, which positions the schedule.

    Examples
    --------
    >>> params = optimizer_params(optimizer='adam', lr=0.01, mom=0.9, wd=1e-4, lr_mode='cosine',
    ...                           lr_step_epochs=(), lr_factor=0.1, warmup_epochs=0, num_epochs=2,
    ...                           batches_per_epoch=10, num_update=10)
    >>> sorted(params), round(params['lr_scheduler'](20), 6)
    (['begin_num_update', 'learning_rate', 'lr_scheduler', 'wd'], 0.0)
    """
    scheduler = make_lr_scheduler(lr, lr_mode, num_epochs, batches_per_epoch, lr_step_epochs,
                                  lr_factor, warmup_epochs, warmup_lr)
    params = dict(learning_rate=lr, wd=wd, begin_num_update=num_update, lr_scheduler=scheduler)
    if optimizer in MOMENTUM_OPTIMIZERS:
        params["momentum"] = mom
    return params


def next_learning_rate(optimizer):
    """The learning rate the next update of ``optimizer`` will use (its schedule at the next update).

    Examples
    --------
    >>> import mxnet as mx
    >>> opt = mx.optimizer.SGD(learning_rate=0.1, lr_scheduler=make_lr_scheduler(
    ...     0.1, 'step', num_epochs=2, batches_per_epoch=3, step_epochs=[1]), begin_num_update=3)
    >>> next_learning_rate(opt)  # update 4 is the first of epoch 1
    0.010000000000000002
    """
    if optimizer.lr_scheduler is None:
        return optimizer.learning_rate
    return optimizer.lr_scheduler(optimizer.num_update + 1)


def schedule_batches(config, data, num_workers=1):
    """Batches per epoch of the lr schedule, and why, with real data: GluonCV's
    ``--num-training-samples // batch`` (the batch of all workers), else MXNet fit.py's
    ``ceil(--num-examples / workers / batch)`` when ``--num-examples`` is given, else the data's own
    epoch (also for synthetic data, whose epoch those flags already set).

    Returns
    -------
    tuple
        ``(batches, reason)``; ``reason`` is None for the data's own epoch.
    """
    if config.synthetic:
        return data.batches_per_epoch, None
    if config.num_training_samples is not None:
        total = config.batch_size * num_workers
        return (max(config.num_training_samples // total, 1),
                f"--num-training-samples {config.num_training_samples} // batch {total}")
    if config.num_examples is not None:
        batches = math.ceil(config.num_examples // num_workers / config.batch_size)
        return max(batches, 1), (f"--num-examples {config.num_examples} / {num_workers} "
                                 f"worker(s) / batch {config.batch_size}, rounded up")
    return data.batches_per_epoch, None
