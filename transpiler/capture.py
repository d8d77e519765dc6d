"""Capture a `torch.nn.Module` into a pslab training program: `from_torch`.

torch.fx traces the module's forward (`symbolic_trace`) into a graph of calls, and shape
propagation on the example inputs gives every node's shape. Each node then becomes the
Paddle-style ops the front end writes (`layers`): `nn.Linear` a `matmul_v2` (+
`elementwise_add`), `nn.Conv2d` a `conv2d`, `F.max_pool2d` a `pool2d`, `nn.GELU` a `gelu`,
`nn.Embedding` a `lookup_table`, `F.cross_entropy` a `softmax_with_cross_entropy` and a `mean`,
... (`supported()` lists them all); anything else is a `CaptureError` naming the node and its
op. An embedding's table may be held by the pservers in pieces, as Paddle's
`embedding(is_distributed=True)` is (`distributed_table`). The forward's arguments become feeds
(batch dim -1; an integer vector, a class label or one id a row, becomes Paddle's [-1, 1]). The
loss is the captured module's own output, or one given by name (`loss="cross_entropy"` or
``"mse"`` against a ``label`` feed); the optimizer's `minimize` then appends backward and the
updates, as for any model.

Parameters keep torch's names (``fc1.weight``, ``features.0.bias``: `state_dict`'s) and layouts
(a linear weight is [out, in]; a layer norm's is flattened), and start from the module's current
values (`initializer.Assign`), as do batch norm's running statistics, so training starts from
the module's weights and `params.npz` compares with `module.state_dict()` entry for entry.

DESIGN: torch is imported only inside the functions here, and this is the one transpiler module
that imports it (tests/meta/test_packaging.py): pslab works without the ``[torch]`` extra, and a
scenario's builder that captures a module runs on every node that builds the model, so the
builder seeds torch (`torch.manual_seed(seed)`) to make every node's module the same.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Sequence

from . import layers
from .framework import ParamAttr, append_op, create_parameter, create_tmp_var
from .framework import default_startup_program
from .initializer import Assign, Constant
from .ir import Var
from .models import Built, LRSpec, Model, ModelError, OptimizerSpec, make_model

__all__ = ["CaptureError", "LOSSES", "from_torch", "supported"]

LOSSES = ("cross_entropy", "mse")
"""Losses `from_torch` can add after a module that returns a prediction."""


class CaptureError(ModelError):
    """A module that cannot be captured; the message names the node and its op."""


def from_torch(module: Any, example_inputs: Any, *, loss: str | None = None,
               label: str = "label", optimizer: OptimizerSpec | None = None,
               lr: LRSpec | None = None, seed: int = 0, name: str | None = None,
               data: str = "", data_params: dict[str, Any] | None = None,
               distributed_table: str | None = None) -> Model:
    """A training `Model` of `module`, traced on `example_inputs` (a tensor, or a tuple of them,
    one per argument of forward; dim 0 is the batch).

    `loss`: None when forward returns the loss (a scalar; the argument named `label`, if any,
    is the model's label), else one of `LOSSES` against a new feed named `label` (int64 class
    ids for cross_entropy, the prediction's shape for mse). `optimizer`, `lr` and `seed` are
    a scenario builder's (`transpiler.models.make_model`); `data` and `data_params` name the
    data set that fits by default. `distributed_table`: the name of one `nn.Embedding` of
    `module` (``"emb"``, as `named_modules` names it) whose table the pservers hold in pieces,
    a trainer prefetching the rows it reads (Paddle's ``embedding(is_distributed=True)``; its
    gradient is sparse rows, whatever the module's `sparse`). Every other table stays on the
    trainers (`remote_prefetch` off, whatever the release's default)."""
    import torch

    if not isinstance(module, torch.nn.Module):
        raise CaptureError(f"from_torch: expected a torch.nn.Module, got {type(module).__name__}")
    if loss is not None and loss not in LOSSES:
        raise CaptureError(f"from_torch: loss {loss!r} is not one of {list(LOSSES)} (or None: "
                           f"forward returns the loss)")
    inputs = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
        else (example_inputs,)
    _check_table(module, distributed_table)
    graph = _trace(module, inputs)
    model_name = name or type(module).__name__

    def body() -> Built:
        capture = _Capture(module, graph, int(inputs[0].shape[0]) if inputs[0].dim() else 0,
                           distributed_table)
        out = capture.run()
        feeds = capture.feeds
        if loss is None:
            if out.shape not in ((1,), ()):
                raise CaptureError(f"from_torch: {model_name}'s forward returns shape "
                                   f"{list(out.shape)}, not a scalar loss; pass loss=...")
            return Built(feeds, out, label if label in feeds else None,
                         capture.predict or out)
        target = _label_feed(label, loss, out)
        return Built(feeds + [label], _add_loss(loss, out, target), label, out)

    return make_model(model_name, body, optimizer, lr, seed, data, data_params)


def _trace(module: Any, inputs: tuple[Any, ...]) -> Any:
    """The fx graph module of `module`, each node's ``tensor_meta`` from `inputs`. The module's
    buffers (batch norm's statistics), which running forward moves, are put back after."""
    import torch
    import torch.fx
    from torch.fx.passes.shape_prop import ShapeProp

    try:
        graph = torch.fx.symbolic_trace(module)
    except Exception as err:  # fx raises TraceError, TypeError, ... for untraceable Python
        raise CaptureError(f"from_torch: torch.fx cannot trace {type(module).__name__}: "
                           f"{type(err).__name__}: {err}") from err
    buffers = [(buffer, buffer.clone()) for buffer in graph.buffers()]
    with torch.no_grad():
        ShapeProp(graph).propagate(*inputs)
        for buffer, before in buffers:
            buffer.copy_(before)
    return graph


def _check_table(module: Any, table: str | None) -> None:
    """`table` (`from_torch`'s `distributed_table`) names an `nn.Embedding` of `module`."""
    import torch

    if table is None:
        return
    embeddings = sorted(n for n, m in module.named_modules() if isinstance(m, torch.nn.Embedding))
    if table not in embeddings:
        raise CaptureError(f"from_torch: distributed_table {table!r} is not an nn.Embedding of "
                           f"{type(module).__name__}; its embeddings: {embeddings or 'none'}")


def _label_feed(label: str, loss: str, out: Var) -> Var:
    if loss == "cross_entropy":
        return layers.data(label, shape=[1], dtype="int64")
    return layers.data(label, shape=list(out.shape[1:]), dtype=out.dtype)


def _add_loss(loss: str, out: Var, target: Var) -> Var:
    if loss == "cross_entropy":
        return layers.mean(layers.softmax_with_cross_entropy(out, target))
    return layers.mean(layers.square_error_cost(out, target))


# -- the graph walk --------------------------------------------------------------------------------

_DTYPES = {"torch.float32": "float32", "torch.float64": "float64", "torch.int64": "int64",
           "torch.int32": "int32"}


class _Capture:
    """Walks the fx graph in order, each node's value being a `Var` (a tensor), or a Python
    value (sizes, ints) that later nodes take as arguments."""

    def __init__(self, module: Any, graph: Any, batch: int, table: str | None = None) -> None:
        self.module, self.graph, self.batch = module, graph, batch
        self.modules = dict(graph.named_modules())
        self.env: dict[Any, Any] = {}
        self.feeds: list[str] = []
        self.predict: Var | None = None  # the logits a captured loss reads
        self.table = table  # the embedding whose table the pservers hold (distributed_table)
        self.looked_up: set[str] = set()  # the embeddings forward reads

    def run(self) -> Var:
        for node in self.graph.graph.nodes:
            if node.op == "output":
                out = self._output(node)
                if self.table is not None and self.table not in self.looked_up:
                    raise CaptureError(f"from_torch: distributed_table {self.table!r}: forward "
                                       f"never looks it up")
                return out
            self.env[node] = self._value(node)
        raise CaptureError("from_torch: the traced graph has no output")

    def _value(self, node: Any) -> Any:
        if node.op == "placeholder":
            return self._feed(node)
        if node.op == "get_attr":
            return self._attr(node)
        args, kwargs = self._load(node.args), self._load(node.kwargs)
        handler, what = self._handler(node)
        try:
            return handler(self, node, *args, **kwargs)
        except CaptureError:
            raise
        except (TypeError, ValueError) as err:
            raise CaptureError(f"from_torch: node {node.name!r} ({what}): "
                               f"{type(err).__name__}: {err}") from err

    def _handler(self, node: Any) -> tuple[Callable[..., Any], str]:
        tables, what = _tables(), _describe(node)
        if node.op == "call_module":
            mod = self.modules[node.target]
            fn = tables.modules.get(type(mod))
            if fn is not None:
                return (lambda cap, n, *a, **k: fn(cap, n, mod, *a, **k)), what
            supported = tables.module_names()
        elif node.op == "call_method":
            if node.target in tables.methods:
                return tables.methods[node.target], what
            supported = sorted(tables.methods)
        else:
            if node.target in tables.functions:
                return tables.functions[node.target], what
            supported = tables.function_names()
        raise CaptureError(f"from_torch: node {node.name!r} ({what}) is not supported; "
                           f"supported {node.op.removeprefix('call_')}s: {', '.join(supported)}")

    def _load(self, value: Any) -> Any:
        import torch.fx

        return torch.fx.node.map_arg(value, lambda n: self.env[n])

    def _feed(self, node: Any) -> Var:
        meta = node.meta.get("tensor_meta")
        if meta is None:
            raise CaptureError(f"from_torch: argument {node.name!r} of forward is not a tensor")
        dtype = _dtype(meta.dtype, node)
        shape = list(meta.shape[1:])
        if not shape and dtype.startswith("int"):
            shape = [1]  # class ids: Paddle's [-1, 1]
        self.feeds.append(node.target)
        return layers.data(node.target, shape=shape, dtype=dtype)

    def _attr(self, node: Any) -> Var:
        import torch

        value = _get_attr(self.graph, node.target)
        if not isinstance(value, torch.nn.Parameter):
            raise CaptureError(f"from_torch: node {node.name!r} (get_attr {node.target}) is not "
                               f"a parameter; only parameters are read as attributes")
        return self.param(node.target, value)

    def _output(self, node: Any) -> Var:
        out = self._load(node.args[0])
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]
        if not isinstance(out, Var):
            raise CaptureError(f"from_torch: forward returns {type(out).__name__}; it must "
                               f"return one tensor")
        return out

    # -- helpers for the handlers
    def param(self, name: str, value: Any, trainable: bool = True) -> Var:
        """The parameter `name` (its torch name), starting from `value`."""
        return create_parameter(self.attr(name, value, trainable), list(value.shape),
                                _dtype(value.dtype, name), Constant(0.0), name)

    def attr(self, name: str, value: Any, trainable: bool = True) -> ParamAttr:
        """How a layer creates the parameter `name` starting from `value` (flattened)."""
        return ParamAttr(name=name, initializer=Assign(_values(value)),
                         trainable=trainable and bool(value.requires_grad))

    def out(self, node: Any, like: Var) -> Var:
        """A temporary of `node`'s traced shape, the batch dim -1 when `like`'s is."""
        return create_tmp_var(node.name, self.shape(node, like), like.dtype)

    def shape(self, node: Any, like: Var) -> list[int]:
        """`node`'s traced shape, the batch dim -1 when `like`'s is."""
        shape = list(node.meta["tensor_meta"].shape)
        if like.shape and like.shape[0] == -1 and shape:
            if shape[0] != self.batch:
                raise CaptureError(f"from_torch: node {node.name!r} ({_describe(node)}) moves "
                                   f"the batch dimension: {list(like.shape)} -> {shape} with "
                                   f"example batch {self.batch}")
            shape[0] = -1
        return shape

    def restart(self, name: str, value: Any) -> None:
        """The persistable var `name` (batch norm's statistics) starts from `value`."""
        block = default_startup_program().global_block()
        block.ops = [op for op in block.ops if name not in op.output_arg_names]
        Assign(_values(value))(block.var(name), block)


def _values(value: Any) -> list[float]:
    return value.detach().cpu().reshape(-1).tolist()  # type: ignore[no-any-return]


def _dtype(dtype: Any, what: Any) -> str:
    key = str(dtype)
    if key not in _DTYPES:
        raise CaptureError(f"from_torch: {getattr(what, 'name', what)!r} has dtype {key}; "
                           f"supported: {', '.join(sorted(_DTYPES))}")
    return _DTYPES[key]


def _get_attr(root: Any, target: str) -> Any:
    obj = root
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _qualname(fn: Any) -> str:
    """How a torch user writes `fn`: ``torch.relu``, ``F.max_pool2d``, ``operator.add``."""
    import torch
    import torch.nn.functional as F

    name = getattr(fn, "__name__", repr(fn))
    if fn is getattr:
        return "getattr"
    for prefix, namespace in (("torch", torch), ("F", F), ("operator", operator)):
        if getattr(namespace, name, None) is fn:
            return f"{prefix}.{name}"
    return f"{getattr(fn, '__module__', None) or '?'}.{getattr(fn, '__qualname__', name)}"


def _describe(node: Any) -> str:
    """A node's op as the errors name it: ``call_module torch.nn.modules.linear.Linear``,
    ``call_function torch.relu``, ``call_method Tensor.view``."""
    if node.op == "call_module":
        kind = type(node.graph.owning_module.get_submodule(node.target))
        return f"call_module {kind.__module__}.{kind.__qualname__}"
    if node.op == "call_method":
        return f"call_method Tensor.{node.target}"
    return f"{node.op} {_qualname(node.target)}"


# -- handlers: (capture, node, *args, **kwargs) -> value, args as torch passes them ---------------

def _unary(op: Callable[[Var], Var]) -> Callable[..., Var]:
    def handle(cap: _Capture, node: Any, x: Var, *_: Any, **__: Any) -> Var:
        return op(_tensor(x, node))
    return handle


def _tensor(x: Any, node: Any) -> Var:
    if not isinstance(x, Var):
        raise CaptureError(f"from_torch: node {node.name!r} ({_describe(node)}) takes a "
                           f"{type(x).__name__} where pslab needs a tensor")
    return x


def _linear(cap: _Capture, node: Any, x: Var, weight: Var, bias: Var | None = None) -> Var:
    """``x @ weight.T + bias``, weight in torch's [out, in] layout."""
    out = cap.out(node, x)
    append_op("matmul_v2", {"X": [x], "Y": [weight]}, {"Out": [out]},
              {"trans_x": False, "trans_y": True})
    return out if bias is None else layers.elementwise_add(out, bias)


def _linear_module(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
    bias = None if mod.bias is None else cap.param(f"{node.target}.bias", mod.bias)
    return _linear(cap, node, x, cap.param(f"{node.target}.weight", mod.weight), bias)


def _conv2d_module(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
    if mod.padding_mode != "zeros" or isinstance(mod.padding, str) and mod.padding != "valid":
        raise ValueError(f"padding {mod.padding!r} ({mod.padding_mode}) is not supported; "
                         f"explicit zero padding only")
    padding = [0, 0] if isinstance(mod.padding, str) else list(mod.padding)
    bias = False if mod.bias is None else cap.attr(f"{node.target}.bias", mod.bias)
    return layers.conv2d(x, mod.out_channels, list(mod.kernel_size), list(mod.stride), padding,
                         list(mod.dilation), mod.groups,
                         param_attr=cap.attr(f"{node.target}.weight", mod.weight),
                         bias_attr=bias, name=node.name)


def _pool(kind: str) -> Callable[..., Var]:
    def handle(cap: _Capture, node: Any, x: Var, kernel_size: Any, stride: Any = None,
               padding: Any = 0, dilation: Any = 1, ceil_mode: bool = False,
               return_indices: bool = False, count_include_pad: bool = True,
               divisor_override: Any = None) -> Var:
        if ceil_mode or return_indices or divisor_override is not None \
                or dilation not in (1, (1, 1), [1, 1]):
            raise ValueError("ceil_mode, return_indices, dilation and divisor_override are "
                             "not supported")
        stride = kernel_size if stride is None or stride == [] else stride
        return layers.pool2d(_tensor(x, node), _pair(kernel_size), kind, _pair(stride),
                             _pair(padding), exclusive=not count_include_pad)
    return handle


def _pool_module(kind: str) -> Callable[..., Var]:
    def handle(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
        extra = {"count_include_pad": mod.count_include_pad,
                 "divisor_override": mod.divisor_override} if kind == "avg" else \
            {"dilation": mod.dilation, "return_indices": mod.return_indices}
        return _pool(kind)(cap, node, x, mod.kernel_size, mod.stride, mod.padding,
                           ceil_mode=mod.ceil_mode, **extra)
    return handle


def _adaptive_module(kind: str) -> Callable[..., Var]:
    def handle(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
        if _pair(mod.output_size) != [1, 1]:
            raise ValueError(f"output_size {mod.output_size} is not supported; only 1 (global "
                             f"pooling)")
        return layers.pool2d(x, pool_type=kind, global_pooling=True)
    return handle


def _pair(value: Any) -> list[int]:
    return [int(value)] * 2 if isinstance(value, int) else [int(v) for v in value]


def _batch_norm_module(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
    if not mod.affine or not mod.track_running_stats or mod.momentum is None:
        raise ValueError("batch norm needs affine=True, track_running_stats=True and a "
                         "momentum (not None)")
    path = node.target
    out = layers.batch_norm(x, is_test=not mod.training, momentum=1.0 - mod.momentum,
                            epsilon=mod.eps, param_attr=cap.attr(f"{path}.weight", mod.weight),
                            bias_attr=cap.attr(f"{path}.bias", mod.bias),
                            moving_mean_name=f"{path}.running_mean",
                            moving_variance_name=f"{path}.running_var", name=node.name)
    cap.restart(f"{path}.running_mean", mod.running_mean)
    cap.restart(f"{path}.running_var", mod.running_var)
    return out


def _layer_norm_module(cap: _Capture, node: Any, mod: Any, x: Var) -> Var:
    affine = mod.elementwise_affine
    has_bias = affine and mod.bias is not None
    return layers.layer_norm(
        x, scale=affine, shift=has_bias, begin_norm_axis=len(x.shape) - len(mod.normalized_shape),
        epsilon=mod.eps, name=node.name,
        param_attr=cap.attr(f"{node.target}.weight", mod.weight) if affine else None,
        bias_attr=cap.attr(f"{node.target}.bias", mod.bias) if has_bias else None)


def _dropout(cap: _Capture, node: Any, x: Var, p: float = 0.5, training: bool = True,
             inplace: bool = False) -> Var:
    return layers.dropout(_tensor(x, node), float(p), is_test=not training,
                          dropout_implementation="upscale_in_train", name=node.name)


def _softmax(cap: _Capture, node: Any, x: Var, dim: int | None = None, *_: Any,
             **__: Any) -> Var:
    if dim is None:
        raise ValueError("softmax needs dim")
    return layers.softmax(_tensor(x, node), axis=int(dim))


def _gelu(cap: _Capture, node: Any, x: Var, approximate: str = "none") -> Var:
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate {approximate!r} is not 'none' or 'tanh'")
    return layers.gelu(_tensor(x, node), approximate == "tanh")


def _silu(cap: _Capture, node: Any, x: Var, inplace: bool = False) -> Var:
    return layers.silu(_tensor(x, node))


def _leaky_relu(cap: _Capture, node: Any, x: Var, negative_slope: float = 0.01,
                inplace: bool = False) -> Var:
    return layers.leaky_relu(_tensor(x, node), float(negative_slope))


def _elu(cap: _Capture, node: Any, x: Var, alpha: float = 1.0, inplace: bool = False) -> Var:
    return layers.elu(_tensor(x, node), float(alpha))


def _softplus(cap: _Capture, node: Any, x: Var, beta: float = 1.0,
              threshold: float = 20.0) -> Var:
    return layers.softplus(_tensor(x, node), float(beta), float(threshold))


def _hardtanh(cap: _Capture, node: Any, x: Var, min_val: float = -1.0, max_val: float = 1.0,
              inplace: bool = False) -> Var:
    return layers.brelu(_tensor(x, node), float(min_val), float(max_val))


def _relu6(cap: _Capture, node: Any, x: Var, inplace: bool = False) -> Var:
    return layers.brelu(_tensor(x, node), 0.0, 6.0)


def _activation_modules(nn: Any) -> dict[type, Callable[..., Var]]:
    """The activation modules with attributes, each as its function's handler."""
    return {
        nn.GELU: lambda cap, node, mod, x: _gelu(cap, node, x, mod.approximate),
        nn.SiLU: _module_of(_silu),
        nn.LeakyReLU: lambda cap, node, mod, x: _leaky_relu(cap, node, x, mod.negative_slope),
        nn.ELU: lambda cap, node, mod, x: _elu(cap, node, x, mod.alpha),
        nn.Softplus: lambda cap, node, mod, x: _softplus(cap, node, x, mod.beta, mod.threshold),
        nn.Hardtanh: lambda cap, node, mod, x: _hardtanh(cap, node, x, mod.min_val, mod.max_val),
        nn.ReLU6: _module_of(_relu6),
    }


def _embedding_module(cap: _Capture, node: Any, mod: Any, ids: Var) -> Var:
    """`lookup_table` of the module's weight (`lookup_table_v2` where torch keeps the ids'
    trailing 1), its `padding_idx` and `sparse` Paddle's, `is_distributed` where it is the
    `distributed_table`."""
    if mod.max_norm is not None or mod.scale_grad_by_freq:
        raise ValueError("max_norm and scale_grad_by_freq are not supported: Paddle's lookup "
                         "neither renormalizes the rows it reads nor scales their gradients")
    ids, pad = _tensor(ids, node), mod.padding_idx
    if pad is not None and bool(mod.weight[pad].ne(0).any()):
        raise ValueError(f"row {pad} of the weight, the padding_idx, is not zero: Paddle's "
                         f"padding_idx reads zeros there (torch reads the row, which it starts "
                         f"at zero)")
    want = cap.shape(node, ids)
    keeps_one = ids.shape[-1] == 1 and len(want) == len(ids.shape) + 1
    lookup = layers.embedding_v2 if keeps_one else layers.embedding
    distributed = node.target == cap.table
    out = lookup(ids, [mod.num_embeddings, mod.embedding_dim],
                 is_sparse=bool(mod.sparse) or distributed, is_distributed=distributed,
                 remote_prefetch=False, padding_idx=pad,
                 param_attr=cap.attr(f"{node.target}.weight", mod.weight),
                 dtype=_dtype(mod.weight.dtype, node))
    if list(out.shape) != want:
        raise ValueError(f"ids of shape {list(ids.shape)} look up {list(out.shape)}, torch "
                         f"{want}")
    cap.looked_up.add(node.target)
    return out


def _reshape(cap: _Capture, node: Any, x: Var, *_: Any, **__: Any) -> Var:
    """view / reshape / flatten: the traced output shape, the batch dim -1."""
    x = _tensor(x, node)
    shape = cap.out(node, x).shape
    return layers.reshape(x, list(shape))


def _identity(cap: _Capture, node: Any, x: Any, *_: Any, **__: Any) -> Any:
    return x


def _size(cap: _Capture, node: Any, x: Var, dim: int | None = None) -> Any:
    """Sizes as traced (the batch dim the example's); a reshape takes its shape from the trace,
    not from these."""
    shape = tuple(node.args[0].meta["tensor_meta"].shape)
    return shape if dim is None else shape[dim]


def _getattr(cap: _Capture, node: Any, x: Any, name: str) -> Any:
    if isinstance(x, Var) and name == "shape":
        return _size(cap, node, x)
    raise ValueError(f"attribute {name!r} is not supported; only .shape")


def _getitem(cap: _Capture, node: Any, x: Any, index: Any) -> Any:
    if isinstance(x, Var):
        raise ValueError("indexing a tensor is not supported")
    return x[index]


def _concat(cap: _Capture, node: Any, tensors: Sequence[Var], dim: int = 0) -> Var:
    return layers.concat([_tensor(t, node) for t in tensors], axis=int(dim))


def _transpose(cap: _Capture, node: Any, x: Var, dim0: int, dim1: int) -> Var:
    x = _tensor(x, node)
    perm = list(range(len(x.shape)))
    a, b = dim0 % len(perm), dim1 % len(perm)
    perm[a], perm[b] = perm[b], perm[a]
    return layers.transpose(x, perm)


def _permute(cap: _Capture, node: Any, x: Var, *dims: Any) -> Var:
    x = _tensor(x, node)
    flat = list(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else list(dims)
    return layers.transpose(x, [int(d) % len(x.shape) for d in flat])


def _matmul(cap: _Capture, node: Any, x: Var, y: Var) -> Var:
    x, y = _tensor(x, node), _tensor(y, node)
    out = cap.out(node, x)
    append_op("matmul_v2", {"X": [x], "Y": [y]}, {"Out": [out]},
              {"trans_x": False, "trans_y": False})
    return out


def _mean(cap: _Capture, node: Any, x: Var, *args: Any, **kwargs: Any) -> Var:
    if args or kwargs.get("dim") is not None:
        raise ValueError("a mean over some dims is not supported; only over all elements")
    return layers.mean(_tensor(x, node))


# Scalar arithmetic: `scale` with (scale, bias) of the number a, keyed by (op, number side).
_SCALED: dict[tuple[str, str], Callable[[float], tuple[float, float]]] = {
    ("add", "right"): lambda a: (1.0, a), ("add", "left"): lambda a: (1.0, a),
    ("sub", "right"): lambda a: (1.0, -a), ("sub", "left"): lambda a: (-1.0, a),
    ("mul", "right"): lambda a: (a, 0.0), ("mul", "left"): lambda a: (a, 0.0),
    ("div", "right"): lambda a: (1.0 / a, 0.0),
}
_COMMUTES = ("add", "mul")


def _arith(kind: str) -> Callable[..., Any]:
    """`elementwise_<kind>` of two tensors (torch's broadcasting: Paddle's with axis -1), a
    `scale` of a tensor and a number, or Python arithmetic of two numbers."""
    python = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
              "div": operator.truediv}[kind]

    def handle(cap: _Capture, node: Any, x: Any, y: Any, *, alpha: Any = None) -> Any:
        if alpha is not None:
            raise ValueError("alpha is not supported")
        if not isinstance(x, Var) and not isinstance(y, Var):
            return python(x, y)
        if isinstance(x, Var) and isinstance(y, Var):
            if kind in _COMMUTES and len(x.shape) < len(y.shape):
                x, y = y, x
            out = cap.out(node, x if x.shape[:1] == (-1,) else y)
            append_op(f"elementwise_{kind}", {"X": [x], "Y": [y]}, {"Out": [out]}, {"axis": -1})
            return out
        var, number, side = (x, y, "right") if isinstance(x, Var) else (y, x, "left")
        if not isinstance(number, (int, float)) or (kind, side) not in _SCALED:
            raise ValueError(f"{type(number).__name__} {kind} on the {side} of a tensor is "
                             f"not supported")
        scale, bias = _SCALED[(kind, side)](float(number))
        return layers.scale(var, scale, bias)
    return handle


def _neg(cap: _Capture, node: Any, x: Var) -> Var:
    return layers.scale(_tensor(x, node), -1.0)


def _cross_entropy(cap: _Capture, node: Any, input: Var, target: Var, weight: Any = None,
                   size_average: Any = None, ignore_index: int = -100, reduce: Any = None,
                   reduction: str = "mean", label_smoothing: float = 0.0) -> Var:
    if weight is not None or reduction != "mean" or label_smoothing or ignore_index != -100 \
            or size_average is not None or reduce is not None:
        raise ValueError("only the mean over the batch of an unweighted, unsmoothed cross "
                         "entropy is supported")
    cap.predict = _tensor(input, node)
    return _add_loss("cross_entropy", cap.predict, _tensor(target, node))


def _mse(cap: _Capture, node: Any, input: Var, target: Var, size_average: Any = None,
         reduce: Any = None, reduction: str = "mean", weight: Any = None) -> Var:
    if reduction != "mean" or size_average is not None or reduce is not None or weight is not None:
        raise ValueError("only the mean squared error over all elements is supported")
    cap.predict = _tensor(input, node)
    return _add_loss("mse", cap.predict, _tensor(target, node))


def _loss_module(fn: Callable[..., Var]) -> Callable[..., Var]:
    def handle(cap: _Capture, node: Any, mod: Any, input: Var, target: Var) -> Var:
        extra = {} if not hasattr(mod, "label_smoothing") else {
            "weight": mod.weight, "ignore_index": mod.ignore_index,
            "label_smoothing": mod.label_smoothing}
        return fn(cap, node, input, target, reduction=mod.reduction, **extra)
    return handle


def _module_of(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A module handler that calls the function handler `fn` on the module's input."""
    def handle(cap: _Capture, node: Any, mod: Any, *args: Any, **kwargs: Any) -> Any:
        return fn(cap, node, *args, **kwargs)
    return handle


# -- the tables -----------------------------------------------------------------------------------

class _Tables:
    """What each torch module type, function and tensor method becomes."""

    def __init__(self) -> None:
        import torch
        import torch.nn.functional as F
        from torch import nn

        relu, sigmoid, tanh = (_unary(layers.relu), _unary(layers.sigmoid),
                               _unary(layers.tanh))
        exp, log, sqrt, square = (_unary(layers.exp), _unary(layers.log), _unary(layers.sqrt),
                                  _unary(layers.square))
        add, sub, mul, div = _arith("add"), _arith("sub"), _arith("mul"), _arith("div")
        flatten_module = _module_of(_reshape)
        self.modules: dict[type, Callable[..., Any]] = {
            nn.Linear: _linear_module, nn.Conv2d: _conv2d_module,
            nn.MaxPool2d: _pool_module("max"), nn.AvgPool2d: _pool_module("avg"),
            nn.AdaptiveMaxPool2d: _adaptive_module("max"),
            nn.AdaptiveAvgPool2d: _adaptive_module("avg"),
            nn.BatchNorm1d: _batch_norm_module, nn.BatchNorm2d: _batch_norm_module,
            nn.LayerNorm: _layer_norm_module,
            nn.Dropout: lambda cap, node, mod, x: _dropout(cap, node, x, mod.p, mod.training),
            nn.ReLU: _module_of(relu), nn.Sigmoid: _module_of(sigmoid),
            nn.Tanh: _module_of(tanh),
            nn.Softmax: lambda cap, node, mod, x: _softmax(cap, node, x, mod.dim),
            nn.Flatten: flatten_module, nn.Identity: _module_of(_identity),
            nn.CrossEntropyLoss: _loss_module(_cross_entropy), nn.MSELoss: _loss_module(_mse),
            nn.Embedding: _embedding_module, **_activation_modules(nn),
        }
        self.functions: dict[Any, Callable[..., Any]] = {
            torch.relu: relu, F.relu: relu, torch.sigmoid: sigmoid, F.sigmoid: sigmoid,
            torch.tanh: tanh, F.tanh: tanh, torch.exp: exp, torch.log: log, torch.sqrt: sqrt,
            torch.square: square, torch.softmax: _softmax, F.softmax: _softmax,
            torch.flatten: _reshape, torch.reshape: _reshape, torch.cat: _concat,
            torch.concat: _concat, torch.transpose: _transpose, torch.permute: _permute,
            torch.matmul: _matmul, operator.matmul: _matmul, F.linear: _linear,
            operator.add: add, torch.add: add, operator.sub: sub, torch.sub: sub,
            operator.mul: mul, torch.mul: mul, operator.truediv: div, torch.div: div,
            operator.neg: _neg, torch.mean: _mean, F.max_pool2d: _pool("max"),
            F.avg_pool2d: _pool("avg"), F.dropout: _dropout, F.cross_entropy: _cross_entropy,
            F.mse_loss: _mse, operator.getitem: _getitem, getattr: _getattr,
            F.gelu: _gelu, F.silu: _silu, F.leaky_relu: _leaky_relu, F.elu: _elu,
            F.softplus: _softplus, F.hardtanh: _hardtanh, F.relu6: _relu6,
        }
        self.methods: dict[str, Callable[..., Any]] = {
            "relu": relu, "sigmoid": sigmoid, "tanh": tanh, "exp": exp, "log": log,
            "sqrt": sqrt, "square": square, "softmax": _softmax, "view": _reshape,
            "reshape": _reshape, "flatten": _reshape, "size": _size, "transpose": _transpose,
            "permute": _permute, "contiguous": _identity, "matmul": _matmul, "mean": _mean,
            "add": add, "sub": sub, "mul": mul, "div": div,
        }

    def module_names(self) -> list[str]:
        return sorted(f"nn.{kind.__name__}" for kind in self.modules)

    def function_names(self) -> list[str]:
        return sorted({_qualname(fn) for fn in self.functions})


_TABLES: list[_Tables] = []


def _tables() -> _Tables:
    if not _TABLES:
        _TABLES.append(_Tables())
    return _TABLES[0]


def supported() -> dict[str, list[str]]:
    """What `from_torch` captures: module types, functions and tensor methods, by name."""
    tables = _tables()
    return {"modules": tables.module_names(), "functions": tables.function_names(),
            "methods": sorted(tables.methods)}

