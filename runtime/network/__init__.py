"""Moving messages between nodes: the Transport seam and its ZeroMQ implementation, the wire format
and request/reply RPC."""
