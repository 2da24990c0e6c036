"""Reading protobuf's wire format: the fields of one encoded message, without protobuf.

The agent reads one message type on every refresh (the kubelet's ListPodResourcesResponse:
strings and nested messages); the protobuf runtime and the generated module cost it 1.7 MiB
of RSS for that. The wire format (protobuf.dev/programming-guides/encoding) is a sequence of
(tag varint = field number << 3 | wire type, value): varint (0), 64-bit (1), length-delimited
(2: strings, bytes, nested messages, packed repeated scalars), 32-bit (5). Unknown fields are
skipped, as protobuf does, so newer kubelets' additions (memory, dynamic resources) pass.
"""

from __future__ import annotations

from collections.abc import Iterator

VARINT, I64, LEN, I32 = 0, 1, 2, 5
FIXED_BYTES = {I64: 8, I32: 4}


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    """The varint at `pos` and the position after it."""
    value = shift = 0
    while True:
        if pos >= len(data):
            raise WireError("a varint runs past the end of the message")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise WireError("a varint is longer than 10 bytes")


def fields(data: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) of each field of the message `data`, in order: an int
    for varints and fixed-width values, bytes for length-delimited ones.

    Raises WireError on a truncated message, a field number 0 or a wire type that proto3 does
    not write (the deprecated groups, 3 and 4, or 6 and 7).
    """
    pos = 0
    while pos < len(data):
        tag, pos = _varint(data, pos)
        number, wire_type = tag >> 3, tag & 7
        if number == 0:
            raise WireError("a field has number 0")
        if wire_type == VARINT:
            value, pos = _varint(data, pos)
            yield number, wire_type, value
        elif wire_type == LEN:
            length, pos = _varint(data, pos)
            if pos + length > len(data):
                raise WireError(f"field {number} runs past the end of the message")
            yield number, wire_type, data[pos : pos + length]
            pos += length
        elif wire_type in FIXED_BYTES:
            end = pos + FIXED_BYTES[wire_type]
            if end > len(data):
                raise WireError(f"field {number} runs past the end of the message")
            yield number, wire_type, int.from_bytes(data[pos:end], "little")
            pos = end
        else:
            raise WireError(f"field {number} has wire type {wire_type}")


def strings_and_messages(data: bytes) -> Iterator[tuple[int, bytes]]:
    """(field number, bytes) of each length-delimited field of `data` (the strings and nested
    messages), other fields skipped. Raises WireError as `fields` does."""
    for number, wire_type, value in fields(data):
        if wire_type == LEN:
            assert isinstance(value, bytes)
            yield number, value


def text(value: bytes) -> str:
    """A string field's value. Raises WireError when it is not UTF-8 (protobuf's check)."""
    try:
        return value.decode()
    except UnicodeDecodeError as err:
        raise WireError(f"a string is not UTF-8 ({err.reason})") from err
