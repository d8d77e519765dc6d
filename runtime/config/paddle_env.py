"""Which node of a job Paddle's environment variables name: the one place that maps every name
Paddle's launchers gave a fact to that fact (`runtime up --role` and ``python -m
runtime.services.node`` read the environment through `paddle_node`).

Paddle named the same facts differently over the years (fleet's ``PaddleCloudRoleMaker`` and
``paddle.distributed.launch --run_mode ps``; fluid's transpiler scripts; fluid's trainer API).
Every name below is read; where several name one fact they must agree, and two that name
different values are refused in one line naming both. Where they agree, messages name the
first of the row.

=================  ==========================================================================
fact               variables
=================  ==========================================================================
role               ``TRAINING_ROLE`` (fleet), ``PADDLE_TRAINING_ROLE`` (fluid):
                   ``PSERVER`` or ``TRAINER``
pserver endpoints  ``PADDLE_PSERVERS_IP_PORT_LIST`` (fleet), ``PADDLE_PSERVER_ENDPOINTS``
                   (fluid's transpiler), ``PADDLE_PSERVER_IPS`` each at
                   ``PADDLE_PSERVER_PORT`` (fluid's trainer API): ``ip:port,ip:port``
pserver count      ``PADDLE_PSERVER_NUMS``: checked against the endpoints, where set
trainer count      ``PADDLE_TRAINERS_NUM`` (fleet), ``PADDLE_TRAINERS`` (fluid), or as many
                   as ``PADDLE_TRAINER_ENDPOINTS`` lists
a trainer's index  ``PADDLE_TRAINER_ID``, or ``PADDLE_CURRENT_ENDPOINT``'s place in
                   ``PADDLE_TRAINER_ENDPOINTS``
own endpoint       a pserver's: a host (``POD_IP``, ``PADDLE_CURRENT_IP``) at a port
                   (``PADDLE_PORT``, ``PADDLE_PSERVER_PORT``), ``PADDLE_CURRENT_ENDPOINT``; its
                   place in the pserver endpoints is the pserver's index
=================  ==========================================================================

Flags come first: a node named by ``--role`` and ``--index`` is what they say, and only the
role variables are read, to refuse one that names the other role (`runtime.services.node`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Generic, Mapping, TypeVar

from runtime.config.nodes import RoleName

T = TypeVar("T")

ROLE_VARS = ("TRAINING_ROLE", "PADDLE_TRAINING_ROLE")
PSERVERS_VARS = ("PADDLE_PSERVERS_IP_PORT_LIST", "PADDLE_PSERVER_ENDPOINTS")
PSERVER_IPS_VAR, PSERVER_PORT_VAR = "PADDLE_PSERVER_IPS", "PADDLE_PSERVER_PORT"
PSERVER_COUNT_VAR = "PADDLE_PSERVER_NUMS"
TRAINERS_VARS = ("PADDLE_TRAINERS_NUM", "PADDLE_TRAINERS")
TRAINER_ENDPOINTS_VAR = "PADDLE_TRAINER_ENDPOINTS"
TRAINER_ID_VAR = "PADDLE_TRAINER_ID"
CURRENT_ENDPOINT_VAR = "PADDLE_CURRENT_ENDPOINT"
HOST_VARS = ("POD_IP", "PADDLE_CURRENT_IP")
PORT_VARS = ("PADDLE_PORT", PSERVER_PORT_VAR)

ENV_VARS: tuple[str, ...] = (*ROLE_VARS, *PSERVERS_VARS, PSERVER_IPS_VAR, PSERVER_PORT_VAR,
                             PSERVER_COUNT_VAR, *TRAINERS_VARS, TRAINER_ENDPOINTS_VAR,
                             TRAINER_ID_VAR, CURRENT_ENDPOINT_VAR, *HOST_VARS, PORT_VARS[0])
"""Every variable `paddle_node` reads (`runtime up` keeps them from the nodes it starts)."""
ENV_ROLES: dict[str, RoleName] = {"PSERVER": "pserver", "TRAINER": "trainer"}


class RoleError(ValueError):
    """Flags or environment variables that do not name one node of the job; the message names
    the flag or variable at fault."""


@dataclass(frozen=True)
class Said(Generic[T]):
    """A fact's value and where it was said: a variable, or two joined (``POD_IP:PADDLE_PORT``)."""

    value: T
    source: str
    text: str
    """The value as the environment spelled it, for messages."""


