"""The op catalog: every op type pslab knows, each with its facts in one entry.

An `OpDef` says what the layers above would otherwise each keep a list of:

- its input and output slots, and which inputs are differentiable (`grad`): autodiff
  (`transpiler.backward`) writes the grad op ``T_grad`` for exactly those, and its entry is
  derived here (`_grad_def`): it reads every forward slot plus ``<Out>@GRAD`` and writes
  ``<In>@GRAD`` for each differentiable input;
- where it runs (`runs`): through a kernel of every backend (numpy, torch, phantom), in the
  trainer's or pserver's async runtime (the RPC ops), or nowhere yet (ops the transpiler writes
  for modes pslab cannot run);
- its phantom output-shape rule (`shape`), a name the timing-mode backend
  (`runtime.execution.kernels.phantom.SHAPE_RULES`) maps to a function;
- its cost facts for the simulator's roofline (`cost`): a rule name `sim.cost` maps to a
  function, and FLOPs per element;
- for an optimizer (`update`): its accumulator slots, whether the table pserver's sgd may stand
  in for it, and whether it updates only the rows of a sparse gradient.

DESIGN: facts are data, rules are names. The catalog sits in the bottom layer, so it cannot hold
the shape and cost functions (they read runtime values); it names them, and the phantom backend
and `sim.cost` each keep one table from rule name to function, checked against the catalog by
tests/transpiler/test_opcatalog.py. Every consumer derives its lists from `OPS`, so adding an op is adding an
entry here (and its kernels): docs/architecture.md, "Op facts".
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from .ir import Op

__all__ = ["OPS", "Cost", "OpDef", "Runs", "State", "Update", "grad_input_slots", "op_def",
           "LOOKUPS", "REMOTE_PREFETCH_SLOTS", "optimizer_types", "prefetches_rows", "rpc_op_types",
           "runs_rpc"]

Runs = Literal["kernel", "rpc", "none"]
"""Where an op runs: `kernel` (a kernel in each backend), `rpc` (the async runtime of a trainer
or pserver: RPC and collective ops), `none` (the transpiler writes it; pslab cannot run it yet)."""

GRAD_SUFFIX = "@GRAD"


@dataclass(frozen=True, slots=True)
class Cost:
    """The simulator's roofline count of an op's work (`sim.cost` names the rules):
    `elementwise` (`flops` per output element), `softmax` (per element of the largest input),
    `reduction` (per element of X), `optimizer` (per parameter element updated), `pool` (per
    window element of each output element), and `matmul`, `matmul_grad`, `batched_matmul`,
    `batched_matmul_grad`, `conv2d`, `conv2d_grad`, `sequence_conv`, `sequence_conv_grad`,
    `sum`, `lookup`, `lookup_grad` (counted from the shapes, `flops` unused), `nce` (`flops` per
    Input element per sample label).
    An op with no `Cost` gets the generic count: a FLOP per output element."""

    rule: str
    flops: float = 0.0


@dataclass(frozen=True, slots=True)
class State:
    """An optimizer accumulator: its input slot, its output slot (None: another op updates it,
    as Adam's beta powers are scaled after the update), the name the front end gives its vars
    (``moment1_0``), and whether it has the parameter's shape (else [1])."""

    slot: str
    out: str | None
    name: str
    param_shaped: bool = True


@dataclass(frozen=True, slots=True)
class Update:
    """What makes an op an optimizer: it reads ``Param``, ``Grad``, ``LearningRate`` and its
    `state`, and writes ``ParamOut`` and the state's outputs. `table`: the distributed table's
    pserver, which runs sgd at the op's learning rate, may stand in for it. `sparse_rows`: a
    SelectedRows gradient updates only its rows (the others densify it first)."""

    state: tuple[State, ...] = ()
    table: bool = True
    sparse_rows: bool = False

    @property
    def scalar_slots(self) -> tuple[str, ...]:
        """Input slots that do not hold parameter-shaped state."""
        return ("Grad", "LearningRate") + tuple(s.slot for s in self.state if not s.param_shaped)


@dataclass(frozen=True, slots=True)
class OpDef:
    """One op type's facts (see the module docstring)."""

    type: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    grad: tuple[str, ...] = ()
    shape: str | None = "generic"
    cost: Cost | None = None
    runs: Runs = "kernel"
    update: Update | None = None
    grad_shape: str = "gradient"
    grad_cost: Cost | None = None
    grad_op: str | None = None
    """The grad op's type where the original did not name it ``T_grad``."""

    @property
    def grad_type(self) -> str | None:
        """The type of this op's grad op (``T_grad`` unless `grad_op` names it); None when it
        has no gradient."""
        if not self.grad:
            return None
        return self.grad_op or self.type + "_grad"


def _op(type: str, inputs: str = "X", outputs: str = "Out", grad: str = "",
        shape: str | None = "generic", cost: Cost | None = None, grad_shape: str = "gradient",
        grad_cost: Cost | None = None, runs: Runs = "kernel", grad_op: str | None = None) -> OpDef:
    """An entry, slots written as space-separated names."""
    return OpDef(type, tuple(inputs.split()), tuple(outputs.split()), tuple(grad.split()), shape,
                 cost, runs, None, grad_shape, grad_cost, grad_op)


def _map(type: str, flops: float, grad_flops: float | None = None, inputs: str = "X",
         shape: str = "generic") -> OpDef:
    """An elementwise op (`flops` per output element); with `grad_flops`, differentiable in
    every input and its grad op costing that."""
    grad_cost = None if grad_flops is None else Cost("elementwise", grad_flops)
    return _op(type, inputs, grad="" if grad_cost is None else inputs, shape=shape,
               cost=Cost("elementwise", flops), grad_cost=grad_cost)


def _arith(type: str, flops: float, grad_flops: float) -> OpDef:
    """Elementwise arithmetic: X and Y broadcast under Paddle's axis rule."""
    return _map(type, flops, grad_flops, inputs="X Y", shape="broadcast")


def _optimizer(type: str, *state: State, flops: float | None, table: bool = True,
               sparse_rows: bool = False, runs: Runs = "kernel") -> OpDef:
    """An optimizer: Param, Grad, LearningRate and its state in, ParamOut and the state's
    outputs out, every output shaped like Param; `flops` per element updated."""
    update = Update(tuple(state), table, sparse_rows)
    inputs = ("Param", "Grad", "LearningRate") + tuple(s.slot for s in state)
    outputs = ("ParamOut",) + tuple(s.out for s in state if s.out is not None)
    return OpDef(type, inputs, outputs, shape="like_param" if runs == "kernel" else None,
                 cost=None if flops is None else Cost("optimizer", flops), runs=runs,
                 update=update)


_SOFTMAX = Cost("softmax", 5.0)
_MOVE = Cost("elementwise", 0.0)

_FORWARD: tuple[OpDef, ...] = (
    # -- elementwise arithmetic: X and Y broadcast under Paddle's axis rule
    _arith("elementwise_add", 1, 1),
    _arith("elementwise_sub", 1, 1),
    _arith("elementwise_mul", 1, 2),
    _arith("elementwise_div", 1, 3),
    _arith("elementwise_max", 1, 1),
    _arith("elementwise_min", 1, 1),
    _arith("elementwise_pow", 4, 8),
    _op("less_than", "X Y", shape="broadcast"),
    _op("logical_and", "X Y", shape="broadcast"),
    _op("logical_or", "X Y", shape="broadcast"),
    _op("logical_xor", "X Y", shape="broadcast"),
    _op("logical_not"),
    # -- activations and other elementwise maps
    _map("relu", 1, 1),
    _map("sigmoid", 4, 3),
    _map("tanh", 4, 3),
    _map("exp", 4, 1),
    _map("log", 4, 1),
    _map("sqrt", 4, 2),
    _map("square", 1, 2),
    _map("cos", 4, 4),
    _map("softsign", 3, 4),
    # with attributes: gelu (approximate), leaky_relu and elu (alpha), softplus (beta,
    # threshold), brelu (t_min, t_max: torch's Hardtanh)
    _map("gelu", 12, 16),
    _map("silu", 5, 7),
    _map("leaky_relu", 1, 1),
    _map("elu", 4, 4),
    _map("softplus", 5, 5),
    _map("brelu", 2, 2),
    _map("sign", 1),
    _map("floor", 1),
    _map("ceil", 1),
    _map("scale", 2, 1, shape="like_x"),
    _map("clip", 2, 2),
    _op("clip_by_norm"),
    _map("cast", 0, 0),
    _map("assign", 0, 0, shape="like_x"),
    _map("reshape", 0, 0, shape="reshape"),
    _op("increment"),
    # -- softmax and losses
    _op("softmax", grad="X", cost=_SOFTMAX, grad_cost=_SOFTMAX),
    _op("softmax_with_cross_entropy", "Logits Label", "Softmax Loss", grad="Logits",
        cost=_SOFTMAX, grad_cost=_SOFTMAX),
    _op("cross_entropy", "X Label", "Y", grad="X", cost=_SOFTMAX, grad_cost=_SOFTMAX),
    # fluid 1.8's hard-label cross entropy: MatchX is each row's probability of its label, which
    # the grad op, named so by the original, divides by (Paddle's XShape output is left out: the
    # grad op here reads X itself)
    _op("cross_entropy2", "X Label", "Y MatchX", grad="X", cost=_SOFTMAX, grad_cost=_SOFTMAX,
        grad_op="cross_entropy_grad2"),
    # -- evaluation, no gradient: fluid's accuracy is top_k, then accuracy of its Indices
    _op("top_k", outputs="Out Indices"),
    _op("accuracy", "Out Indices Label", "Accuracy Correct Total", shape="accuracy"),
    # fluid's auc: a ROC curve over binned predictions, StatPos/StatNeg (persistable counts) in
    # and updated in place; forward only
    _op("auc", "Predict Label StatPos StatNeg", "AUC StatPosOut StatNegOut", shape="auc"),
    # -- reductions, products, gathers
    _op("mean", grad="X", cost=Cost("reduction", 1)),
    # fluid's reductions over `dim` (or every axis: `reduce_all`), `keep_dim`
    _op("reduce_sum", grad="X", shape="reduce", cost=Cost("reduction", 1),
        grad_cost=Cost("elementwise", 0)),
    _op("reduce_mean", grad="X", shape="reduce", cost=Cost("reduction", 1),
        grad_cost=Cost("elementwise", 1)),
    _op("squared_l2_norm", grad="X", cost=Cost("reduction", 2)),
    _op("sequence_pool", outputs="Out MaxIndex", grad="X", shape="sequence_pool",
        cost=Cost("reduction", 1)),
    # fluid's sequence_conv: each row's context window of contextLength rows within its
    # sequence (zeros past either end) times Filter [contextLength * D, M]
    _op("sequence_conv", "X Filter", grad="X Filter", shape="sequence_conv",
        cost=Cost("sequence_conv"), grad_cost=Cost("sequence_conv_grad")),
    # fluid's cosine similarity of X's rows with Y's (Y may be one row, broadcast)
    _op("cos_sim", "X Y", "Out XNorm YNorm", grad="X Y", shape="cos_sim",
        cost=Cost("reduction", 6), grad_cost=Cost("reduction", 10)),
    _op("mul", "X Y", grad="X Y", shape="mul", cost=Cost("matmul"),
        grad_cost=Cost("matmul_grad")),
    _op("sum", grad="X", shape="sum", cost=Cost("sum")),
    _op("concat", grad="X", shape="concat"),
    _op("lookup_table", "W Ids", grad="W", shape="lookup", cost=Cost("lookup"),
        grad_shape="lookup_grad", grad_cost=Cost("lookup_grad")),
    _op("lookup_table_v2", "W Ids", grad="W", shape="lookup_v2", cost=Cost("lookup"),
        grad_shape="lookup_grad", grad_cost=Cost("lookup_grad")),
    _op("lookup_sparse_table", "W Ids", shape="lookup", cost=Cost("lookup")),
    _op("lookup_sparse_table_read", "W Ids", shape="lookup", cost=Cost("lookup")),
    _op("matmul", "X Y", grad="X Y", shape="matmul", cost=Cost("batched_matmul"),
        grad_cost=Cost("batched_matmul_grad")),
    _op("matmul_v2", "X Y", grad="X Y", shape="matmul", cost=Cost("batched_matmul"),
        grad_cost=Cost("batched_matmul_grad")),
    _op("sigmoid_cross_entropy_with_logits", "X Label", grad="X", shape="like_x",
        cost=Cost("elementwise", 6), grad_cost=Cost("elementwise", 6)),
    # Paddle's noise-contrastive estimation; Step (pslab's) keys the draws (runtime/execution/kernels/sampling.py)
    _op("nce", "Input Label Weight Bias SampleWeight CustomDistProbs CustomDistAlias "
        "CustomDistAliasProbs Step", "Cost SampleLogits SampleLabels", grad="Input Weight Bias",
        shape="nce", cost=Cost("nce", 2), grad_shape="nce_grad", grad_cost=Cost("nce", 4)),
    # fluid's hierarchical sigmoid (hsigmoid): default tree by num_classes, or a custom one by
    # PathTable/PathCode; W_Out (fluid's, for remote prefetch) is never written by pslab's layer
    _op("hierarchical_sigmoid", "X W Label PathTable PathCode Bias", "Out PreOut W_Out",
        grad="X W Bias", shape="hsigmoid", grad_shape="hsigmoid_grad"),
    # -- images and normalization (NCHW)
    _op("conv2d", "Input Filter", "Output", grad="Input Filter", shape="conv2d",
        cost=Cost("conv2d"), grad_cost=Cost("conv2d_grad")),
    _op("pool2d", grad="X", shape="pool2d", cost=Cost("pool", 1), grad_cost=Cost("pool", 2)),
    _op("batch_norm", "X Scale Bias Mean Variance",
        "Y MeanOut VarianceOut SavedMean SavedVariance", grad="X Scale Bias",
        shape="batch_norm", cost=Cost("reduction", 8), grad_cost=Cost("reduction", 12)),
    _op("layer_norm", "X Scale Bias", "Y Mean Variance", grad="X Scale Bias", shape="layer_norm",
        cost=Cost("reduction", 8), grad_cost=Cost("reduction", 12)),
    _op("dropout", outputs="Out Mask", grad="X", shape="dropout", cost=Cost("elementwise", 2),
        grad_cost=Cost("elementwise", 1)),
    # -- shaping: data moved, no arithmetic (the *2 ops also write Paddle's XShape)
    _op("reshape2", outputs="Out XShape", grad="X", shape="reshape2", cost=_MOVE,
        grad_cost=_MOVE),
    _op("transpose2", outputs="Out XShape", grad="X", shape="transpose2", cost=_MOVE,
        grad_cost=_MOVE),
    _op("squeeze2", outputs="Out XShape", grad="X", shape="reshape2", cost=_MOVE,
        grad_cost=_MOVE),
    _op("unsqueeze2", outputs="Out XShape", grad="X", shape="reshape2", cost=_MOVE,
        grad_cost=_MOVE),
    _op("split", grad="X", shape="split", cost=_MOVE, grad_cost=_MOVE),
    _op("slice", "Input", grad="Input", shape="slice", cost=_MOVE, grad_cost=_MOVE),
    _op("gather", "X Index", grad="X", shape="gather", cost=_MOVE, grad_cost=_MOVE),
    # -- distributed training's helpers (run by kernels)
    _op("split_byref", shape="split_byref"),
    _op("split_selected_rows", shape="split_selected_rows"),
    _op("split_ids", "Ids", shape="split_ids"),
    _op("merge_ids", "Ids Rows X", shape="merge_ids"),
    _op("ref_by_trainer_id", "X TrainerId", shape="ref_by_trainer_id"),
    # -- control, initializers, I/O
    _op("conditional_block", "Cond Input", shape="conditional_block"),
    _op("save", outputs="", shape="save"),
    _op("fill_constant", inputs="", shape="from_attrs"),
    # the `shape` attribute with one dim taken from Input's batch (fluid's)
    _op("fill_constant_batch_size_like", inputs="Input", shape="batch_size_like"),
    _op("assign_value", inputs="", shape="from_attrs"),
    _op("uniform_random", inputs="", shape="from_attrs"),
    _op("gaussian_random", inputs="", shape="from_attrs"),
    _op("truncated_gaussian_random", inputs="", shape="from_attrs"),
    _op("fake_init", inputs="", shape="from_attrs"),
    # -- optimizers, in the order the scenario schema lists them
    _optimizer("sgd", flops=2, sparse_rows=True),
    _optimizer("momentum", State("Velocity", "VelocityOut", "velocity"), flops=4),
    _optimizer("adam", State("Moment1", "Moment1Out", "moment1"),
               State("Moment2", "Moment2Out", "moment2"),
               State("Beta1Pow", None, "beta1_pow_acc", param_shaped=False),
               State("Beta2Pow", None, "beta2_pow_acc", param_shaped=False), flops=12),
    _optimizer("adagrad", State("Moment", "MomentOut", "moment"), flops=6),
    _optimizer("decayed_adagrad", State("Moment", "MomentOut", "moment"), flops=7),
    _optimizer("adamax", State("Moment", "MomentOut", "moment"),
               State("InfNorm", "InfNormOut", "inf_norm"),
               State("Beta1Pow", None, "beta1_pow_acc", param_shaped=False), flops=10),
    _optimizer("rmsprop", State("Moment", "MomentOut", "momentum"),
               State("MeanSquare", "MeanSquareOut", "mean_square"),
               State("MeanGrad", "MeanGradOut", "mean_grad"), flops=10),
    _optimizer("ftrl", State("SquaredAccumulator", "SquaredAccumOut", "squared"),
               State("LinearAccumulator", "LinearAccumOut", "linear"), flops=16, table=False),
    # Paddle's LARS momentum: norms over the whole param and grad, so a pserver holds its
    # param whole (distribute.analysis.WHOLE_GRAD_OPS) and never a table's row shard
    _optimizer("lars_momentum", State("Velocity", "VelocityOut", "velocity"), flops=10,
               table=False),
    # -- RPC ops, run by the trainer's and pserver's async runtime
    _op("send", shape=None, runs="rpc"),
    _op("recv", shape=None, runs="rpc"),
    _op("send_barrier", shape=None, runs="rpc"),
    _op("fetch_barrier", shape=None, runs="rpc"),
    _op("prefetch", shape=None, runs="rpc"),
    _op("checkpoint_notify", inputs="", outputs="", shape=None, runs="rpc"),
    _op("listen_and_serv", outputs="", shape=None, runs="rpc"),
    _op("distributed_lookup_table", "Ids W", "Outputs", shape=None, runs="rpc"),
    # -- geo's sparse delta: the rows where a parameter moved since its last pull
    _op("sparse_delta", "X Y", shape="sparse_delta", cost=Cost("elementwise", 2)),
    # -- collective ops, run by the trainer's async runtime over its transport (runtime.services
    # .collective); the stream syncs order nothing there (no streams) and are no-ops
    _op("gen_nccl_id", inputs="", outputs="NCCLID InterNCCLID ExterNCCLID", shape=None,
        runs="rpc"),
    _op("c_gen_nccl_id", inputs="", shape=None, runs="rpc"),
    _op("c_comm_init", outputs="", shape=None, runs="rpc"),
    # single_process_multi_thread: ring 0 over this process's own devices (no id, no peers)
    _op("c_comm_init_all", inputs="", outputs="", shape=None, runs="rpc"),
    _op("c_broadcast", shape=None, runs="rpc"),
    _op("c_allreduce_sum", shape=None, runs="rpc"),
    _op("c_sync_calc_stream", shape=None, runs="rpc"),
    _op("c_sync_comm_stream", shape=None, runs="rpc"),
)


def _grad_def(forward: OpDef) -> OpDef:
    """The entry of `forward`'s grad op (Paddle's default grad-op maker, see the docstring)."""
    assert forward.grad_type is not None
    out_grads = tuple(slot + GRAD_SUFFIX for slot in forward.outputs)
    return replace(forward, type=forward.grad_type,
                   inputs=forward.inputs + forward.outputs + out_grads,
                   outputs=tuple(slot + GRAD_SUFFIX for slot in forward.grad), grad=(),
                   shape=forward.grad_shape, cost=forward.grad_cost, grad_cost=None,
                   grad_op=None)


def _catalog(forward: tuple[OpDef, ...]) -> dict[str, OpDef]:
    ops: dict[str, OpDef] = {}
    for op in forward + tuple(_grad_def(op) for op in forward if op.grad):
        if op.type in ops:
            raise ValueError(f"op catalog: {op.type!r} has two entries")
        ops[op.type] = op
    return ops


OPS: dict[str, OpDef] = _catalog(_FORWARD)
"""Every op type pslab knows, grad ops included, by type."""


def op_def(op_type: str) -> OpDef:
    """The entry of `op_type`; KeyError naming it when the catalog does not know it."""
    try:
        return OPS[op_type]
    except KeyError:
        raise KeyError(f"op type {op_type!r} is not in the op catalog (transpiler/opcatalog.py)") \
            from None


def optimizer_types(runs: Runs | None = None, table: bool | None = None) -> tuple[str, ...]:
    """The optimizer op types, in catalog order; only those that run so (`runs`) and that the
    table's sgd may or may not stand in for (`table`), when given."""
    return tuple(op.type for op in OPS.values() if op.update is not None
                 and (runs is None or op.runs == runs)
                 and (table is None or op.update.table == table))


def grad_input_slots() -> dict[str, tuple[str, ...]]:
    """Differentiable input slots of each op type that has a gradient."""
    return {op.type: op.grad for op in OPS.values() if op.grad}


def rpc_op_types() -> frozenset[str]:
    """Op types the async runtime runs (no kernel)."""
    return frozenset(op.type for op in OPS.values() if op.runs == "rpc")


_RPC_TYPES = rpc_op_types()
LOOKUPS = frozenset({"lookup_table", "lookup_table_v2"})
"""The lookup ops (Paddle's ``fluid.layers.embedding`` and ``fluid.embedding``)."""
REMOTE_PREFETCH_SLOTS = {"lookup_table": "W", "lookup_table_v2": "W", "nce": "Weight"}
"""The ops that may read their table's rows from the pservers (``remote_prefetch``; the
original's `sparse_update_op_types`, less hierarchical_sigmoid), and the slot of the table."""


def prefetches_rows(op: Op) -> bool:
    """Whether `op` reads its table's rows from the pservers' blocks by id: ``remote_prefetch``,
    with the blocks' ``epmap`` the transpiler wrote (an nce's weight, a 1.2 program's
    lookup; `transpiler.distribute.lookup_table`)."""
    return (op.type in REMOTE_PREFETCH_SLOTS and bool(op.attrs.get("remote_prefetch"))
            and bool(op.attrs.get("epmap")))


def runs_rpc(op: Op) -> bool:
    """Whether the async runtime runs `op` (no kernel): an RPC op type, or a lookup that
    `prefetches_rows` (its rows asked for by id)."""
    return op.type in _RPC_TYPES or (op.type in LOOKUPS and prefetches_rows(op))
