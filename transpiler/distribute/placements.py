"""Where the parameters went, as the original's programs showed it to scripts.

`_parameters_on_pservers` (trainer and pserver programs) stays the list of placed vars the
runtime and `transpiler.show` read, one dict per var a pserver holds (`pserver.PlacedVar`);
`Placements` adds the original's 1.8 query on it, ``get_distributed_vars_by_ep(endpoint)``:
the vars that pserver holds, each with its origin, its slice and whether it is a slice of the
origin (`DistributedVar`), for every pserver of the job, whichever program it is read from.
`slice_vars_and_attrs` gives what the original's 1.2 ``_slice_vars_and_attrs`` of a pserver
program listed, ``[origin var, first row, param block]`` for each block of a cut parameter it
holds, as plain entries (`Program._slice_vars_and_attrs` turns them back into vars).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from ..ir import VarShape
from .plan import Plan
from .pserver import placed_vars


@dataclass(frozen=True)
class DistributedVar:
    """One var a pserver holds: the var it comes from, the piece the pserver holds, whether
    that piece is a slice of it, the block's index and first row, "Param" or "Optimizer"."""

    origin: VarShape
    slice: VarShape
    is_slice: bool
    block_id: int
    offset: int
    vtype: str
    endpoint: str


class Placements(list[dict[str, Any]]):
    """`_parameters_on_pservers`: a program's own placed vars, with the original's query over
    every pserver's (`get_distributed_vars_by_ep`)."""

    def __init__(self, own: Iterable[dict[str, Any]], job: Iterable[DistributedVar]) -> None:
        super().__init__(own)
        self.job = tuple(job)

    def get_distributed_vars_by_ep(self, endpoint: str) -> list[DistributedVar]:
        """The vars the pserver at `endpoint` holds, in its order."""
        return [v for v in self.job if v.endpoint == endpoint]


def distributed_vars(plan: Plan) -> list[DistributedVar]:
    """Every placed var of every pserver of `plan`."""
    origin = plan.origin.global_block()
    out = []
    for endpoint in plan.cluster.pservers:
        for pv in placed_vars(plan, endpoint):
            whole = tuple(origin.var(pv.origin).shape)
            out.append(DistributedVar(VarShape(pv.origin, whole), VarShape(pv.name, pv.shape),
                                      pv.shape != whole, pv.index, pv.row_offset, pv.kind,
                                      endpoint))
    return out


def placements(plan: Plan, endpoint: str | None) -> Placements:
    """`_parameters_on_pservers` of the pserver at `endpoint` (its own vars), or of a trainer
    (None: every pserver's)."""
    ends = plan.cluster.pservers if endpoint is None else [endpoint]
    own = [pv.to_dict() for ep in ends for pv in placed_vars(plan, ep)]
    return Placements(own, distributed_vars(plan))


def slice_vars_and_attrs(plan: Plan, endpoint: str) -> list[dict[str, Any]]:
    """The origin (name and shape), first row and block name of each param block of a cut
    parameter that the pserver at `endpoint` holds."""
    origin = plan.origin.global_block()
    return [{"origin": pv.origin, "shape": list(origin.var(pv.origin).shape),
             "offset": pv.row_offset, "block": pv.name}
            for pv in placed_vars(plan, endpoint) if pv.kind == "Param" and pv.name != pv.origin]
