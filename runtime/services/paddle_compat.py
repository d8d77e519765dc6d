"""Paddle's `fluid.Executor` over pslab's runtime: one executor for local, trainer and pserver
programs, so that a classic parameter-server script runs with only its imports changed
(`runtime.paddle.fluid` gathers the names such a script uses, this module's `FluidExecutor` as
``fluid.Executor``).

`FluidExecutor.run(program, feed, fetch_list)` looks at the program:

- a `listen_and_serv` op (a pserver program from ``t.get_pserver_program(endpoint)``): it serves
  at the op's endpoint with the runtime's `PserverService`, from the values the pserver's
  startup program left in the scope (the script runs ``exe.run(pserver_startup)`` first), and
  returns once every trainer has completed (or, on its own as it is, when its trainers are
  gone: `TrainersGone`); it drops a trainer silent for Paddle's ``FLAGS_rpc_deadline``
  (`rpc_deadline`);
- other RPC ops (a transpiled trainer program, or the trainer's startup program that
  `DistributeTranspiler.transpile` rewrote in place): it runs them as a trainer of the job. The
  first such run makes the trainer (`runtime.services.trainer.Trainer`, its `RpcOps` and an
  `RpcClient` over `ZmqTransport`) from the program: the pserver endpoints are the program's
  ``_endpoints`` (else the ``endpoints``/``epmap`` of its RPC ops), the trainer id the ops'
  ``trainer_id``. Unless the program says ``_wait_port`` False
  (``t.get_trainer_program(wait_port=False)``, which marks the trainer's startup program too)
  it waits until the pservers accept connections (`PortsNotReady`, naming them, after
  ``startup_timeout``; without the wait a request to a pserver not yet up is queued and
  resent), and `Trainer.start` runs that first program as the startup (parameters fetched from
  the pservers) and joins the job. A program with sends is one training step (send the
  gradients, barriers, receive the parameters) at the next step number; one with only receives
  (a startup run again) fetches the parameters as the last step left them;
- no RPC op: the kernels run it, as `runtime.execution.executor.Executor` does (local
  training, startup programs).

`FluidExecutor.close()` (Paddle's, which the script calls at the end) tells every pserver this
trainer is done (COMPLETE); an executor still open when the interpreter exits does it then.

One trainer per scope, as Paddle has one RPC client per process: a script may run the trainer's
startup with one executor and its steps with another (``fluid.ParallelExecutor``, which makes
its own), in the same scope; the executor that made the trainer runs every RPC program of that
scope, whichever executor was called.

Beyond the program, `run` takes what Paddle's does: a ``fluid.CompiledProgram`` (anything holding
its program as ``_program``: the program runs as it is, on the executor's one place), fed
`FluidLoDTensor`s (Paddle's ``fluid.core.LoDTensor``), and with ``return_numpy=False`` it returns
dense values and LoD tensors as `FluidLoDTensor`s (``np.array(t)``, ``t.lod()``).

Profiling (``fluid.profiler``): while `profile_kernels` holds a timer, every executor's runs
(local, and a trainer's steps) time each kernel with it
(`runtime.execution.executor.timed_binder`, through a second kernel executor made with the
timer); without one the kernels run unwrapped, as before.

DESIGN: the trainer's RPC client lives on an event loop of its own in a daemon thread, and
`run` waits for the coroutine it hands it. The client's sockets and the heartbeat go on between
calls, so a script that does other work between steps is not dropped from the fan-in for
silence, and `run` stays a plain blocking call as in Paddle. A step the pservers ask to redo
(a pserver that restarted from a checkpoint) cannot be redone here: the executor does not hold
the script's earlier batches, so `run` fails naming it (`runtime up` redoes such steps).

Security (SECURITY.md): with ``PSLAB_KEYS`` set to a job's key directory (``runtime keys DIR``)
every connection is CurveZMQ, a pserver admitting only the job's trainers. Without it the
executor runs unauthenticated and unencrypted, with the same warning as ``--insecure``, only
where every pserver endpoint is a loopback address or ``PSLAB_INSECURE=1`` says so; otherwise
it refuses, naming both variables.
"""

from __future__ import annotations

