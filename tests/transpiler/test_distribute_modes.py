"""Every mode beyond the acceptance cases: async, half-async, runtime split, DC-ASGD, async LR,
remote sparse update, Geo-SGD, nccl2 and collective."""

from __future__ import annotations

import pytest
from distribute_helpers import (PS1, PS2, PSERVERS, basic, config, listen, lookup_model,
                                pserver, trainer, transpile, types)

import transpiler as T
from transpiler.ir import BlockRef, OpRole, VarType

BACKWARD = ["mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant",
            "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad"]


def exp_decay_sgd():  # type: ignore[no-untyped-def]
    return T.optimizer.SGD(T.lr.exponential_decay(1.0, 2100, 0.1, True))


# -- async family ---------------------------------------------------------------------------------

def test_half_async_sends_without_barriers_and_recv_after_each_send() -> None:
    t = transpile(basic(), sync_mode=False)
    main, _ = trainer(t)
    assert types(main.global_block()) == BACKWARD + [
        "send", "mul_grad", "split_byref", "send", "recv", "recv", "concat"]
    recvs = [op for op in main.global_block().ops if op.type == "recv"]
    assert [op.input("X") for op in recvs] == [["@SEND@fc_b@GRAD"], ["@SEND@fc_w@GRAD"]]
    assert main.attrs["_distributed_mode"] == T.DistributedMode.HALF_ASYNC
    sends = [op for op in main.global_block().ops if op.type == "send"]
    assert sends[1].input("X") == ["fc_w@GRAD.block0", "fc_w@GRAD.block1"]  # no trainer suffix
    ps1, _ = pserver(t, PS1)
    assert [types(b) for b in ps1.blocks[1:]] == [["sgd"], ["sgd"]]
    assert listen(ps1).input("X") == ["fc_b@GRAD", "fc_w@GRAD.block1"]
    assert listen(ps1).attr("distributed_mode") == int(T.DistributedMode.HALF_ASYNC)


def test_half_async_flag_adds_a_local_send_barrier_only_with_runtime_split() -> None:
    """As the original: ``runtime_split_send_recv and half_async`` appends the local barrier;
    ``half_async`` alone appends none."""
    cfg = config(sync_mode=False, runtime_split_send_recv=True, half_async=True)
    main, _ = trainer(transpile(basic(), cfg, sync_mode=False))
    (barrier,) = [op for op in main.global_block().ops if op.type == "send_barrier"]
    assert barrier.attr("half_async") is True
    assert "fetch_barrier" not in types(main.global_block())
    main, _ = trainer(transpile(basic(), config(half_async=True), sync_mode=False))
    assert "send_barrier" not in types(main.global_block())


def test_runtime_split_sends_whole_grads_with_sections() -> None:
    cfg = config(sync_mode=False, runtime_split_send_recv=True)
    t = transpile(basic(), cfg, sync_mode=False)
    main, startup = trainer(t)
    assert types(main.global_block()) == BACKWARD + ["send", "mul_grad", "send", "recv", "recv"]
    send_w = [op for op in main.global_block().ops if op.type == "send"][1]
    assert send_w.input("X") == ["fc_w@GRAD"]
    assert send_w.attr("sections") == [500, 500]
    assert send_w.attr("send_varnames") == ["fc_w@GRAD.block0", "fc_w@GRAD.block1"]
    recv_w = [op for op in main.global_block().ops if op.type == "recv"][1]
    assert recv_w.output("Out") == ["fc_w"]
    assert recv_w.attr("recv_varnames") == ["fc_w.block0", "fc_w.block1"]
    assert types(startup.global_block())[-4:] == ["recv", "recv", "fetch_barrier", "concat"]
    assert listen(pserver(t, PS1)[0]).attr("distributed_mode") == int(T.DistributedMode.ASYNC)


def test_completely_not_async_is_sync() -> None:
    t = transpile(basic(), config(completely_not_async=True), sync_mode=False)
    main, _ = trainer(t)
    assert "send_barrier" in types(main.global_block())
    assert types(pserver(t, PS1)[0].block(1)) == ["sum", "scale", "sgd"]


