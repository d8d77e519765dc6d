"""Parity with the original transpiler beyond its own unit tests (docs/transpiler.md): where
global-norm clipping runs, the trainer's checkpoint notices, LARS momentum, DC-ASGD's
temporaries, and the newer op and config variants."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from distribute_helpers import PS1, PS2, basic, pserver, trainer, transpile, types

import transpiler as T
from runtime.execution.executor import Executor
from runtime.execution.scope import Scope
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.checkpoint import MANIFEST
from runtime.services.cluster import LocalCluster, batches_for, train_locally
from runtime.services.job import Job
from transpiler.distribute import CheckpointConfig, append_checkpoint_notify

from cluster_helpers import FAST_DRAIN, assert_params_equal, make_job, simulate
from gradcheck import run_kernel

# -- 1. global-norm clipping stays on the trainer ---------------------------------------------

GLOBAL_NORM_TRAINER = [
    "mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant", "mean_grad",
    "square_grad", "elementwise_sub_grad", "elementwise_add_grad", "mul_grad",
    "squared_l2_norm", "squared_l2_norm", "sum", "sqrt", "fill_constant", "elementwise_max",
    "elementwise_div", "elementwise_mul", "send", "elementwise_mul", "split_byref", "send",
    "send_barrier", "recv", "recv", "fetch_barrier", "concat"]


def global_norm_sgd() -> Any:
    return T.optimizer.SGD(0.1, grad_clip=T.clip.GradientClipByGlobalNorm(1.0))


def test_global_norm_clipping_runs_on_the_trainer_before_the_sends() -> None:
    main, _ = trainer(transpile(basic(global_norm_sgd)))
    block = main.global_block()
    assert types(block) == GLOBAL_NORM_TRAINER
    clip = [op for op in block.ops if op.attrs.get("op_namescope") == "/@CLIP/global_norm/"]
    assert len(clip) == 9
    assert all(op.role == T.OpRole.Backward for op in clip)
    # each grad is sent as the clipped one: its send reads what its elementwise_mul wrote
    muls = [op for op in clip if op.type == "elementwise_mul"]
    assert [op.output("Out") for op in muls] == [["fc_b@GRAD.trainer_0"], ["fc_w@GRAD"]]
    assert block.ops[block.ops.index(muls[0]) + 1].input("X") == ["fc_b@GRAD.trainer_0"]
    assert block.ops[block.ops.index(muls[1]) + 1].input("X") == ["fc_w@GRAD"]


def test_global_norm_clipping_leaves_the_pservers_only_the_merge_and_update() -> None:
    t = transpile(basic(global_norm_sgd))
    ps1, _ = pserver(t, PS1)
    ps2, _ = pserver(t, PS2)
    # fc_w is sliced as without clipping: the trainer clips the whole grad
    assert [types(b) for b in ps1.blocks] == [["listen_and_serv"], ["sum", "scale", "sgd"],
                                              ["sum", "scale", "sgd"]]
    assert [types(b) for b in ps2.blocks] == [["listen_and_serv"], ["sum", "scale", "sgd"]]
    assert ps2.global_block().var("fc_w.block0").shape == (500, 1000)


def test_value_and_norm_clipping_still_run_on_the_pserver_after_the_merge() -> None:
    clip = T.clip.GradientClipByNorm(1.0)
    t = transpile(basic(lambda: T.optimizer.SGD(0.1, grad_clip=clip)))
    blocks = [types(b) for ep in (PS1, PS2) for b in pserver(t, ep)[0].blocks[1:]]
    # fc_w stays whole (a norm over a slice is not the grad's norm): one block per param
    assert blocks == [["sum", "scale", "clip_by_norm", "sgd"]] * 2
    main, _ = trainer(t)
    assert "clip_by_norm" not in types(main.global_block())


CLIPPED_MLP = ("{name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1, "
               "grad_clip: {type: global_norm, clip_norm: 0.05}}}")


def each_trainer_clipped(job: Job) -> dict[str, np.ndarray]:
    """What the original computes in sync mode: each trainer clips its own gradients by their
    global norm; the pservers average the clipped gradients and apply SGD. SGD is linear in
    the gradient, so that equals the mean of one local step per trainer from the same
    parameters."""
    model, exe, scope = job.model, Executor("numpy"), Scope()
    exe.run(model.startup, scope=scope)
    batches = [batches_for(job, k) for k in range(job.trainers)]
    for step in range(job.scenario.train.steps):
        start = {p: np.array(scope.get(p)) for p in model.params}
        after = []
        for batch in batches:
            for name, value in start.items():
                scope.set(name, value.copy())
            exe.run(model.main, feed=batch(step), scope=scope)
            after.append({p: np.array(scope.get(p)) for p in model.params})
        for name in model.params:
            scope.set(name, np.mean([a[name] for a in after], axis=0, dtype=np.float32))
    return {p: np.array(scope.get(p)) for p in model.params}


@pytest.mark.timeout(60)
def test_one_trainer_with_global_norm_clipping_equals_local_training() -> None:
    job = make_job(CLIPPED_MLP, trainers=1, pservers=2, steps=5, retry_after=FAST_DRAIN)
    _, local = train_locally(job)
    assert_params_equal(simulate(job), local)


@pytest.mark.timeout(60)
def test_two_trainers_clip_their_own_gradients_then_the_pservers_average() -> None:
    job = make_job(CLIPPED_MLP, trainers=2, pservers=2, steps=5, retry_after=FAST_DRAIN)
    params = simulate(job)
    assert_params_equal(params, each_trainer_clipped(job))
    # the clipping bites: clipping the global batch's gradient instead gives other numbers
    _, local = train_locally(job)
    assert any(not np.allclose(params[n], v, rtol=1e-4, atol=1e-5) for n, v in local.items())


# -- 2. trainer 0 notifies the pservers to checkpoint --------------------------------------------

def test_trainer_0_ends_each_step_with_a_checkpoint_notify_every_n_steps() -> None:
    chief, chief_startup = trainer(transpile(basic()))
    append_checkpoint_notify(chief, chief_startup, CheckpointConfig("/ckpt", step_interval=3))
    assert types(chief.global_block())[-4:] == ["increment", "less_than", "logical_not",
                                                "conditional_block"]
    sub = chief.block(chief.global_block().ops[-1].attr("sub_block").idx)
    assert types(sub) == ["fill_constant", "checkpoint_notify"]
    notify = sub.ops[1]
    assert (notify.attr("epmap"), notify.attr("dir"), notify.attr("lookup_table")) == \
        ([PS1, PS2], "/ckpt", "")
    limit = [op for op in chief_startup.global_block().ops
             if op.output("Out") == ["@CHECKPOINT_STEP@@K"]]
    assert [op.attr("value") for op in limit] == [3.0]
    T.verify(chief)
    other, other_startup = trainer(transpile(basic(), trainer_id=1))
    before = types(other.global_block())
    append_checkpoint_notify(other, other_startup, CheckpointConfig("/ckpt", 3))
    assert types(other.global_block()) == before and other.num_blocks == 1


def test_checkpoint_config_refuses_a_bad_interval() -> None:
    with pytest.raises(ValueError, match="step_interval"):
        CheckpointConfig("/ckpt", 0)


@pytest.mark.timeout(60)
def test_trainer_0s_notices_are_the_jobs_checkpoints(tmp_path: Path) -> None:
    """``checkpoint_by: trainer``: the pservers take no checkpoints of their own; trainer 0's
    notices every 4 steps save them (the last after step 8 of 10, holding 8 steps) and the
    job trains as without them."""
    model = "{name: mlp, sizes: [32, 16, 4], optimizer: {type: sgd, learning_rate: 0.1}}"
    # the default retry_after (1 s): a notice resent sooner (its save slow on a busy machine)
    # would count twice in messages_by_kind, which counts retries
    job = make_job(model, trainers=2, pservers=2, steps=10)
    train = job.scenario.train.model_copy(update={"checkpoint_every": 4,
                                                   "checkpoint_by": "trainer"})
    job = Job(job.scenario.model_copy(update={"train": train}), job.args)
    result = asyncio.run(LocalCluster(job, ZmqTransport, checkpoint_dir=tmp_path).run())
    assert all(s.checkpoints == [] for s in result.pservers)
    assert [s.messages_by_kind.get("checkpoint_notify") for s in result.pservers] == [2, 2]
    for j in range(2):
        manifest = json.loads((tmp_path / f"pserver:{j}" / MANIFEST).read_text())
        assert manifest["step"] == 8
    _, local = train_locally(job)
    assert_params_equal(result.params, local)


# -- 3. LARS momentum ------------------------------------------------------------------------------

def lars_reference(p: np.ndarray, g: np.ndarray, v: np.ndarray, lr: float, mu: float,
                   coeff: float, decay: float) -> tuple[np.ndarray, np.ndarray]:
    """Paddle's formula in float64, written out element by element."""
    p_norm = sum(float(x) ** 2 for x in p.flat) ** 0.5
    g_norm = sum(float(x) ** 2 for x in g.flat) ** 0.5
    local = lr * coeff * p_norm / (g_norm + decay * p_norm) if p_norm > 0 and g_norm > 0 else lr
    v_out = np.array([mu * a + local * (b + decay * c) for a, b, c in zip(v.flat, g.flat, p.flat)])
    return (p.reshape(-1) - v_out).reshape(p.shape), v_out.reshape(p.shape)


