"""A pserver answers every malformed or unacceptable message with an error reply that names
the problem, logs it, keeps its parameters bit-identical and goes on serving."""

from __future__ import annotations

import asyncio
import math
import logging

import msgpack
import numpy as np
import pytest

from runtime.execution.executor import Executor
from runtime.network.wire import Kind, Message, decode, encode
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.pserver import PserverService, ServeConfig

from cluster_helpers import make_job

MODEL = "{name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}"


def header(**fields: object) -> bytes:
    base = {"v": 1, "kind": "send", "id": 7, "src": "trainer:0", "step": 0, "vars": [], "trainer": 0}
    base.update(fields)
    return msgpack.packb(base, use_bin_type=True)


def grad_spec(name: str, shape: list[int], dtype: str = "float32") -> dict:
    return {"name": name, "dtype": dtype, "shape": shape, "kind": "dense"}


GRAD = "mlp.fc1.w@GRAD"
BAD_MESSAGES = {
    "malformed header": ([b"\xc1not msgpack"], "bad_header"),
    "unknown kind": ([header(kind="explode")], "unknown_kind"),
    "wrong frame count": ([header(vars=[grad_spec(GRAD, [32, 10])])], "frame_count"),
    "wrong dtype": ([header(vars=[grad_spec(GRAD, [32, 10], "float64")]),
                     np.zeros((32, 10)).tobytes()], GRAD),
    "wrong shape": ([header(vars=[grad_spec(GRAD, [31, 10])]),
                     np.zeros((31, 10), np.float32).tobytes()], GRAD),
    "unknown var": ([header(vars=[grad_spec("nonsense@GRAD", [2])]),
                     np.zeros(2, np.float32).tobytes()], "nonsense@GRAD"),
    "oversized": ([header(vars=[grad_spec(GRAD, [1 << 20, 1 << 10])]), b""], "too_large"),
    "param, not a grad": ([header(vars=[grad_spec("mlp.fc1.w", [32, 10])]),
                           np.zeros((32, 10), np.float32).tobytes()], "mlp.fc1.w"),
    "no trainer field": ([msgpack.packb({"v": 1, "kind": "heartbeat", "id": 3, "src": "x",
                                         "step": 0, "vars": []})], "trainer"),
}


@pytest.mark.timeout(30)
def test_bad_messages_get_named_errors_and_change_nothing(caplog: pytest.LogCaptureFixture) -> None:
    job = make_job(MODEL, trainers=1, pservers=1)
    main, startup = job.pserver_programs(0)
    endpoint = job.endpoints[0]

    async def scenario() -> None:
        service = PserverService(main, startup, ZmqTransport("pserver:0"), Executor(),
                                 ServeConfig(heartbeat_timeout=30, max_message_size=1 << 26))
        # one window for the whole test, however long a loaded machine makes it take: the
        # log lines counted below are then those of one window, not of the machine's speed
        service.refusals.interval = math.inf
        before = {n: service.scope.get(n).tobytes() for n in ("mlp.fc1.w", "mlp.fc0.w")}
        serving = asyncio.get_running_loop().create_task(service.serve(endpoint))
        client = ZmqTransport("trainer:0")
        await client.connect(endpoint)
        try:
            for label, (frames, culprit) in BAD_MESSAGES.items():
                await client.send(endpoint, frames)  # all carry id 7: errors are not cached
                _, reply_frames = await asyncio.wait_for(client.recv(), 10)
                reply = decode(reply_frames)
                assert reply.kind is Kind.ERROR, label
                error = reply.extra["error"]
                assert culprit in f"{error['reason']} {error['detail']} {error['var']}", (label, error)
            # still serving, and nothing changed
            get = Message(Kind.GET, 99, "trainer:0", -1, extra={"trainer": 0, "names": ["mlp.fc1.w"]})
            await client.send(endpoint, encode(get))
            _, reply_frames = await asyncio.wait_for(client.recv(), 10)
            reply = decode(reply_frames)
            assert reply.kind is Kind.REPLY
            assert np.asarray(reply.vars["mlp.fc1.w"]).tobytes() == before["mlp.fc1.w"]
            for name, data in before.items():
                assert service.scope.get(name).tobytes() == data, name
            assert service.stats.errors == len(BAD_MESSAGES)
            assert sum(service.stats.refusals.values()) == len(BAD_MESSAGES)  # by reason
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await client.close()
            await service.transport.close()

    with caplog.at_level(logging.WARNING, logger="runtime.services.pserver"):
        asyncio.run(scenario())
    # the first refusal in full, the others of the same peer summed up (no log flood)
    lines = [r.getMessage() for r in caplog.records]
    assert sum("rejected a message" in line for line in lines) == 1
    assert sum(f"{len(BAD_MESSAGES) - 1} more refusals from trainer:0" in line
               for line in lines) == 1


