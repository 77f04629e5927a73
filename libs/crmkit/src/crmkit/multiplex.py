"""What both ends of the multiplexed stream share (crm.mux.v1; docs/decisions.md, "Unary calls
over one stream"): the method's name and metadata as frame entries and back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from crm.mux.v1 import mux_pb2

EXCHANGE = "/crm.mux.v1.Multiplexer/Exchange"
SERVICE = "crm.mux.v1.Multiplexer"

CALL = mux_pb2.Frame.KIND_CALL
REPLY = mux_pb2.Frame.KIND_REPLY
CANCEL = mux_pb2.Frame.KIND_CANCEL
DRAIN = mux_pb2.Frame.KIND_DRAIN

Metadata = Sequence[tuple[str, str | bytes]]

# The server's initial metadata, sent as soon as a stream opens: the client writes frames only
# after it has seen this. A server without Exchange answers UNIMPLEMENTED with no headers; a
# frame written before that answer arrived would fail, and grpc.aio then reports the stream as
# INTERNAL ("Internal error from Core") in place of UNIMPLEMENTED, hiding the fallback.
SERVING = ("crm-mux", "1")


def add_entries(frame: mux_pb2.Frame, metadata: Iterable[tuple[str, str | bytes]]) -> None:
    """`metadata` into the frame's entries (made in place: an Entry passed in is copied)."""
    add = frame.metadata.add
    for key, value in metadata:
        add(key=key, value=value if isinstance(value, bytes) else value.encode())


def metadata_of(items: Iterable[mux_pb2.Entry]) -> tuple[tuple[str, str | bytes], ...]:
    """Entries as grpc metadata: bytes for "-bin" keys, str for the others."""
    return tuple(
        (item.key, item.value if item.key.endswith("-bin") else item.value.decode())
        for item in items
    )