def test_single_trainer_sync_has_no_copies_to_merge() -> None:
    t = transpile(basic(), trainers=1)
    main, _ = trainer(t)
    assert "fc_b@GRAD" in main.global_block().vars
    ps1, _ = pserver(t, PS1)
    assert types(ps1.block(1)) == ["sgd"]
    assert listen(ps1).attr("Fanin") == 1


def test_second_trainer_sends_its_own_copies() -> None:
    main, _ = trainer(transpile(basic(), trainer_id=1))
    sends = [op for op in main.global_block().ops if op.type == "send"]
    assert sends[0].input("X") == ["fc_b@GRAD.trainer_1"]
    assert sends[1].input("X") == ["fc_w@GRAD.block0.trainer_1", "fc_w@GRAD.block1.trainer_1"]
    assert main.attrs["_is_chief"] is False


def test_dc_asgd_compensates_before_the_update() -> None:
    t = transpile(basic(), config(enable_dc_asgd=True), sync_mode=False)
    ps1, startup = pserver(t, PS1)
    assert types(ps1.block(1)) == ["ref_by_trainer_id", "elementwise_sub", "elementwise_mul",
                                   "elementwise_mul", "elementwise_add", "sgd"]
    ref = ps1.block(1).ops[0]
    assert ref.input("X") == ["fc_b.trainer_0_bak", "fc_b.trainer_1_bak"]
    assert ref.input("TrainerId") == ["@TRAINER_ID@"]
    sgd = ps1.block(1).ops[-1]
    assert sgd.input("Grad") == ps1.block(1).ops[-2].output("Out")
    assert ps1.block(1).ops[1].input("X") == ["fc_b"]
    assert listen(ps1).attr("dc_asgd") is True
    assigns = [(op.input("X"), op.output("Out")) for op in startup.global_block().ops
               if op.type == "assign"]
    assert assigns == [(["fc_b"], ["fc_b.trainer_0_bak"]), (["fc_b"], ["fc_b.trainer_1_bak"]),
                       (["fc_w.block1"], ["fc_w.block1.trainer_0_bak"]),
                       (["fc_w.block1"], ["fc_w.block1.trainer_1_bak"])]


def test_async_lr_sums_each_trainers_step_counter() -> None:
    t = transpile(basic(exp_decay_sgd), sync_mode=False, trainer_id=1)
    main, startup = trainer(t)
    (counter_send,) = [op for op in main.global_block().ops
                       if op.type == "send" and op.attr("merge_add")]
    assert counter_send.input("X") == ["@LR_DECAY_COUNTER@.trainer_1"] * 2
    assert counter_send.attr("epmap") == [PS1, PS2]
    assert not any(op.role & OpRole.LRSched for op in main.global_block().ops)
    fill = startup.global_block().ops[-1]
    assert fill.output("Out") == ["@LR_DECAY_COUNTER@.trainer_1"] and fill.attr("value") == 1.0
    ps1, ps1_startup = pserver(t, PS1)
    lr_block = ps1.block(listen(ps1).attr("lr_decay_block_id"))
    assert lr_block.ops[0].type == "sum"
    assert lr_block.ops[0].input("X") == ["@LR_DECAY_COUNTER@.trainer_0", "@LR_DECAY_COUNTER@.trainer_1"]
    assert listen(ps1).input("X")[-2:] == lr_block.ops[0].input("X")
    starts = {op.output("Out")[0]: op.attr("value") for op in ps1_startup.global_block().ops}
    assert starts["@LR_DECAY_COUNTER@.trainer_0"] == -1.0
    assert starts["@LR_DECAY_COUNTER@.trainer_1"] == 0.0


def test_sync_lr_keeps_the_increment() -> None:
    ps1, startup = pserver(transpile(basic(exp_decay_sgd)), PS1)
    assert ps1.block(1).ops[0].type == "increment"
    counter = [op for op in startup.global_block().ops if op.output("Out") == ["@LR_DECAY_COUNTER@"]]
    assert counter[0].attr("value") == -1.0


# -- sparse ----------------------------------------------------------------------------------------

