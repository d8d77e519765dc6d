"""Ready-made training programs that a scenario can name: `linear`, `mlp`, `ctr_dnn`, `word2vec`,
`cnn`.

Each builder appends a forward pass, a loss and an optimizer (`minimize`) to a fresh main and
startup program, inside its own `program_guard` and `unique_name.guard()`, so building twice gives
identical programs. Parameters get explicit, stable names (``mlp.fc0.w``, ``ctr.emb.title_ids``,
``w2v.emb_in``) that the distribute transpiler's golden outputs can rely on. Each lookup and
`nce` passes its `remote_prefetch` (off, but where word2vec's own option asks it of nce), so
the release's default for a sparse table (docs/transpiler.md §9) never moves a scenario's
tables to the pservers: a timing-mode run's ids are phantoms, which no pserver can look up.

A builder returns a `Model`: the programs, the names to feed, the loss var, and hints for the data
side (which data set fits by default and the sizes it must have). `build_model(name, **kwargs)`
looks a builder up by name, or imports one given as ``"package.module:function"``.

The optimizer is given as an `Optimizer` (used as is, so use one object per build), or as a dict
``{"type": "sgd", "learning_rate": 0.1, ...}`` whose other keys go to the optimizer's constructor
(``regularization`` and ``grad_clip`` may be dicts too), plus an optional learning-rate schedule
dict ``{"type": "exponential_decay", "decay_steps": 100, "decay_rate": 0.5}`` whose
``learning_rate`` defaults to the optimizer's.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any, Callable, Mapping, Sequence

from . import clip, layers
from . import lr as schedules
from .framework import ParamAttr, program_guard, unique_name
from .initializer import Constant, Uniform
from .ir import Program, Var
from .optimizer import OPTIMIZERS, Optimizer
from .regularizer import regularizer_from_dict

OptimizerSpec = Optimizer | Mapping[str, Any]
LRSpec = Mapping[str, Any]


@dataclass
class Model:
    """A built training program and what a runner needs to feed and watch it."""

    name: str
    main: Program
    startup: Program
    feeds: list[str]  # names of the data vars to feed, in declaration order
    loss: Var  # the scalar that `minimize` was called on
    label: str | None  # the feed holding the target, if the model has one
    predict: Var  # the model's output (logits, probabilities, regression value, or score)
    data: str  # the data set that fits by default (see runtime.execution.data)
    data_params: dict[str, Any] = field(default_factory=dict)  # sizes the data must have

    @property
    def params(self) -> list[str]:
        """Names of the trainable parameters, sorted."""
        return sorted(p.name for p in self.main.all_parameters() if p.trainable)


class ModelError(ValueError):
    """A model or optimizer spec that cannot be built; the message names the field at fault."""


# -- optimizer specs ------------------------------------------------------------------------------

LR_SCHEDULES: dict[str, Callable[..., Var]] = {
    "exponential_decay": schedules.exponential_decay,
    "natural_exp_decay": schedules.natural_exp_decay,
    "inverse_time_decay": schedules.inverse_time_decay,
    "polynomial_decay": schedules.polynomial_decay,
    "piecewise_decay": schedules.piecewise_decay,
    "noam_decay": schedules.noam_decay,
    "cosine_decay": schedules.cosine_decay,
}

GRAD_CLIPS: dict[str, Callable[..., clip.BaseGradientClipAttr]] = {
    "value": clip.GradientClipByValue,
    "norm": clip.GradientClipByNorm,
    "global_norm": clip.GradientClipByGlobalNorm,
}


def _pick(kind: str, table: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """Split a ``{"type": ..., **kwargs}`` spec into its table entry and the kwargs."""
    if not isinstance(spec, Mapping):
        raise ModelError(f"{kind}: expected a dict with a 'type' key, got {type(spec).__name__}")
    kwargs = dict(spec)
    name = kwargs.pop("type", None)
    if name not in table:
        raise ModelError(f"{kind}: unknown type {name!r}; one of {sorted(table)}")
    return table[name], kwargs


def _call(kind: str, fn: Callable[..., Any], kwargs: Mapping[str, Any]) -> Any:
    """``fn(**kwargs)``, after checking the keyword names so that a bad one is a `ModelError`."""
    try:
        inspect.signature(fn).bind(**kwargs)
    except TypeError as err:
        raise ModelError(f"{kind}: {err}") from None
    unknown = sorted(set(kwargs) - _keywords(fn)) if isinstance(fn, type) else []
    if unknown:
        raise ModelError(f"{kind}: got an unexpected keyword argument {unknown[0]!r}")
    return fn(**kwargs)


def _keywords(cls: type) -> set[str]:
    """Keyword names a class's constructor takes, following ``**kwargs`` up to the bases."""
    names: set[str] = set()
    for base in cls.__mro__:
        if base is not object and "__init__" in vars(base):
            names.update(inspect.signature(vars(base)["__init__"]).parameters)
    return names


