"""`DistributeTranspiler`: one training program in, the programs of every role out.

`transpile` validates its arguments, copies the caller's programs and runs one straight pipeline
per mode on the copies; at the end, as the original did, the caller's main and startup programs
(the default ones when none is passed) become the trainer's, in place (``in_place=False`` leaves
them as they were). The pserver programs are built from the copies, so they are the same
either way. Pserver mode (sync, async, half-async, DC-ASGD)::

    read optimize section -> slice -> dispatch -> rewrite trainer -> trainer startup -> RPC plan
                                               \\-> (per endpoint, on request) pserver, its startup

Geo-SGD reuses slice and dispatch (see `geo`); nccl2 and collective modes only add
communication ops to the copies (see `collective`). Every step is a plain function of the `Plan`
before it, so transpiling twice gives identical programs.

Modes (docs/transpiler.md §3, `config.resolve_mode`): SYNC when both ``config.sync_mode`` and
`transpile`'s ``sync_mode`` hold (or ``completely_not_async``); else ASYNC with
``runtime_split_send_recv`` (whole grads sent, the runtime cuts them) or HALF_ASYNC (the
transpiler cuts them; trainers may send in the background); GEO with ``geo_sgd_mode``.
"""

from __future__ import annotations

import copy
from typing import Any

from ..framework import default_main_program, default_startup_program
from ..ir import Program
from .analysis import check_placeable, read_optimize_section
from .cluster import Cluster, pserver_cluster, trainer_cluster
from .collective import transpile_collective, transpile_nccl2
from .config import DistributedMode, DistributeTranspilerConfig, ServerRuntimeConfig, resolve_mode
from .geo import build_geo_pserver_program, rewrite_geo_trainer, with_distribute_update_vars
from .lookup_table import check_table_optimizer, find_distributed_table, remote_sparse_params
from .plan import Plan, dispatch_pass, slice_pass
from .placements import placements, slice_vars_and_attrs
from .pserver import build_pserver_program
from .rpc_plan import rpc_plan_pass
from .startup import build_pserver_startup, build_trainer_startup
from .trainer import rewrite_trainer, sends_lr_counter


def make_plan(config: DistributeTranspilerConfig, cluster: Cluster, mode: DistributedMode,
              program: Program, startup: Program,
              server: ServerRuntimeConfig | None = None) -> Plan:
    """Read, slice and dispatch: everything decided before programs are written."""
    section = with_distribute_update_vars(read_optimize_section(program), program, mode)
    check_placeable(section)
    table = find_distributed_table(program)
    if table is not None:
        if mode is DistributedMode.GEO:
            raise ValueError(f"program: geo_sgd_mode does not support the distributed lookup "
                             f"table {table!r}; use is_sparse without is_distributed")
        check_table_optimizer(section, table)
    remote = set() if mode is DistributedMode.GEO else remote_sparse_params(program, section)
    if config.enable_dc_asgd and mode not in (DistributedMode.ASYNC, DistributedMode.HALF_ASYNC):
        raise ValueError("enable_dc_asgd needs asynchronous training: pass sync_mode=False "
                         f"(the mode is {mode.name})")
    sliced = slice_pass(program, section, config, len(cluster.pservers), {table} if table else set())
    dist_vars = dispatch_pass(program, sliced, config, cluster)
    return Plan(config, mode, cluster, program, startup, section, dist_vars, table, frozenset(remote),
                server if server is not None else ServerRuntimeConfig())


def distributed_attrs(plan: Plan) -> dict[str, Any]:
    """Program attributes a runtime reads (docs/transpiler.md §6.9, and the job's shape)."""
    return {
        "_is_distributed": True,
        "_endpoints": list(plan.cluster.pservers),
        "_ps_endpoint": plan.cluster.current_endpoint,
        "_is_chief": plan.cluster.is_chief,
        "_distributed_lookup_table": plan.table,
        "_parameters_on_pservers": placements(plan, None),
        "_trainer_id": plan.cluster.trainer_id,
        "_trainers": plan.cluster.trainers,
        "_distributed_mode": int(plan.mode),
    }


def trainer_programs(plan: Plan) -> tuple[Program, Program]:
    """The trainer's main and startup programs of a pserver-mode or geo plan, each with its
    RPC plan written on its RPC ops (`rpc_plan`)."""
    if plan.mode is DistributedMode.GEO:
        trainer, startup = rewrite_geo_trainer(plan)
    else:
        trainer = rewrite_trainer(plan)
        startup = build_trainer_startup(plan, plan.in_param_order(), sends_lr_counter(plan))
    trainer.attrs.update(distributed_attrs(plan))
    return rpc_plan_pass(trainer), rpc_plan_pass(startup)


