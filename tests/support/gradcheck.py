"""Kernel test helpers: run one op's kernel on given values (`run_op`; `run_kernel` on a given
device, every output var), and check a grad kernel against central finite differences of the
forward kernel.

Input values are given per slot (one value or a list for a multi-var slot); the var of slot
``S`` at position ``i`` is named ``S{i}``. The finite-difference loss is
``sum_s sum(w_s * out_s)`` over the checked outputs with fixed random weights ``w_s``, which are
also what the grad op receives as ``<out>@GRAD``.

Both take a ``backend`` (``numpy`` or ``torch``; see `BACKENDS`): a kernel test parametrized
over `BACKENDS` checks each backend's gradients against its own forward kernel, in float64 (the
torch kernels keep the input dtype), and skips torch where it is not installed.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pytest

from runtime import LoDTensor, Scope, SelectedRows
from runtime.execution.executor import device_binder
from runtime.execution.kernels import KernelContext, get_kernel
from runtime.execution.tensor import to_dense
from transpiler.ir import Op, Program
from transpiler.opcatalog import OPS

Inputs = Mapping[str, Any]
BACKENDS = ("numpy", "torch")


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def var_names(slot: str, count: int) -> list[str]:
    return [f"{slot}{i}" for i in range(count)]


def run_in_scope(op: Op, scope: Scope, program: Program | None = None,
                 backend: str = "numpy") -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    kernel = device_binder(backend, "cpu")(get_kernel(op.type, backend))
    kernel(KernelContext(op, scope, "", program))


def run_op(op_type: str, inputs: Inputs, outputs: Mapping[str, int] | Sequence[str] = ("Out",),
           attrs: Mapping[str, Any] | None = None, program: Program | None = None,
           backend: str = "numpy") -> dict[str, Any]:
    """Run `op_type` on `inputs`; return each output slot's value (a list for several vars,
    None for a single var the kernel did not write). Arrays come back as arrays (a LoDTensor's
    data), SelectedRows as SelectedRows."""
    counts = dict(outputs) if isinstance(outputs, Mapping) else {s: 1 for s in outputs}
    scope = Scope()
    in_names = {}
    for slot, value in inputs.items():
        values = _as_list(value)
        in_names[slot] = var_names(slot, len(values))
        for name, v in zip(in_names[slot], values):
            scope.set(name, v)
    out_names = {slot: var_names(slot, n) for slot, n in counts.items()}
    run_in_scope(Op(op_type, in_names, out_names, dict(attrs or {})), scope, program, backend)
    result = {}
    for slot, names in out_names.items():
        values = [scope.get(n) for n in names if n in scope]
        result[slot] = (values[0] if values else None) if counts[slot] == 1 else values
    return result


def _perturbed(value: Any, index: tuple[int, ...], delta: float) -> Any:
    data = to_dense(value).copy()
    data[index] += delta
    return LoDTensor(data, value.lod) if isinstance(value, LoDTensor) else data


def _with(inputs: Inputs, slot: str, pos: int, value: Any) -> dict[str, Any]:
    changed = dict(inputs)
    values = _as_list(inputs[slot])
    values[pos] = value
    changed[slot] = values if isinstance(inputs[slot], list) else value
    return changed


def grad_op(op_type: str) -> str:
    """The type of `op_type`'s grad op, as the catalog names it (``T_grad`` but where the
    original named it otherwise, as `cross_entropy_grad2`)."""
    known = OPS.get(op_type)
    return (known.grad_type if known is not None else None) or op_type + "_grad"


def check_grad(op_type: str, inputs: Inputs, wrt: Iterable[str], attrs: Mapping[str, Any] | None = None,
               outputs: Sequence[str] | Mapping[str, int] = ("Out",),
               loss_outputs: Sequence[str] | None = None, eps: float = 1e-6, rtol: float = 1e-5,
               atol: float = 1e-7, seed: int = 0, backend: str = "numpy") -> None:
    """Assert that `op_type`'s grad op (`grad_op`) matches central differences of `op_type` for every input
    slot in `wrt` (all float64). `outputs`: the op's output slots, or slot -> var count for
    slots of several vars (`split`). SelectedRows gradients are compared densified. Every
    kernel run is `backend`'s."""
    attrs = dict(attrs or {})
    counts = dict(outputs) if isinstance(outputs, Mapping) else dict.fromkeys(outputs, 1)
    loss_outputs = list(loss_outputs or list(counts)[:1])
    forward = run_op(op_type, inputs, counts, attrs, backend=backend)
    rng = np.random.default_rng(seed)
    weights = {s: [rng.standard_normal(np.shape(v)) for v in _as_list(forward[s])]
               for s in loss_outputs}

    def loss(values: Inputs) -> float:
        out = run_op(op_type, values, counts, attrs, backend=backend)
        return float(sum(np.sum(w * v) for s in loss_outputs
                         for w, v in zip(weights[s], _as_list(out[s]))))

    wrt = list(wrt)
    grad_inputs: dict[str, Any] = {**inputs, **{s: v for s, v in forward.items() if v is not None}}
    grad_inputs.update({f"{s}@GRAD": w if counts[s] > 1 else w[0] for s, w in weights.items()})
    grad_outputs = {f"{s}@GRAD": len(_as_list(inputs[s])) for s in wrt}
    analytic = run_op(grad_op(op_type), grad_inputs, grad_outputs, attrs, backend=backend)

    for slot in wrt:
        for pos, value in enumerate(_as_list(inputs[slot])):
            got = _as_list(analytic[f"{slot}@GRAD"])[pos]
            got = got.to_dense() if isinstance(got, SelectedRows) else got
            data = to_dense(value)
            numeric = np.zeros(data.shape)
            for index in np.ndindex(*data.shape):
                up = loss(_with(inputs, slot, pos, _perturbed(value, index, eps)))
                down = loss(_with(inputs, slot, pos, _perturbed(value, index, -eps)))
                numeric[index] = (up - down) / (2 * eps)
            assert got.shape == data.shape, f"{slot}[{pos}]: grad shape {got.shape} != {data.shape}"
            assert got.dtype == data.dtype, f"{slot}[{pos}]: grad dtype {got.dtype} != {data.dtype}"
            np.testing.assert_allclose(got, numeric, rtol=rtol, atol=atol,
                                       err_msg=f"{backend} {op_type}: gradient of {slot}[{pos}]")


Outputs = dict[str, list[Any]]  # per slot: stored values, None where the kernel wrote none


def run_kernel(backend: str, op_type: str, inputs: Inputs, outputs: Mapping[str, int],
               attrs: Mapping[str, Any], program: Program | None = None,
               device: str = "cpu") -> Outputs:
    """Run one kernel (on `device`) on a fresh scope holding copies of `inputs` (slot -> value or
    list; var ``S{i}`` is slot S's i-th); return each output slot's stored values, None where
    unwritten."""
    scope = Scope()
    in_names = {}
    for slot, value in inputs.items():
        values = value if isinstance(value, list) else [value]
        in_names[slot] = [f"{slot}{i}" for i in range(len(values))]
        for name, v in zip(in_names[slot], values):
            scope.set(name, v)
    out_names = {slot: [f"{slot}{i}" for i in range(n)] for slot, n in outputs.items()}
    op = Op(op_type, in_names, out_names, dict(attrs))
    device_binder(backend, device)(get_kernel(op_type, backend))(KernelContext(op, scope, "", program))
    return {slot: [scope.get_tensor(n) if n in scope else None for n in names]
            for slot, names in out_names.items()}
