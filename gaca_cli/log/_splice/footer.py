"""Reading and checking a Parquet file's footer: the FileMetaData, its schema's top-level
fields, each column chunk's byte range, and the Arrow schema its writer stored.

Layout (apache/parquet-format): "PAR1", the column chunks row group by row group, bloom filters
and page indexes, FileMetaData (Thrift compact), its byte length (u32 little-endian), "PAR1".
Field ids below are those of parquet.thrift (apache/parquet-format, src/main/thrift/parquet.thrift).
"""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from gaca_cli.log._splice.thrift import CT_STRUCT, DECODE_ERRORS, Struct, TList, decode_struct, encode_struct

MAGIC = b"PAR1"
MAGIC_ENCRYPTED = b"PARE"

FMD_VERSION, FMD_SCHEMA, FMD_NUM_ROWS, FMD_ROW_GROUPS, FMD_KEY_VALUE_METADATA = 1, 2, 3, 4, 5
FMD_CREATED_BY, FMD_COLUMN_ORDERS, FMD_ENCRYPTION_ALGORITHM, FMD_FOOTER_SIGNING_KEY = 6, 7, 8, 9
RG_COLUMNS, RG_TOTAL_BYTE_SIZE, RG_NUM_ROWS, RG_SORTING_COLUMNS = 1, 2, 3, 4
RG_FILE_OFFSET, RG_TOTAL_COMPRESSED_SIZE, RG_ORDINAL = 5, 6, 7
CC_FILE_PATH, CC_FILE_OFFSET, CC_META_DATA = 1, 2, 3
CC_OFFSET_INDEX_OFFSET, CC_OFFSET_INDEX_LENGTH, CC_COLUMN_INDEX_OFFSET, CC_COLUMN_INDEX_LENGTH = 4, 5, 6, 7
CC_CRYPTO_METADATA, CC_ENCRYPTED_COLUMN_METADATA = 8, 9
CMD_PATH_IN_SCHEMA, CMD_TOTAL_UNCOMPRESSED_SIZE, CMD_TOTAL_COMPRESSED_SIZE = 3, 6, 7
CMD_DATA_PAGE_OFFSET, CMD_INDEX_PAGE_OFFSET, CMD_DICTIONARY_PAGE_OFFSET = 9, 10, 11
CMD_BLOOM_FILTER_OFFSET, CMD_BLOOM_FILTER_LENGTH = 14, 15
SE_NAME, SE_NUM_CHILDREN = 4, 5
OI_PAGE_LOCATIONS, PL_OFFSET = 1, 1
KV_KEY, KV_VALUE = 1, 2
SC_COLUMN_IDX = 1

ARROW_SCHEMA_KEY = b"ARROW:schema"


class SpliceUnsupported(Exception):
    """The inputs cannot be spliced (reason in the message); the caller falls back to a normal write."""


@dataclass
class Footer:
    """One Parquet file: its path, decoded FileMetaData and the first byte of its footer; `data`
    holds the whole file when it was encoded in memory (then `path` only names it)."""

    path: str
    meta: Struct
    data_end: int
    data: memoryview | None = None


@dataclass
class Chunk:
    """One column chunk: where its bytes are, its ColumnChunk (rewritten in place when it is
    copied) and its decoded OffsetIndex; `delta` is how far the chunk moved once written."""

    path: str
    start: int
    length: int
    chunk: Struct
    offset_index: Struct | None
    delta: int = 0
    data: memoryview | None = None  # the chunk's bytes, for chunks encoded in memory
    extras: dict[int, bytes] | None = None  # an in-memory chunk's bloom filter and column index, by offset