def make_lr(spec: LRSpec, base_lr: float | None) -> Var:
    """Append the LR schedule `spec` to the current program; returns the learning-rate var."""
    fn, kwargs = _pick("lr", LR_SCHEDULES, spec)
    if "learning_rate" in inspect.signature(fn).parameters and base_lr is not None:
        kwargs.setdefault("learning_rate", base_lr)
    return _call(f"lr {spec['type']!r}", fn, kwargs)


def make_optimizer(spec: OptimizerSpec, lr_spec: LRSpec | None = None) -> Optimizer:
    """An optimizer from a spec; call inside the model's `program_guard` (a schedule adds ops)."""
    if isinstance(spec, Optimizer):
        if lr_spec is not None:
            raise ModelError("lr: a schedule needs an optimizer dict, not an Optimizer object "
                             "(pass the schedule var as its learning_rate instead)")
        return spec
    cls, kwargs = _pick("optimizer", OPTIMIZERS, spec)
    kind = f"optimizer {spec['type']!r}"
    if isinstance(kwargs.get("regularization"), Mapping):
        try:
            kwargs["regularization"] = regularizer_from_dict(dict(kwargs["regularization"]))
        except (KeyError, ValueError) as err:
            raise ModelError(f"{kind} regularization: {err}") from None
    if isinstance(kwargs.get("grad_clip"), Mapping):
        clip_cls, clip_kwargs = _pick(f"{kind} grad_clip", GRAD_CLIPS, kwargs["grad_clip"])
        kwargs["grad_clip"] = _call(f"{kind} grad_clip", clip_cls, clip_kwargs)
    if lr_spec is not None:
        kwargs["learning_rate"] = make_lr(lr_spec, kwargs.get("learning_rate"))
    if "learning_rate" not in kwargs:
        raise ModelError(f"{kind}: learning_rate is missing")
    return _call(kind, cls, kwargs)  # type: ignore[no-any-return]


# Each builder's optimizer when none is given: what trains its default data set well.
DEFAULT_OPTIMIZERS: dict[str, dict[str, Any]] = {
    "linear": {"type": "sgd", "learning_rate": 0.05},
    "mlp": {"type": "sgd", "learning_rate": 0.1},
    "ctr_dnn": {"type": "adagrad", "learning_rate": 0.05},
    "word2vec": {"type": "adagrad", "learning_rate": 0.2},
    "cnn": {"type": "momentum", "learning_rate": 0.05},
}


# -- building -------------------------------------------------------------------------------------

@dataclass
class Built:
    """What a model's forward pass declares: the feeds in order, the loss, the label feed (if
    any) and the output."""

    feeds: list[str]
    loss: Var
    label: str | None
    predict: Var


