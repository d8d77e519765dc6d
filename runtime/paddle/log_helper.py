"""``fluid.log_helper``: `get_logger`, the logger a fluid script's reader module asks for
(``from paddle.fluid.log_helper import get_logger``, as Paddle's CTR reader does)."""

from __future__ import annotations

import logging


def get_logger(name: str, level: int, fmt: str | None = None) -> logging.Logger:
    """The logger `name` at `level`, writing to stderr in `fmt` (a `logging` format string)
    through one handler of its own, not passed on to the root logger's: calling it again for
    the same name adds no second handler."""
    logger = logging.getLogger(name)
    logger.setLevel(level)
    if not any(getattr(h, "_pslab_fluid", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler._pslab_fluid = True  # type: ignore[attr-defined]
        if fmt:
            handler.setFormatter(logging.Formatter(fmt=fmt))
        logger.addHandler(handler)
    logger.propagate = False
    return logger
