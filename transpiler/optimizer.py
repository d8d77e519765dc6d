"""Optimizers: `minimize(loss)` = backward + clipping + regularization + one update op per
parameter, in parameter-name order.

Each update op runs under `op_role_guard(Optimize, [param, grad])`, so the distribute transpiler
can find it (and the clip/regularization ops of the same param) and move it to the pserver that
owns the param. Accumulators are persistable vars named like Paddle's (`moment1_0`,
`velocity_1`, ...), zero-filled by the startup program unless stated otherwise; a float learning
rate becomes the persistable var `learning_rate_N`. Each update op's accumulators (their slots,
var names and shapes) are its entry's in the op catalog (`transpiler.opcatalog`); an optimizer
class adds its attributes and the accumulators' fill values.
"""

from __future__ import annotations

from typing import Any

from .backward import append_backward
from .clip import BaseGradientClipAttr, per_param_clips
from .framework import (append_op, create_global_var, default_startup_program, op_role_guard,
                        program_guard, unique_name)
from .ir import Op, OpRole, Program, Var
from .opcatalog import OPS, State
from .regularizer import WeightDecayRegularizer, append_regularization_ops

ParamsGrads = list[tuple[Var, Var]]


class Optimizer:
    type = ""
    """The update op's type; its slots and accumulators are the op catalog's."""

    def __init__(self, learning_rate: float | Var, regularization: WeightDecayRegularizer | None = None,
                 grad_clip: BaseGradientClipAttr | None = None, name: str | None = None) -> None:
        if isinstance(learning_rate, (int, float)):
            if learning_rate <= 0:
                raise ValueError(f"{type(self).__name__}: learning_rate must be positive, got {learning_rate}")
        elif not isinstance(learning_rate, Var):
            raise TypeError(f"{type(self).__name__}: learning_rate must be a float or a Var, "
                            f"got {type(learning_rate).__name__}")
        self._learning_rate = learning_rate
        self.regularization = regularization
        self.grad_clip = grad_clip
        self._lr_var: Var | None = None
        self._acc: dict[tuple[str, str], Var] = {}

    # -- public ---------------------------------------------------------------------------------
    def minimize(self, loss: Var, startup_program: Program | None = None,
                 parameter_list: list[str] | None = None,
                 no_grad_set: set[str] | None = None,
                 grad_clip: BaseGradientClipAttr | None = None) -> tuple[list[Op], ParamsGrads]:
        """Backward, clipping, regularization, updates. `grad_clip` (fluid's keyword of
        `minimize`) clips this call's gradients in place of the constructor's; with neither,
        each parameter's own ``ParamAttr(gradient_clip=)`` applies."""
        if loss.block is None:
            raise ValueError(f"minimize: loss {loss.name!r} is not declared in a program")
        if grad_clip is not None and not isinstance(grad_clip, BaseGradientClipAttr):
            raise TypeError(f"minimize: grad_clip must be a GradientClip*, got {grad_clip!r}")
        clip = grad_clip if grad_clip is not None else self.grad_clip
        with program_guard(loss.block.program, startup_program or default_startup_program()):
            params_grads = append_backward(loss, parameter_list, no_grad_set)
            if clip is not None:
                params_grads = clip.apply(params_grads)
            else:
                params_grads = per_param_clips(params_grads)
            params_grads = append_regularization_ops(params_grads, self.regularization)
            ops = self.apply_gradients(params_grads)
        return ops, params_grads

    def apply_gradients(self, params_grads: ParamsGrads) -> list[Op]:
        # Learning-rate and accumulator vars belong to one program: a reused optimizer object
        # declares fresh ones in the program it is now minimizing.
        self._lr_var, self._acc = None, {}
        self._create_learning_rate()
        trainable = [(p, g) for p, g in params_grads if p.trainable]
        for param, _ in trainable:
            for state in self.state():
                self._add_accumulator(state.name, param, self._fill_value(state.name, 0.0),
                                      state.param_shaped)
        ops = []
        for param, grad in trainable:
            with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                ops.append(self._append_optimize_op(param, grad))
        for param, grad in trainable:
            with op_role_guard(OpRole.Optimize, [param.name, grad.name]):
                self._finish_update(param)
        return ops

    # -- helpers for subclasses -----------------------------------------------------------------
    def _fill_value(self, acc_name: str, default: float) -> float:
        return default

    def _create_learning_rate(self) -> None:
        if isinstance(self._learning_rate, Var):
            self._lr_var = self._learning_rate
        else:
            self._lr_var = create_global_var(unique_name.generate("learning_rate"), [1],
                                             float(self._learning_rate), "float32")

    def _param_lr(self, param: Var) -> Var:
        assert self._lr_var is not None
        factor = float(param.optimize_attr.get("learning_rate", 1.0))
        if factor == 1.0:
            return self._lr_var
        block = param.block
        assert block is not None
        out = block.create_var(unique_name.generate(param.name + "_lr"), shape=(1,), dtype="float32")
        append_op("scale", {"X": [self._lr_var]}, {"Out": [out]},
                  {"scale": factor, "bias": 0.0, "bias_after_scale": True})
        return out

    def _add_accumulator(self, name: str, param: Var, value: float, param_shaped: bool) -> None:
        shape = list(param.shape) if param_shaped else [1]
        self._acc[(name, param.name)] = create_global_var(unique_name.generate(name), shape, value,
                                                          param.dtype)

    def _get_accumulator(self, name: str, param: Var) -> Var:
        return self._acc[(name, param.name)]

    def _append_optimize_op(self, param: Var, grad: Var) -> Op:
        slots = {"Param": [param], "Grad": [grad], "LearningRate": [self._param_lr(param)]}
        outs = {"ParamOut": [param]}
        for state in self.state():
            acc = self._get_accumulator(state.name, param)
            slots[state.slot] = [acc]
            if state.out:
                outs[state.out] = [acc]
        return append_op(self.type, slots, outs, self.attrs())

    @classmethod
    def state(cls) -> tuple[State, ...]:
        """The update op's accumulators, in slot order (`transpiler.opcatalog`)."""
        update = OPS[cls.type].update
        if update is None:
            raise ValueError(f"{cls.__name__}: op {cls.type!r} is no optimizer in the op catalog")
        return update.state

    def attrs(self) -> dict[str, Any]:
        return {}

    def _finish_update(self, param: Var) -> None:
        return None

    def _scale_pow(self, acc_name: str, param: Var, beta: float) -> None:
        acc = self._get_accumulator(acc_name, param)
        append_op("scale", {"X": [acc]}, {"Out": [acc]},
                  {"scale": float(beta), "bias": 0.0, "bias_after_scale": True})


