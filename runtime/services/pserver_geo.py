"""Geo-SGD mode: trainers train locally and now and then send parameter deltas.

At the pserver a delta is applied as it comes, like an async gradient: its block adds it to the
parameter block (``sum(p, p.delta) -> p``; see `transpiler.distribute.geo`). There is no LR
block, so only the delta's block runs.
"""

from __future__ import annotations

from typing import ClassVar

from runtime.services.pserver_async import AsyncPolicy


class GeoPolicy(AsyncPolicy):
    name: ClassVar[str] = "geo"
