"""DC-ASGD (async with delay compensation; Zheng et al., 2017).

Each trainer's gradient was computed at the parameters it last fetched, ``w_bak``; the program
compensates it as ``g + g*g*(w - w_bak)`` (see `transpiler.distribute.pserver`). The pserver's
part: it keeps, per trainer, the parameter values it served that trainer (`served`: the backups
``<param block>.trainer_{t}_bak``), and before applying a trainer's gradients it sets
``@TRAINER_ID@`` to that trainer, so the program picks its backup.
"""

from __future__ import annotations

from typing import ClassVar

from runtime.services.pserver_actions import Work
from runtime.services.pserver_async import AsyncPolicy


class DcAsgdPolicy(AsyncPolicy):
    name: ClassVar[str] = "dc_asgd"

    def apply(self, trainer: int, names: list[str]) -> Work:
        self.store.set_trainer(trainer)
        yield from super().apply(trainer, names)

    def served(self, trainer: int, values: dict[str, object]) -> None:
        self.store.keep_backups(trainer, values)
