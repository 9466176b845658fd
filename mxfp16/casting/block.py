"""The network :func:`mxfp16.cast_block` returns: a SymbolBlock that behaves like its original.

It runs the graph traced in the current autograd mode, writes float32 checkpoints a float32 network
of the same architecture loads, reads float32 or float16 ones, and warns once when a float16
network's output overflows in evaluation.
"""
import warnings

import mxnet as mx
from mxnet import autograd, gluon

from .. import mxnet_internals, numpy_interface
from ..scaling import boundary as boundary_scale
from ..dtypes import LOSS_HEADS
from ..scaling.overflow import all_finite
from ..scaling.heads import symbol_ops
from ..optimizers import master_copies
from . import deploy
from .keep import kept_ops
from .signature import call_structure, describe_call, is_plain_call

#: Dtypes :meth:`CastBlock.save_parameters` writes: float32 (loadable by the float32 network) or the
#: float16 network's own (half the bytes, for deployment).
SAVE_DTYPES = ("float32", "float16")

#: The warning a float16 network gives, once, when an output in inference mode holds inf or NaN.
OVERFLOW_WARNING = (
    "mxfp16: an output of the float16 network holds inf or NaN (inference mode; warned once). "
    "The likely cause: logits beyond 65504, float16's largest value, from the last float16 layer "
    "(the outputs are float32, but only after that layer). Check the inputs for inf/NaN and keep "
    "the logits in range (normalized inputs, weight decay, a smaller learning rate), or evaluate "
    "the float32 network with the checkpoint net.save_parameters() writes.")


def _data_inputs(data_names, numpy=False):
    """Input symbols for the data: float32 declared, any float dtype accepted at call time; numpy
    symbols for a network of the NumPy interface."""
    return [numpy_interface.numpy_symbol(mx.sym.var(name, dtype="float32"), numpy)
            for name in data_names]


def _graph_block(graph, data_names, params, numpy):
    """A SymbolBlock running ``graph``: a numpy graph (``mx.np.ndarray`` outputs) for a network of
    the NumPy interface."""
    return gluon.SymbolBlock(numpy_interface.numpy_symbol(graph, numpy),
                             _data_inputs(data_names, numpy), params=params)


def _ndarrays(out):
    """The NDArrays of a block's output (one array, or nested lists of them)."""
    if isinstance(out, (list, tuple)):
        return [array for item in out for array in _ndarrays(item)]
    return [out] if isinstance(out, mx.nd.NDArray) else []


def _symbolic(call):
    """Whether a call passes Symbols (a hybridized parent block tracing its graph): the boundary
    factors are for calls that run, not for graphs."""
    return any(isinstance(item, mx.sym.Symbol) or
               (isinstance(item, (list, tuple)) and _symbolic(item)) for item in call)


