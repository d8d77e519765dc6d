"""Who takes part: the endpoints and ids `transpile` is given, checked before any rewriting.

Every check raises ValueError naming the argument at fault: an empty or malformed endpoint
list, a duplicate endpoint, `trainers` < 1, a `trainer_id` outside ``range(trainers)``, a
`current_endpoint` that is not the trainer's own entry in the trainer list (nccl2 / collective).
In pserver mode `current_endpoint` may be None, as the original took it there: it only records
it as the program's ``_ps_endpoint`` (Paddle's harness of its distributed tests passes None).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .config import SINGLE_PROCESS_MULTI_THREAD as SINGLE_PROCESS


@dataclass(frozen=True)
class Cluster:
    """One transpile's view of the job.

    `pservers` is empty in nccl2 and collective modes, where `trainer_endpoints` lists the
    trainers instead; `trainers` is the number of trainers in every mode.
    """

    trainer_id: int
    trainers: int
    pservers: tuple[str, ...]
    trainer_endpoints: tuple[str, ...]
    current_endpoint: str | None
    """None only in pserver mode, where `transpile` was given none."""

    @property
    def is_chief(self) -> bool:
        return self.trainer_id == 0

    def pserver_index(self, endpoint: str) -> int:
        if endpoint not in self.pservers:
            raise ValueError(f"endpoint {endpoint!r} is not one of the pservers {list(self.pservers)}")
        return self.pservers.index(endpoint)


def check_endpoint(endpoint: object, argument: str) -> str:
    """`host:port` with a non-empty host and a port in 1..65535."""
    if not isinstance(endpoint, str):
        raise ValueError(f"{argument}: endpoint must be a 'host:port' string, got {endpoint!r}")
    host, sep, port = endpoint.strip().rpartition(":")
    if not sep or not host or any(c.isspace() for c in host) or not port.isdigit() \
            or not 0 < int(port) < 65536:
        raise ValueError(f"{argument}: {endpoint!r} is not a 'host:port' endpoint")
    return f"{host}:{port}"


def parse_endpoints(value: object, argument: str) -> tuple[str, ...]:
    """A comma-separated string (or a list) of distinct endpoints."""
    items: Sequence[object]
    if isinstance(value, str):
        items = value.split(",") if value.strip() else []
    elif isinstance(value, (list, tuple)):
        items = value
    else:
        raise ValueError(f"{argument}: expected 'host:port,...', got {value!r}")
    if not items:
        raise ValueError(f"{argument}: the endpoint list is empty")
    endpoints = tuple(check_endpoint(e, argument) for e in items)
    duplicates = sorted({e for e in endpoints if endpoints.count(e) > 1})
    if duplicates:
        raise ValueError(f"{argument}: duplicate endpoints {duplicates}")
    return endpoints


def _check_trainer_id(trainer_id: object, trainers: int) -> int:
    if isinstance(trainer_id, bool) or not isinstance(trainer_id, int):
        raise ValueError(f"trainer_id: must be an int, got {trainer_id!r}")
    if not 0 <= trainer_id < trainers:
        raise ValueError(f"trainer_id: {trainer_id} is outside range({trainers}) of the trainers")
    return trainer_id


def pserver_cluster(trainer_id: object, pservers: object, trainers: object,
                    current_endpoint: str | None) -> Cluster:
    """Pserver mode: `pservers` lists the servers, `trainers` counts the trainers;
    `current_endpoint`, when given, must be an endpoint (None is kept as None)."""
    endpoints = parse_endpoints(pservers, "pservers")
    if isinstance(trainers, bool) or not isinstance(trainers, int) or trainers < 1:
        raise ValueError(f"trainers: must be an int >= 1 in pserver mode, got {trainers!r}")
    current = None if current_endpoint is None else check_endpoint(current_endpoint,
                                                                   "current_endpoint")
    return Cluster(_check_trainer_id(trainer_id, trainers), trainers, endpoints, (), current)


def trainer_cluster(trainer_id: object, trainers: object, current_endpoint: str | None,
                    mode: str, collective_mode: str | None = None) -> Cluster:
    """nccl2 / collective mode: `trainers` lists the trainers' endpoints, and the current
    endpoint must be the one at index `trainer_id`. Collective mode needs two endpoints at
    least, except in ``single_process_multi_thread``, which takes one, as the original did."""
    endpoints = parse_endpoints(trainers, "trainers")
    current = check_endpoint(current_endpoint, "current_endpoint")
    if current not in endpoints:
        raise ValueError(f"current_endpoint: {current!r} is not one of the trainers {list(endpoints)}")
    if mode == "collective" and collective_mode != SINGLE_PROCESS and len(endpoints) < 2:
        raise ValueError(f"trainers: collective mode needs at least 2 trainers (1 only with "
                         f"collective_mode {SINGLE_PROCESS}), got {list(endpoints)}")
    rank = _check_trainer_id(trainer_id, len(endpoints))
    if endpoints[rank] != current:
        raise ValueError(f"current_endpoint: trainer {rank} is {endpoints[rank]!r} in trainers, "
                         f"not {current!r}")
    return Cluster(rank, len(endpoints), (), endpoints, current)