import asyncio
import atexit
import ipaddress
import logging
import os
import sys
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import (Any, Coroutine, Iterable, Mapping, Protocol, Sequence, TypeVar,
                    runtime_checkable)

import numpy as np

from transpiler.framework import default_main_program
from transpiler.ir import Op, Program, Var

from runtime.config.atomic import atomic_open
from runtime.config.nodes import pserver_name, trainer_name
from transpiler.opcatalog import runs_rpc
from runtime.execution.executor import Executor as KernelExecutor
from runtime.execution.executor import FeedValue, KernelTimer
from runtime.execution.scope import Scope, global_scope
from runtime.execution.tensor import (LoDTensor, TensorError, Value, copy_value, to_dense,
                                      validate_lod)
from runtime.network.curve import KEYS_VAR, CurveKeys
from runtime.network.ports import wait_for_ports
from runtime.network.rpc import RetryPolicy, RpcClient
from runtime.network.zmq_transport import ZmqLimits, ZmqTransport
from runtime.services.checkpoint import file_name
from runtime.services.node import node_keys
from runtime.services.pserver import PserverService, ServeConfig
from runtime.services.trainer import Rewind, Trainer, run_program

log = logging.getLogger(__name__)

INSECURE_VAR = "PSLAB_INSECURE"
"""Set to 1, the executor runs without CurveZMQ on endpoints that are not loopback too."""
STARTUP_TIMEOUT = 60.0
"""Seconds a trainer waits for the pservers' ports before its first RPC."""
_RECEIVES = frozenset({"recv", "fetch_barrier"})
"""The RPC ops of a trainer's startup program: a program with others is a training step."""
RPC_DEADLINE_VAR = "FLAGS_rpc_deadline"
"""Paddle's RPC deadline in milliseconds (default `RPC_DEADLINE_MS`): how long a pserver of a
script waits for a silent trainer (`rpc_deadline`)."""
RPC_DEADLINE_MS = 180_000
"""Paddle's default ``FLAGS_rpc_deadline``."""
T = TypeVar("T")


class SecurityRefused(RuntimeError):
    """No keys, and endpoints that are not loopback: the message names what to set."""


@dataclass(frozen=True)
class CPUPlace:
    """Kernels on the CPU (numpy)."""


@dataclass(frozen=True)
class CUDAPlace:
    """Kernels on GPU `device_id` (the torch backend, which needs the ``[torch]`` extra)."""

    device_id: int = 0


