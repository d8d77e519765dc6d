"""CurveZMQ jobs as tests drive them: a job's keys, `runtime up` of a scenario with the keys it
makes, and messages sent to a pserver over plain pyzmq, as an outsider would."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import zmq

from runtime import cli
from runtime.config.nodes import node_file_stem
from runtime.network.curve import write_keys
from runtime.network.wire import Kind, Message, encode
from runtime.services.job import Job


STEPS = 8


def job_keys(tmp_path: Path, job: Job) -> Path:
    directory = tmp_path / "keys"
    write_keys(directory, [node_file_stem("pserver", j) for j in range(len(job.endpoints))]
               + [node_file_stem("trainer", i) for i in range(job.trainers)])
    return directory


def attack(endpoint: str, routing_id: bytes, frames_list: list[list[bytes]],
           keys: tuple[bytes, bytes] | None, server_key: bytes | None) -> list[list[bytes]]:
    """Send each message from a DEALER of its own (plain pyzmq, as an outsider would), with
    CURVE `keys` if given; what came back within half a second."""
    context = zmq.Context()
    dealer = context.socket(zmq.DEALER)
    try:
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.ROUTING_ID, routing_id)
        if keys is not None:
            dealer.setsockopt(zmq.CURVE_SERVERKEY, server_key)
            dealer.setsockopt(zmq.CURVE_PUBLICKEY, keys[0])
            dealer.setsockopt(zmq.CURVE_SECRETKEY, keys[1])
        dealer.connect(f"tcp://{endpoint}")
        for frames in frames_list:
            dealer.send_multipart(frames)
        replies = []
        while dealer.poll(500):
            replies.append(dealer.recv_multipart())
        return replies
    finally:
        dealer.close()
        context.term()


def hostile_messages(server: Any, src: str, trainer: int) -> list[list[bytes]]:
    """A GET of every parameter, a SEND of every gradient (ones) and a COMPLETE, claiming to
    come from `src` as trainer `trainer`."""
    params = sorted(server.state)
    grads = {g: np.ones_like(np.asarray(server.scope.get(g.split("@GRAD")[0])))
             for g in sorted(server.receivable) if g.split("@GRAD")[0] in server.state}
    extra = {"trainer": trainer}
    messages = [Message(Kind.GET, 1, src, 0, extra={**extra, "names": params}),
                Message(Kind.SEND, 2, src, 0, grads, extra),
                Message(Kind.COMPLETE, 3, src, 0, extra=extra)]
    return [[bytes(f) for f in encode(m)] for m in messages]


async def outsider_attacks(endpoint: str, messages: list[list[bytes]],
                           trainer1: tuple[bytes, bytes], server_key: bytes
                           ) -> dict[str, list[list[bytes]]]:
    """What came back to the three outsiders a CurveZMQ job refuses, each sending `messages` as
    trainer 0 (`attack`): with no key, with a key not of the job, and with trainer 1's key
    under trainer 0's routing id."""
    attempts: dict[str, tuple[tuple[bytes, bytes] | None, bytes | None]] = {
        "no key": (None, None), "wrong key": (zmq.curve_keypair(), server_key),
        "routing id": (trainer1, server_key)}
    return {name: await asyncio.to_thread(attack, endpoint, b"trainer:0", messages, *keys)
            for name, keys in attempts.items()}


SCENARIO = """\
name: curve-up
seed: 3
model: {name: mlp, sizes: [64, 32, 10], optimizer: {type: sgd, learning_rate: 0.1}}
data: {batch_size: 16}
cluster: {pservers: 1, trainers: 2}
transpiler: {mode: sync}
train: {steps: 5, deadline: 60s, heartbeat_timeout: 10s, retry_after: 100ms}
expect: {params_equal_to: local}
"""


def up_encrypted(tmp_path: Path, text: str, capfd: pytest.CaptureFixture[str]
                 ) -> tuple[Path, Path, Any]:
    """`runtime up` of the scenario `text` over CurveZMQ (``cluster.security: curve``, which a
    job with message faults has anyway) with the keys it makes for the job: the scenario's
    file, the out dir and what it printed, once it said every connection is encrypted."""
    scenario = tmp_path / "s.yaml"
    scenario.write_text(text)
    out = tmp_path / "out"
    assert cli.main(["up", str(scenario), "--out", str(out),
                     "--set", "cluster.security=curve"]) == 0
    printed = capfd.readouterr()
    assert f"CurveZMQ: every connection authenticated and encrypted, keys in {out / 'keys'}" \
        in printed.out
    return scenario, out, printed
