"""CurveZMQ for a job: its key files, and the admission of its clients by their keys (ZAP).

Every job has one CURVE keypair per node: a pserver's (one per endpoint) and a trainer's. The
key directory holds them as ZeroMQ certificate files (`zmq.auth.load_certificate` reads them):
``<node>.key`` the public key, ``<node>.key_secret`` the keypair, where ``<node>`` is the node's
file stem (``pserver-0``, ``trainer-3``). Secret files are written mode 0600 in a directory of
mode 0700, and a secret file that others may read is refused, as ssh refuses such a key. Each
file is written whole (`runtime.config.atomic`), a secret one mode 0600 from its creation, its
temporary file named ``.<stem>.<8 hex>.tmp.key_secret``: every file that holds a secret matches
``*.key_secret``, also one a killed ``runtime keys`` left. Hidden names are never key files:
`write_keys` and `export_keys` remove such leftovers from the directory they write, and no glob
here takes one for a key. A directory that cannot be written (a full disk) is a `KeyFileError`
naming the file.

A host is given only what its node needs: `export_keys` copies every public key and that
node's own secret file into a directory of its own, for one host, container or pod.

A node loads only what it needs (`load_keys`): its own keypair and the public keys of its peers:
a pserver those of every trainer of the job, each bound to the trainer's name; a trainer those
of the pservers, each bound to the endpoint it connects to. A missing or malformed file is a
`KeyFileError` that names it.

Admission: a serving socket is a CURVE server whose ZAP requests (RFC 27, on
``inproc://zeromq.zap.01`` of its context) `ZapHandler` answers from the event loop: a client
key of the job is admitted with the key's owner as its ZAP User-Id, which libzmq then attaches
to every message of that connection; any other key, or another mechanism, is refused before
a single message gets through. DESIGN: a handler of our own rather than `zmq.auth`'s
authenticator: that one runs a thread (or `zmq.asyncio`, which this runtime avoids) and
reports the key itself as the User-Id, while the transport wants the owner's name to compare
with the routing id the client chose.
"""

from __future__ import annotations

import asyncio
import logging
import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import zmq
import zmq.auth
import zmq.utils.z85

from runtime.config.atomic import stale_temporaries, write_atomic
from runtime.network.refusals import RefusalLog

log = logging.getLogger(__name__)

KEYS_VAR = "PSLAB_KEYS"
"""The environment variable naming a node's key directory when ``--keys`` does not."""
ZAP_ENDPOINT = "inproc://zeromq.zap.01"
ZAP_DOMAIN = "pslab"
RELAY = "relay"
"""The owner (ZAP User-Id) of a key that may send under any routing id: a pserver behind a
fault proxy admits its own public key so, for the proxy, which holds the pserver's keypair and
admits the trainers itself (`runtime.faults.curve_proxy`)."""
PUBLIC_SUFFIX = ".key"
SECRET_SUFFIX = ".key_secret"


class KeyFileError(ValueError):
    """A key file is missing, malformed or unsafe; the message names the file."""


@dataclass(frozen=True)
class CurveKeys:
    """What one node's transport needs for CURVE: its keypair, the client keys it admits when
    it serves (public key -> owner's node name) and the server key of each endpoint it
    connects to (endpoint -> public key)."""

    public: bytes
    secret: bytes = field(repr=False)
    clients: Mapping[bytes, str] = field(default_factory=dict)
    servers: Mapping[str, bytes] = field(default_factory=dict)


# -- key files ---------------------------------------------------------------------------------

def public_path(directory: Path, stem: str) -> Path:
    return directory / f"{stem}{PUBLIC_SUFFIX}"


def secret_path(directory: Path, stem: str) -> Path:
    return directory / f"{stem}{SECRET_SUFFIX}"


def _certificate(public: bytes, secret: bytes | None) -> str:
    kind = "Secret" if secret is not None else "Public"
    lines = [f"#   ZeroMQ CURVE **{kind}** Certificate (pslab)"]
    if secret is not None:
        lines.append("#   Keep it mode 0600; give it only to the node it names.")
    lines += ["", "metadata", "curve", f'    public-key = "{public.decode()}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode()}"')
    return "\n".join(lines) + "\n"