class FluidLoDTensor:
    """Paddle's ``fluid.core.LoDTensor``: an array and its LoD, Paddle's methods on them.
    `set(array, place)` stores a copy of the array (the place is not kept: values live on the
    host until a kernel reads them); `set_lod` takes offsets (``[[0, 2, 5]]``: two sequences of
    2 and 3 rows), `set_recursive_sequence_lengths` lengths (``[[2, 3]]``), each checked
    against the rows set (ValueError); ``np.array(t)`` is the array. The executor takes one as
    a feed and, with ``return_numpy=False``, returns fetched values as these."""

    def __init__(self, array: Any = None, lod: Sequence[Sequence[int]] = ()) -> None:
        self._array: np.ndarray | None = None if array is None else np.array(array, copy=True)
        self._lod: list[list[int]] = []
        if lod:
            self.set_lod(lod)

    def set(self, array: Any, place: CPUPlace | CUDAPlace | None = None) -> None:
        """Hold a copy of `array` (its LoD, if any, stays; `has_valid_recursive_sequence_lengths`
        says whether it still fits)."""
        self._array = np.array(array, copy=True)

    def shape(self) -> list[int]:
        """The array's shape ([] before `set`)."""
        return [] if self._array is None else list(self._array.shape)

    def _dtype(self) -> np.dtype:
        return self._held().dtype

    def set_lod(self, lod: Sequence[Sequence[int]]) -> None:
        self._lod = self._checked(lod)

    def lod(self) -> list[list[int]]:
        return [list(level) for level in self._lod]

    def set_recursive_sequence_lengths(self, lengths: Sequence[Sequence[int]]) -> None:
        self._lod = self._checked([np.concatenate([[0], np.cumsum(level, dtype=np.int64)]).tolist()
                                   for level in lengths])

    def recursive_sequence_lengths(self) -> list[list[int]]:
        return [[b - a for a, b in zip(level, level[1:])] for level in self._lod]

    def has_valid_recursive_sequence_lengths(self) -> bool:
        try:
            self._checked(self._lod)
        except ValueError:
            return False
        return True

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        array = self._held()
        if dtype is not None and np.dtype(dtype) != array.dtype:
            return array.astype(dtype)
        return array.copy() if copy else array

    def value(self) -> Value:
        """The runtime's value of it: a `LoDTensor` with a LoD, else the array (a copy)."""
        array = self._held().copy()
        return LoDTensor(array, self._lod) if self._lod else array

    @staticmethod
    def of(value: Any) -> Any:
        """A fetched value as Paddle returns it with ``return_numpy=False``: a dense array or a
        `LoDTensor` as a FluidLoDTensor (a copy), anything else (SelectedRows) as it is."""
        if isinstance(value, LoDTensor):
            return FluidLoDTensor(np.asarray(value.data), value.lod)
        if isinstance(value, np.ndarray):
            return FluidLoDTensor(value)
        return value

    def _held(self) -> np.ndarray:
        if self._array is None:
            raise ValueError("LoDTensor: no data; call set(array, place) first")
        return self._array

    def _checked(self, lod: Sequence[Sequence[int]]) -> list[list[int]]:
        levels = [[int(o) for o in level] for level in lod]
        if not levels:
            return []
        if self._array is not None and self._array.ndim:
            rows = self._array.shape[0]
        else:  # no rows yet: the LoD is checked against the rows it names
            rows = levels[-1][-1] if levels[-1] else 0
        try:
            return validate_lod(levels, rows)
        except TensorError as exc:
            raise ValueError(f"LoDTensor: invalid LoD {levels} for {rows} rows: {exc}") from None

    def __repr__(self) -> str:
        return f"LoDTensor(shape={self.shape()}, lod={self._lod})"


@runtime_checkable
class HoldsProgram(Protocol):
    """What `FluidExecutor.run` takes besides a `Program`: Paddle's ``CompiledProgram``, which
    holds the program it compiled as ``_program``."""

    _program: Program


def program_of(program: Program | HoldsProgram | None) -> Program:
    """The program to run: `program`, the one a compiled program holds, or the default main
    program."""
    if program is None:
        return default_main_program()
    if isinstance(program, Program):
        return program
    if isinstance(program, HoldsProgram):
        return program._program
    raise TypeError(f"Executor.run: program must be a Program or a CompiledProgram, got "
                    f"{type(program).__name__}")


_profiler: KernelTimer | None = None
"""The timer every executor's kernels report to while profiling (`profile_kernels`)."""


def profile_kernels(timer: KernelTimer | None) -> None:
    """From now on every `FluidExecutor`'s kernels report each call to `timer` (None: they run
    untimed again). ``fluid.profiler`` sets and clears it."""
    global _profiler
    _profiler = timer


def backend_of(place: CPUPlace | CUDAPlace | None) -> tuple[str, str]:
    """The kernel backend and device of a Paddle place."""
    if place is None or isinstance(place, CPUPlace):
        return "numpy", "cpu"
    if isinstance(place, CUDAPlace):
        return "torch", f"cuda:{place.device_id}"
    raise TypeError(f"place must be CPUPlace() or CUDAPlace(i), got {place!r}")


# -- which program -------------------------------------------------------------------------------

def rpc_ops(program: Program) -> list[Op]:
    """The RPC ops of every block of `program`, in order."""
    return [op for block in program.blocks for op in block.ops if runs_rpc(op)]


def listen_op(program: Program) -> Op | None:
    return next((op for op in program.global_block().ops if op.type == "listen_and_serv"), None)


def pserver_endpoints(program: Program, ops: Sequence[Op]) -> list[str]:
    """The job's pserver endpoints in the job's order: the program's ``_endpoints``, else the
    first barrier's ``endpoints`` (every pserver), else the ``epmap`` of the ops as they come."""
    listed = program.attrs.get("_endpoints")
    if listed:
        return list(listed)
    for op in ops:
        if op.attr("endpoints"):
            return list(op.attr("endpoints"))
    return list(dict.fromkeys(ep for op in ops for ep in op.attr("epmap") or ()))


