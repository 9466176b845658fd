"""Every access mxfp16 makes to MXNet's private attributes, in one place.

MXNet 1.9 offers no public accessor for these; each function names the attribute it reads, why
mxfp16 needs it, and the MXNet versions it was checked against (:data:`CHECKED_MXNET_VERSIONS`).
When MXNet changes one of them, this module is the only one to update.
"""
import contextlib

#: MXNet releases whose private attributes below were read and tested.
CHECKED_MXNET_VERSIONS = ("1.9.1",)


def graph_json(symbol):
    """The graph of ``symbol`` as parsed JSON (``nodes``, ``node_row_ptr``, ...), read without
    leaking it.

    MXNet 1.9's ``Symbol.tojson()`` (``remove_amp_cast=True``, the default) saves a copy made by
    ``MXSymbolRemoveAmpCast`` and never frees that handle.  For a graph that ``autograd.get_symbol``
    returns, the leaked copy holds the recorded nodes, and a ``_CachedOp`` node holds its CachedOp
    with its ``static_alloc`` buffers: a network cast again every epoch (GluonCV's ``set_nms`` at
    validation) kept every old one, 0.3 GB an epoch for an SSD.  ``remove_amp_cast=False`` saves
    the graph itself, with its ``amp_cast`` nodes, so the rows line up with
    ``get_internals().list_outputs()``.

    Examples
    --------
    >>> import mxnet as mx
    >>> x = mx.sym.var('x')
    >>> [node['op'] for node in graph_json(mx.sym.amp_cast(x, dtype='float16'))['nodes']]
    ['null', 'amp_cast']
    """
    import json
    return json.loads(symbol.tojson(remove_amp_cast=False))


def symbol_block_graph(block):
    """``(inputs, outputs)`` symbols of a ``gluon.SymbolBlock`` (``block._cached_graph``), as
    legacy Symbols (a shallow copy of a NumPy-interface block's numpy symbols: the same graph).

    Examples
    --------
    >>> import mxnet as mx
    >>> data = mx.sym.var('data')
    >>> block = mx.gluon.SymbolBlock(mx.sym.relu(data, name='r'), [data])
    >>> inputs, outputs = symbol_block_graph(block)
    >>> [s.name for s in inputs], outputs.name
    (['data'], 'r')
    """
    inputs, outputs = block._cached_graph
    return [sym.as_nd_ndarray() for sym in inputs], outputs.as_nd_ndarray()


def hybridized_graphs():
    """The graphs that live hybridized blocks run as ``_CachedOp``: ``block._cached_graph[1]`` of
    every ``gluon.HybridBlock`` (``SymbolBlock`` included) whose ``block._cached_op`` is built.

    The blocks are found among the objects the garbage collector tracks, after a collection: a
    block nothing refers to any more is gone then, whenever the collector last ran, so the answer
    does not depend on its timing.  It costs a collection (about 0.3 s in a process with GluonCV
    and a ResNet-50): call it rarely.

    Examples
    --------
    >>> import mxnet as mx
    >>> net = mx.gluon.nn.Dense(2, in_units=3, prefix='probe_dense_')
    >>> net.initialize()
    >>> net.hybridize()
    >>> _ = net(mx.nd.ones((1, 3)))
    >>> [g.list_outputs() for g in hybridized_graphs() if 'probe_dense_' in g.list_outputs()[0]]
    [['probe_dense_fwd_output']]
    """
    import gc

    from mxnet import gluon
    gc.collect()
    return [obj._cached_graph[1] for obj in gc.get_objects()
            if issubclass(type(obj), gluon.HybridBlock)
            and getattr(obj, "_cached_op", None) is not None and obj._cached_graph]


def trainer_params(trainer):
    """The Parameters a ``gluon.Trainer`` updates, in its order (``trainer._params``)."""
    return trainer._params


def trainer_kvstore_ready(trainer):
    """Whether a Trainer has set up its kvstore (``trainer._kv_initialized``): its first gradient
    exchange has happened, or :func:`init_trainer_kvstore` ran."""
    return trainer._kv_initialized