@dataclass(frozen=True)
class PaddleNode:
    """The node Paddle's variables name, and where each part was said."""

    role: RoleName
    index: int
    index_source: str
    endpoints: tuple[str, ...]
    endpoints_source: str
    trainers: int


# -- reading one variable -------------------------------------------------------------------------

def parse_endpoints(text: str, source: str) -> tuple[str, ...]:
    """``host:port,host:port`` as a tuple; `RoleError` naming `source` for anything else."""
    endpoints = tuple(e.strip() for e in text.split(",") if e.strip())
    if not endpoints:
        raise RoleError(f"{source}: no endpoint in {text!r}; expected host:port,host:port")
    for ep in endpoints:
        host, _, port = ep.rpartition(":")
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise RoleError(f"{source}: {ep!r} is not host:port")
    if len(set(endpoints)) != len(endpoints):
        raise RoleError(f"{source}: endpoints listed twice in {text!r}")
    return endpoints


def parse_int(text: str, source: str, minimum: int) -> int:
    try:
        value = int(text)
    except ValueError:
        raise RoleError(f"{source}={text!r} is not an integer") from None
    if value < minimum:
        raise RoleError(f"{source}={value} must be >= {minimum}")
    return value


def parse_port(text: str, source: str) -> int:
    port = parse_int(text, source, 1)
    if port > 65535:
        raise RoleError(f"{source}={port} is not a port")
    return port