def trainer_id_of(program: Program, ops: Sequence[Op]) -> int:
    ids = {int(op.attr("trainer_id")) for op in ops if op.attr("trainer_id") is not None}
    if "_trainer_id" in program.attrs:
        ids.add(int(program.attrs["_trainer_id"]))
    if len(ids) > 1:
        raise ValueError(f"program: its RPC ops name several trainers {sorted(ids)}")
    return ids.pop() if ids else 0


def is_step(ops: Iterable[Op]) -> bool:
    """Whether a trainer program with these RPC ops is a training step (it sends)."""
    return any(op.type not in _RECEIVES for op in ops)


# -- security --------------------------------------------------------------------------------

def rpc_deadline(env: Mapping[str, str]) -> float:
    """Seconds a script's pserver waits for a trainer it has not heard from before dropping it
    from the fan-in: Paddle's ``FLAGS_rpc_deadline`` (milliseconds; 180 s by default; Paddle's
    distributed-test harness sets 30 s). A trainer's event loop also runs its kernels: it
    heartbeats between two of them (`runtime.services.trainer.HOLD_LIMIT`) but not during
    one, so `runtime up`'s 10 s (``train.heartbeat_timeout``) would drop a trainer one of
    whose ops takes longer (a large convolution on a loaded host), where Paddle's pserver
    waits out its deadline."""
    text = env.get(RPC_DEADLINE_VAR, "").strip()
    if not text:
        return RPC_DEADLINE_MS / 1000
    try:
        ms = int(text)
    except ValueError:
        ms = 0
    if ms <= 0:
        raise ValueError(f"{RPC_DEADLINE_VAR}={text!r}: expected a positive number of "
                         "milliseconds")
    return ms / 1000


def _loopback(endpoint: str) -> bool:
    host = endpoint.rpartition(":")[0].strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def key_directory(who: str, endpoints: Sequence[str], env: Mapping[str, str]) -> Path | None:
    """The job's key directory from `KEYS_VAR`; None (after the insecure warning) where every
    endpoint is loopback or `INSECURE_VAR` is 1; `SecurityRefused` otherwise."""
    named = env.get(KEYS_VAR, "").strip()
    if named:
        return Path(named)
    if env.get(INSECURE_VAR, "").strip() == "1" or all(_loopback(ep) for ep in endpoints):
        print(f"warning: {who}: no {KEYS_VAR}: no CurveZMQ: whoever reaches "
              f"{','.join(endpoints)} can read and change the parameters and end the job; "
              "see SECURITY.md", file=sys.stderr, flush=True)
        return None
    raise SecurityRefused(
        f"{who}: no keys for endpoints {','.join(endpoints)}: set {KEYS_VAR}=DIR (a job's keys, "
        f"written by `runtime keys DIR`), or {INSECURE_VAR}=1 to run unauthenticated and "
        "unencrypted (see SECURITY.md)")


# -- the event loop ----------------------------------------------------------------------------

