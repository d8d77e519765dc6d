"""Every optimizer kernel, bit for bit: its outputs over a few steps equal those recorded in
tests/execution/data/optim_golden.json, for each backend (numpy, torch), each kind of grad (dense, a
SelectedRows densified, a SelectedRows under `lazy_mode`) and each dtype (float32, float64, and
float32 state with a float64 learning rate and beta powers, where numpy and torch promote).

Each run updates its param and accumulators in place, as a program does (each output is its
input's var), for `STEPS` steps, so the accumulators evolve and the in-place paths run; the
beta powers are scaled between steps as Paddle's optimizer does. A run's values (every state
var after every step: dtype, shape and bytes) are hashed; the file maps each run to its hash.

DESIGN: a hash of exact bytes, not a tolerance: the kernels' results depend on each formula's
order of operations, and a change that keeps the rules but moves a rounding must show here (the
param starts small beside its steps, so that a step's last bits reach it). Only what rounds
alike on every x86-64 CPU is recorded: elementwise arithmetic and square roots (IEEE's, on any
vector path); LARS's norms and torch's fused sgd only on vars too narrow for a vector path
(`NARROW`); ftrl's general power with ``lr_power=-1`` (``n ** 1.0``, exact in any libm). Regenerate
the file (``PYTHONPATH=. python tests/execution/test_optim_rules.py --write``) only for a change
meant to move results, and say so.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from runtime import Scope, SelectedRows
from transpiler.ir import Op
from transpiler.opcatalog import op_def, optimizer_types

GOLDEN = Path(__file__).parent / "data" / "optim_golden.json"
STEPS = 4
HEIGHT = 3
NARROW = frozenset({"lars_momentum", "sgd"})
"""Optimizers whose vars here are one column wide (3 elements), so that torch adds LARS's norms
in one order and computes sgd's fused multiply-add elementwise, whatever the CPU's vector
width; the others' vars are `WIDE` columns wide (elementwise ops round alike on any path)."""
WIDE = 8
ROWS = [2, 0, 2]  # a repeated row, and row 1 untouched

CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "sgd": ("sgd", {}),
    "momentum": ("momentum", {"mu": 0.9}),
    "momentum-nesterov": ("momentum", {"mu": 0.8, "use_nesterov": True}),
    "lars_momentum": ("lars_momentum", {"mu": 0.9, "lars_coeff": 0.01,
                                        "lars_weight_decay": 0.0005}),
    "adam": ("adam", {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
    "adagrad": ("adagrad", {"epsilon": 1e-6}),
    "decayed_adagrad": ("decayed_adagrad", {"decay": 0.9, "epsilon": 1e-6}),
    "adamax": ("adamax", {"beta1": 0.9, "beta2": 0.999, "epsilon": 1e-8}),
    "rmsprop": ("rmsprop", {"decay": 0.9, "epsilon": 1e-6}),
    "rmsprop-momentum": ("rmsprop", {"decay": 0.9, "epsilon": 1e-6, "momentum": 0.5}),
    "rmsprop-centered": ("rmsprop", {"decay": 0.9, "epsilon": 1e-6, "momentum": 0.5,
                                     "centered": True}),
    "ftrl": ("ftrl", {"l1": 0.01, "l2": 0.1}),
    "ftrl-power": ("ftrl", {"l1": 0.01, "l2": 0.1, "lr_power": -1.0}),
}
GRADS = ("dense", "rows", "rows-lazy")
DTYPES = {"float32": ("float32", "float32"), "float64": ("float64", "float64"),
          "mixed": ("float32", "float64")}
"""Name -> (the dtype of param, grad and state; of the learning rate and beta powers)."""
BACKENDS = ("numpy", "torch")


def _op(op_type: str, attrs: dict[str, Any], lazy: bool) -> Op:
    """The op with every catalog slot bound to a var of the slot's name, outputs in place."""
    update = op_def(op_type).update
    assert update is not None
    outputs = {"ParamOut": ["Param"]} | {s.out: [s.slot] for s in update.state if s.out}
    inputs = {slot: [slot] for slot in op_def(op_type).inputs}
    return Op(op_type, inputs, outputs, attrs | ({"lazy_mode": True} if lazy else {}))


def _width(op_type: str) -> int:
    return 1 if op_type in NARROW else WIDE


def _grad(rng: np.random.Generator, kind: str, width: int, dtype: str) -> Any:
    if kind == "dense":
        return rng.standard_normal((HEIGHT, width)).astype(dtype)
    return SelectedRows(ROWS, rng.standard_normal((len(ROWS), width)).astype(dtype), HEIGHT)


def _scope(op_type: str, rng: np.random.Generator, dtype: str, scalar_dtype: str) -> Scope:
    update = op_def(op_type).update
    assert update is not None
    scope, shape = Scope(), (HEIGHT, _width(op_type))
    # a param small beside its step keeps the step's last bits in the result
    scope.put("Param", (0.01 * rng.standard_normal(shape)).astype(dtype))
    scope.put("LearningRate", np.array([0.1], scalar_dtype))
    for state in update.state:
        if state.param_shaped:  # a mean grad below the mean square's root keeps rmsprop real
            low, high = (-0.3, 0.3) if state.slot == "MeanGrad" else (0.1, 1.0)
            scope.put(state.slot, rng.uniform(low, high, shape).astype(dtype))
        else:  # Beta1Pow, Beta2Pow: their beta's first power
            scope.put(state.slot, np.array([0.9 if state.slot == "Beta1Pow" else 0.999],
                                           scalar_dtype))
    return scope


def _kernel(op_type: str, backend: str) -> Any:
    if backend == "torch":
        pytest.importorskip("torch")
    from runtime.execution.executor import device_binder
    from runtime.execution.kernels import get_kernel
    return device_binder(backend, "cpu")(get_kernel(op_type, backend))


def run_digest(backend: str, case: str, grad: str, dtype_name: str) -> str:
    """The hash of every state var after every step of one run (see the module docstring)."""
    from runtime.execution.kernels import KernelContext
    op_type, attrs = CASES[case]
    dtype, scalar_dtype = DTYPES[dtype_name]
    rng = np.random.default_rng(zlib.crc32(f"{case}/{grad}/{dtype_name}".encode()))
    scope = _scope(op_type, rng, dtype, scalar_dtype)
    op, kernel = _op(op_type, attrs, grad == "rows-lazy"), _kernel(op_type, backend)
    digest = hashlib.sha256()
    for _ in range(STEPS):
        scope.put("Grad", _grad(rng, grad, _width(op_type), dtype))
        kernel(KernelContext(op, scope, "", None))
        for name in sorted({names[0] for names in op.outputs.values()}):
            value = np.array(scope.get(name))
            assert np.isfinite(value).all(), f"{case} {grad} {dtype_name}: {name} = {value}"
            digest.update(f"{name} {value.dtype.str} {value.shape}".encode())
            digest.update(value.tobytes())
        for slot, beta in (("Beta1Pow", "beta1"), ("Beta2Pow", "beta2")):
            if slot in op.inputs:
                power = np.array(scope.get(slot))
                scope.put(slot, power * power.dtype.type(attrs[beta]))
    return digest.hexdigest()[:32]


def run_keys() -> list[str]:
    return [f"{b}/{c}/{g}/{d}" for b in BACKENDS for c in CASES for g in GRADS for d in DTYPES]


def test_every_optimizer_is_covered() -> None:
    from runtime.execution.kernels.optim_rules import RULES
    assert {op_type for op_type, _ in CASES.values()} == set(optimizer_types(runs="kernel"))
    assert set(RULES) == set(optimizer_types(runs="kernel"))
    assert set(json.loads(GOLDEN.read_text())) == set(run_keys())


@pytest.mark.parametrize("backend", BACKENDS)
def test_optimizer_results_are_bit_identical_to_the_recorded_ones(backend: str) -> None:
    golden = json.loads(GOLDEN.read_text())
    keys = [k for k in run_keys() if k.startswith(backend + "/")]
    moved = [k for k in keys if run_digest(*k.split("/")) != golden[k]]
    assert not moved, f"{len(moved)} of {len(keys)} runs changed results: {moved}"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(f"usage: PYTHONPATH=. {sys.argv[0]} --write  (records the current results)")
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps({k: run_digest(*k.split("/")) for k in run_keys()}, indent=0)
                      + "\n")
