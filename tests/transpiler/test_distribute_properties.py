"""Property tests of the distribute transpiler over random models and clusters (issue 3).

A `Case` is a small but varied model (an fc tower of random depth and widths, with or without
biases, a frozen layer, a per-param learning rate or L2; embeddings that are dense, sparse or
remote-prefetched; an optional distributed table; any of the 8 optimizers, weight decay,
clipping, any LR schedule) and a cluster (1 to 16 pservers, 1 to 64 trainers, slicing on or off,
a `min_block_size` that may cut the larger params, either dispatcher, every pserver mode: sync,
async, half-async, geo, DC-ASGD). For every case:

(a) param blocks and param-shaped accumulators partition their var exactly (contiguous row
    offsets from 0, shapes adding up); scalar accumulators go whole with every block; table
    shards cover the table's ids once;
(b) every grad block a trainer sends is consumed by exactly one optimize block of the pserver it
    is sent to, and each pserver receives exactly what the trainers send;
(c) every param block a trainer receives (main and startup) is a persistable var of that
    pserver, written by one of its optimize blocks and initialized by its startup;
(d) `verify` passes on every program;
(e) transpiling twice gives identical programs, and the caller's programs are left unchanged;
(f) RoundRobin places blocks evenly: at most one block more on any server than on another;
(g) every persistable var a trainer or pserver program reads is received, initialized by its
    startup, or written by the program itself.

(b) transpiles for trainers 0 and T-1: the names trainer t sends are trainer 0's with t in
them, which is how the pservers' inputs are checked against all T trainers at once.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, replace
from typing import Any, Callable

from hypothesis import given, settings
from hypothesis import strategies as st

import transpiler as T
from transpiler.distribute.config import MIN_BLOCK_SIZE
from transpiler.distribute.lookup_table import TABLE_OPTIMIZERS, table_sections
from transpiler.ir import Block, Op, Program, VarType
from transpiler.opcatalog import optimizer_types

OPTIMIZERS = optimizer_types("kernel")
LR_SCHEDULES = ("constant", "exponential", "natural_exp", "inverse_time", "polynomial",
                "piecewise", "noam", "cosine")
MODES = ("sync", "async", "half_async", "geo", "dc_asgd")
WIDTHS = (200, 513, 64, 7, 1)  # the first, most drawn and shrunk to, slice on 2 pservers
TRAINER_ZERO = re.compile(r"\.trainer_0(?=\.|$)")


# -- cases ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Embedding:
    vocab: int
    dim: int
    kind: str  # dense | sparse | remote (sparse, looked up with remote_prefetch)


@dataclass(frozen=True)
class Model:
    in_dim: int
    widths: tuple[int, ...]
    biases: tuple[bool, ...]
    frozen: int | None  # index of a non-trainable fc weight (not the last: one must train)
    embeddings: tuple[Embedding, ...]
    table: tuple[int, int, int] | None  # distributed table: vocab, dim, lookups
    optimizer: str
    lr: str
    regularization: str | None  # l1 | l2 on every param
    first_l2: bool  # the first fc weight has its own L2Decay (ParamAttr)
    first_lr: float  # the first fc weight's learning-rate factor
    clip: str | None  # value | norm


@dataclass(frozen=True)
class Cluster:
    pservers: int
    trainers: int
    trainer_id: int
    mode: str
    variant: bool  # sync: completely_not_async; half_async: local barrier; dc_asgd: runtime split
    slice_var_up: bool
    round_robin: bool
    min_block_size: int


@dataclass(frozen=True)
class Case:
    model: Model
    cluster: Cluster

    @property
    def endpoints(self) -> list[str]:
        return [f"10.0.{i // 8}.{i % 8}:{6170 + i}" for i in range(self.cluster.pservers)]


@st.composite
def models(draw: st.DrawFn, geo: bool = False) -> Model:
    optimizer = draw(st.sampled_from(OPTIMIZERS))
    depth = draw(st.integers(1, 3))
    has_table = not geo and optimizer in TABLE_OPTIMIZERS and draw(st.booleans())
    return Model(
        in_dim=draw(st.sampled_from((257, 100, 3))),
        widths=tuple(draw(st.sampled_from(WIDTHS)) for _ in range(depth)),
        biases=tuple(draw(st.booleans()) for _ in range(depth)),
        frozen=draw(st.none() | st.integers(0, depth - 2)) if depth > 1 else None,
        embeddings=tuple(draw(st.lists(st.builds(
            Embedding, st.sampled_from((5000, 1000, 10)), st.sampled_from((33, 16, 4)),
            st.sampled_from(("dense", "sparse", "remote"))), max_size=2))),
        table=(draw(st.sampled_from((7, 1000, 3001))), draw(st.sampled_from((8, 64))),
               draw(st.integers(1, 2))) if has_table else None,
        optimizer=optimizer,
        lr=draw(st.sampled_from(LR_SCHEDULES)),
        regularization=draw(st.sampled_from((None, "l1", "l2"))),
        first_l2=draw(st.booleans()),
        first_lr=draw(st.sampled_from((1.0, 0.5))),
        clip=draw(st.sampled_from((None, "value", "norm"))),
    )


@st.composite
def clusters(draw: st.DrawFn, mode: str) -> Cluster:
    trainers = draw(st.integers(1, 64))
    return Cluster(
        pservers=draw(st.integers(1, 16)),
        trainers=trainers,
        trainer_id=draw(st.integers(0, trainers - 1)),
        mode=mode,
        variant=draw(st.booleans()),
        slice_var_up=draw(st.integers(0, 3)) > 0,  # on 3 times in 4
        round_robin=draw(st.booleans()),
        min_block_size=draw(st.sampled_from((MIN_BLOCK_SIZE, 10_000, 40_000))),
    )


@st.composite
def cases(draw: st.DrawFn) -> Case:
    mode = draw(st.sampled_from(MODES))
    return Case(draw(models(geo=mode == "geo")), draw(clusters(mode)))


# -- building and transpiling ---------------------------------------------------------------------

def learning_rate(kind: str) -> float | T.Var:
    schedules: dict[str, Callable[[], T.Var]] = {
        "exponential": lambda: T.lr.exponential_decay(0.1, 100, 0.5, staircase=True),
        "natural_exp": lambda: T.lr.natural_exp_decay(0.1, 100, 0.5),
        "inverse_time": lambda: T.lr.inverse_time_decay(0.1, 100, 0.5),
        "polynomial": lambda: T.lr.polynomial_decay(0.1, 100, cycle=True),
        "piecewise": lambda: T.lr.piecewise_decay([10, 20], [0.1, 0.05, 0.01]),
        "noam": lambda: T.lr.noam_decay(64, 100),
        "cosine": lambda: T.lr.cosine_decay(0.1, 10, 5),
    }
    return schedules[kind]() if kind in schedules else 0.1


def optimizer(m: Model) -> T.optimizer.Optimizer:
    regularization = {"l1": T.regularizer.L1Decay(1e-4), "l2": T.regularizer.L2Decay(1e-4),
                      None: None}[m.regularization]
    clip = {"value": T.clip.GradientClipByValue(1.0), "norm": T.clip.GradientClipByNorm(1.0),
            None: None}[m.clip]
    cls = T.optimizer.OPTIMIZERS[m.optimizer]
    return cls(learning_rate(m.lr), regularization=regularization, grad_clip=clip)


def embed(m: Model) -> list[T.Var]:
    pooled = []
    for i, e in enumerate(m.embeddings):
        ids = T.layers.data(f"ids_{i}", shape=[1], dtype="int64", lod_level=1)
        emb = T.layers.embedding(ids, size=[e.vocab, e.dim], is_sparse=e.kind != "dense",
                                 remote_prefetch=e.kind == "remote",
                                 param_attr=T.ParamAttr(name=f"emb_{i}"))
        pooled.append(T.layers.sequence_pool(emb, "sum"))
    if m.table is not None:
        vocab, dim, lookups = m.table
        for j in range(lookups):
            ids = T.layers.data(f"table_ids_{j}", shape=[1], dtype="int64", lod_level=1)
            emb = T.layers.embedding(ids, size=[vocab, dim], is_sparse=True, is_distributed=True,
                                     param_attr=T.ParamAttr(name="table"))
            pooled.append(T.layers.sequence_pool(emb, "average"))
    return pooled


def build(m: Model) -> tuple[Program, Program]:
    main, startup = Program(), Program()
    main.random_seed = startup.random_seed = 7
    with T.program_guard(main, startup), T.unique_name.guard():
        h = T.layers.data("x", shape=[m.in_dim])
        pooled = embed(m)
        if pooled:
            h = T.layers.concat([h] + pooled, axis=1)
        for i, (width, bias) in enumerate(zip(m.widths, m.biases)):
            w = T.ParamAttr(name=f"fc{i}.w", trainable=m.frozen != i,
                            regularizer=T.regularizer.L2Decay(1e-3) if i == 0 and m.first_l2 else None,
                            learning_rate=m.first_lr if i == 0 else 1.0)
            h = T.layers.fc(h, size=width, act="relu" if i else None, param_attr=w,
                            bias_attr=T.ParamAttr(name=f"fc{i}.b") if bias else False)
        y = T.layers.data("y", shape=[m.widths[-1]])
        loss = T.layers.mean(T.layers.square_error_cost(h, y))
        optimizer(m).minimize(loss)
    return main, startup


def remote_tables(m: Model) -> set[str]:
    return {f"emb_{i}" for i, e in enumerate(m.embeddings) if e.kind == "remote"}


def config(c: Cluster) -> tuple[T.DistributeTranspilerConfig, bool]:
    """The config and `transpile`'s sync_mode of cluster `c`."""
    cfg = T.DistributeTranspilerConfig(slice_var_up=c.slice_var_up,
                                       split_method=T.RoundRobin if c.round_robin else T.HashName,
                                       min_block_size=c.min_block_size)
    if c.mode == "sync":
        cfg.completely_not_async = c.variant
        return cfg, not c.variant
    cfg.sync_mode = False
    if c.mode == "async" or (c.mode == "dc_asgd" and c.variant):
        cfg.runtime_split_send_recv = True
    cfg.half_async = c.mode == "half_async" and c.variant
    cfg.enable_dc_asgd = c.mode == "dc_asgd"
    cfg.geo_sgd_mode = c.mode == "geo"
    return cfg, False