class CastCheckpoints:
    """The float32 checkpoints of a cast network, :class:`CastBlock` or a cast plain Block
    (:class:`~mxfp16.casting.plain_block.CastPlainBlock`): ``save_parameters`` and
    ``load_parameters`` under the float32 network's names.  A class lists those names in
    ``_save_keys()`` (what it writes) and ``_load_keys()`` (what it reads besides the
    parameters' own names); by default the ``param_keys`` of a :class:`CastBlock`."""

    def _save_keys(self):
        """``{name: Parameter}``: the names ``save_parameters`` writes."""
        return self.param_keys

    def _load_keys(self):
        """``{name: Parameter}``: the names ``load_parameters`` reads besides the parameters'."""
        return self._save_keys()

    def save_parameters(self, filename, deduplicate=False, dtype="float32"):
        """Save the parameters under the float32 network's (the original block's) names, in
        float32 by default.

        Parameters
        ----------
        filename : str
        deduplicate : bool
            Save a parameter shared by several layers once, as in Gluon.
        dtype : {'float32', 'float16'}
            ``'float32'``: the optimizer's float32 master weights where it holds them (the Trainer
            the parameters were given to), else the float16 values widened; ``get_model(name)
            .load_parameters(filename)`` loads the file with no option.  ``'float16'``: the values
            as the network holds them (float16 weights, float32 normalization), half the size; a
            float32 network loads it with ``load_parameters(filename, cast_dtype=True)``.

        Raises
        ------
        ValueError
            For another ``dtype``.
        """
        if dtype not in SAVE_DTYPES:
            raise ValueError(f"dtype={dtype!r}: choose one of {', '.join(SAVE_DTYPES)} ('float32' "
                             "for a checkpoint any float32 network loads)")
        saved, seen = {}, set()
        for key, param in self._save_keys().items():
            if not (deduplicate and id(param) in seen):
                seen.add(id(param))
                saved[key] = deploy.float32_value(param) if dtype == "float32" else \
                    numpy_interface.legacy(param.list_data()[0]).copyto(mx.cpu())
        numpy_interface.save_arrays(filename, saved)  # as Gluon writes in this front end

    def load_parameters(self, filename, ctx=None, allow_missing=False, ignore_extra=False,
                        cast_dtype=False, dtype_source="current"):
        """Load a float32 or float16 parameter file, converting each value to this network's dtype.

        The names may be the float32 network's (``save_parameters`` of this network, of the float32
        network, GluonCV's and MXNet's model-zoo files), the cast parts' own, or the parameters'
        (``save_params``; ``arg:``/``aux:`` prefixes allowed).  Loaded float32 values also become
        the optimizer's master weights.  ``cast_dtype`` is accepted for Gluon's signature: values
        are always converted.

        Raises
        ------
        ValueError
            For a parameter the file lacks (unless ``allow_missing``), a name it has that this
            network does not (unless ``ignore_extra``), or ``dtype_source='saved'``.
        """
        if dtype_source != "current":
            raise ValueError(f"dtype_source={dtype_source!r}: a cast network keeps its own dtypes; "
                             "leave dtype_source='current'")
        values, extra = self._values_by_name(numpy_interface.load_arrays(filename))
        params = self.collect_params()
        missing = [name for name in params if name not in values]
        if missing and not allow_missing:
            raise ValueError(f"{filename!r} has no value for parameter(s) {missing[:4]}: pass "
                             "allow_missing=True to keep their current values, or check the file")
        if extra and not ignore_extra:
            raise ValueError(f"{filename!r} holds {extra[:4]}, which this network does not have: "
                             "pass ignore_extra=True to skip them, or check the file")
        params.load_dict(values, ctx=ctx, allow_missing=True, cast_dtype=True)
        for name, value in values.items():
            for master in master_copies(params[name]):
                master[:] = numpy_interface.legacy(value).astype("float32").as_in_context(
                    master.context)

    def _values_by_name(self, loaded):
        """``({parameter name: value}, [unknown keys])`` for a loaded parameter file."""
        by_key = self._load_keys()
        by_name = dict(self.collect_params().items())
        values, extra = {}, []
        for key, value in (loaded.items() if isinstance(loaded, dict) else []):
            name = key[4:] if key.startswith(("arg:", "aux:")) else key
            # Names without the block's prefix too, as gluon's load_parameters restores it
            # (GluonNLP's AWD-LSTM saves its averaged weights so).
            param = by_key.get(name) or by_name.get(name) or by_name.get(self.prefix + name)
            if param is None:
                extra.append(key)
            else:
                values[param.name] = value
        return values, extra


