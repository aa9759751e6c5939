"""What a stage wrote, as one digest: the key downstream reuse is decided on (with config and code).

A stage's fingerprint says what *should* decide its rows; its output's digest says what the rows *are*.
A forced or non-deterministic stage (a sampling teacher) writes other rows under the same fingerprint,
so every stage hashes its upstream outputs' digests, never only their fingerprints: a forced re-run whose
rows are the same lets everything downstream be reused; any other output re-runs what reads it.

The digest of a table covers every column of its record type except the fields marked `Measured`
(durations, times, which endpoint answered: how the work went, not what it made), at any depth, and reads
a field marked `TarMark` as its members (name, type, mode, owner, link, bytes; never mtimes). Invariants:
two tables with the same rows in the same order (measurements aside) have the same digest, whatever their
chunking; any other difference in content gives another digest. A manifest's digest is the hash of its
parts' digests, each named by its path in the stage folder, in shard order.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
import typing
from typing import Any, Iterable

import pyarrow as pa
from pydantic import BaseModel

from ...schemas.arrow import as_storage
from ...schemas.common import Measured, TarMark

Path = tuple[str, ...]


def _models_in(tp: Any) -> list[type[BaseModel]]:
    """The record types a field annotation holds (through Optional, list and Annotated)."""
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return [tp]
    return [m for arg in typing.get_args(tp) for m in _models_in(arg)]


@functools.cache
def marked_paths(model: type[BaseModel], mark: type) -> frozenset[Path]:
    """Paths (field names, lists looked through) of the fields of `model` carrying `mark`, at any depth."""
    out: set[Path] = set()
    for name, info in model.model_fields.items():
        if mark in info.metadata:
            out.add((name,))
            continue
        for sub in _models_in(info.annotation):
            out |= {(name, *p) for p in marked_paths(sub, mark)}
    return frozenset(out)


def _strip(arr: pa.Array, drop: frozenset[Path]) -> pa.Array:
    """`arr` without the struct fields named by `drop` (paths relative to `arr`'s type)."""
    if not drop:
        return arr
    t = arr.type
    if pa.types.is_struct(t):
        children, fields = [], []
        for f, child in zip(t, arr.flatten()):
            if (f.name,) in drop:
                continue
            sub = frozenset(p[1:] for p in drop if p[0] == f.name and len(p) > 1)
            child = _strip(child, sub)
            children.append(child)
            fields.append(pa.field(f.name, child.type, f.nullable))
        if not fields:  # every field measured: only presence is content
            return arr.is_valid()
        return pa.StructArray.from_arrays(children, fields=fields, mask=arr.is_null() if arr.null_count else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        cls = pa.LargeListArray if pa.types.is_large_list(t) else pa.ListArray
        return cls.from_arrays(arr.offsets, _strip(arr.values, drop), mask=arr.is_null() if arr.null_count else None)
    return arr


def tar_content(data: bytes | None) -> bytes | None:
    """A tar's content as bytes to hash: members in archive order, with mtimes left out. Bytes that do not
    read as a tar are their own content."""
    if data is None:
        return None
    h = hashlib.sha256()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:*") as tar:
            for m in tar:
                h.update(repr((m.name, m.type, m.mode, m.uid, m.gid, m.uname, m.gname, m.linkname, m.size)).encode())
                if m.isfile():
                    f = tar.extractfile(m)
                    h.update(f.read() if f else b"")
    except (tarfile.TarError, EOFError, OSError):
        return b"raw:" + hashlib.sha256(data).digest()
    return b"tar:" + h.digest()


def table_digest(table: pa.Table, model: type[BaseModel]) -> str:
    """The content digest of `table` (rows of `model`): see the module docstring."""
    measured, tars = marked_paths(model, Measured), marked_paths(model, TarMark)
    h = hashlib.sha256()
    for name in table.column_names:
        if (name,) in measured:
            continue
        arr = as_storage(table.column(name))
        if (name,) in tars:
            arr = pa.array([tar_content(v) for v in arr.to_pylist()], pa.large_binary())
        arr = _strip(arr, frozenset(p[1:] for p in measured if p[0] == name and len(p) > 1))
        column = pa.table({name: arr})
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, column.schema) as writer:
            writer.write_table(column)
        h.update(name.encode() + b"\0")
        h.update(sink.getvalue())
    return h.hexdigest()[:32]


def combine(digests: Iterable[tuple[str, str]]) -> str:
    """One digest of named parts' digests (a manifest: its shards, in the order given)."""
    return hashlib.sha256("\n".join(f"{n}={d}" for n, d in digests).encode()).hexdigest()[:32]


def part_digest(store: Any, path: str, model: type[BaseModel]) -> str:
    """The content digest of one committed part file (for markers written before digests existed)."""
    return table_digest(store.read_table([path], model), model)


def parts_digest(store: Any, base: str, parts: Iterable[tuple[str, str | None]], model: type[BaseModel]) -> str:
    """The content digest of a stage's output: its parts (paths relative to `base`, in shard order), each by the
    digest its marker recorded, or computed from its file when none was (markers written before digests)."""
    return combine((rel, known or part_digest(store, f"{base.rstrip('/')}/{rel}", model)) for rel, known in parts)


def modified_parts(store: Any, manifest: Any) -> list[str]:
    """The parts of a committed output whose bytes are not those committed (`manifest.files`), each as
    `path (sha256 a… -> b…)` or `path (missing)`. Empty for an intact output, or one committed before
    files were recorded (nothing to compare with)."""
    out = []
    for rel, sha in sorted(manifest.files.items()):
        path = f"{manifest.dir.rstrip('/')}/{rel}"
        if not store.exists(path):
            out.append(f"{rel} (missing)")
            continue
        now = store.file_sha256(path)
        if now != sha:
            out.append(f"{rel} (sha256 {sha[:12]}… -> {now[:12]}…)")
    return out