@dataclass
class Job:
    """Every program of one transpile: the trainer's, and each pserver's main and startup."""

    trainer: Program
    trainer_startup: Program
    pservers: dict[str, tuple[Program, Program]]

    def programs(self) -> list[Program]:
        return [self.trainer, self.trainer_startup] + [p for pair in self.pservers.values()
                                                       for p in pair]

    def placed(self) -> list[dict[str, Any]]:
        return list(self.trainer.attrs["_parameters_on_pservers"])


def transpile(case: Case, programs: tuple[Program, Program], trainer_id: int | None = None) -> Job:
    cfg, sync_mode = config(case.cluster)
    t = T.DistributeTranspiler(cfg)
    tid = case.cluster.trainer_id if trainer_id is None else trainer_id
    t.transpile(tid, program=programs[0], pservers=",".join(case.endpoints),
                trainers=case.cluster.trainers, sync_mode=sync_mode, startup_program=programs[1], in_place=False)
    return Job(t.get_trainer_program(), t.get_trainer_startup_program(),
               {ep: t.get_pserver_programs(ep) for ep in case.endpoints})


# -- reading programs -----------------------------------------------------------------------------

def all_ops(program: Program) -> list[Op]:
    return [op for block in program.blocks for op in block.ops]


def listen(program: Program) -> Op:
    (op,) = program.global_block().ops
    assert op.type == "listen_and_serv"
    return op


