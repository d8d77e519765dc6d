"""`from_torch`'s activations with attributes and `nn.Embedding`.

The kernels of `gelu` (exact and tanh), `silu`, `leaky_relu`, `elu`, `softplus` and `brelu` (torch's
Hardtanh) have gradients equal to central differences of their forward, in numpy and in torch
(tests/execution/test_torch_kernels.py checks that both backends agree), and compute what torch's
modules do. A module with an embedding and every activation, captured and trained with SGD, has
torch's losses, gradients and parameters to 1e-5, whatever the shape of its ids ([N], [N, L],
[N, 1]), with a sparse gradient too; what Paddle's lookup cannot do is refused, naming it. An
embedding named `distributed_table` is Paddle's distributed lookup table: transpiled for 2
pservers each holds half its rows, the trainers prefetch, and the simulated sync job trains to
local training's losses and parameters."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402
from torch.nn import functional as F  # noqa: E402

from gradcheck import BACKENDS, check_grad, run_op  # noqa: E402
from runtime import Executor, Scope  # noqa: E402
from runtime.config.scenario import load_scenario  # noqa: E402
from runtime.execution.kernels import numpy_math  # noqa: E402
from runtime.execution.tensor import SelectedRows  # noqa: E402
from runtime.services.cluster import train_locally  # noqa: E402
from runtime.services.job import Job  # noqa: E402
from sim.simulate import simulate  # noqa: E402
from transpiler import from_torch  # noqa: E402
from transpiler.capture import CaptureError  # noqa: E402
from transpiler.models import Model  # noqa: E402

import torch_models  # noqa: E402

LR, STEPS, BATCH = 0.1, 6, 8
RTOL = ATOL = 1e-5
"""What equal to torch's (or to local training's) means here."""

# -- the kernels ----------------------------------------------------------------------------------
ACTIVATIONS: dict[str, tuple[dict[str, Any], Any]] = {
    "gelu": ({}, lambda x: F.gelu(x)),
    "gelu-tanh": ({"approximate": True}, lambda x: F.gelu(x, approximate="tanh")),
    "silu": ({}, F.silu),
    "leaky_relu": ({}, lambda x: F.leaky_relu(x, 0.02)),  # Paddle's default alpha
    "leaky_relu-0.3": ({"alpha": 0.3}, lambda x: F.leaky_relu(x, 0.3)),
    "elu": ({}, F.elu),
    "elu-0.5": ({"alpha": 0.5}, lambda x: F.elu(x, 0.5)),
    "softplus": ({}, F.softplus),
    "softplus-2-1": ({"beta": 2.0, "threshold": 1.0}, lambda x: F.softplus(x, 2.0, 1.0)),
    "brelu": ({}, lambda x: F.hardtanh(x, 0.0, 24.0)),  # Paddle's defaults
    "brelu-hardtanh": ({"t_min": -1.0, "t_max": 1.0}, F.hardtanh),
}
"""Case -> the op's attributes and what torch computes for them."""


def inputs(rng: np.random.Generator) -> np.ndarray:
    """Values on both sides of every kink (0, the bounds, softplus's threshold), none at one."""
    x = rng.uniform(-3, 3, (4, 5))
    return np.where(np.abs(np.abs(x) - 1) < 0.05, x + 0.1, np.where(np.abs(x) < 0.05, 0.1, x))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_an_activations_gradient_is_central_differences_of_its_forward(case: str,
                                                                       backend: str) -> None:
    attrs, _ = ACTIVATIONS[case]
    check_grad(case.split("-")[0], {"X": inputs(np.random.default_rng(3))}, ["X"], attrs,
               backend=backend)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", sorted(ACTIVATIONS))
def test_an_activation_computes_what_torch_does(case: str, backend: str, dtype: type) -> None:
    attrs, reference = ACTIVATIONS[case]
    x: np.ndarray = (4 * np.random.default_rng(4).standard_normal((6, 7))).astype(dtype)
    out = np.asarray(run_op(case.split("-")[0], {"X": x}, attrs=attrs, backend=backend)["Out"])
    assert out.dtype == dtype
    np.testing.assert_allclose(out, reference(torch.from_numpy(x)).numpy(), rtol=1e-6,
                               atol=1e-6 if dtype == np.float32 else 1e-14)