def write_keys(directory: Path, stems: list[str], force: bool = False) -> list[Path]:
    """Write a fresh keypair for each node file stem into `directory` (made mode 0700): the
    public ``<stem>.key`` (0644) and the secret ``<stem>.key_secret`` (0600, from the moment it
    exists: `write_atomic` creates it so); the paths. Keys already there are an error, before
    anything is written, unless `force`."""
    paths = [path for stem in stems
             for path in (public_path(directory, stem), secret_path(directory, stem))]
    if not force:
        for path in paths:
            if path.exists():
                raise KeyFileError(f"{path}: already exists (keys are not replaced without "
                                   "--force)")
    _private_directory(directory)
    for stem in stems:
        public, secret = zmq.curve_keypair()
        _write(public_path(directory, stem), _certificate(public, None), 0o644)
        _write(secret_path(directory, stem), _certificate(public, secret), 0o600)
    return paths


def export_keys(directory: Path, stem: str, out: Path) -> list[Path]:
    """Copy into `out` (made mode 0700) what the node with file stem `stem` needs and nothing
    more: every public key of `directory` and its own secret file, not another node's; the
    paths. What a node's host is given when the job's keys are made elsewhere."""
    secret = secret_path(directory, stem)
    read_keypair(secret)  # the node's own, present and safe
    _private_directory(out)
    others = [p.name for p in key_files(out, SECRET_SUFFIX) if p.name != secret.name]
    if others:
        raise KeyFileError(f"{out}: holds another node's secret key ({others[0]}); export "
                           f"{stem}'s keys into a directory of its own")
    written = []
    for public in key_files(directory, PUBLIC_SUFFIX):
        written.append(out / public.name)
        _write(written[-1], public.read_bytes(), 0o644)
    written.append(out / secret.name)
    _write(written[-1], secret.read_bytes(), 0o600)
    return written


def key_files(directory: Path, suffix: str) -> list[Path]:
    """The key files of `directory` whose names end in `suffix`: not the hidden temporary files
    of a write (`pathlib`'s glob takes hidden names too)."""
    return sorted(p for p in directory.glob(f"*{suffix}") if not p.name.startswith("."))


def _private_directory(directory: Path) -> None:
    """Make `directory` mode 0700, and remove the temporary files killed writes left in it."""
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(directory, 0o700)  # one that was there before
        for leftover in stale_temporaries(directory):
            leftover.unlink(missing_ok=True)
    except OSError as exc:
        raise KeyFileError(f"{directory}: cannot write keys there: {exc.strerror or exc}") \
            from None


def _write(path: Path, content: str | bytes, mode: int) -> None:
    """Write key file `path` whole; a full disk (any `OSError`) is a `KeyFileError` naming it."""
    try:
        write_atomic(path, content, mode=mode)
    except OSError as exc:
        raise KeyFileError(f"{path}: cannot write: {exc.strerror or exc}") from None


def _load(path: Path) -> tuple[bytes, bytes | None]:
    if not path.is_file():
        raise KeyFileError(f"{path}: no such key file (runtime keys DIR writes a job's keys)")
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (ValueError, OSError) as exc:
        raise KeyFileError(f"{path}: not a ZeroMQ CURVE certificate: {exc}") from None
    if public is None or len(public) != 40:
        raise KeyFileError(f"{path}: no 40-character Z85 public-key")
    return public, secret


def read_public(path: Path) -> bytes:
    """The public key in certificate file `path`."""
    return _load(path)[0]


def read_keypair(path: Path) -> tuple[bytes, bytes]:
    """The keypair in secret certificate file `path`, which only its owner may read."""
    mode = path.stat().st_mode if path.is_file() else 0
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(f"{path}: secret key readable by others (mode {mode & 0o777:04o}); "
                           "chmod 600 it")
    public, secret = _load(path)
    if secret is None or len(secret) != 40:
        raise KeyFileError(f"{path}: no 40-character Z85 secret-key")
    return public, secret


