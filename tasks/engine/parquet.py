"""How the engine lays out every Parquet file it writes: row groups bounded in bytes, a page index,
optional content-defined chunking (`ParquetOptions`; a stage picks its own with `Stage.parquet_options`,
export takes them from `export.parquet`).

Invariants: every row group holds at most `row_group_bytes` uncompressed bytes as Arrow measures them
(a single row larger than the bound is a row group of its own); rows keep their order.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# pyarrow >= 21 writes data pages at content-defined boundaries (deduplicated by the Hub's storage across builds)
CDC = "use_content_defined_chunking" in inspect.signature(pq.ParquetWriter.__init__).parameters


@dataclass(frozen=True)
class ParquetOptions:
    row_group_bytes: int = 100 * 2**20
    file_bytes: int = 500 * 2**20
    page_index: bool = True
    content_defined_chunking: bool = False
    compression: str = "zstd"

    @classmethod
    def of(cls, config: Any) -> "ParquetOptions":
        """From `export.parquet` (schemas.config.ExportParquet)."""
        return cls(row_group_bytes=config.row_group_bytes, file_bytes=config.file_bytes, page_index=config.page_index,
                   content_defined_chunking=config.content_defined_chunking)


def row_bytes(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Per row, the bytes its values take in Arrow (data + offsets), column-wise."""
    if isinstance(arr, pa.ChunkedArray):
        parts = [row_bytes(c) for c in arr.chunks]
        return np.concatenate(parts) if parts else np.zeros(0)
    if isinstance(arr, pa.ExtensionArray):  # (JSON: its storage, text)
        arr = arr.storage
    t, n = arr.type, len(arr)
    if pa.types.is_struct(t):
        return sum((row_bytes(pc.struct_field(arr, [i])) for i in range(t.num_fields)), np.zeros(n))
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        values = arr.flatten()
        per_value = row_bytes(values)
        parents = pc.list_parent_indices(arr).to_numpy()
        return np.bincount(parents, weights=per_value, minlength=n) + (8 if pa.types.is_large_list(t) else 4)
    if pa.types.is_string(t) or pa.types.is_binary(t) or pa.types.is_large_string(t) or pa.types.is_large_binary(t):
        wide = pa.types.is_large_string(t) or pa.types.is_large_binary(t)
        offsets = np.frombuffer(arr.buffers()[1], dtype=np.int64 if wide else np.int32)[arr.offset:arr.offset + n + 1]
        return np.diff(offsets).astype(np.float64) + (8 if wide else 4)
    if pa.types.is_null(t):
        return np.zeros(n)
    width = getattr(t, "bit_width", 8)
    return np.full(n, max(width, 8) / 8)


def table_row_bytes(table: pa.Table) -> np.ndarray:
    return sum((row_bytes(c) for c in table.columns), np.zeros(table.num_rows))


def split_bytes(sizes: np.ndarray, bound: float) -> list[tuple[int, int]]:
    """Consecutive [start, stop) ranges whose sizes sum to at most `bound` (a larger single row alone)."""
    ranges, start, held = [], 0, 0.0
    for i, s in enumerate(sizes.tolist()):
        if i > start and held + s > bound:
            ranges.append((start, i))
            start, held = i, 0.0
        held += s
    if start < len(sizes):
        ranges.append((start, len(sizes)))
    return ranges


def row_groups(table: pa.Table, bound: int) -> Iterator[pa.Table]:
    """`table` in slices of at most `bound` bytes (90% of it: Parquet's levels add a little)."""
    if table.nbytes <= bound * 0.9:
        yield table
        return
    for start, stop in split_bytes(table_row_bytes(table), bound * 0.9):
        yield table.slice(start, stop - start)


def write_parquet(table: pa.Table, where: Any, options: ParquetOptions | None = None) -> None:
    """Write `table` to a path or file object with bounded row groups and a page index."""
    o = options or ParquetOptions()
    kw: dict[str, Any] = {"compression": o.compression, "write_page_index": o.page_index}
    if o.content_defined_chunking and CDC:
        kw["use_content_defined_chunking"] = True
    with pq.ParquetWriter(where, table.schema, **kw) as writer:
        for group in row_groups(table, o.row_group_bytes):
            writer.write_table(group, row_group_size=max(group.num_rows, 1))
