"""Writing a group of files that becomes visible whole or not at all: the checkpoints of the
training scripts and :func:`mxfp16.save_training_state` share it.

Each file is written under a temporary name in its final folder and flushed to disk (``fsync``);
when all are written they are renamed in the order they were written (the file that marks the group
complete last) and the folder is flushed, so the renames reach the disk too.  The SHA-256 of each
file is taken as it is flushed (:meth:`StagedFiles.digests`), for the marker to record.  A failure or an
interrupt while writing removes the temporary files and leaves what was there before untouched.
"""
import hashlib
import os

__all__ = ["StagedFiles"]


class StagedFiles:
    """A context manager that stages files and renames them into place on a clean exit.

    Examples
    --------
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> def text(content):
    ...     return lambda path: open(path, 'w').write(content)
    >>> with StagedFiles(folder) as files:
    ...     files.write(os.path.join(folder, 'data.txt'), text('numbers'))
    ...     files.sizes(), files.digests()['data.txt'][:12]
    ({'data.txt': 7}, 'f3c7807d4750')
    >>> sorted(os.listdir(folder))
    ['data.txt']
    """

    def __init__(self, folder):
        self.folder = folder
        self._staged = []
        self._digests = {}

    def write(self, path, write, verify=None):
        """Write ``path`` through ``write(temporary_path)``, flushed to disk, not yet renamed.

        ``verify(temporary_path)``, if given, reads the file back and raises if it is not whole:
        MXNet's writers can lose the end of a small file silently when the disk is full or a file
        size limit is reached (the buffered bytes are dropped when the file is closed).
        """
        tmp = f"{path}.tmp-{os.getpid()}"
        try:
            write(tmp)
            if verify is not None:
                verify(tmp)
            digest = hashlib.sha256()
            with open(tmp, "rb") as written:  # on the disk before the rename makes it count
                os.fsync(written.fileno())
                for chunk in iter(lambda: written.read(1 << 22), b""):
                    digest.update(chunk)
        except BaseException:
            if os.path.exists(tmp):
                os.remove(tmp)
            raise
        self._staged.append((tmp, path))
        self._digests[os.path.basename(path)] = digest.hexdigest()

    def sizes(self):
        """``{file name: bytes}`` of the files staged so far (what a marker file records)."""
        return {os.path.basename(final): os.path.getsize(tmp) for tmp, final in self._staged}

    def digests(self):
        """``{file name: SHA-256 in hex}`` of the files staged so far (what a marker records)."""
        return dict(self._digests)

    def __enter__(self):
        os.makedirs(self.folder, exist_ok=True)
        return self

    def __exit__(self, exc_type, exc, traceback):
        if exc_type is not None:
            for tmp, _ in self._staged:
                if os.path.exists(tmp):
                    os.remove(tmp)
            return False
        for tmp, final in self._staged:
            os.replace(tmp, final)
        _sync_folder(self.folder)
        return False


def _sync_folder(folder):
    """Flush a folder's entries (the renames) to disk; a no-op where folders cannot be opened."""
    try:
        descriptor = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass
    finally:
        os.close(descriptor)
