"""A scenario's ``transpiler`` and ``cluster`` sections, as plain dicts, mapped onto
`DistributeTranspilerConfig` and the arguments of `DistributeTranspiler.transpile`.

The scenario file is parsed and validated elsewhere (``runtime.config.scenario``, or
``yaml.safe_load`` in the ``show`` command); this module takes the sections as plain values, so both
can share it without the transpiler importing the runtime. A missing key takes the scenario schema's
default, which is also the config's. Every error is a `ValueError` naming the scenario field.

Modes (``transpiler.mode``), onto docs/transpiler.md §3:

- ``sync``: ``sync_mode`` True (SYNC);
- ``async``: ``sync_mode`` False and ``runtime_split_send_recv`` True (ASYNC: whole grads are
  sent, the runtime cuts them); ``dc_asgd`` adds ``enable_dc_asgd`` (async only);
- ``ssp``: async with bounded staleness (Stale Synchronous Parallel): async's fields and
  ``staleness`` = ``staleness`` (an int >= 0, or ``inf``: no bound), which only ``ssp`` takes;
- ``half_async``: ``sync_mode`` False and ``half_async`` True (HALF_ASYNC: the transpiler cuts
  the grads, a local send barrier only waits for this trainer's sends to leave);
- ``geo``: ``geo_sgd_mode`` True, ``geo_sgd_need_push_nums`` = ``geo_push_every`` (which
  other modes ignore, as the schema always carries it);
- ``nccl2``: ``mode`` nccl2, ``nccl_comm_num`` rings;
- ``collective``: ``mode`` collective with ``collective_mode`` (grad_allreduce, local_sgd or
  single_process_multi_thread), ``local_sgd_k_steps`` and ``nccl_comm_num``.

``compression`` (``{method, ratio}``) is ``config.compression`` as it is; a method other than
none needs a mode whose trainers send gradients to pservers (sync, async, ssp, half_async).

Endpoints (``cluster``): ``endpoints.pservers`` when given, else ``host:base_port+i`` for each
of ``pservers`` servers (``host`` 127.0.0.1, a ``base_port`` of 0 meaning 6170). nccl2 and
collective modes have no pservers (``pservers`` is ignored): the trainers' endpoints are
``endpoints.trainers`` when given, else ``host:base_port+i`` for each trainer.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from ..ir import Program
from .config import COLLECTIVE_MODES, DistributeTranspilerConfig, compression_settings
from .dispatch import HashName, PSDispatcher, RoundRobin
from .modes import COMPRESSED_MODES, MODE_NAMES, MODES, TRAINER_RING_MODES, conflicts
from .transpiler import DistributeTranspiler

DEFAULT_HOST = "127.0.0.1"
DEFAULT_BASE_PORT = 6170
SPLIT_METHODS: dict[str, type[PSDispatcher]] = {"round_robin": RoundRobin, "hash_name": HashName}
TRANSPILER_FIELDS = ("mode", "slice_var_up", "split_method", "min_block_size", "dc_asgd",
                     "geo_push_every", "collective_mode", "local_sgd_k_steps", "nccl_comm_num",
                     "staleness", "compression")
CLUSTER_FIELDS = ("pservers", "trainers", "endpoints", "host", "base_port")


@dataclass(frozen=True)
class TranspileArgs:
    """What `DistributeTranspiler.transpile` needs besides the programs and the trainer id."""

    config: DistributeTranspilerConfig
    sync_mode: bool
    pservers: tuple[str, ...]
    trainers: int
    trainer_endpoints: tuple[str, ...] = ()
    """nccl2 and collective modes: every trainer's endpoint (else none)."""


def _section(value: Mapping[str, Any] | None, name: str, fields: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}: must be a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(fields))
    if unknown:
        raise ValueError(f"{name}.{unknown[0]}: unknown field (one of {', '.join(fields)})")
    return dict(value)


def _choice(section: dict[str, Any], key: str, choices: tuple[str, ...] | list[str],
            default: str) -> str:
    value = section.get(key, default)
    if value not in choices:
        raise ValueError(f"transpiler.{key}: must be one of {', '.join(choices)}, got {value!r}")
    return str(value)


def _set(config: DistributeTranspilerConfig, field: str, value: Any, key: str) -> None:
    """Set a config field, naming the scenario key in the error."""
    try:
        setattr(config, field, value)
    except ValueError as err:
        reason = str(err).split(": ", 1)[-1]
        raise ValueError(f"transpiler.{key}: {reason}") from None