class LoopThread:
    """An asyncio loop running in a daemon thread; `call` runs a coroutine there and waits."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name=name, daemon=True)
        self._thread.start()

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result()
        except BaseException:
            future.cancel()  # interrupted (Ctrl-C): the coroutine must not go on alone
            raise

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


# -- the executor ------------------------------------------------------------------------------

class FluidExecutor:
    """Paddle's ``fluid.Executor(place)``: see the module for what `run` does with each kind of
    program."""

    def __init__(self, place: CPUPlace | CUDAPlace | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT) -> None:
        backend, device = backend_of(place)
        self.kernels = KernelExecutor(backend, device)
        self._timed: KernelExecutor | None = None
        """The kernels timed by the profiler's timer, made on the first run while profiling."""
        self.startup_timeout = startup_timeout
        self._loop: LoopThread | None = None
        self._trainer: Trainer | None = None
        self._next_step = 0
        self._startup: tuple[Scope, Program] | None = None
        """The last program without RPC ops run, and its scope (a pserver's startup)."""

    def run(self, program: Program | HoldsProgram | None = None,
            feed: Mapping[str, FeedValue] | None = None,
            fetch_list: Iterable[Var | str] | None = None, scope: Scope | None = None,
            return_numpy: bool = True, *, feed_var_name: str = "feed",
            fetch_var_name: str = "fetch", use_program_cache: bool = False) -> list[Any]:
        """Run `program` (default: the default main program; a compiled program runs the one
        it holds) once and return the fetched values (`FluidLoDTensor`s unless
        `return_numpy`); a pserver program serves until its trainers are done and returns [].

        `feed_var_name`, `fetch_var_name` and `use_program_cache` are Paddle's, taken by keyword
        (this signature keeps `scope` fourth) and change nothing: Paddle names the feed and
        fetch vars its executor adds to a copy of the program, and may cache that copy;
        pslab's executor feeds the scope and fetches from it directly, and always keeps what it
        prepared of a program (`runtime.execution.executor`)."""
        program = program_of(program)
        scope = global_scope() if scope is None else scope
        fetch = [item.name if isinstance(item, Var) else str(item) for item in fetch_list or ()]
        if feed:
            feed = {name: value.value() if isinstance(value, FluidLoDTensor) else value
                    for name, value in feed.items()}
        ops = rpc_ops(program)
        if not ops:
            values = self._kernels_now().run(program, feed, fetch, scope, return_numpy)
            self._startup = (scope, program)
            return values if return_numpy else [FluidLoDTensor.of(value) for value in values]
        if listen_op(program) is not None:
            self._serve(program, scope)
            return []
        owner = self._trainer_owner(scope)
        found = owner._call(owner._train(program, ops, scope, feed or {}, fetch))
        if return_numpy:
            return [np.array(to_dense(value), copy=True) for value in found]
        return [FluidLoDTensor.of(copy_value(value)) for value in found]

    def _kernels_now(self) -> KernelExecutor:
        """The kernels to run with: timed by the profiler's timer while one is set."""
        timer = _profiler
        if timer is None:
            return self.kernels
        if self._timed is None or self._timed.timer is not timer:
            self._timed = KernelExecutor(self.kernels.backend, self.kernels.device, timer)
        return self._timed

    def _trainer_owner(self, scope: Scope) -> FluidExecutor:
        """The executor whose trainer runs in `scope`: this one, or one that made a trainer
        there before (the script's startup executor, where this is a ParallelExecutor's)."""
        if self._trainer is None:
            other = _TRAINERS.get(id(scope))
            if other is not None and other._trainer is not None:
                return other
        return self

    def close(self) -> None:
        """Tell every pserver this trainer is done (COMPLETE) and stop the event loop. Runs at
        interpreter exit if the script does not call it; a second call does nothing."""
        atexit.unregister(self.close)
        loop, trainer, self._loop, self._trainer = self._loop, self._trainer, None, None
        if trainer is not None and _TRAINERS.get(id(trainer.scope)) is self:
            del _TRAINERS[id(trainer.scope)]
        if loop is None:
            return
        try:
            if trainer is not None:
                loop.call(_finish(trainer))
        finally:
            loop.stop()

    # -- trainer ---------------------------------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._loop is None:
            self._loop = LoopThread("pslab executor")
            atexit.register(self.close)
        return self._loop.call(coro)

    async def _train(self, program: Program, ops: list[Op], scope: Scope,
                     feed: Mapping[str, FeedValue], fetch: list[str]) -> list[Any]:
        trainer = self._trainer
        step = is_step(ops)
        if trainer is None:
            trainer = self._trainer = await self._make_trainer(program, ops, scope)
            _TRAINERS[id(scope)] = self
            # the startup runs as written: `Trainer` leaves out the initializers its main
            # program does not read, but the script's main program comes later and may read
            # any var the startup initializes (auc's counts, batch norm's moving averages)
            trainer.startup = Program() if step else program  # a step: no startup came first
            self._next_step = await trainer.start()
            if not step:  # this program was the startup `start` ran
                return [scope.get(name) for name in fetch]
        if scope is not trainer.scope:
            raise ValueError("Executor.run: a trainer's programs must all run in one scope (the "
                             "one its first RPC program ran in)")
        unknown = {ep for op in ops for ep in op.attr("epmap") or op.attr("endpoints") or ()}
        unknown -= set(trainer.endpoints)
        if unknown:
            raise ValueError(f"Executor.run: program names pservers {sorted(unknown)} outside "
                             f"this trainer's job {trainer.endpoints}")
        if step:
            trainer.main = program  # the chief's `finish` reads it
        trainer.rpc.step = trainer.rpc.charge.step = self._next_step - (0 if step else 1)
        try:
            found = await run_program(self._kernels_now(), program, scope, trainer.rpc, feed,
                                      fetch)
        except Rewind as rewind:
            raise RuntimeError(f"trainer {trainer.trainer_id}: {rewind}; the pservers ask for "
                               f"steps from {rewind.step} to be redone, which a script's "
                               "executor cannot do (it does not hold the earlier batches)") from None
        self._next_step += int(step)
        return found

    async def _make_trainer(self, program: Program, ops: list[Op], scope: Scope) -> Trainer:
        endpoints = pserver_endpoints(program, ops)
        trainer_id = trainer_id_of(program, ops)
        name = trainer_name(trainer_id)
        keys_dir = key_directory(name, endpoints, os.environ)
        keys = None if keys_dir is None else node_keys(keys_dir, "trainer", trainer_id, 0,
                                                       endpoints)
        client = RpcClient(ZmqTransport(name, curve=keys), RetryPolicy(),
                           labels={ep: pserver_name(j) for j, ep in enumerate(endpoints)})
        trainer = Trainer(trainer_id, program, program, client, endpoints, self.kernels)
        trainer.scope = scope
        # the program's wish (`get_trainer_program(wait_port=...)`, recorded on the trainer's
        # startup program too); a program that states none waits, as the original's default did
        if program.attrs.get("_wait_port", True):
            await wait_for_ports(name, endpoints, self.startup_timeout)
        return trainer

    # -- pserver ---------------------------------------------------------------------------------
    def _serve(self, program: Program, scope: Scope) -> None:
        listen = listen_op(program)
        assert listen is not None
        endpoint = str(listen.attr("endpoint"))
        if self._startup is None or self._startup[0] is not scope:
            raise RuntimeError(f"pserver {endpoint}: run its startup program first, in the same "
                               "scope: exe.run(t.get_startup_program(endpoint, pserver_program))")
        endpoints = list(program.attrs.get("_endpoints") or [endpoint])
        index = endpoints.index(endpoint) if endpoint in endpoints else int(listen.attr("pserver_id", 0))
        trainers = int(program.attrs.get("_trainers") or listen.attr("Fanin") or 1)
        name = pserver_name(index)
        keys_dir = key_directory(name, endpoints, os.environ)
        keys = None if keys_dir is None else node_keys(keys_dir, "pserver", index, trainers,
                                                       endpoints)
        config = ServeConfig(trainer_names=tuple(trainer_name(i) for i in range(trainers)),
                             give_up_without_trainers=True,
                             heartbeat_timeout=rpc_deadline(os.environ))
        self._call(_serve(program, self._startup[1], scope, name, endpoint, keys, config,
                          self.kernels))


