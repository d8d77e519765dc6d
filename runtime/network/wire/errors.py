"""How the protocol fails, and how a failure travels back to the peer that caused it.

A `WireError` says why (`Reason`) and names the culprit var: a `DecodeError` for what a peer
sent (it broke the protocol), an `EncodeError` for what the local caller asked to send. A server
answers a request it cannot take with `error_reply`, an ERROR message carrying the reason,
detail and var; the client's `raise_for_error` turns that back into a `RemoteError`. Whatever an
error echoes of received data is `clip`ped, so a hostile peer cannot make error text (or a log
line) large.
"""

from __future__ import annotations

from runtime.network.wire.format import (ID_RANGE, MAX_DETAIL, MAX_VAR, STEP_RANGE, Kind,
                                         Message, Reason, _is_int)


class WireError(Exception):
    """A message that breaks the wire protocol; `reason` says how, `var` names the culprit var."""

    def __init__(
        self, reason: Reason, detail: str, *, var: str | None = None, msg_id: int | None = None
    ) -> None:
        detail, var = clip(detail, MAX_DETAIL), None if var is None else clip(var, MAX_VAR)
        where = f" (var {var!r})" if var is not None else ""
        super().__init__(f"{reason}: {detail}{where}")
        self.reason = reason
        self.detail = detail
        self.var = var
        self.msg_id = msg_id


class DecodeError(WireError):
    """A received message is malformed: the peer broke the protocol."""


class EncodeError(WireError):
    """A message cannot be encoded: the local caller passed something the wire cannot carry."""


class RemoteError(Exception):
    """A peer answered a request with an error reply."""

    def __init__(self, peer: str, reason: str, detail: str, var: str | None) -> None:
        peer, reason, detail = clip(peer, MAX_VAR), clip(reason, MAX_VAR), clip(detail, MAX_DETAIL)
        var = None if var is None else clip(var, MAX_VAR)
        where = f" (var {var!r})" if var is not None else ""
        super().__init__(f"{peer} replied error {reason}: {detail}{where}")
        self.peer = peer
        self.reason = reason
        self.detail = detail
        self.var = var


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters, saying how much was cut: what an error or a log line
    echoes of received data stays small however large the data."""
    if len(text) <= limit:
        return text
    cut = f"...[{len(text) - limit} more chars]"
    return text[: max(0, limit - len(cut))] + cut


def error_reply(
    src: str, error: Exception, *, request_id: int | None = None, step: int = 0
) -> Message:
    """An ERROR message from `src` answering request `request_id` with what `error` says.

    The reason is the error's `reason` (a `WireError`'s, or a refusal's that names one) or else
    the exception's class name; the culprit var is
    the error's `var` attribute where it has one. The id defaults to the one the malformed
    request carried, or 0 when even that was unreadable.
    """
    if request_id is None:
        carried = error.msg_id if isinstance(error, WireError) else None
        request_id = carried if carried is not None else 0
    if not _is_int(request_id) or not ID_RANGE[0] <= request_id <= ID_RANGE[1]:
        request_id = 0  # an id the reply could not carry (the request's was readable but bad)
    if not _is_int(step) or not STEP_RANGE[0] <= step <= STEP_RANGE[1]:
        step = 0
    named = getattr(error, "reason", None)
    reason = str(named) if isinstance(named, str) and named else type(error).__name__
    detail = error.detail if isinstance(error, WireError) else str(error)
    culprit = getattr(error, "var", None)
    var = clip(culprit, MAX_VAR) if isinstance(culprit, str) else None
    body = {"reason": reason, "detail": clip(detail, MAX_DETAIL), "var": var}
    return Message(Kind.ERROR, request_id, src, step, extra={"error": body})


def raise_for_error(msg: Message) -> Message:
    """Return `msg`, or raise `RemoteError` if it is an error reply."""
    if msg.kind is not Kind.ERROR:
        return msg
    body = msg.extra.get("error")
    body = body if isinstance(body, dict) else {}
    reason, detail, var = body.get("reason"), body.get("detail"), body.get("var")
    raise RemoteError(
        msg.src,
        reason if isinstance(reason, str) else "unknown",
        detail if isinstance(detail, str) else repr(body),
        var if isinstance(var, str) else None,
    )