def plan_log(plan: Plan) -> list[str]:
    """What `print_log` prints: each (param, grad) pair, then where each param block went."""
    pairs = [f"adding param_grad pair: {d.param} {d.grad}" for d in plan.in_param_order()]
    blocks = [f"{p.name} {tuple(p.shape)} -> {p.endpoint}"
              for d in plan.in_param_order() for p in d.params]
    return pairs + blocks


class DistributeTranspiler:
    """Paddle's parameter-server transpiler (docs/transpiler.md, sections 3 to 10).

    `server_config` (a `ServerRuntimeConfig`, default one read from the ``FLAGS_rpc_*``
    environment) sets the RPC thread counts on every pserver's `listen_and_serv`; the original
    took it through ``_set_server_config``, which is kept.
    """

    def __init__(self, config: DistributeTranspilerConfig | None = None,
                 server_config: ServerRuntimeConfig | None = None) -> None:
        if config is not None and not isinstance(config, DistributeTranspilerConfig):
            raise ValueError(f"config: must be a DistributeTranspilerConfig, got {config!r}")
        self.config = config if config is not None else DistributeTranspilerConfig()
        self.config.validate()
        self._set_server_config(server_config)
        self._plan: Plan | None = None
        self._mode_name = ""
        self._trainer: Program | None = None
        self._trainer_startup: Program | None = None
        self._in_place = True

    def transpile(self, trainer_id: int, program: Program | None = None,
                  pservers: str = "127.0.0.1:6174", trainers: int | str = 1,
                  sync_mode: bool = True, startup_program: Program | None = None,
                  current_endpoint: str | None = "127.0.0.1:6174", *,
                  in_place: bool = True) -> None:
        """Plan the job and build the trainer's programs; the pservers' are built on request.

        In nccl2 and collective modes `trainers` is the trainers' endpoint list instead of a
        count. `program` and `startup_program` (default: the default programs) become the
        trainer's main and startup programs in place, as in the original, so a script that
        goes on with ``default_main_program()`` runs the trainer's program; `in_place=False`
        (pslab's) leaves them unchanged, for callers that transpile one program for many
        roles (docs/transpiler.md, section 6.10).
        """
        config = copy.copy(self.config)
        config.validate()
        if not isinstance(sync_mode, bool):
            raise ValueError(f"sync_mode: must be a bool, got {sync_mode!r}")
        given = (program if program is not None else default_main_program(),
                 startup_program if startup_program is not None else default_startup_program())
        main, startup = given[0].clone(), given[1].clone()
        self._plan, self._mode_name, self._in_place = None, config.mode, in_place
        if config.mode == "pserver":
            cluster = pserver_cluster(trainer_id, pservers, trainers, current_endpoint)
            self.server_config.validate()
            self._plan = make_plan(config, cluster, resolve_mode(config, sync_mode), main, startup,
                                   copy.copy(self.server_config))
            self._trainer, self._trainer_startup = trainer_programs(self._plan)
            if config.print_log:
                print("\n".join(plan_log(self._plan)))
        else:
            cluster = trainer_cluster(trainer_id, trainers, current_endpoint, config.mode,
                                      config.collective_mode)
            if config.mode == "nccl2":
                transpile_nccl2(config, cluster, main, startup)
            else:
                transpile_collective(config, cluster, main, startup)
            self._trainer, self._trainer_startup = main, startup
        if in_place:
            given[0].take_contents(self._trainer)
            given[1].take_contents(self._trainer_startup)
            self._trainer, self._trainer_startup = given

    def _set_server_config(self, server_config: ServerRuntimeConfig | None = None) -> None:
        """The original's setter: None gives a fresh `ServerRuntimeConfig`; anything but one is a
        TypeError, as there. Takes effect at the next `transpile`."""
        if server_config is None:
            server_config = ServerRuntimeConfig()
        elif not isinstance(server_config, ServerRuntimeConfig):
            raise TypeError("server_config: must be a ServerRuntimeConfig, "
                            f"got {server_config!r}")
        server_config.validate()
        self.server_config = server_config

    # -- trainer -------------------------------------------------------------------------------
    def get_trainer_program(self, wait_port: bool = True) -> Program:
        """The trainer's main program: the program `transpile` rewrote in place (the same
        object, as in the original), or a fresh copy after ``in_place=False``. ``wait_port``
        (default True, as in the original) is recorded as the program attribute
        ``_wait_port``: a real trainer waits for the pservers' ports before its first step
        (`runtime.network.ports`). The original waited inside this call, before the script
        ran its startup program, so the wish is recorded on the trainer's startup program too
        (in place: the caller's; after ``in_place=False``, the copies taken from now on): a
        Paddle script's executor runs that program first (`runtime.services.paddle_compat`)."""
        trainer = self._own(self._trainer)
        trainer.attrs["_wait_port"] = bool(wait_port)
        self._require(self._trainer_startup).attrs["_wait_port"] = bool(wait_port)
        return trainer

    def get_trainer_startup_program(self) -> Program:
        """The trainer's startup program: the one `transpile` rewrote in place, or a fresh copy
        after ``in_place=False``."""
        return self._own(self._trainer_startup)

    # -- the distributed lookup table -----------------------------------------------------------
    @property
    def has_distributed_lookup_table(self) -> bool:
        """Whether the transpiled program has a distributed lookup table (an embedding with
        ``is_distributed=True``), as fluid's transpiler answers after `transpile`."""
        return self._plan is not None and self._plan.table is not None

    @property
    def table_name(self) -> str | None:
        """The distributed lookup table's parameter name (each pserver's program declares its
        rows under it); None without one."""
        return self._plan.table if self._plan is not None else None

    # -- pservers ------------------------------------------------------------------------------
    def get_pserver_program(self, endpoint: str) -> Program:
        plan = self._pserver_plan()
        plan.cluster.pserver_index(endpoint)
        if plan.mode is DistributedMode.GEO:
            program = build_geo_pserver_program(plan, endpoint)
        else:
            program = build_pserver_program(plan, endpoint)
        program.attrs.update(_pserver_attrs(plan, endpoint))
        return program

    def get_startup_program(self, endpoint: str, pserver_program: Program | None = None,
                            startup_program: Program | None = None) -> Program:
        """The startup of the pserver at `endpoint` (`startup_program` is accepted for the
        original's signature and ignored: the one given to `transpile` is used)."""
        plan = self._pserver_plan()
        plan.cluster.pserver_index(endpoint)
        main = pserver_program if pserver_program is not None else self.get_pserver_program(endpoint)
        return build_pserver_startup(plan, endpoint, main)

    def get_pserver_programs(self, endpoint: str) -> tuple[Program, Program]:
        main = self.get_pserver_program(endpoint)
        return main, self.get_startup_program(endpoint, main)

    # -- helpers -------------------------------------------------------------------------------
    def _own(self, program: Program | None) -> Program:
        """`program` itself where `transpile` wrote it in place, else a copy of it."""
        program = self._require(program)
        return program if self._in_place else program.clone()

    def _require(self, program: Program | None) -> Program:
        if program is None:
            raise RuntimeError("DistributeTranspiler: call transpile() first")
        return program

    def _pserver_plan(self) -> Plan:
        if self._plan is None:
            if self._mode_name in ("nccl2", "collective"):
                raise ValueError(f"endpoint: mode {self._mode_name!r} has no pservers")
            raise RuntimeError("DistributeTranspiler: call transpile() first")
        return self._plan


def _pserver_attrs(plan: Plan, endpoint: str) -> dict[str, Any]:
    return {
        "_is_distributed": True,
        "_endpoints": list(plan.cluster.pservers),
        "_ps_endpoint": endpoint,
        "_distributed_lookup_table": plan.table,
        "_parameters_on_pservers": placements(plan, endpoint),
        "_slice_vars_and_attrs": slice_vars_and_attrs(plan, endpoint),
        "_trainers": plan.cluster.trainers,
        "_distributed_mode": int(plan.mode),
    }


class GeoSgdTranspiler(DistributeTranspiler):
    """`DistributeTranspiler` in Geo-SGD mode (``geo_sgd_mode`` set on a copy of the config)."""

    def __init__(self, config: DistributeTranspilerConfig | None = None,
                 server_config: ServerRuntimeConfig | None = None) -> None:
        geo = copy.copy(config) if config is not None else DistributeTranspilerConfig()
        geo.geo_sgd_mode = True
        super().__init__(geo, server_config)
