"""Weight decay as ops: L2Decay(c) adds c*param to the grad, L1Decay(c) adds c*sign(param).

The regularizers themselves (`L2Decay`, `L1Decay`: a kind and a coefficient) are IR data, defined
in `transpiler.ir` because a parameter carries and serializes one; this module names them as
Paddle's `regularizer` module does and turns them into ops.

`append_regularization_ops` runs after clipping: for each (param, grad) the param's own
regularizer (from its `ParamAttr`) wins over the optimizer's `regularization=`. The decay term is
`scale(param, c)` (L1: `sign` first) added into the grad in place with `sum`, inside an
`op_role_guard(Optimize, [param, grad])` so the transpiler moves it to the param's pserver.
"""

from __future__ import annotations

from collections.abc import Callable

from .framework import append_op, create_tmp_var, op_role_guard
from .ir import (L1Decay, L2Decay, OpRole, Var, VarType, WeightDecayRegularizer,
                 regularizer_from_dict)

__all__ = ["L1Decay", "L1DecayRegularizer", "L2Decay", "L2DecayRegularizer",
           "WeightDecayRegularizer", "append_regularization_ops", "decay_term",
           "regularizer_from_dict"]

L2DecayRegularizer = L2Decay
L1DecayRegularizer = L1Decay


def _scaled(param: Var, source: Var, coeff: float) -> Var:
    """`coeff * source` as a new tmp var beside `param`."""
    out = create_tmp_var(param.name + "@REG", param.shape, param.dtype, block=param.block)
    append_op("scale", {"X": [source]}, {"Out": [out]},
              {"scale": float(coeff), "bias": 0.0, "bias_after_scale": True})
    return out


def _l2_term(param: Var, coeff: float) -> Var:
    return _scaled(param, param, coeff)


def _l1_term(param: Var, coeff: float) -> Var:
    sign = create_tmp_var(param.name + "@SIGN", param.shape, param.dtype, block=param.block)
    append_op("sign", {"X": [param]}, {"Out": [sign]})
    return _scaled(param, sign, coeff)


_DECAY_TERMS: dict[str, Callable[[Var, float], Var]] = {"l2": _l2_term, "l1": _l1_term}


def decay_term(regularizer: WeightDecayRegularizer, param: Var) -> Var:
    """Append the ops computing `regularizer`'s decay term for `param`; the term's var."""
    term = _DECAY_TERMS.get(regularizer.kind)
    if term is None:
        raise ValueError(f"parameter {param.name!r}: no decay ops for regularizer "
                         f"{regularizer!r}; one of {sorted(_DECAY_TERMS)}")
    return term(param, regularizer.regularization_coeff)


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
            term = decay_term(reg, param)
            append_op("sum", {"X": [grad, term]}, {"Out": [grad]})
    return params_grads
