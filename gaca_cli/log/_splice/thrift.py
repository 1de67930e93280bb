"""The Thrift compact protocol, the encoding of Parquet's footer and page headers.

A decoded struct keeps every field in wire order, unknown ones included, so that
`encode_struct(decode_struct(b)) == b` for what Parquet writers produce (tested on pyarrow's,
polars' and duckdb's footers): the splice edits a few fields of a footer and writes the rest
back unchanged.

Wire format (apache/thrift, doc/specs/thrift-compact-protocol.md): a struct is a list of
fields, each a header byte (id delta in the high nibble, 1-15, else 0 and a zigzag varint id;
the compact type in the low nibble; a bool field carries its value in the type) and a value,
ended by a STOP byte; integers are zigzag LEB128 varints; binary is a varint length and the
bytes; a list is a header (size in the high nibble, 15 = a varint size follows; element type in
the low nibble) and its elements.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# Thrift compact-protocol type codes (a bool field carries its value in the type: 1 true, 2 false).
CT_STOP, CT_TRUE, CT_FALSE, CT_BYTE, CT_I16, CT_I32, CT_I64, CT_DOUBLE = range(8)
CT_BINARY, CT_LIST, CT_SET, CT_MAP, CT_STRUCT = range(8, 13)
_INT_TYPES = (CT_I16, CT_I32, CT_I64)

# what a truncated or malformed struct raises while it is decoded
DECODE_ERRORS = (IndexError, ValueError, TypeError, AttributeError, RecursionError, struct.error)


@dataclass
class TList:
    """A Thrift list or set: the compact type of its elements and the decoded elements."""

    elem_type: int
    items: list


@dataclass
class TMap:
    """A Thrift map: key and value compact types and the decoded (key, value) pairs."""

    key_type: int
    value_type: int
    items: list


@dataclass
class Struct:
    """A decoded Thrift struct: [field id, compact type, value] triples in wire order.

    Bool fields are stored with type CT_TRUE and a Python bool; unknown fields survive unchanged.
    """

    fields: list = field(default_factory=list)

    def get(self, fid: int, default=None):
        """The value of field `fid`, or `default` when absent."""
        return next((v for f, _, v in self.fields if f == fid), default)

    def set(self, fid: int, ctype: int, value) -> None:
        """Replace field `fid`, or insert it before the first field with a larger id."""
        for entry in self.fields:
            if entry[0] == fid:
                entry[1:] = [ctype, value]
                return
        at = next((i for i, entry in enumerate(self.fields) if entry[0] > fid), len(self.fields))
        self.fields.insert(at, [fid, ctype, value])

    def pop(self, fid: int) -> None:
        """Remove field `fid` if present."""
        self.fields = [entry for entry in self.fields if entry[0] != fid]


def zigzag(n: int) -> int:
    """Signed -> unsigned zigzag mapping (0, -1, 1, -2, ... -> 0, 1, 2, 3, ...)."""
    return n << 1 if n >= 0 else ((-n) << 1) - 1


def unzigzag(z: int) -> int:
    """Inverse of `zigzag`."""
    return (z >> 1) ^ -(z & 1)


class ThriftDecoder:
    """Reads Thrift compact-protocol values from `data`, starting at `pos`."""

    def __init__(self, data: bytes | memoryview, pos: int = 0):
        self.data, self.pos = data, pos

    def read_byte(self) -> int:
        """One unsigned byte."""
        self.pos += 1
        return self.data[self.pos - 1]

    def read_varint(self) -> int:
        """An unsigned LEB128 varint (7 bits a byte, low bits first)."""
        result = shift = 0
        while True:
            b = self.read_byte()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    def read_struct(self) -> Struct:
        """Fields up to STOP; a header holds the id delta (1-15, else 0 and a zigzag i16 id)."""
        fields, last = [], 0
        while (header := self.read_byte()) != CT_STOP:
            ctype, delta = header & 0x0F, header >> 4
            fid = last + delta if delta else unzigzag(self.read_varint())
            if ctype in (CT_TRUE, CT_FALSE):
                fields.append([fid, CT_TRUE, ctype == CT_TRUE])
            else:
                fields.append([fid, ctype, self.read_value(ctype)])
            last = fid
        return Struct(fields)

    def read_value(self, ctype: int):
        """One value of compact type `ctype`."""
        if ctype in (CT_TRUE, CT_FALSE):  # a bool inside a list, set or map: one byte
            return self.read_byte() == CT_TRUE
        if ctype == CT_BYTE:
            b = self.read_byte()
            return b - 256 if b >= 128 else b
        if ctype in _INT_TYPES:
            return unzigzag(self.read_varint())
        if ctype == CT_DOUBLE:
            self.pos += 8
            return struct.unpack_from("<d", self.data, self.pos - 8)[0]
        if ctype == CT_BINARY:
            n = self.read_varint()
            self.pos += n
            if self.pos > len(self.data):
                raise IndexError("binary runs past the end")
            return bytes(self.data[self.pos - n : self.pos])
        if ctype in (CT_LIST, CT_SET):
            header = self.read_byte()
            size = header >> 4 if header >> 4 != 15 else self.read_varint()
            return TList(header & 0x0F, [self.read_value(header & 0x0F) for _ in range(size)])
        if ctype == CT_MAP:
            size = self.read_varint()
            kv = self.read_byte() if size else 0
            items = [(self.read_value(kv >> 4), self.read_value(kv & 0x0F)) for _ in range(size)]
            return TMap(kv >> 4, kv & 0x0F, items)
        if ctype == CT_STRUCT:
            return self.read_struct()
        raise ValueError(f"unknown Thrift compact type {ctype}")


def decode_struct(data: bytes | memoryview) -> Struct:
    """Decode one Thrift compact struct that fills `data` exactly."""
    decoder = ThriftDecoder(data)
    result = decoder.read_struct()
    if decoder.pos != len(data):
        raise ValueError(f"{len(data) - decoder.pos} bytes after the struct")
    return result


def encode_struct(value: Struct) -> bytes:
    """Thrift compact encoding of `value` (decode_struct's inverse, byte for byte)."""
    out = bytearray()
    _put(out, CT_STRUCT, value)
    return bytes(out)


def _put_varint(out: bytearray, n: int) -> None:
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)


