"""Models and shortcuts shared by the distribute transpiler tests (the setup of
docs/transpiler.md §9)."""

from __future__ import annotations

from typing import Any, Callable

import transpiler as T
from transpiler.ir import Block, Program

PS1, PS2 = "127.0.0.1:6174", "127.0.0.1:6175"
PSERVERS = f"{PS1},{PS2}"


def build(body: Callable[[], Any]) -> tuple[Program, Program]:
    main, startup = Program(), Program()
    main.random_seed = 1
    with T.program_guard(main, startup), T.unique_name.guard():
        body()
    return main, startup


def basic(opt: Callable[[], Any] | None = None, bias: bool = True,
          w_attr: T.ParamAttr | None = None) -> tuple[Program, Program]:
    """x[1000] -> fc(1000) (fc_w, fc_b) -> square_error_cost with y[1] -> mean -> opt."""
    def body() -> None:
        x = T.layers.data("x", shape=[1000])
        y = T.layers.data("y", shape=[1])
        pred = T.layers.fc(x, size=1000, param_attr=w_attr or T.ParamAttr(name="fc_w"),
                           bias_attr=T.ParamAttr(name="fc_b") if bias else False)
        loss = T.layers.mean(T.layers.square_error_cost(pred, y))
        (opt or (lambda: T.optimizer.SGD(0.1)))().minimize(loss)
    return build(body)


def lookup_model(is_distributed: bool = False, remote_prefetch: bool | None = False,
                 opt: Callable[[], Any] | None = None) -> tuple[Program, Program]:
    """`shared_w` [1000, 64] looked up by title_ids and brand_ids, pooled, concat, fc(2).
    `remote_prefetch` goes to the lookups (None: the release's default)."""
    def body() -> None:
        pooled = []
        for slot in ("title_ids", "brand_ids"):
            ids = T.layers.data(slot, shape=[1], dtype="int64", lod_level=1)
            emb = T.layers.embedding(ids, size=[1000, 64], is_sparse=True,
                                     is_distributed=is_distributed,
                                     remote_prefetch=remote_prefetch,
                                     param_attr=T.ParamAttr(name="shared_w"))
            pooled.append(T.layers.sequence_pool(emb, "average"))
        merged = T.layers.concat(pooled, axis=1)
        label = T.layers.data("label", shape=[1], dtype="int64")
        pred = T.layers.fc(merged, size=2, act="softmax", param_attr=T.ParamAttr(name="fc_w"),
                           bias_attr=T.ParamAttr(name="fc_b"))
        loss = T.layers.mean(T.layers.cross_entropy(pred, label))
        (opt or (lambda: T.optimizer.Adam(0.003)))().minimize(loss)
    return build(body)


def mark_remote_prefetch(main: Program, lookup: str) -> None:
    """Set ``remote_prefetch`` on every `lookup` op (the original's test did it by hand)."""
    for op in main.global_block().ops:
        if op.type == lookup:
            op.attrs["remote_prefetch"] = True


def transpile(programs: tuple[Program, Program], config: T.DistributeTranspilerConfig | None = None,
              trainer_id: int = 0, trainers: int = 2, sync_mode: bool = True,
              pservers: str = PSERVERS) -> T.DistributeTranspiler:
    main, startup = programs
    t = T.DistributeTranspiler(config)
    t.transpile(trainer_id, program=main, pservers=pservers, trainers=trainers,
                sync_mode=sync_mode, startup_program=startup, in_place=False)
    return t


def trainer(t: T.DistributeTranspiler) -> tuple[Program, Program]:
    main, startup = t.get_trainer_program(), t.get_trainer_startup_program()
    T.verify(main)
    T.verify(startup)
    return main, startup


def pserver(t: T.DistributeTranspiler, endpoint: str = PS1) -> tuple[Program, Program]:
    main, startup = t.get_pserver_programs(endpoint)
    T.verify(main)
    T.verify(startup)
    return main, startup


def types(block: Block) -> list[str]:
    return [op.type for op in block.ops]


def listen(program: Program) -> Any:
    (op,) = program.global_block().ops
    assert op.type == "listen_and_serv"
    return op


def config(**fields: Any) -> T.DistributeTranspilerConfig:
    return T.DistributeTranspilerConfig(**fields)
