"""The op catalog agrees with what registers per op: every kernel backend, the shape and cost
rules, the front end's optimizer classes, the scenario schema; and the programs the front end and
the distribute transpiler write use only the slots the catalog lists."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from distribute_helpers import PSERVERS, config
from pydantic import ValidationError

import transpiler as T
from runtime.config.scenario import OptimizerSpec
from runtime.execution.kernels import registered_ops
from runtime.execution.kernels.phantom import SHAPE_RULES
from sim.cost import COST_RULES
from transpiler.distribute.analysis import OPTIMIZER_TYPES
from transpiler.distribute.lookup_table import TABLE_OPTIMIZERS
from transpiler.ir import Op, Program
from transpiler.models import MODELS, build_model
from transpiler.opcatalog import OPS, OpDef, op_def, optimizer_types

KERNEL_OPS = sorted(t for t, op in OPS.items() if op.runs == "kernel")
RUNNABLE_OPTIMIZERS = ("sgd", "momentum", "adam", "adagrad", "decayed_adagrad", "adamax",
                       "rmsprop", "ftrl", "lars_momentum")


# -- kernels, rules, lists ------------------------------------------------------------------------

@pytest.mark.parametrize("backend", ["numpy", "phantom", "torch"])
def test_every_backend_has_a_kernel_for_exactly_the_catalog_kernel_ops(backend: str) -> None:
    if backend == "torch":
        pytest.importorskip("torch")
    assert registered_ops(backend) == KERNEL_OPS


def test_every_shape_and_cost_rule_is_named_by_some_entry() -> None:
    assert {op.shape for op in OPS.values() if op.runs == "kernel"} == set(SHAPE_RULES)
    assert {op.cost.rule for op in OPS.values() if op.cost is not None} == set(COST_RULES)


def test_ops_that_run_nowhere_have_no_shape_rule_and_rpc_ops_no_cost() -> None:
    for op in OPS.values():
        if op.runs != "kernel":
            assert op.shape is None and op.cost is None, op.type


def test_the_optimizer_lists_are_the_catalogs() -> None:
    assert optimizer_types("kernel") == RUNNABLE_OPTIMIZERS
    assert tuple(T.optimizer.OPTIMIZERS) == RUNNABLE_OPTIMIZERS
    assert OPTIMIZER_TYPES == frozenset(RUNNABLE_OPTIMIZERS)
    assert TABLE_OPTIMIZERS == OPTIMIZER_TYPES - {"ftrl", "lars_momentum"}


def test_the_scenario_takes_every_runnable_optimizer_and_names_them_when_refusing() -> None:
    for name in RUNNABLE_OPTIMIZERS:
        assert OptimizerSpec(type=name).type == name
    with pytest.raises(ValidationError) as err:
        OptimizerSpec(type="lamb")
    assert ("Input should be 'sgd', 'momentum', 'adam', 'adagrad', 'decayed_adagrad', 'adamax', "
            "'rmsprop', 'ftrl' or 'lars_momentum'") in str(err.value)


def test_a_grad_entry_follows_the_default_grad_op_maker() -> None:
    assert op_def("softmax_with_cross_entropy").grad_type == "softmax_with_cross_entropy_grad"
    grad = op_def("softmax_with_cross_entropy_grad")
    assert grad.inputs == ("Logits", "Label", "Softmax", "Loss", "Softmax@GRAD", "Loss@GRAD")
    assert grad.outputs == ("Logits@GRAD",)
    assert (grad.grad, grad.shape, grad.cost) == ((), "gradient", op_def("softmax").cost)
    assert op_def("lookup_table_grad").shape == "lookup_grad"
    assert op_def("sum").grad_type == "sum_grad" and op_def("sum_grad").cost is None
    assert op_def("less_than").grad_type is None


def test_a_grad_op_named_otherwise_by_the_original_keeps_its_name() -> None:
    """fluid 1.8's cross_entropy2 has the grad op cross_entropy_grad2, which autodiff writes."""
    assert op_def("cross_entropy2").grad_type == "cross_entropy_grad2"
    assert "cross_entropy2_grad" not in OPS
    grad = op_def("cross_entropy_grad2")
    assert grad.inputs == ("X", "Label", "Y", "MatchX", "Y@GRAD", "MatchX@GRAD")
    assert (grad.outputs, grad.grad_type) == (("X@GRAD",), None)
    main, startup = Program(), Program()
    with T.program_guard(main, startup):
        p = T.layers.fc(T.layers.data("x", shape=[4]), size=3, act="softmax")
        T.append_backward(T.layers.mean(T.layers.cross_entropy(p, T.layers.data(
            "y", shape=[1], dtype="int64"))))
    assert [op.type for op in main.global_block().ops if "cross_entropy" in op.type] == \
        ["cross_entropy2", "cross_entropy_grad2"]