def test_sparse_grads_are_split_as_selected_rows() -> None:
    t = transpile(lookup_model())
    main, _ = trainer(t)
    (split,) = [op for op in main.global_block().ops if op.type == "split_selected_rows"]
    assert split.attr("height_sections") == [500, 500]
    assert split.output("Out") == ["shared_w@GRAD.block0.trainer_0", "shared_w@GRAD.block1.trainer_0"]
    assert main.global_block().var("shared_w@GRAD.block0.trainer_0").type is VarType.SELECTED_ROWS
    assert listen(pserver(t, PS1)[0]).attr("sparse_grad_to_param") == [
        "shared_w@GRAD.block0:shared_w.block0"]


def test_remote_sparse_update_replaces_lookups() -> None:
    t = transpile(lookup_model(remote_prefetch=True))
    main, startup = trainer(t)
    ops = main.global_block().ops
    lookups = [op for op in ops if op.type == "distributed_lookup_table"]
    assert [op.input("Ids") for op in lookups] == [["title_ids", "brand_ids"]]  # one per table
    assert lookups[0].attr("table_names") == ["shared_w.block0", "shared_w.block1"]
    assert lookups[0].attr("height_sections") == [500, 500]
    assert lookups[0].attr("endpoints") == [PS1, PS2]
    assert lookups[0].attr("padding_idx") == -1
    assert "lookup_table" not in types(main.global_block())
    assert [op.output("Out") for op in ops if op.type == "recv"] == [["fc_b"], ["fc_w"]]
    assert "concat" not in types(main.global_block())[-3:]
    # nor does its startup fetch the table: a fake_init of it comes last, as for the
    # distributed table
    assert not any(op.type == "recv" and "shared_w.block0" in op.output("Out")
                   for op in startup.global_block().ops)
    assert "uniform_random" not in [op.type for op in startup.global_block().ops
                                    if "shared_w" in op.output_arg_names]
    fake_init = startup.global_block().ops[-1]
    assert (fake_init.type, fake_init.output("Out"), fake_init.attr("shape")) == \
        ("fake_init", ["shared_w"], [1000, 64])


def test_remote_prefetch_needs_a_sparse_trained_table() -> None:
    main, startup = lookup_model()
    for op in main.global_block().ops:
        if op.type == "lookup_table":
            op.attrs.update(remote_prefetch=True, is_sparse=False)
    with pytest.raises(ValueError, match="remote_prefetch"):
        transpile((main, startup))


def test_distributed_table_async_grad_names() -> None:
    t = transpile(lookup_model(is_distributed=True), sync_mode=False)
    main, startup = trainer(t)
    send = [op for op in main.global_block().ops if op.type == "send"][-1]
    assert send.input("X") == ["shared_w@GRAD.pserver_0", "shared_w@GRAD.pserver_1"]
    assert [op.type for op in startup.global_block().ops if "shared_w" in op.output_arg_names] \
        == ["fake_init"]
    ps2, _ = pserver(t, PS2)
    table_block = [b for b in ps2.blocks if "sgd" in types(b) and
                   b.ops[-1].input("Param") == ["shared_w"]][0]
    assert table_block.ops[-1].input("Grad") == ["shared_w@GRAD.pserver_1"]
    assert listen(ps2).attr("grad_to_block_id")[-1] == f"shared_w@GRAD.pserver_1:{table_block.idx}"
    assert listen(ps2).attr("prefetch_var_name_to_block_id") == [
        "shared_w.prefetch_ids_0.pserver_1:3"]  # both lookups share one chain (1.8)


def test_distributed_table_rejects_ftrl() -> None:
    with pytest.raises(ValueError, match="ftrl"):
        transpile(lookup_model(is_distributed=True, opt=lambda: T.optimizer.Ftrl(0.1)))


def test_table_rows_split_by_id_range() -> None:
    main, _ = trainer(transpile(lookup_model(is_distributed=True), pservers=f"{PS1},{PS2},127.0.0.1:6176"))
    split = next(op for op in main.global_block().ops if op.type == "split_ids")
    assert split.attr("height_sections") == [334, 334, 332]


# -- geo -------------------------------------------------------------------------------------------

