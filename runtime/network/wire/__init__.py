"""The wire protocol: PS messages as lists of frames, with strict validation of what arrives.

A message is frame 0, a msgpack header

    {v, kind, id, src, step, vars: [{name, dtype, shape, kind, height?}, ...], ...extra}

followed by the tensors' raw bytes in `vars` order: one frame per dense tensor (a `LoDTensor`
is dense with a `lod` field), two per `SelectedRows` (the int64 row indices, then the values,
whose first dimension is the row count) and none per `Phantom` (shape and dtype only, with
the `height` or `lod` its real twin would carry). Bytes are little-endian and C-ordered. No
pickle: the header is plain msgpack data, and the tensors are bytes whose layout the header
states.

`encode` is zero-copy: tensor frames are memoryviews of the arrays' own buffers (C-contiguous
arrays are not copied), so the arrays must not change until the frames are sent. `decode` is
strict: anything the header or frames get wrong raises a `DecodeError` whose `reason` says what
and whose message names the var and field, checked before any array is built (sizes from the
header are checked against the limit first, so a lying header allocates nothing). Decoded arrays
are read-only views over the received frames (copied only when a frame is misaligned for its
dtype); copy one to change it. A server turns a `WireError` into an `error_reply`, which the
client turns back into a `RemoteError`.

A compressed gradient (`runtime.network.compression.Packed`) travels as a dense var whose entry
names its ``codec`` (and, for top-k, its ``nnz``): its frames are the codec's, and `decode`
unpacks them into the dense tensor of the entry's shape and dtype, so a receiver never sees the
packing.

Timing mode sends phantoms where numeric mode sends tensors. `charged_size` is what such a
message would weigh with data: exactly the bytes of its numeric twin (same header but for the
vars' kind, and the frames the phantoms stand for), which is what a simulated network charges.

The modules, each importing only those listed before it:

- `format`: the version, limits and kinds, `Message`, `VarSpec`, and the table of the header's
  fields (`HEADER_FIELDS`, `VAR_FIELDS`...) that encode writes and both decode paths read;
- `errors`: `WireError` and its reasons, `error_reply` and `raise_for_error`;
- `header`: the header frame `encode` makes, which remembers the message's weight and parse;
- `decoding`: `decode`, its fast path for plain messages and its strict path;
- `weighing`: `charged_size`, what a simulated network charges;
- `encoding`: `encode`.

This package re-exports their public names (and the few private ones tests reach for), so
``from runtime.network.wire import X`` names the same objects as the module that defines X.
"""

from __future__ import annotations

from runtime.execution.tensor import Phantom
from runtime.network.wire.decoding import (  # the private ones: tests compare the paths
    _decode, _decode_plain, _unpack_header, decode)
from runtime.network.wire.encoding import encode
from runtime.network.wire.errors import (DecodeError, EncodeError, RemoteError, WireError, clip,
                                         error_reply, raise_for_error)
from runtime.network.wire.format import (CODEC_FIELDS, CODECS, DEFAULT_MAX_HEADER_SIZE,
                                         DEFAULT_MAX_MESSAGE_SIZE, DTYPES, ENTRY_FIELDS,
                                         HEADER_FIELDS, ID_RANGE, KINDS, MAX_DETAIL, MAX_DIM,
                                         MAX_ECHO, MAX_FRAMES, MAX_NDIM, MAX_VAR, ROWS_DTYPE,
                                         STEP_RANGE, VAR_FIELDS, VAR_KINDS, WIRE_DTYPE_NAMES,
                                         WIRE_VERSION, Kind, Message, Reason, Tensor, VarFields,
                                         VarKind, VarSpec)
from runtime.network.wire.header import message_kind
from runtime.network.wire.weighing import charged_size

__all__ = [
    "CODEC_FIELDS", "CODECS", "DEFAULT_MAX_HEADER_SIZE", "DEFAULT_MAX_MESSAGE_SIZE", "DTYPES",
    "ENTRY_FIELDS", "HEADER_FIELDS", "ID_RANGE", "KINDS", "MAX_DETAIL", "MAX_DIM", "MAX_ECHO",
    "MAX_FRAMES", "MAX_NDIM", "MAX_VAR", "ROWS_DTYPE", "STEP_RANGE", "VAR_FIELDS", "VAR_KINDS",
    "WIRE_DTYPE_NAMES", "WIRE_VERSION", "DecodeError", "EncodeError", "Kind", "Message",
    "Phantom", "Reason", "RemoteError", "Tensor", "VarFields", "VarKind", "VarSpec",
    "WireError", "charged_size", "clip", "decode", "encode", "error_reply", "message_kind",
    "raise_for_error",
]