_TRAINERS: dict[int, FluidExecutor] = {}
"""id(scope) -> the executor whose trainer runs in that scope (the trainer holds its scope, so
the id names that scope while the entry stands; `close` removes it)."""


async def _serve(program: Program, startup: Program, scope: Scope, name: str, endpoint: str,
                 keys: CurveKeys | None, config: ServeConfig, kernels: KernelExecutor) -> None:
    # linger: the acks of the last COMPLETE messages must leave before the transport closes
    transport = ZmqTransport(name, ZmqLimits(linger_ms=2000), curve=keys)
    service = PserverService(program, startup, transport, kernels, config, scope=scope)
    log.info("%s: serving %s for %d trainer(s)", name, endpoint, len(config.trainer_names or ()))
    try:
        stats = await service.serve(endpoint)
    finally:
        await transport.close()
    log.info("%s: done after %d steps, %d messages", name, stats.steps, stats.messages)


async def _finish(trainer: Trainer) -> None:
    try:
        await trainer.finish()
    finally:
        await trainer.stop()
        await trainer.client.close()


# -- feeding and saving ------------------------------------------------------------------------

class DataFeeder:
    """Paddle's ``fluid.DataFeeder(feed_list, place)``: `feed(minibatch)` turns a list of
    samples (a tuple per example, one field per var of `feed_list`) into a feed dict: an array
    with the var's dtype and shape for a dense var; for a var with LoD (``lod_level`` n), the
    field is a sequence per example (nested n deep) and the feed is the `FluidLoDTensor` of
    their rows one after another with its n levels of offsets, as fluid's feeder makes it
    (``[[1, 2], [3]]`` for ``lod_level=1`` ids of shape [1]: rows [[1], [2], [3]], LoD
    ``[[0, 2, 3]]``), which the executor feeds as the runtime's `LoDTensor`."""

    def __init__(self, feed_list: Sequence[Var | str], place: CPUPlace | CUDAPlace | None = None,
                 program: Program | None = None) -> None:
        block = (program or default_main_program()).global_block()
        self.vars = [block.var(v) if isinstance(v, str) else v for v in feed_list]

    def feed(self, minibatch: Sequence[Sequence[Any]]) -> dict[str, np.ndarray | FluidLoDTensor]:
        columns = list(zip(*minibatch)) if minibatch else [() for _ in self.vars]
        if len(columns) != len(self.vars):
            raise ValueError(f"DataFeeder: samples have {len(columns)} fields, the feed list "
                             f"{len(self.vars)} vars ({[v.name for v in self.vars]})")
        return {var.name: _sequences(var, column) if var.lod_level else _rows(var, column)
                for var, column in zip(self.vars, columns)}


