"""The RPC plan pass: how a trainer program's requests travel, written on its RPC ops.

Run on every trainer program once it is built (main and startup, `transpiler.trainer_programs`;
again after `checkpoint.append_checkpoint_notify` edits one), it plans each block of the
program for the runtime's protocols (docs/wire.md, "Three protocols") and writes the plan as
attributes of the ops it concerns, which `contract.TrainContract` reads back; the runtime
never works a step out from the order of the ops.

- ``compact`` (and ``bundled``): a round's barrier travels on its last message to each
  pserver. The send (recv) op whose message to an endpoint is the last of the round before
  the send (fetch) barrier carries it: ``barrier_counts`` (``"endpoint:n"``, n the messages of
  the round to that endpoint, the carrier's own included). A barrier op lists the endpoints
  whose barrier a message carried in ``carried_endpoints`` (the others get a barrier request
  of their own). An op that runs RPC ops of its own (a `conditional_block` over a block that
  holds some: geo's push and pull, the checkpoint notice) leaves the rounds it is in
  uncarried.
- ``bundled``: a run of send ops (recv ops) makes one message per endpoint, which the run's
  last op to that endpoint sends with the vars of the earlier ones: an earlier op lists the
  endpoints it holds back in ``bundled_held``, and the carriers' counts are
  ``bundled_barrier_counts``. A run of sends ends at any other RPC op, a run of recvs at any op
  that is not a recv; a send with ``merge_add`` and a recv fetching one var block by block
  make their own messages. Where a send barrier carried to every endpoint is followed by recvs
  only and then a fetch barrier carried to every endpoint (a sync step), each endpoint's GET
  rides on the SEND that carried the send barrier; where a run of recvs follows a run of sends
  with no barrier between (an async step), each endpoint's GETs ride on the run's SEND there.
  Such a send names the GET's vars per endpoint in ``bundled_fetch_epmap`` and
  ``bundled_fetch_varnames`` (parallel), how many recv messages take their values from its
  reply in ``bundled_fetch_takers`` (``"endpoint:n"``), and the endpoints whose GET carries the
  fetch barrier in ``bundled_fetch_barrier``; each recv taking its values so lists those
  endpoints in ``bundled_fetched``.
- ``local_barrier`` (every `send_barrier`): it only waits until this trainer's sends have
  left, and no request goes out for it. That is so in a program of a mode that is not
  `modes.Mode.synchronous` (the program's ``_distributed_mode``: the half-async send barrier
  of the original, ``half_async`` True); a program that states no mode is taken at the op's
  ``half_async``.
- ``per_op``: no plan; every barrier is a request of its own.

`barrier_counts` is on every send and recv op the pass planned (empty where it carries
nothing) and `carried_endpoints` on every barrier: `TrainContract.of` takes a program where
any such op lacks them (not written by this transpiler, or edited after the pass) to have no
plan, and plans it with `plan_attrs` when it reads it, leaving the program as it is. The
`bundled_*` attributes are written only where they say something. `prefetch` and the other
RPC ops make their requests on their own and carry nothing; they end the runs they stand in.

DESIGN: planned from the program, not by holding the last message back until the barrier op
runs, so a gradient still leaves as soon as its send op runs (compact), or as soon as the last
send op to its pserver in the round runs (bundled). Bundling trades that overlap for fewer
messages: each costs a node tens of microseconds of CPU at either end, more than a small
gradient's transfer on one host. The op lists and every attribute the original wrote are
unchanged by the pass.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Literal, Mapping

from ..ir import Op, Program
from ..opcatalog import runs_rpc
from .config import DistributedMode
from .modes import mode_of

PROTOCOLS = ("bundled", "compact", "per_op")
"""How a round's requests travel (the runtime's ``train.protocol``): `bundled`, one SEND and
one GET per pserver and round, the barrier on it; `compact`, a request per RPC op and pserver,
the barrier on the round's last; `per_op`, a request per RPC op and barriers as requests of
their own (as Paddle's traces read)."""

Protocol = Literal["bundled", "compact", "per_op"]
"""One of `PROTOCOLS` (the scenario's ``train.protocol``)."""
DEFAULT_PROTOCOL: Protocol = "bundled"
"""The protocol a job speaks unless its scenario says otherwise: the fastest for real, by
measurement (benchmarks/vs_ddp.py: 1.6-1.8x compact's samples/s on the quickstart MLP, 1.05-1.4x
on wider ones, on 2 cores)."""

PLANNED_OPS = ("send", "recv", "send_barrier", "fetch_barrier")
"""The ops the pass writes a plan on."""

COUNTS = "barrier_counts"
BUNDLED_COUNTS = "bundled_barrier_counts"
HELD = "bundled_held"
FETCH_EPMAP = "bundled_fetch_epmap"
FETCH_VARNAMES = "bundled_fetch_varnames"
FETCH_TAKERS = "bundled_fetch_takers"
FETCH_BARRIER = "bundled_fetch_barrier"
FETCHED = "bundled_fetched"
CARRIED = "carried_endpoints"
LOCAL = "local_barrier"
PLAN_ATTRS = (COUNTS, BUNDLED_COUNTS, HELD, FETCH_EPMAP, FETCH_VARNAMES, FETCH_TAKERS,
              FETCH_BARRIER, FETCHED, CARRIED, LOCAL)
"""Every attribute the pass writes (docs/transpiler.md, section 6, item 12)."""

_BARRIERS = {"send_barrier": "send", "fetch_barrier": "get"}
"""Each barrier op, and the kind of the requests whose round it closes."""



@dataclass
class BarrierPlan:
    """Where a block's barriers travel (compact and bundled protocols), and which messages are
    bundled (bundled protocol), by the ids of the ops.

    `carriers`: id of a send / recv op -> {endpoint: messages of the round} for the endpoints
    whose round that op's message ends (it carries the barrier); `covered`: id of a barrier op
    -> the endpoints whose barrier a carrier took (the others still get a request of their
    own); `held`: id of a send / recv op -> the endpoints its vars go to in the message of a
    later op of the same kind (the last of its bundle), not in one of its own; `fetches`: id of
    a send op -> {endpoint: the GET} of the round that rides on its SEND there; `fetched`: id
    of a recv op -> the endpoints whose GET rode on a SEND (it takes the values from that
    SEND's reply); `local`: ids of the send barriers that only wait for this trainer's sends."""

    carriers: dict[int, dict[str, int]] = field(default_factory=dict)
    covered: dict[int, frozenset[str]] = field(default_factory=dict)
    held: dict[int, frozenset[str]] = field(default_factory=dict)
    fetches: dict[int, dict[str, Fetch]] = field(default_factory=dict)
    fetched: dict[int, frozenset[str]] = field(default_factory=dict)
    local: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Fetch:
    """The GET that rides on a SEND to one endpoint (bundled protocol): the wire `names` it
    asks for, whether it carries the round's fetch barrier (`barrier`: a sync step), and how
    many of the recv ops' messages to that endpoint take their values from its reply
    (`takers`: one in a sync step; in an async step a var fetched block by block takes its
    block apart from the vars bundled around it)."""

    names: list[str]
    barrier: bool = True
    takers: int = 1


def _never(op: Op) -> bool:
    return False


def barrier_plan(ops: Iterable[Op], rpc_inside: Callable[[Op], bool], bundle: bool = False,
                 local: Callable[[Op], bool] = _never) -> BarrierPlan:
    """The plan of one block's `ops` (see the module): for each barrier op, the last send
    (recv) op before it, since the previous barrier of its kind, with a message to each
    endpoint carries it; an op that runs RPC ops of its own (`rpc_inside`) leaves the rounds it
    is in uncarried, and a `local` send barrier is carried nowhere. With `bundle`, the runs of
    sends (recvs) are bundled and the GETs ride on SENDs where they can."""
    ops = list(ops)
    plan = BarrierPlan(local=frozenset(id(op) for op in ops if op.type == "send_barrier"
                                       and local(op)))
    carried_by: dict[int, dict[str, Op]] = {}
    """id of a barrier op -> the op whose message carried it to each endpoint."""
    counts: dict[str, dict[str, int]] = {"send": {}, "get": {}}
    last: dict[str, dict[str, Op]] = {"send": {}, "get": {}}
    opaque = {"send": False, "get": False}
    open_: dict[str, dict[str, Op]] = {"send": {}, "get": {}}
    """The op whose message to each endpoint is still open to bundling, by kind."""
    for op in ops:
        kind = "send" if op.type == "send" else "get" if op.type == "recv" else None
        for other in ("send", "get"):
            if other != kind and (other == "get" or runs_rpc(op) or rpc_inside(op)):
                open_[other] = {}
        if kind is not None:
            bundling = bundle and _bundles(op)
            if not bundling:
                open_[kind] = {}
            for ep, n in _messages_per_endpoint(op).items():
                earlier = open_[kind].get(ep) if bundling else None
                if earlier is not None:
                    plan.held[id(earlier)] = plan.held.get(id(earlier), frozenset()) | {ep}
                else:
                    counts[kind][ep] = counts[kind].get(ep, 0) + n
                if bundling:
                    open_[kind][ep] = op
                last[kind][ep] = op
        elif op.type in _BARRIERS:
            kind = _BARRIERS[op.type]
            carried = set()
            if not opaque[kind] and id(op) not in plan.local:
                for ep in op.attr("endpoints") or ():
                    if ep in counts[kind]:
                        plan.carriers.setdefault(id(last[kind][ep]), {})[ep] = counts[kind][ep]
                        carried_by.setdefault(id(op), {})[ep] = last[kind][ep]
                        carried.add(ep)
            plan.covered[id(op)] = frozenset(carried)
            counts[kind], last[kind], opaque[kind] = {}, {}, False
        elif rpc_inside(op):
            opaque = {"send": True, "get": True}
    if bundle:
        _plan_fetches(ops, plan, carried_by)
        _plan_async_fetches(ops, plan, rpc_inside)
    return plan


def _plan_fetches(ops: list[Op], plan: BarrierPlan, carried_by: dict[int, dict[str, Op]]) -> None:
    """Put each GET of a run of recvs between a send and a fetch barrier, both carried to every
    endpoint, on the SEND that carried the send barrier (a sync step)."""
    for i, op in enumerate(ops):
        if op.type != "send_barrier" or id(op) in plan.local:
            continue
        j = i + 1
        while j < len(ops) and ops[j].type == "recv" and _bundles(ops[j]):
            j += 1
        if j == i + 1 or j == len(ops) or ops[j].type != "fetch_barrier":
            continue
        sends, gets = carried_by.get(id(op), {}), carried_by.get(id(ops[j]), {})
        if not set(op.attr("endpoints")) <= set(sends) \
                or not set(ops[j].attr("endpoints")) <= set(gets):
            continue
        names: dict[str, list[str]] = defaultdict(list)
        for recv in ops[i + 1:j]:
            for _, wire, ep in zip(recv.output("Out"),
                                   recv.attr("recv_varnames") or recv.output("Out"),
                                   recv.attr("epmap")):
                names[ep].append(wire)
        for ep, wires in names.items():
            carrier = gets[ep]
            plan.fetches.setdefault(id(sends[ep]), {})[ep] = Fetch(wires)
            plan.fetched[id(carrier)] = plan.fetched.get(id(carrier), frozenset()) | {ep}
            del plan.carriers[id(carrier)][ep]
            if not plan.carriers[id(carrier)]:
                del plan.carriers[id(carrier)]


def _plan_async_fetches(ops: list[Op], plan: BarrierPlan,
                        rpc_inside: Callable[[Op], bool]) -> None:
    """Put the GETs of a run of recvs that follows a run of sends with no barrier between (an
    async step) on the SEND to each endpoint, whose reply then brings the values: an async step
    is one request and one reply per pserver, as a sync one. An endpoint whose GET carries a
    barrier, or that the run of sends did not reach, keeps its own GET.

    DESIGN: the pserver reads the values right after it applies the SEND, where a GET of its
    own would have read them once every SEND of the step was acknowledged, a little later: in
    async mode either is a read of the parameters as they happen to be, with this trainer's
    gradients in. The values still land only when the recv op runs."""
    senders: dict[str, Op] = {}
    """Endpoint -> the op whose SEND there ends the run of sends (it holds the earlier ones')."""
    run: list[tuple[Op, str, list[str], int]] = []
    """The run of recvs: (op, endpoint, wire names, messages) for each endpoint of each op."""
    for op in [*ops, None]:
        if op is not None and op.type == "recv" and senders:
            for ep, wires, count in _gets_of(op, plan):
                run.append((op, ep, wires, count))
            continue
        if run:
            _ride(run, senders, plan)
            run, senders = [], {}
        if op is None:
            break
        if op.type == "send" and _bundles(op):
            senders.update(dict.fromkeys(op.attr("epmap") or (), op))
        elif runs_rpc(op) or rpc_inside(op):
            senders = {}


def _gets_of(op: Op, plan: BarrierPlan) -> list[tuple[str, list[str], int]]:
    """(endpoint, wire names, GET messages there) of recv `op`: its vars bundled into a later
    op's GET count no message of their own."""
    wires = op.attr("recv_varnames") or op.output("Out")
    messages = _messages_per_endpoint(op)
    held = plan.held.get(id(op), frozenset())
    names: dict[str, list[str]] = defaultdict(list)
    for wire, ep in zip(wires, op.attr("epmap")):
        names[ep].append(wire)
    return [(ep, names[ep], 0 if ep in held else messages[ep]) for ep in names]


def _ride(run: list[tuple[Op, str, list[str], int]], senders: Mapping[str, Op],
          plan: BarrierPlan) -> None:
    """Put the GETs of `run` (see `_plan_async_fetches`) on the SENDs of `senders`."""
    barred = {ep for op, ep, _, _ in run if ep in plan.carriers.get(id(op), {})}
    names: dict[str, list[str]] = defaultdict(list)
    takers: dict[str, int] = defaultdict(int)
    for op, ep, wires, count in run:
        if ep in senders and ep not in barred:
            names[ep] += wires
            takers[ep] += count
            if count:
                plan.fetched[id(op)] = plan.fetched.get(id(op), frozenset()) | {ep}
    for ep, wires in names.items():
        plan.fetches.setdefault(id(senders[ep]), {})[ep] = Fetch(wires, False, takers[ep])


def _bundles(op: Op) -> bool:
    """Whether a send or recv op's messages may be bundled with its neighbours': one message
    per endpoint, with no fields of its own."""
    if op.type == "send":
        return not op.attr("merge_add")
    return not by_block(op)


def by_block(op: Op) -> bool:
    """A recv of one var from several endpoints: a GET per block, joined by the trainer
    (async mode)."""
    return len(op.output("Out")) == 1 and len(op.attr("epmap") or ()) > 1


def _messages_per_endpoint(op: Op) -> dict[str, int]:
    """How many requests a send or recv op makes to each endpoint."""
    endpoints = list(op.attr("epmap") or ())
    if op.type == "recv" and by_block(op):
        return {ep: endpoints.count(ep) for ep in endpoints}  # a GET per block
    return dict.fromkeys(endpoints, 1)


# -- the pass ----------------------------------------------------------------------------------

def local_barrier(program: Program, op: Op) -> bool:
    """Whether `op` is a send barrier that only waits for this trainer's own sends (see the
    module): by the modes table where `program` states its mode, else by the op's
    ``half_async``."""
    if op.type != "send_barrier":
        return False
    mode = program.attrs.get("_distributed_mode")
    if mode is not None:
        return not mode_of(DistributedMode(int(mode))).synchronous
    return bool(op.attr("half_async"))


def rpc_inside(program: Program) -> Callable[[Op], bool]:
    """Whether an op of `program` runs RPC ops of its own: a `conditional_block` whose block
    holds some (the trainer runs that block itself, awaiting them)."""
    def inside(op: Op) -> bool:
        if op.type != "conditional_block":
            return False
        ref = op.attr("sub_block")
        return ref is not None and any(runs_rpc(o) for o in program.blocks[ref.idx].ops)
    return inside


def plan_attrs(program: Program) -> dict[int, tuple[Op, dict[str, Any]]]:
    """id of each op of `program` the pass plans -> (the op, its plan attributes); the program
    is left as it is."""
    inside = rpc_inside(program)

    def local(op: Op) -> bool:
        return local_barrier(program, op)

    out = {}
    for block in program.blocks:
        compact = barrier_plan(block.ops, inside, False, local)
        bundled = barrier_plan(block.ops, inside, True, local)
        for op in block.ops:
            if op.type in PLANNED_OPS:
                out[id(op)] = (op, _attrs_of(op, compact, bundled))
    return out


def rpc_plan_pass(program: Program) -> Program:
    """Write the plan on `program`'s RPC ops (see the module), replacing any earlier one;
    returns `program`."""
    for op, attrs in plan_attrs(program).values():
        for name in PLAN_ATTRS:
            op.attrs.pop(name, None)
        op.attrs.update(attrs)
    return program


def _pairs(entries: Mapping[str, int]) -> list[str]:
    return [f"{name}:{value}" for name, value in entries.items()]


def _in_order(endpoints: frozenset[str], order: Iterable[str]) -> list[str]:
    """`endpoints` in the order `order` first names them (attributes are deterministic)."""
    return [ep for ep in dict.fromkeys(order) if ep in endpoints]


def _attrs_of(op: Op, compact: BarrierPlan, bundled: BarrierPlan) -> dict[str, Any]:
    key = id(op)
    if op.type in _BARRIERS:
        attrs: dict[str, Any] = {CARRIED: _in_order(compact.covered.get(key, frozenset()),
                                                    op.attr("endpoints") or ())}
        if op.type == "send_barrier":
            attrs[LOCAL] = key in compact.local
        return attrs
    epmap = op.attr("epmap") or ()
    attrs = {COUNTS: _pairs(compact.carriers.get(key, {}))}
    if bundled.carriers.get(key):
        attrs[BUNDLED_COUNTS] = _pairs(bundled.carriers[key])
    if bundled.held.get(key):
        attrs[HELD] = _in_order(bundled.held[key], epmap)
    fetches = bundled.fetches.get(key, {})
    if fetches:
        attrs[FETCH_EPMAP] = [ep for ep, fetch in fetches.items() for _ in fetch.names]
        attrs[FETCH_VARNAMES] = [name for fetch in fetches.values() for name in fetch.names]
        attrs[FETCH_TAKERS] = _pairs({ep: fetch.takers for ep, fetch in fetches.items()})
        attrs[FETCH_BARRIER] = [ep for ep, fetch in fetches.items() if fetch.barrier]
    if bundled.fetched.get(key):
        attrs[FETCHED] = _in_order(bundled.fetched[key], epmap)
    return attrs
