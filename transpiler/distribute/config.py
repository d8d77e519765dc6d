"""What the distribute transpiler is asked to do: `DistributeTranspilerConfig` and the
`DistributedMode` it resolves to.

The config holds Paddle's fields with Paddle's defaults (docs/transpiler.md §3). Each field is
checked when it is set, so a bad value fails where it is written, not deep inside `transpile`;
fields that only conflict with each other are checked by `validate()`, which `DistributeTranspiler`
calls. `sync_mode` and `runtime_split_send_recv` exclude each other at assignment time, as in the
original: set one to False before setting the other to True.

The mode a transpile runs in is `resolve_mode(config, sync_mode)`, where `sync_mode` is
`transpile`'s own argument: training is synchronous only when both the config and the argument
say so (or when `completely_not_async` forces it); GEO wins when `geo_sgd_mode` is set.
"""

from __future__ import annotations

import enum
import math
import os
from typing import Any

# re-exported: the names a config's callers have imported from here
from ..framework import DEFAULT_PADDLE_VERSION as DEFAULT_PADDLE_VERSION
from ..framework import PADDLE_VERSION_ENV as PADDLE_VERSION_ENV
from ..framework import env_paddle_version
from .dispatch import PSDispatcher, RoundRobin

MIN_BLOCK_SIZE = 8192
MODES = ("pserver", "nccl2", "collective")
SINGLE_PROCESS_MULTI_THREAD = "single_process_multi_thread"
"""The collective mode whose one process drives all its devices: one ring, no id exchange."""
COLLECTIVE_MODES = ("grad_allreduce", "local_sgd", SINGLE_PROCESS_MULTI_THREAD)
COMPRESSION_METHODS = ("none", "topk", "fp16", "int8")
PADDLE_VERSIONS = ("1.2", "1.8", "2.x")
"""The releases of the original whose program shapes `paddle_version` selects;
docs/transpiler.md §9 lists what differs."""
PADDLE_VERSION_2X = "2.x"
"""Paddle 2.x (``paddle.distributed.transpiler``): 1.8's programs but for the op names and the
remote-prefetch tables docs/transpiler.md §9 lists."""
DEFAULT_TOPK_RATIO = 0.01


class DistributedMode(enum.IntEnum):
    """The `distributed_mode` attribute of `listen_and_serv` (the original's values)."""

    SYNC = 0
    ASYNC = 1
    HALF_ASYNC = 2
    GEO = 3


_BOOL_FIELDS = ("slice_var_up", "enable_dc_asgd", "half_async", "completely_not_async",
                "geo_sgd_mode", "use_hierarchical_allreduce", "print_log", "wait_port")