def test_the_exact_gelu_needs_no_scipy(monkeypatch: pytest.MonkeyPatch) -> None:
    x = np.random.default_rng(5).standard_normal((3, 4)).astype(np.float32)
    with_scipy = run_op("gelu", {"X": x})["Out"]
    monkeypatch.setitem(sys.modules, "scipy.special", None)  # import fails
    numpy_math._erf_ufunc.cache_clear()
    try:
        without = run_op("gelu", {"X": x})["Out"]
    finally:
        numpy_math._erf_ufunc.cache_clear()
    assert without.dtype == np.float32
    np.testing.assert_allclose(without, with_scipy, rtol=1e-6, atol=1e-7)


# -- a captured module trains as torch does -------------------------------------------------------
Batches = list[tuple[np.ndarray, np.ndarray]]
Run = tuple[list[float], dict[str, np.ndarray], dict[str, np.ndarray]]
"""Losses of SGD steps; the first step's gradients; the parameters after the last."""


def batches(ids_shape: tuple[int, ...], vocab: int = 40, classes: int = 5,
            seed: int = 7) -> Batches:
    """STEPS batches of ids (some the padding id 0) and labels."""
    rng = np.random.default_rng(seed)
    return [(rng.integers(0, vocab, (BATCH, *ids_shape)), rng.integers(0, classes, BATCH))
            for _ in range(STEPS)]


def capture(module: Any, ids_shape: tuple[int, ...], table: str | None = None) -> Model:
    example = torch.zeros((2, *ids_shape), dtype=torch.int64)
    return from_torch(module, example, loss="cross_entropy",
                      optimizer={"type": "sgd", "learning_rate": LR}, distributed_table=table)


def torch_run(module: Any, data: Batches) -> Run:
    sgd = torch.optim.SGD(module.parameters(), lr=LR)
    losses: list[float] = []
    grads: dict[str, np.ndarray] = {}
    for ids, labels in data:
        sgd.zero_grad()
        loss = F.cross_entropy(module(torch.from_numpy(ids)), torch.from_numpy(labels))
        loss.backward()
        grads = grads or {n: p.grad.to_dense().numpy().copy() for n, p in module.named_parameters()}
        sgd.step()
        losses.append(loss.item())
    return losses, grads, {n: p.detach().numpy() for n, p in module.named_parameters()}


def pslab_run(model: Model, data: Batches) -> Run:
    exe, scope = Executor(), Scope()
    exe.run(model.startup, scope=scope)
    losses: list[float] = []
    grads: dict[str, np.ndarray] = {}
    names = [f"{p}@GRAD" for p in model.params]
    for ids, labels in data:
        ids = ids[:, None] if ids.ndim == 1 else ids  # an int vector feeds as Paddle's [-1, 1]
        loss, *fetched = exe.run(model.main, feed={"ids": ids, "label": labels[:, None]},
                                 fetch_list=[model.loss, *([] if grads else names)], scope=scope)
        grads = grads or {p: _dense(g) for p, g in zip(model.params, fetched)}
        losses.append(float(np.asarray(loss).reshape(-1)[0]))
    return losses, grads, {p: np.asarray(scope.get(p)) for p in model.params}


def _dense(value: Any) -> np.ndarray:
    return value.to_dense() if isinstance(value, SelectedRows) else np.asarray(value)


def assert_trains_as_torch(module: Any, ids_shape: tuple[int, ...]) -> Model:
    model = capture(module, ids_shape)
    data = batches(ids_shape)
    ours, theirs = pslab_run(model, data), torch_run(module, data)
    np.testing.assert_allclose(ours[0], theirs[0], rtol=RTOL, atol=ATOL, err_msg="losses")
    for what, mine, torchs in (("gradient", ours[1], theirs[1]), ("parameter", ours[2], theirs[2])):
        assert sorted(mine) == sorted(torchs)
        for name in mine:
            np.testing.assert_allclose(mine[name], torchs[name], rtol=RTOL, atol=ATOL,
                                       err_msg=f"{what} {name}")
    return model


@pytest.mark.parametrize("shape,lookup", [((), "lookup_table"), ((3,), "lookup_table"),
                                          ((1,), "lookup_table_v2")],
                         ids=["ids-N", "ids-NxL", "ids-Nx1"])
def test_every_activation_after_an_embedding_trains_as_torch_does(shape: tuple[int, ...],
                                                                   lookup: str) -> None:
    torch.manual_seed(0)
    module = torch_models.Activations(bag=shape[0] if shape else 0)
    model = assert_trains_as_torch(module, shape)
    ops = [op.type for op in model.main.global_block().ops]
    assert ops[0] == lookup
    assert {"gelu", "silu", "leaky_relu", "elu", "softplus", "brelu"} <= set(ops)
    table = model.main.global_block().ops[0]
    assert table.attr("padding_idx") == 0 and table.attr("is_sparse") is False
    assert table.attr("is_distributed") is False