def test_geo_trainer_keeps_training_and_pushes_deltas_every_k_steps() -> None:
    t = T.GeoSgdTranspiler(config(geo_sgd_need_push_nums=5))
    main0, startup0 = basic()
    t.transpile(0, program=main0, pservers=PSERVERS, trainers=2, startup_program=startup0, in_place=False)
    main, startup = trainer(t)
    ops = types(main.global_block())
    assert ops[:-4] == types(main0.global_block())
    assert ops[-4:] == ["increment", "less_than", "logical_not", "conditional_block"]
    push = main.block(main.global_block().ops[-1].attr("sub_block").idx)
    assert types(push) == ["fill_constant", "elementwise_sub", "scale", "send", "elementwise_sub",
                           "scale", "split_byref", "send", "recv", "assign", "recv", "concat",
                           "assign"]
    assert push.ops[2].attr("scale") == 0.5
    assert push.ops[7].input("X") == ["fc_w.block0.delta", "fc_w.block1.delta"]
    limit = [op for op in startup.global_block().ops if op.output("Out") == ["@GEO_STEP@@K"]]
    assert limit[0].attr("value") == 5.0
    assert ("assign", ["fc_w@GEO_OLD"]) in [(op.type, op.output("Out"))
                                           for op in startup.global_block().ops]
    ps1, ps1_startup = pserver(t, PS1)
    assert [types(b) for b in ps1.blocks[1:]] == [["sum"], ["sum"]]
    assert ps1.block(2).ops[0].input("X") == ["fc_w.block1", "fc_w.block1.delta"]
    assert listen(ps1).attr("grad_to_block_id") == ["fc_b.delta:1", "fc_w.block1.delta:2"]
    assert listen(ps1).attr("distributed_mode") == int(T.DistributedMode.GEO)
    assert types(ps1_startup.global_block()) == ["fill_constant", "uniform_random"]


def test_geo_pushes_only_touched_rows_of_sparse_tables() -> None:
    t = T.GeoSgdTranspiler()
    main0, startup0 = lookup_model()
    t.transpile(0, program=main0, pservers=PSERVERS, trainers=2, startup_program=startup0, in_place=False)
    main, _ = trainer(t)
    push = main.blocks[-1]
    (delta,) = [op for op in push.ops if op.type == "sparse_delta"]
    assert delta.input("X") == ["shared_w"] and delta.output("Out") == ["shared_w.delta"]
    assert main.global_block().var("shared_w.delta").type is VarType.SELECTED_ROWS
    assert "split_selected_rows" in types(push)
    ps1, _ = pserver(t, PS1)
    assert "shared_w.block0.delta:shared_w.block0" in listen(ps1).attr("sparse_grad_to_param")


def _update_vars_model(names: str, op_type: str = "mul") -> tuple[T.Program, T.Program]:
    """basic() with fc_w not trainable (no optimizer op) and `names` as the
    ``distribute_update_vars`` of its `op_type` op, as Paddle's pyramid_hash carries it."""
    main, startup = basic(w_attr=T.ParamAttr(name="fc_w", trainable=False))
    (op,) = [op for op in main.global_block().ops if op.type == op_type]
    op.attrs["distribute_update_vars"] = names
    return main, startup


def test_geo_pushes_and_pulls_the_distribute_update_vars_without_an_optimizer_op() -> None:
    main0, startup0 = _update_vars_model("fc_w")
    assert [op.role_var[0] for op in main0.global_block().ops if op.type == "sgd"] == ["fc_b"]
    t = T.GeoSgdTranspiler(config(geo_sgd_need_push_nums=5))
    t.transpile(0, program=main0, pservers=PSERVERS, trainers=2, startup_program=startup0,
                in_place=False)
    main, startup = trainer(t)
    push = main.block(main.global_block().ops[-1].attr("sub_block").idx)
    assert types(push) == ["fill_constant", "elementwise_sub", "scale", "send", "elementwise_sub",
                           "scale", "split_byref", "send", "recv", "assign", "recv", "concat",
                           "assign"]
    assert push.ops[4].input_arg_names == ["fc_w", "fc_w@GEO_OLD"]
    assert push.ops[7].input("X") == ["fc_w.block0.delta", "fc_w.block1.delta"]
    assert push.ops[10].output("Out") == ["fc_w.block0", "fc_w.block1"]
    assert ("assign", ["fc_w@GEO_OLD"]) in [(op.type, op.output("Out"))
                                           for op in startup.global_block().ops]
    ps1, ps1_startup = pserver(t, PS1)
    assert listen(ps1).attr("grad_to_block_id") == ["fc_b.delta:1", "fc_w.block1.delta:2"]
    assert ps1.block(2).ops[0].input("X") == ["fc_w.block1", "fc_w.block1.delta"]
    assert types(ps1_startup.global_block()) == ["fill_constant", "uniform_random"]
    assert [pv["origin"] for pv in main.attrs["_parameters_on_pservers"]] == [
        "fc_b", "fc_w", "fc_w"]