def optimize_blocks(program: Program) -> list[Block]:
    return [program.block(ref.idx) for ref in listen(program).attr("optimize_blocks")]


def grad_to_block(program: Program) -> dict[str, int]:
    pairs = [entry.rsplit(":", 1) for entry in listen(program).attr("grad_to_block_id")]
    names = [name for name, _ in pairs]
    assert len(names) == len(set(names)), f"grad_to_block_id repeats a grad: {names}"
    return {name: int(idx) for name, idx in pairs}


def blocks_reading(program: Program, name: str) -> list[int]:
    return [b.idx for b in optimize_blocks(program)
            if any(name in op.input_arg_names for op in b.ops)]


def writer_blocks(program: Program, name: str) -> list[int]:
    return [b.idx for b in optimize_blocks(program)
            if any(name in op.output_arg_names for op in b.ops)]


def sends(program: Program) -> list[tuple[str, str, bool]]:
    """(var name, endpoint, merge_add) of every piece every send op of `program` sends."""
    out = []
    for op in all_ops(program):
        if op.type == "send":
            names = op.attr("send_varnames") or op.input("X")
            assert len(names) == len(op.attr("epmap")), op
            out += [(n, ep, bool(op.attr("merge_add"))) for n, ep in zip(names, op.attr("epmap"))]
    return out


