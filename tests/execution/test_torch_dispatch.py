"""What a torch kernel's context reads and writes, on the paths that skip work: a tensor is read
as the very object the scope holds, a numpy value is converted once and kept, a numpy kernel
still reads numpy; a value fed or initialized as numpy is never written; the usual sgd (its
shortcut past the general optimizer rules) steps as numpy's; a bias broadcasts without a
reshape, with numpy's numbers and gradients."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from runtime import Executor, Scope  # noqa: E402
from runtime.execution.executor import device_binder  # noqa: E402
from runtime.execution.kernels import KernelContext, MissingInputError, get_kernel  # noqa: E402
from runtime.execution.kernels.buffers import MIN_BYTES  # noqa: E402
from runtime.execution.kernels.torch_common import on_host  # noqa: E402
from transpiler.ir import Op  # noqa: E402
from transpiler.models import build_model  # noqa: E402


def torch_context(op: Op, scope: Scope) -> KernelContext:
    """A context as a CPU-bound torch kernel sees it (the binding sets its view)."""
    seen: list[KernelContext] = []
    device_binder("torch", "cpu")(seen.append)(KernelContext(op, scope))  # type: ignore[arg-type]
    return seen[0]


def run(op: Op, scope: Scope, backend: str = "torch") -> None:
    device_binder(backend, "cpu")(get_kernel(op.type, backend))(KernelContext(op, scope, "", None))


def test_a_tensor_is_read_as_the_object_the_scope_holds() -> None:
    scope = Scope()
    t = torch.ones(3)
    scope.put("x", t)
    assert torch_context(Op("relu", {"X": ["x"]}, {"Out": ["y"]}), scope).input("X") is t


def test_a_numpy_value_is_converted_once_and_kept_a_numpy_kernel_reads_numpy() -> None:
    scope = Scope()
    a = np.arange(4, dtype=np.float32)
    scope.put("x", a)
    ctx = torch_context(Op("relu", {"X": ["x"]}, {"Out": ["y"]}), scope)
    viewed = ctx.input("X")
    assert type(viewed) is torch.Tensor and scope.raw("x") is viewed and ctx.input("X") is viewed
    seen: list[KernelContext] = []
    on_host(seen.append)(KernelContext(Op("relu", {"X": ["x"]}, {"Out": ["y"]}), scope))  # type: ignore[arg-type]
    read = seen[0].input("X")
    assert type(read) is np.ndarray and scope.raw("x") is viewed  # not stored back
    np.testing.assert_array_equal(read, a)


def test_a_missing_input_names_its_slot_and_var() -> None:
    ctx = torch_context(Op("relu", {"X": ["x"]}, {"Out": ["y"]}), Scope())
    with pytest.raises(MissingInputError, match="input X var 'x'"):
        ctx.input("X")


def test_values_fed_or_initialized_as_numpy_are_never_written() -> None:
    model = build_model("mlp", sizes=[64, 256, 10], optimizer={"type": "sgd", "learning_rate": 0.5})
    exe, scope = Executor("torch"), Scope()
    exe.run(model.startup, scope=scope)
    initial = {name: scope.raw(name) for name in model.params}
    kept = {name: value.copy() for name, value in initial.items()}
    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64)).astype(np.float32)
    label = rng.integers(0, 10, (32, 1))
    fed_x, fed_label = x.copy(), label.copy()
    for _ in range(3):
        exe.run(model.main, feed={"x": x, "label": label}, fetch_list=[model.loss], scope=scope)
    np.testing.assert_array_equal(x, fed_x)
    np.testing.assert_array_equal(label, fed_label)
    for name, value in initial.items():
        assert type(value) is np.ndarray
        np.testing.assert_array_equal(value, kept[name])
        assert not np.array_equal(scope.get(name), kept[name]), name  # trained, elsewhere


@pytest.mark.parametrize("rows", [4, MIN_BYTES // (4 * 16)])
def test_the_usual_sgd_steps_as_numpy_does_on_small_and_large_parameters(rows: int) -> None:
    scope = Scope()
    rng = np.random.default_rng(1)
    p = rng.standard_normal((rows, 16)).astype(np.float32)
    g = rng.standard_normal((rows, 16)).astype(np.float32)
    op = Op("sgd", {"Param": ["p"], "Grad": ["g"], "LearningRate": ["lr"]}, {"ParamOut": ["p"]})
    scope.put("p", torch.from_numpy(p.copy()).clone())
    scope.put("g", torch.from_numpy(g))
    scope.put("lr", np.array([0.1], np.float32))
    run(op, scope)
    expected = torch.add(torch.add(torch.from_numpy(p), torch.from_numpy(g), alpha=-0.1),
                         torch.from_numpy(g), alpha=-0.1)
    run(op, scope)
    second = scope.raw("p")
    assert torch.equal(second, expected)
    numpy_scope = Scope()
    numpy_scope.put("p", p.copy())
    numpy_scope.put("g", g)
    numpy_scope.put("lr", np.array([0.1], np.float32))
    run(op, numpy_scope, "numpy")
    run(op, numpy_scope, "numpy")
    np.testing.assert_allclose(second.numpy(), numpy_scope.get("p"), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("axis, y_shape", [(-1, (5,)), (1, (5,)), (0, (3,)), (-1, (3, 5))])
@pytest.mark.parametrize("op_type", ["elementwise_add", "elementwise_mul", "elementwise_div"])
def test_broadcast_operands_give_numpy_values_and_gradients(op_type: str, axis: int,
                                                            y_shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(2)
    values = {"x": rng.uniform(1, 2, (3, 5)).astype(np.float32),
              "y": rng.uniform(1, 2, y_shape).astype(np.float32),
              "out@GRAD": rng.standard_normal((3, 5)).astype(np.float32)}
    forward = Op(op_type, {"X": ["x"], "Y": ["y"]}, {"Out": ["out"]}, {"axis": axis})
    backward = Op(op_type + "_grad", {"X": ["x"], "Y": ["y"], "Out": ["out"], "Out@GRAD": ["out@GRAD"]},
                  {"X@GRAD": ["x@GRAD"], "Y@GRAD": ["y@GRAD"]}, {"axis": axis})
    scopes = {}
    for backend in ("numpy", "torch"):
        scope = Scope()
        for name, value in values.items():
            scope.put(name, value.copy())
        run(forward, scope, backend)
        run(backward, scope, backend)
        scopes[backend] = scope
    for name in ("out", "x@GRAD", "y@GRAD"):
        got, want = scopes["torch"].get(name), scopes["numpy"].get(name)
        assert got.shape == want.shape and got.dtype == want.dtype, name
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=name)