def test_distribute_update_vars_are_read_from_any_op_once_each_in_order() -> None:
    main0, startup0 = _update_vars_model(" fc_w,fc_b ", op_type="elementwise_add")
    main0.global_block().ops[0].attrs["distribute_update_vars"] = "fc_w"
    t = T.GeoSgdTranspiler(config(slice_var_up=False))
    t.transpile(0, program=main0, pservers=PSERVERS, trainers=2, startup_program=startup0,
                in_place=False)
    main, _ = trainer(t)
    sends = [op.input("X") for op in main.blocks[-1].ops if op.type == "send"]
    assert sends == [["fc_b.delta"], ["fc_w.delta"]]  # fc_b keeps its optimizer's one pair


def test_distribute_update_vars_name_parameters_and_only_geo_pushes_them() -> None:
    with pytest.raises(ValueError, match="op 'mul' names distribute_update_vars 'nowhere', "
                                         "which is no var in the global block"):
        transpile(_update_vars_model("nowhere"), config(geo_sgd_mode=True))
    with pytest.raises(ValueError, match="'mean.tmp_0', which is not persistable"):
        transpile(_update_vars_model("mean.tmp_0"), config(geo_sgd_mode=True))
    with pytest.raises(ValueError, match="which only geo_sgd_mode pushes \\(the mode is SYNC\\)"):
        transpile(_update_vars_model("fc_w"))
    transpile(_update_vars_model(""), config(geo_sgd_mode=True))  # empty: nothing named


def test_geo_rejects_a_distributed_table() -> None:
    with pytest.raises(ValueError, match="geo_sgd_mode"):
        transpile(lookup_model(is_distributed=True), config(geo_sgd_mode=True))


# -- nccl2 and collective --------------------------------------------------------------------------

TRAINERS = f"{PS1},{PS2}"


def _collective(cfg: T.DistributeTranspilerConfig, trainer_id: int = 0, model=None):  # type: ignore[no-untyped-def]
    main, startup = model or basic()
    t = T.DistributeTranspiler(cfg)
    t.transpile(trainer_id, program=main, trainers=TRAINERS, startup_program=startup,
                current_endpoint=TRAINERS.split(",")[trainer_id], in_place=False)
    return trainer(t)


def test_nccl2_rings_and_hierarchical_ids() -> None:
    cfg = config(mode="nccl2", nccl_comm_num=2)
    main, startup = _collective(cfg, trainer_id=1)
    gen = startup.global_block().ops[-1]
    assert gen.output("NCCLID") == ["NCCLID", "NCCLID_1"]
    assert gen.attr("trainers") == [PS1, PS2] and gen.attr("trainer_id") == 1
    assert main.attrs["_trainers_endpoints"] == [PS1, PS2] and main.attrs["_nccl_comm_num"] == 2
    four = ",".join(f"127.0.0.1:{6170 + i}" for i in range(4))
    t = T.DistributeTranspiler(config(mode="nccl2", use_hierarchical_allreduce=True,
                                      hierarchical_allreduce_inter_nranks=2))
    m, s = basic()
    t.transpile(0, program=m, trainers=four, startup_program=s, current_endpoint="127.0.0.1:6170", in_place=False)
    gen = t.get_trainer_startup_program().global_block().ops[-1]
    assert gen.output("InterNCCLID") == ["Hierarchical_inter_NCCLID_0"]
    t3 = T.DistributeTranspiler(config(mode="nccl2", use_hierarchical_allreduce=True,
                                       hierarchical_allreduce_inter_nranks=3))
    with pytest.raises(ValueError, match="hierarchical_allreduce_inter_nranks=3"):
        t3.transpile(0, program=m, trainers=four, startup_program=s,
                     current_endpoint="127.0.0.1:6170", in_place=False)