def recvs(program: Program) -> list[tuple[str, str]]:
    """(var name, endpoint) of every piece every recv op of `program` fetches."""
    out = []
    for op in all_ops(program):
        if op.type == "recv":
            names = op.attr("recv_varnames") or op.output("Out")
            assert len(names) == len(op.attr("epmap")), op
            out += list(zip(names, op.attr("epmap")))
    return out


def by_origin(placed: list[dict[str, Any]], kind: str) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for pv in placed:
        if pv["kind"] == kind:
            groups[pv["origin"]].append(pv)
    return groups


# -- (a) exact partition --------------------------------------------------------------------------

def assert_partition(shape: tuple[int, ...], blocks: list[dict[str, Any]], what: str) -> None:
    """The blocks are rows [offset, offset + rows) of a var of `shape`, covering it once."""
    blocks = sorted(blocks, key=lambda b: b["row_offset"])
    assert [b["index"] for b in blocks] == list(range(len(blocks))), what
    row = 0
    for b in blocks:
        assert b["row_offset"] == row, f"{what}: {b['name']} starts at {b['row_offset']}, not {row}"
        assert tuple(b["shape"][1:]) == shape[1:], f"{what}: {b['name']} {b['shape']} vs {shape}"
        assert b["shape"][0] > 0, what
        row += b["shape"][0]
    assert row == shape[0], f"{what}: blocks hold {row} of {shape[0]} rows"
    assert sum(math.prod(b["shape"]) for b in blocks) == math.prod(shape), what


def check_partition(case: Case, origin: Program, job: Job) -> None:
    gblock = origin.global_block()
    placed = job.placed()
    params = by_origin(placed, "Param")
    trained = {op.input("Param")[0] for op in gblock.ops if "Param" in op.inputs}
    assert set(params) == trained - ({"table"} if case.model.table else set())
    for param, blocks in params.items():
        assert_partition(gblock.var(param).shape, blocks, param)
    for acc, copies in by_origin(placed, "Optimizer").items():
        shape = gblock.var(acc).shape
        param = _param_of(origin, acc)
        param_blocks = params[param]
        if len(param_blocks) > 1 and shape == gblock.var(param).shape:
            assert_partition(shape, copies, acc)
            assert sorted(_where(c) for c in copies) == sorted(_where(b) for b in param_blocks)
        else:
            assert len(copies) == len(param_blocks), acc
            assert all(tuple(c["shape"]) == shape and c["row_offset"] == 0 for c in copies), acc
    for ep in case.endpoints:
        names = [b["name"] for b in placed if b["endpoint"] == ep]
        assert len(names) == len(set(names)), f"{ep} holds two vars named alike: {names}"
        main, startup = job.pservers[ep]
        for b in (b for b in placed if b["endpoint"] == ep):
            assert main.global_block().var(b["name"]).shape == tuple(b["shape"]), b
            assert startup.global_block().var(b["name"]).shape == tuple(b["shape"]), b
    check_table(case, origin, placed)


