"""Each pass of the pipeline on its own, with `verify` after every program-producing step, and
the properties the pipeline as a whole promises (determinism, round trips, placement)."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from distribute_helpers import (PS1, PS2, PSERVERS, basic, config, listen, lookup_model,
                                pserver, trainer, transpile, types)

import transpiler as T
from transpiler.distribute.analysis import read_optimize_section
from transpiler.distribute.cluster import pserver_cluster
from transpiler.distribute.config import DistributedMode
from transpiler.distribute.plan import Plan, slice_pass
from transpiler.distribute.seeded import numpy_legacy_shuffle
from transpiler.distribute.pserver import build_pserver_program, placed_vars
from transpiler.distribute.startup import build_pserver_startup, build_trainer_startup
from transpiler.distribute.trainer import (append_send_barrier, insert_grad_sends,
                                           recv_and_merge, strip_optimize_ops)
from transpiler.distribute.transpiler import make_plan
from transpiler.ir import OpRole, Program, dumps_json, dumps_msgpack, loads_json, loads_msgpack


def plan_of(programs: tuple[Program, Program], cfg: T.DistributeTranspilerConfig | None = None,
            mode: DistributedMode = DistributedMode.SYNC, pservers: str = PSERVERS) -> Plan:
    main, startup = programs
    return make_plan(cfg or config(), pserver_cluster(0, pservers, 2, PS1), mode, main, startup)


def test_read_optimize_section() -> None:
    main, _ = basic(lambda: T.optimizer.Adam(T.lr.exponential_decay(1.0, 10, 0.5)))
    section = read_optimize_section(main)
    assert [(pg.param, pg.grad) for pg in section.params_grads] == [
        ("fc_b", "fc_b@GRAD"), ("fc_w", "fc_w@GRAD")]
    assert [op.type for op in section.ops_of("fc_w")] == ["adam", "scale", "scale"]
    assert section.optimizer_op("fc_b").type == "adam"
    assert section.lr_ops[0].type == "increment" and len(section.lr_ops) == 8


def test_slice_pass_cuts_pairs_and_skips_excluded() -> None:
    main, _ = basic()
    section = read_optimize_section(main)
    sliced = slice_pass(main, section, config(), 2, exclude=set())
    assert [(s.pair.param, [str(b) for b in s.blocks]) for s in sliced] == [
        ("fc_b", ["fc_b:0:1000"]), ("fc_w", ["fc_w:0:500000", "fc_w:1:500000"])]
    assert [s.pair.param for s in slice_pass(main, section, config(), 2, {"fc_w"})] == ["fc_b"]
    assert all(len(s.blocks) == 1 for s in slice_pass(main, section, config(slice_var_up=False), 2, set()))


def test_dispatch_pass_places_grad_and_param_blocks_together() -> None:
    plan = plan_of(basic())
    (fc_b, fc_w) = plan.dist_vars
    assert [(p.name, p.endpoint) for p in fc_w.params] == [("fc_w.block0", PS2), ("fc_w.block1", PS1)]
    assert [(g.name, g.endpoint) for g in fc_w.grads] == [("fc_w@GRAD.block0", PS2),
                                                          ("fc_w@GRAD.block1", PS1)]
    assert [p.row_offset for p in fc_w.params] == [0, 500]
    assert fc_b.params[0].endpoint == PS1 and not fc_b.is_split
    assert plan.on(PS1) == [(fc_b, 0), (fc_w, 1)]


def eight_fcs() -> tuple[Program, Program]:
    def body() -> None:
        x = T.layers.data("x", shape=[4])
        h = x
        for _ in range(8):
            h = T.layers.fc(h, size=4)
        T.optimizer.SGD(0.1).minimize(T.layers.mean(h))
    from distribute_helpers import build
    return build(body)


def test_unsliced_dispatch_is_shuffled_as_the_original_did() -> None:
    """``np.random.seed(program.random_seed); np.random.shuffle(pairs)``: same seed, same
    placement as the original's."""
    main, startup = eight_fcs()
    in_program_order = [pair.param for pair in read_optimize_section(main).params_grads]

    def placed(seed: int) -> list[str]:
        main.random_seed = seed
        return [d.param for d in plan_of((main, startup), config(slice_var_up=False)).dist_vars]

    for seed in (0, 1, 2, 7):
        expected = list(in_program_order)
        np.random.seed(seed)
        np.random.shuffle(expected)
        assert placed(seed) == expected
    assert placed(1) != placed(2)