def test_a_sparse_embedding_has_a_sparse_gradient_and_trains_as_torch_does() -> None:
    torch.manual_seed(1)
    model = assert_trains_as_torch(torch_models.Activations(sparse=True), ())
    assert model.main.global_block().ops[0].attr("is_sparse") is True


class Lookup(nn.Module):
    def __init__(self, **options: Any) -> None:
        super().__init__()
        self.emb, self.out = nn.Embedding(10, 4, **options), nn.Linear(4, 3)

    def forward(self, ids: Any) -> Any:
        return self.out(self.emb(ids))


@pytest.mark.parametrize("options,message", [
    ({"max_norm": 1.0}, "max_norm and scale_grad_by_freq are not supported"),
    ({"scale_grad_by_freq": True}, "max_norm and scale_grad_by_freq are not supported"),
])
def test_what_paddles_lookup_cannot_do_is_refused_naming_the_node(options: dict[str, Any],
                                                                   message: str) -> None:
    with pytest.raises(CaptureError, match=rf"^from_torch: node 'emb' \(call_module torch\.nn\."
                                           rf"modules\.sparse\.Embedding\): ValueError: {message}"):
        capture(Lookup(**options), ())


def test_a_padding_row_that_is_not_zero_is_refused() -> None:
    module = Lookup(padding_idx=2)
    with torch.no_grad():
        module.emb.weight[2] = 1.0
    with pytest.raises(CaptureError, match=r"row 2 of the weight, the padding_idx, is not zero"):
        capture(module, ())


def test_the_distributed_table_must_be_an_embedding_that_forward_reads() -> None:
    with pytest.raises(CaptureError, match=r"^from_torch: distributed_table 'out' is not an "
                                           r"nn\.Embedding of Lookup; its embeddings: \['emb'\]$"):
        capture(Lookup(), (), table="out")

    class Unused(Lookup):
        def forward(self, x: Any) -> Any:
            return self.out(x)

    with pytest.raises(CaptureError, match=r"distributed_table 'emb': forward never looks it up"):
        from_torch(Unused(), torch.zeros(2, 4), loss="mse", distributed_table="emb")


# -- the distributed lookup table ----------------------------------------------------------------
SCENARIO = """\
name: torch_table
seed: 3
model: {name: "torch_models:embedding_classifier", vocab: 60, dim: 8, distributed: true,
        optimizer: {type: sgd, learning_rate: 0.5}}
data: {batch_size: 16}
cluster: {pservers: 2, trainers: 2}
transpiler: {mode: sync}
train: {steps: 12, retry_after: 100ms}
expect: {params_equal_to: local, no_lost_updates: true}
"""


def test_a_distributed_table_is_split_over_the_pservers_and_the_trainers_prefetch(
        tmp_path: Path) -> None:
    (tmp_path / "table.yaml").write_text(SCENARIO)
    job = Job.from_scenario(load_scenario(tmp_path / "table.yaml"))
    lookup = next(op for op in job.model.main.global_block().ops if op.type == "lookup_table")
    assert lookup.attr("is_distributed") is True and lookup.attr("is_sparse") is True
    trainer = [op.type for op in job.trainer_programs(0)[0].global_block().ops]
    assert "prefetch" in trainer and "lookup_table" not in trainer
    shards = [job.pserver_programs(k)[0].global_block().var("emb.weight") for k in range(2)]
    assert [s.shape for s in shards] == [(30, 8), (30, 8)]


@pytest.mark.timeout(120)
def test_a_simulated_sync_job_with_a_distributed_table_trains_as_local_training(
        tmp_path: Path) -> None:
    (tmp_path / "table.yaml").write_text(SCENARIO)
    scenario = load_scenario(tmp_path / "table.yaml")
    result = simulate(scenario, base_dir=tmp_path, trace_messages=False, trace_spans=False)
    local_losses, local_params = train_locally(Job.from_scenario(scenario))
    # each trainer's loss is its half batch's mean; local training's the whole batch's
    both = np.mean([t.losses for t in result.trainers], axis=0)
    np.testing.assert_allclose(both, local_losses, rtol=RTOL, atol=ATOL)
    assert local_losses[-1] < local_losses[0]  # it learns, if slowly: 60 words to predict
    for name, value in local_params.items():
        np.testing.assert_allclose(result.params[name], value, rtol=RTOL, atol=ATOL, err_msg=name)
    assert all(p.steps == 12 and p.errors == 0 for p in result.pservers)
