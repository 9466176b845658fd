"""What a training run reports: console and file logs, a progress bar with ETA, ``metrics.jsonl``,
TensorBoard scalars, and the one-line summary.

Console logs go to stdout (stderr is kept for the one-line errors of the scripts); the progress bar
(tqdm) goes to stderr and shows only on a terminal.
"""
import contextlib
import json
import logging
import math
import os
import sys
import time
import warnings

import mxnet as mx
from tqdm import tqdm

from .metrics import Accuracy, MeanLoss

#: Logger of every mxfp16 module; :func:`run_logging` attaches the handlers here.
LOGGER_NAME = "mxfp16"
LOG_FORMAT = "%(asctime)s %(levelname)s %(message)s"

log = logging.getLogger(LOGGER_NAME + ".train")


class _ConsoleHandler(logging.Handler):
    """Log lines to stdout through ``tqdm.write``, which keeps a progress bar below them intact."""

    def emit(self, record):
        try:
            tqdm.write(self.format(record), file=sys.stdout)
        except Exception:  # logging's contract: a broken handler must not stop the program
            self.handleError(record)


class _RankFileHandler(logging.FileHandler):
    """The log file of a run whose rank is not known yet (``dist_*`` kvstores: the scheduler
    numbers the workers once they connect).  Records wait until :func:`settle_log_rank`; then rank
    0 writes them and every later one, and the other ranks write nothing, so the file holds each
    event once.  Unsettled at the end (the run failed before its kvstore), it writes them all."""

    def __init__(self, path):
        super().__init__(path, delay=True)
        self.rank, self.pending = None, []

    def emit(self, record):
        if self.rank is None:
            self.pending.append(record)
        elif self.rank == 0:
            super().emit(record)

    def settle(self, rank):
        self.rank, pending, self.pending = rank, self.pending, []
        for record in pending:
            self.emit(record)

    def close(self):
        if self.rank is None:
            self.settle(0)
        super().close()


def settle_log_rank(rank):
    """Tell the log file of a ``dist_*`` run its worker's rank: only rank 0 writes it.

    Examples
    --------
    >>> settle_log_rank(0)  # no run logging: nothing to do
    """
    for handler in logging.getLogger(LOGGER_NAME).handlers:
        if isinstance(handler, _RankFileHandler) and handler.rank is None:
            handler.settle(rank)


@contextlib.contextmanager
def run_logging(log_file=None, level=logging.INFO, rank_known=True):
    """Log mxfp16's messages to stdout and to ``log_file`` for the duration of a ``with`` block.

    Python warnings raised meanwhile (MXNet's, or mxfp16's one-time overflow warning) become one
    ``WARNING`` line of the log too, so a long run's log file keeps them.

    Parameters
    ----------
    log_file : str or None
        Appended to; its folder is created.  None logs to the console only.
    level : int
        Logging level.
    rank_known : bool
        False for a ``dist_*`` run, whose log file waits for :func:`settle_log_rank`.

    Yields
    ------
    logging.Logger
        The training logger.  The handlers are removed (and the file closed) on exit, so a second
        run in the same process starts clean.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), 'logs', 'train.log')
    >>> with run_logging(path) as log:
    ...     log.info('epoch 0 done')  # doctest: +ELLIPSIS
    20... INFO epoch 0 done
    >>> open(path).read().strip().endswith(' INFO epoch 0 done')
    True
    """
    logger = logging.getLogger(LOGGER_NAME)
    handlers = [_ConsoleHandler()]
    if log_file:
        os.makedirs(os.path.dirname(os.path.abspath(log_file)), exist_ok=True)
        handlers.append(logging.FileHandler(log_file) if rank_known else _RankFileHandler(log_file))
    saved = logger.level, logger.propagate
    for handler in handlers:
        handler.setFormatter(logging.Formatter(LOG_FORMAT))
        logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False
    saved_showwarning = warnings.showwarning
    warnings.showwarning = _log_warning
    try:
        yield log
    finally:
        warnings.showwarning = saved_showwarning
        for handler in handlers:
            logger.removeHandler(handler)
            handler.close()
        logger.level, logger.propagate = saved


