"""Half-async mode: at the pserver, async mode's rules.

What makes the mode half-asynchronous happens on the trainer (its sends are merged and its
barriers kept, see `transpiler.distribute.trainer`); the pserver applies each send as it comes.
"""

from __future__ import annotations

from typing import ClassVar

from runtime.services.pserver_async import AsyncPolicy


class HalfAsyncPolicy(AsyncPolicy):
    name: ClassVar[str] = "half_async"
