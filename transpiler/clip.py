"""Gradient clipping as ops in the ``@CLIP`` name scope, passed to an optimizer as `grad_clip=`.

By value: ``clip(g, -max, max)``; by norm: ``clip_by_norm(g, clip_norm)``; by global norm:
``squared_l2_norm`` of every grad, `sum`, `sqrt`, then each grad times
``clip_norm / max(global_norm, clip_norm)``. Clipping rewrites each grad in place, so later ops
(regularization, the optimizer) and the distribute transpiler keep the grad's name.

Which gradients, as in fluid: every dense one whose parameter passes the clip's `need_clip`
(a function of the parameter; None passes all) and was not created with
``ParamAttr(need_clip=False)``. Without an optimizer `grad_clip`, a parameter created with
``ParamAttr(gradient_clip=c)`` (fluid 1.x) has its gradient clipped by `c` (`per_param_clips`).

DESIGN: the global-norm ops sit in the name scope ``/@CLIP/global_norm/`` (`GLOBAL_NORM_SCOPE`).
They read every gradient at once, so no pserver, which holds some of them, can run them; the
distribute transpiler keeps them on the trainer before the sends, as the original did
(docs/transpiler.md §6), and finds them by this scope (`is_global_norm_clip_op`). Clipping by
value or by norm touches one gradient and runs on the pserver after the trainers' copies are
merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

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


NeedClip = Callable[[Var], bool]
"""fluid's ``need_clip``: whether a parameter's gradient is clipped."""


def _dense(params_grads: list[tuple[Var, Var]],
           need_clip: NeedClip | None = None) -> list[tuple[Var, Var]]:
    """The pairs to clip: dense gradients of parameters that want clipping."""
    return [(p, g) for p, g in params_grads if g.type is not VarType.SELECTED_ROWS
            and p.need_clip and (need_clip is None or need_clip(p))]


def per_param_clips(params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
    """Apply each parameter's own ``gradient_clip`` (fluid 1.x's ``ParamAttr(gradient_clip=)``)
    to its gradient; parameters sharing one clip object are clipped together (one global norm
    for a `GradientClipByGlobalNorm`), in the order of their first parameter."""
    groups: dict[int, tuple[BaseGradientClipAttr, list[tuple[Var, Var]]]] = {}
    for param, grad in params_grads:
        clip = param.gradient_clip
        if clip is None:
            continue
        if not isinstance(clip, BaseGradientClipAttr):
            raise TypeError(f"parameter {param.name!r}: gradient_clip must be a GradientClip*, "
                            f"got {clip!r}")
        groups.setdefault(id(clip), (clip, []))[1].append((param, grad))
    for clip, pairs in groups.values():
        clip.apply(pairs)
    return params_grads


@dataclass
class GradientClipByValue(BaseGradientClipAttr):
    max: float
    min: float | None = None
    need_clip: NeedClip | None = None

    def __post_init__(self) -> None:
        if self.low > self.max:
            raise ValueError(f"GradientClipByValue: min {self.low} is greater than max {self.max}")

    @property
    def low(self) -> float:
        return -self.max if self.min is None else self.min

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        with name_scope(CLIP_SCOPE):
            for param, grad in _dense(params_grads, self.need_clip):
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    append_op("clip", {"X": [grad]}, {"Out": [grad]},
                              {"min": float(self.low), "max": float(self.max)})
        return params_grads


@dataclass
class GradientClipByNorm(BaseGradientClipAttr):
    clip_norm: float
    need_clip: NeedClip | None = None

    def __post_init__(self) -> None:
        if self.clip_norm <= 0:
            raise ValueError(f"GradientClipByNorm: clip_norm must be positive, got {self.clip_norm}")

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        with name_scope(CLIP_SCOPE):
            for param, grad in _dense(params_grads, self.need_clip):
                with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                    append_op("clip_by_norm", {"X": [grad]}, {"Out": [grad]},
                              {"max_norm": float(self.clip_norm)})
        return params_grads


@dataclass
class GradientClipByGlobalNorm(BaseGradientClipAttr):
    clip_norm: float
    group_name: str = "default_group"
    need_clip: NeedClip | None = None

    def __post_init__(self) -> None:
        if self.clip_norm <= 0:
            raise ValueError(f"GradientClipByGlobalNorm: clip_norm must be positive, got {self.clip_norm}")

    def apply(self, params_grads: list[tuple[Var, Var]]) -> list[tuple[Var, Var]]:
        pairs = _dense(params_grads, self.need_clip)
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