def _get(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip()


def _read(env: Mapping[str, str], names: tuple[str, ...],
          parse: Callable[[str, str], T]) -> list[Said[T]]:
    return [Said(parse(text, name), name, text)
            for name in names if (text := _get(env, name))]


# -- agreeing on a fact ---------------------------------------------------------------------------

def agreed(what: str, said: list[Said[T]]) -> Said[T] | None:
    """The one value every variable in `said` gives `what` (the first's source named); None for
    none; `RoleError` naming two that differ."""
    for other in said[1:]:
        if other.value != said[0].value:
            raise RoleError(f"{said[0].source}={said[0].text} and {other.source}={other.text} "
                            f"name different {what}; set one of them")
    return said[0] if said else None


def _required(said: Said[T] | None, name: str, why: str, alternatives: str) -> Said[T]:
    if said is None:
        raise RoleError(f"{name} is not set; {why} (or {alternatives})")
    return said


def env_role(env: Mapping[str, str]) -> Said[RoleName] | None:
    """The role ``TRAINING_ROLE`` / ``PADDLE_TRAINING_ROLE`` name; None where neither is set."""
    def parse(text: str, source: str) -> RoleName:
        role = ENV_ROLES.get(text.upper())
        if role is None:
            raise RoleError(f"{source}={text!r}: expected PSERVER or TRAINER")
        return role
    return agreed("roles", _read(env, ROLE_VARS, parse))


# -- the facts ------------------------------------------------------------------------------------

def pserver_endpoints(env: Mapping[str, str]) -> Said[tuple[str, ...]] | None:
    said = _read(env, PSERVERS_VARS, parse_endpoints)
    ips, port = _get(env, PSERVER_IPS_VAR), _get(env, PSERVER_PORT_VAR)
    if ips and not port:
        raise RoleError(f"{PSERVER_PORT_VAR} is not set; {PSERVER_IPS_VAR} needs it (the port "
                        "of every pserver)")
    if ips:
        source = f"{PSERVER_IPS_VAR}:{PSERVER_PORT_VAR}"
        number = parse_port(port, PSERVER_PORT_VAR)
        listed = ",".join(f"{ip.strip()}:{number}" for ip in ips.split(",") if ip.strip())
        said.append(Said(parse_endpoints(listed, source), source, listed))
    found = agreed("pserver endpoints", said)
    count = _get(env, PSERVER_COUNT_VAR)
    if found and count and parse_int(count, PSERVER_COUNT_VAR, 1) != len(found.value):
        raise RoleError(f"{PSERVER_COUNT_VAR}={count} and {found.source}={found.text} name "
                        "different pserver counts; set one of them")
    return found


def trainer_endpoints(env: Mapping[str, str]) -> Said[tuple[str, ...]] | None:
    return agreed("trainer endpoints", _read(env, (TRAINER_ENDPOINTS_VAR,), parse_endpoints))


def trainer_count(env: Mapping[str, str]) -> Said[int] | None:
    said = _read(env, TRAINERS_VARS, lambda text, source: parse_int(text, source, 1))
    listed = trainer_endpoints(env)
    if listed is not None:
        said.append(Said(len(listed.value), listed.source, listed.text))
    return agreed("trainer counts", said)


def trainer_index(env: Mapping[str, str]) -> Said[int] | None:
    said = _read(env, (TRAINER_ID_VAR,), lambda text, source: parse_int(text, source, 0))
    me, listed = _get(env, CURRENT_ENDPOINT_VAR), trainer_endpoints(env)
    if me and listed is not None:
        if me not in listed.value:
            raise RoleError(f"{CURRENT_ENDPOINT_VAR} {me} is not in {listed.source} "
                            f"{','.join(listed.value)}")
        said.append(Said(listed.value.index(me), CURRENT_ENDPOINT_VAR, me))
    return agreed("trainer indexes", said)


def parse_endpoint(text: str, source: str) -> str:
    """One ``host:port``; `RoleError` naming `source` for anything else."""
    (endpoint, *more) = parse_endpoints(text, source)
    if more:
        raise RoleError(f"{source}={text!r}: expected one host:port")
    return endpoint


def own_endpoint(env: Mapping[str, str], why: str) -> Said[str] | None:
    """A pserver's own endpoint: a host at a port and ``PADDLE_CURRENT_ENDPOINT``, where set; a
    host without a port, or a port without a host, only where nothing else names it."""
    current = _read(env, (CURRENT_ENDPOINT_VAR,), parse_endpoint)
    host = agreed("hosts", _read(env, HOST_VARS, lambda text, source: text))
    port = agreed("ports", _read(env, PORT_VARS, parse_port))
    if host is not None and port is not None:
        text = f"{host.value}:{port.value}"
        return agreed("endpoints of this pserver",
                      [Said(text, f"{host.source}:{port.source}", text), *current])
    if not current and host is not None:
        raise RoleError(f"{PORT_VARS[0]} is not set; {why} with {host.source} "
                        f"(or {PORT_VARS[1]})")
    if not current and port is not None:
        raise RoleError(f"{HOST_VARS[0]} is not set; {why} with {port.source} "
                        f"(or {HOST_VARS[1]}, or {CURRENT_ENDPOINT_VAR} alone)")
    return agreed("endpoints of this pserver", current)


# -- the node -------------------------------------------------------------------------------------

def paddle_node(env: Mapping[str, str]) -> PaddleNode | None:
    """The node Paddle's variables in `env` name; None where no role variable is set."""
    role = env_role(env)
    if role is None:
        return None
    why = f"{role.source}={role.text} needs it"
    endpoints = _required(pserver_endpoints(env), PSERVERS_VARS[0], why,
                          f"{PSERVERS_VARS[1]}, or {PSERVER_IPS_VAR} with {PSERVER_PORT_VAR}")
    trainers = _required(trainer_count(env), TRAINERS_VARS[0], why,
                         f"{TRAINERS_VARS[1]}, or {TRAINER_ENDPOINTS_VAR}")
    if role.value == "trainer":
        return _trainer(env, why, endpoints, trainers)
    me = _required(own_endpoint(env, why), CURRENT_ENDPOINT_VAR, why,
                   f"{HOST_VARS[0]} with {PORT_VARS[0]}")
    if me.value not in endpoints.value:
        raise RoleError(f"{me.source} {me.value} is not in {endpoints.source} "
                        f"{','.join(endpoints.value)}")
    return PaddleNode("pserver", endpoints.value.index(me.value), me.source, endpoints.value,
                      endpoints.source, trainers.value)


def _trainer(env: Mapping[str, str], why: str, endpoints: Said[tuple[str, ...]],
             trainers: Said[int]) -> PaddleNode:
    index = _required(trainer_index(env), TRAINER_ID_VAR, why,
                      f"{CURRENT_ENDPOINT_VAR} with {TRAINER_ENDPOINTS_VAR}")
    if index.value >= trainers.value:
        raise RoleError(f"{index.source}={index.text} is not below "
                        f"{trainers.source}={trainers.text}")
    return PaddleNode("trainer", index.value, index.source, endpoints.value, endpoints.source,
                      trainers.value)