@pytest.mark.parametrize("seed", [0, 1, 7, 90210, 2**32 - 1])
@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 300])
def test_the_shuffle_is_numpys_legacy_shuffle(seed: int, n: int) -> None:
    expected = list(range(n))
    np.random.seed(seed)
    np.random.shuffle(expected)
    items = list(range(n))
    numpy_legacy_shuffle(items, seed)
    assert items == expected


def test_a_seed_numpy_cannot_take_is_refused() -> None:
    with pytest.raises(ValueError, match=r"numpy legacy seed is in \[0, 2\*\*32\), got -1"):
        numpy_legacy_shuffle([1, 2], -1)


def test_round_robin_balances_blocks() -> None:
    eps = ",".join(f"127.0.0.1:{7000 + i}" for i in range(5))
    plan = plan_of(lookup_model(), pservers=eps)
    counts = Counter(p.endpoint for d in plan.dist_vars for p in d.params)
    assert max(counts.values()) - min(counts.values()) <= 1


def test_trainer_steps_each_leave_a_valid_program() -> None:
    plan = plan_of(basic(lambda: T.optimizer.SGD(T.lr.piecewise_decay([5], [1.0, 0.5]),
                                                 grad_clip=T.clip.GradientClipByValue(1.0))))
    program = plan.origin.clone()
    strip_optimize_ops(program)
    T.verify(program)
    block = program.global_block()
    assert program.num_blocks == 1  # the LR switch's sub-blocks went with the LR ops
    assert not any(op.role & (OpRole.Optimize | OpRole.LRSched) for op in block.ops)
    assert not block.has_var("learning_rate") and block.has_var("fc_w")
    sends = insert_grad_sends(block, plan)
    T.verify(program)
    barrier = append_send_barrier(block, plan, list(sends.values()))
    T.verify(program)
    recv_and_merge(block, plan, sends, barrier, plan.in_param_order())
    T.verify(program)
    assert types(block)[-5:] == ["send_barrier", "recv", "recv", "fetch_barrier", "concat"]


def test_pserver_and_startup_builders_alone() -> None:
    plan = plan_of(basic(lambda: T.optimizer.Adam(0.1)))
    for ep in (PS1, PS2):
        main = build_pserver_program(plan, ep)
        T.verify(main)
        startup = build_pserver_startup(plan, ep, main)
        T.verify(startup)
        held = {v for v in main.global_block().vars}
        assert all(set(op.output_arg_names) <= held for op in startup.global_block().ops)
    trainer_startup = build_trainer_startup(plan, plan.in_param_order(), lr_counter=False)
    T.verify(trainer_startup)


def test_placed_vars_partition_every_param_and_accumulator() -> None:
    plan = plan_of(basic(lambda: T.optimizer.Adam(0.1)))
    placed = [pv for ep in (PS1, PS2) for pv in placed_vars(plan, ep)]
    fc_w = sorted((pv.row_offset, pv.shape) for pv in placed if pv.origin == "fc_w")
    assert fc_w == [(0, (500, 1000)), (500, (500, 1000))]
    moments = sorted((pv.endpoint, pv.shape) for pv in placed if pv.origin == "moment1_1")
    assert moments == [(PS1, (500, 1000)), (PS2, (500, 1000))]
    assert {pv.shape for pv in placed if pv.origin == "beta1_pow_acc_1"} == {(1,)}