@pytest.mark.parametrize("backend", ["numpy", "torch"])
@pytest.mark.parametrize("case", ["random", "zero_param", "zero_grad"])
def test_lars_momentum_matches_the_formula(backend: str, case: str) -> None:
    pytest.importorskip("torch") if backend == "torch" else None
    rng = np.random.default_rng(7)
    p, g, v = (rng.standard_normal((4, 3)) for _ in range(3))
    if case == "zero_param":
        p = np.zeros_like(p)
    if case == "zero_grad":
        g = np.zeros_like(g)
    attrs = {"mu": 0.9, "lars_coeff": 0.001, "lars_weight_decay": 0.0005}
    out = run_kernel(backend, "lars_momentum",
                     {"Param": p, "Grad": g, "Velocity": v, "LearningRate": np.array([0.5])},
                     {"ParamOut": 1, "VelocityOut": 1}, attrs)
    want_p, want_v = lars_reference(p, g, v, 0.5, 0.9, 0.001, 0.0005)
    assert np.all(np.isfinite(out["ParamOut"][0])) and np.all(np.isfinite(out["VelocityOut"][0]))
    np.testing.assert_allclose(out["ParamOut"][0], want_p, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(out["VelocityOut"][0], want_v, rtol=1e-12, atol=1e-14)


def lars() -> Any:
    return T.optimizer.LarsMomentum(0.1, momentum=0.9, lars_coeff=0.01)


def test_lars_momentum_runs_on_the_pserver_with_the_param_whole() -> None:
    t = transpile(basic(lars))
    main, _ = trainer(t)
    assert "lars_momentum" not in types(main.global_block())
    assert "split_byref" not in types(main.global_block())  # the norms need the whole fc_w
    blocks = [b for ep in (PS1, PS2) for b in pserver(t, ep)[0].blocks[1:]]
    assert [types(b) for b in blocks] == [["sum", "scale", "lars_momentum"]] * 2
    op = next(op for b in blocks for op in b.ops if op.input("Param") == ["fc_w"])
    assert (op.attr("mu"), op.attr("lars_coeff"), op.attr("lars_weight_decay")) == \
        (0.9, 0.01, 0.0005)
    assert op.input("Velocity") == op.output("VelocityOut")


def test_lars_momentum_refuses_the_distributed_table() -> None:
    from distribute_helpers import lookup_model
    with pytest.raises(ValueError, match="lars_momentum"):
        transpile(lookup_model(is_distributed=True, opt=lars))


@pytest.mark.timeout(60)
def test_lars_momentum_2x2_sync_equals_local_training() -> None:
    model = ("{name: mlp, sizes: [64, 32, 10], optimizer: {type: lars_momentum, "
             "learning_rate: 0.5, lars_coeff: 0.01}}")
    job = make_job(model, trainers=2, pservers=2, steps=5, retry_after=FAST_DRAIN)
    _, local = train_locally(job)
    assert_params_equal(simulate(job), local)


# -- 4. DC-ASGD's temporaries live in the optimize block ----------------------------------------

def test_dc_asgd_temporaries_are_the_optimize_blocks_own() -> None:
    t = transpile(basic(), T.DistributeTranspilerConfig(enable_dc_asgd=True), sync_mode=False)
    for ep in (PS1, PS2):
        ps, _ = pserver(t, ep)
        assert not [n for n in ps.global_block().vars if "@DC_ASGD" in n]
        for block in ps.blocks[1:]:
            (param,) = next(op for op in block.ops if op.type == "sgd").input("Param")
            assert sorted(block.vars) == [f"{param}@DC_ASGD.tmp_{i}" for i in range(5)]
            assert not any(v.persistable for v in block.vars.values())


def test_a_sub_blocks_own_vars_are_gone_after_it_ran() -> None:
    from transpiler.ir import Program
    program = Program()
    outer = program.global_block()
    outer.create_var("x", shape=(1,), dtype="float32", persistable=True)
    sub = program.create_block(0)
    sub.create_var("tmp", shape=(1,), dtype="float32")
    sub.append_op("scale", {"X": ["x"]}, {"Out": ["tmp"]}, {"scale": 2.0})
    sub.append_op("scale", {"X": ["tmp"]}, {"Out": ["x"]}, {"scale": 3.0})
    scope = Scope()
    scope.set("x", np.array([1.0], np.float32))
    Executor("numpy").run_block(program, sub.idx, scope)
    assert scope.get("x").tolist() == [6.0] and not scope.has("tmp")


@pytest.mark.timeout(60)
def test_dc_asgd_still_trains_the_same_over_the_simulator() -> None:
    """One trainer: DC-ASGD's compensation is g + g*g*(w - w_bak), and the bak is the param it
    fetched, so the run is async SGD exactly: local training."""
    model = "{name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}"
    job = make_job(model, trainers=1, pservers=2, steps=5, mode="async",
                   transpiler="dc_asgd: true", retry_after=FAST_DRAIN)
    _, local = train_locally(job)
    assert_params_equal(simulate(job), local)
