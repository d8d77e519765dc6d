"""Paddle 2.x's ``paddle.distributed.transpiler`` (``DistributeTranspiler``,
``DistributeTranspilerConfig``) for a ported script (``import runtime.paddle as paddle``):
pslab's transpiler (`transpiler.distribute`). A config made here without ``paddle_version``
follows the 2.x programs ("2.x", docs/transpiler.md §9) unless ``PSLAB_PADDLE_VERSION`` says
otherwise, and so does a transpiler made here without a config; fluid's names
(`runtime.paddle.fluid`) keep 1.8's default.

Layers: a facade on top of `transpiler`.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType
from typing import Any

from transpiler.distribute import DistributeTranspiler as _Transpiler
from transpiler.distribute import DistributeTranspilerConfig as _Config
from transpiler.distribute import ServerRuntimeConfig
from transpiler.distribute.config import PADDLE_VERSION_ENV, PADDLE_VERSION_2X

__all__ = ["DistributeTranspiler", "DistributeTranspilerConfig", "ServerRuntimeConfig",
           "transpiler"]


class DistributeTranspilerConfig(_Config):
    """pslab's config whose `paddle_version` defaults to "2.x" (``PSLAB_PADDLE_VERSION``
    still wins when set)."""

    def __init__(self, **fields: Any) -> None:
        fields.setdefault("paddle_version", os.getenv(PADDLE_VERSION_ENV) or PADDLE_VERSION_2X)
        super().__init__(**fields)


class DistributeTranspiler(_Transpiler):
    """pslab's transpiler, given a 2.x `DistributeTranspilerConfig` when none is passed."""

    def __init__(self, config: _Config | None = None,
                 server_config: ServerRuntimeConfig | None = None) -> None:
        super().__init__(config if config is not None else DistributeTranspilerConfig(),
                         server_config)


transpiler = ModuleType(f"{__name__}.transpiler", "``paddle.distributed.transpiler``.")
transpiler.__dict__.update(DistributeTranspiler=DistributeTranspiler,
                           DistributeTranspilerConfig=DistributeTranspilerConfig,
                           ServerRuntimeConfig=ServerRuntimeConfig)
sys.modules[transpiler.__name__] = transpiler  # ``from paddle.distributed.transpiler import``
