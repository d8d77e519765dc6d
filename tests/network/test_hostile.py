"""Hostile input: whatever a process that speaks ZeroMQ sends a pserver, the pserver answers
with an error reply or drops the message, and goes on serving with its parameters untouched,
holding no state for senders that are not the job's trainers.

- the wire decoder, fuzzed: any frames decode to a `Message` or raise `DecodeError`, quickly;
- `HOSTILE`: named hostile messages, each sent to a live pserver shell over an in-memory
  transport (an outsider, then the job's own trainer name sending what must be refused), and
  all of them over ZeroMQ on loopback to a pserver that then serves a normal job to the very
  result of a run that saw none: plain, and under CurveZMQ from an insider holding a trainer's
  key and from outsiders without a key of the job, who get nothing;
- the same shell, fuzzed with mutated headers and frames, and a burst of thousands of hostile
  inputs that leaves (tracemalloc) far less memory behind than any per-input state would;
- the trainer's side: a sync pserver behind it, or a reply lacking a var, is a named error.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
import tracemalloc
from dataclasses import replace
from pathlib import Path
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import msgpack
import numpy as np
import pytest
import zmq
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.execution.tensor import Phantom
from runtime.network.rpc import RetryPolicy
from runtime.network.transport import Frame, Transport
from runtime.network.wire import (DEFAULT_MAX_HEADER_SIZE, MAX_DETAIL, MAX_FRAMES, DecodeError,
                                  Kind, Message, decode, encode, error_reply)
from runtime.network.curve import CurveKeys, make_client
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport, own_routing_id
from runtime.services.cluster import batches_for, make_pserver, make_trainer, run_job
from runtime.services.job import Job
from runtime.services.messages import ServerState
from runtime.services.node import node_keys
from runtime.services.pserver import PserverService
from runtime.services.trainer import BadReply, RpcOps, StepMismatch, Trainer

from cluster_helpers import FAST_DRAIN, make_job
from curve_helpers import job_keys

MODEL = "{name: mlp, sizes: [8, 4, 2], optimizer: {type: sgd, learning_rate: 0.1}}"
GRAD = "mlp.fc1.w@GRAD"
TRAINERS = 2
LIMIT = 1 << 20
"""The message size limit of the pservers under attack (decode and transport)."""
OUTSIDER = "mallory"


def pack(value: Any) -> bytes:
    return msgpack.packb(value, use_bin_type=True)


def header(**fields: Any) -> bytes:
    """A SEND header from the outsider, claiming to be trainer 0, with `fields` changed
    (a field set to `DROP` is left out)."""
    base: dict[Any, Any] = {"v": 1, "kind": "send", "id": 7, "src": OUTSIDER, "step": 0,
                            "vars": [], "trainer": 0}
    base.update(fields)
    return pack({k: v for k, v in base.items() if v is not DROP})


DROP = object()


def spec(name: str = GRAD, shape: Sequence[int] = (4, 2), dtype: str = "float32",
         kind: str = "dense", **more: Any) -> dict[str, Any]:
    return {"name": name, "dtype": dtype, "shape": list(shape), "kind": kind, **more}


GRAD_BYTES = np.zeros((4, 2), np.float32).tobytes()
OWN = "mlp.fc1.w@GRAD.trainer_0"
"""A gradient trainer 0 sends (sync mode: its own copy of the sum)."""
OTHERS = "mlp.fc1.w@GRAD.trainer_1"
"""The same gradient, trainer 1's copy: trainer 0 may not write it."""


def filled(value: float, nan_at: int | None = None) -> bytes:
    """A (4, 2) float32 gradient of `value`, with a NaN at flat index `nan_at`."""
    array = np.full((4, 2), value, np.float32)
    if nan_at is not None:
        array.reshape(-1)[nan_at] = np.nan
    return array.tobytes()