def init_trainer_kvstore(trainer):
    """Set up a Trainer's kvstore and its parameters' initial values on it, the calls its own
    first ``step()`` makes (``_init_kvstore``, ``_init_params``).

    Returns
    -------
    list of Parameter
        Parameters still waiting for a shape (deferred initialization); empty when all are ready.
    """
    if not trainer._kv_initialized:
        trainer._init_kvstore()
    if trainer._params_to_init:
        trainer._init_params()
    return list(trainer._params_to_init)


def trainer_updates_on_kvstore(trainer):
    """Whether a Trainer, once set up, updates the weights on its kvstore
    (``trainer._update_on_kvstore``): then ``allreduce_grads`` and ``update`` are not allowed."""
    return bool(trainer._update_on_kvstore)


def trainer_update_on_kvstore_setting(trainer):
    """The ``update_on_kvstore`` a Trainer was created with (``trainer._kvstore_params``): True,
    False, or None (Gluon decides when the kvstore is set up)."""
    return trainer._kvstore_params.get("update_on_kvstore")


def trainer_scale(trainer):
    """The factor a Trainer's ``step`` multiplies ``1/batch_size`` by (``trainer._scale``: the
    optimizer's initial ``rescale_grad``, divided by the number of ranks in Horovod's
    DistributedTrainer); MXNet AMP's ``scale_loss`` divides it by the loss scale."""
    return trainer._scale


def trainer_updaters(trainer):
    """The per-device optimizer ``Updater`` objects of a Trainer that updates on the workers
    (``trainer._updaters``), which hold the optimizer state (the float32 master weights among it);
    empty when it updates on its kvstore, whose updater MXNet keeps out of reach."""
    return [] if trainer_updates_on_kvstore(trainer) else list(trainer._updaters)


def param_trainer(param):
    """The Trainer a Parameter was last given to (``param._trainer``), or None."""
    return getattr(param, "_trainer", None)


def block_param_keys(block):
    """``{structural name: Parameter}`` as ``block.save_parameters`` names them
    (``block._collect_params_with_prefix()``: ``'features.0.weight'``, ...)."""
    return dict(block._collect_params_with_prefix())


def hybridize_flags(block):
    """The keyword arguments of a block's last ``hybridize()`` (``block._flags``), or None if it
    is not hybridized (``block._active``)."""
    return dict(block._flags) if block._active else None


def release_cached_ops(block):
    """Drop the CachedOps of ``block`` and of every block below it (``_cached_op``), so that
    their memory (``static_alloc`` buffers: hundreds of MB for a detector) is freed now rather
    than when Python's cycle collector reaches the blocks.  Their graphs stay: a block called
    again builds a new CachedOp."""
    blocks = [block]
    while blocks:
        current = blocks.pop()
        if hasattr(current, "_cached_op"):
            current._cached_op = None
        blocks.extend(current._children.values())


def current_module(module):
    """The ``Module`` a ``BucketingModule`` runs now (``module._curr_module``); a plain Module as is.

    It is the one that can save and load the optimizer state, which all buckets share."""
    return getattr(module, "_curr_module", module)


def module_grads_per_param(module):
    """A Module's parameter gradients as ``[[param0 on dev0, on dev1, ...], ...]``
    (``_exec_group.grad_arrays``), the arrays its kvstore sums over devices in ``update()``;
    parameters with ``grad_req='null'`` left out."""
    current = current_module(module)
    return [list(grads) for grads in current._exec_group.grad_arrays
            if grads and grads[0] is not None]


def refresh_module_params(module):
    """Make the next ``module.get_params()`` copy the values from the devices.

    Module re-reads the devices only after an update (``_params_dirty``); a skipped step still moved
    the BatchNorm statistics, and Module offers no public way to ask for a fresh copy."""
    module._params_dirty = True



@contextlib.contextmanager
def module_without_kvstore(module):
    """Run ``module.update()`` without its kvstore (``_kvstore = None`` on the current Module), for
    gradients already summed over devices and workers: each device then updates with its own copy
    of the sum, as after the kvstore's ``pushpull``."""
    current = current_module(module)
    kvstore, current._kvstore = current._kvstore, None
    try:
        yield
    finally:
        current._kvstore = kvstore


