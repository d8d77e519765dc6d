"""The header frame `encode` makes: msgpack bytes that remember what they mean.

A `_Header` is the header's bytes plus what the message weighs with data (`surcharge`, which
`charged_size` adds to its frames) and, for a message of phantoms and plain header data, the
message `decode` parses out of it (`_Parsed`, the third decode path beside the fast and the
strict one). The bytes cannot change, so both stay true; the simulator hands the very frames
(as memoryviews of them) to the receiver, which then parses nothing. `_encoded_header` tells
such a frame from one that arrived any other way, which is parsed as usual.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from runtime.execution.tensor import Phantom
from runtime.network.transport import Frame
from runtime.network.wire.format import Kind, Message, _nbytes


class _Header(bytes):
    """A header frame `encode` made: the msgpack bytes, which also remember what the message
    weighs with data (`surcharge`: what its phantoms add to its frames' bytes, as
    `charged_size` reads it off the frames) and, for a message of phantoms and plain header
    data, the message `decode` parses out of it (`parsed`). The bytes cannot change, so these
    stay true; the simulator hands the very frames (as memoryviews of them) to the receiver,
    which then needs to parse nothing. Frames that arrive any other way are parsed."""

    surcharge: int
    parsed: _Parsed | None
    kind: str


class _Parsed(NamedTuple):
    """What `decode` makes of a header of phantoms: the message's fields as msgpack gives
    them back (`extra` plain data; `nested` when it holds lists or maps, copied per decode)."""

    kind: Kind
    id: int
    src: str
    step: int
    vars: dict[str, Phantom]
    extra: Mapping[str, Any]
    nested: bool

    def message(self) -> Message:
        """A new `Message` of these fields (with new maps), as `decode` would build it."""
        return Message.of(self.kind, self.id, self.src, self.step, self.vars.copy(),
                          _fresh(self.extra) if self.nested else dict(self.extra))


def _fresh(value: Any) -> Any:
    """A copy of plain data whose lists and maps are new."""
    if type(value) is list:
        return [_fresh(item) for item in value]
    if type(value) is dict:
        return {key: _fresh(item) for key, item in value.items()}
    return value


def message_kind(frames: Sequence[Frame]) -> str | None:
    """The kind of a message `encode` made (as its header says), without decoding; None for
    frames that came any other way."""
    encoded = _encoded_header(frames)
    return None if encoded is None else encoded.kind


def _encoded_header(frames: Sequence[Frame]) -> _Header | None:
    """The header `encode` made that frame 0 is (or is a whole view of), if it is one."""
    if not frames:
        return None
    head = frames[0]
    origin = head.obj if type(head) is memoryview else head
    if type(origin) is _Header and _nbytes(head) == len(origin):
        return origin
    return None
