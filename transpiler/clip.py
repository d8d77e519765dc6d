"""Gradient clipping as ops in the ``@CLIP`` name scope, passed to an optimizer as `grad_clip=`.

By value: ``clip(g, -max, max)``; by norm: ``clip_by_norm(g, clip_norm)``; by global norm:
``squared_l2_norm`` of every grad, `sum`, `sqrt`, then each grad times
``clip_norm / max(global_norm, clip_norm)``. Clipping rewrites each grad in place, so later ops
(regularization, the optimizer) and the distribute transpiler keep the grad's name.

DESIGN: the global-norm ops sit in the name scope ``/@CLIP/global_norm/`` (`GLOBAL_NORM_SCOPE`).
They read every gradient at once, so no pserver, which holds some of them, can run them; the
distribute transpiler keeps them on the trainer before the sends, as the original did
(docs/transpiler.md §6), and finds them by this scope (`is_global_norm_clip_op`). Clipping by
value or by norm touches one gradient and runs on the pserver after the trainers' copies are
merged.
"""

from __future__ import annotations

from dataclasses import dataclass

from .framework import append_op, create_tmp_var, name_scope, op_role_guard
from .ir import Op, OpRole, Var, VarType

CLIP_SCOPE = "@CLIP"
GLOBAL_NORM_SCOPE = f"/{CLIP_SCOPE}/global_norm/"


def is_global_norm_clip_op(op: Op) -> bool:
    """Whether `op` is one of `GradientClipByGlobalNorm`'s ops (which need every gradient)."""
    return str(op.attrs.get("op_namescope", "")).startswith(GLOBAL_NORM_SCOPE)


class BaseGradientClipAttr:
    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        raise NotImplementedError


def _dense(params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
    return [(p, g) for p, g in params_grads if g.type is not VarType.SELECTED_ROWS]


@dataclass
class GradientClipByValue(BaseGradientClipAttr):
    max: float
    min: float | None = None

    def __post_init__(self) -> None:
        if self.low > self.max:
            raise ValueError(f"GradientClipByValue: min {self.low} is greater than max {self.max}")

    @property
    def low(self) -> float:
        return -self.max if self.min is None else self.min

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        with name_scope(CLIP_SCOPE):
            for param, grad in _dense(params_grads):
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    append_op("clip", {"X": [grad]}, {"Out": [grad]},
                              {"min": float(self.low), "max": float(self.max)})
        return params_grads


@dataclass
class GradientClipByNorm(BaseGradientClipAttr):
    clip_norm: float

    def __post_init__(self) -> None:
        if self.clip_norm <= 0:
            raise ValueError(f"GradientClipByNorm: clip_norm must be positive, got {self.clip_norm}")

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        with name_scope(CLIP_SCOPE):
            for param, grad in _dense(params_grads):
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    append_op("clip_by_norm", {"X": [grad]}, {"Out": [grad]},
                              {"max_norm": float(self.clip_norm)})
        return params_grads


@dataclass
class GradientClipByGlobalNorm(BaseGradientClipAttr):
    clip_norm: float

    def __post_init__(self) -> None:
        if self.clip_norm <= 0:
            raise ValueError(f"GradientClipByGlobalNorm: clip_norm must be positive, got {self.clip_norm}")

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        pairs = _dense(params_grads)
        if not pairs:
            return params_grads
        block = pairs[0][1].block
        with name_scope(CLIP_SCOPE), name_scope("global_norm"):
            norms = []
            for param, grad in pairs:
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    sq = create_tmp_var(grad.name + "@SQ_NORM", (1,), grad.dtype, block=block)
                    append_op("squared_l2_norm", {"X": [grad]}, {"Out": [sq]})
                norms.append(sq)
            with op_role_guard(OpRole.Optimize):
                dtype = pairs[0][1].dtype
                total = create_tmp_var("global_norm_sq", (1,), dtype, block=block)
                append_op("sum", {"X": norms}, {"Out": [total]})
                norm = create_tmp_var("global_norm", (1,), dtype, block=block)
                append_op("sqrt", {"X": [total]}, {"Out": [norm]})
                limit = create_tmp_var("clip_norm", (1,), dtype, block=block)
                append_op("fill_constant", {}, {"Out": [limit]},
                          {"shape": [1], "dtype": dtype, "value": float(self.clip_norm)})
                denom = create_tmp_var("clip_denom", (1,), dtype, block=block)
                append_op("elementwise_max", {"X": [norm], "Y": [limit]}, {"Out": [denom]}, {"axis": -1})
                factor = create_tmp_var("clip_factor", (1,), dtype, block=block)
                append_op("elementwise_div", {"X": [limit], "Y": [denom]}, {"Out": [factor]}, {"axis": -1})
            for param, grad in pairs:
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    append_op("elementwise_mul", {"X": [grad], "Y": [factor]}, {"Out": [grad]},
                              {"axis": -1})
        return params_grads


ClipByValue = GradientClipByValue
ClipByNorm = GradientClipByNorm
ClipByGlobalNorm = GradientClipByGlobalNorm
