"""Optimizer kernels: one hand-checked step per optimizer (dense and with a SelectedRows grad),
and 20-step agreement with torch.optim where torch has the same optimizer."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from gradcheck import run_op

from runtime import SelectedRows

LR = np.array([0.1])
P = np.array([1.0, -2.0])
G = np.array([0.5, -0.25])

OUTPUTS = {
    "sgd": ["ParamOut"],
    "momentum": ["ParamOut", "VelocityOut"],
    "adam": ["ParamOut", "Moment1Out", "Moment2Out"],
    "adagrad": ["ParamOut", "MomentOut"],
    "decayed_adagrad": ["ParamOut", "MomentOut"],
    "adamax": ["ParamOut", "MomentOut", "InfNormOut"],
    "rmsprop": ["ParamOut", "MomentOut", "MeanSquareOut", "MeanGradOut"],
    "ftrl": ["ParamOut", "SquaredAccumOut", "LinearAccumOut"],
}


def step(op_type: str, state: dict[str, Any], attrs: dict[str, Any] | None = None) -> dict[str, Any]:
    return run_op(op_type, state, OUTPUTS[op_type], attrs)


def test_sgd_step() -> None:
    out = step("sgd", {"Param": P, "Grad": G, "LearningRate": LR})
    np.testing.assert_allclose(out["ParamOut"], [0.95, -1.975])


def test_sgd_selected_rows_scatter_adds_repeated_rows() -> None:
    p = np.array([[1.0, 1.0], [2.0, 2.0], [3.0, 3.0]])
    g = SelectedRows([2, 0, 2], np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]]), 3)
    out = step("sgd", {"Param": p, "Grad": g, "LearningRate": LR})["ParamOut"]
    np.testing.assert_allclose(out, [[0.7, 0.6], [2.0, 2.0], [2.4, 2.2]])
    dense = step("sgd", {"Param": p, "Grad": g.to_dense(), "LearningRate": LR})["ParamOut"]
    np.testing.assert_allclose(out, dense)


def test_sgd_keeps_float32_and_checks_height() -> None:
    out = step("sgd", {"Param": P.astype(np.float32), "Grad": G.astype(np.float32),
                       "LearningRate": np.array([0.1], np.float32)})["ParamOut"]
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match="height"):
        step("sgd", {"Param": np.zeros((3, 2)), "Grad": SelectedRows([0], np.ones((1, 2)), 4),
                     "LearningRate": LR})


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_step(nesterov: bool) -> None:
    out = step("momentum", {"Param": np.array([1.0]), "Grad": np.array([0.5]),
                            "Velocity": np.array([0.2]), "LearningRate": LR},
               {"mu": 0.9, "use_nesterov": nesterov})
    np.testing.assert_allclose(out["VelocityOut"], [0.68])  # 0.9 * 0.2 + 0.5
    np.testing.assert_allclose(out["ParamOut"], [0.8888 if nesterov else 0.932])


def test_adam_step() -> None:
    b1, b2, eps, t = 0.9, 0.999, 1e-8, 3
    m1, m2 = np.array([0.1, -0.2]), np.array([0.01, 0.04])
    out = step("adam", {"Param": P, "Grad": G, "LearningRate": LR, "Moment1": m1, "Moment2": m2,
                        "Beta1Pow": np.array([b1 ** t]), "Beta2Pow": np.array([b2 ** t])},
               {"beta1": b1, "beta2": b2, "epsilon": eps})
    for i in range(2):
        e1 = b1 * m1[i] + (1 - b1) * G[i]
        e2 = b2 * m2[i] + (1 - b2) * G[i] ** 2
        lr_t = 0.1 * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
        expected = P[i] - lr_t * e1 / (math.sqrt(e2) + eps * math.sqrt(1 - b2 ** t))
        assert out["Moment1Out"][i] == pytest.approx(e1)
        assert out["Moment2Out"][i] == pytest.approx(e2)
        assert out["ParamOut"][i] == pytest.approx(expected, rel=1e-12)


def test_adagrad_step() -> None:
    out = step("adagrad", {"Param": P, "Grad": G, "Moment": np.array([0.75, 0.0]), "LearningRate": LR},
               {"epsilon": 1e-6})
    np.testing.assert_allclose(out["MomentOut"], [1.0, 0.0625])
    np.testing.assert_allclose(out["ParamOut"], [1 - 0.05 / (1 + 1e-6), -2 + 0.025 / (0.25 + 1e-6)])


def test_decayed_adagrad_step() -> None:
    out = step("decayed_adagrad", {"Param": P, "Grad": G, "Moment": np.array([1.0, 0.0]),
                                   "LearningRate": LR}, {"decay": 0.5, "epsilon": 1e-6})
    m = np.array([0.5 + 0.5 * 0.25, 0.5 * 0.0625])
    np.testing.assert_allclose(out["MomentOut"], m)
    np.testing.assert_allclose(out["ParamOut"], P - 0.1 * G / (np.sqrt(m) + 1e-6))


def test_adamax_step() -> None:
    b1, b2, eps = 0.9, 0.999, 1e-8
    out = step("adamax", {"Param": P, "Grad": G, "LearningRate": LR, "Moment": np.array([0.1, 0.1]),
                          "InfNorm": np.array([1.0, 0.1]), "Beta1Pow": np.array([b1 ** 2])},
               {"beta1": b1, "beta2": b2, "epsilon": eps})
    m = np.array([0.09 + 0.05, 0.09 - 0.025])
    u = np.array([0.999 + eps, 0.25])  # max(b2*u + eps, |g|): the old norm wins, then |g| wins
    np.testing.assert_allclose(out["MomentOut"], m)
    np.testing.assert_allclose(out["InfNormOut"], u)
    np.testing.assert_allclose(out["ParamOut"], P - 0.1 / (1 - b1 ** 2) * m / u)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_step(centered: bool) -> None:
    rho, eps, mu = 0.9, 1e-6, 0.5
    state = {"Param": P, "Grad": G, "LearningRate": LR, "MeanSquare": np.array([0.2, 0.1]),
             "Moment": np.array([0.01, -0.02]), "MeanGrad": np.array([0.1, 0.05])}
    out = step("rmsprop", state, {"decay": rho, "epsilon": eps, "momentum": mu, "centered": centered})
    ms = rho * state["MeanSquare"] + (1 - rho) * G * G
    mg = rho * state["MeanGrad"] + (1 - rho) * G
    denom = np.sqrt(ms - mg * mg + eps) if centered else np.sqrt(ms + eps)
    mom = mu * state["Moment"] + 0.1 * G / denom
    np.testing.assert_allclose(out["MeanSquareOut"], ms)
    np.testing.assert_allclose(out["MomentOut"], mom)
    np.testing.assert_allclose(out["ParamOut"], P - mom)
    if centered:
        np.testing.assert_allclose(out["MeanGradOut"], mg)
    else:
        assert out["MeanGradOut"] is None  # not written: the accumulator is unused


@pytest.mark.parametrize("l1,l2,power", [(0.0, 0.0, -0.5), (0.1, 0.2, -0.5), (0.05, 0.1, -0.7)])
def test_ftrl_step(l1: float, l2: float, power: float) -> None:
    n, z = np.array([0.5, 1.0]), np.array([0.3, -0.01])
    out = step("ftrl", {"Param": P, "Grad": G, "LearningRate": LR, "SquaredAccumulator": n,
                        "LinearAccumulator": z}, {"l1": l1, "l2": l2, "lr_power": power})
    for i in range(2):
        n_new = n[i] + G[i] ** 2
        z_new = z[i] + G[i] - (n_new ** -power - n[i] ** -power) / 0.1 * P[i]
        expected = ((l1 * np.sign(z_new) - z_new) / (n_new ** -power / 0.1 + 2 * l2)
                    if abs(z_new) > l1 else 0.0)
        assert out["SquaredAccumOut"][i] == pytest.approx(n_new)
        assert out["LinearAccumOut"][i] == pytest.approx(z_new)
        assert out["ParamOut"][i] == pytest.approx(expected)


def test_ftrl_zeroes_weights_inside_l1_band() -> None:
    out = step("ftrl", {"Param": np.array([0.0]), "Grad": np.array([0.01]), "LearningRate": LR,
                        "SquaredAccumulator": np.array([0.0]), "LinearAccumulator": np.array([0.0])},
               {"l1": 1.0})
    assert out["ParamOut"].tolist() == [0.0]


# -- SelectedRows grads equal their dense version ---------------------------------------------
def _state(op_type: str, grad: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    rng = np.random.default_rng(3)
    p = rng.standard_normal((4, 2))
    pos = lambda: rng.uniform(0.1, 1.0, (4, 2))  # noqa: E731
    acc = {
        "sgd": {}, "momentum": {"Velocity": pos()},
        "adam": {"Moment1": pos(), "Moment2": pos(), "Beta1Pow": np.array([0.81]),
                 "Beta2Pow": np.array([0.998])},
        "adagrad": {"Moment": pos()}, "decayed_adagrad": {"Moment": pos()},
        "adamax": {"Moment": pos(), "InfNorm": pos(), "Beta1Pow": np.array([0.81])},
        "rmsprop": {"MeanSquare": pos(), "Moment": pos(), "MeanGrad": 0.1 * pos()},
        "ftrl": {"SquaredAccumulator": pos(), "LinearAccumulator": pos()},
    }[op_type]
    attrs = {"rmsprop": {"centered": True, "momentum": 0.5}, "ftrl": {"l1": 0.1, "l2": 0.1}}
    return {"Param": p, "Grad": grad, "LearningRate": LR, **acc}, attrs.get(op_type, {})


@pytest.mark.parametrize("op_type", sorted(OUTPUTS))
def test_selected_rows_grad_equals_dense_grad(op_type: str) -> None:
    rows = SelectedRows([3, 0, 3], np.array([[1.0, -2.0], [0.5, 0.5], [0.25, 1.0]]), 4)
    sparse_state, attrs = _state(op_type, rows)
    dense_state, _ = _state(op_type, rows.to_dense())
    sparse, dense = step(op_type, sparse_state, attrs), step(op_type, dense_state, attrs)
    for slot in OUTPUTS[op_type]:
        np.testing.assert_allclose(sparse[slot], dense[slot], rtol=1e-12, err_msg=slot)
    # untouched rows still move for optimizers with state (non-lazy): row 1 has no gradient
    if op_type in ("momentum", "adam", "rmsprop"):
        assert not np.allclose(sparse["ParamOut"][1], sparse_state["Param"][1])


# -- against torch.optim ------------------------------------------------------------------------
STEPS = 20


def _grads() -> list[np.ndarray]:
    rng = np.random.default_rng(11)
    return [rng.standard_normal((3, 4)) for _ in range(STEPS)]


def _run_paddle(op_type: str, acc: dict[str, np.ndarray], attrs: dict[str, Any], lr: float,
                pows: dict[str, float]) -> np.ndarray:
    """`pows`: Beta*Pow slots and their beta, advanced after each step as the `scale` ops do."""
    p = np.random.default_rng(5).standard_normal((3, 4))
    state = {"Param": p, "LearningRate": np.array([lr]), **acc,
             **{slot: np.array([beta]) for slot, beta in pows.items()}}
    for g in _grads():
        out = step(op_type, {**state, "Grad": g}, attrs)
        state["Param"] = out.pop("ParamOut")
        state.update({slot.removesuffix("Out"): value for slot, value in out.items() if value is not None})
        for slot, beta in pows.items():
            state[slot] = state[slot] * beta
    return state["Param"]


def _run_torch(make: Any) -> np.ndarray:
    torch = pytest.importorskip("torch")
    p = torch.tensor(np.random.default_rng(5).standard_normal((3, 4)), requires_grad=True)
    opt = make(torch, [p])
    for g in _grads():
        p.grad = torch.tensor(g)
        opt.step()
    return p.detach().numpy()


def _zeros() -> np.ndarray:
    return np.zeros((3, 4))


def test_adam_matches_torch() -> None:
    """Paddle's lr*sqrt(1-b2^t)/(1-b1^t) with eps*sqrt(1-b2^t) is torch's update exactly."""
    ours = _run_paddle("adam", {"Moment1": _zeros(), "Moment2": _zeros()},
                       {"beta1": 0.9, "beta2": 0.99, "epsilon": 1e-3}, 0.05,
                       {"Beta1Pow": 0.9, "Beta2Pow": 0.99})
    theirs = _run_torch(lambda t, ps: t.optim.Adam(ps, lr=0.05, betas=(0.9, 0.99), eps=1e-3))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("nesterov", [False, True])
def test_momentum_matches_torch(nesterov: bool) -> None:
    ours = _run_paddle("momentum", {"Velocity": _zeros()}, {"mu": 0.8, "use_nesterov": nesterov}, 0.05, {})
    theirs = _run_torch(lambda t, ps: t.optim.SGD(ps, lr=0.05, momentum=0.8, nesterov=nesterov))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_adagrad_matches_torch() -> None:
    """Both add eps outside the square root: same settings."""
    ours = _run_paddle("adagrad", {"Moment": _zeros()}, {"epsilon": 1e-2}, 0.1, {})
    theirs = _run_torch(lambda t, ps: t.optim.Adagrad(ps, lr=0.1, eps=1e-2))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("centered", [False, True])
def test_rmsprop_matches_torch(centered: bool) -> None:
    """Paddle adds eps inside the square root, torch outside: compared with eps = 0. Paddle's
    moment holds lr * torch's momentum buffer, the same update for a constant lr."""
    ours = _run_paddle("rmsprop", {"MeanSquare": _zeros(), "Moment": _zeros(), "MeanGrad": _zeros()},
                       {"decay": 0.9, "epsilon": 0.0, "momentum": 0.5, "centered": centered}, 0.01, {})
    theirs = _run_torch(lambda t, ps: t.optim.RMSprop(ps, lr=0.01, alpha=0.9, eps=0.0, momentum=0.5,
                                                      centered=centered))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


def test_adamax_matches_torch() -> None:
    """Paddle adds eps to b2*u before the max, torch to |g|: compared with eps = 0."""
    ours = _run_paddle("adamax", {"Moment": _zeros(), "InfNorm": _zeros()},
                       {"beta1": 0.9, "beta2": 0.99, "epsilon": 0.0}, 0.02, {"Beta1Pow": 0.9})
    theirs = _run_torch(lambda t, ps: t.optim.Adamax(ps, lr=0.02, betas=(0.9, 0.99), eps=0.0))
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
