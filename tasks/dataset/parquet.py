"""Parquet files the Hub's dataset viewer accepts: one explicit schema per config, files bounded in rows
and bytes (`FileWriter`), laid out by the engine's `ParquetOptions` (row groups bounded in bytes, a
page index, optional content-defined chunking: `tasks.engine.parquet`).

Invariants: `FileWriter` files hold at most `max_rows` rows and about `file_bytes` bytes, each conformed
to the config's record schema (no drift from an all-null chunk); rows keep their order.
"""

from __future__ import annotations

import posixpath
from typing import Any

import pyarrow as pa

from ...schemas.arrow import to_table
from ..engine.parquet import ParquetOptions, split_bytes, table_row_bytes


class FileWriter:
    """Rows appended in order land in `<folder>/train-<fp>-NNNNN.parquet` files of at most `max_rows`
    rows and about `options.file_bytes` bytes each, conformed to `model`'s schema; at most one file's
    rows are held. `store.write_table` writes each file (atomic, with these options)."""

    def __init__(self, store: Any, folder: str, fp: str, max_rows: int, model: type, options: ParquetOptions):
        self.store, self.folder, self.fp, self.max_rows, self.model, self.options = store, folder, fp, max_rows, model, options
        self.pending: list[pa.Table] = []
        self.held = self.held_bytes = self.files = self.rows = 0

    def add(self, table: pa.Table) -> None:
        if table.num_rows:
            self.pending.append(table)
            self.held += table.num_rows
            self.held_bytes += table.nbytes
        while self.held >= self.max_rows or (self.held_bytes >= self.options.file_bytes and self.held):
            table = pa.concat_tables(self.pending)
            n = min(self.max_rows, self.held)
            if self.held_bytes >= self.options.file_bytes:
                n = min(n, split_bytes(table_row_bytes(table), self.options.file_bytes)[0][1])
            self._flush(table, n)

    def close(self) -> int:
        if self.held:
            self._flush(pa.concat_tables(self.pending), self.held)
        return self.rows

    def _flush(self, table: pa.Table, n: int) -> None:
        path = posixpath.join(self.folder, f"train-{self.fp}-{self.files:05d}.parquet")
        self.store.write_table(path, to_table(self.model, table.slice(0, n)), options=self.options)
        rest = table.slice(n)
        self.pending, self.held, self.held_bytes = ([rest] if rest.num_rows else []), rest.num_rows, rest.nbytes
        self.files, self.rows = self.files + 1, self.rows + n
