"""The run store: every byte a build writes goes through here, on any fsspec URL.

Layout (docs/architecture.md):
    <runs>/<dataset>/<build_id>/build.json
    <runs>/<dataset>/<build_id>/<stage>/<fingerprint>/part-*.parquet, _done/part-*, rejects.parquet,
        stats.json, gate.json, manifest.json
    <runs>/<dataset>/latest            -> newest committed build (symlink locally, text object elsewhere)

Invariants: a shard's Parquet file is complete before its `_done` marker exists (resume trusts
markers only); `manifest.json` is written last and only by `commit`; readers never see a stage
without a manifest.
"""

from __future__ import annotations

import io
import json
import os
import posixpath
import uuid
from typing import Any, Iterable

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel

from ...schemas.arrow import arrow_schema, from_table, to_table
from ...schemas.build import BuildRecord
from ...schemas.common import Reject

PARQUET_OPTS = {"compression": "zstd"}


class RunStore:
    """Paths and atomic-enough writes under `<runs>/<dataset>`."""

    def __init__(self, runs_url: str, dataset: str, storage_options: dict | None = None):
        self.fs, root = fsspec.core.url_to_fs(runs_url, **(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)
        if self.local:
            root = os.path.abspath(root)
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.root = posixpath.join(root, dataset)
        self.runs_url, self.dataset = runs_url, dataset
        self.fs.makedirs(self.root, exist_ok=True)

    # -- paths ---------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """A full URL for a path of this store (what other tools, e.g. `datasets`, are given)."""
        return path if self.local else f"{self.protocol}://{path}"

    def build_dir(self, build_id: str) -> str:
        return posixpath.join(self.root, build_id)

    def stage_dir(self, build_id: str, stage: str, fingerprint: str) -> str:
        return posixpath.join(self.root, build_id, stage, fingerprint)

    # -- small files ---------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def write_text(self, path: str, text: str) -> None:
        """Write via a temporary name + move, so a reader sees the old or the new file, never half."""
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self.local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            with open(tmp, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        else:  # object stores: a PUT is atomic
            with self.fs.open(path, "w") as f:
                f.write(text)

    def read_text(self, path: str) -> str:
        with self.fs.open(path, "r") as f:
            return f.read()

    def write_json(self, path: str, obj: Any) -> None:
        self.write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_text(path))

    def remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    # -- tables --------------------------------------------------------------------------------
    def write_table(self, path: str, table: pa.Table) -> None:
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        if self.local:
            tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
            pq.write_table(table, tmp, **PARQUET_OPTS)
            os.replace(tmp, path)
        else:
            buf = io.BytesIO()
            pq.write_table(table, buf, **PARQUET_OPTS)
            with self.fs.open(path, "wb") as f:
                f.write(buf.getvalue())

    def write_records(self, path: str, model: type[BaseModel], rows: Iterable[BaseModel]) -> int:
        table = to_table(model, rows)
        self.write_table(path, table)
        return table.num_rows

    def read_table(self, paths: list[str], model: type[BaseModel] | None = None,
                   columns: list[str] | None = None, filters: list | None = None) -> pa.Table:
        """Concatenated parts; `filters` are pyarrow's DNF filters (row groups pruned, rows filtered)."""
        schema = arrow_schema(model) if model is not None else None
        tables = []
        for p in paths:
            with self.fs.open(p, "rb") as f:
                tables.append(pq.read_table(f, schema=schema, columns=columns, filters=filters))
        if not tables:
            if schema is None:
                return pa.table({})
            schema = pa.schema([schema.field(c) for c in columns]) if columns else schema
            return schema.empty_table()
        return pa.concat_tables(tables)

    def read_records(self, paths: list[str], model: type[BaseModel], filters: list | None = None) -> list:
        return from_table(model, self.read_table(paths, model, filters=filters))

    def write_rejects(self, path: str, rejects: list[Reject]) -> None:
        self.write_records(path, Reject, rejects)

    # -- discovery -----------------------------------------------------------------------------
    def builds(self) -> list[str]:
        """Build ids of this dataset, oldest first (ids sort by creation time)."""
        out = []
        for p in self.fs.ls(self.root, detail=False):
            name = posixpath.basename(p.rstrip("/"))
            if name != "latest" and self.fs.exists(posixpath.join(p, "build.json")):
                out.append(name)
        return sorted(out)

    def committed_manifests(self, stage: str) -> list[str]:
        """Paths of every committed manifest of `stage` in this dataset, newest build first."""
        return sorted(self.fs.glob(posixpath.join(self.root, "*", stage, "*", "manifest.json")), reverse=True)

    def build_record_path(self, build_id: str) -> str:
        return posixpath.join(self.build_dir(build_id), "build.json")

    def read_build(self, build_id: str) -> BuildRecord | None:
        """The typed `build.json` of a build, or None when there is none."""
        path = self.build_record_path(build_id)
        return BuildRecord.model_validate(self.read_json(path)) if self.exists(path) else None

    def write_build(self, record: BuildRecord) -> None:
        self.write_json(self.build_record_path(record.build_id), record.model_dump(mode="json", exclude_none=True))

    @staticmethod
    def datasets(runs_url: str) -> list[str]:
        """Dataset names under a runs root (nothing is created)."""
        fs, root = fsspec.core.url_to_fs(runs_url)
        if not fs.exists(root):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p))

    def find_committed(self, stage: str, fingerprint: str) -> str | None:
        """Path of a committed manifest for (stage, fingerprint) in any build of this dataset."""
        for build in reversed(self.builds()):
            m = posixpath.join(self.stage_dir(build, stage, fingerprint), "manifest.json")
            if self.fs.exists(m):
                return m
        return None

    def set_latest(self, build_id: str) -> None:
        """Point `<dataset>/latest` at a committed build."""
        latest = posixpath.join(self.root, "latest")
        if self.local:
            tmp = f"{latest}.tmp-{uuid.uuid4().hex[:8]}"
            os.symlink(build_id, tmp)
            os.replace(tmp, latest)
        else:
            self.write_text(latest, build_id + "\n")

    def latest(self) -> str | None:
        latest = posixpath.join(self.root, "latest")
        if self.local:
            return os.readlink(latest) if os.path.islink(latest) else None
        return self.read_text(latest).strip() if self.fs.exists(latest) else None

    def link_dataset(self, build_id: str, target: str) -> str:
        """`<build>/dataset` -> the export folder: a symlink locally, a pointer file elsewhere."""
        link = posixpath.join(self.build_dir(build_id), "dataset")
        if self.local:
            rel = os.path.relpath(target, self.build_dir(build_id))
            tmp = f"{link}.tmp-{uuid.uuid4().hex[:8]}"
            os.symlink(rel, tmp)
            os.replace(tmp, link)
        else:
            self.write_text(link + ".json", json.dumps({"path": self.url(target)}))
        return link