def test_an_optimizer_entry_lists_its_state_slots() -> None:
    adam = op_def("adam")
    assert adam.inputs == ("Param", "Grad", "LearningRate", "Moment1", "Moment2", "Beta1Pow",
                           "Beta2Pow")
    assert adam.outputs == ("ParamOut", "Moment1Out", "Moment2Out")
    assert adam.update is not None
    assert adam.update.scalar_slots == ("Grad", "LearningRate", "Beta1Pow", "Beta2Pow")
    assert [op.type for op in OPS.values() if op.update and op.update.sparse_rows] == ["sgd"]


def test_an_unknown_op_type_is_named() -> None:
    with pytest.raises(KeyError, match="'frobnicate' is not in the op catalog"):
        op_def("frobnicate")


# -- slots of the programs written ----------------------------------------------------------------

def _programs() -> Iterator[tuple[str, Program]]:
    """Every model with every optimizer; with sgd, its pserver-mode trainer and pserver programs
    (sync, async, geo) and its nccl2 and collective trainer programs, startups included."""
    for name in MODELS:
        for opt in RUNNABLE_OPTIMIZERS:
            model = build_model(name, optimizer={"type": opt, "learning_rate": 0.1})
            yield f"{name}/{opt}", model.main
            yield f"{name}/{opt} startup", model.startup
        for label, cfg, sync in (("sync", config(), True), ("async", config(), False),
                                 ("geo", config(geo_sgd_mode=True), False),
                                 ("nccl2", config(mode="nccl2"), True),
                                 ("allreduce", config(mode="collective",
                                                      collective_mode="grad_allreduce"), True),
                                 ("local_sgd", config(mode="collective",
                                                      collective_mode="local_sgd"), True),
                                 ("single_process", config(
                                     mode="collective",
                                     collective_mode="single_process_multi_thread"), True)):
            model = build_model(name)
            t = T.DistributeTranspiler(cfg)
            collective = cfg.mode != "pserver"
            t.transpile(0, program=model.main, pservers=PSERVERS, trainers=PSERVERS if collective
                        else 2, sync_mode=sync, startup_program=model.startup,
                        current_endpoint=PSERVERS.split(",")[0], in_place=False)
            yield f"{name} {label} trainer", t.get_trainer_program()
            yield f"{name} {label} trainer startup", t.get_trainer_startup_program()
            if not collective:
                for k, program in enumerate(t.get_pserver_programs(PSERVERS.split(",")[0])):
                    yield f"{name} {label} pserver {k}", program


def _unlisted(op: Op, entry: OpDef) -> list[str]:
    return sorted((set(op.inputs) - set(entry.inputs)) | (set(op.outputs) - set(entry.outputs)))


def test_the_programs_written_use_only_catalog_ops_and_slots() -> None:
    seen: set[str] = set()
    for where, program in _programs():
        for block in program.blocks:
            for op in block.ops:
                assert op.type in OPS, f"{where}: op {op.type!r} is not in the catalog"
                assert not _unlisted(op, OPS[op.type]), \
                    f"{where}: {op.type} has slots {_unlisted(op, OPS[op.type])} the catalog lacks"
                seen.add(op.type)
    assert {"mul_grad", "lookup_table_grad", "adam", "send", "listen_and_serv",
            "c_allreduce_sum", "gen_nccl_id", "c_comm_init_all", "conditional_block",
            "sparse_delta"} <= seen
