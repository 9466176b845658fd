"""A cheap check of an image folder's files before training: each must start like a JPEG or PNG
image and end like one (a JPEG's end-of-image marker, a PNG's ``IEND`` chunk), so a corrupt or
truncated file is named at the start rather than found 45 batches in, or, for a truncated JPEG
(which decoders fill in grey without an error), never.

Two small reads per file: the first 16 bytes and the last 4 KiB (a JPEG may carry a few bytes after
its end marker).  The images are not decoded.
"""
import os

__all__ = ["image_problem", "bad_images"]

_JPEG_START, _JPEG_END = b"\xff\xd8\xff", b"\xff\xd9"
_PNG_START, _PNG_END = b"\x89PNG\r\n\x1a\n", b"IEND\xaeB`\x82"
_TAIL = 4096


def image_problem(path):
    """Why ``path`` is not a whole JPEG or PNG file, or None.

    Examples
    --------
    >>> import os, tempfile, numpy as np, cv2
    >>> path = os.path.join(tempfile.mkdtemp(), 'a.jpg')
    >>> _ = cv2.imwrite(path, np.zeros((8, 8, 3), np.uint8))
    >>> image_problem(path) is None
    True
    >>> data = open(path, 'rb').read()
    >>> _ = open(path, 'wb').write(data[:len(data) // 2])  # cut short
    >>> image_problem(path)
    'is a truncated JPEG file (no end-of-image marker)'
    """
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as image:
            head = image.read(16)
            image.seek(max(size - _TAIL, 0))
            tail = image.read()
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    if size == 0:
        return "is empty"
    if head.startswith(_JPEG_START):
        return None if _JPEG_END in tail else "is a truncated JPEG file (no end-of-image marker)"
    if head.startswith(_PNG_START):
        return None if _PNG_END in tail else "is a truncated PNG file (no IEND chunk)"
    return f"is not a JPEG or PNG image (it starts with {head[:4].hex()})"


def bad_images(paths):
    """``[(path, problem), ...]`` of the files of ``paths`` that :func:`image_problem` rejects."""
    return [(path, problem) for path in paths for problem in [image_problem(path)] if problem]