def _rows(var: Var, items: Sequence[Any]) -> np.ndarray:
    """`items` as one array of `var`'s dtype and shape, the batch dim taking the rest."""
    return np.asarray(items, dtype=var.dtype).reshape([-1, *var.shape[1:]])


def _sequences(var: Var, column: Sequence[Any]) -> FluidLoDTensor:
    """A column of nested sequences (`var.lod_level` deep) as their rows and LoD: the lengths
    of each level, flattened level by level (fluid's feeder)."""
    lengths: list[list[int]] = []
    items: list[Any] = list(column)
    for level in range(var.lod_level):
        try:
            lengths.append([len(item) for item in items])
        except TypeError:
            raise ValueError(f"DataFeeder: var {var.name!r} has lod_level {var.lod_level}; "
                             f"each example must be sequences {var.lod_level} deep") from None
        items = [element for item in items for element in item]
    tensor = FluidLoDTensor(_rows(var, items))
    tensor.set_recursive_sequence_lengths(lengths)
    return tensor


def save_vars(scope: Scope, dirname: str | Path, names: Iterable[str]) -> None:
    """Each var's value as ``dirname/<name>.npy`` (not Paddle's binary format), atomically."""
    for name in names:
        with atomic_open(Path(dirname) / file_name(name), binary=True) as f:
            np.save(f, np.asarray(scope.get(name)))


def save_params(executor: FluidExecutor, dirname: str | Path, main_program: Program | None = None,
                scope: Scope | None = None) -> None:
    """Paddle's ``fluid.io.save_params``: every parameter of the program, from the scope, as
    ``dirname/<name>.npy``."""
    program = main_program or default_main_program()
    save_vars(scope or global_scope(), dirname, [v.name for v in program.all_parameters()])


def save_persistables(executor: FluidExecutor, dirname: str | Path,
                      main_program: Program | None = None, scope: Scope | None = None) -> None:
    """Paddle's ``fluid.io.save_persistables``: every persistable var of the program's global
    block that the scope holds, as ``dirname/<name>.npy``."""
    program = main_program or default_main_program()
    held = scope or global_scope()
    save_vars(held, dirname, [n for n, v in program.global_block().vars.items()
                              if v.persistable and held.has(n)])


__all__ = ["CPUPlace", "CUDAPlace", "DataFeeder", "FluidExecutor", "FluidLoDTensor",
           "HoldsProgram", "INSECURE_VAR", "SecurityRefused", "profile_kernels", "program_of",
           "save_params", "save_persistables"]