class CastBlock(CastCheckpoints, gluon.SymbolBlock):
    """The network :func:`cast_block` returns: a ``SymbolBlock`` that behaves like its original.

    * Calls in training mode (inside ``autograd.record()`` or ``autograd.train_mode()``) run the
      graph traced in training mode, other calls the one traced in inference mode, so every branch
      on ``autograd.is_training()`` stays live (GluonCV's DropBlock drops only in training).
    * :meth:`save_parameters` writes float32 values under the names the original block uses, so
      the float32 network of the same architecture loads them as they are; :meth:`load_parameters`
      reads float32 or float16 files, with those names or the parameters' own.
    * A float16 network warns once if an output in inference mode holds inf or NaN.
    * While autograd records, its float inputs and outputs pass through the loss-scale factors of
      :mod:`mxfp16.scaling.boundary` (times 1, unless a Trainer back-propagates a loss that ignores
      its head gradient), added at call time: no graph holds them; and the call's inputs are kept,
      by reference, until the step ends (:func:`mxfp16.scaling.boundary.keep_call`): the batch an
      overflow warning locates on.
    * :meth:`export` writes what plain MXNet loads: the float32 graph with the float32 master
      weights, or the float16 GPU graph with every parameter (:func:`mxfp16.export`).

    Parameters
    ----------
    graphs : (Symbol, Symbol or None)
        The cast inference graph, and the cast training graph where it differs.
    data_names : list of str
        The data inputs.
    params : ParameterDict
        The original block's parameters, shared.
    param_keys : dict of str to Parameter
        The original block's ``save_parameters`` names.
    dtype : str
        The dtype the network was cast to.
    numpy : bool
        Whether the network is one of MXNet's NumPy interface: its graphs then run as numpy graphs,
        taking and returning ``mx.np.ndarray``.

    Examples
    --------
    >>> import os, tempfile
    >>> from mxnet.gluon import nn
    >>> import mxfp16
    >>> net16 = mxfp16.cast_block(nn.Dense(2, in_units=3), 'float16')
    >>> net16.initialize()
    >>> path = os.path.join(tempfile.mkdtemp(), 'net.params')
    >>> net16.save_parameters(path)
    >>> sorted((k, v.dtype.__name__) for k, v in mx.nd.load(path).items())
    [('bias', 'float32'), ('weight', 'float32')]
    >>> nn.Dense(2, in_units=3).load_parameters(path)  # the float32 network, no option
    """

    def __init__(self, graphs, data_names, params, param_keys, dtype, tracer=None, plain=None,
                 original=None, plain_training=None, numpy=False):
        inference, training = graphs
        super().__init__(numpy_interface.numpy_symbol(inference, numpy),
                         _data_inputs(data_names, numpy), params=params)
        self.numpy = numpy
        self.data_names = list(data_names)
        self.param_keys = dict(param_keys)
        self._watch_outputs = dtype == "float16"
        # The call traced first: ``count`` plain arrays, of which those at ``positions`` are the
        # graph's inputs, the outputs nested as ``out_fmt`` (None: as the graph gives them); in
        # training mode the same call's own inputs and nesting (``plain_training``: data names,
        # positions, nesting), None while that call waits to be traced from its first use.
        count, positions, out_fmt = plain or (len(data_names), None, None)
        self._plain_count = count
        self._plain_modes = {False: (positions, out_fmt)}
        if plain_training is None and tracer is None:  # nothing to trace: one call, two modes
            plain_training = (data_names, positions, out_fmt)
        if plain_training is not None:
            self._plain_modes[True] = tuple(plain_training[1:])
        train_names = data_names if plain_training is None else plain_training[0]
        # A child block, so hybridize() reaches it; it shares every Parameter.
        self.training_block = None if training is None else \
            _graph_block(training, train_names, params, numpy)
        # Calls of another shape (nested states, optional inputs given or left out), and calls in
        # a mode not traced yet, get graphs of their own, traced from the original block by
        # ``tracer(call, training=...)`` on first use.
        self._tracer, self._variants = tracer, {}
        # The original's other methods (GluonNLP's decoder.init_state_from_encoder, begin_state),
        # not as a child: its Parameters are this block's already.
        object.__setattr__(self, "_original", original)
        self._cast_dtype = dtype
        self._head_answer = (None, False)  # (graphs looked at, whether one holds a loss head)
        if original is not None:  # scripts read them: GluonNLP's k.split(model._prefix)
            self._prefix, self._name = original.prefix, original.name

    def __getattr__(self, name):
        original = self.__dict__.get("_original")
        if original is None or name.startswith("__"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return getattr(original, name)

    def __repr__(self):
        original = self.__dict__.get("_original")
        if original is None:
            return super().__repr__()
        inner = "\n".join("  " + line for line in repr(original).splitlines())
        return f"{type(self).__name__}(dtype={self._cast_dtype!r},\n{inner}\n)"

    @property
    def graphs(self):
        """``(inference graph, training graph or None)``: None when the two are the same, or
        when the training call waits to be traced from its first use (GluonCV's detectors, whose
        training call takes other inputs)."""
        training = None if self.training_block is None else \
            mxnet_internals.symbol_block_graph(self.training_block)[1]
        return mxnet_internals.symbol_block_graph(self)[1], training

    def forward(self, x, *args):
        if not autograd.is_recording() or _symbolic((x,) + args):
            return self._forward((x,) + args)
        # The loss scale of a loss that ignores its head gradient enters here (see
        # mxfp16.scaling.boundary): values unchanged, gradients times 1 unless a Trainer sets it.
        out = self._forward(boundary_scale.scale_inputs((x,) + args))
        boundary_scale.note_call(self, self._holds_loss_head())
        boundary_scale.keep_call(self, (x,) + args)
        return boundary_scale.scale_outputs(out)

    def _holds_loss_head(self):
        """Whether a graph of this network (either mode, any call traced so far) holds an op whose
        backward ignores the head gradient (a SoftmaxOutput cast with the network)."""
        graphs = [graph for graph in self.graphs if graph is not None] + \
            [mxnet_internals.symbol_block_graph(block)[1] for block, _, _ in
             self._variants.values()]
        if self._head_answer[0] != len(graphs):
            found = any(set(symbol_ops(mxnet_internals.graph_json(graph))) & LOSS_HEADS
                        for graph in graphs)
            self._head_answer = (len(graphs), found)
        return self._head_answer[1]

    def _forward(self, call):
        training = autograd.is_training()
        plain = self._plain_modes.get(training)
        if plain is None or not is_plain_call(call, self._plain_count):
            return self._watch(self._call_variant(call, training))
        positions, out_fmt = plain
        if positions is not None:
            call = [call[index] for index in positions]
        if self.training_block is not None and training:
            out = self.training_block(*call)
        else:
            out = self._watch(super().forward(*call))
        if out_fmt is None:
            return out
        return mxnet_internals.regroup(out if isinstance(out, list) else [out], out_fmt)

    def _call_variant(self, call, training):
        """Run a call whose arguments are not the traced data inputs (nested lists, None, or
        another number of arrays), or whose mode was not traced: each traced in its own mode,
        with its own inputs, at its first use."""
        flat, _, key = call_structure(call)
        key = (len(call), key, training)
        if key not in self._variants:
            if self._tracer is None:
                raise TypeError(f"this cast network takes ({', '.join(self.data_names)}) (the "
                                f"inputs it was traced with), called with {describe_call(call)}: "
                                "cast the original Gluon block, whose own calls it then takes")
            self._variants[key] = self._new_variant(call, training)
        block, positions, out_fmt = self._variants[key]
        outputs = block(*[flat[index] for index in positions])
        return mxnet_internals.regroup(outputs if isinstance(outputs, list) else [outputs],
                                       out_fmt)

    def _new_variant(self, call, training=False):
        """``(block, positions, out_fmt)`` of ``call`` traced in one mode (training: in the
        autograd recording state of the call)."""
        trace = self._tracer(call, training=training,
                             recording=training and autograd.is_recording())
        # The original's parameters as they are now: GluonCV's R-CNN creates its target
        # generator (and its constants) at the first training call, that is, in this trace.
        params = self.collect_params() if self._original is None else \
            self._original.collect_params()
        block = _graph_block(trace.graph, trace.data_names, params, self.numpy)
        self.register_child(block, f"variant{len(self._variants)}")
        flags = mxnet_internals.hybridize_flags(self)
        if flags is not None:
            block.hybridize(True, **flags)
        return block, trace.positions, trace.out_fmt

    def _watch(self, out):
        if self._watch_outputs and not autograd.is_training():
            arrays = _ndarrays(out)
            if arrays and not all_finite(arrays):
                self._watch_outputs = False
                warnings.warn(OVERFLOW_WARNING, RuntimeWarning, stacklevel=4)
        return out

    #: ``cast_symbol`` with the mode this network was cast in (set by ``cast_block``): how
    #: :meth:`export` builds the float16 graph.
    recast = None

    #: The paths of the blocks ``keep_float32`` keeps: each selected block and every block inside
    #: it, in ``print(net)`` order (see :func:`mxfp16.cast_block`); empty when nothing is kept or
    #: the network was a ``SymbolBlock`` selected by op names.
    keep_float32 = ()
    _keep = None

    @property
    def kept_ops(self):
        """The names of the ops of the inference graph that ``keep_float32`` keeps in float32."""
        return kept_ops(self.graphs[0], self._keep)

    def export(self, path, epoch=0, remove_amp_cast=True, dtype="float32", emulate=False):
        """Write ``PATH-symbol.json`` and ``PATH-NNNN.params`` that plain MXNet loads: the float32
        graph with the float32 master weights (default), or with ``dtype='float16'`` the float16
        GPU graph with every parameter; never the emulation graph unless ``emulate=True``.  See
        :func:`mxfp16.export`; ``remove_amp_cast`` is accepted for Gluon's signature.
        """
        return deploy.export_network(self, path, dtype=dtype, epoch=epoch, emulate=emulate,
                                     recast=self.recast)
