"""Reading the program to transpile: which ops update which parameter, and which compute the
learning rate.

The front end marks them (docs/transpiler.md §1): every optimizer, clipping and regularization op
has role Optimize and ``op_role_var = [param, grad]``; learning-rate ops have role LRSched. An
*optimizer op* is the one update op of a parameter (it has ``Param`` and ``LearningRate`` inputs);
the other Optimize ops of the parameter (clip, weight decay, Adam's beta-pow scales) travel with it
to the pserver that owns it. Global-norm clipping's ops are the exception: they read every
gradient, so they are not optimize ops here and stay on the trainer, before the sends
(docs/transpiler.md §6).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property

from ..clip import is_global_norm_clip_op
from ..ir import Op, OpRole, Program
from ..opcatalog import optimizer_types

# Update ops the pservers know how to slice: the catalog's optimizers (their accumulators are
# param-shaped or [1]).
OPTIMIZER_TYPES = frozenset(optimizer_types())
# Ops whose result depends on the whole grad (or param: LARS's norms): a param they touch is
# never sliced, because the pserver would compute them over one slice only.
WHOLE_GRAD_OPS = frozenset({"clip_by_norm", "squared_l2_norm", "lars_momentum"})


@dataclass(frozen=True)
class ParamGrad:
    param: str
    grad: str


@dataclass(frozen=True)
class OptimizeSection:
    """The optimize and learning-rate ops of the global block, in program order."""

    ops: tuple[Op, ...]
    lr_ops: tuple[Op, ...]
    params_grads: tuple[ParamGrad, ...]

    @cached_property
    def _by_param(self) -> dict[str, list[Op]]:
        by_param: dict[str, list[Op]] = defaultdict(list)
        for op in self.ops:
            if op.role_var:
                by_param[op.role_var[0]].append(op)
        return by_param

    def ops_of(self, param: str) -> list[Op]:
        """The Optimize ops of `param` (clip, decay, update, ...), in program order."""
        return list(self._by_param.get(param, ()))

    def optimizer_op(self, param: str) -> Op:
        return next(op for op in self._by_param[param] if is_optimizer_op(op))

    def whole_params(self) -> set[str]:
        """Params that must stay in one block (see `WHOLE_GRAD_OPS`)."""
        return {op.role_var[0] for op in self.ops if op.type in WHOLE_GRAD_OPS and op.role_var}


def is_optimizer_op(op: Op) -> bool:
    return "Param" in op.inputs and "LearningRate" in op.inputs


def is_lr_op(op: Op) -> bool:
    return bool(op.role & OpRole.LRSched)


def is_optimize_op(op: Op) -> bool:
    """An op a pserver runs for its parameter: role Optimize, not LR, not global-norm clipping
    (which the trainer keeps)."""
    return bool(op.role & OpRole.Optimize) and not is_lr_op(op) and not is_global_norm_clip_op(op)


def read_optimize_section(program: Program) -> OptimizeSection:
    """Find the optimize and LR ops; raise ValueError when there is nothing to distribute or an
    update op is one the pservers cannot run."""
    block = program.global_block()
    ops = tuple(op for op in block.ops if is_optimize_op(op))
    updates = [op for op in ops if is_optimizer_op(op)]
    if not updates:
        raise ValueError("program: it has no optimizer ops; call optimizer.minimize(loss) "
                         "before transpiling")
    params_grads: list[ParamGrad] = []
    seen: set[str] = set()
    for op in updates:
        if op.type not in OPTIMIZER_TYPES:
            raise ValueError(f"program: optimizer op {op.type!r} is not supported for distributed "
                             f"training (one of {sorted(OPTIMIZER_TYPES)})")
        pair = ParamGrad(op.input("Param")[0], op.input("Grad")[0])
        if pair.param in seen:
            raise ValueError(f"program: parameter {pair.param!r} has more than one optimizer op")
        seen.add(pair.param)
        params_grads.append(pair)
    lr_ops = tuple(op for op in block.ops if is_lr_op(op))
    return OptimizeSection(ops, lr_ops, tuple(params_grads))


def check_placeable(section: OptimizeSection) -> None:
    """Every Optimize op must name its parameter, or no pserver can own it."""
    for op in section.ops:
        if not op.role_var:
            raise ValueError(f"program: optimize op {op.type!r} (outputs {op.output_arg_names}) "
                             "belongs to no parameter (no op_role_var), so no pserver can run it")
