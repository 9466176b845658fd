"""Float32 master weights: which optimizers keep them, and where in their state.

With ``multi_precision=True`` an MXNet optimizer keeps a float32 copy of each float16 weight,
updates the copy and writes it back rounded.  MXNet's base Optimizer does so for any optimizer that
does not replace its multi-precision methods; an optimizer that replaces them (SGD, NAG, LARS,
LAMB, GluonNLP's BERTAdam) is probed here with one update, since some do not (MXNet 1.9.1's LAMB
never writes its float32 copy back).  :mod:`mxfp16.optimizers` builds on this.
"""
import copy

import mxnet as mx
import numpy as np

__all__ = ["keeps_master_weights", "multi_precision_optimizers", "check_optimizer",
           "master_index", "master_weight"]


#: Optimizer classes already probed by :func:`keeps_master_weights`: class -> None or the reason.
_PROBED = {}
_UNPROBED = object()
#: Why a class whose constructor needs arguments, given by name only, could not be probed.
_NEEDS_ARGUMENTS = "its constructor needs arguments: pass an instance to check"


def _probe(kind, template=None):
    """Why optimizers of class ``kind`` keep no float32 master copy of a float16 weight, or None
    when they do: one multi-precision update of a float16 weight must move the float32 copy in
    the state and leave the weight equal to that copy rounded."""
    try:  # a fresh one: its counters and parameters are not the caller's
        probe = kind()
    except TypeError:  # a constructor with required arguments: a copy of the caller's
        if template is None:
            return _NEEDS_ARGUMENTS
        probe = copy.deepcopy(template)
    probe.multi_precision, probe.lr_scheduler, probe.lr = True, None, 0.01
    probe.wd, probe.rescale_grad, probe.clip_gradient = 0.0, 1.0, None
    weight = mx.nd.ones((4,), dtype="float16")
    try:
        state = probe.create_state_multi_precision(0, weight)
        probe.update_multi_precision(0, weight, mx.nd.full((4,), 0.5, dtype="float16"), state)
        master = master_weight(probe, state)
        if master is None:
            return "its multi-precision state holds no float32 copy of the weight"
        if bool((master == 1.0).prod().asscalar()):
            return "its multi-precision update leaves the float32 copy unchanged"
        if not bool((master.astype("float16") == weight).prod().asscalar()):
            return "its multi-precision update does not copy the float32 weight back"
    except (mx.base.MXNetError, TypeError, ValueError, AttributeError, IndexError) as error:
        return f"its multi-precision update fails: {' '.join(str(error).split())[:120]}"
    return None


def _master_weights_problem(kind, template=None):
    """None if optimizers of class ``kind`` keep float32 master weights, else why not.  One on
    the base Optimizer's master-copy path (float32 copy, ``update`` on it, rounded back) keeps
    them; one with a multi-precision path of its own is probed once per class."""
    base = mx.optimizer.Optimizer
    if kind.create_state_multi_precision is base.create_state_multi_precision and \
            kind.update_multi_precision is base.update_multi_precision:
        return None
    cached = _PROBED.get(kind, _UNPROBED)
    if cached is _UNPROBED or (template is not None and cached == _NEEDS_ARGUMENTS):
        _PROBED[kind] = _probe(kind, template)
    return _PROBED[kind]


def keeps_master_weights(optimizer):
    """Whether an optimizer keeps float32 master weights of float16 weights (``multi_precision``).

    Decided by what it does, not by a list: MXNet's base Optimizer keeps a float32 copy for any
    optimizer that does not replace its multi-precision methods; one that replaces them is probed
    with a single update of a float16 weight (cached per class).

    Parameters
    ----------
    optimizer : str or mx.optimizer.Optimizer
        A registered name (``'sgd'``; GluonNLP's ``'bertadam'`` once gluonnlp is imported) or an
        instance.

    Returns
    -------
    bool
        False also for a name no optimizer is registered under.

    Examples
    --------
    >>> keeps_master_weights('adam'), keeps_master_weights('lamb')
    (True, False)
    """
    if isinstance(optimizer, mx.optimizer.Optimizer):
        return _master_weights_problem(type(optimizer), optimizer) is None
    kind = mx.optimizer.Optimizer.opt_registry.get(str(optimizer).lower())
    return kind is not None and _master_weights_problem(kind) is None


def multi_precision_optimizers():
    """The registered optimizers that keep float32 master weights, sorted by name.

    Examples
    --------
    >>> 'sgd' in multi_precision_optimizers(), 'lamb' in multi_precision_optimizers()
    (True, False)
    """
    return tuple(sorted(name for name in mx.optimizer.Optimizer.opt_registry
                        if name != "test" and keeps_master_weights(name)))


def check_optimizer(name, optimizer=None):
    """Return the lower-case optimizer name if it keeps float32 master weights; else raise.

    Parameters
    ----------
    name : str
        A registered optimizer name, any case.
    optimizer : mx.optimizer.Optimizer, optional
        The instance to check in place of the registered class's default one.

    Raises
    ------
    ValueError
        For a name no optimizer is registered under, or an optimizer that keeps no float32
        master weights: naming the reason and the optimizers that keep them.
    """
    key = str(name).lower()
    kind = type(optimizer) if optimizer is not None else \
        mx.optimizer.Optimizer.opt_registry.get(key)
    if kind is None:
        raise ValueError(f"unknown optimizer {name!r}: no optimizer is registered under that name "
                         "(mx.optimizer.register); import the package that registers it (GluonNLP's "
                         "'bertadam' needs `import gluonnlp`), or choose one of "
                         f"{', '.join(multi_precision_optimizers())}")
    problem = _master_weights_problem(kind, optimizer)
    if problem is not None:
        raise ValueError(f"optimizer {name!r} keeps no float32 master weights with "
                         f"multi_precision=True ({problem}), which float16 and bfloat16 training "
                         "need (updates below float16's resolution would be lost): choose one that "
                         f"keeps them: {', '.join(multi_precision_optimizers())}")
    return key


def master_index(optimizer):
    """Where an optimizer's multi-precision state keeps the float32 master copy.

    SGD, NAG and LARS override ``create_state_multi_precision`` and return ``(state, master)``;
    the others inherit the base Optimizer's ``(master, state)``.

    Examples
    --------
    >>> master_index(mx.optimizer.SGD()), master_index(mx.optimizer.Adam())
    (1, 0)
    """
    base = mx.optimizer.Optimizer.create_state_multi_precision
    return 0 if type(optimizer).create_state_multi_precision is base else 1


def master_weight(optimizer, state):
    """The float32 master copy in the optimizer state of a float16 weight, or None.

    Parameters
    ----------
    optimizer : mx.optimizer.Optimizer
    state : object
        ``create_state_multi_precision``'s output for a float16 weight (None before the first
        update).

    Returns
    -------
    NDArray or None

    Examples
    --------
    >>> import mxnet as mx
    >>> import mxfp16
    >>> opt = mxfp16.make_optimizer('sgd', 'float16', momentum=0.9)
    >>> weight = mx.nd.full((2,), 0.1, dtype='float16')
    >>> master_weight(opt, opt.create_state_multi_precision(0, weight)).dtype.__name__
    'float32'
    """
    if not (getattr(optimizer, "multi_precision", False) and isinstance(state, (tuple, list))
            and len(state) == 2):
        return None
    master = state[master_index(optimizer)]
    ok = isinstance(master, mx.nd.NDArray) and master.dtype == np.float32
    return master if ok else None
