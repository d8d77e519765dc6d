"""Local sockets: a job's nodes on one host talk over ipc:// sockets in a private directory."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import stat
from pathlib import Path

import numpy as np
import pytest

from runtime.config.scenario import load_scenario
from runtime.network.local_sockets import (SUN_PATH_MAX, SocketDirError, check_socket_dir,
                                           ipc_address, make_socket_dir, release_socket_dir,
                                           socket_path)
from runtime.network.ports import PortsNotReady, wait_for_ports
from runtime.network.zmq_transport import ZmqTransport
from runtime.services.node import RoleError, socket_directory

pytestmark = pytest.mark.timeout(60)
QUICKSTART = Path(__file__).parents[2] / "scenarios" / "quickstart.yaml"


def test_a_fresh_socket_directory_is_private_and_names_a_socket_per_endpoint() -> None:
    directory = make_socket_dir()
    try:
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert check_socket_dir(directory) == directory
        assert socket_path(directory, "127.0.0.1:6170") == directory / "127.0.0.1-6170"
        assert socket_path(directory, "[::1]:6170") == directory / "__1-6170"
        assert ipc_address(directory, "ps.example:7") == f"ipc://{directory}/ps.example-7"
        assert ipc_address(directory, "tcp://h:1") == "tcp://h:1"
    finally:
        directory.rmdir()


def test_a_directory_others_may_open_a_file_or_a_long_path_is_refused(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    shared.chmod(0o755)
    with pytest.raises(SocketDirError, match=r"shared: mode 0755 lets other users in; the job's "
                                             r"sockets need a directory of mode 0700"):
        check_socket_dir(shared)
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(SocketDirError, match="file: not a directory"):
        check_socket_dir(a_file)
    with pytest.raises(SocketDirError, match="No such file"):
        check_socket_dir(tmp_path / "missing")
    deep = tmp_path / ("d" * (SUN_PATH_MAX - len(str(tmp_path))))
    with pytest.raises(SocketDirError, match=f"longer than the {SUN_PATH_MAX} bytes"):
        socket_path(deep, "127.0.0.1:6170")


def test_ipc_takes_neither_keys_nor_insecure(tmp_path: Path) -> None:
    private = tmp_path / "sockets"
    private.mkdir(mode=0o700)
    assert socket_directory(private, None, False) == private
    assert socket_directory(None, None, False) is None
    with pytest.raises(RoleError, match="does not combine with --keys"):
        socket_directory(private, tmp_path, False)
    with pytest.raises(RoleError, match="does not combine with --insecure"):
        socket_directory(private, None, True)
    private.chmod(0o750)
    with pytest.raises(RoleError, match="--ipc .*mode 0750 lets other users in"):
        socket_directory(private, None, False)


async def test_nodes_talk_over_their_sockets_and_a_trainer_waits_for_the_pservers() -> None:
    directory = make_socket_dir()
    server = ZmqTransport("pserver:0", ipc_dir=directory)
    client = ZmqTransport("trainer:0", ipc_dir=directory)
    try:
        with pytest.raises(PortsNotReady, match=r"127\.0\.0\.1:6170: no socket at .*127\.0\.0\.1-"
                                                r"6170 yet: nothing listens there"):
            await wait_for_ports("trainer:0", ["127.0.0.1:6170"], 0.2, ipc_dir=directory)
        bound = await server.bind("127.0.0.1:6170")
        assert bound == f"ipc://{directory}/127.0.0.1-6170"
        await wait_for_ports("trainer:0", ["127.0.0.1:6170"], 5.0, ipc_dir=directory)
        await client.connect("127.0.0.1:6170")
        payload = np.arange(1000, dtype=np.float32).tobytes()
        await client.send("127.0.0.1:6170", [b"hello", payload])
        peer, frames = await asyncio.wait_for(server.recv(), 10)
        assert peer == "trainer:0" and [bytes(f) for f in frames] == [b"hello", payload]
        await server.send(peer, [b"reply"])
        endpoint, reply = await asyncio.wait_for(client.recv(), 10)
        assert endpoint == "127.0.0.1:6170" and [bytes(f) for f in reply] == [b"reply"]
    finally:
        await client.close()
        await server.close()
        for leftover in directory.iterdir():
            leftover.unlink()
        directory.rmdir()


def test_auto_is_local_on_one_host_and_curvezmq_elsewhere() -> None:
    def cluster(*overrides: str) -> tuple[str, str]:
        spec = load_scenario(QUICKSTART, list(overrides)).cluster
        return spec.secured(spec.on_one_host()), spec.secured(False)

    assert cluster() == ("curve", "curve")  # the simulator's default: a host per node
    assert cluster("cluster.hosts=[{nodes: '*', cores: 2}]") == ("local", "curve")
    assert cluster("cluster.hosts=[{nodes: 'trainer:*', cores: 2}]") == ("curve", "curve")
    assert cluster("cluster.hosts=[{nodes: ['pserver:*', 'trainer:*'], cores: 2}]")[0] == "local"
    assert cluster("cluster.security=curve",
                   "cluster.hosts=[{nodes: '*', cores: 2}]") == ("curve", "curve")
    assert cluster("cluster.security=none") == ("none", "none")
    assert os.getuid() >= 0  # (the directory's owner check reads it)


def test_an_abandoned_socket_directory_goes_once_no_socket_in_it_listens() -> None:
    directory = make_socket_dir()
    live, dead = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    try:
        live.bind(str(socket_path(directory, "127.0.0.1:6170")))
        live.listen()
        dead.bind(str(socket_path(directory, "127.0.0.1:6171")))  # bound, never listening
        dead.close()
        # a node that still listens keeps its socket, and so the directory
        assert not release_socket_dir(directory, patience=0.0)
        assert sorted(p.name for p in directory.iterdir()) == ["127.0.0.1-6170"]
        live.close()
        assert release_socket_dir(directory) and not directory.exists()
        assert release_socket_dir(directory)  # the next node to look finds it gone
    finally:
        live.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_an_abandoned_socket_directory_with_other_files_is_left(tmp_path: Path) -> None:
    directory = make_socket_dir()
    try:
        (directory / "notes").write_text("not a socket")
        assert not release_socket_dir(directory, patience=0.0)
        assert (directory / "notes").exists()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
