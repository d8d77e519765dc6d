"""The torch backend keeps torch tensors in the scope and converts only at the edges; devices
per role, with the errors a missing GPU gives before any node starts; torch's threads capped by
the node. CUDA cases skip, saying so, on a machine without a GPU."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from runtime import Executor, LoDTensor, Scope, SelectedRows  # noqa: E402
from runtime.config.scenario import ScenarioError, parse_scenario  # noqa: E402
from runtime.execution.kernels import torch_common  # noqa: E402
from runtime.execution.kernels.torch_common import DeviceError, local_rank, native_value  # noqa: E402
from runtime.execution.tensor import host_value  # noqa: E402
from runtime.network.wire import Kind, Message, decode, encode  # noqa: E402
from runtime.services.job import JobError, check_devices  # noqa: E402
from runtime.services.node import cap_kernel_threads  # noqa: E402
from transpiler.models import Model, build_model  # noqa: E402

HAS_CUDA = torch.cuda.is_available()
NO_GPU = "needs a CUDA GPU (torch.cuda.is_available() is False here)"
SIZES = [8, 16, 3]


def mlp() -> Model:
    return build_model("mlp", sizes=SIZES, optimizer={"type": "sgd", "learning_rate": 0.1})


def batch(step: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(step)
    return {"x": rng.standard_normal((4, SIZES[0])).astype(np.float32),
            "label": rng.integers(0, SIZES[-1], (4, 1))}


def train(backend: str, steps: int, device: str = "cpu") -> tuple[Model, Scope, list[float]]:
    model, exe, scope = mlp(), Executor(backend, device), Scope()
    exe.run(model.startup, scope=scope)
    losses = [float(exe.run(model.main, feed=batch(s), fetch_list=[model.loss], scope=scope)[0][0])
              for s in range(steps)]
    return model, scope, losses


class Conversions:
    """Every `from_host` and `to_host` call, as (dtype kind, shape)."""

    def __init__(self) -> None:
        self.up: list[tuple[str, tuple[int, ...]]] = []
        self.down: list[tuple[str, tuple[int, ...]]] = []

    def clear(self) -> None:
        self.up.clear()
        self.down.clear()

    def floats_up(self) -> list[tuple[int, ...]]:
        return sorted(shape for kind, shape in self.up if kind == "f")


@pytest.fixture
def conversions(monkeypatch: pytest.MonkeyPatch) -> Iterator[Conversions]:
    seen = Conversions()
    up, down = torch_common.from_host, torch_common.to_host

    def counted_up(a: np.ndarray, device: Any = None) -> Any:
        seen.up.append((a.dtype.kind, a.shape))
        return up(a, device)

    def counted_down(t: Any) -> np.ndarray:
        out = down(t)
        seen.down.append((out.dtype.kind, out.shape))
        return out

    monkeypatch.setattr(torch_common, "from_host", counted_up)
    monkeypatch.setattr(torch_common, "to_host", counted_down)
    yield seen


# -- tensors in the scope -------------------------------------------------------------------------
def test_the_scope_holds_tensors_and_gives_numpy_to_everyone_else() -> None:
    model, scope, _ = train("torch", 2)
    for name in model.params:
        assert type(scope.raw(name)) is torch.Tensor, name
        assert type(scope.get(name)) is np.ndarray and type(scope.get_tensor(name)) is np.ndarray
        np.testing.assert_array_equal(scope.get(name), scope.raw(name).numpy())


def test_numpy_backend_scope_holds_only_numpy() -> None:
    model, scope, _ = train("numpy", 2)
    assert all(type(scope.raw(name)) is np.ndarray for name in scope.names())


def test_torch_trains_like_numpy_through_the_tensor_scope() -> None:
    model, numpy_scope, numpy_losses = train("numpy", 5)
    _, torch_scope, torch_losses = train("torch", 5)
    np.testing.assert_allclose(torch_losses, numpy_losses, rtol=1e-5)
    for name in model.params:
        np.testing.assert_allclose(torch_scope.get(name), numpy_scope.get(name), rtol=1e-5, atol=1e-6)


def test_a_step_converts_only_its_feed_its_fetch_and_what_enters_as_numpy(
        conversions: Conversions) -> None:
    """After the first step (which converts the initialized parameters once), a step converts
    the fed x and the fetched loss; parameters, activations and gradients never leave torch.
    Integer labels stay numpy (host-side bookkeeping) and are uploaded by the kernels that
    compute on them; the learning rate and the loss gradient's fill_constant (a numpy-shared
    kernel) stay numpy too: the kernels reading them read a scalar on the host."""
    model, exe, scope = mlp(), Executor("torch"), Scope()
    exe.run(model.startup, scope=scope)
    exe.run(model.main, feed=batch(0), fetch_list=[model.loss], scope=scope)
    first = conversions.floats_up()
    assert len(first) == 1 + len(model.params)  # x, parameters
    for step in (1, 2):
        conversions.clear()
        exe.run(model.main, feed=batch(step), fetch_list=[model.loss], scope=scope)
        assert conversions.floats_up() == [(4, SIZES[0])]
        assert conversions.down == [("f", (1,))]
        assert {kind for kind, _ in conversions.up} <= {"f", "i", "b"}


def test_sends_convert_at_the_wire_and_receives_are_converted_once_by_the_first_reader(
        conversions: Conversions) -> None:
    scope = Scope()
    scope.put("w", torch.arange(6, dtype=torch.float32).reshape(2, 3))
    frames = encode(Message(Kind.SEND, 1, "t0", 0, {"w": scope.get_tensor("w")}))
    assert conversions.down == [("f", (2, 3))]
    received = decode(frames).vars["w"]
    scope.put("w", received)
    viewed = native_value(scope.raw("w"))
    assert type(viewed) is torch.Tensor and conversions.up == [("f", (2, 3))]
    assert native_value(viewed) is viewed  # already a tensor: nothing converts, nothing stored


def test_host_value_converts_lod_tensors_and_selected_rows() -> None:
    lod = LoDTensor(torch.ones(3, 2), [[0, 1, 3]])
    rows = SelectedRows(np.array([1, 1]), torch.ones(2, 2), 4)
    host_lod, host_rows = host_value(lod), host_value(rows)
    assert type(host_lod.data) is np.ndarray and host_lod.lod == [[0, 1, 3]]
    assert type(host_rows.values) is np.ndarray and host_rows.rows.tolist() == [1, 1]
    np.testing.assert_array_equal(host_rows.to_dense()[1], [2.0, 2.0])
    assert native_value(np.arange(3)).dtype == np.int64  # integers stay numpy


# -- devices ----------------------------------------------------------------------------------------
SCENARIO = "name: d\nmodel: {name: mlp}\nbackend: {kernels: %s, %s}\n"


@pytest.mark.parametrize("device", ["cpu", "cuda", "cuda:0", "cuda:7", "cuda:local"])
def test_devices_parse(device: str) -> None:
    backend = parse_scenario(SCENARIO % ("torch", f"device: '{device}'")).backend
    assert backend.device_for("trainer") == device and backend.device_for("pserver") == "cpu"


def test_pserver_device_is_its_own() -> None:
    backend = parse_scenario(SCENARIO % ("torch", "device: cuda, pserver_device: 'cuda:1'")).backend
    assert (backend.device_for("trainer"), backend.device_for("pserver")) == ("cuda", "cuda:1")


@pytest.mark.parametrize("spec, message", [
    ("device: gpu", "device"), ("device: 'cuda:x'", "device"), ("pserver_device: cuda:", "pserver_device"),
])
def test_bad_devices_are_refused_by_field(spec: str, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(SCENARIO % ("torch", spec))


def test_cuda_needs_torch_kernels_for_either_role() -> None:
    with pytest.raises(ScenarioError, match="pserver_device cuda needs kernels: torch"):
        parse_scenario(SCENARIO % ("numpy", "pserver_device: cuda"))


@pytest.mark.skipif(HAS_CUDA, reason="a GPU is present: cuda devices exist")
@pytest.mark.parametrize("field, device", [("device", "cuda:local"), ("pserver_device", "cuda:1")])
def test_a_missing_gpu_is_a_job_error_before_any_node_starts(field: str, device: str) -> None:
    scenario = parse_scenario(SCENARIO % ("torch", f"{field}: '{device}'"))
    with pytest.raises(JobError) as info:
        check_devices(scenario)
    message = str(info.value)
    assert f"backend.{field} {device}" in message and "use device cpu" in message
    assert "torch.cuda.is_available() is False" in message


def test_cpu_devices_need_no_check() -> None:
    check_devices(parse_scenario(SCENARIO % ("torch", "device: cpu")))


def test_local_rank_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert local_rank(3) == 3
    monkeypatch.setenv("LOCAL_RANK", "5")
    assert local_rank(3) == 5
    monkeypatch.setenv("LOCAL_RANK", "five")
    with pytest.raises(DeviceError, match="LOCAL_RANK='five'"):
        local_rank(0)


# -- threads ----------------------------------------------------------------------------------------
@pytest.fixture
def torch_threads() -> Iterator[int]:
    before = torch.get_num_threads()
    yield before
    torch.set_num_threads(before)


def test_a_node_caps_torch_threads_at_its_share(torch_threads: int) -> None:
    assert cap_kernel_threads("torch", {"OMP_NUM_THREADS": "1"}) == 1
    assert torch.get_num_threads() == 1


def test_without_a_share_the_threads_are_left_alone(torch_threads: int) -> None:
    assert cap_kernel_threads("torch", {}) is None
    assert torch.get_num_threads() == torch_threads
    assert cap_kernel_threads("numpy", {"OMP_NUM_THREADS": "2"}) == 2  # numpy's BLAS read it at start
    assert torch.get_num_threads() == torch_threads


@pytest.mark.parametrize("text", ["0", "many"])
def test_a_bad_share_is_refused_by_name(text: str, torch_threads: int) -> None:
    with pytest.raises(ScenarioError, match=f"OMP_NUM_THREADS='{text}'"):
        cap_kernel_threads("torch", {"OMP_NUM_THREADS": text})


# -- CUDA -------------------------------------------------------------------------------------------
@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
def test_cuda_keeps_parameters_on_the_device_and_trains_like_numpy() -> None:
    model, numpy_scope, numpy_losses = train("numpy", 5)
    _, scope, losses = train("torch", 5, "cuda")
    np.testing.assert_allclose(losses, numpy_losses, rtol=1e-4)
    for name in model.params:
        assert scope.raw(name).device.type == "cuda", name
        np.testing.assert_allclose(scope.get(name), numpy_scope.get(name), rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
def test_cuda_step_copies_only_its_feed_and_fetch(conversions: Conversions) -> None:
    model, exe, scope = mlp(), Executor("torch", "cuda"), Scope()
    exe.run(model.startup, scope=scope)
    exe.run(model.main, feed=batch(0), fetch_list=[model.loss], scope=scope)
    conversions.clear()
    exe.run(model.main, feed=batch(1), fetch_list=[model.loss], scope=scope)
    assert conversions.floats_up() == [(4, SIZES[0])]
    assert conversions.down == [("f", (1,))]


@pytest.mark.skipif(not HAS_CUDA, reason=NO_GPU)
def test_cuda_tensors_cross_the_wire_through_the_host() -> None:
    value = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
    got = decode(encode(Message(Kind.SEND, 1, "t0", 0, {"w": value}))).vars["w"]
    np.testing.assert_array_equal(got, np.arange(6, dtype=np.float32).reshape(2, 3))