def _where(block: dict[str, Any]) -> tuple[Any, ...]:
    return block["endpoint"], block["index"], block["row_offset"], block["shape"]


def _param_of(origin: Program, acc: str) -> str:
    (op,) = [op for op in origin.global_block().ops if "Param" in op.inputs
             and acc in op.input_arg_names]
    return str(op.input("Param")[0])


def check_table(case: Case, origin: Program, placed: list[dict[str, Any]]) -> None:
    shards = sorted(by_origin(placed, "Table").get("table", []), key=lambda s: s["index"])
    if case.model.table is None:
        assert not shards
        return
    rows, dim = origin.global_block().var("table").shape
    per = math.ceil(rows / case.cluster.pservers)
    assert [s["endpoint"] for s in shards] == case.endpoints
    assert [s["row_offset"] for s in shards] == [k * per for k in range(case.cluster.pservers)]
    sections = table_sections(rows, case.cluster.pservers)
    assert sum(sections) == rows and all(0 <= n <= per for n in sections)
    assert all(tuple(s["shape"]) == (per, dim) for s in shards)


# -- (b) and (c) sends and receives ---------------------------------------------------------------

def check_sends(job: Job, sent: list[tuple[str, str, bool]]) -> None:
    """Each sent piece is taken by its pserver and consumed by exactly one optimize block, the
    one `grad_to_block_id` gives for it (or for the merged grad it is a trainer's copy of)."""
    for name, ep, merge_add in sent:
        main = job.pservers[ep][0]
        assert name in listen(main).input("X"), f"{name} sent to {ep}, which does not take it"
        assert main.global_block().has_var(name), name
        readers = blocks_reading(main, name)
        if merge_add:  # a trainer's step counter: the LR block sums the trainers' counters
            assert readers == [listen(main).attr("lr_decay_block_id")], name
            continue
        assert len(readers) == 1, f"{name} on {ep} is read by optimize blocks {readers}"
        keys = [k for k, idx in grad_to_block(main).items() if idx == readers[0]]
        assert len(keys) == 1 and (name == keys[0] or name.startswith(keys[0] + ".trainer_")), \
            f"{name} is consumed by block {readers[0]}, which grad_to_block_id gives to {keys}"


def as_trainer(name: str, trainer_id: int) -> str:
    """Trainer 0's name for a sent var, as trainer `trainer_id` names it."""
    return TRAINER_ZERO.sub(f".trainer_{trainer_id}", name)


def check_received_is_sent(case: Case, first: Job, last: Job) -> None:
    """Trainer t sends what trainer 0 sends with its own id in the names, and each pserver's
    listen_and_serv takes exactly what all trainers send it."""
    trainers = case.cluster.trainers
    sent = [(n, ep) for n, ep, _ in sends(first.trainer)]
    assert sorted((n, ep) for n, ep, _ in sends(last.trainer)) == \
        sorted((as_trainer(n, trainers - 1), ep) for n, ep in sent)
    for ep in case.endpoints:
        expected = {as_trainer(n, t) for n, e in sent if e == ep for t in range(trainers)}
        taken = listen(first.pservers[ep][0]).input("X")
        assert len(taken) == len(set(taken)) and set(taken) == expected, \
            f"{ep}: taken but not sent / sent but not taken: {sorted(set(taken) ^ expected)}"


