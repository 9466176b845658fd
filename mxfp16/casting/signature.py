"""How a Gluon block is called: its inputs read from ``hybrid_forward``, and calls described, so a
cast block takes the same arguments as the block it replaces.

A HybridBlock's inputs are the arguments of ``hybrid_forward`` after ``F`` that are not its
parameters (which Gluon passes by keyword): ``BERTModel.hybrid_forward(self, F, inputs,
token_types, valid_length=None, masked_positions=None)`` takes two required inputs and two
optional ones.  A call may nest arrays in lists (GluonNLP's language models take ``(x, states)``
with ``states`` a list of ``[h, c]``) and leave optional ones as None: :func:`call_structure` gives
the flat arrays and a key that is the same for calls of the same shape of nesting.
"""
import inspect
import re
import traceback

import mxnet as mx

from .. import mxnet_internals

__all__ = ["block_inputs", "describe_signature", "describe_call", "call_structure",
           "is_plain_call", "ImperativeCallError", "imperative_call_error"]

#: How an ``mx.nd`` function called with a Symbol fails (its generated argument check).
_ND_ON_SYMBOL = re.compile(r"must have NDArray type, but got <Symbol")


class ImperativeCallError(TypeError):
    """A block's ``hybrid_forward`` (or own ``forward``) calls ``mx.nd`` functions directly, so it
    cannot be traced; ``method`` names which."""

    def __init__(self, message, method):
        super().__init__(message)
        self.method = method


def _where(error):
    """``(method, file:line, source line)`` of the innermost ``hybrid_forward`` or ``forward``
    frame of ``error``'s traceback, or None."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if frame.name in ("hybrid_forward", "forward")]
    if not frames:
        return None
    frame = frames[-1]
    path = re.sub(r".*/(site|dist)-packages/", "", frame.filename)
    return frame.name, f"{path}:{frame.lineno}", (frame.line or "").strip()


def imperative_call_error(error, block):
    """An :class:`ImperativeCallError` naming the cause when ``error`` was raised by an ``mx.nd``
    function that tracing ``block`` handed a Symbol; None for another error.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> class Bad(nn.HybridBlock):
    ...     def hybrid_forward(self, F, x):
    ...         return mx.nd.relu(x)
    >>> try:
    ...     Bad()(mx.sym.var('x'))
    ... except AssertionError as error:
    ...     print(str(imperative_call_error(error, Bad()))[:67])
    Bad.hybrid_forward calls an mxnet.nd function directly (<doctest mx
    """
    if not _ND_ON_SYMBOL.search(str(error)):
        return None
    method, place, line = _where(error) or ("hybrid_forward", "", "")
    place = f" ({place}: `{line}`)" if place else ""
    name = type(block).__name__
    fix = (f"Call it through hybrid_forward's F argument (F.Dropout for nd.Dropout), e.g. in a "
           f"subclass of {name} that overrides hybrid_forward; a Dropout that acts only in "
           "training can be left out of an evaluation model (GluonNLP's StandardRNN: dropout=0)"
           if method == "hybrid_forward" else
           f"Call the original {name} with float32 values, or cast the HybridBlocks it calls")
    return ImperativeCallError(
        f"{name}.{method} calls an mxnet.nd function directly{place}: a cast network is traced "
        f"with Symbols, as hybridize() traces, and nd functions take only NDArrays. {fix}",
        method)


def block_inputs(block):
    """``(required, optional)`` input names of a HybridBlock: its ``__call__``'s or ``forward``'s
    where it defines one (Gluon's RNN layers: ``states=None``), else its ``hybrid_forward``'s after
    ``F``; None when the signature cannot be read (``*args``).

    Examples
    --------
    >>> from mxnet.gluon import nn, rnn
    >>> block_inputs(nn.Dense(2))
    (('x',), ())
    >>> block_inputs(rnn.LSTM(4))
    (('inputs',), ('states', 'sequence_length'))
    """
    try:
        kind = type(block)
        if kind.__call__ is not mx.gluon.Block.__call__:  # its own __call__ (Gluon's RNN layers)
            parameters = list(inspect.signature(block.__call__).parameters.values())
        elif kind.forward is not mx.gluon.HybridBlock.forward:  # its own forward: the call
            parameters = list(inspect.signature(block.forward).parameters.values())
        else:
            parameters = list(inspect.signature(block.hybrid_forward).parameters.values())[1:]
    except (TypeError, ValueError, AttributeError):
        return None
    params = set(mxnet_internals.block_own_param_names(block))
    parameters = [p for p in parameters if p.name not in params]  # after F
    if any(p.kind == p.VAR_POSITIONAL for p in parameters):
        return None
    positional = [p for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = tuple(p.name for p in positional if p.default is p.empty)
    optional = tuple(p.name for p in positional if p.default is not p.empty)
    return required, optional


def describe_signature(block):
    """``LSTM(inputs, states=None, sequence_length=None)``: how ``block`` is called.

    Examples
    --------
    >>> from mxnet.gluon import rnn
    >>> describe_signature(rnn.LSTM(4))
    'LSTM(inputs, states=None, sequence_length=None)'
    """
    inputs = block_inputs(block)
    name = type(block).__name__
    if inputs is None:
        return f"{name}(*inputs)"
    required, optional = inputs
    return f"{name}({', '.join(list(required) + [f'{o}=None' for o in optional])})"


def _describe(value):
    if value is None:
        return "None"
    if isinstance(value, mx.nd.NDArray):
        return f"NDArray({', '.join(map(str, value.shape))})"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_describe(item) for item in value) + "]"
    return type(value).__name__


def describe_call(args):
    """The arguments of a call, for messages: ``(NDArray(2, 3), [NDArray(1, 2, 4)], None)``.

    Examples
    --------
    >>> import mxnet as mx
    >>> describe_call([mx.nd.ones((2, 3)), [mx.nd.ones((1, 2, 4))], None])
    '(NDArray(2, 3), [NDArray(1, 2, 4)], None)'
    """
    return "(" + ", ".join(_describe(arg) for arg in args) + ")"


def call_structure(args):
    """``(flat, fmt, key)``: the arrays of a call (None for each None), Gluon's format to regroup
    them, and a hashable key equal for calls of the same nesting and None pattern.

    Raises
    ------
    TypeError
        For an argument that is neither an NDArray, None nor a (nested) list of them.

    Examples
    --------
    >>> import mxnet as mx
    >>> flat, fmt, key = call_structure([mx.nd.ones(2), [mx.nd.ones(1), mx.nd.ones(1)], None])
    >>> len(flat), fmt
    (4, [0, [0, 0], -1])
    """
    try:
        flat, fmt = mxnet_internals.flatten_call(list(args))
    except ValueError:
        raise TypeError(f"a cast block takes NDArrays, None or (nested) lists of them, got "
                        f"{describe_call(args)}") from None
    return flat, fmt, repr(fmt)


def is_plain_call(args, count):
    """Whether a call passes exactly ``count`` NDArrays (or Symbols, for a symbolic call), nothing
    nested, no None."""
    return len(args) == count and all(isinstance(arg, (mx.nd.NDArray, mx.sym.Symbol))
                                      for arg in args)
