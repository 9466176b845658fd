"""The command-line runner of the training scripts: parse, check, log, run, and end with one line.

A run ends with the one-line summary on stdout (exit code 0) or with one ``error: ...`` line on
stderr (exit code 2) for every error a user can fix: bad flags, data or checkpoints, a collapsed
loss scale.  Programming errors still raise, with their traceback.
"""
import contextlib
import logging
import os
import shlex
import sys

from ..distributed.horovod import HorovodUnavailable
from ..scaling.scalers import LossScaleCollapse
from .cli.config import contexts, device_line
from .launch.horovod_start import check_not_under_horovodrun, start_horovod
from .launch.plan import JOB_VARIABLE, LAUNCH_COMMAND_VARIABLE
from .launch.slurm import requeue_after_stop, slurm_line
from .logs import format_value, run_files, run_logging
from .state.prefix import check_log_file, claim_prefix, claims_early, log_removed
from .progress import TrainingStopped, resume_command, stopped_line

log = logging.getLogger("mxfp16.train")

#: MXNet 1.x's switch: float16 reductions (softmax, norms, sums) on GPUs accumulate in float32 only
#: when it is 1, in float16 otherwise.
SAFE_ACCUMULATION = "MXNET_SAFE_ACCUMULATION"


def error_line(error):
    """An exception as the one line a script prints on stderr: ``error: <message>``."""
    return "error: " + " ".join(str(error).split())


def summary_line(network, dtype, api, record, top_k):
    """The one-line summary a run ends with.

    Examples
    --------
    >>> record = {'epoch': 1, 'top1': 0.75, 'topk': 1.0, 'img_per_sec': 812.3, 'loss_scale': 65536.0,
    ...           'num_skipped': 2}
    >>> print(summary_line('resnet50_v1', 'float16', 'gluon', record, top_k=5))  # doctest: +ELLIPSIS
    resnet50_v1 float16 (gluon): 2 epochs, top-1 0.7500, top-5 1.0000, 812.3 img/s, ... 2 skipped steps
    """
    epochs = record.get("epoch", -1) + 1
    return (f"{network} {dtype} ({api}): {epochs} epoch{'s' if epochs != 1 else ''}, top-1 "
            f"{format_value(record.get('top1'))}, top-{top_k} {format_value(record.get('topk'))}, "
            f"{record.get('img_per_sec', 0.0):.1f} img/s, loss scale "
            f"{record.get('loss_scale', 1.0):g}, {record.get('num_skipped', 0)} skipped steps")


def use_safe_accumulation(dtype, ctx, environ=None):
    """Set ``MXNET_SAFE_ACCUMULATION=1`` for float16 on GPUs unless the user has set it.

    Parameters
    ----------
    dtype : str
    ctx : list of Context
    environ : dict, optional
        The environment (default: ``os.environ``, which MXNet reads at every reduction).

    Returns
    -------
    str or None
        What to log: the setting made or the user's, None when the run is not float16 on GPUs.

    Examples
    --------
    >>> import mxnet as mx
    >>> env = {}
    >>> use_safe_accumulation('float16', [mx.gpu(0)], env), env  # doctest: +ELLIPSIS
    ('set MXNET_SAFE_ACCUMULATION=1: ...', {'MXNET_SAFE_ACCUMULATION': '1'})
    >>> use_safe_accumulation('float16', [mx.cpu(0), mx.cpu(1)], {}) is None
    True
    """
    environ = os.environ if environ is None else environ
    if dtype != "float16" or not any(c.device_type == "gpu" for c in ctx):
        return None
    if SAFE_ACCUMULATION in environ:
        return (f"{SAFE_ACCUMULATION}={environ[SAFE_ACCUMULATION]!r} as set by you (1: float16 "
                "reductions accumulate in float32, else in float16)")
    environ[SAFE_ACCUMULATION] = "1"
    return (f"set {SAFE_ACCUMULATION}=1: float16 reductions (softmax, norms, sums) on the GPUs "
            f"accumulate in float32; export {SAFE_ACCUMULATION}=0 to keep float16 accumulation")


def launch_argv(environ=None):
    """The launch command of this run as its user typed it (``scripts/launch.py ... -- ...``, set
    by the launcher), as a list; None outside a launched job.

    Examples
    --------
    >>> launch_argv({'MXFP16_LAUNCH_COMMAND': "scripts/launch.py -n 2 -- python t.py --lr '0.1'"})
    ['scripts/launch.py', '-n', '2', '--', 'python', 't.py', '--lr', '0.1']
    """
    environ = os.environ if environ is None else environ
    typed = environ.get(LAUNCH_COMMAND_VARIABLE)
    return shlex.split(typed) if typed else None


