"""The dtypes mxfp16 trains in, and the loss heads: the vocabulary that casting, the optimizers,
Module loss scaling and the model loader share."""

#: Training dtypes mxfp16 understands.
SUPPORTED_DTYPES = ("float32", "float16", "bfloat16")

#: Low-precision dtypes: the ones that need float32 master weights.
LOW_PRECISION_DTYPES = ("float16", "bfloat16")

#: Loss-head ops: their backward starts the gradient itself, ignoring the incoming one.  The one
#: list of loss heads; :data:`GRAD_SCALE_HEADS` and :data:`LABELLED_HEADS` are parts of it.
LOSS_HEADS = frozenset({
    "SoftmaxOutput", "LinearRegressionOutput", "LogisticRegressionOutput", "MAERegressionOutput",
    "SVMOutput", "MakeLoss",
})

#: Loss heads that scale their gradient by a ``grad_scale`` attribute (SVMOutput has none): static
#: loss scaling of a Symbol multiplies that attribute.
GRAD_SCALE_HEADS = LOSS_HEADS - {"SVMOutput"}

#: Loss heads that take a label input: cutting one off leaves the network's output (MakeLoss wraps
#: a loss expression instead, which is no network output).
LABELLED_HEADS = LOSS_HEADS - {"MakeLoss"}


def check_dtype(dtype):
    """Return the canonical name of a training dtype, or raise.

    Parameters
    ----------
    dtype : str or numpy dtype
        ``'float32'``, ``'float16'`` or ``'bfloat16'`` (``numpy.float16`` etc. are accepted).

    Returns
    -------
    str
        The dtype's name.

    Raises
    ------
    ValueError
        If ``dtype`` is not one of :data:`SUPPORTED_DTYPES`.

    Examples
    --------
    >>> import numpy as np
    >>> check_dtype(np.float16)
    'float16'
    """
    name = getattr(dtype, "__name__", None) or str(dtype)
    name = {"fp16": "float16", "half": "float16", "fp32": "float32", "bf16": "bfloat16"}.get(name, name)
    if name not in SUPPORTED_DTYPES:
        raise ValueError(
            f"unknown dtype {dtype!r}: choose one of {', '.join(SUPPORTED_DTYPES)} "
            f"(for example dtype='float16')")
    return name
