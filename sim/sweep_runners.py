"""Runners of a sweep's points (`sim.sweep.Runner`) beyond the sequential one: worker
processes on this machine (`in_processes`, ``sim sweep --jobs N``) and tasks on a Ray cluster
(`on_ray`, ``sim sweep --ray ADDRESS``).

Each yields (index, result) as points finish, in whatever order; `sim.sweep.run_sweep` puts
them back in plan order, so the record, and sweep.json, are those of a sequential sweep. A
worker gets the `SweepSpec` (the scenario's text, not its path) and a point's settings, and
runs `sim.sweep.run_point`, as the sequential runner does.

A failure of the machinery, not of a point (a worker process killed, Ray unreachable), is a
`RunnerError`: the sweep stops, and the points already finished are in its journal for
``--resume``. A point's own failure is recorded in its result, as in a sequential sweep.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.forkserver
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from concurrent.futures import BrokenExecutor, Future, ProcessPoolExecutor, as_completed
from multiprocessing.connection import wait
from typing import Any

from .sweep import Runner, Settings, SweepPoint, SweepSpec, run_point

__all__ = ["RAY_MISSING", "RunnerError", "in_processes", "on_ray"]

RAY_MISSING = "--ray needs Ray, which is not installed: pip install 'pslab[ray]'"

Todo = Sequence[tuple[int, Settings]]


class RunnerError(RuntimeError):
    """The runner itself failed (a worker died, the cluster went away); no point's fault."""


# -- worker processes -----------------------------------------------------------------------------

def in_processes(jobs: int) -> Runner:
    """A runner of `jobs` worker processes (at most one per point to run).

    DESIGN: the workers come from a forkserver that has imported the simulator already
    (``set_forkserver_preload``): each worker is a fork of it, ready at once, where a spawned
    one would import numpy and the runtime again (about 1 s each), and a plain fork of this
    process could inherit threads (a ZeroMQ context's, a progress bar's) in the middle of
    holding a lock."""
    def run(spec: SweepSpec, todo: Todo) -> Iterator[tuple[int, SweepPoint]]:
        if not todo:
            return
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(["sim.sweep"])
        try:
            with ProcessPoolExecutor(min(jobs, len(todo)), mp_context=context,
                                     initializer=_worker_started) as pool:
                futures = {pool.submit(_run_in_worker, spec, settings): index
                           for index, settings in todo}
                try:
                    yield from _as_finished(futures)
                finally:
                    for future in futures:
                        future.cancel()
        finally:
            _stop_forkserver()
    return run


def _stop_forkserver() -> None:
    """Stop this process's forkserver once the workers are gone, so that a sweep run as a
    library call (a notebook) does not keep a process of the simulator's loaded behind it;
    the next sweep starts one again (about a second). multiprocessing's resource tracker, which
    other libraries in the process may share, is left to it.

    DESIGN: multiprocessing has no public way to stop the forkserver; `ForkServer._stop`
    (CPython 3.8 to 3.13, what CPython's own tests call) does, and where it is missing the
    forkserver simply lives until this process exits, as it always would."""
    stop = getattr(multiprocessing.forkserver._forkserver, "_stop", None)  # type: ignore[attr-defined]
    if stop is not None:
        stop()


def _as_finished(futures: dict[Future[SweepPoint], int]) -> Iterator[tuple[int, SweepPoint]]:
    try:
        for future in as_completed(futures):
            yield futures[future], future.result()
    except BrokenExecutor as err:
        raise RunnerError(f"a worker process died ({err})") from None


def _worker_started() -> None:
    """In each worker: ignore Ctrl-C while idle (`_run_in_worker` takes it while a point
    runs), and exit when the sweep's process is gone.

    DESIGN: a terminal's Ctrl-C reaches every process of the foreground group. A busy worker
    stops its point (the `KeyboardInterrupt` goes back to the sweep as the point's outcome,
    which stops it too); an idle one would die with a traceback while waiting for work. A
    worker whose sweep was killed outright (SIGKILL, no cleanup) would wait for work for ever;
    the thread below sees its parent's sentinel close and ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    parent = multiprocessing.parent_process()
    if parent is not None:
        threading.Thread(target=_exit_with, args=(parent.sentinel,), daemon=True).start()


def _exit_with(sentinel: int) -> None:
    wait([sentinel])
    os._exit(1)


def _run_in_worker(spec: SweepSpec, settings: Settings) -> SweepPoint:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return run_point(spec, settings)
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


# -- Ray ------------------------------------------------------------------------------------------

def ray_module() -> Any:
    """The `ray` module; `RunnerError` saying how to install it if it is missing."""
    try:
        import ray
    except ImportError:
        raise RunnerError(RAY_MISSING) from None
    return ray


def on_ray(address: str) -> Runner:
    """A runner of Ray tasks, one per point, on the cluster at `address`: ``auto`` (the
    cluster this machine belongs to), ``local`` (a new instance on this machine, shut down
    after), ``ray://host:port`` (Ray Client) or ``host:port`` (a cluster's GCS), as
    `ray.init` takes them. Every node needs pslab installed and whatever files the scenario
    names (a profile) at the same path; the scenario itself travels with each task. A Ray
    already initialized in this process (a caller's own `ray.init`) is used as it is."""
    ray = ray_module()

    def run(spec: SweepSpec, todo: Todo) -> Iterator[tuple[int, SweepPoint]]:
        if not todo:
            return
        started = not ray.is_initialized()
        if started:
            _connect(ray, address)
        try:
            yield from _ray_tasks(ray, spec, todo)
        finally:
            if started:
                ray.shutdown()
    return run


def _connect(ray: Any, address: str) -> None:
    import logging

    try:
        ray.init(address=address, include_dashboard=False, logging_level=logging.WARNING)
    except (ConnectionError, RuntimeError, ValueError) as err:
        if address == "auto" and isinstance(err, ConnectionError):
            raise RunnerError("--ray auto: no Ray cluster is running here; `ray start --head` "
                              "starts one, or --ray local starts one for this sweep alone"
                              ) from None
        raise RunnerError(f"--ray {address}: {str(err).splitlines()[0]}") from None


def _ray_tasks(ray: Any, spec: SweepSpec, todo: Todo) -> Iterator[tuple[int, SweepPoint]]:
    task = ray.remote(num_cpus=1)(run_point)
    spec_ref = ray.put(spec)
    pending = {task.remote(spec_ref, settings): index for index, settings in todo}
    try:
        while pending:
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                yield pending.pop(ref), _ray_result(ray, ref)
    finally:
        for ref in pending:
            ray.cancel(ref, force=True)


def _ray_result(ray: Any, ref: Any) -> SweepPoint:
    try:
        point: SweepPoint = ray.get(ref)
    except ray.exceptions.RayError as err:
        raise RunnerError(f"a Ray task failed: {str(err).splitlines()[0]}") from None
    return point