def check_recvs(job: Job, received: list[tuple[str, str]]) -> None:
    for name, ep in received:
        main, startup = job.pservers[ep]
        var = main.global_block().var(name)
        assert var.persistable, f"{name} on {ep} is not persistable"
        writers = writer_blocks(main, name)
        assert len(writers) == 1, f"{name} on {ep}: written by optimize blocks {writers}"
        assert any(name in op.output_arg_names for op in startup.global_block().ops), \
            f"{name} is never initialized on {ep}"


def check_state_initialized(main: Program, startup: Program, received: set[str]) -> None:
    """Every persistable var `main` reads is received, initialized by `startup`, or written by
    `main` itself (RAW control and path vars carry no state)."""
    initialized = {n for op in startup.global_block().ops for n in op.output_arg_names}
    written = {n for op in all_ops(main) for n in op.output_arg_names}
    for op in all_ops(main):
        for name in op.input_arg_names:
            var = main.global_block().vars.get(name)
            if var is None or not var.persistable or var.type is VarType.RAW:
                continue
            assert name in received | initialized | written, f"{op.type} reads {name}, never set"


# -- (f) balance ----------------------------------------------------------------------------------

def check_balance(case: Case, job: Job) -> None:
    counts = Counter(b["endpoint"] for b in job.placed() if b["kind"] == "Param")
    per_server = [counts[ep] for ep in case.endpoints]
    assert max(per_server) - min(per_server) <= 1, dict(counts)


# -- the properties -------------------------------------------------------------------------------

SETTINGS = settings(max_examples=150, deadline=None)  # 2 to 5 s a test on an idle core


@SETTINGS
@given(cases())
def test_blocks_partition_params_and_accumulators(case: Case) -> None:
    programs = build(case.model)
    check_partition(case, programs[0], transpile(case, programs))


@SETTINGS
@given(cases())
def test_every_sent_grad_block_has_one_consumer(case: Case) -> None:
    programs = build(case.model)
    first = transpile(case, programs, 0)
    last = transpile(case, programs, case.cluster.trainers - 1)
    for job in (first, last):
        check_sends(job, sends(job.trainer))
    check_received_is_sent(case, first, last)


@SETTINGS
@given(cases())
def test_every_received_param_block_is_produced_there(case: Case) -> None:
    job = transpile(case, build(case.model))
    check_recvs(job, recvs(job.trainer) + recvs(job.trainer_startup))
    # the trainer never holds a remote-prefetched table: its startup fake_inits it instead
    remote = set() if case.cluster.mode == "geo" else remote_tables(case.model)
    assert {n for n, _ in recvs(job.trainer_startup)} == \
        {b["name"] for b in job.placed() if b["kind"] == "Param" and b["origin"] not in remote}
    assert remote <= {op.output("Out")[0] for op in job.trainer_startup.global_block().ops
                      if op.type == "fake_init"}


@SETTINGS
@given(cases())
def test_every_persistable_var_read_is_initialized(case: Case) -> None:
    job = transpile(case, build(case.model))
    check_state_initialized(job.trainer, job.trainer_startup, set())
    for main, startup in job.pservers.values():
        check_state_initialized(main, startup, set(listen(main).input("X")))


@SETTINGS
@given(cases())
def test_every_program_verifies(case: Case) -> None:
    for program in transpile(case, build(case.model)).programs():
        T.verify(program)


@SETTINGS
@given(cases())
def test_transpiling_twice_gives_identical_programs(case: Case) -> None:
    main, startup = build(case.model)
    before = (main.to_dict(), startup.to_dict())
    first = transpile(case, (main, startup))
    second = transpile(case, (main, startup))
    assert (main.to_dict(), startup.to_dict()) == before
    assert [p.to_dict() for p in first.programs()] == [p.to_dict() for p in second.programs()]


@SETTINGS
@given(cases())
def test_round_robin_balances_blocks(case: Case) -> None:
    case = Case(case.model, replace(case.cluster, round_robin=True))
    check_balance(case, transpile(case, build(case.model)))