def test_grad_allreduce() -> None:
    main, startup = _collective(config(mode="collective", collective_mode="grad_allreduce"))
    ops = main.global_block().ops
    assert types(main.global_block()) == [
        "mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant", "scale",
        "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad",
        "c_allreduce_sum", "mul_grad", "c_allreduce_sum", "sgd", "sgd"]
    assert ops[6].attr("scale") == 0.5 and ops[6].input("X") == ["mean.tmp_0@GRAD"]
    assert [op.input("X") for op in ops if op.type == "c_allreduce_sum"] == [["fc_b@GRAD"], ["fc_w@GRAD"]]
    assert types(startup.global_block())[-4:] == ["c_gen_nccl_id", "c_comm_init", "c_broadcast",
                                                  "c_broadcast"]
    gen = startup.global_block().ops[-4]
    assert gen.attr("other_endpoints") == [PS2] and gen.attr("rank") == 0


def test_single_process_multi_thread_is_grad_allreduce_on_one_ring_opened_by_c_comm_init_all(
        ) -> None:
    """The original's SingleProcessMultiThread: one ring whatever nccl_comm_num says, nranks
    the endpoints, one endpoint allowed, and a startup with only c_comm_init_all added."""
    mode = "single_process_multi_thread"
    main0, startup0 = basic()
    for endpoints, scale in ((PS1, 1.0), (TRAINERS, 0.5)):
        t = T.DistributeTranspiler(config(mode="collective", collective_mode=mode,
                                          nccl_comm_num=2))
        t.transpile(0, program=main0, trainers=endpoints, startup_program=startup0,
                    current_endpoint=PS1, in_place=False)
        main, startup = trainer(t)
        ops = main.global_block().ops
        assert types(main.global_block()) == [
            "mul", "elementwise_add", "elementwise_sub", "square", "mean", "fill_constant",
            "scale", "mean_grad", "square_grad", "elementwise_sub_grad", "elementwise_add_grad",
            "c_allreduce_sum", "mul_grad", "c_allreduce_sum", "sgd", "sgd"]
        assert ops[6].attr("scale") == scale and ops[6].input("X") == ["mean.tmp_0@GRAD"]
        assert [(op.input("X"), op.attr("ring_id"), op.attr("nranks")) for op in ops
                if op.type == "c_allreduce_sum"] == [(["fc_b@GRAD"], 0, 1 / scale),
                                                     (["fc_w@GRAD"], 0, 1 / scale)]
        assert types(startup.global_block()) == types(startup0.global_block()) + [
            "c_comm_init_all"]
        init = startup.global_block().ops[-1]
        assert (init.inputs, init.outputs, init.attr("ring_id")) == ({}, {}, 0)
        assert (main.attrs["_collective_mode"], main.attrs["_nccl_comm_num"]) == (mode, 1)
    with pytest.raises(ValueError, match=r"at least 2 trainers \(1 only with collective_mode "
                                         "single_process_multi_thread"):
        T.DistributeTranspiler(config(mode="collective", collective_mode="grad_allreduce")
                               ).transpile(0, program=main0, trainers=PS1,
                                           startup_program=startup0, current_endpoint=PS1)


def test_local_sgd_every_step_and_every_k_steps() -> None:
    main, startup = _collective(config(mode="collective", collective_mode="local_sgd"))
    assert types(main.global_block())[-10:] == ["elementwise_sub", "c_allreduce_sum", "scale",
                                                "elementwise_sub", "assign"] * 2
    assert ("assign", ["fc_b@SNAPSHOT"]) in [(op.type, op.output("Out"))
                                            for op in startup.global_block().ops]
    main, _ = _collective(config(mode="collective", collective_mode="local_sgd",
                                 local_sgd_k_steps=4))
    assert types(main.global_block())[-4:] == ["increment", "less_than", "logical_not",
                                               "conditional_block"]
    assert types(main.blocks[-1])[0] == "fill_constant"
    assert types(main.blocks[-1]).count("c_allreduce_sum") == 2


def test_collective_programs_carry_sub_block_refs_that_verify() -> None:
    main, _ = _collective(config(mode="collective", collective_mode="local_sgd", local_sgd_k_steps=2))
    assert main.global_block().ops[-1].attr("sub_block") == BlockRef(1)