@pytest.mark.timeout(30)
def test_retried_gradient_is_applied_once() -> None:
    job = make_job(MODEL, trainers=1, pservers=1)
    main, startup = job.pserver_programs(0)
    endpoint = job.endpoints[0]
    grad = np.ones((32, 10), np.float32)

    async def scenario() -> tuple[np.ndarray, np.ndarray]:
        service = PserverService(main, startup, ZmqTransport("pserver:0"))
        start = service.scope.get("mlp.fc1.w").copy()
        serving = asyncio.get_running_loop().create_task(service.serve(endpoint))
        client = ZmqTransport("trainer:0")
        await client.connect(endpoint)
        extra = {"trainer": 0}
        try:
            grads = {name: np.zeros(main.global_block().var(name).shape, np.float32)
                     for name in service.receivable}
            grads[GRAD] = grad
            send = Message(Kind.SEND, 1, "trainer:0", 0, grads, extra)
            for _ in range(3):  # the same message id, resent
                await client.send(endpoint, encode(send))
                await asyncio.wait_for(client.recv(), 10)
            for i, kind in enumerate((Kind.SEND_BARRIER, Kind.GET, Kind.FETCH_BARRIER)):
                names = {"names": ["mlp.fc1.w"]} if kind is Kind.GET else {}
                await client.send(endpoint, encode(Message(kind, 2 + i, "trainer:0", 0,
                                                           extra={**extra, **names})))
                _, frames = await asyncio.wait_for(client.recv(), 10)
                assert decode(frames).kind is Kind.REPLY
            return start, service.scope.get("mlp.fc1.w")
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await client.close()
            await service.transport.close()

    start, after = asyncio.run(scenario())
    np.testing.assert_allclose(after, start - 0.1 * grad, rtol=1e-6)


@pytest.mark.timeout(30)
def test_a_barrier_before_all_gradients_is_refused_naming_one() -> None:
    """A send barrier that would make the server optimize with a missing gradient (which would
    fail at step 0, or apply the last step's again later) is refused, naming the missing grad;
    the gradients then sent complete the step."""
    job = make_job(MODEL, trainers=1, pservers=1)
    main, startup = job.pserver_programs(0)
    endpoint = job.endpoints[0]

    async def scenario() -> None:
        service = PserverService(main, startup, ZmqTransport("pserver:0"))
        start = service.scope.get("mlp.fc1.w").copy()
        serving = asyncio.get_running_loop().create_task(service.serve(endpoint))
        client = ZmqTransport("trainer:0")
        await client.connect(endpoint)

        async def ask(msg: Message) -> Message:
            await client.send(endpoint, encode(msg))
            _, frames = await asyncio.wait_for(client.recv(), 10)
            return decode(frames)

        try:
            only_one = Message(Kind.SEND, 1, "trainer:0", 0, {GRAD: np.ones((32, 10), np.float32)},
                               {"trainer": 0})
            barrier = Message(Kind.SEND_BARRIER, 2, "trainer:0", 0, extra={"trainer": 0})
            assert (await ask(only_one)).kind is Kind.REPLY
            refused = await ask(barrier)
            assert refused.kind is Kind.ERROR
            assert refused.extra["error"]["var"].endswith("@GRAD")
            assert "before its gradients" in refused.extra["error"]["detail"]
            assert service.scope.get("mlp.fc1.w").tobytes() == start.tobytes()
            rest = {name: np.zeros(main.global_block().var(name).shape, np.float32)
                    for name in service.receivable if name != GRAD}
            assert (await ask(Message(Kind.SEND, 3, "trainer:0", 0, rest, {"trainer": 0}))).kind \
                is Kind.REPLY
            assert (await ask(Message(Kind.SEND_BARRIER, 4, "trainer:0", 0,
                                      extra={"trainer": 0}))).kind is Kind.REPLY
            np.testing.assert_allclose(service.scope.get("mlp.fc1.w"), start - 0.1, rtol=1e-6)
            assert not serving.done()
        finally:
            serving.cancel()
            await asyncio.gather(serving, return_exceptions=True)
            await client.close()
            await service.transport.close()

    asyncio.run(scenario())