def module_param_names(module):
    """Names of a Module's trained parameters, in the order of :func:`module_grads_per_param`."""
    group = current_module(module)._exec_group
    return [name for name, grads in zip(group.param_names, group.grad_arrays)
            if grads and grads[0] is not None]


def bucketing_module_spec(module):
    """``(sym_gen, default_bucket_key, context)`` of a ``BucketingModule`` (``module._sym_gen``,
    ``._default_bucket_key``, ``._context``), which MXNet AMP's conversion reads too."""
    return module._sym_gen, module._default_bucket_key, module._context


def bucket_modules(module):
    """``{bucket key: Module}`` of a ``BucketingModule``, the buckets bound so far
    (``module._buckets``), which MXNet AMP's conversion converts."""
    return dict(module._buckets)


def module_updater(module):
    """The ``Updater`` of a Module that updates on the workers (``_updater``): its ``states`` are
    the optimizer state, keyed ``param_index * num_devices + device`` as ``update()`` passes them."""
    return current_module(module)._updater


def module_arrays_per_device(module):
    """``{name: [array on dev0, on dev1, ...]}`` of a Module's parameters and auxiliary states, the
    arrays its executors compute with (``_exec_group.param_arrays`` / ``aux_arrays``)."""
    group = current_module(module)._exec_group
    return dict(zip(list(group.param_names) + list(group.aux_names),
                    [list(arrays) for arrays in group.param_arrays + group.aux_arrays]))


def align_update_counts(optimizer, device_ids):
    """Give each of ``device_ids`` the per-parameter update counts of the optimizer's most advanced
    device (``optimizer._all_index_update_counts``, ``_index_update_count``).

    An optimizer counts updates per device, and Adam's bias correction reads the count: restored
    from a checkpoint of other devices, the new devices' counts would restart at
    ``begin_num_update`` and their weights drift apart."""
    counts = optimizer._all_index_update_counts
    reference = max(counts.values(), key=lambda c: (len(c), sum(c.values())))
    optimizer._all_index_update_counts = {device: dict(reference) for device in device_ids}
    optimizer._index_update_count = optimizer._all_index_update_counts[device_ids[0]]


def restart_update_counts(optimizer, num_update):
    """Count the optimizer's updates from ``num_update`` again, for every parameter and device
    (``begin_num_update``, ``num_update``, ``_all_index_update_counts``, ``_index_update_count``):
    an optimizer state of another run (GluonCV's) keeps its momenta, not its position."""
    optimizer.begin_num_update = optimizer.num_update = num_update
    optimizer._all_index_update_counts = {0: {}}
    optimizer._index_update_count = optimizer._all_index_update_counts[0]


def dataloader_batches(loader, skip):
    """The batches of a single-process ``gluon.data.DataLoader`` after its first ``skip``, without
    decoding the skipped ones: ``(skipped, generator)``, or None for a loader with workers.

    Reads ``loader._num_workers``, ``_batch_sampler``, ``_batchify_fn`` and ``_dataset``: the loader's
    own single-process iteration (``DataLoader._prefetch_iter``) with the skipped index batches
    drawn from the sampler but not read.  A resumed run uses it to continue in the middle of an
    epoch of an image folder.
    """
    if loader._num_workers:
        return None
    indices = iter(loader._batch_sampler)
    skipped = 0
    for _ in range(skip):
        if next(indices, None) is None:
            break
        skipped += 1
    batchify, dataset = loader._batchify_fn, loader._dataset
    return skipped, (batchify([dataset[index] for index in batch]) for batch in indices)


def block_own_param_names(block):
    """The names under which a HybridBlock passes its own Parameters to ``hybrid_forward`` as
    keywords (``block._reg_params``)."""
    return list(getattr(block, "_reg_params", {}))


def block_own_params(block):
    """``{attribute name: Parameter}`` of the Parameters a Block holds itself, not through a child
    (``block._reg_params``): the first part of the names ``save_parameters`` gives them."""
    return dict(getattr(block, "_reg_params", {}))


def flatten_call(args):
    """``(flat, fmt)`` of (nested) call arguments, None allowed (``gluon.block._flatten``), the
    format ``regroup`` rebuilds them from."""
    from mxnet.gluon.block import _flatten
    return _flatten(args, "input")