def make_model(name: str, body: Callable[[], Built], optimizer: OptimizerSpec | None,
               lr: LRSpec | None = None, seed: int = 0, data: str = "",
               data_params: dict[str, Any] | None = None) -> Model:
    """A `Model` from `body`, a function that declares the forward pass and the loss (with
    `layers`) and returns its `Built`: `body` runs inside a fresh main and startup program's
    `program_guard` and `unique_name.guard()`, then the optimizer `minimize`s the loss. `data`
    names the data set that fits by default (none: the scenario's `data` must name one), with
    the sizes it must have in `data_params`."""
    main, startup = Program(), Program()
    main.random_seed = startup.random_seed = seed
    with program_guard(main, startup), unique_name.guard():
        built = body()
        if optimizer is None and name not in DEFAULT_OPTIMIZERS:
            raise ModelError(f"model {name!r}: no optimizer given, and it has no default")
        make_optimizer(optimizer or DEFAULT_OPTIMIZERS[name], lr).minimize(built.loss)
    return Model(name, main, startup, built.feeds, built.loss, built.label, built.predict, data,
                 dict(data_params or {}))



def _param(name: str, initializer: Any = None, trainable: bool = True) -> ParamAttr:
    return ParamAttr(name=name, initializer=initializer, trainable=trainable)


def _positive(model: str, **values: int) -> None:
    for key, value in values.items():
        if int(value) < 1:
            raise ModelError(f"{model}: {key} must be a positive integer, got {value}")


def linear(in_dim: int = 13, optimizer: OptimizerSpec | None = None, lr: LRSpec | None = None,
           seed: int = 0) -> Model:
    """Linear regression (Paddle's fit_a_line): ``y ~ fc(x, 1)``, mean squared error."""
    _positive("linear", in_dim=in_dim)

    def body() -> Built:
        x = layers.data("x", shape=[in_dim])
        y = layers.data("y", shape=[1])
        pred = layers.fc(x, size=1, param_attr=_param("linear.w"), bias_attr=_param("linear.b"))
        loss = layers.mean(layers.square_error_cost(pred, y))
        return Built(["x", "y"], loss, "y", pred)

    return make_model("linear", body, optimizer, lr, seed, "synthetic_regression", {"dim": in_dim})


def mlp(sizes: Sequence[int] = (64, 128, 10), act: str = "relu",
        optimizer: OptimizerSpec | None = None, lr: LRSpec | None = None, seed: int = 0) -> Model:
    """Classifier: ``x`` of ``sizes[0]`` features, hidden fc layers with `act`, ``sizes[-1]``
    logits, `softmax_with_cross_entropy` against an int64 ``label``."""
    sizes = [int(s) for s in sizes]
    if len(sizes) < 2:
        raise ModelError(f"mlp: sizes needs at least [inputs, classes], got {sizes}")
    _positive("mlp", **{f"sizes[{i}]": s for i, s in enumerate(sizes)})

    def body() -> Built:
        h = layers.data("x", shape=[sizes[0]])
        label = layers.data("label", shape=[1], dtype="int64")
        last = len(sizes) - 2
        for i, size in enumerate(sizes[1:]):
            h = layers.fc(h, size=size, act=None if i == last else act,
                          param_attr=_param(f"mlp.fc{i}.w"), bias_attr=_param(f"mlp.fc{i}.b"))
        loss = layers.mean(layers.softmax_with_cross_entropy(h, label))
        return Built(["x", "label"], loss, "label", h)

    return make_model("mlp", body, optimizer, lr, seed, "synthetic_classification",
                  {"dim": sizes[0], "classes": sizes[-1]})


