"""Configuration and argument checks: bad input fails early, with a ValueError naming it."""

from __future__ import annotations

import pytest
from distribute_helpers import PS1, PSERVERS, basic, config, lookup_model, transpile

import transpiler as T
from transpiler.distribute.config import resolve_mode

Mode = T.DistributedMode


def test_defaults_are_the_originals() -> None:
    c = T.DistributeTranspilerConfig()
    assert (c.slice_var_up, c.split_method, c.min_block_size, c.enable_dc_asgd, c.mode) == \
        (True, T.RoundRobin, 8192, False, "pserver")
    assert (c.sync_mode, c.runtime_split_send_recv, c.half_async, c.completely_not_async) == \
        (True, False, False, False)
    assert (c.geo_sgd_mode, c.geo_sgd_need_push_nums, c.nccl_comm_num) == (False, 100, 1)
    assert (c.use_hierarchical_allreduce, c.hierarchical_allreduce_inter_nranks) == (False, 0)
    assert (c.collective_mode, c.print_log, c.wait_port) == (None, False, True)


def test_sync_mode_and_runtime_split_exclude_each_other() -> None:
    c = T.DistributeTranspilerConfig()
    with pytest.raises(ValueError, match="runtime_split_send_recv"):
        c.runtime_split_send_recv = True
    c.sync_mode = False
    c.runtime_split_send_recv = True
    with pytest.raises(ValueError, match="sync_mode"):
        c.sync_mode = True
    with pytest.raises(ValueError, match="sync_mode"):
        c.sync_mode = None  # type: ignore[assignment]


@pytest.mark.parametrize("field,value", [
    ("min_block_size", 4096), ("min_block_size", 8192.0), ("split_method", object),
    ("split_method", T.PSDispatcher), ("mode", "ring"), ("collective_mode", "allgather"),
    ("slice_var_up", 1), ("geo_sgd_need_push_nums", 0), ("nccl_comm_num", 0),
    ("local_sgd_k_steps", 0), ("hierarchical_allreduce_inter_nranks", -1),
])
def test_bad_field_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        T.DistributeTranspilerConfig(**{field: value})


def test_unknown_field() -> None:
    with pytest.raises(ValueError, match="unknown field 'slice_vars_up'"):
        T.DistributeTranspilerConfig(slice_vars_up=False)


