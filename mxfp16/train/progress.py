"""Where a run is, so it can stop anywhere and go on exactly: per-batch seeds, mid-epoch checkpoint
timing, the stop on SIGTERM/SIGINT and the command that resumes.

Exact resume rests on one rule: every random draw of a batch (its augmentation, its dropout masks,
an image folder's shuffle for batch 0) comes after :func:`seed_batch` reseeded Python's ``random``,
numpy's global generator and MXNet's generators (all devices) from ``(seed, epoch, batch)``.  A
resumed run reseeds the same way before the batch it continues with, so it draws what the
uninterrupted run drew, without saving generator states (MXNet's cannot be read back).
"""
import logging
import random
import shlex
import sys
import time

import mxnet as mx
import numpy as np

from .state.resume import AUTO

log = logging.getLogger("mxfp16.train")


def batch_seed(seed, epoch, batch):
    """The 32-bit seed of batch ``batch`` of epoch ``epoch`` of a run seeded ``seed``.

    Examples
    --------
    >>> batch_seed(0, 1, 2) == batch_seed(0, 1, 2) != batch_seed(0, 2, 1)
    True
    """
    return int(np.random.SeedSequence([seed, epoch, batch]).generate_state(1)[0])


def seed_batch(seed, epoch, batch):
    """Reseed ``random``, numpy's global generator and MXNet's (every device) for one batch."""
    value = batch_seed(seed, epoch, batch)
    random.seed(value)
    np.random.seed(value)
    mx.random.seed(value)


def skip_batches(data_iter, count, seed, epoch):
    """Advance a freshly reset ``data_iter`` past the first ``count`` batches of epoch ``epoch``.

    An iterator with a ``skip(count)`` method (image folders, synthetic data) skips without decoding;
    others (``ImageRecordIter``) read and drop the batches, each after its :func:`seed_batch`, as
    the uninterrupted run read them.

    Returns
    -------
    int
        Batches skipped (fewer when the data ends first).
    """
    if not count:
        return 0
    skip = getattr(data_iter, "skip", None)
    if skip is not None:
        seed_batch(seed, epoch, 0)  # draws made at the first batch (a folder's shuffle)
        return skip(count)
    for index in range(count):
        seed_batch(seed, epoch, index)
        try:
            data_iter.next()
        except StopIteration:
            return index
    return count


class SavePolicy:
    """When to write a mid-epoch checkpoint: every ``steps`` batches (counted over the whole run, so
    a resumed run keeps the rhythm) and/or every ``minutes`` of wall time since the last save.

    Examples
    --------
    >>> policy = SavePolicy(steps=100)
    >>> [policy.due(batches) for batches in (99, 100, 200)]
    [False, True, True]
    >>> SavePolicy().due(100)
    False
    """

    def __init__(self, steps=0, minutes=0.0, clock=time.monotonic):
        self.steps, self.minutes, self._clock = steps or 0, minutes or 0.0, clock
        self._last = clock()

    def due(self, batches_done):
        """Whether to save after ``batches_done`` batches of the run."""
        if self.steps and batches_done % self.steps == 0:
            return True
        return bool(self.minutes) and self._clock() - self._last >= self.minutes * 60

    def saved(self):
        """Restart the wall-time count (any checkpoint counts)."""
        self._last = self._clock()


class TrainingStopped(Exception):
    """The run stopped on a signal after saving (or, without ``--model-prefix``, without saving).

    Attributes
    ----------
    signal_name : str
    exit_code : int
        128 + the signal's number.
    epoch, batch : int
        Where it stopped: ``batch`` batches of epoch ``epoch`` done.
    checkpoint : str or None
        The checkpoint written, None without ``--model-prefix``.
    prefix : str or None
        The ``--model-prefix`` to resume from.
    rank : int
        The worker (0 speaks for a distributed job).
    """

    def __init__(self, signal_name, exit_code, epoch, batch, checkpoint, prefix, rank=0):
        super().__init__(f"stopped by {signal_name} after batch {batch} of epoch {epoch}")
        self.signal_name, self.exit_code = signal_name, exit_code
        self.epoch, self.batch, self.checkpoint, self.prefix = epoch, batch, checkpoint, prefix
        self.rank = rank


def resume_command(argv, prefix, executable=None):
    """The command that resumes a run started with ``argv`` from the checkpoints under ``prefix``:
    the same command with ``--resume PREFIX`` (replacing a ``--resume`` it had), or the same
    command unchanged when it has ``--resume auto``.

    Examples
    --------
    >>> resume_command(['scripts/train_imagenet.py', '--dtype', 'float16', '--resume', 'r-0001'],
    ...                'runs/r', executable='python')
    'python scripts/train_imagenet.py --dtype float16 --resume runs/r'
    >>> resume_command(['scripts/train_imagenet.py', '--resume=auto'], 'runs/r', executable='python')
    'python scripts/train_imagenet.py --resume=auto'
    """
    kept, skip_next, auto = [], False, False
    for arg, after in zip(argv, [*argv[1:], None]):
        if skip_next:
            skip_next = False
        elif arg == "--resume":
            skip_next, auto = True, after == AUTO
        elif arg.startswith("--resume="):
            auto = arg == f"--resume={AUTO}"
        else:
            kept.append(arg)
    executable = executable or ("python" if sys.executable.endswith(("python", "python3"))
                                else sys.executable)
    return shlex.join([executable, *argv] if auto else [executable, *kept, "--resume", prefix])