def test_several_blocks_of_a_param_on_one_server_get_their_own_accumulators() -> None:
    # HashName puts both blocks of "big" on ps1 (a stable, tested fact of its hash)
    model = basic(lambda: T.optimizer.Adam(0.1), w_attr=T.ParamAttr(name="big"))
    t = transpile(model, config(split_method=T.HashName))
    ps1, startup = pserver(t, PS1)
    adams = [op for b in ps1.blocks for op in b.ops if op.type == "adam"
             and op.input("Param")[0].startswith("big")]
    assert [(op.input("Param"), op.input("Moment1"), op.input("Beta1Pow")) for op in adams] == [
        (["big.block0"], ["moment1_0.block0"], ["beta1_pow_acc_0.block0"]),
        (["big.block1"], ["moment1_0.block1"], ["beta1_pow_acc_0.block1"])]  # "big" < "fc_b"
    inits = {op.output("Out")[0]: op.attr("shape") for op in startup.global_block().ops}
    assert inits["moment1_0.block1"] == [500, 1000] and inits["beta1_pow_acc_0.block0"] == [1]
    assert inits["big.block0"] == [500, 1000]


def test_norm_clipped_params_stay_whole() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(0.1, grad_clip=T.clip.GradientClipByNorm(1.0))))
    main, _ = trainer(t)
    assert "split_byref" not in types(main.global_block())
    holders = [ep for ep in (PS1, PS2) if pserver(t, ep)[0].global_block().has_var("fc_w")]
    assert len(holders) == 1


def test_regularization_temporaries_are_sliced_on_the_pserver() -> None:
    t = transpile(basic(lambda: T.optimizer.SGD(0.1, regularization=T.regularizer.L1Decay(0.1))))
    ps1, _ = pserver(t, PS1)
    block = ps1.block(2)
    assert types(block) == ["sum", "scale", "sign", "scale", "sum", "sgd"]
    sign_out = block.ops[2].output("Out")[0]
    assert ps1.global_block().var(sign_out).shape == (500, 1000)


@pytest.mark.parametrize("build,cfg,sync", [
    (basic, None, True), (lookup_model, None, False),
    (lambda: lookup_model(is_distributed=True), None, True),
    (lambda: basic(lambda: T.optimizer.Momentum(T.lr.piecewise_decay([3], [1.0, 0.1]))), None, False),
    (basic, config(geo_sgd_mode=True), False),
])
def test_transpiling_twice_gives_identical_programs(build, cfg, sync) -> None:  # type: ignore[no-untyped-def]
    def programs() -> list[Program]:
        t = transpile(build(), cfg, sync_mode=sync)
        return [t.get_trainer_program(), t.get_trainer_startup_program(),
                *t.get_pserver_programs(PS1), *t.get_pserver_programs(PS2)]
    first, second = programs(), programs()
    assert first == second
    t = transpile(build(), cfg, sync_mode=sync)
    assert t.get_pserver_program(PS2) == t.get_pserver_program(PS2)


def test_programs_round_trip_through_json_and_msgpack() -> None:
    t = transpile(lookup_model(is_distributed=True), sync_mode=False)
    for program in (t.get_trainer_program(), *t.get_pserver_programs(PS1)):
        assert loads_json(dumps_json(program)) == program
        assert loads_msgpack(dumps_msgpack(program)) == program


def test_every_grad_block_sent_is_consumed_by_one_block_where_it_is_sent() -> None:
    models = [(basic(), True), (lookup_model(), True), (lookup_model(), False),
              (lookup_model(is_distributed=True), True), (lookup_model(is_distributed=True), False)]
    for model, sync in models:
        t = transpile(model, sync_mode=sync)
        main, _ = trainer(t)
        sent = [(name, ep) for op in main.global_block().ops if op.type == "send"
                for name, ep in zip(op.input("X"), op.attr("epmap"))]
        assert sent
        for name, ep in sent:
            serve = listen(pserver(t, ep)[0])
            merged = name.split(".trainer_")[0]
            assert name in serve.input("X")
            assert len([e for e in serve.attr("grad_to_block_id")
                        if e.rsplit(":", 1)[0] == merged]) == 1


def test_per_parameter_learning_rate_scale_moves_with_its_parameter() -> None:
    w_attr = T.ParamAttr(name="fc_w", learning_rate=0.5)
    t = transpile(basic(w_attr=w_attr))
    ps1, _ = pserver(t, PS1)
    assert types(ps1.block(2)) == ["sum", "scale", "scale", "sgd"]
    lr_scale, sgd = ps1.block(2).ops[2], ps1.block(2).ops[3]
    assert lr_scale.attr("scale") == 0.5 and lr_scale.input("X") == ["learning_rate_0"]
    assert sgd.input("LearningRate") == lr_scale.output("Out")


