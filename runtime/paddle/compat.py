"""``paddle.compat`` for a ported script: fluid 1.x's text, rounding and exception helpers.

Paddle wrote them to run on Python 2 and 3 alike; on Python 3 they are: `to_text` and
`to_bytes` (decode or encode ``bytes``/``str``, and the items of a list or set, or the keys and
values of a dict; anything else comes back as it is), `round` (halves away from zero, as Python
2 rounded, not to even), `floor_division` (``//``) and `get_exception_message` (``str(exc)``).
"""

from __future__ import annotations

import math
from typing import Any


def _text(obj: Any, encoding: str) -> Any:
    return obj.decode(encoding) if isinstance(obj, bytes) else obj


def _bytes(obj: Any, encoding: str) -> Any:
    return obj.encode(encoding) if isinstance(obj, str) else obj


def _convert(obj: Any, one: Any, encoding: str, inplace: bool) -> Any:
    """`one` applied to `obj`, or to each item of a list or set and each key and value of a
    dict (changing the container itself with `inplace`)."""
    if isinstance(obj, list):
        items = [one(item, encoding) for item in obj]
        if inplace:
            obj[:] = items
            return obj
        return items
    if isinstance(obj, set):
        members = {one(item, encoding) for item in obj}
        if inplace:
            obj.clear()
            obj.update(members)
            return obj
        return members
    if isinstance(obj, dict):
        pairs = {one(k, encoding): one(v, encoding) for k, v in obj.items()}
        if inplace:
            obj.clear()
            obj.update(pairs)
            return obj
        return pairs
    return one(obj, encoding)


def to_text(obj: Any, encoding: str = "utf-8", inplace: bool = False) -> Any:
    """`obj` as text: ``bytes`` decoded with `encoding`, in a list, set or dict too (the
    container changed in place with `inplace`); None and anything else as they are."""
    return _convert(obj, _text, encoding, inplace)


def to_bytes(obj: Any, encoding: str = "utf-8", inplace: bool = False) -> Any:
    """`obj` as bytes: ``str`` encoded with `encoding`, in a list, set or dict too (the
    container changed in place with `inplace`); None and anything else as they are."""
    return _convert(obj, _bytes, encoding, inplace)


def round(x: float, d: int = 0) -> float:  # noqa: A001  (Paddle's name)
    """`x` rounded to `d` decimals with halves away from zero: ``round(2.5) == 3.0``,
    ``round(-2.5) == -3.0`` (Python 3's `round` gives 2 and -2); zero keeps its sign."""
    if x == 0:
        return math.copysign(0.0, x)
    scale = 10 ** d
    shifted = x * scale + math.copysign(0.5, x)
    return float(math.floor(shifted) if x > 0 else math.ceil(shifted)) / scale


def floor_division(x: Any, y: Any) -> Any:
    """``x // y``."""
    return x // y


def get_exception_message(exc: BaseException) -> str:
    """The exception's message, ``str(exc)``."""
    if exc is None:
        raise ValueError("get_exception_message: no exception")
    return str(exc)


__all__ = ["floor_division", "get_exception_message", "round", "to_bytes", "to_text"]