def _put(out: bytearray, ctype: int, value) -> None:
    """Append one value of compact type `ctype` (field headers are written by the struct case)."""
    if ctype in (CT_TRUE, CT_FALSE):
        out.append(CT_TRUE if value else CT_FALSE)
    elif ctype == CT_BYTE:
        out.append(value & 0xFF)
    elif ctype in _INT_TYPES:
        _put_varint(out, zigzag(value))
    elif ctype == CT_DOUBLE:
        out += struct.pack("<d", value)
    elif ctype == CT_BINARY:
        _put_varint(out, len(value))
        out += value
    elif ctype in (CT_LIST, CT_SET):
        n = len(value.items)
        out.append(n << 4 | value.elem_type if n < 15 else 0xF0 | value.elem_type)
        if n >= 15:
            _put_varint(out, n)
        for item in value.items:
            _put(out, value.elem_type, item)
    elif ctype == CT_MAP:
        _put_varint(out, len(value.items))
        if value.items:
            out.append(value.key_type << 4 | value.value_type)
        for k, v in value.items:
            _put(out, value.key_type, k)
            _put(out, value.value_type, v)
    elif ctype == CT_STRUCT:
        last = 0
        for fid, ftype, fvalue in value.fields:
            is_bool = ftype in (CT_TRUE, CT_FALSE)
            ftype = (CT_TRUE if fvalue else CT_FALSE) if is_bool else ftype
            if 0 < fid - last <= 15:
                out.append((fid - last) << 4 | ftype)
            else:
                out.append(ftype)
                _put_varint(out, zigzag(fid))
            if not is_bool:
                _put(out, ftype, fvalue)
            last = fid
        out.append(CT_STOP)
    else:
        raise ValueError(f"unknown Thrift compact type {ctype}")