def config_from_spec(transpiler: Mapping[str, Any] | None) -> tuple[DistributeTranspilerConfig, bool]:
    """The config and `transpile`'s ``sync_mode`` for a scenario's ``transpiler`` section: its
    mode's row of `MODES` sets the fields, after the cross-field rules (`conflicts`)."""
    spec = _section(transpiler, "transpiler", TRANSPILER_FIELDS)
    mode = MODES[_choice(spec, "mode", MODE_NAMES, "sync")]
    split = _choice(spec, "split_method", list(SPLIT_METHODS), "round_robin")
    if mode.name == "collective":
        _choice(spec, "collective_mode", COLLECTIVE_MODES, "grad_allreduce")
    config = DistributeTranspilerConfig()
    _set(config, "compression", spec.get("compression"), "compression")
    for message, fields in conflicts(mode.name, spec.get("dc_asgd", False) is not False,
                                     spec.get("staleness"), compression_settings(config)[0]):
        raise ValueError(f"transpiler.{fields[0]}: {message.removeprefix(fields[0] + ' ')}")
    _set(config, "slice_var_up", spec.get("slice_var_up", True), "slice_var_up")
    _set(config, "split_method", SPLIT_METHODS[split], "split_method")
    _set(config, "min_block_size", spec.get("min_block_size", config.min_block_size),
         "min_block_size")
    for field, value, key in mode.settings(spec):
        _set(config, field, value, key)
    return config, mode.synchronous


def _count(spec: dict[str, Any], key: str) -> int:
    value = spec.get(key, 1)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"cluster.{key}: must be an int >= 1, got {value!r}")
    return value


def pserver_endpoints(cluster: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The pservers' endpoints of a scenario's ``cluster`` section."""
    return _endpoints(cluster, "pservers")


def trainer_endpoints(cluster: Mapping[str, Any] | None) -> tuple[str, ...]:
    """The trainers' endpoints of a scenario's ``cluster`` section (nccl2, collective)."""
    return _endpoints(cluster, "trainers")


def _endpoints(cluster: Mapping[str, Any] | None, role: str) -> tuple[str, ...]:
    """The endpoints of `role` (pservers, trainers): listed, else numbered from a base port."""
    spec = _section(cluster, "cluster", CLUSTER_FIELDS)
    count = _count(spec, role)
    listed = (spec.get("endpoints") or {}).get(role)
    if listed is not None:
        if not isinstance(listed, list) or len(listed) != count:
            raise ValueError(f"cluster.endpoints.{role}: must list {count} endpoints "
                             f"(cluster.{role}), got {listed!r}")
        return tuple(str(e) for e in listed)
    return _numbered(spec, count)


def _numbered(spec: dict[str, Any], count: int) -> tuple[str, ...]:
    """``host:base_port+i`` for `count` nodes."""
    host = spec.get("host", DEFAULT_HOST)
    base = spec.get("base_port", 0)
    if isinstance(base, bool) or not isinstance(base, int) or not 0 <= base <= 65535 - count:
        raise ValueError(f"cluster.base_port: must be an int in 0..{65535 - count}, got {base!r}")
    return tuple(f"{host}:{(base or DEFAULT_BASE_PORT) + i}" for i in range(count))


def transpile_args(transpiler: Mapping[str, Any] | None,
                   cluster: Mapping[str, Any] | None) -> TranspileArgs:
    """Everything a scenario says about how to transpile."""
    config, sync_mode = config_from_spec(transpiler)
    trainers = _count(_section(cluster, "cluster", CLUSTER_FIELDS), "trainers")
    if config.mode in TRAINER_RING_MODES:
        return TranspileArgs(config, sync_mode, (), trainers, trainer_endpoints(cluster))
    return TranspileArgs(config, sync_mode, pserver_endpoints(cluster), trainers)


def transpile_from_spec(main: Program, startup: Program, args: TranspileArgs,
                        trainer_id: int = 0) -> DistributeTranspiler:
    """A transpiler that has transpiled `main` and `startup` for trainer `trainer_id`."""
    t = DistributeTranspiler(args.config)
    if args.trainer_endpoints:
        t.transpile(trainer_id, program=main, trainers=",".join(args.trainer_endpoints),
                    startup_program=startup,
                    current_endpoint=args.trainer_endpoints[trainer_id], in_place=False)
        return t
    t.transpile(trainer_id, program=main, pservers=",".join(args.pservers),
                trainers=args.trainers, sync_mode=args.sync_mode, startup_program=startup,
                current_endpoint=args.pservers[0], in_place=False)
    return t