def regroup(flat, fmt):
    """The nested structure ``fmt`` (from :func:`flatten_call`) rebuilt from ``flat``
    (``gluon.block._regroup``)."""
    from mxnet.gluon.block import _regroup
    return _regroup(list(flat), fmt)


def block_children(block):
    """``{name: child Block}`` of a Block (``block._children``), in registration order."""
    return dict(block._children)


def block_tree(block, children=None):
    """``(path, Block)`` of every block inside ``block``, in registration order (pre-order), the
    paths the children's names joined by ``'.'`` (``'features.3'``, as ``print(net)`` and
    ``save_parameters`` name them); ``children(block) -> {name: Block}`` (default:
    :func:`block_children`) gives each block's children.

    Examples
    --------
    >>> from mxnet.gluon import nn
    >>> net = nn.HybridSequential()
    >>> net.add(nn.Dense(2))
    >>> [path for path, _ in block_tree(net)]
    ['0']
    """
    children = children or block_children

    def visit(parent, prefix, ancestors):
        for name, child in children(parent).items():
            if id(child) not in ancestors:  # a cycle: Gluon never builds one, but do not loop
                yield prefix + name, child
                yield from visit(child, f"{prefix}{name}.", ancestors | {id(child)})
    return list(visit(block, "", {id(block)}))


def replace_child(block, name, child):
    """Put ``child`` in place of the child ``name`` of ``block`` (``_children`` and the attribute
    of that name), where ``Block.__setattr__`` refuses a change of the child's type."""
    block._children[name] = child
    if name in vars(block):
        object.__setattr__(block, name, child)


def wrap_deferred_initializer(param, wrap):
    """Replace the initializer a Parameter waiting for its shape will run by ``wrap(initializer)``
    (``param._deferred_init``, ``(init, ctx, default_init, data)``); False when it is not waiting."""
    if not param._deferred_init:
        return False
    init, ctx, default_init, data = param._deferred_init
    param._deferred_init = (init, ctx, wrap(default_init), data)
    return True


def initialized_arrays(param):
    """The arrays of an initialized Parameter, one per device (``param._data``); [] while it waits
    for initialization or for its shape."""
    return [] if param._data is None else list(param._data)


@contextlib.contextmanager
def amp_lists_extended(dtype, extra):
    """MXNet AMP's op lists for ``dtype`` with the ops of ``extra`` (``{list name: [ops]}``, such
    as ``'FP32_FUNCS'``) added while the body runs: ``mxnet.contrib.amp.lists.symbol_fp16`` /
    ``symbol_bf16``'s module-level lists, which MXNet 1.9.1's ``amp.convert_symbol`` reads at each
    call (its widest-type list is read only there, and op names in its arguments must be in a
    list).  The lists are put back afterwards, also on an error.

    Examples
    --------
    >>> from mxnet.contrib.amp.lists import symbol_fp16
    >>> with amp_lists_extended('float16', {'FP32_FUNCS': ['my_op']}):
    ...     'my_op' in symbol_fp16.FP32_FUNCS
    True
    >>> 'my_op' in symbol_fp16.FP32_FUNCS
    False
    """
    from mxnet.contrib.amp.lists import symbol_bf16, symbol_fp16
    module = symbol_fp16 if dtype == "float16" else symbol_bf16
    saved = {name: getattr(module, name) for name in extra}
    try:
        for name, ops in extra.items():
            setattr(module, name, list(saved[name]) + [op for op in ops if op not in saved[name]])
        yield
    finally:
        for name, ops in saved.items():
            setattr(module, name, ops)


def register_cached_op_hook(cached_op, callback):
    """Call ``callback(name, op_name, handle)`` for every output of every op a ``CachedOp`` runs,
    forward and backward (``CachedOp._register_op_hook``, the C API ``MXCachedOpRegisterOpHook``
    behind ``HybridBlock.register_op_hook``): ``name`` and ``op_name`` are bytes, ``handle`` an
    ``NDArrayHandle`` the callback owns (wrap it in an ``NDArray``).  The CachedOp keeps the
    ctypes callback alive."""
    cached_op._register_op_hook(callback, False)
