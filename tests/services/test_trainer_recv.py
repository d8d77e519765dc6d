"""A trainer's `recv`: the values of a GET land in the scope when its reply comes, a reply that
lacks one fails the values' wait with a named error, and giving the step up cancels the GET."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import pytest

from runtime.execution.scope import Scope
from runtime.network.wire import Kind, Message
from runtime.services.trainer import BadReply, RpcOps
from transpiler.ir import Op

from trainer_helpers import FutureClient

pytestmark = pytest.mark.timeout(30)


RECV = Op("recv", outputs={"Out": ["w", "b"]}, attrs={"epmap": ["ep", "ep"]})


def _reply(**vars: Any) -> Message:
    return Message(Kind.REPLY, 1, "pserver:1", 0, vars, {"server_step": 0})


async def _recv(scope: Scope) -> tuple[FutureClient, RpcOps]:
    """A trainer's RPC ops that have run `RECV` into `scope`, and its client."""
    client = FutureClient()
    ops = RpcOps(client, 0)  # type: ignore[arg-type]
    await ops.recv(RECV, scope)
    return client, ops


def test_the_values_of_a_get_land_when_its_reply_comes() -> None:
    async def go() -> None:
        scope = Scope()
        client, ops = await _recv(scope)
        ((kind, names, reply),) = client.started  # one GET for both vars, sent at once
        assert (kind, names) == (Kind.GET, ["w", "b"])
        assert not ops.pending["w"].done()
        reply.set_result(_reply(w=np.ones(2), b=np.zeros(1)))
        await ops.wait_for(["w", "b"])
        assert scope.get("w").tolist() == [1.0, 1.0] and scope.get("b").tolist() == [0.0]

    asyncio.run(go())


def test_a_reply_lacking_a_var_fails_the_wait_naming_it() -> None:
    async def go() -> None:
        client, ops = await _recv(Scope())
        client.started[0][2].set_result(_reply(w=np.ones(2)))
        with pytest.raises(BadReply, match="pserver:1 .* lacks var 'b'"):
            await ops.wait_for(["w", "b"])

    asyncio.run(go())


def test_a_failed_get_fails_the_wait_with_its_error() -> None:
    async def go() -> None:
        client, ops = await _recv(Scope())
        client.started[0][2].set_exception(TimeoutError("pserver:1 did not answer"))
        with pytest.raises(TimeoutError, match="did not answer"):
            await ops.wait_for(["w"])

    asyncio.run(go())


def test_abandoning_the_step_cancels_the_get_in_flight() -> None:
    async def go() -> None:
        client, ops = await _recv(Scope())
        await ops.abandon()
        assert client.started[0][2].cancelled()
        assert not ops.pending

    asyncio.run(go())