def read_footer(path: str) -> Footer:
    """Decode the FileMetaData of `path`; refuse encrypted or malformed files."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            head = f.read(4)
            f.seek(max(size - 8, 0))
            tail = f.read(8)
            if MAGIC_ENCRYPTED in (head, tail[4:]):
                raise SpliceUnsupported(f"{path}: encrypted Parquet file")
            footer_length = int.from_bytes(tail[:4], "little")
            data_end = size - 8 - footer_length
            if size < 12 or head != MAGIC or tail[4:] != MAGIC or data_end < 4:
                raise SpliceUnsupported(f"{path}: not a Parquet file")
            f.seek(data_end)
            meta = decode_struct(f.read(footer_length))
    except (OSError, *DECODE_ERRORS) as exc:
        raise SpliceUnsupported(f"{path}: cannot read the Parquet footer ({exc})") from None
    if meta.get(FMD_ENCRYPTION_ALGORITHM) is not None or meta.get(FMD_FOOTER_SIGNING_KEY) is not None:
        raise SpliceUnsupported(f"{path}: encrypted Parquet file")
    if not isinstance(meta.get(FMD_ROW_GROUPS), TList) or not isinstance(meta.get(FMD_SCHEMA), TList):
        raise SpliceUnsupported(f"{path}: FileMetaData without schema or row groups")
    return Footer(path, meta, data_end)


def top_level_fields(schema: list[Struct]) -> list[tuple[str, int, int]]:
    """(name, number of SchemaElements, number of leaf columns) of each top-level field, from the
    depth-first SchemaElement list (a group has num_children, a leaf has none)."""
    fields, i = [], 1
    for _ in range(schema[0].get(SE_NUM_CHILDREN, 0)):
        start, leaves, pending = i, 0, 1
        while pending:
            children = schema[i].get(SE_NUM_CHILDREN)
            i, pending = i + 1, pending - 1
            if children is None:
                leaves += 1
            else:
                pending += children
        fields.append((schema[start].get(SE_NAME).decode(), i - start, leaves))
    if i != len(schema):
        raise ValueError("schema has elements outside the root's subtree")
    return fields


def memory_footer(buffer: pa.Buffer) -> Footer:
    """Decode the FileMetaData of a Parquet file held in memory (one pyarrow just wrote)."""
    data = memoryview(buffer).cast("B")  # pyarrow buffers export signed bytes
    footer_length = int.from_bytes(data[-8:-4], "little")
    data_end = len(data) - 8 - footer_length
    if data[:4] != MAGIC or data[-4:] != MAGIC or data_end < 4:
        raise SpliceUnsupported("pyarrow wrote the new columns in an unexpected layout")
    return Footer("<new columns>", decode_struct(data[data_end : len(data) - 8]), data_end, data)


def chunk_piece(inp: Footer, chunk: Struct) -> Chunk:
    """Validate a ColumnChunk (inline, unencrypted, ranges inside the data area) and read its
    OffsetIndex."""
    md = chunk.get(CC_META_DATA)
    elsewhere = (CC_FILE_PATH, CC_CRYPTO_METADATA, CC_ENCRYPTED_COLUMN_METADATA)
    if not isinstance(md, Struct) or any(chunk.get(fid) is not None for fid in elsewhere):
        raise SpliceUnsupported(f"{inp.path}: column chunk stored elsewhere, encrypted or without meta_data")
    data = md.get(CMD_DATA_PAGE_OFFSET)
    length = md.get(CMD_TOTAL_COMPRESSED_SIZE)
    others = [md.get(CMD_DICTIONARY_PAGE_OFFSET), md.get(CMD_INDEX_PAGE_OFFSET)]
    start = min([o for o in others if isinstance(o, int) and 0 < o < data] + [data])
    _check_range(inp, start, length, "column chunk")
    if not start <= data < start + length:
        raise SpliceUnsupported(f"{inp.path}: data page offset outside its column chunk")
    if md.get(CMD_BLOOM_FILTER_OFFSET) is not None:
        _check_range(inp, md.get(CMD_BLOOM_FILTER_OFFSET), md.get(CMD_BLOOM_FILTER_LENGTH), "bloom filter")
    for offset_fid in (CC_COLUMN_INDEX_OFFSET, CC_OFFSET_INDEX_OFFSET):  # each length's id is offset's + 1
        if chunk.get(offset_fid) is not None or chunk.get(offset_fid + 1) is not None:
            _check_range(inp, chunk.get(offset_fid), chunk.get(offset_fid + 1), "page index")
    offset_index = None
    if chunk.get(CC_OFFSET_INDEX_OFFSET) is not None:
        offset_index = _read_offset_index(inp, chunk.get(CC_OFFSET_INDEX_OFFSET), chunk.get(CC_OFFSET_INDEX_LENGTH))
        locations = offset_index.get(OI_PAGE_LOCATIONS).items
        if not all(start <= loc.get(PL_OFFSET) < start + length for loc in locations):
            raise SpliceUnsupported(f"{inp.path}: offset index points outside its column chunk")
    return Chunk(inp.path, start, length, chunk, offset_index)


def _check_range(inp: Footer, offset, length, what: str) -> None:
    """Refuse a byte range that is not a positive-length range inside the file's data area."""
    is_int = isinstance(offset, int) and isinstance(length, int)
    if not (is_int and length > 0 and 4 <= offset <= inp.data_end - length):
        raise SpliceUnsupported(f"{inp.path}: {what} range ({offset}, {length}) outside the file's data")