def ctr_dnn(vocab: int = 1000, embed_dim: int = 16,
            slots: Sequence[str] = ("title_ids", "brand_ids"), hidden: Sequence[int] = (64, 32),
            pool: str = "sum", is_sparse: bool = True, is_distributed: bool = False,
            shared_table: bool = False, dense: int = 0, embedding_v2: bool = False,
            optimizer: OptimizerSpec | None = None, lr: LRSpec | None = None,
            seed: int = 0) -> Model:
    """CTR DNN (Paddle's dist_ctr): per slot, an embedding of int64 LoD ids (table
    ``ctr.emb.<slot>``) pooled per sequence; the pooled slots concatenated, after `dense`
    float features (feed ``dense``; none by default) when asked for; a relu fc tower; a
    2-way softmax and `cross_entropy` against the click ``label``. With `shared_table`, or
    with `is_distributed` (a program has at most one distributed table), all slots share one
    table, ``ctr.emb``. With `embedding_v2` the lookups are `lookup_table_v2` (Paddle's
    ``fluid.embedding``), whose rows keep the ids' trailing 1 ([-1, 1, embed_dim]); the fc
    after them flattens that away, so the model computes what it does without."""
    slots = list(slots)
    if not slots or len(set(slots)) != len(slots):
        raise ModelError(f"ctr_dnn: slots must be distinct names, at least one, got {slots}")
    if "label" in slots or (dense and "dense" in slots):
        raise ModelError("ctr_dnn: 'label' and 'dense' are feed names of their own and cannot "
                         "be slots")
    if int(dense) < 0:
        raise ModelError(f"ctr_dnn: dense must be a non-negative integer, got {dense}")
    _positive("ctr_dnn", vocab=vocab, embed_dim=embed_dim,
              **{f"hidden[{i}]": h for i, h in enumerate(hidden)})

    def body() -> Built:
        pooled = [layers.data("dense", shape=[int(dense)])] if dense else []
        for slot in slots:
            ids = layers.data(slot, shape=[1], dtype="int64", lod_level=1)
            embed = layers.embedding_v2 if embedding_v2 else layers.embedding
            emb = embed(ids, size=[vocab, embed_dim], is_sparse=is_sparse,
                        is_distributed=is_distributed, remote_prefetch=False,
                        param_attr=_param("ctr.emb" if shared_table or is_distributed
                                          else f"ctr.emb.{slot}"))
            pooled.append(layers.sequence_pool(emb, pool))
        h = layers.concat(pooled, axis=1) if len(pooled) > 1 else pooled[0]
        for i, size in enumerate(hidden):
            h = layers.fc(h, size=int(size), act="relu", param_attr=_param(f"ctr.fc{i}.w"),
                          bias_attr=_param(f"ctr.fc{i}.b"))
        prob = layers.fc(h, size=2, act="softmax", param_attr=_param("ctr.out.w"),
                         bias_attr=_param("ctr.out.b"))
        label = layers.data("label", shape=[1], dtype="int64")
        loss = layers.mean(layers.cross_entropy(prob, label))
        return Built(["dense"] * bool(dense) + slots + ["label"], loss, "label", prob)

    return make_model("ctr_dnn", body, optimizer, lr, seed, "ctr",
                      {"vocab": vocab, "slots": slots, "dense": int(dense)})