def load_keys(directory: Path, own: str, clients: Mapping[str, str] | None = None,
              servers: Mapping[str, str] | None = None) -> CurveKeys:
    """The `CurveKeys` of the node with file stem `own`: `clients` maps the file stems of the
    clients it admits to their node names, `servers` the file stems of the servers it connects
    to to their endpoints."""
    if not directory.is_dir():
        raise KeyFileError(f"{directory}: no such key directory")
    public, secret = read_keypair(secret_path(directory, own))
    admitted = {read_public(public_path(directory, stem)): name
                for stem, name in (clients or {}).items()}
    if len(admitted) != len(clients or {}):
        raise KeyFileError(f"{directory}: two clients share a public key")
    return CurveKeys(public, secret, admitted,
                     {endpoint: read_public(public_path(directory, stem))
                      for stem, endpoint in (servers or {}).items()})


# -- sockets -----------------------------------------------------------------------------------

def make_server(socket: zmq.Socket[Any], keys: CurveKeys) -> None:
    """Make `socket` a CURVE server whose clients ZAP must admit (before it binds)."""
    socket.setsockopt(zmq.ZAP_DOMAIN, ZAP_DOMAIN.encode())
    socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)  # no handler: refuse, never admit everyone
    socket.setsockopt(zmq.CURVE_SERVER, 1)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


def make_client(socket: zmq.Socket[Any], keys: CurveKeys, endpoint: str) -> None:
    """Make `socket` a CURVE client of the server at `endpoint` (before it connects)."""
    server = keys.servers.get(endpoint)
    if server is None:
        raise KeyFileError(f"no server key for endpoint {endpoint!r} among "
                           f"{sorted(keys.servers)}")
    socket.setsockopt(zmq.CURVE_SERVERKEY, server)
    socket.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    socket.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)


_POLLIN = int(zmq.POLLIN)
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)


class ZapHandler:
    """Answers a context's ZAP requests from the event loop: admits the keys in `clients`, each
    with its owner's name as the User-Id, and refuses (and counts) everything else."""

    def __init__(self, context: zmq.Context[Any], clients: Mapping[bytes, str], node: str) -> None:
        self.node = node
        self.clients = {zmq.utils.z85.decode(key): name for key, name in clients.items()}
        self.admitted = 0
        self.refused = 0
        self.refusals = RefusalLog(log, node)
        """Refused handshakes, logged so that a flood of them writes a line per address and
        window (`runtime.network.refusals`)."""
        self._socket = context.socket(zmq.REP)
        self._socket.setsockopt(zmq.LINGER, 0)
        try:
            self._socket.bind(ZAP_ENDPOINT)
        except zmq.ZMQError as exc:
            self._socket.close()
            raise RuntimeError(f"node {node!r}: cannot answer ZAP requests ({exc}); a context "
                               "serves one CURVE server") from exc
        self._fd = cast(int, self._socket.getsockopt(zmq.FD))
        self._loop: asyncio.AbstractEventLoop | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        loop.add_reader(self._fd, self._answer_waiting)
        loop.call_soon(self._answer_waiting)

    def answer(self, request: list[bytes]) -> list[bytes]:
        """The ZAP reply to `request`: version, request id, status code, text, User-Id, metadata."""
        if len(request) < 6 or request[0] != b"1.0":
            self.refused += 1
            return [b"1.0", request[1] if len(request) > 1 else b"", b"500",
                    b"malformed ZAP request", b"", b""]
        _, request_id, domain, address, _, mechanism, *credentials = request
        owner = (self.clients.get(credentials[0])
                 if mechanism == b"CURVE" and domain == ZAP_DOMAIN.encode()
                 and len(credentials) == 1 else None)
        if owner is None:
            self.refused += 1
            where = address.decode(errors="replace")
            self.refusals.refused(where, "key_not_admitted", f"refused a "
                                  f"{mechanism.decode(errors='replace')} connection from "
                                  f"{where}: not a key of this job")
            return [b"1.0", request_id, b"400", b"key not admitted", b"", b""]
        self.admitted += 1
        return [b"1.0", request_id, b"200", b"OK", owner.encode(), b""]

    def _answer_waiting(self) -> None:
        socket = self._socket
        if socket.closed:
            return
        while cast(int, socket.getsockopt(_EVENTS)) & _POLLIN:
            socket.send_multipart(self.answer(socket.recv_multipart(_NOBLOCK)), _NOBLOCK)

    def close(self) -> None:
        self.refusals.flush()
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(self._fd)
        self._socket.close(linger=0)