def stopped_line(stopped, command):
    """The one log line of a run stopped by a signal."""
    where = f"after batch {stopped.batch} of epoch {stopped.epoch}" if stopped.batch else \
        f"at the end of epoch {stopped.epoch - 1}"
    if stopped.checkpoint is None:
        return (f"stopped by {stopped.signal_name} {where}: nothing saved (no --model-prefix; pass "
                f"--model-prefix PREFIX to save on a signal); exit code {stopped.exit_code}")
    return (f"stopped by {stopped.signal_name} {where}: saved checkpoint {stopped.checkpoint}; "
            f"resume with: {command}; exit code {stopped.exit_code}")


class Checkpointer:
    """Between the steps of a run: a mid-epoch checkpoint when the :class:`SavePolicy` says so, and
    the stop when a signal arrived, on every worker at the same step.

    Parameters
    ----------
    save : callable or None
        ``save(epoch, batch, meter_state) -> checkpoint name``; None where nothing is saved (no
        ``--model-prefix``, or a worker other than rank 0).
    stop : mxfp16.checkpoints.preemption.StopRequest or None
    policy : SavePolicy
    batches_per_epoch : int
        For counting batches over the run.
    vote : callable, optional
        ``vote(flag) -> bool``: whether any worker of a distributed job asks to stop (every worker
        calls it after every step, so all stop after the same one).
    prefix : str, optional
        The ``--model-prefix``, for the resume command.
    rank : int
        This worker's rank (rank 0 saves and logs the stop).
    """

    def __init__(self, save, stop, policy, batches_per_epoch, vote=None, prefix=None, rank=0):
        self.save, self.stop, self.policy, self.vote = save, stop, policy, vote
        self.batches_per_epoch, self.prefix, self.rank = batches_per_epoch, prefix, rank

    def stop_requested(self):
        """Whether this run stops now: a signal here, or (``vote``) on any worker."""
        flag = bool(self.stop is not None and self.stop.requested)
        if self.vote is not None:
            flag = self.vote(flag)
            if flag and self.stop is not None:
                self.stop.request()  # another worker's signal: stop as if it had come here
        return flag

    def checkpoint(self, epoch, batch, meter_state):
        """Save the position (``batch`` batches of epoch ``epoch`` done); the checkpoint's name, or
        None where nothing is saved."""
        if self.save is None:
            return None
        name = self.save(epoch, batch, meter_state)
        self.policy.saved()
        return name

    def stopped(self, epoch, batch, name):
        """Raise :class:`TrainingStopped` for a stop after ``batch`` batches of epoch ``epoch``."""
        raise TrainingStopped(self.stop.signal_name or "SIGTERM", self.stop.exit_code or 143,
                              epoch, batch, name, self.prefix, self.rank)

    def after_step(self, epoch, batch, meter):
        """After ``batch`` batches of epoch ``epoch``: checkpoint if due or stopping; stop if asked.

        Raises
        ------
        TrainingStopped
        """
        stop = self.stop_requested()
        name = None
        if stop or self.policy.due(epoch * self.batches_per_epoch + batch):
            name = self.checkpoint(epoch, batch, meter.state())
        if stop:
            self.stopped(epoch, batch, name)


#: The kvstore key of the stop vote of a ``dist_sync`` job: an int beside a Trainer's keys (which
#: count from 0), a name beside a Module's (parameter names); a kvstore takes one kind only.
STOP_VOTE_KEYS = (2 ** 30, "mxfp16_stop_vote")


def stop_vote(kvstore, num_workers):
    """``vote(flag) -> bool``, True when any worker's ``flag`` is: a sum over the workers of a
    distributed job (``dist_sync`` or Horovod), which every worker calls after every step.  None for
    a job of one process, which needs no vote.

    It costs one exchange of one number per step, small beside the gradients'.
    """
    if num_workers < 2 or isinstance(kvstore, str):
        return None
    if hasattr(kvstore, "allreduce_values"):  # mxfp16.distributed.horovod.Horovod
        return lambda flag: bool(kvstore.allreduce_values("stop", [float(flag)])[0] > 0)
    for key in STOP_VOTE_KEYS:
        try:
            kvstore.init(key, mx.nd.zeros(1))
            break
        except mx.base.MXNetError:  # "Mixed key types are not allowed": the other kind
            continue
    total = mx.nd.zeros(1)

    def vote(flag):
        kvstore.pushpull(key, mx.nd.array([float(flag)]), out=total)
        return bool(total.asscalar() > 0)
    return vote