def _horovod_rank(config):
    """``(rank, first line)``: Horovod's, for a ``--kv-store horovod`` run; else ``(0, None)``."""
    if config.kv_store != "horovod":
        check_not_under_horovodrun(config.kv_store)
        return 0, None
    rank, _, line = start_horovod(config)
    return rank, line


def _start_run(config, first_line=None):
    """The run's first log lines: Horovod's processes, the devices and batch; float32 accumulation
    on GPUs."""
    if first_line:  # a Horovod run of one process by accident is a warning
        log.log(logging.WARNING if first_line.startswith("--kv-store") else logging.INFO,
                first_line)
    if slurm_line():
        log.info(slurm_line())
    log.info(device_line(config))
    note = use_safe_accumulation(config.dtype, contexts(config.gpus, config.cpus))
    if note:
        log.info(note)


def run_job(parser, config_type, job, argv=None):
    """The body of a training script: parse, check, log, run; return the exit code.

    Parameters
    ----------
    parser : argparse.ArgumentParser
        The script's parser (its usage errors exit 2 with one line).
    config_type : type
        A config dataclass (:class:`mxfp16.train.cli.config.TrainConfig` or ``FineTuneConfig``) built from the
        parsed flags and checked with its ``checked()``.
    job : callable
        ``job(config, metrics_path=...) -> record``, the run itself (``mxfp16.train.loop.train``,
        ``mxfp16.train.finetune.fine_tune``).
    argv : list of str or None
        The arguments (default: ``sys.argv[1:]``).

    Returns
    -------
    int
        0 after printing the one-line summary; 2 after printing one ``error: ...`` line for bad
        input, a failed checkpoint or a collapsed loss scale; 143 (SIGTERM) or 130 (SIGINT) after
        saving the run's position and logging the line that says how to resume it; argparse's
        code for ``--help``.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:  # --help, or a usage error already printed
        return exit_request.code
    argv = sys.argv[1:] if argv is None else list(argv)
    rank = 0
    try:
        config = config_type(**vars(args)).checked()
        rank, first_line = _horovod_rank(config)
        log_file, metrics_path = run_files(config.log_file, config.model_prefix) \
            if rank == 0 else (None, None)
        owner = rank == 0 and claims_early(config.kv_store)
        with (claim_prefix(config.model_prefix) if owner else contextlib.nullcontext([])) \
                as removed:
            check_log_file(log_file)
            with run_logging(log_file, logging.INFO if rank == 0 else logging.WARNING,
                             rank_known=claims_early(config.kv_store)):
                _start_run(config, first_line)
                log_removed(removed)
                try:
                    record = job(config, metrics_path=metrics_path)
                except TrainingStopped as stopped:  # a stop signal: saved, one line, 143 / 130
                    if stopped.rank == 0:
                        command = resume_command(launch_argv() or [sys.argv[0], *argv],
                                                 stopped.prefix or "PREFIX")
                        log.warning(stopped_line(stopped, command))
                        if stopped.checkpoint and JOB_VARIABLE not in os.environ:
                            requeue_after_stop(argv)  # no launcher above: the job is this run's
                    return stopped.exit_code
    except (ValueError, OSError, LossScaleCollapse, HorovodUnavailable) as error:
        print(error_line(error), file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # a second Ctrl-C: at once, the last complete checkpoint intact
        print("error: interrupted twice (SIGINT): stopped at once without saving; the checkpoints "
              "saved before are intact", file=sys.stderr)
        return 130
    if rank:  # the job's summary is rank 0's
        return 0
    print(summary_line(config.run_name, config.dtype, config.api, record, config.top_k))
    return 0


def run_command(parser, config_type, job, argv=None):
    """The body of a script that is not a training run (``scripts/evaluate.py``,
    ``scripts/export.py``): parse, check, run with console logging; return the exit code.

    ``job(config)`` returns the one summary line, printed on stdout (exit code 0); a user error
    (``ValueError``, ``OSError``; ``RuntimeError`` for a written file that fails its check) is one
    ``error: ...`` line on stderr and exit code 2.
    """
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_request:
        return exit_request.code
    try:
        config = config_type(**vars(args)).checked()
        with run_logging(None):
            line = job(config)
    except (ValueError, OSError, RuntimeError) as error:
        print(error_line(error), file=sys.stderr)
        return 2
    print(line)
    return 0