def _log_warning(message, category, filename, lineno, file=None, line=None):
    """``warnings.showwarning`` during a run: the warning as one log line."""
    log.warning("%s: %s", category.__name__, " ".join(str(message).split()))


class MetricsLog:
    """Records as JSON lines (``metrics.jsonl``) and their numbers as TensorBoard scalars.

    Parameters
    ----------
    jsonl_path : str or None
        File the records are appended to, one JSON object per line.
    tensorboard_dir : str or None
        Folder of a ``tensorboardX.SummaryWriter``.

    Examples
    --------
    >>> import os, tempfile, json
    >>> path = os.path.join(tempfile.mkdtemp(), 'metrics.jsonl')
    >>> with MetricsLog(path) as metrics:
    ...     metrics.write({'epoch': 0, 'top1': 0.5}, step=0)
    >>> json.loads(open(path).readline())
    {'epoch': 0, 'top1': 0.5}
    """

    def __init__(self, jsonl_path=None, tensorboard_dir=None):
        self._file = None
        if jsonl_path:
            os.makedirs(os.path.dirname(os.path.abspath(jsonl_path)), exist_ok=True)
            self._file = open(jsonl_path, "a")
        self._writer = None
        if tensorboard_dir:
            from tensorboardX import SummaryWriter  # imported only when asked for: it is slow
            self._writer = SummaryWriter(tensorboard_dir)

    def write(self, record, step, group="epoch"):
        """Append ``record`` to the JSON lines and its finite numbers to TensorBoard as
        ``group/<key>`` at ``step``."""
        if self._file:
            self._file.write(json.dumps(record) + "\n")
            self._file.flush()
        self.scalars(record, step, group)

    def scalars(self, values, step, group):
        """TensorBoard scalars only (per-batch values)."""
        if not self._writer:
            return
        for key, value in values.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and math.isfinite(value):
                self._writer.add_scalar(f"{group}/{key}", value, step)

    def close(self):
        if self._file:
            self._file.close()
        if self._writer:
            self._writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()


def progress_bar(total, desc):
    """A tqdm bar with ETA on stderr; silent when stderr is not a terminal (logs, tests)."""
    return tqdm(total=total, desc=desc, unit="batch", leave=False, dynamic_ncols=True,
                disable=None, file=sys.stderr)


def _is_power_of_two(number):
    return number > 0 and number & (number - 1) == 0


