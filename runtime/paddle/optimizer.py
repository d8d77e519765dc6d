"""Paddle 2.x's ``paddle.optimizer`` for a static-graph script (``import runtime.paddle as
paddle``): ``SGD``, ``Momentum``, ``Adam``, ``RMSProp`` with 2.x's keywords
(``learning_rate`` a float, a var or an ``lr`` scheduler; ``weight_decay`` a float, meaning
L2Decay of that coefficient, or a regularizer; ``grad_clip`` a ``paddle.nn.ClipGrad*``), each
writing the update ops of fluid's optimizer of that name (`transpiler.optimizer`), and
``paddle.optimizer.lr``: the schedulers ``ExponentialDecay`` and ``PiecewiseDecay`` and
fluid's schedule functions kept there (``piecewise_decay``, ``exponential_decay``, ...,
`transpiler.lr`).

A 2.x scheduler is a Python object a dynamic-graph loop steps by hand; in a static program
pslab writes it as fluid's schedule ops on the program's step counter (role LRSched, which the
distribute transpiler moves to the pservers' LR block): ``ExponentialDecay(lr, gamma)`` is
``exponential_decay(lr, decay_steps=1, decay_rate=gamma, staircase=True)``, i.e. lr * gamma ^
step, advancing each step of the program; ``PiecewiseDecay(boundaries, values)`` is
``piecewise_decay``. The object still answers ``step()``, ``get_lr()`` and ``last_epoch``.

Layers: a facade on top of `transpiler`.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Sequence

from transpiler import lr as _lr
from transpiler import optimizer as _opt
from transpiler.clip import BaseGradientClipAttr
from transpiler.framework import default_startup_program, program_guard
from transpiler.ir import L2Decay, Program, Var, WeightDecayRegularizer

__all__ = ["Adam", "LRScheduler", "Momentum", "RMSProp", "SGD", "lr"]


class LRScheduler:
    """What 2.x's schedulers share: the learning rate of epoch `last_epoch` (`get_lr`),
    `step()` to the next, and `program_var()`: the schedule as ops in the current program."""

    def __init__(self, learning_rate: float = 0.1, last_epoch: int = -1,
                 verbose: bool = False) -> None:
        self.base_lr = float(learning_rate)
        self.last_epoch = int(last_epoch)
        self.verbose = verbose
        self.step()

    def step(self, epoch: int | None = None) -> None:
        """Move to `epoch` (the next one when None)."""
        self.last_epoch = self.last_epoch + 1 if epoch is None else int(epoch)
        self.last_lr = self.get_lr()

    def __call__(self) -> float:
        return self.last_lr

    def get_lr(self) -> float:
        raise NotImplementedError

    def program_var(self) -> Var:
        """The schedule as LRSched ops appended to the current main program."""
        raise NotImplementedError


class ExponentialDecay(LRScheduler):
    """lr * gamma ^ epoch; in a program, ^ the step (`exponential_decay` with one step per
    decay, staircase)."""

    def __init__(self, learning_rate: float, gamma: float, last_epoch: int = -1,
                 verbose: bool = False) -> None:
        if not 0.0 < gamma < 1.0:
            raise ValueError(f"ExponentialDecay: gamma must be in (0, 1), got {gamma}")
        self.gamma = float(gamma)
        super().__init__(learning_rate, last_epoch, verbose)

    def get_lr(self) -> float:
        return self.base_lr * self.gamma ** self.last_epoch

    def program_var(self) -> Var:
        return _lr.exponential_decay(self.base_lr, 1, self.gamma, staircase=True)


class PiecewiseDecay(LRScheduler):
    """values[i] while the epoch (in a program, the step) is below boundaries[i], then the
    last value: fluid's `piecewise_decay` ops."""

    def __init__(self, boundaries: Sequence[int], values: Sequence[float], last_epoch: int = -1,
                 verbose: bool = False) -> None:
        if len(values) != len(boundaries) + 1:
            raise ValueError(f"PiecewiseDecay: values needs {len(boundaries) + 1} entries, "
                             f"got {len(values)}")
        self.boundaries, self.values = list(boundaries), [float(v) for v in values]
        super().__init__(self.values[0], last_epoch, verbose)

    def get_lr(self) -> float:
        for boundary, value in zip(self.boundaries, self.values):
            if self.last_epoch < boundary:
                return value
        return self.values[-1]

    def program_var(self) -> Var:
        return _lr.piecewise_decay(self.boundaries, self.values)


def _lr_module() -> ModuleType:
    """``paddle.optimizer.lr``: the schedulers and fluid's schedule functions."""
    module = ModuleType(f"{__name__}.lr", "Paddle 2.x's learning-rate schedules.")
    module.__dict__.update(LRScheduler=LRScheduler, ExponentialDecay=ExponentialDecay,
                           PiecewiseDecay=PiecewiseDecay)
    for name in ("exponential_decay", "natural_exp_decay", "inverse_time_decay",
                 "polynomial_decay", "piecewise_decay", "noam_decay", "cosine_decay"):
        setattr(module, name, getattr(_lr, name))
    return module


