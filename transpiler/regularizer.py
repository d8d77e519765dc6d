"""Weight decay as ops: L2Decay(c) adds c*param to the grad, L1Decay(c) adds c*sign(param).

`append_regularization_ops` runs after clipping: for each (param, grad) the param's own
regularizer (from its `ParamAttr`) wins over the optimizer's `regularization=`. The decay term is
`scale(param, c)` (L1: `sign` first) added into the grad in place with `sum`, inside an
`op_role_guard(Optimize, [param, grad])` so the transpiler moves it to the param's pserver.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .framework import append_op, create_tmp_var, op_role_guard
from .ir import OpRole, Var, VarType


@dataclass(frozen=True)
class WeightDecayRegularizer:
    regularization_coeff: float = 0.0

    kind = ""

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.kind, "coeff": self.regularization_coeff}

    def decay_term(self, param: Var) -> Var:
        raise NotImplementedError


@dataclass(frozen=True)
class L2Decay(WeightDecayRegularizer):
    kind = "l2"

    def decay_term(self, param: Var) -> Var:
        out = create_tmp_var(param.name + "@REG", param.shape, param.dtype, block=param.block)
        append_op("scale", {"X": [param]}, {"Out": [out]},
                  {"scale": float(self.regularization_coeff), "bias": 0.0, "bias_after_scale": True})
        return out


@dataclass(frozen=True)
class L1Decay(WeightDecayRegularizer):
    kind = "l1"

    def decay_term(self, param: Var) -> Var:
        sign = create_tmp_var(param.name + "@SIGN", param.shape, param.dtype, block=param.block)
        append_op("sign", {"X": [param]}, {"Out": [sign]})
        out = create_tmp_var(param.name + "@REG", param.shape, param.dtype, block=param.block)
        append_op("scale", {"X": [sign]}, {"Out": [out]},
                  {"scale": float(self.regularization_coeff), "bias": 0.0, "bias_after_scale": True})
        return out


L2DecayRegularizer = L2Decay
L1DecayRegularizer = L1Decay


def regularizer_from_dict(d: dict[str, Any]) -> WeightDecayRegularizer:
    kinds = {"l2": L2Decay, "l1": L1Decay}
    if d.get("type") not in kinds:
        raise ValueError(f"unknown regularizer type {d.get('type')!r}; one of {sorted(kinds)}")
    return kinds[d["type"]](float(d["coeff"]))


def append_regularization_ops(params_grads: list[tuple[Var, Var]],
                              regularization: WeightDecayRegularizer | None = None
                              ) -> list[tuple[Var, Var]]:
    for param, grad in params_grads:
        reg = param.regularizer or regularization
        if reg is None:
            continue
        if grad.type is VarType.SELECTED_ROWS:
            # Decaying every row on each sparse step would densify the update; Paddle skips it too.
            continue
        with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
            term = reg.decay_term(param)
            append_op("sum", {"X": [grad, term]}, {"Out": [grad]})
    return params_grads
