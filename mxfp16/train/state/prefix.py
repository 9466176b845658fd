"""A run's claim on its ``--model-prefix``: one writer per prefix, no stale temporary files, and a
folder (and log file) known to be writable before the first batch.

Rank 0 of a job writes the checkpoints and holds the lock; the other ranks never write there and
never lock it.  For a single process and for Horovod the rank is known before the log file opens,
so the claim comes first (:mod:`mxfp16.train.runner`); the workers of a ``dist_sync`` job learn
their rank from the kvstore, so rank 0 claims the prefix then (:func:`mxfp16.train.loop.train`).
"""
import contextlib
import logging
import os

from ...checkpoints.files import PrefixLock, check_writable, remove_stale_temporaries

log = logging.getLogger("mxfp16.train")


def claims_early(kv_store):
    """Whether the rank is known before training starts (not a ``dist_*`` kvstore).

    Examples
    --------
    >>> claims_early('device'), claims_early('dist_sync')
    (True, False)
    """
    return not str(kv_store).startswith("dist")


def check_log_file(log_file):
    """Raise ``OSError`` (one line) unless ``log_file`` can be appended to."""
    if not log_file:
        return
    check_writable(log_file, f"--log-file {log_file}")
    try:
        with open(log_file, "a"):
            pass
    except OSError as error:
        raise OSError(f"--log-file {log_file} cannot be written ({error.strerror or error}): make "
                      "it writable or pass another --log-file") from None


@contextlib.contextmanager
def claim_prefix(prefix):
    """Hold ``prefix``'s lock for the ``with`` block, after removing the temporary files of an
    earlier killed write and checking the folder is writable; yields the temporaries removed.

    Raises
    ------
    mxfp16.checkpoints.files.PrefixInUse
        Another live run holds it (one line with its PID and the fix).
    OSError
        The folder is not writable (one line).

    Examples
    --------
    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> _ = open(prefix + '-0002.params.tmp-999', 'w')
    >>> with claim_prefix(prefix) as removed:
    ...     print([os.path.basename(path) for path in removed])
    ['run-0002.params.tmp-999']
    """
    if not prefix:
        yield []
        return
    check_writable(prefix, f"--model-prefix {prefix}")
    with PrefixLock(prefix, f"--model-prefix {prefix}"):
        yield remove_stale_temporaries(prefix)


def log_removed(removed):
    """One log line for the temporary files an earlier killed write left, if any."""
    if removed:
        log.info("removed %d temporary file(s) of an interrupted checkpoint write (%s%s)",
                 len(removed), os.path.basename(removed[0]), ", ..." if len(removed) > 1 else "")