lr = _lr_module()
sys.modules[lr.__name__] = lr  # ``import paddle.optimizer.lr``

Regularization = float | WeightDecayRegularizer | None


def _regularization(weight_decay: Regularization) -> WeightDecayRegularizer | None:
    """2.x's `weight_decay`: a float is L2Decay of that coefficient."""
    if weight_decay is None or isinstance(weight_decay, WeightDecayRegularizer):
        return weight_decay
    if isinstance(weight_decay, (int, float)):
        return L2Decay(float(weight_decay))
    raise TypeError(f"weight_decay must be a float or a regularizer, got {weight_decay!r}")


class _Paddle2(_opt.Optimizer):
    """The 2.x constructor keywords and schedulers on top of a fluid optimizer class (a
    2.x class derives from this and from fluid's class of its name, in that order)."""

    _scheduler: LRScheduler | None = None

    def _paddle2(self, learning_rate: float | Var | LRScheduler, parameters: Any,
                 weight_decay: Regularization, grad_clip: BaseGradientClipAttr | None,
                 ) -> dict[str, Any]:
        if parameters is not None:
            raise ValueError(f"{type(self).__name__}: parameters is for dynamic graphs; a "
                             "static program updates every trainable parameter")
        if isinstance(learning_rate, LRScheduler):
            self._scheduler = learning_rate
            learning_rate = learning_rate.base_lr
        return {"learning_rate": learning_rate, "regularization": _regularization(weight_decay),
                "grad_clip": grad_clip}

    def minimize(self, loss: Var, startup_program: Program | None = None,
                 parameters: list[str] | None = None, no_grad_set: set[str] | None = None,
                 grad_clip: BaseGradientClipAttr | None = None) -> Any:
        if self._scheduler is not None:
            assert loss.block is not None
            with program_guard(loss.block.program, startup_program or default_startup_program()):
                self._learning_rate = self._scheduler.program_var()
        return super().minimize(loss, startup_program, parameters, no_grad_set, grad_clip)

    def get_lr(self) -> float:
        """The learning rate now: the scheduler's, else the float given."""
        if self._scheduler is not None:
            return self._scheduler()
        rate = self._learning_rate
        if isinstance(rate, Var):
            raise TypeError("get_lr: the learning rate is a var, computed when the program runs")
        return float(rate)


class SGD(_Paddle2, _opt.SGD):
    """2.x's ``paddle.optimizer.SGD``: an `sgd` op per parameter."""

    def __init__(self, learning_rate: float | Var | LRScheduler = 0.001, parameters: Any = None,
                 weight_decay: Regularization = None,
                 grad_clip: BaseGradientClipAttr | None = None, multi_precision: bool = False,
                 name: str | None = None) -> None:
        _opt.SGD.__init__(self, **self._paddle2(learning_rate, parameters, weight_decay,
                                                grad_clip))


class Momentum(_Paddle2, _opt.Momentum):
    """2.x's ``paddle.optimizer.Momentum``: a `momentum` op per parameter."""

    def __init__(self, learning_rate: float | Var | LRScheduler = 0.001, momentum: float = 0.9,
                 parameters: Any = None, use_nesterov: bool = False,
                 weight_decay: Regularization = None,
                 grad_clip: BaseGradientClipAttr | None = None, multi_precision: bool = False,
                 rescale_grad: float = 1.0, name: str | None = None) -> None:
        _opt.Momentum.__init__(self, momentum=momentum, use_nesterov=use_nesterov,
                               **self._paddle2(learning_rate, parameters, weight_decay,
                                               grad_clip))


class Adam(_Paddle2, _opt.Adam):
    """2.x's ``paddle.optimizer.Adam``: an `adam` op per parameter, its beta powers scaled."""

    def __init__(self, learning_rate: float | Var | LRScheduler = 0.001, beta1: float = 0.9,
                 beta2: float = 0.999, epsilon: float = 1e-8, parameters: Any = None,
                 weight_decay: Regularization = None,
                 grad_clip: BaseGradientClipAttr | None = None, lazy_mode: bool = False,
                 multi_precision: bool = False, name: str | None = None) -> None:
        _opt.Adam.__init__(self, beta1=beta1, beta2=beta2, epsilon=epsilon, lazy_mode=lazy_mode,
                           **self._paddle2(learning_rate, parameters, weight_decay, grad_clip))


class RMSProp(_Paddle2, _opt.RMSProp):
    """2.x's ``paddle.optimizer.RMSProp``: an `rmsprop` op per parameter."""

    def __init__(self, learning_rate: float | Var | LRScheduler, rho: float = 0.95,
                 epsilon: float = 1e-6, momentum: float = 0.0, centered: bool = False,
                 parameters: Any = None, weight_decay: Regularization = None,
                 grad_clip: BaseGradientClipAttr | None = None, name: str | None = None) -> None:
        _opt.RMSProp.__init__(self, rho=rho, epsilon=epsilon, momentum=momentum,
                              centered=centered,
                              **self._paddle2(learning_rate, parameters, weight_decay,
                                              grad_clip))