@pytest.mark.parametrize("fields,culprit", [
    ({"collective_mode": "local_sgd"}, "collective_mode"),
    ({"mode": "collective"}, "collective_mode"),
    ({"geo_sgd_mode": True, "enable_dc_asgd": True}, "enable_dc_asgd"),
    ({"geo_sgd_mode": True, "mode": "nccl2"}, "geo_sgd_mode"),
    ({"half_async": True, "completely_not_async": True}, "completely_not_async"),
    ({"enable_dc_asgd": True, "completely_not_async": True}, "completely_not_async"),
    ({"use_hierarchical_allreduce": True}, "use_hierarchical_allreduce"),
    ({"mode": "nccl2", "use_hierarchical_allreduce": True}, "inter_nranks"),
])
def test_conflicting_fields(fields: dict, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        T.DistributeTranspiler(T.DistributeTranspilerConfig(**fields))


def test_modes_resolve_like_the_spec() -> None:
    assert resolve_mode(config(), True) is Mode.SYNC
    assert resolve_mode(config(), False) is Mode.HALF_ASYNC
    assert resolve_mode(config(sync_mode=False), True) is Mode.HALF_ASYNC
    assert resolve_mode(config(sync_mode=False, runtime_split_send_recv=True), False) is Mode.ASYNC
    assert resolve_mode(config(completely_not_async=True), False) is Mode.SYNC
    assert resolve_mode(config(geo_sgd_mode=True), True) is Mode.GEO


@pytest.mark.parametrize("pservers,message", [
    ("", "pservers: the endpoint list is empty"),
    ("127.0.0.1", "not a 'host:port'"),
    ("127.0.0.1:http", "not a 'host:port'"),
    ("127.0.0.1:0", "not a 'host:port'"),
    ("127.0.0.1:70000", "not a 'host:port'"),
    ("127.0.0.1:6174,,127.0.0.1:6175", "not a 'host:port'"),
    (f"{PS1},{PS1}", "duplicate endpoints"),
    (None, "pservers"),
])
def test_bad_pserver_lists(pservers: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        transpile(basic(), pservers=pservers)  # type: ignore[arg-type]


@pytest.mark.parametrize("trainer_id,trainers,culprit", [
    (0, 0, "trainers"), (0, -1, "trainers"), (0, "2", "trainers"), (0, True, "trainers"),
    (2, 2, "trainer_id"), (-1, 2, "trainer_id"), (True, 2, "trainer_id"), ("0", 2, "trainer_id"),
])
def test_bad_trainer_arguments(trainer_id: object, trainers: object, culprit: str) -> None:
    with pytest.raises(ValueError, match=culprit):
        transpile(basic(), trainer_id=trainer_id, trainers=trainers)  # type: ignore[arg-type]


def test_program_without_optimizer() -> None:
    def body() -> None:
        x = T.layers.data("x", shape=[4])
        T.layers.mean(T.layers.fc(x, size=2))
    from distribute_helpers import build
    with pytest.raises(ValueError, match="program: it has no optimizer ops"):
        transpile(build(body))


def test_unknown_optimizer_op() -> None:
    main, startup = basic()
    for op in main.global_block().ops:
        if op.type == "sgd":
            op.type = "lamb"
    with pytest.raises(ValueError, match="'lamb' is not supported"):
        transpile((main, startup))


def test_dc_asgd_needs_async() -> None:
    with pytest.raises(ValueError, match="enable_dc_asgd needs asynchronous"):
        transpile(basic(), config(enable_dc_asgd=True))


def test_sync_mode_argument_must_be_bool() -> None:
    with pytest.raises(ValueError, match="sync_mode"):
        transpile(basic(), sync_mode=None)  # type: ignore[arg-type]


def test_endpoint_not_in_the_list() -> None:
    t = transpile(basic())
    for call in (t.get_pserver_program, t.get_pserver_programs, t.get_startup_program):
        with pytest.raises(ValueError, match="endpoint '127.0.0.1:9999' is not one of the pservers"):
            call("127.0.0.1:9999")  # type: ignore[operator]


def test_calls_before_transpile() -> None:
    t = T.DistributeTranspiler()
    with pytest.raises(RuntimeError, match="transpile"):
        t.get_trainer_program()
    with pytest.raises(RuntimeError, match="transpile"):
        t.get_pserver_program(PS1)


def test_config_must_be_a_config() -> None:
    with pytest.raises(ValueError, match="config"):
        T.DistributeTranspiler({"slice_var_up": False})  # type: ignore[arg-type]


@pytest.mark.parametrize("trainers,current,trainer_id,culprit", [
    ("", PS1, 0, "trainers"),
    (PSERVERS, "127.0.0.1:9999", 0, "current_endpoint"),
    (PSERVERS, PS1, 1, "current_endpoint"),
    (PSERVERS, PS1, 2, "trainer_id"),
    (PS1, PS1, 0, "at least 2 trainers"),
])
def test_bad_collective_arguments(trainers: str, current: str, trainer_id: int, culprit: str) -> None:
    main, startup = basic()
    t = T.DistributeTranspiler(config(mode="collective", collective_mode="grad_allreduce"))
    with pytest.raises(ValueError, match=culprit):
        t.transpile(trainer_id, program=main, trainers=trainers, startup_program=startup,
                    current_endpoint=current, in_place=False)


def test_pserver_mode_takes_no_current_endpoint_as_the_original_did() -> None:
    """Paddle's harness of its distributed tests transpiles with ``current_endpoint=None``:
    in pserver mode the original only records it as ``_ps_endpoint``; the programs are those
    of the default endpoint's transpile. nccl2 mode still needs the trainer's own endpoint."""
    def programs(current: str | None) -> tuple[list[str], list[str], object]:
        main, startup = basic()
        t = T.DistributeTranspiler()
        t.transpile(0, program=main, pservers=PSERVERS, trainers=2, startup_program=startup,
                    current_endpoint=current, in_place=False)
        trainer = t.get_trainer_program()
        pserver = t.get_pserver_program(PS1)
        return ([op.type for op in trainer.global_block().ops],
                [op.type for b in pserver.blocks for op in b.ops], trainer._ps_endpoint)
    none, given = programs(None), programs(PS1)
    assert none[:2] == given[:2] and "send" in none[0] and "listen_and_serv" in none[1]
    assert none[2] is None and given[2] == PS1
    main, startup = basic()
    with pytest.raises(ValueError, match="current_endpoint: endpoint must be a 'host:port' "
                                         "string, got None"):
        T.DistributeTranspiler(config(mode="nccl2")).transpile(
            0, program=main, trainers=PSERVERS, startup_program=startup,
            current_endpoint=None, in_place=False)
    with pytest.raises(ValueError, match="current_endpoint: 'nowhere' is not a 'host:port'"):
        programs("nowhere")


def test_no_pservers_in_nccl2_mode() -> None:
    main, startup = basic()
    t = T.DistributeTranspiler(config(mode="nccl2"))
    t.transpile(0, program=main, trainers=PSERVERS, startup_program=startup, current_endpoint=PS1, in_place=False)
    with pytest.raises(ValueError, match="no pservers"):
        t.get_pserver_program(PS1)


def test_only_one_distributed_table() -> None:
    main, startup = lookup_model(is_distributed=True)
    lookups = [op for op in main.global_block().ops if op.type == "lookup_table"]
    lookups[1].attrs["is_distributed"] = False
    with pytest.raises(ValueError, match="both with and without"):
        transpile((main, startup))


def test_the_config_is_read_at_transpile_time_only() -> None:
    c = config()
    t = T.DistributeTranspiler(c)
    main, startup = basic()
    t.transpile(0, program=main, pservers=PSERVERS, trainers=2, startup_program=startup, in_place=False)
    c.slice_var_up = False
    assert "split_byref" in [op.type for op in t.get_trainer_program().global_block().ops]
