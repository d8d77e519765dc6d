"""A trainer does not run the initializers of what it never reads: the 1.8 programs keep the
dense parameters' optimizer accumulators in its startup, which the pservers update."""

from __future__ import annotations

from distribute_helpers import basic, config, trainer, transpile

import transpiler as T
from runtime.services.trainer import without_unread_state
from transpiler.distribute.analysis import read_optimize_section
from transpiler.ir import Program


def _written(program: Program) -> set[str]:
    return {name for op in program.global_block().ops for name in op.output_arg_names}


def test_the_accumulators_the_pservers_hold_are_not_initialized_on_a_trainer() -> None:
    model = basic(lambda: T.optimizer.Adam(0.1))
    state = {name for op in read_optimize_section(model[0]).ops if op.type == "adam"
             for slot in ("Moment1", "Moment2", "Beta1Pow", "Beta2Pow") for name in op.input(slot)}
    main, startup = trainer(transpile(model))
    assert state <= _written(startup)  # the program, as the 1.8 transpiler wrote it
    run = without_unread_state(startup, main)
    assert not state & _written(run)
    assert state <= _written(startup), "the transpiled program itself is left as it is"
    assert [op.type for op in run.global_block().ops if op.type in ("recv", "fetch_barrier")] \
        == [op.type for op in startup.global_block().ops if op.type in ("recv", "fetch_barrier")]
    read = {name for op in main.global_block().ops for name in op.input_arg_names}
    assert {"fc_w", "fc_b"} <= read & _written(run)  # what the steps read is still initialized


def test_a_trainer_that_optimizes_itself_keeps_its_accumulators() -> None:
    model = basic(lambda: T.optimizer.Adam(0.1))
    state = {name for op in read_optimize_section(model[0]).ops if op.type == "adam"
             for slot in ("Moment1", "Moment2") for name in op.input(slot)}
    main, startup = trainer(transpile(model, config(geo_sgd_mode=True)))
    assert state <= _written(without_unread_state(startup, main))
