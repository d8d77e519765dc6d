"""The plan every later pass reads: each (param, grad) pair cut into row blocks (`slice_pass`)
and each block placed on a pserver (`dispatch_pass`), plus the names both sides agree on.

Naming (docs/transpiler.md §5): param block i is ``p.block{i}`` and grad block i ``g.block{i}``
when a var is cut in more than one block, else the var keeps its name. In sync mode with several
trainers, trainer t sends its copy as ``<grad block>.trainer_{t}`` and the pserver sums the copies
into the grad block.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

from ..ir import Program, VarType
from .analysis import OptimizeSection, ParamGrad
from .cluster import Cluster
from .config import DistributedMode, DistributeTranspilerConfig, ServerRuntimeConfig
from .seeded import numpy_legacy_shuffle
from .slicing import VarBlock, slice_shapes, slice_variable


@dataclass(frozen=True)
class VarSlice:
    """Rows ``[row_offset, row_offset + shape[0])`` of var `origin`, kept on `endpoint`."""

    name: str
    origin: str
    index: int
    shape: tuple[int, ...]
    row_offset: int
    endpoint: str


@dataclass(frozen=True)
class DistVar:
    """A parameter and its gradient, cut into the same row blocks, block i of both on the same
    pserver. `grads` holds the pserver's (merged) grad block names."""

    param: str
    grad: str
    grad_type: VarType
    params: tuple[VarSlice, ...]
    grads: tuple[VarSlice, ...]

    @property
    def is_split(self) -> bool:
        return len(self.params) > 1


@dataclass(frozen=True)
class SlicedPair:
    """The output of `slice_pass`: a pair and its blocks, not yet placed."""

    pair: ParamGrad
    blocks: tuple[VarBlock, ...]


def block_name(name: str, index: int, count: int) -> str:
    return f"{name}.block{index}" if count > 1 else name


def trainer_copy(name: str, trainer_id: int) -> str:
    return f"{name}.trainer_{trainer_id}"


def retarget_copy(name: str, src: int, dst: int) -> str:
    """`name` with the mark of trainer `src`'s copy (``.trainer_{src}``, as `trainer_copy`, a
    table's grad pieces and DC-ASGD's backups write it) made trainer `dst`'s; a name without
    that mark comes back as it is."""
    return re.sub(rf"\.trainer_{src}(?![0-9])", f".trainer_{dst}", name)


@dataclass(frozen=True)
class Plan:
    """Everything decided before any program is written."""

    config: DistributeTranspilerConfig
    mode: DistributedMode
    cluster: Cluster
    origin: Program
    startup: Program
    section: OptimizeSection
    dist_vars: tuple[DistVar, ...]
    table: str | None
    remote_sparse: frozenset[str]
    server: ServerRuntimeConfig = field(default_factory=ServerRuntimeConfig)
    """The pservers' RPC thread counts, recorded on `listen_and_serv`."""

    @property
    def sync(self) -> bool:
        return self.mode is DistributedMode.SYNC

    @property
    def per_trainer_grads(self) -> bool:
        """Whether each trainer sends its own copy of a grad block for the pserver to merge."""
        return self.sync and self.cluster.trainers > 1

    def sent_name(self, merged: str, trainer_id: int | None = None) -> str:
        """The name a trainer sends grad block `merged` under."""
        tid = self.cluster.trainer_id if trainer_id is None else trainer_id
        return trainer_copy(merged, tid) if self.per_trainer_grads else merged

    def in_param_order(self) -> list[DistVar]:
        """The pairs in program order of their update ops (dispatch order may be shuffled)."""
        order = {pg.param: n for n, pg in enumerate(self.section.params_grads)}
        return sorted(self.dist_vars, key=lambda d: order[d.param])

    def dist_var(self, param: str) -> DistVar:
        return self._by_param[param]

    def on(self, endpoint: str) -> list[tuple[DistVar, int]]:
        """(pair, block index) of every block placed on `endpoint`, in dispatch order."""
        return list(self._by_endpoint.get(endpoint, ()))

    @cached_property
    def _by_param(self) -> dict[str, DistVar]:
        return {d.param: d for d in self.dist_vars}

    @cached_property
    def _by_endpoint(self) -> dict[str, list[tuple[DistVar, int]]]:
        placed: dict[str, list[tuple[DistVar, int]]] = defaultdict(list)
        for d in self.dist_vars:
            for i, block in enumerate(d.params):
                placed[block.endpoint].append((d, i))
        return placed


def slice_pass(origin: Program, section: OptimizeSection, config: DistributeTranspilerConfig,
               pservers: int, exclude: set[str]) -> list[SlicedPair]:
    """Cut every (param, grad) pair not in `exclude` into row blocks (docs/transpiler.md §4)."""
    block = origin.global_block()
    whole = section.whole_params()
    out = []
    for pair in section.params_grads:
        if pair.param in exclude:
            continue
        count = pservers if config.slice_var_up and pair.param not in whole else 1
        blocks = slice_variable([block.var(pair.param)], count, config.min_block_size)
        out.append(SlicedPair(pair, tuple(blocks)))
    return out


def dispatch_pass(origin: Program, sliced: Sequence[SlicedPair],
                  config: DistributeTranspilerConfig, cluster: Cluster) -> tuple[DistVar, ...]:
    """Place every block (docs/transpiler.md §5): grad blocks first, then param blocks from a reset
    dispatcher; unsliced pairs are shuffled first, as the original did with numpy's global
    generator seeded by the program's random_seed, so blocks land where they did there."""
    items = list(sliced)
    if not config.slice_var_up:
        numpy_legacy_shuffle(items, origin.random_seed)
    dispatcher = config.split_method(list(cluster.pservers))
    names = [(_names(s.pair.param, s.blocks), _names(s.pair.grad, s.blocks)) for s in items]
    dispatcher.reset()
    grad_eps = dispatcher.dispatch([g for _, gs in names for g in gs])
    dispatcher.reset()
    param_eps = dispatcher.dispatch([p for ps, _ in names for p in ps])
    if grad_eps != param_eps:
        raise ValueError(f"split_method {config.split_method.__name__} placed param blocks "
                         "apart from their grad blocks")
    out, k = [], 0
    for s, (pnames, gnames) in zip(items, names):
        eps = param_eps[k:k + len(s.blocks)]
        k += len(s.blocks)
        out.append(_dist_var(origin, s, pnames, gnames, eps))
    return tuple(out)


def _names(name: str, blocks: Sequence[VarBlock]) -> list[str]:
    return [block_name(name, i, len(blocks)) for i in range(len(blocks))]


def _dist_var(origin: Program, s: SlicedPair, pnames: list[str], gnames: list[str],
              eps: list[str]) -> DistVar:
    block = origin.global_block()
    shapes = slice_shapes(block.var(s.pair.param).shape, s.blocks)
    params = tuple(VarSlice(n, s.pair.param, i, shape, row, ep)
                   for i, (n, (shape, row), ep) in enumerate(zip(pnames, shapes, eps)))
    grads = tuple(VarSlice(n, s.pair.grad, i, shape, row, ep)
                  for i, (n, (shape, row), ep) in enumerate(zip(gnames, shapes, eps)))
    return DistVar(s.pair.param, s.pair.grad, block.var(s.pair.grad).type, params, grads)
