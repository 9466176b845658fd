"""What makes a checkpoint folder trustworthy: checksums of the files a checkpoint is made of, one
writer per prefix (an OS file lock), no stale temporary files, a folder known to be writable, and
no parameter that is not finite.

The training scripts' checkpoints (:mod:`mxfp16.train.state.checkpoint`) and
:func:`mxfp16.save_training_state` share these helpers: a marker (JSON) file records the SHA-256 of
each file of its checkpoint, and loading recomputes them, so a file damaged after it was written
(same size or not) is found before anything is trained on it.
"""
import fcntl
import glob
import hashlib
import json
import os
import resource

import numpy as np

__all__ = ["sha256_file", "damaged_files", "seal", "seal_broken", "PrefixLock", "PrefixInUse",
           "remove_stale_temporaries", "write_failure_cause",
           "check_writable", "non_finite_name"]

#: The suffix :class:`mxfp16.checkpoints.atomic.StagedFiles` gives a file being written (and its PID).
TEMPORARY_SUFFIX = ".tmp-"

_CHUNK = 1 << 22


def sha256_file(path):
    """The SHA-256 of a file's bytes, in hex.

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), 'a.txt')
    >>> _ = open(path, 'w').write('abc')
    >>> sha256_file(path)[:16]
    'ba7816bf8f01cfea'
    """
    digest = hashlib.sha256()
    with open(path, "rb") as data:
        for chunk in iter(lambda: data.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


#: The key under which a marker records the SHA-256 of its own other contents.
SEAL_KEY = "marker_sha256"


def _canonical(record):
    text = json.dumps({k: v for k, v in record.items() if k != SEAL_KEY}, indent=1, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()


def seal(record):
    """``record`` with the SHA-256 of its own JSON text, so a marker damaged after it was written
    (a flipped digit of the learning rate, say) is found too.

    Examples
    --------
    >>> sealed = seal({'epoch': 2, 'lr': 0.1})
    >>> seal_broken(sealed), seal_broken(dict(sealed, lr=0.2)), seal_broken({'epoch': 2})
    (False, True, False)
    """
    return dict(record, **{SEAL_KEY: _canonical(record)})


def seal_broken(record):
    """Whether a marker read back has other contents than when :func:`seal` sealed it (False for a
    marker written before seals)."""
    return SEAL_KEY in record and record[SEAL_KEY] != _canonical(record)


def damaged_files(folder, sizes, digests):
    """``[(path, why), ...]`` of the files a marker records that are missing, of another size, or
    of another SHA-256 (``digests`` may be empty: a marker written before checksums).

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> _ = open(os.path.join(folder, 'w.params'), 'w').write('abc')
    >>> damaged_files(folder, {'w.params': 3}, {'w.params': sha256_file(os.path.join(folder,
    ...                                                                              'w.params'))})
    []
    >>> _ = open(os.path.join(folder, 'w.params'), 'w').write('abd')  # same size, other bytes
    >>> [why for _, why in damaged_files(folder, {'w.params': 3}, {'w.params': '00'})]
    ['has other bytes than when it was saved (SHA-256 differs)']
    """
    problems = []
    for name, size in sizes.items():
        path = os.path.join(folder, name)
        actual = os.path.getsize(path) if os.path.isfile(path) else None
        if actual != size:
            problems.append((path, "is missing" if actual is None else
                             f"has {actual} bytes, not {size}"))
        elif name in digests and sha256_file(path) != digests[name]:
            problems.append((path, "has other bytes than when it was saved (SHA-256 differs)"))
    return problems


def non_finite_name(arrays):
    """The name of the first array (in name order) holding NaN or infinity, or None.

    Examples
    --------
    >>> import mxnet as mx
    >>> non_finite_name({'fc_bias': mx.nd.zeros(2), 'fc_weight': mx.nd.array([1, float('nan')])})
    'fc_weight'
    """
    for name in sorted(arrays):
        values = arrays[name].asnumpy()
        if values.dtype.kind == "f" or values.dtype.name == "bfloat16":
            if not np.isfinite(values.astype(np.float32)).all():
                return name
    return None


class PrefixInUse(ValueError):
    """Another live process holds the lock of a checkpoint prefix."""


class PrefixLock:
    """An exclusive OS lock (``fcntl.flock``) on ``PREFIX.lock``: one run per checkpoint prefix.

    The lock file holds the PID of the run that holds it.  The operating system releases the lock
    when that process ends, however it ends (``kill -9`` included), so no stale lock is ever left;
    the file itself stays and is harmless.  Child processes (data-loading workers) close their copy
    of the descriptor, so a worker that outlives its run does not keep the prefix.

    Parameters
    ----------
    prefix : str
        The checkpoint prefix (``--model-prefix``); its folder is created.
    what : str
        How to name the prefix in the error (``--model-prefix runs/r50``).

    Raises
    ------
    PrefixInUse
        When a live process holds it, naming that process's PID and the fix.

    Examples
    --------
    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> with PrefixLock(prefix):
    ...     try:
    ...         PrefixLock(prefix).acquire()
    ...     except PrefixInUse as error:
    ...         print(f'in use by the run with PID {os.getpid()}' in str(error))
    True
    """

    def __init__(self, prefix, what=None):
        self.prefix, self.path = prefix, f"{prefix}.lock"
        self.what = what or f"checkpoint prefix {prefix!r}"
        self._descriptor = None

    def acquire(self):
        """Take the lock (see the class notes); returns self."""
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        descriptor = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(descriptor, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(descriptor)
            raise PrefixInUse(
                f"{self.what} is in use by the run with PID {holder} (it holds {self.path}): two "
                "runs on one prefix overwrite each other's checkpoints; wait for it to end (or "
                f"stop it: kill {holder}), or pass another --model-prefix") from None
        os.ftruncate(descriptor, 0)
        os.pwrite(descriptor, f"{os.getpid()}\n".encode(), 0)
        self._descriptor = descriptor
        os.register_at_fork(after_in_child=self._close_in_child)
        return self

    def _close_in_child(self):
        if self._descriptor is not None:
            try:
                os.close(self._descriptor)
            except OSError:
                pass
            self._descriptor = None

    def release(self):
        """Give the lock up (the end of the run)."""
        if self._descriptor is not None:
            os.close(self._descriptor)  # closing releases the flock
            self._descriptor = None

    def __enter__(self):
        return self.acquire()

    def __exit__(self, *exc_info):
        self.release()


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_temporaries(prefix, dead_writers_only=False):
    """Delete the temporary files that a write under ``prefix`` killed before its renames left
    (``PREFIX-....tmp-PID``); call it holding the prefix's :class:`PrefixLock`, so no live writer
    owns them, or with ``dead_writers_only`` (only files whose writer's PID is not a live process).
    Returns the paths removed.

    Examples
    --------
    >>> import os, tempfile
    >>> prefix = os.path.join(tempfile.mkdtemp(), 'run')
    >>> _ = open(prefix + '-0001.params.tmp-4242', 'w')
    >>> [os.path.basename(path) for path in remove_stale_temporaries(prefix)]
    ['run-0001.params.tmp-4242']
    """
    removed = []
    for path in glob.glob(glob.escape(prefix) + "-*" + TEMPORARY_SUFFIX + "*"):
        pid = path.rsplit(TEMPORARY_SUFFIX, 1)[1]
        if pid.isdigit() and not (dead_writers_only and _alive(int(pid))):
            try:
                os.remove(path)
                removed.append(path)
            except FileNotFoundError:
                pass
    return sorted(removed)


def write_failure_cause(folder):
    """The likely cause of a failed write in ``folder`` that reported no error number (MXNet's
    writers): a full disk, the file size limit, or a folder that cannot be written; None if none
    of them.

    Examples
    --------
    >>> import tempfile
    >>> write_failure_cause(tempfile.mkdtemp()) is None
    True
    """
    try:
        space = os.statvfs(folder)
        if space.f_bavail == 0:
            return "the disk is full"
    except OSError:
        pass
    limit = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    if limit != resource.RLIM_INFINITY:
        return f"the file size limit is {limit} bytes (ulimit -f)"
    if not os.access(folder, os.W_OK):
        return "the folder cannot be written"
    return None


def check_writable(path, what):
    """Make sure a file can be created and written next to ``path`` (a test write of one byte,
    flushed and removed), so a run learns it cannot save before it trains, not after an epoch.

    Raises
    ------
    OSError
        One line naming ``what``, the folder, the cause and the fix.

    Examples
    --------
    >>> import tempfile
    >>> check_writable(tempfile.mkdtemp() + '/run', '--model-prefix')
    """
    folder = os.path.dirname(os.path.abspath(path))
    probe = os.path.join(folder, f".mxfp16-write-test-{os.getpid()}")
    try:
        os.makedirs(folder, exist_ok=True)
        with open(probe, "wb") as out:
            out.write(b"0")
            out.flush()
            os.fsync(out.fileno())
        os.remove(probe)
    except OSError as error:
        if os.path.exists(probe):
            os.remove(probe)
        raise OSError(f"{what}: cannot write in folder {folder!r} ({error.strerror or error}): "
                      "make it writable, free space, or choose another folder") from None

