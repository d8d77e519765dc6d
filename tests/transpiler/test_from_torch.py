"""`transpiler.from_torch`: a torch module captured into a pslab program trains as torch trains
it (same data, same initial weights, plain SGD: the losses of 20 steps agree to rtol 1e-4), an
op it cannot map is an error naming the node and the op, and a captured model run by `sim run`
in 2 pservers x 2 trainers sync mode ends with local training's parameters."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

import example_runs  # noqa: E402
from runtime import Executor, Scope  # noqa: E402
from runtime.config.scenario import load_scenario  # noqa: E402
from runtime.services.job import Job  # noqa: E402
from transpiler import from_torch  # noqa: E402
from transpiler.capture import CaptureError, supported  # noqa: E402
from transpiler.models import Model  # noqa: E402

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "my_torch_model.yaml"
STEPS, BATCH, LR = 20, 16, 0.1


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(64, 32), nn.Linear(32, 10)

    def forward(self, x: Any) -> Any:
        return self.fc2(torch.relu(self.fc1(x)))


class CNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x: Any) -> Any:
        h = self.pool(torch.relu(self.conv(x.view(-1, 1, 8, 8))))
        return self.fc(h.flatten(1))


class MLPWithLoss(MLP):
    """Returns its own loss: forward(x, label)."""

    def forward(self, x: Any, label: Any) -> Any:  # type: ignore[override]
        return F.cross_entropy(super().forward(x), label)


class BatchNormNet(nn.Module):
    """Batch norm (its running statistics are state the capture must not move), average
    pooling, a layer norm, sigmoid and scalar arithmetic."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(4)
        self.norm = nn.LayerNorm(16)
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x: Any) -> Any:
        h = F.avg_pool2d(F.relu(self.bn(self.conv(x.view(-1, 1, 8, 8)))), 2)
        h = self.norm(torch.sigmoid(h.mean() * 0.5 + h.view(h.size(0), 4, 16)) * 2.0 - 1)
        return self.head(h)


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(7)
    return (rng.normal(size=(STEPS, BATCH, 64)).astype(np.float32),
            rng.integers(0, 10, size=(STEPS, BATCH)))


def torch_losses(module: Any, xs: np.ndarray, ys: np.ndarray, loss_inside: bool = False) -> list[float]:
    sgd = torch.optim.SGD(module.parameters(), lr=LR)
    losses = []
    for x, y in zip(torch.from_numpy(xs), torch.from_numpy(ys)):
        sgd.zero_grad()
        loss = module(x, y) if loss_inside else F.cross_entropy(module(x), y)
        loss.backward()
        sgd.step()
        losses.append(loss.item())
    return losses


def pslab_losses(model: Model, xs: np.ndarray, ys: np.ndarray) -> list[float]:
    exe, scope = Executor(), Scope()
    exe.run(model.startup, scope=scope)
    return [float(exe.run(model.main, feed={"x": x, "label": y[:, None]},
                          fetch_list=[model.loss], scope=scope)[0][0])
            for x, y in zip(xs, ys)]


def capture(module: Any, loss: str | None = "cross_entropy") -> Model:
    inputs = (torch.zeros(2, 64),) if loss else (torch.zeros(2, 64), torch.zeros(2, dtype=torch.int64))
    return from_torch(module, inputs, loss=loss, optimizer={"type": "sgd", "learning_rate": LR})


@pytest.mark.parametrize("make", [MLP, CNN, BatchNormNet], ids=["mlp", "cnn", "batch_norm"])
def test_a_captured_module_trains_as_torch_does(make: Callable[[], Any]) -> None:
    torch.manual_seed(0)
    module = make()
    model = capture(module)
    xs, ys = data()
    np.testing.assert_allclose(pslab_losses(model, xs, ys), torch_losses(module, xs, ys),
                               rtol=1e-4)


def test_a_module_that_returns_its_loss_trains_as_torch_does() -> None:
    torch.manual_seed(1)
    module = MLPWithLoss()
    model = capture(module, loss=None)
    assert model.feeds == ["x", "label"] and model.label == "label"
    assert model.main.global_block().var("label").shape == (-1, 1)
    xs, ys = data()
    np.testing.assert_allclose(pslab_losses(model, xs, ys),
                               torch_losses(module, xs, ys, loss_inside=True), rtol=1e-4)


def test_parameters_keep_torch_names_layouts_and_values_and_the_module_is_untouched() -> None:
    torch.manual_seed(2)
    module = BatchNormNet()
    module.bn.running_mean.fill_(0.25)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    model = capture(module)
    scope = Scope()
    Executor().run(model.startup, scope=scope)
    for name, value in before.items():
        assert torch.equal(module.state_dict()[name], value), name  # tracing moved nothing
        if name.endswith("num_batches_tracked"):
            continue
        got = np.asarray(scope.get(name))
        np.testing.assert_array_equal(got.reshape(value.shape), value.numpy(), err_msg=name)
    assert model.params == sorted(n for n, p in module.named_parameters())
    assert model.main.global_block().var("head.1.weight").shape == (10, 64)  # [out, in]


class Mish(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc, self.act = nn.Linear(64, 10), nn.Mish()

    def forward(self, x: Any) -> Any:
        return self.act(self.fc(x))


class Cumsum(nn.Module):
    def forward(self, x: Any) -> Any:
        return torch.cumsum(x, 1)


def test_an_unsupported_op_is_an_error_naming_the_node_and_the_op() -> None:
    with pytest.raises(CaptureError, match=r"^from_torch: node 'act' \(call_module "
                       r"torch\.nn\.modules\.activation\.Mish\) is not supported; supported "
                       r"modules: .*nn\.Conv2d"):
        capture(Mish())
    with pytest.raises(CaptureError, match=r"^from_torch: node 'cumsum' \(call_function "
                       r"torch\.cumsum\) is not supported; supported functions: "):
        capture(Cumsum())
    with pytest.raises(CaptureError, match=r"^from_torch: node '_1' \(call_module torch\.nn\."
                       r"modules\.flatten\.Flatten\) moves the batch dimension: \[-1, 64\] -> "
                       r"\[128\] with example batch 2$"):
        capture(nn.Sequential(nn.Identity(), nn.Flatten(0)))


def test_the_supported_list_names_what_the_docs_name() -> None:
    listed = supported()
    text = (Path(__file__).resolve().parents[2] / "docs" / "transpiler.md").read_text()
    for kind in ("modules", "functions", "methods"):
        for name in listed[kind]:
            assert f"`{name}`" in text, (kind, name)


def test_sim_run_of_a_captured_model_in_2x2_sync_equals_local_training(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    metrics = example_runs.sim_run(EXAMPLE, tmp_path)
    assert metrics.job.success and all(e.passed for e in metrics.expectations)
    assert [e.name for e in metrics.expectations] == ["loss_drop_factor", "params_equal_to",
                                                      "no_lost_updates"]
    # fc1.weight (128 x 128) is cut in two blocks, each pserver starting from its rows of it
    job = Job.from_scenario(load_scenario(EXAMPLE))
    offsets = sorted(op.attr("row_offset") for ps in range(2)
                     for op in job.pserver_programs(ps)[1].global_block().ops
                     if op.type == "assign_value" and op.attr("origin_name") == "fc1.weight")
    assert offsets == [0, 64]