def word2vec(vocab: int = 1000, embed_dim: int = 16, neg_num: int = 5, is_sparse: bool = True,
             is_distributed: bool = False, optimizer: OptimizerSpec | None = None,
             lr: LRSpec | None = None, seed: int = 0, nce: bool = False,
             remote_prefetch: bool = False) -> Model:
    """Skip-gram with negative sampling. The center word's row of ``w2v.emb_in`` is scored
    against the context word's and each negative's row of ``w2v.emb_out``; a dot product is
    `elementwise_mul` then an fc with the frozen all-ones column ``w2v.ones`` (a row sum). The
    loss is ``-log sigmoid(pos) - sum_k log sigmoid(-neg_k)``, averaged over the batch.
    Negatives are fed one column per var: ``neg_ids_0`` ... ``neg_ids_<neg_num-1>``.

    `nce`: Paddle's word2vec instead: the center word's row scored by `layers.nce` against the
    context word, `neg_num` negatives drawn log-uniformly by the op (weight ``w2v.nce.w``, bias
    ``w2v.nce.b``; sparse when `is_sparse`), the mean cost the loss; only ``center_ids`` and
    ``context_ids`` are fed. `remote_prefetch` (with `nce` and `is_sparse`): a distributed
    trainer fetches only the nce weight's rows it samples."""
    _positive("word2vec", vocab=vocab, embed_dim=embed_dim, neg_num=neg_num)
    if remote_prefetch and not (nce and is_sparse):
        raise ModelError("word2vec: remote_prefetch needs nce and is_sparse")
    negs = [f"neg_ids_{k}" for k in range(neg_num)]
    bound = 0.5 / embed_dim

    def lookup(name: str, table: str, init: Any) -> Var:
        ids = layers.data(name, shape=[1], dtype="int64")
        return layers.embedding(ids, size=[vocab, embed_dim], is_sparse=is_sparse,
                                is_distributed=is_distributed, remote_prefetch=False,
                                param_attr=_param(table, init))

    def dot(a: Var, b: Var) -> Var:
        ones = _param("w2v.ones", Constant(1.0), trainable=False)
        return layers.fc(layers.elementwise_mul(a, b), size=1, param_attr=ones, bias_attr=False)

    def log_sigmoid(x: Var) -> Var:
        return layers.log(layers.sigmoid(x))

    def nce_body() -> Built:
        center = lookup("center_ids", "w2v.emb_in", Uniform(-bound, bound))
        context = layers.data("context_ids", shape=[1], dtype="int64")
        cost = layers.nce(center, context, vocab, num_neg_samples=neg_num, sampler="log_uniform",
                          param_attr=_param("w2v.nce.w", Uniform(-bound, bound)),
                          bias_attr=_param("w2v.nce.b", Constant(0.0)), is_sparse=is_sparse,
                          remote_prefetch=remote_prefetch)
        return Built(["center_ids", "context_ids"], layers.mean(cost), None, cost)

    def body() -> Built:
        center = lookup("center_ids", "w2v.emb_in", Uniform(-bound, bound))
        out_init = Uniform(-bound, bound)
        pos = dot(center, lookup("context_ids", "w2v.emb_out", out_init))
        terms = [log_sigmoid(pos)]
        for name in negs:
            neg = dot(center, lookup(name, "w2v.emb_out", out_init))
            terms.append(log_sigmoid(layers.scale(neg, -1.0)))
        loss = layers.mean(layers.scale(layers.sums(terms), -1.0))
        return Built(["center_ids", "context_ids"] + negs, loss, None, pos)

    return make_model("word2vec", nce_body if nce else body, optimizer, lr, seed, "skipgram",
                  {"vocab": vocab, "neg_num": neg_num})


def cnn(image: int = 8, channels: Sequence[int] = (8, 16), classes: int = 10,
        batch_norm: bool = True, optimizer: OptimizerSpec | None = None,
        lr: LRSpec | None = None, seed: int = 0) -> Model:
    """A small convnet: ``x`` of image*image features reshaped to [-1, 1, image, image]; per
    entry of `channels` a 3x3 conv (padding 1), a `batch_norm` (or, without `batch_norm`, the
    conv's bias) with relu, and a 2x2 max pool; an fc to `classes` logits and
    `softmax_with_cross_entropy` against an int64 ``label``. Fits the 8x8 ``digits`` set, or
    ``synthetic_classification`` with ``dim: 64`` (the default data)."""
    _positive("cnn", image=image, classes=classes,
              **{f"channels[{i}]": c for i, c in enumerate(channels)})
    if image % (2 ** len(channels)):
        raise ModelError(f"cnn: image {image} does not halve {len(channels)} times")

    def body() -> Built:
        x = layers.data("x", shape=[image * image])
        label = layers.data("label", shape=[1], dtype="int64")
        h = layers.reshape(x, [-1, 1, image, image])
        for i, c in enumerate(channels):
            h = layers.conv2d(h, c, 3, padding=1, param_attr=_param(f"cnn.conv{i}.w"),
                              bias_attr=False if batch_norm else _param(f"cnn.conv{i}.b"),
                              act=None if batch_norm else "relu")
            if batch_norm:
                h = layers.batch_norm(h, act="relu", param_attr=_param(f"cnn.bn{i}.w"),
                                      bias_attr=_param(f"cnn.bn{i}.b"),
                                      moving_mean_name=f"cnn.bn{i}.mean",
                                      moving_variance_name=f"cnn.bn{i}.var")
            h = layers.pool2d(h, 2, "max", pool_stride=2)
        logits = layers.fc(h, size=classes, param_attr=_param("cnn.fc.w"),
                           bias_attr=_param("cnn.fc.b"))
        loss = layers.mean(layers.softmax_with_cross_entropy(logits, label))
        return Built(["x", "label"], loss, "label", logits)

    return make_model("cnn", body, optimizer, lr, seed, "synthetic_classification",
                  {"dim": image * image, "classes": classes})