class EpochMeter:
    """Bookkeeping of one training epoch: loss, accuracy, speed, skipped steps, bar and batch logs.

    Loss and accuracy accumulate without waiting on the device (:mod:`mxfp16.train.metrics`); they
    are read back every ``disp_batches`` batches and at the end of the epoch only.

    Parameters
    ----------
    epoch : int
        Epoch number (from 0), for the messages.
    num_batches : int
        Batches planned, for the progress bar's ETA.
    scaler : mxfp16.LossScaler
        Read for the loss scale and the skipped steps.
    disp_batches : int
        Log a line (and TensorBoard scalars) every ``disp_batches`` batches.
    metrics_log : MetricsLog or None
        Receives the per-batch scalars.
    """

    def __init__(self, epoch, num_batches, scaler, disp_batches=20, metrics_log=None):
        self.epoch, self.scaler, self.disp_batches = epoch, scaler, disp_batches
        self.metrics_log = metrics_log
        self.accuracy = Accuracy(top_k=1, num_classes=1)
        self.loss = MeanLoss()
        self.samples, self.batches = 0, 0
        self.skipped_at_start = scaler.num_skipped
        self.bar = progress_bar(num_batches, f"epoch {epoch}")
        self.tic = time.time()

    def update(self, labels, outputs, losses, updated, lr, num_update):
        """Record one step: ``labels``, ``outputs`` and per-sample ``losses`` (lists over devices),
        whether the step ``updated``, the learning rate and the update count."""
        self.accuracy.update(labels, outputs)
        self.loss.update(losses)
        self.samples += sum(label.shape[0] for label in labels)
        self.batches += 1
        if not updated and _is_power_of_two(self.scaler.consecutive_skips):
            log.warning("Epoch[%d] Batch[%d] gradient overflow: step skipped, loss scale now %g "
                        "(%d skipped in a row, %d in all)", self.epoch, self.batches - 1,
                        self.scaler.loss_scale, self.scaler.consecutive_skips,
                        self.scaler.num_skipped)
        self.bar.update(1)
        if self.batches % self.disp_batches == 0:
            self._log_batch(lr, num_update)

    def state(self):
        """The epoch so far, JSON-ready, for a mid-epoch checkpoint (reads the sums back)."""
        return {"accuracy": self.accuracy.state(), "loss": self.loss.state(),
                "samples": self.samples, "batches": self.batches,
                "skipped_at_start": self.skipped_at_start, "seconds": time.time() - self.tic}

    def load_state(self, state):
        """Continue the epoch :meth:`state` describes (a resumed run)."""
        self.accuracy.load_state(state["accuracy"])
        self.loss.load_state(state["loss"])
        self.samples, self.batches = state["samples"], state["batches"]
        self.skipped_at_start = state["skipped_at_start"]
        self.tic = time.time() - state["seconds"]
        self.bar.update(self.batches)

    def _log_batch(self, lr, num_update):
        mean_loss = self.loss.get()
        speed = self.samples / max(time.time() - self.tic, 1e-9)
        self.bar.set_postfix(loss="%.3f" % mean_loss, scale="%g" % self.scaler.loss_scale)
        log.info("Epoch[%d] Batch[%d] speed %.1f img/s loss %.4f accuracy %.4f lr %.5g "
                 "loss scale %g", self.epoch, self.batches, speed, mean_loss,
                 self.accuracy.get()[0], lr, self.scaler.loss_scale)
        if self.metrics_log:
            self.metrics_log.scalars({"loss": mean_loss, "lr": lr, "img_per_sec": speed,
                                      "loss_scale": self.scaler.loss_scale}, num_update, "batch")

    def close(self):
        """End the epoch; return its statistics (``train_loss``, ``train_acc``, ``img_per_sec``,
        ``skipped_steps``, ``batches``)."""
        mx.nd.waitall()
        elapsed = max(time.time() - self.tic, 1e-9)
        self.bar.close()
        return {"train_loss": self.loss.get(), "train_acc": self.accuracy.get()[0],
                "img_per_sec": self.samples / elapsed, "batches": self.batches,
                "skipped_steps": self.scaler.num_skipped - self.skipped_at_start}


def run_files(log_file=None, model_prefix=None):
    """``(log_file, metrics_path)`` of a run: ``--log-file``, else ``train.log`` in the folder of
    ``--model-prefix``; ``metrics.jsonl`` next to the log.  ``(None, None)`` without either.

    Examples
    --------
    >>> run_files(model_prefix='runs/r50')
    ('runs/train.log', 'runs/metrics.jsonl')
    """
    if not log_file and model_prefix:
        log_file = os.path.join(os.path.dirname(model_prefix), "train.log")
    if not log_file:
        return None, None
    return log_file, os.path.join(os.path.dirname(log_file), "metrics.jsonl")


def format_value(number, digits=4):
    return "n/a" if number is None or not math.isfinite(number) else f"{number:.{digits}f}"


def epoch_line(record, top_k):
    """The log line of an epoch record (see :func:`mxfp16.train.loop.fit`)."""
    return (f"Epoch[{record['epoch']}] train loss {format_value(record['train_loss'])} accuracy "
            f"{format_value(record['train_acc'])} | validation top-1 "
            f"{format_value(record['top1'])} top-{top_k} {format_value(record['topk'])} | "
            f"{record['img_per_sec']:.1f} img/s | lr "
            f"{record['lr']:.5g} | loss scale {record['loss_scale']:g} | skipped steps "
            f"{record['skipped_steps']} (run total {record['num_skipped']})")