def test_many_trainers_merge_every_copy() -> None:
    t = transpile(basic(), trainers=5, trainer_id=3)
    ps1, _ = pserver(t, PS1)
    merge, scale = ps1.block(1).ops[:2]
    assert merge.input("X") == [f"fc_b@GRAD.trainer_{i}" for i in range(5)]
    assert scale.attr("scale") == pytest.approx(0.2)
    assert listen(ps1).attr("Fanin") == 5


def test_program_attributes_describe_the_placement() -> None:
    t = transpile(lookup_model(is_distributed=True))
    main = t.get_trainer_program(wait_port=False)
    assert main.attrs["_wait_port"] is False and t.get_trainer_program().attrs["_wait_port"] is True
    placed = main.attrs["_parameters_on_pservers"]
    table = [p for p in placed if p["kind"] == "Table"]
    assert [(p["endpoint"], p["row_offset"], p["shape"]) for p in table] == [
        (PS1, 0, [500, 64]), (PS2, 500, [500, 64])]
    assert {p["origin"] for p in placed if p["kind"] == "Param"} == {"fc_b", "fc_w"}
    assert {p["origin"] for p in placed if p["kind"] == "Optimizer"} >= {"moment1_0", "moment2_1"}
    ps2, _ = pserver(t, PS2)
    assert ps2.attrs["_ps_endpoint"] == PS2
    assert {p["endpoint"] for p in ps2.attrs["_parameters_on_pservers"]} == {PS2}


def test_geo_programs_describe_only_parameters() -> None:
    t = transpile(basic(lambda: T.optimizer.Adam(0.1)), config(geo_sgd_mode=True))
    main, _ = trainer(t)
    assert main.attrs["_distributed_mode"] == T.DistributedMode.GEO == 3
    assert {p["kind"] for p in main.attrs["_parameters_on_pservers"]} == {"Param"}


def test_the_trainer_startup_keeps_the_dense_accumulators() -> None:
    """The pservers hold the accumulators; the trainer's startup still initializes those of
    the dense parameters, in the 1.2 programs as in the 1.8 ones (1.2's transpiler took no op
    out of it but the distributed table's initializer), and the learning rate's."""
    def writers(program: Program, names: set[str]) -> list[str]:
        return [op.type for op in program.global_block().ops if names & set(op.output_arg_names)]

    model = basic(lambda: T.optimizer.Adam(0.1))
    adam = [op for op in read_optimize_section(model[0]).ops if op.type == "adam"]
    state = {name for op in adam for slot in ("Moment1", "Moment2", "Beta1Pow", "Beta2Pow")
             for name in op.input(slot)}
    assert len(state) == 8 and writers(model[1], state)  # fc_w and fc_b: 4 accumulators each
    lr = {name for op in adam for name in op.input("LearningRate")}
    for version in ("1.8", "1.2"):
        t = transpile(model, config(paddle_version=version))
        _, startup = trainer(t)
        assert writers(startup, state) == ["fill_constant"] * 8, version
        assert writers(startup, lr) == ["fill_constant"]
        held = {name.split(".block")[0] for ep in PSERVERS.split(",")
                for name in pserver(t, ep)[1].global_block().vars}
        assert state <= held


def test_print_log_prints_the_pairs_and_the_placement(capsys: pytest.CaptureFixture[str]) -> None:
    transpile(basic(), config(print_log=True))
    lines = capsys.readouterr().out.splitlines()
    assert "adding param_grad pair: fc_w fc_w@GRAD" in lines
    assert "adding param_grad pair: fc_b fc_b@GRAD" in lines
    assert f"fc_w.block0 (500, 1000) -> {PS1}" in lines or f"fc_w.block0 (500, 1000) -> {PS2}" in lines
    transpile(basic())
    assert capsys.readouterr().out == ""
