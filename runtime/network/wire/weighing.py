"""What a message weighs on a simulated network: `charged_size`.

Timing mode sends phantoms where numeric mode sends tensors. `charged_size` is what such a
message would weigh with data: exactly the bytes of its numeric twin (the same header but for
the vars' kind, and the frames the phantoms stand for), which is what a simulated network
charges. A header `encode` made knows its weight already (`_Header.surcharge`, summed from
`_surcharge` of each phantom as it is encoded); frames that came any other way are weighed
from their header (`_charged_size`), read by the strict decode path's own checks, so a phantom
that `decode` refuses adds nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgpack

from runtime.execution.tensor import Phantom
from runtime.network.compression import FLOAT_DTYPES, Packed
from runtime.network.transport import Frame
from runtime.network.wire.decoding import _check_var, _unpack_header
from runtime.network.wire.errors import DecodeError
from runtime.network.wire.format import MAX_DIM, MAX_NDIM, VarKind, _nbytes
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
    return size + sum(spec.data_nbytes + _TWIN_KIND_BYTES[spec.height is not None]
                      for spec in phantoms)


def _surcharge(phantom: Phantom | Packed) -> int | None:
    """The bytes `phantom`'s data adds to a message's weight, less "phantom" over "dense" or
    "rows" in its entry; None if `decode` would refuse its shape."""
    if not _decodable(phantom):
        return None
    rows = isinstance(phantom, Phantom) and phantom.height is not None
    return phantom.nbytes + _TWIN_KIND_BYTES[rows]


def _decodable(phantom: Phantom | Packed) -> bool:
    """Whether `decode` accepts the shape and height (codec) of this phantom (encode does not
    check these limits)."""
    if isinstance(phantom, Packed):
        return len(phantom.shape) <= MAX_NDIM and (not phantom.shape or max(phantom.shape)
                                                     <= MAX_DIM) and phantom.dtype in FLOAT_DTYPES
    shape, height = phantom.shape, phantom.height
    return len(shape) <= MAX_NDIM and (not shape or max(shape) <= MAX_DIM) \
        and (height is None or height <= MAX_DIM)
