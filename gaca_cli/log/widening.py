"""Widening: one Arrow type per column across the files of a log, where they differ only in a
width or an encoding (string and large_string, int32 and int64, a dictionary and plain text),
and usual types for columns that are all nulls."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa


def widest_type(t: pa.DataType) -> pa.DataType:
    """`t` with its text, binary and list types at their widest (string and string_view ->
    large_string, binary and binary_view -> large_binary, list -> large_list), also inside
    lists, structs and maps, and dictionaries decoded (a pandas categorical or a column read
    as a dictionary in one file is plain text in another). List views are left as they are:
    pyarrow 26 casts a list view to a list wrongly where its offsets do not increase."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.large_string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.large_binary()
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.large_list(t.value_field.with_type(widest_type(t.value_type)))
    if pa.types.is_fixed_size_list(t):
        return pa.list_(t.value_field.with_type(widest_type(t.value_type)), t.list_size)
    if pa.types.is_map(t):
        key, item = t.key_field, t.item_field
        return pa.map_(key.with_type(widest_type(key.type)), item.with_type(widest_type(item.type)), t.keys_sorted)
    if pa.types.is_struct(t):
        return pa.struct([t.field(i).with_type(widest_type(t.field(i).type)) for i in range(t.num_fields)])
    if pa.types.is_dictionary(t):
        return widest_type(t.value_type)
    return t


def text_width_types(schemas: Sequence[pa.Schema]) -> dict[str, pa.DataType]:
    """For each column whose type differs between `schemas` only in a width or an encoding:
    of its text, binary or list offsets (string in a file from pyarrow, large_string in one from
    polars), a dictionary in one file and not in another (pandas categoricals),
    or of its integers (int32 and int64 step indices: int64) or floats (float32 and float64:
    float64), the type every file's column is read as: the wide one, as polars, duckdb and
    pyarrow's permissive promotion unify them. Null-typed columns are left to the default
    promotion; any other difference (an integer in one file, a float or text in another) is
    not unified (the caller reports it)."""
    seen: dict[str, set[pa.DataType]] = {}
    for schema in schemas:
        for f in schema:
            if not pa.types.is_null(f.type):
                seen.setdefault(f.name, set()).add(f.type)
    targets = {}
    for name, types in seen.items():
        if len(types) < 2:
            continue
        wide = {widest_type(t) for t in types}
        if len(wide) == 1:
            targets[name] = wide.pop()
        elif all(pa.types.is_integer(t) for t in types) and pa.uint64() not in types:
            targets[name] = pa.int64()  # every value of the narrower ones fits
        elif all(pa.types.is_floating(t) for t in types):
            targets[name] = pa.float64()
    return targets


def with_text_widths(schemas: list[pa.Schema]) -> list[pa.Schema]:
    """`schemas` with the columns `text_width_types` unifies given their wide type."""
    targets = text_width_types(schemas)
    out = []
    for schema in schemas:
        for i, f in enumerate(schema):
            if f.name in targets and not pa.types.is_null(f.type):
                schema = schema.set(i, f.with_type(targets[f.name]))
        out.append(schema)
    return out


def cast_columns(table: pa.Table, targets: Mapping[str, pa.DataType]) -> pa.Table:
    """`table` with the columns named in `targets` cast to their type (null columns left alone)."""
    for i, f in enumerate(table.schema):
        want = targets.get(f.name)
        if want is not None and f.type != want and not pa.types.is_null(f.type):
            table = table.set_column(i, f.with_type(want), table.column(i).cast(want))
    return table


def null_types(schema: pa.Schema) -> pa.Schema:
    """`schema` with each nullable column of the log schema that has Arrow type null (all
    nulls, as pandas and polars write a column of None) given its usual type: float64 for
    nll_sum and nll_mean, bool for done, lists for token ids and log-probs."""
    from gaca_cli.log.schema import INPUT_BY_NAME

    usual = {
        "float": pa.float64(),
        "bool": pa.bool_(),
        "token_ids": pa.list_(pa.int32()),
        "logprobs": pa.list_(pa.float32()),
    }
    fields = []
    for f in schema:
        spec = INPUT_BY_NAME.get(f.name)
        if pa.types.is_null(f.type) and spec is not None and spec.nullable and spec.kind in usual:
            f = f.with_type(usual[spec.kind])
        fields.append(f)
    return pa.schema(fields, metadata=schema.metadata)


def typed_nulls(table: pa.Table) -> pa.Table:
    """`table` with its columns of Arrow type null cast as `null_types` says."""
    typed = null_types(table.schema)
    return table if typed.equals(table.schema) else table.cast(typed)