class DistributeTranspilerConfig:
    """Fields and defaults of Paddle's `DistributeTranspilerConfig` (docs/transpiler.md §3).

    `local_sgd_k_steps` (default 1) is this project's addition: how many local steps
    `collective_mode="local_sgd"` takes between two parameter averages. `print_log` makes
    `transpile` print what it decides (pairs, placements), as the original's log did.
    `wait_port` is kept for the original's scripts; the trainer's wait for its pservers is
    `get_trainer_program(wait_port=...)`, recorded as the program attribute ``_wait_port``.
    `staleness` (default None) is this project's too: bounded staleness (SSP) in async mode, a
    trainer reading the parameters at most that many steps ahead of the slowest trainer (an
    int >= 0, or ``math.inf``: no bound); None: plain async (docs/transpiler.md §3).
    `compression` is this project's too: ``{"method": "topk" | "fp16" | "int8" | "none",
    "ratio": 0.01}`` (None: none) packs each dense gradient a trainer sends to a pserver, with
    error feedback (docs/transpiler.md §6; `compression_settings` reads it).
    `paddle_version` is this project's too: which release of the original the programs follow
    where releases differ, "1.8" (the default), "1.2" or "2.x" (docs/transpiler.md §9): 1.8
    fuses a remote-prefetch table's lookups into one `distributed_lookup_table`, 1.2 leaves
    each in its place; 2.x is 1.8 but for the prefetch block's op, `lookup_sparse_table_read`.
    A config takes its default from ``PSLAB_PADDLE_VERSION`` when set, so that a ported script
    runs unchanged as either release.
    """

    def __init__(self, **fields: Any) -> None:
        self.slice_var_up = True
        self.split_method: type[PSDispatcher] = RoundRobin
        self.min_block_size = MIN_BLOCK_SIZE
        self.enable_dc_asgd = False
        self.mode = "pserver"
        self.sync_mode = True
        self.runtime_split_send_recv = False
        self.half_async = False
        self.completely_not_async = False
        self.geo_sgd_mode = False
        self.geo_sgd_need_push_nums = 100
        self.nccl_comm_num = 1
        self.use_hierarchical_allreduce = False
        self.hierarchical_allreduce_inter_nranks = 0
        self.collective_mode: str | None = None
        self.local_sgd_k_steps = 1
        self.print_log = False
        self.wait_port = True
        self.staleness: int | float | None = None
        self.compression: dict[str, Any] | None = None
        self.paddle_version = env_paddle_version()
        for name, value in fields.items():
            if not hasattr(self, name):
                raise ValueError(f"DistributeTranspilerConfig: unknown field {name!r}")
            setattr(self, name, value)

    def __setattr__(self, name: str, value: Any) -> None:
        check = _FIELD_CHECKS.get(name)
        if check is not None:
            check(self, value)
        object.__setattr__(self, name, value)

    def validate(self) -> None:
        """Raise ValueError naming the fields when two settings contradict each other."""
        compressed = compression_settings(self)[0] != "none"
        conflicts = [
            (self.mode != "collective" and self.collective_mode is not None,
             f"collective_mode={self.collective_mode!r} needs mode='collective', not {self.mode!r}"),
            (self.mode == "collective" and self.collective_mode is None,
             f"mode='collective' needs collective_mode, one of {COLLECTIVE_MODES}"),
            (self.geo_sgd_mode and self.mode != "pserver",
             f"geo_sgd_mode runs in mode='pserver', not {self.mode!r}"),
            (self.geo_sgd_mode and self.enable_dc_asgd,
             "geo_sgd_mode and enable_dc_asgd cannot both be set"),
            (self.geo_sgd_mode and self.completely_not_async,
             "geo_sgd_mode and completely_not_async cannot both be set"),
            (self.half_async and self.completely_not_async,
             "half_async and completely_not_async cannot both be set"),
            (self.enable_dc_asgd and self.completely_not_async,
             "enable_dc_asgd is asynchronous; completely_not_async makes training synchronous"),
            (self.staleness is not None and not self.runtime_split_send_recv,
             "staleness (bounded-staleness async) needs runtime_split_send_recv (async mode)"),
            (self.staleness is not None and (self.enable_dc_asgd or self.geo_sgd_mode
                                             or self.completely_not_async),
             "staleness cannot be combined with enable_dc_asgd, geo_sgd_mode or "
             "completely_not_async"),
            (self.use_hierarchical_allreduce and self.mode != "nccl2",
             f"use_hierarchical_allreduce needs mode='nccl2', not {self.mode!r}"),
            (compressed and self.mode != "pserver",
             f"compression packs the gradients trainers send to pservers; mode={self.mode!r} "
             "has none"),
            (compressed and self.geo_sgd_mode,
             "compression packs gradients; geo_sgd_mode sends parameter deltas"),
            (self.use_hierarchical_allreduce and self.hierarchical_allreduce_inter_nranks < 2,
             "use_hierarchical_allreduce needs hierarchical_allreduce_inter_nranks >= 2 "
             f"(ranks per node), got {self.hierarchical_allreduce_inter_nranks}"),
        ]
        for failed, message in conflicts:
            if failed:
                raise ValueError(f"DistributeTranspilerConfig: {message}")

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"DistributeTranspilerConfig({fields})"


RPC_THREAD_FLAGS = {"_rpc_send_thread_num": "FLAGS_rpc_send_thread_num",
                    "_rpc_get_thread_num": "FLAGS_rpc_get_thread_num",
                    "_rpc_prefetch_thread_num": "FLAGS_rpc_prefetch_thread_num"}
DEFAULT_RPC_THREADS = 12


class ServerRuntimeConfig:
    """Paddle's `ServerRuntimeConfig`: how many RPC threads a pserver serves sends, gets and
    prefetches with. Each field starts from its ``FLAGS_rpc_*_thread_num`` environment variable
    (12 when unset), as in the original; `DistributeTranspiler` writes them on the pserver's
    `listen_and_serv` (``rpc_send_thread_num``, ``rpc_get_thread_num``,
    ``rpc_prefetch_thread_num``; docs/transpiler.md §7).

    DESIGN: pslab's pserver serves every request on one event loop, so the counts are recorded
    for the programs to compare with the original's and the runtime does not read them.
    """

    def __init__(self) -> None:
        self._rpc_send_thread_num = _flag(RPC_THREAD_FLAGS["_rpc_send_thread_num"])
        self._rpc_get_thread_num = _flag(RPC_THREAD_FLAGS["_rpc_get_thread_num"])
        self._rpc_prefetch_thread_num = _flag(RPC_THREAD_FLAGS["_rpc_prefetch_thread_num"])

    def validate(self) -> None:
        """ValueError naming the field whose count is not an int >= 1."""
        for field in RPC_THREAD_FLAGS:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ServerRuntimeConfig.{field}: must be an int >= 1, got {value!r}")

    def listen_and_serv_attrs(self) -> dict[str, int]:
        """The attributes the original set from this object on `listen_and_serv`."""
        return {"rpc_get_thread_num": self._rpc_get_thread_num,
                "rpc_send_thread_num": self._rpc_send_thread_num,
                "rpc_prefetch_thread_num": self._rpc_prefetch_thread_num}

    def __repr__(self) -> str:
        fields = ", ".join(f"{f}={getattr(self, f)}" for f in RPC_THREAD_FLAGS)
        return f"ServerRuntimeConfig({fields})"