def _check_range(owner: str, name: str, value: float, low: float, high: float) -> None:
    if not low <= value < high:
        raise ValueError(f"{owner}: {name} must be in [{low}, {high}), got {value}")


class SGD(Optimizer):
    type = "sgd"


class Momentum(Optimizer):
    type = "momentum"

    def __init__(self, learning_rate: float | Var, momentum: float = 0.9, use_nesterov: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("Momentum", "momentum", momentum, 0.0, 1.0)
        self.momentum, self.use_nesterov = float(momentum), bool(use_nesterov)

    def attrs(self) -> dict[str, Any]:
        return {"mu": self.momentum, "use_nesterov": self.use_nesterov}


class Adam(Optimizer):
    type = "adam"

    def __init__(self, learning_rate: float | Var = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, lazy_mode: bool = False, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("Adam", "beta1", beta1, 0.0, 1.0)
        _check_range("Adam", "beta2", beta2, 0.0, 1.0)
        self.beta1, self.beta2, self.epsilon, self.lazy_mode = beta1, beta2, epsilon, lazy_mode

    def _fill_value(self, acc_name: str, default: float) -> float:
        return {"beta1_pow_acc": self.beta1, "beta2_pow_acc": self.beta2}.get(acc_name, default)

    def attrs(self) -> dict[str, Any]:
        return {"beta1": float(self.beta1), "beta2": float(self.beta2),
                "epsilon": float(self.epsilon), "lazy_mode": self.lazy_mode}

    def _finish_update(self, param: Var) -> None:
        self._scale_pow("beta1_pow_acc", param, self.beta1)
        self._scale_pow("beta2_pow_acc", param, self.beta2)


class Adagrad(Optimizer):
    type = "adagrad"

    def __init__(self, learning_rate: float | Var, epsilon: float = 1e-6,
                 initial_accumulator_value: float = 0.0, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        self.epsilon, self.initial_accumulator_value = epsilon, initial_accumulator_value

    def _fill_value(self, acc_name: str, default: float) -> float:
        return float(self.initial_accumulator_value)

    def attrs(self) -> dict[str, Any]:
        return {"epsilon": float(self.epsilon)}


class DecayedAdagrad(Optimizer):
    type = "decayed_adagrad"

    def __init__(self, learning_rate: float | Var, decay: float = 0.95, epsilon: float = 1e-6,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("DecayedAdagrad", "decay", decay, 0.0, 1.0)
        self.decay, self.epsilon = decay, epsilon

    def attrs(self) -> dict[str, Any]:
        return {"decay": float(self.decay), "epsilon": float(self.epsilon)}


class Adamax(Optimizer):
    type = "adamax"

    def __init__(self, learning_rate: float | Var = 0.001, beta1: float = 0.9, beta2: float = 0.999,
                 epsilon: float = 1e-8, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("Adamax", "beta1", beta1, 0.0, 1.0)
        _check_range("Adamax", "beta2", beta2, 0.0, 1.0)
        self.beta1, self.beta2, self.epsilon = beta1, beta2, epsilon

    def _fill_value(self, acc_name: str, default: float) -> float:
        return self.beta1 if acc_name == "beta1_pow_acc" else default

    def attrs(self) -> dict[str, Any]:
        return {"beta1": float(self.beta1), "beta2": float(self.beta2), "epsilon": float(self.epsilon)}

    def _finish_update(self, param: Var) -> None:
        self._scale_pow("beta1_pow_acc", param, self.beta1)


class RMSProp(Optimizer):
    type = "rmsprop"

    def __init__(self, learning_rate: float | Var, rho: float = 0.95, epsilon: float = 1e-6,
                 momentum: float = 0.0, centered: bool = False, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("RMSProp", "rho", rho, 0.0, 1.0)
        _check_range("RMSProp", "momentum", momentum, 0.0, 1.0)
        self.rho, self.epsilon, self.momentum, self.centered = rho, epsilon, momentum, centered

    def attrs(self) -> dict[str, Any]:
        return {"decay": float(self.rho), "epsilon": float(self.epsilon),
                "momentum": float(self.momentum), "centered": self.centered}


class Ftrl(Optimizer):
    type = "ftrl"

    def __init__(self, learning_rate: float | Var, l1: float = 0.0, l2: float = 0.0,
                 lr_power: float = -0.5, **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        if l1 < 0 or l2 < 0:
            raise ValueError(f"Ftrl: l1 and l2 must be non-negative, got l1={l1}, l2={l2}")
        self.l1, self.l2, self.lr_power = l1, l2, lr_power

    def attrs(self) -> dict[str, Any]:
        return {"l1": float(self.l1), "l2": float(self.l2), "lr_power": float(self.lr_power)}


class LarsMomentum(Optimizer):
    """Momentum with LARS's layer-wise rate (docs/transpiler.md §2)."""

    type = "lars_momentum"

    def __init__(self, learning_rate: float | Var, momentum: float = 0.9,
                 lars_coeff: float = 0.001, lars_weight_decay: float = 0.0005,
                 **kwargs: Any) -> None:
        super().__init__(learning_rate, **kwargs)
        _check_range("LarsMomentum", "momentum", momentum, 0.0, 1.0)
        if lars_coeff <= 0 or lars_weight_decay < 0:
            raise ValueError(f"LarsMomentum: lars_coeff must be positive and lars_weight_decay "
                             f"non-negative, got {lars_coeff} and {lars_weight_decay}")
        self.momentum, self.lars_coeff = float(momentum), float(lars_coeff)
        self.lars_weight_decay = float(lars_weight_decay)

    def attrs(self) -> dict[str, Any]:
        return {"mu": self.momentum, "lars_coeff": self.lars_coeff,
                "lars_weight_decay": self.lars_weight_decay}


SGDOptimizer = SGD
MomentumOptimizer = Momentum
AdamOptimizer = Adam
AdagradOptimizer = Adagrad
DecayedAdagradOptimizer = DecayedAdagrad
AdamaxOptimizer = Adamax
RMSPropOptimizer = RMSProp
FtrlOptimizer = Ftrl
LarsMomentumOptimizer = LarsMomentum

OPTIMIZERS: dict[str, type[Optimizer]] = {cls.type: cls for cls in Optimizer.__subclasses__()}
"""Every optimizer by its op type (tests/transpiler/test_opcatalog.py: the catalog's optimizers that run)."""
