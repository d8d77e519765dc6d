"""What a message weighs on a simulated network: `charged_size`.

Timing mode sends phantoms where numeric mode sends tensors. `charged_size` is what such a
message would weigh with data: exactly the bytes of its numeric twin (the same header but for
the vars' kind, and the frames the phantoms stand for), which is what a simulated network
charges. Both ways to it weigh a phantom's entry as the strict decode path reads it
(`_check_var`, then `_weight`): a header `encode` made knows its weight already
(`_Header.surcharge`, summed from `_surcharge` of each phantom's entry as it is encoded), and
frames that came any other way are weighed from their header (`_charged_size`). A message with
a phantom entry that `decode` refuses weighs its frames alone, either way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgpack

from runtime.network.transport import Frame
from runtime.network.wire.decoding import _check_var, _unpack_header
from runtime.network.wire.errors import DecodeError
from runtime.network.wire.format import VarKind, VarSpec, _nbytes
from runtime.network.wire.header import _Header, _encoded_header

_PHANTOM_KIND = msgpack.packb(str(VarKind.PHANTOM))
_TWIN_KIND_BYTES = {
    rows: len(msgpack.packb(str(VarKind.ROWS if rows else VarKind.DENSE))) - len(_PHANTOM_KIND)
    for rows in (False, True)
}
"""How much shorter the header gets when a phantom's kind becomes its twin's (dense or rows)."""


def charged_size(frames: Sequence[Frame]) -> int:
    """Bytes the message would take if its phantoms carried data: its frames, plus for each
    phantom var the frames it stands for, less the header bytes its kind "phantom" takes over
    its twin's "dense" or "rows". A message without phantoms, or one that does not decode,
    weighs its frames."""
    if len(frames) == 1:  # the header alone (most messages): `_encoded_header`, inline
        head = frames[0]
        origin = head.obj if type(head) is memoryview else head
        if type(origin) is _Header and _nbytes(head) == len(origin):
            return len(origin) + origin.surcharge
    encoded = _encoded_header(frames)
    if encoded is not None:
        return sum(_nbytes(frame) for frame in frames) + encoded.surcharge
    return _charged_size(frames)


def _charged_size(frames: Sequence[Frame]) -> int:
    """`charged_size` read off the frames alone."""
    size = sum(_nbytes(frame) for frame in frames)
    if not frames or _PHANTOM_KIND not in bytes(frames[0]):
        return size
    try:
        entries = _unpack_header(frames[0])["vars"]
        phantoms = [_check_var(entry) for entry in entries
                    if isinstance(entry, dict) and entry.get("kind") == VarKind.PHANTOM]
    except (DecodeError, KeyError, TypeError):
        return size
    return size + sum(map(_weight, phantoms))


def _weight(phantom: VarSpec) -> int:
    """The bytes a phantom var's data adds to its message's weight, less "phantom" over "dense"
    or "rows" in its entry."""
    return phantom.data_nbytes + _TWIN_KIND_BYTES[phantom.height is not None]


def _surcharge(entry: dict[str, Any]) -> int | None:
    """The `_weight` of the phantom var whose header entry `encode` writes as `entry`; None if
    `decode` refuses the entry (the strict path's own check of it: encode does not check the
    decoder's limits on shapes, heights and codec fields)."""
    try:
        return _weight(_check_var(entry))
    except DecodeError:
        return None