# name -> frames. Every one is refused by decoding or by the protocol (never accepted): an
# error reply, or a drop by the transport where noted in `ZMQ_DROPS`.
WIRE_CASES: dict[str, list[bytes]] = {
    "empty_header_frame": [b""],
    "not_msgpack": [b"\xc1\xc1"],
    "truncated_msgpack": [header()[:-3]],
    "header_is_a_list": [pack([1, 2, 3])],
    "header_is_an_int": [pack(5)],
    "extension_type": [msgpack.packb(msgpack.ExtType(1, b"x"))],
    "int_map_keys": [msgpack.packb({1: 2})],
    "missing_version": [header(v=DROP)],
    "version_2": [header(v=2)],
    "version_true": [header(v=True)],
    "unknown_kind": [header(kind="explode")],
    "kind_is_int": [header(kind=3)],
    "negative_id": [header(id=-1)],
    "most_negative_id": [header(id=-(1 << 63))],
    "float_id": [header(id=1.5)],
    "string_id": [header(id="7")],
    "step_past_64_bits": [header(step=1 << 63)],
    "bool_step": [header(step=True)],
    "empty_src": [header(src="")],
    "int_src": [header(src=9)],
    "vars_not_a_list": [header(vars={"a": 1})],
    "var_entry_not_a_map": [header(vars=[5])],
    "var_without_name": [header(vars=[{"dtype": "float32"}])],
    "var_without_dtype": [header(vars=[{k: v for k, v in spec().items() if k != "dtype"}]),
                          GRAD_BYTES],
    "complex_dtype": [header(vars=[spec(dtype="complex128")]), GRAD_BYTES],
    "unknown_var_kind": [header(vars=[spec(kind="sparse")]), GRAD_BYTES],
    "unknown_var_field": [header(vars=[spec(evil=1)]), GRAD_BYTES],
    "negative_dim": [header(vars=[spec(shape=[-4, 2])]), GRAD_BYTES],
    "33_dims": [header(vars=[spec(shape=[1] * 33)]), b"\0" * 4],
    "declares_exabytes": [header(vars=[spec(shape=[1 << 40, 1 << 20])]), b""],
    "duplicate_var": [header(vars=[spec(), spec()]), GRAD_BYTES, GRAD_BYTES],
    "frame_missing": [header(vars=[spec()])],
    "frame_extra": [header(vars=[spec()]), GRAD_BYTES, GRAD_BYTES],
    "frame_too_short": [header(vars=[spec()]), GRAD_BYTES[:-1]],
    "bool_byte_2": [header(vars=[spec(dtype="bool", shape=[2])]), b"\x01\x02"],
    "row_out_of_range": [header(vars=[spec(kind="rows", shape=[1, 2], height=4)]),
                         np.array([9], np.int64).tobytes(), np.zeros(2, np.float32).tobytes()],
    "negative_height": [header(vars=[spec(kind="rows", shape=[1, 2], height=-1)]),
                        np.array([0], np.int64).tobytes(), np.zeros(2, np.float32).tobytes()],
    "lod_not_fitting": [header(vars=[spec(lod=[[0, 9]])]), GRAD_BYTES],
    "header_over_64k": [header(pad="x" * (DEFAULT_MAX_HEADER_SIZE + 1))],
    "nested_2000_deep": [b"\x91" * 2000 + b"\x00"],
    "kind_of_60k_chars": [header(kind="k" * 60_000)],
    "total_over_limit": [header(), *[b"\0" * (LIMIT // 2)] * 3],
    "frames_over_limit": [header(), *[b""] * MAX_FRAMES],
    "header_of_2mb": [header(pad="x" * (2 * LIMIT))],
    "empty_of_2_124_elements": [header(vars=[spec(shape=[1 << 62, 1 << 62, 0])]), b""],
    "empty_of_2_62_rows": [header(vars=[spec(shape=[1 << 62, 0])]), b""],
    "phantom_of_2_64_elements": [header(vars=[spec(kind="phantom", shape=[1 << 62, 4])])],
    "timestamp_extension": [header(when=msgpack.Timestamp(1, 0))],
    "timestamp_nested": [header(fetch=[{"at": msgpack.Timestamp(0, 5)}])],
}
"""Messages the decoder refuses."""

ZMQ_DROPS = {"total_over_limit", "frames_over_limit", "header_of_2mb"}
"""Over ZeroMQ these never reach the pserver: the transport drops them (their frames' sum or
count, or one frame, is over its limits)."""
COUNTED_DROPS = {"total_over_limit", "frames_over_limit"}
"""Of `ZMQ_DROPS`, those the transport reads and counts in `dropped` (libzmq itself refuses a
frame over MAXMSGSIZE, unseen)."""
REPLY_TIMEOUT_MS = 30_000
"""How long a raw client waits for a reply: the server is alive when one comes at all, and a
busy machine may take seconds; a dead one never answers (the test's own timeout bounds it)."""


def request(kind: str, src: str = OUTSIDER, step: int = 0, vars: Sequence[dict[str, Any]] = (),
            frames: Sequence[bytes] = (), **extra: Any) -> list[bytes]:
    fields = {"v": 1, "kind": kind, "id": 11, "src": src, "step": step, "vars": list(vars),
              "trainer": 0, **extra}
    return [pack({k: v for k, v in fields.items() if v is not DROP}), *frames]


OUTSIDER_CASES: dict[str, list[bytes]] = {
    "no_trainer_field": request("heartbeat", trainer=DROP),
    "bool_trainer": request("heartbeat", trainer=True),
    "trainer_out_of_range": request("heartbeat", trainer=TRAINERS),
    "negative_trainer": request("heartbeat", trainer=-1),
    "trainer_of_2_62": request("heartbeat", trainer=1 << 62),
    "impostor_heartbeat": request("heartbeat"),
    "impostor_gradient": request("send", vars=[spec()], frames=[GRAD_BYTES]),
    "impostor_barrier": request("send_barrier"),
    "impostor_get": request("get", step=-1, names=["mlp.fc1.w"]),
    "impostor_complete": request("complete"),
    "impostor_join": request("join", entry=0),
    "spoofed_src": request("heartbeat", src="trainer:0"),
    "src_of_60k_chars": request("heartbeat", src="s" * 60_000),
}
"""Well-formed messages from a node that is not the job's trainer it claims to be."""

TRAINER = "trainer:0"
INSIDER_CASES: dict[str, list[bytes]] = {
    "phantom_gradient": request("send", TRAINER, vars=[spec(kind="phantom")]),
    "phantom_rows_gradient": request(
        "send", TRAINER, vars=[spec(kind="phantom", shape=[1, 2], height=4)]),
    "unknown_gradient": request("send", TRAINER, vars=[spec("nonsense@GRAD")],
                                frames=[GRAD_BYTES]),
    "gradient_of_a_param": request("send", TRAINER, vars=[spec("mlp.fc1.w")],
                                   frames=[GRAD_BYTES]),
    "float64_gradient": request("send", TRAINER, vars=[spec(dtype="float64")],
                                frames=[GRAD_BYTES * 2]),
    "misshapen_gradient": request("send", TRAINER, vars=[spec(shape=[2, 4, 1])],
                                  frames=[GRAD_BYTES]),
    "gradient_at_startup_step": request("send", TRAINER, step=-1, vars=[spec()],
                                        frames=[GRAD_BYTES]),
    "barrier_without_gradients": request("send_barrier", TRAINER),
    "barrier_at_startup_step": request("send_barrier", TRAINER, step=-1),
    "get_of_unknown_var": request("get", TRAINER, step=-1, names=["nope"]),
    "get_names_not_a_list": request("get", TRAINER, step=-1, names="mlp.fc1.w"),
    "prefetch_without_table": request("prefetch", TRAINER, vars=[spec("ids", [2, 1], "int64")],
                                      frames=[np.zeros(2, np.int64).tobytes()]),
    "join_without_entry": request("join", TRAINER),
    "checkpoint_without_dir": request("checkpoint_notify", TRAINER),
    "checkpoint_dir_with_nul": request("checkpoint_notify", TRAINER, dir="/tmp/\0x"),
    "another_trainers_id": request("heartbeat", TRAINER, trainer=1),
    "another_trainers_gradient": request("send", TRAINER, vars=[spec(OTHERS)],
                                         frames=[GRAD_BYTES]),
    "misshapen_own_gradient": request("send", TRAINER, vars=[spec(OWN, shape=[2, 4, 1])],
                                      frames=[GRAD_BYTES]),
    "nan_gradient": request("send", TRAINER, vars=[spec(OWN)], frames=[filled(np.nan)]),
    "inf_gradient": request("send", TRAINER, vars=[spec(OWN)], frames=[filled(np.inf)]),
    "minus_inf_gradient": request("send", TRAINER, vars=[spec(OWN)], frames=[filled(-np.inf)]),
    "gradient_of_3e38": request("send", TRAINER, vars=[spec(OWN)], frames=[filled(3e38)]),
    "one_nan_among_zeros": request("send", TRAINER, vars=[spec(OWN)],
                                   frames=[filled(0.0, nan_at=5)]),
    "barrier_before_own_gradients": request("send", TRAINER, vars=[spec(OWN)],
                                            frames=[GRAD_BYTES], barrier=1),
    "send_far_ahead": request("send", TRAINER, step=1 << 40, vars=[spec(OWN)],
                              frames=[GRAD_BYTES]),
    "get_far_ahead": request("get", TRAINER, step=1 << 40, names=["mlp.fc1.w"]),
    "barrier_far_ahead": request("send_barrier", TRAINER, step=2),
    "a_reply": request("reply", TRAINER),
    "an_error": request("error", TRAINER),
    "a_collective": request("collective", TRAINER),
}
"""Messages from the job's own trainer name that the pserver must refuse (sent before that
trainer runs; the transport's identity is not authenticated here, so a peer speaking as a
trainer is that trainer as far as the pserver can tell)."""

HOSTILE = {**WIRE_CASES, **OUTSIDER_CASES, **INSIDER_CASES}

REASONS = {
    "empty_of_2_124_elements": "bad_shape", "empty_of_2_62_rows": "bad_shape",
    "phantom_of_2_64_elements": "bad_shape", "timestamp_extension": "bad_header",
    "timestamp_nested": "bad_header", "another_trainers_gradient": "not_own_var",
    "nan_gradient": "nonfinite", "inf_gradient": "nonfinite", "minus_inf_gradient": "nonfinite",
    "gradient_of_3e38": "nonfinite", "one_nan_among_zeros": "nonfinite",
    "barrier_before_own_gradients": "barrier_early", "send_far_ahead": "step_ahead",
    "get_far_ahead": "step_ahead", "barrier_far_ahead": "step_ahead",
    "a_reply": "not_a_request", "an_error": "not_a_request", "a_collective": "not_a_request",
}
"""The reason the error reply names, for the inputs an insider's message once killed, poisoned
or bloated a pserver with (and those like them)."""


def test_there_are_at_least_fifty_named_hostile_inputs() -> None:
    assert len(HOSTILE) >= 50
    assert len(HOSTILE) == len(WIRE_CASES) + len(OUTSIDER_CASES) + len(INSIDER_CASES)


# ------------------------------------------------------------------------------- wire decoder

PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(1 << 63), (1 << 64) - 1) | st.floats()
    | st.text(max_size=20) | st.binary(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12)
"""Any msgpack data."""

FIELDS = ("v", "kind", "id", "src", "step", "vars", "trainer", "names")
VALID_FIELDS: dict[str, Any] = {"v": 1, "kind": "send", "id": 7, "src": OUTSIDER, "step": 0,
                                "vars": [spec()], "trainer": 0}


@st.composite
def mutated_header(draw: st.DrawFn) -> bytes:
    """A valid SEND header with some fields (or its var entry's) replaced or removed."""
    fields = dict(VALID_FIELDS, vars=[spec()])
    for key in draw(st.lists(st.sampled_from(FIELDS), max_size=3)):
        if draw(st.booleans()):
            fields[key] = draw(PLAIN)
        else:
            fields.pop(key, None)
    if isinstance(fields.get("vars"), list) and fields["vars"] and draw(st.booleans()):
        entry = dict(spec())
        entry[draw(st.sampled_from(["name", "dtype", "shape", "kind", "height", "lod"]))] = \
            draw(PLAIN)
        fields["vars"] = [entry]
    return pack(fields)


FRAMES = st.one_of(
    st.lists(st.binary(max_size=64), max_size=5),
    st.tuples(mutated_header(), st.lists(st.binary(max_size=64), max_size=3)).map(
        lambda pair: [pair[0], *pair[1]]),
    st.tuples(mutated_header(), st.sampled_from([b"", GRAD_BYTES, GRAD_BYTES * 2])).map(list),
)


def decode_or_refuse(frames: list[bytes]) -> Message | DecodeError:
    started = time.thread_time()  # CPU, not wall time: a busy machine must not fail it
    try:
        result: Message | DecodeError = decode(frames, LIMIT)
    except DecodeError as exc:
        result = exc
    assert time.thread_time() - started < 1.0, "decoding took over a second of CPU"
    return result


@settings(max_examples=400)
@given(FRAMES)
def test_any_frames_decode_to_a_message_or_a_decode_error(frames: list[bytes]) -> None:
    result = decode_or_refuse(frames)
    if isinstance(result, Message):
        assert isinstance(result.kind, Kind) and result.src
        assert 0 <= result.id < 1 << 64
        return
    reply = encode(error_reply("pserver:0", result))  # every refusal can be answered
    assert sum(len(bytes(frame)) for frame in reply) < 4 * MAX_DETAIL


@pytest.mark.parametrize("name", sorted(WIRE_CASES))
def test_each_wire_case_is_refused_quickly_with_a_small_encodable_reply(name: str) -> None:
    result = decode_or_refuse(WIRE_CASES[name])
    assert isinstance(result, DecodeError), name
    frames = encode(error_reply("pserver:0", result))
    assert len(frames[0]) < 4 * MAX_DETAIL
    assert len(str(result)) < 2 * MAX_DETAIL


def test_a_header_over_the_limit_is_refused_before_it_is_parsed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    huge = header(pad="x" * (10 << 20))

    def parse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the oversized header was parsed")

    monkeypatch.setattr(msgpack, "unpackb", parse)
    with pytest.raises(DecodeError, match="too_large: header of"):
        decode([huge])


# ------------------------------------------------------------------- a live shell, in memory

class MemoryTransport(Transport):
    """A server's transport whose peers are the test: `deliver` puts a message in, `replies`
    holds what the server sent back."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.inbox: asyncio.Queue[tuple[str, list[Frame]]] = asyncio.Queue()
        self.replies: asyncio.Queue[tuple[str, list[Frame]]] = asyncio.Queue()

    async def bind(self, endpoint: str) -> str:
        return endpoint

    async def connect(self, endpoint: str) -> None:
        raise NotImplementedError

    async def send(self, peer: str, frames: Sequence[Frame]) -> None:
        self.replies.put_nowait((peer, list(frames)))

    async def recv(self) -> tuple[str, list[Frame]]:
        return await self.inbox.get()

    async def close(self) -> None:
        pass


def job() -> Job:
    return make_job(MODEL, trainers=TRAINERS, pservers=1, steps=3, retry_after=FAST_DRAIN)


def params_of(service: PserverService) -> dict[str, bytes]:
    return {name: np.asarray(service.scope.get(name)).tobytes()
            for name in sorted(service.state) if service.scope.has(name)}


def assert_bounded(service: PserverService) -> None:
    """The per-sender state holds the job's trainers at most, and nothing waits."""
    core = service.core
    assert set(core.senders.values()) == {f"trainer:{i}" for i in range(TRAINERS)}
    assert set(core.dedupe._senders) <= set(core.senders.values())
    assert set(core.last_seen) <= set(range(TRAINERS))
    assert set(core.next_step) <= set(range(TRAINERS))
    assert not core.pending and not core.deferred


class LiveShell:
    """A pserver of `job()` serving over a `MemoryTransport` on its own event loop."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.job = job()
        self.transport = MemoryTransport("pserver:0")
        self.service = make_pserver(self.job, 0, self.transport)
        self.service.config = replace(self.service.config, max_message_size=LIMIT)
        self.before = params_of(self.service)
        self.serving = self.loop.create_task(self.service.serve(self.job.endpoints[0]))
        self.loop.run_until_complete(asyncio.sleep(0))

    def exchange(self, peer: str, frames: list[bytes]) -> Message:
        """Deliver one message; the one reply it gets (decoded)."""
        async def go() -> Message:
            self.transport.inbox.put_nowait((peer, [memoryview(f) for f in frames]))
            to, reply = await asyncio.wait_for(self.transport.replies.get(), 5)
            assert to == peer
            for _ in range(3):  # nothing else comes back
                await asyncio.sleep(0)
            assert self.transport.replies.empty()
            return decode(reply)
        return self.loop.run_until_complete(go())

    def check_unharmed(self) -> None:
        assert not self.serving.done(), self.serving
        assert params_of(self.service) == self.before
        assert_bounded(self.service)

    def close(self) -> None:
        self.serving.cancel()
        self.loop.run_until_complete(asyncio.gather(self.serving, return_exceptions=True))
        self.loop.close()


@pytest.fixture(scope="module")
def shell() -> Iterator[LiveShell]:
    live = LiveShell()
    yield live
    live.close()


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_each_hostile_input_gets_a_small_error_reply_and_changes_nothing(
        shell: LiveShell, name: str) -> None:
    peer = TRAINER if name in INSIDER_CASES else OUTSIDER
    reply = shell.exchange(peer, HOSTILE[name])
    assert reply.kind is Kind.ERROR, (name, reply)
    error = reply.extra["error"]
    assert len(error["detail"]) <= MAX_DETAIL and error["reason"]
    shell.check_unharmed()


@pytest.mark.parametrize("name", sorted(REASONS))
def test_each_insider_refusal_names_its_reason(shell: LiveShell, name: str) -> None:
    reply = shell.exchange(TRAINER if name in INSIDER_CASES else OUTSIDER, HOSTILE[name])
    assert reply.kind is Kind.ERROR and reply.extra["error"]["reason"] == REASONS[name], reply
    shell.check_unharmed()


@settings(max_examples=150)
@given(FRAMES, st.sampled_from([OUTSIDER, TRAINER, "x" * 255]))
def test_a_live_shell_fuzzed_answers_every_message_with_an_error(
        shell: LiveShell, frames: list[bytes], peer: str) -> None:
    reply = shell.exchange(peer, frames)
    assert reply.kind is Kind.ERROR
    shell.check_unharmed()


def test_many_distinct_senders_leave_no_state(shell: LiveShell) -> None:
    for i in range(2000):
        name = f"sender-{i}"
        assert shell.exchange(name, request("heartbeat", src=name)).kind is Kind.ERROR
    shell.check_unharmed()


LEAK_BYTES = 16
"""Bytes an input may leave allocated on average: less than the smallest state a pserver
could keep per input (a set entry and a tuple of a name and an id, about 100 bytes), many
times what a burst leaves without a leak (a few bytes an input, the loop's and allocators'
bookkeeping)."""


def test_a_burst_of_hostile_input_leaves_no_memory_behind() -> None:
    """The memory Python has allocated (tracemalloc), after a warm-up: before and after
    thousands of hostile inputs from distinct unknown senders (a heartbeat, a gradient, a
    header over the limit each; every named input between), it grows by less than
    `LEAK_BYTES` an input. Logging is off meanwhile: the test's log capture keeps every
    record, which is the test's memory, not the pserver's."""
    live = LiveShell()

    def burst(tag: str, senders: int) -> int:
        count = 0
        for i in range(senders):
            name = f"{tag}-{i}"
            for frames in (request("heartbeat", src=name), WIRE_CASES["header_over_64k"],
                           request("send", src=name, vars=[spec()], frames=[GRAD_BYTES])):
                assert live.exchange(name, frames).kind is Kind.ERROR
            count += 3
            if i % 500 == 0:
                for case, frames in HOSTILE.items():
                    peer = TRAINER if case in INSIDER_CASES else name
                    assert live.exchange(peer, frames).kind is Kind.ERROR, case
                count += len(HOSTILE)
        return count

    logging.disable(logging.CRITICAL)
    try:
        burst("warm-up", 100)
        gc.collect()
        tracemalloc.start()
        try:
            before = tracemalloc.get_traced_memory()[0]
            count = burst("sender", 1500)
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        live.check_unharmed()
    finally:
        logging.disable(logging.NOTSET)
        live.close()
    assert count > 4500
    assert grown < LEAK_BYTES * count, f"{grown} bytes left after {count} hostile inputs"


# --------------------------------------------------------------- over ZeroMQ, then a real job

AUTHENTIC = {"spoofed_src"}
"""Hostile inputs that, sent with trainer:0's key, are that trainer's own well-formed messages
(a heartbeat): an authenticated insider sends the others only."""
NOTHING_WITHIN_MS = 300
"""How long a refused client waits to see that nothing comes back."""


def raw_dealer(context: zmq.Context[Any], endpoint: str, identity: str,
               keys: CurveKeys | None = None) -> zmq.Socket[Any]:
    """A plain pyzmq DEALER to `endpoint` speaking as `identity`; with CURVE `keys` it
    connects with them, under a routing id of `identity` and a token of its own, as the job's
    nodes do (`own_routing_id`)."""
    dealer = context.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.setsockopt(zmq.ROUTING_ID, own_routing_id(identity, keys is not None))
    dealer.setsockopt(zmq.RCVTIMEO, REPLY_TIMEOUT_MS)
    dealer.setsockopt(zmq.SNDTIMEO, REPLY_TIMEOUT_MS)  # a send never blocks the test for good
    if keys is not None:
        make_client(dealer, keys, endpoint)
    dealer.connect(f"tcp://{endpoint}")
    return dealer


async def attack(endpoint: str, service: PserverService, keys: CurveKeys | None = None) -> None:
    """Every hostile input over plain pyzmq sockets, each from a new connection: an error
    reply for each, but for the transport's drops, which get none. With `keys` (trainer:0's),
    every input comes under trainer:0's own name, authenticated, but those that are then its
    own well-formed messages (`AUTHENTIC`)."""
    context: zmq.Context[Any] = zmq.Context()
    loop = asyncio.get_running_loop()
    counted = 0
    try:
        for name, frames in HOSTILE.items():
            if keys is not None and name in AUTHENTIC:
                continue
            identity = TRAINER if keys is not None or name in INSIDER_CASES else OUTSIDER
            dealer = sender = raw_dealer(context, endpoint, identity, keys)
            try:
                await loop.run_in_executor(None, dealer.send_multipart, frames)
                if name in ZMQ_DROPS:
                    # answered: the server is alive, the drop silent. On a connection of its
                    # own (the first stays open until then, so that what it sent is not
                    # discarded): libzmq closes a connection that sends a frame over
                    # MAXMSGSIZE, and a ping sent behind such a frame may go down with it
                    sender, dealer = dealer, raw_dealer(
                        context, endpoint, identity if keys is not None else "ping-" + identity,
                        keys)
                    ping = request("heartbeat", src="ping-" + identity)
                    await loop.run_in_executor(None, dealer.send_multipart, ping)
                try:
                    reply = decode(await loop.run_in_executor(None, dealer.recv_multipart))
                except zmq.Again:
                    raise AssertionError(f"{name}: no reply within "
                                         f"{REPLY_TIMEOUT_MS / 1000:g} s") from None
                assert reply.kind is Kind.ERROR, name
                if name in ZMQ_DROPS:  # the reply is the ping's
                    detail = reply.extra["error"]["detail"]
                    assert "heartbeat" in detail and "ping-" in detail, (name, reply)
                    if name in COUNTED_DROPS:  # the ping, on its own connection, may overtake
                        counted += 1  # the message it follows: let the server read that too
                        while service.transport.dropped < counted:  # type: ignore[attr-defined]
                            await asyncio.sleep(0)
            finally:
                sender.close()
                dealer.close()  # every socket closed, else the context's term would hang
        assert_bounded(service)
    finally:
        context.term()


def unanswered(endpoint: str, sends: Sequence[tuple[str, CurveKeys | None,
                                                   Sequence[list[bytes]]]],
               sent: Callable[[], bool]) -> list[list[bytes]]:
    """Send each message list from a DEALER of its own (identity, keys); once `sent()` says
    the server has seen what it will of them, what came back within `NOTHING_WITHIN_MS`."""
    context: zmq.Context[Any] = zmq.Context()
    dealers = []
    try:
        for identity, keys, messages in sends:
            dealers.append(raw_dealer(context, endpoint, identity, keys))
            for frames in messages:
                try:  # a DEALER whose handshake failed has no peer to queue for
                    dealers[-1].send_multipart(frames, zmq.NOBLOCK)
                except zmq.Again:
                    break
        while not sent():
            time.sleep(0.01)
        got = []
        for dealer in dealers:
            while dealer.poll(NOTHING_WITHIN_MS):
                got.append(dealer.recv_multipart())
        return got
    finally:
        for dealer in dealers:
            dealer.close()
        context.term()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("secure", [False, True], ids=["plain", "curve"])
def test_over_zeromq_a_pserver_survives_every_input_then_serves_the_fault_free_result(
        secure: bool, tmp_path: Path) -> None:
    """Plain: every hostile input, as an outsider or as the trainer it names. CurveZMQ: from
    an insider with trainer:0's key (as itself: an error reply for each; under another's
    routing id: nothing, counted as impostors), and from outsiders without a key or with one
    not of the job: nothing comes back, and the handshake ZAP refused is counted. Then the job,
    authenticated where the pserver is, ends with the parameters of a run that saw none."""
    the_job = job()
    reference = asyncio.run(run_job(the_job, ZmqTransport)).params
    directory = job_keys(tmp_path, the_job) if secure else None
    endpoint = the_job.endpoints[0]

    def transport_for(name: str, limits: ZmqLimits | None = None) -> ZmqTransport:
        if directory is None:
            return ZmqTransport(name, limits)
        role, index = name.split(":")
        return ZmqTransport(name, limits, curve=node_keys(
            directory, role, int(index), the_job.trainers, the_job.endpoints))

    async def outsiders(service: PserverService, insider: CurveKeys) -> None:
        transport: ZmqTransport = service.transport  # type: ignore[assignment]
        stranger = CurveKeys(*zmq.curve_keypair(), servers=insider.servers)
        everything = list(HOSTILE.values())
        impostors = list(OUTSIDER_CASES.values())
        got = await asyncio.to_thread(
            unanswered, endpoint,
            [(TRAINER, None, everything), (TRAINER, stranger, everything),
             (OUTSIDER, insider, impostors)],
            lambda: transport.unauthenticated >= 1 and transport.impostors >= len(impostors))
        assert got == []
        assert transport.impostors == len(impostors)
        assert_bounded(service)

    async def attacked() -> dict[str, np.ndarray]:
        limits = ZmqLimits(max_message_size=LIMIT, linger_ms=1000)
        service = make_pserver(the_job, 0, transport_for("pserver:0", limits))
        service.config = replace(service.config, max_message_size=LIMIT)
        before = params_of(service)
        serving = asyncio.get_running_loop().create_task(service.serve(endpoint))
        trainers: list[Trainer] = []
        try:
            await asyncio.sleep(0)
            insider = None if directory is None else transport_for(TRAINER).curve
            await attack(endpoint, service, insider)
            if insider is not None:
                await outsiders(service, insider)
            assert not serving.done()
            assert params_of(service) == before
            assert service.transport.dropped == 2  # type: ignore[attr-defined]
            trainers = [make_trainer(the_job, i, transport_for(f"trainer:{i}"))
                        for i in range(TRAINERS)]
            steps, loss = the_job.scenario.train.steps, the_job.model.loss.name
            await asyncio.gather(*(t.run(batches_for(the_job, i), steps, loss)
                                   for i, t in enumerate(trainers)))
            await asyncio.wait_for(serving, 30)
            assert_bounded(service)
            return {name: np.asarray(trainers[0].scope.get(name)) for name in reference}
        finally:
            for t in trainers:
                await t.client.close()
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await service.transport.close()

    after = asyncio.run(attacked())
    assert after.keys() == reference.keys()
    for name, value in reference.items():
        assert after[name].tobytes() == np.asarray(value).tobytes(), name


# ------------------------------------------------------------------------------ trainer side

class _Client:
    name = "trainer:0"
    labels = {"ep": "pserver:1"}
    policy = RetryPolicy()


def test_a_sync_pserver_two_steps_behind_holding_a_request_is_a_named_error() -> None:
    ops = RpcOps(_Client(), 0)  # type: ignore[arg-type]
    ops.server_state["ep"] = ServerState(sync=True)
    ops.step = 5
    pending = Message(Kind.REPLY, 3, "pserver:1", 3, extra={"pending": True, "server_step": 3})
    with pytest.raises(StepMismatch, match="pserver:1 is at step 3.*disagree"):
        ops._check_reply("ep", pending)
    ops._check_reply("ep", Message(Kind.REPLY, 3, "pserver:1", 4,
                                   extra={"pending": True, "server_step": 4}))  # a step behind


def test_a_reply_without_the_var_asked_for_is_a_named_error() -> None:
    ops = RpcOps(_Client(), 0)  # type: ignore[arg-type]
    ack = Message(Kind.REPLY, 1, "pserver:1", 0, extra={"server_step": 0})
    with pytest.raises(BadReply, match="pserver:1 .* lacks var 'w'"):
        ops._var("ep", ack, "w")


def test_a_pending_notice_a_check_refuses_fails_the_call() -> None:
    """The RPC client runs a call's check on pending notices too: a server that holds a
    request it can never answer fails the call at once instead of keeping it alive."""
    from runtime.network.rpc import RetryPolicy, RpcClient

    class Echo(MemoryTransport):
        async def connect(self, endpoint: str) -> None:
            pass

        def deliver_to(self, handler: Callable[[str, list[Frame]], None]) -> bool:
            self.handler = handler
            return True

        def send_nowait(self, peer: str, frames: Sequence[Frame]) -> bool:
            msg = decode(frames)
            notice = Message(Kind.REPLY, msg.id, "pserver:1", 0,
                             extra={"pending": True, "server_step": 0})
            asyncio.get_running_loop().call_soon(self.handler, peer, encode(notice))
            return True

    def refuse(endpoint: str, reply: Message) -> None:
        if reply.extra.get("pending"):
            raise StepMismatch(0, endpoint, 5, 0)

    async def go() -> None:
        client = RpcClient(Echo("trainer:0"), RetryPolicy(deadline=30, first_retry=10))
        await client.connect(["ep"])
        with pytest.raises(StepMismatch):
            await asyncio.wait_for(client.start("ep", Kind.GET, 5, check=refuse), 5)

    asyncio.run(go())


def test_phantom_ids_are_refused_by_a_numeric_store(shell: LiveShell) -> None:
    from runtime.services.pserver_messages import ProtocolViolation
    with pytest.raises(ProtocolViolation, match="phantom"):
        shell.service.store._check_ids({"ids": Phantom((2, 1), np.dtype("int64"))})
