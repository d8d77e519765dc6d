"""Spec section 10: the original's known defects, each with a test that would have caught it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from distribute_helpers import (PS1, PSERVERS, basic, config, listen, lookup_model, pserver,
                                trainer, transpile, types)

import transpiler as T
from transpiler.ir import OpRole

SUPPORT = Path(__file__).resolve().parents[1] / "support"
RPC_OPS = ("send", "recv", "send_barrier", "fetch_barrier", "prefetch")


def test_hash_name_works_on_real_vars() -> None:
    """The original called ``var.name()`` on a property: any dispatch crashed."""
    main, _ = basic()
    fc_w = main.global_block().var("fc_w")
    assert T.HashName([PS1]).dispatch([fc_w]) == [PS1]
    t = transpile(basic(), config(split_method=T.HashName))
    trainer(t)


def test_hash_name_placement_is_the_same_in_every_process() -> None:
    """The original hashed with Python's salted ``hash``: trainers and pservers disagreed."""
    code = (
        f"import sys; sys.path.insert(0, {str(SUPPORT)!r})\n"
        "from distribute_helpers import basic, config, transpile\n"
        "import transpiler as T\n"
        "t = transpile(basic(lambda: T.optimizer.Adam(0.1)), config(split_method=T.HashName),"
        " pservers='h:1,h:2,h:3,h:4,h:5')\n"
        "print(T.dumps_json(t.get_trainer_program()))\n")
    outs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, env={"PYTHONHASHSEED": seed}, cwd=SUPPORT.parents[1]).stdout
            for seed in ("0", "1", "12345")}
    assert len(outs) == 1


def test_empty_optional_input_slot_is_copied_empty() -> None:
    """The original indexed ``op.input(slot)[0]`` for every slot: IndexError on an empty one."""
    main, startup = basic(lambda: T.optimizer.Adam(0.1))
    for op in main.global_block().ops:
        if op.type == "adam":
            op.inputs["MasterParam"] = []
            op.outputs["MasterParamOut"] = []
    t = transpile((main, startup))
    ps1, _ = pserver(t, PS1)
    adam = next(op for op in ps1.block(1).ops if op.type == "adam")
    assert adam.input("MasterParam") == [] and adam.output("MasterParamOut") == []
    assert adam.input("Param") == ["fc_b"]


def test_a_pserver_with_nothing_to_do_gets_one_empty_block() -> None:
    """Paddle issue 13073: a pserver without params crashed for want of an optimize block."""
    eps = ",".join(f"127.0.0.1:{6174 + i}" for i in range(3))
    t = transpile(basic(), config(slice_var_up=False), pservers=eps)
    idle, _ = pserver(t, "127.0.0.1:6176")
    assert idle.num_blocks == 2 and types(idle.block(1)) == []
    assert listen(idle).input("X") == [] and listen(idle).attr("grad_to_block_id") == []


def test_programs_carry_what_a_runtime_needs_against_hangs() -> None:
    """Sync training hung on late, slow or dead trainers. The cure is the runtime's (deadlines,
    fan-in that shrinks and grows); the programs give it every id and count it needs."""
    for model, sync in ((basic(), True), (lookup_model(is_distributed=True), True),
                        (lookup_model(), False)):
        t = transpile(model, sync_mode=sync, trainer_id=1)
        main, startup = trainer(t)
        rpc = [op for p in (main, startup) for op in p.global_block().ops if op.type in RPC_OPS]
        assert rpc and all(op.attr("trainer_id") == 1 for op in rpc)
        assert all(op.role == OpRole.RPC for op in rpc if op.type != "prefetch")
        for op in rpc:
            if op.type.endswith("barrier"):
                assert op.attr("endpoints") == PSERVERS.split(",")
            else:
                talks_to = op.input("X") if op.type != "recv" else \
                    op.attr("recv_varnames") or op.output("Out")
                assert len(op.attr("epmap")) == len(talks_to)
        assert (main.attrs["_trainer_id"], main.attrs["_trainers"]) == (1, 2)
        serve = listen(pserver(t, PS1)[0])
        assert (serve.attr("Fanin"), serve.attr("pserver_id"), serve.attr("endpoint")) == (2, 0, PS1)
        assert serve.attr("distributed_mode") == main.attrs["_distributed_mode"]
