"""What an op does, counted from the shapes it works on: its FLOPs and the bytes it moves.

`op_work(op, scope)` reads the values an op's inputs and outputs hold (phantoms count as the
values they stand for: `shape_of`, `nbytes_of`, so a timing-mode op works as its numeric twin)
and applies the op's cost rule from the op catalog (`transpiler.opcatalog.Cost`: a rule name and
FLOPs per element; `COST_RULES`): matrix products count 2*M*K*N per product, convolutions their
multiply-adds (`sequence_conv` the product of its windows and Filter), elementwise ops their
FLOPs per output element; every op the bytes of every input it reads and output it writes. The simulator prices ops from it (`sim.cost`: a roofline, or a
machine's calibrated curves), and `runtime calibrate` measures kernels against it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.execution.scope import Scope
from runtime.execution.tensor import LoDTensor, Phantom, SelectedRows, nbytes_of, shape_of
from transpiler.ir import Op
from transpiler.opcatalog import OPS, Cost, OpDef

__all__ = ["COST_RULES", "CostRule", "Work", "op_work", "out_elements"]


@dataclass(frozen=True, slots=True)
class Work:
    """What an op does, as a roofline sees it."""

    flops: float
    bytes: float


_VALUES = (np.ndarray, LoDTensor, SelectedRows, Phantom)
"""What a cost counts: numeric values and the phantoms that stand for them in timing mode."""


def _shape(value: Any) -> tuple[int, ...] | None:
    """The shape of the data `value` holds (or, a phantom, would hold); None for anything else."""
    return shape_of(value) if isinstance(value, _VALUES) else None


def _nbytes(value: Any) -> int:
    return nbytes_of(value) if isinstance(value, _VALUES) else 0


def _elements(value: Any) -> int:
    shape = _shape(value)
    return 0 if shape is None else math.prod(shape)


def _is_rows(value: Any) -> bool:
    """Whether `value` is a `SelectedRows` or the phantom of one."""
    return isinstance(value, SelectedRows) or (isinstance(value, Phantom) and value.is_rows)


def _values(scope: Scope, names: list[str]) -> list[Any]:
    return [scope.get_tensor(name) for name in names if scope.has(name)]


def _first(op: Op, scope: Scope, slot: str, output: bool = False) -> Any | None:
    values = _values(scope, op.output(slot) if output else op.input(slot))
    return values[0] if values else None


def _moved(op: Op, scope: Scope, skip: frozenset[str] = frozenset()) -> int:
    """Bytes of every input read (but those of the `skip` slots) and every output written."""
    read = sum(_nbytes(v) for slot, names in op.inputs.items() if slot not in skip
               for v in _values(scope, names))
    return read + sum(_nbytes(v) for names in op.outputs.values() for v in _values(scope, names))


def out_elements(op: Op, scope: Scope) -> int:
    return sum(_elements(v) for names in op.outputs.values() for v in _values(scope, names))


def _generic(op: Op, scope: Scope) -> Work:
    """Any other op: one FLOP per output element; every input and output moved once."""
    return Work(out_elements(op, scope), _moved(op, scope))


def _matmul(op: Op, scope: Scope, products: int) -> Work:
    """`mul` and `mul_grad`: X and Y flattened to [M, K] and [K, N] by their num_col_dims;
    each product is 2*M*K*N FLOPs."""
    x, y = _shape(_first(op, scope, "X")), _shape(_first(op, scope, "Y"))
    if x is None or y is None:
        return _generic(op, scope)
    xd, yd = int(op.attr("x_num_col_dims", 1)), int(op.attr("y_num_col_dims", 1))
    m, k, n = math.prod(x[:xd]), math.prod(x[xd:]), math.prod(y[yd:])
    return Work(2.0 * m * k * n * products, _moved(op, scope))


def _mul(op: Op, scope: Scope, flops: float) -> Work:
    return _matmul(op, scope, 1)


def _mul_grad(op: Op, scope: Scope, flops: float) -> Work:
    products = sum(1 for slot in ("X@GRAD", "Y@GRAD") if _first(op, scope, slot, output=True)
                   is not None)
    return _matmul(op, scope, products)


def _in_or_out(op: Op, scope: Scope, slot: str) -> Any | None:
    """The value of `slot`: an output of a forward op, an input of its grad op."""
    value = _first(op, scope, slot, output=True)
    return value if value is not None else _first(op, scope, slot)


def _grads_written(op: Op, scope: Scope, slots: tuple[str, ...]) -> int:
    return sum(1 for slot in slots if _first(op, scope, slot, output=True) is not None)


def _batched(op: Op, scope: Scope, products: int) -> Work:
    """`matmul`, `matmul_v2` and their grads: 2*K FLOPs per element of Out per product, K the
    contracted dim of X (after its transpose)."""
    x, out = _shape(_first(op, scope, "X")), _shape(_in_or_out(op, scope, "Out"))
    if x is None or out is None:
        return _generic(op, scope)
    transposed = op.attr("trans_x" if op.type.startswith("matmul_v2") else "transpose_X", False)
    k = x[-2] if transposed and len(x) > 1 else x[-1]
    return Work(2.0 * k * math.prod(out) * products, _moved(op, scope))


def _batched_matmul(op: Op, scope: Scope, flops: float) -> Work:
    return _batched(op, scope, 1)


def _batched_matmul_grad(op: Op, scope: Scope, flops: float) -> Work:
    return _batched(op, scope, _grads_written(op, scope, ("X@GRAD", "Y@GRAD")))


def _conv(op: Op, scope: Scope, products: int) -> Work:
    """`conv2d` and its grad: 2 * C/groups * KH * KW FLOPs per Output element per product (the
    forward's, the Input's and the Filter's gradient each one)."""
    w, out = _shape(_first(op, scope, "Filter")), _shape(_in_or_out(op, scope, "Output"))
    if w is None or out is None:
        return _generic(op, scope)
    return Work(2.0 * math.prod(w[1:]) * math.prod(out) * products, _moved(op, scope))


def _conv2d(op: Op, scope: Scope, flops: float) -> Work:
    return _conv(op, scope, 1)


def _conv2d_grad(op: Op, scope: Scope, flops: float) -> Work:
    return _conv(op, scope, _grads_written(op, scope, ("Input@GRAD", "Filter@GRAD")))


def _context_conv(op: Op, scope: Scope, products: int) -> Work:
    """`sequence_conv` and its grad: 2 * contextLength * D * M FLOPs per row of X per product
    (the forward's, X's and Filter's gradient each one): a [T, contextLength * D] x
    [contextLength * D, M] product."""
    x, w = _shape(_first(op, scope, "X")), _shape(_first(op, scope, "Filter"))
    if x is None or w is None:
        return _generic(op, scope)
    return Work(2.0 * x[0] * math.prod(w) * products, _moved(op, scope))


def _sequence_conv(op: Op, scope: Scope, flops: float) -> Work:
    return _context_conv(op, scope, 1)


def _sequence_conv_grad(op: Op, scope: Scope, flops: float) -> Work:
    return _context_conv(op, scope, _grads_written(op, scope, ("X@GRAD", "Filter@GRAD")))


def _pool(op: Op, scope: Scope, flops: float) -> Work:
    """`pool2d` and its grad: `flops` per window element of each Out element."""
    x, out = _shape(_first(op, scope, "X")), _shape(_in_or_out(op, scope, "Out"))
    if x is None or out is None:
        return _generic(op, scope)
    window = x[2:] if op.attr("global_pooling", False) else op.attr("ksize", x[2:])
    return Work(flops * math.prod(window) * math.prod(out), _moved(op, scope))


def _lookup(op: Op, scope: Scope, flops: float) -> Work:
    """`lookup_table`: the ids read, the rows read from the table and written to Out."""
    out = _first(op, scope, "Out", output=True)
    return Work(0.0, _moved(op, scope, skip=frozenset({"W"})) + _nbytes(out))


def _lookup_grad(op: Op, scope: Scope, flops: float) -> Work:
    """`lookup_table_grad`: the table itself is not read, only the rows' gradients."""
    return Work(out_elements(op, scope), _moved(op, scope, skip=frozenset({"W"})))


def _nce(op: Op, scope: Scope, flops: float) -> Work:
    """`nce` and its grad: `flops` per element of Input's rows times the sample labels (a dot
    product per sample; its grad two more); only the sampled rows of Weight are read."""
    x = _shape(_first(op, scope, "Input"))
    samples = _in_or_out(op, scope, "SampleLabels")
    if x is None or _shape(samples) is None:
        return _generic(op, scope)
    elements = _elements(samples) * math.prod(x[1:])
    w = _first(op, scope, "Weight")
    rows = elements * (w.dtype.itemsize if isinstance(w, _VALUES) else 4)
    return Work(flops * elements, _moved(op, scope, skip=frozenset({"Weight"})) + rows)


def _sum(op: Op, scope: Scope, flops: float) -> Work:
    adds = max(len(_values(scope, op.input("X"))) - 1, 0)
    return Work(out_elements(op, scope) * adds, _moved(op, scope))


def _softmax(op: Op, scope: Scope, flops: float) -> Work:
    """Softmax and cross-entropy: `flops` per element of the largest input."""
    largest = max((_elements(v) for names in op.inputs.values() for v in _values(scope, names)),
                  default=0)
    return Work(flops * largest, _moved(op, scope))


def _reduction(op: Op, scope: Scope, flops: float) -> Work:
    """Reductions: `flops` per element of X."""
    elements = sum(_elements(v) for v in _values(scope, op.input("X")))
    return Work(flops * elements, _moved(op, scope))


def _optimizer(op: Op, scope: Scope, flops: float) -> Work:
    """The gradient read, and each parameter-shaped state (Param, moments, accumulators) read
    and written at the elements updated: `flops` per element updated, which are the rows of a
    sparse gradient for an optimizer that updates only those (`sgd`), the whole parameter
    otherwise (the other optimizers densify a sparse gradient)."""
    param, grad = _first(op, scope, "Param"), _first(op, scope, "Grad")
    update = OPS[op.type].update
    if not isinstance(param, _VALUES) or grad is None or update is None:
        return _generic(op, scope)
    sparse = update.sparse_rows and _is_rows(grad)
    updated = _elements(grad) if sparse else _elements(param)
    states = sum(1 for slot, names in op.inputs.items()
                 if slot not in update.scalar_slots and _values(scope, names))
    moved = _nbytes(grad) + 2 * states * updated * param.dtype.itemsize
    return Work(flops * updated, moved)


def _elementwise(op: Op, scope: Scope, flops: float) -> Work:
    """Elementwise ops and activations: `flops` per element of the op's outputs."""
    return Work(flops * out_elements(op, scope), _moved(op, scope))


CostRule = Callable[[Op, Scope, float], Work]

COST_RULES: dict[str, CostRule] = {
    "elementwise": _elementwise, "softmax": _softmax, "reduction": _reduction,
    "optimizer": _optimizer, "matmul": _mul, "matmul_grad": _mul_grad, "sum": _sum,
    "lookup": _lookup, "lookup_grad": _lookup_grad, "batched_matmul": _batched_matmul,
    "batched_matmul_grad": _batched_matmul_grad, "conv2d": _conv2d, "conv2d_grad": _conv2d_grad,
    "pool": _pool, "nce": _nce, "sequence_conv": _sequence_conv,
    "sequence_conv_grad": _sequence_conv_grad,
}
"""The cost rules by the names the op catalog's entries give (`transpiler.opcatalog.Cost`)."""


def _priced(op_def: OpDef, cost: Cost) -> tuple[CostRule, float]:
    if cost.rule not in COST_RULES:
        raise ValueError(f"op {op_def.type!r}: the catalog names cost rule {cost.rule!r}, "
                         f"which is not one of {sorted(COST_RULES)}")
    return COST_RULES[cost.rule], cost.flops


_RULES: dict[str, tuple[CostRule, float]] = {
    op.type: _priced(op, op.cost) for op in OPS.values() if op.cost is not None}
"""Each op type's cost rule and FLOPs per element; op types not here get `_generic`."""


def op_work(op: Op, scope: Scope) -> Work:
    """FLOPs and bytes moved by `op`, from the values its inputs and outputs hold in `scope`
    (phantoms count as the values they stand for: `shape_of`, `nbytes_of`)."""
    priced = _RULES.get(op.type)
    if priced is None:
        return _generic(op, scope)
    rule, flops = priced
    return rule(op, scope, flops)
