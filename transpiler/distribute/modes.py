"""The distributed modes, one row each: every fact about a mode that more than one layer reads.

A scenario names a mode (``transpiler.mode``); the scenario schema checks the fields that go with
it, the transpiler turns it into `DistributeTranspilerConfig` fields, the fault validation asks
whether a trainer of that mode may crash, and the pserver picks the policy that serves it from
the name the transpiler wrote on `listen_and_serv` (``policy``). All of them read `MODES`, so a
mode is one row here, one policy file (`runtime.services.pserver_<policy>`) and its tests.

Per mode: whether the trainers talk to pservers or to each other (`ring`); whether
`DistributeTranspiler.transpile` runs it with ``sync_mode`` (`synchronous`); whether its trainers
send gradients that ``compression`` may pack (`compressible`); whether it recovers from a
trainer's crash (`trainer_crash`); whether its trainers fetch a distributed table's rows
from the pservers (`remote_prefetch`); the config fields it sets (`settings`); and its pserver
policy (`policy`; DC-ASGD, a variant of async, is `policy_of`'s business). `conflicts` is the one
place the cross-field rules between a mode and the fields that go with it are written.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from .config import DistributedMode

__all__ = ["COMPRESSED_MODES", "MODES", "MODE_NAMES", "Mode", "ModeName", "TRAINER_RING_MODES", "conflicts",
           "mode_of", "policy_of", "staleness_of"]

Setting = tuple[str, Any, str]
"""A config field, its value, and the scenario field it comes from (named in its errors)."""
Settings = Callable[[Mapping[str, Any]], list[Setting]]


def _sync(spec: Mapping[str, Any]) -> list[Setting]:
    return []


def _async(spec: Mapping[str, Any]) -> list[Setting]:
    return [("sync_mode", False, "mode"), ("runtime_split_send_recv", True, "mode"),
            ("enable_dc_asgd", spec.get("dc_asgd", False), "dc_asgd")]


def _ssp(spec: Mapping[str, Any]) -> list[Setting]:
    return _async(spec) + [("staleness", staleness_of(spec.get("staleness")), "staleness")]


def _half_async(spec: Mapping[str, Any]) -> list[Setting]:
    return [("sync_mode", False, "mode"), ("half_async", True, "mode")]


def _geo(spec: Mapping[str, Any]) -> list[Setting]:
    return [("sync_mode", False, "mode"), ("geo_sgd_mode", True, "mode"),
            ("geo_sgd_need_push_nums", spec.get("geo_push_every", 100), "geo_push_every")]


def _nccl2(spec: Mapping[str, Any]) -> list[Setting]:
    return [("mode", "nccl2", "mode"), ("nccl_comm_num", spec.get("nccl_comm_num", 1),
                                        "nccl_comm_num")]


def _collective(spec: Mapping[str, Any]) -> list[Setting]:
    return [("mode", "collective", "mode"),
            ("nccl_comm_num", spec.get("nccl_comm_num", 1), "nccl_comm_num"),
            ("collective_mode", spec.get("collective_mode", "grad_allreduce"), "collective_mode"),
            ("local_sgd_k_steps", spec.get("local_sgd_k_steps", 1), "local_sgd_k_steps")]


@dataclass(frozen=True)
class Mode:
    """One distributed mode's facts (see the module)."""

    name: str
    summary: str
    settings: Settings
    """The config fields the mode sets from the scenario's ``transpiler`` section."""
    synchronous: bool
    ring: bool = False
    compressible: bool = False
    trainer_crash: bool = False
    remote_prefetch: bool = False
    averaged: bool = False
    """Every step applies the mean of all trainers' gradients, so training equals local
    training on the whole batch (collective: with grad_allreduce, which its row cannot say)."""
    """Its trainers ask the pservers for a distributed table's rows (geo keeps the table on
    every trainer; the ring modes have no pservers)."""
    policy: str | None = None


ModeName = Literal["sync", "async", "ssp", "half_async", "geo", "nccl2", "collective"]
"""The modes' names, as the scenario schema types ``transpiler.mode`` (`MODES` has a row for
each, in this order: tests/meta/test_modes.py)."""

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("sync", "barriers each step", _sync, synchronous=True, compressible=True, averaged=True,
         trainer_crash=True, remote_prefetch=True,
         policy="sync"),
    Mode("async", "every gradient applied as it comes", _async, synchronous=False,
         compressible=True, trainer_crash=True, remote_prefetch=True,
         policy="async"),
    Mode("ssp", "async with bounded staleness", _ssp, synchronous=False, compressible=True,
         trainer_crash=True, remote_prefetch=True,
         policy="ssp"),
    Mode("half_async", "async, the transpiler cutting the gradients", _half_async,
         synchronous=False, compressible=True, trainer_crash=True, remote_prefetch=True,
         policy="half_async"),
    Mode("geo", "Geo-SGD: local steps, parameter deltas pushed every few", _geo,
         synchronous=False, policy="geo"),
    Mode("nccl2", "trainers all-reduce among themselves", _nccl2, synchronous=True,
         ring=True, averaged=True),
    Mode("collective", "trainers all-reduce or average among themselves", _collective,
         synchronous=True, ring=True),
)}
"""Every mode, in the order the docs list them."""

MODE_NAMES: tuple[str, ...] = get_args(ModeName)
TRAINER_RING_MODES = tuple(m.name for m in MODES.values() if m.ring)
"""Modes without pservers: the trainers talk to each other."""
COMPRESSED_MODES = tuple(m.name for m in MODES.values() if m.compressible)
"""Modes whose trainers send gradients to pservers, which `compression` may pack."""


def staleness_of(value: Any) -> int | float:
    """An ssp scenario's ``staleness``: an int >= 0, or ``inf`` (no bound)."""
    if value == "inf" or value == math.inf:
        return math.inf
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"transpiler.staleness: mode ssp needs an int >= 0 or inf, "
                         f"got {value!r}")
    return value


def conflicts(mode: str, dc_asgd: bool, staleness: object, compression: str
              ) -> list[tuple[str, tuple[str, ...]]]:
    """The cross-field rules `mode` breaks with the other fields: (message, the fields
    involved) for each. ``dc_asgd`` goes with async, ``staleness`` with ssp (and ssp needs
    it), ``compression`` with a mode that sends gradients to pservers."""
    out: list[tuple[str, tuple[str, ...]]] = []
    if dc_asgd and mode != "async":
        out.append((f"dc_asgd needs mode async, not {mode}", ("dc_asgd", "mode")))
    if (mode == "ssp") != (staleness is not None):
        out.append(("mode ssp needs staleness (an int >= 0, or inf), and staleness needs mode "
                    f"ssp; got mode {mode}, staleness {staleness}", ("staleness", "mode")))
    if compression != "none" and mode in MODES and not MODES[mode].compressible:
        out.append((f"compression.method {compression} needs mode "
                    f"{', '.join(COMPRESSED_MODES)}, not {mode}", ("compression.method", "mode")))
    return out


def mode_of(mode: DistributedMode) -> Mode:
    """The row of a program's resolved `mode` (its ``_distributed_mode``): ssp and DC-ASGD,
    async with more, read as async."""
    return MODES[mode.name.lower()]


def policy_of(mode: DistributedMode, dc_asgd: bool, staleness: object) -> str:
    """The pserver policy that serves a program of the resolved `mode` (`resolve_mode`):
    DC-ASGD's, SSP's where a staleness bound is set, else its mode's (``listen_and_serv``'s
    ``policy``)."""
    if dc_asgd:
        return "dc_asgd"
    return "ssp" if staleness is not None else mode.name.lower()
