"""The log: schema, columns, reading and writing Parquet, input checks, the row index, anchors."""