def _flag(name: str) -> int:
    raw = os.getenv(name, str(DEFAULT_RPC_THREADS))
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name}: must be an int, got {raw!r}") from None


def compression_settings(config: DistributeTranspilerConfig) -> tuple[str, float]:
    """The compression method and top-k's ratio of `config` (("none", ...) when unset)."""
    spec = config.compression or {}
    return spec.get("method", "none"), float(spec.get("ratio", DEFAULT_TOPK_RATIO))


def resolve_mode(config: DistributeTranspilerConfig, sync_mode: bool) -> DistributedMode:
    """Spec section 3: SYNC if sync or completely_not_async; else ASYNC if the runtime splits
    sends and receives; else HALF_ASYNC; GEO whenever geo_sgd_mode is set."""
    if config.geo_sgd_mode:
        return DistributedMode.GEO
    if (config.sync_mode and sync_mode) or config.completely_not_async:
        return DistributedMode.SYNC
    if config.runtime_split_send_recv:
        return DistributedMode.ASYNC
    return DistributedMode.HALF_ASYNC


# -- field checks ---------------------------------------------------------------------------------

def _fail(name: str, message: str) -> None:
    raise ValueError(f"DistributeTranspilerConfig.{name}: {message}")


def _check_bool(name: str) -> Any:
    def check(_: DistributeTranspilerConfig, value: Any) -> None:
        if not isinstance(value, bool):
            _fail(name, f"must be a bool, got {value!r}")
    return check


def _check_int(name: str, low: int) -> Any:
    def check(_: DistributeTranspilerConfig, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            _fail(name, f"must be an int >= {low}, got {value!r}")
    return check


def _check_sync_mode(config: DistributeTranspilerConfig, value: Any) -> None:
    if not isinstance(value, bool):
        _fail("sync_mode", f"must be a bool, got {value!r}")
    if value and getattr(config, "runtime_split_send_recv", False):
        _fail("sync_mode", "cannot be True while runtime_split_send_recv is True "
                           "(set runtime_split_send_recv to False first)")


def _check_runtime_split(config: DistributeTranspilerConfig, value: Any) -> None:
    if not isinstance(value, bool):
        _fail("runtime_split_send_recv", f"must be a bool, got {value!r}")
    if value and config.sync_mode:
        _fail("runtime_split_send_recv", "cannot be True while sync_mode is True "
                                         "(set sync_mode to False first)")


def _check_split_method(_: DistributeTranspilerConfig, value: Any) -> None:
    if not (isinstance(value, type) and issubclass(value, PSDispatcher)) or value is PSDispatcher:
        _fail("split_method", f"must be a PSDispatcher subclass such as RoundRobin or HashName, "
                              f"got {value!r}")


def _check_staleness(_: DistributeTranspilerConfig, value: Any) -> None:
    if value is None or value == math.inf:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        _fail("staleness", f"must be None, an int >= 0 or math.inf, got {value!r}")


def _check_compression(_: DistributeTranspilerConfig, value: Any) -> None:
    if value is None:
        return
    if not isinstance(value, dict) or not set(value) <= {"method", "ratio"} \
            or "method" not in value:
        _fail("compression", f"must be None or a dict with 'method' and optionally 'ratio', "
                             f"got {value!r}")
    if value["method"] not in COMPRESSION_METHODS:
        _fail("compression", f"method must be one of {COMPRESSION_METHODS}, got "
                             f"{value['method']!r}")
    ratio = value.get("ratio", DEFAULT_TOPK_RATIO)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        _fail("compression", f"ratio must be a number in (0, 1], got {ratio!r}")


def _check_choice(name: str, choices: tuple[Any, ...]) -> Any:
    def check(_: DistributeTranspilerConfig, value: Any) -> None:
        if value not in choices:
            _fail(name, f"must be one of {choices}, got {value!r}")
    return check


_FIELD_CHECKS: dict[str, Any] = {
    **{name: _check_bool(name) for name in _BOOL_FIELDS},
    "sync_mode": _check_sync_mode,
    "runtime_split_send_recv": _check_runtime_split,
    "split_method": _check_split_method,
    "min_block_size": _check_int("min_block_size", MIN_BLOCK_SIZE),
    "geo_sgd_need_push_nums": _check_int("geo_sgd_need_push_nums", 1),
    "nccl_comm_num": _check_int("nccl_comm_num", 1),
    "hierarchical_allreduce_inter_nranks": _check_int("hierarchical_allreduce_inter_nranks", 0),
    "local_sgd_k_steps": _check_int("local_sgd_k_steps", 1),
    "staleness": _check_staleness,
    "mode": _check_choice("mode", MODES),
    "collective_mode": _check_choice("collective_mode", (None,) + COLLECTIVE_MODES),
    "compression": _check_compression,
    "paddle_version": _check_choice("paddle_version", PADDLE_VERSIONS),
}