# -- registry -------------------------------------------------------------------------------------

MODELS: dict[str, Callable[..., Model]] = {
    "linear": linear, "mlp": mlp, "ctr_dnn": ctr_dnn, "word2vec": word2vec, "cnn": cnn,
}


def _import_builder(ref: str, folder: str | None = None) -> Callable[..., Model]:
    """The function `ref` (``"module:function"``) names; its module is looked up in `folder`
    first, then on ``sys.path``."""
    module_name, _, func_name = ref.partition(":")
    if not module_name or not func_name:
        raise ModelError(f"model {ref!r}: a builder is named 'module:function'")
    try:
        module = _import_beside(module_name, folder)
    except Exception as err:  # an import runs the module: any error in it is the module's
        raise ModelError(f"model {ref!r}: cannot import {module_name!r}: "
                         f"{type(err).__name__}: {err}") from err
    fn = getattr(module, func_name, None)
    if not callable(fn):
        raise ModelError(f"model {ref!r}: module {module_name!r} ({module.__file__}) has no "
                         f"function {func_name!r}")
    return fn  # type: ignore[no-any-return]


def _import_beside(module_name: str, folder: str | None) -> ModuleType:
    """Import `module_name`, its top-level package or module taken from `folder` when it is
    there. DESIGN: found by `PathFinder` in that folder alone and loaded under its own name,
    so no search path changes; a module of that name already imported from elsewhere is a
    clash to report, not to paper over."""
    top = module_name.partition(".")[0]
    spec = PathFinder.find_spec(top, [folder]) if folder else None
    if spec is None or spec.loader is None:
        return importlib.import_module(module_name)
    loaded = sys.modules.get(top)
    if loaded is not None:
        origin = getattr(getattr(loaded, "__spec__", None), "origin", None)
        if origin is not None and origin != spec.origin:
            raise ImportError(f"{spec.origin} is shadowed by {origin}, imported already under "
                              "the same name; rename one")
        return importlib.import_module(module_name)
    module = importlib.util.module_from_spec(spec)
    sys.modules[top] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[top]
        raise
    return importlib.import_module(module_name)


def builder_for(name: str, folder: str | None = None) -> Callable[..., Model]:
    """The builder `name` names: a key of `MODELS`, or ``"module:function"`` whose module is
    looked up in `folder` (a scenario's folder) first."""
    if ":" in name:
        return _import_builder(name, folder)
    if name in MODELS:
        return MODELS[name]
    raise ModelError(f"unknown model {name!r}; one of {sorted(MODELS)} or 'module:function'")


def build_model(name: str, *, folder: str | None = None, **kwargs: Any) -> Model:
    """Build the model `name` (a key of `MODELS` or ``"module:function"``, its module looked up
    in `folder` first) with the builder's keyword arguments. The builder contract: it takes
    ``optimizer`` (a spec dict), ``lr`` (a schedule dict or None), ``seed`` (an int) and the
    scenario's other model keys as keyword arguments, and returns a `Model` (`make_model`
    assembles one)."""
    builder = builder_for(name, folder)
    model = _call(f"model {name!r}", builder, kwargs)
    if not isinstance(model, Model):
        raise ModelError(f"model {name!r}: the builder returned {type(model).__name__}, "
                         f"not a transpiler.models.Model")
    return model


__all__ = ["DEFAULT_OPTIMIZERS", "GRAD_CLIPS", "LR_SCHEDULES", "MODELS", "Model", "ModelError",
           "Built", "build_model", "builder_for", "cnn", "ctr_dnn", "linear", "make_lr",
           "make_model", "make_optimizer", "mlp", "word2vec"]