def _read_offset_index(inp: Footer, offset: int, length: int) -> Struct:
    """Decode one OffsetIndex; refuse it unless its page locations are a well-formed list."""
    try:
        if inp.data is not None:
            index = decode_struct(inp.data[offset : offset + length])
        else:
            with open(inp.path, "rb") as f:
                f.seek(offset)
                index = decode_struct(f.read(length))
        if not all(isinstance(loc.get(PL_OFFSET), int) for loc in index.get(OI_PAGE_LOCATIONS).items):
            raise ValueError("page location without offset")
    except (OSError, *DECODE_ERRORS) as exc:
        raise SpliceUnsupported(f"{inp.path}: unreadable offset index ({exc})") from None
    return index


def encode_field(meta: Struct, fid: int) -> bytes:
    """The encoding of one field of `meta` (for equality tests); empty when absent."""
    return encode_struct(Struct([entry for entry in meta.fields if entry[0] == fid]))


def key_value_metadata(meta: Struct) -> dict[bytes, bytes]:
    """The FileMetaData's key/value metadata (a key without a value maps to b"")."""
    items = meta.get(FMD_KEY_VALUE_METADATA)
    if not isinstance(items, TList) or items.elem_type != CT_STRUCT:
        return {}
    return {kv.get(KV_KEY): kv.get(KV_VALUE, b"") for kv in items.items}


def arrow_schema(footer: Footer) -> pa.Schema:
    """The Arrow schema of the file, without schema-level metadata: the one its writer stored
    (ARROW:schema, a base64 Arrow IPC message) when it names the Parquet columns, else pyarrow's
    reading of the Parquet schema. The stored one is what readers take their types from (polars
    its time zones; pyarrow its string widths and dictionaries), so a file that carries it on
    reads back as its input did: pyarrow itself reads an INT96 timestamp without the time zone
    the stored schema records, and would lose it for everyone if the schema were rebuilt."""
    try:
        names = [name for name, _, _ in top_level_fields(footer.meta.get(FMD_SCHEMA).items)]
    except DECODE_ERRORS as exc:
        raise SpliceUnsupported(f"{footer.path}: malformed Parquet schema ({exc})") from None
    stored = key_value_metadata(footer.meta).get(ARROW_SCHEMA_KEY)
    if stored:
        try:
            schema = pa.ipc.read_schema(pa.py_buffer(base64.b64decode(stored)))
        except (pa.ArrowException, ValueError) as exc:
            raise SpliceUnsupported(f"{footer.path}: unreadable ARROW:schema ({exc})") from None
        if schema.names == names:
            return schema.remove_metadata()
    try:
        schema = pq.read_schema(footer.path).remove_metadata()
    except (pa.ArrowException, OSError) as exc:
        raise SpliceUnsupported(f"{footer.path}: unreadable schema ({exc})") from None
    if schema.names != names:
        raise SpliceUnsupported(f"{footer.path}: Arrow and Parquet schemas name different columns")
    return schema
