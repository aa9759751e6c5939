"""The run store: every byte a build writes goes through here, on any fsspec URL.

Layout (docs/architecture.md):
    <runs>/<dataset>/<build_id>/build.json
    <runs>/<dataset>/<build_id>/<stage>/<fingerprint>/part-*.parquet, _done/part-*, rejects.parquet,
        stats.json, gate.json, manifest.json
    <runs>/<dataset>/latest            -> newest committed build (symlink locally, text object elsewhere)

Invariants: a shard's Parquet file is complete (and, locally, fsynced) before its `_done` marker
exists (resume trusts markers only); `manifest.json` is written last and only by `commit`; readers
never see a stage without a manifest. A write that fails (a full disk) raises StoreWriteError naming
the path and the free space, and leaves no temporary behind; `*.tmp-*` left by a killed writer are
removed by `clean_temporaries`. Build ids and dataset names are plain names, never paths.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import posixpath
import re
import shutil
import uuid
from typing import Any, Callable, Iterable, Iterator

import fsspec
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem
from pydantic import BaseModel

from ...schemas.arrow import arrow_schema, empty_table, from_table, to_table
from ...schemas.build import BuildRecord
from ...schemas.common import Reject
from .parquet import ParquetOptions, write_parquet

PARQUET_OPTS = {"compression": "zstd"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")  # a build id or a dataset: one path segment


class StoreWriteError(OSError):
    """A write to the run store failed (e.g. the disk is full): one line naming the path and the free space."""


def check_name(value: str, what: str = "build id") -> str:
    """`value` if it is a plain name (letters, digits, `.`, `_`, `-`; no path), else ValueError."""
    if not NAME.match(value or "") or value in (".", ".."):
        raise ValueError(f"invalid {what} {value!r}: use letters, digits, '.', '_' and '-' (a name, not a path)")
    return value


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover


def _write_synced(path: str, text: str) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())


def _fsync(path: str) -> None:
    """Flush a file (or a directory entry) to the disk; on Linux a read-only descriptor may be fsynced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class RunStore:
    """Paths and atomic-enough writes under `<runs>/<dataset>`."""

    def __init__(self, runs_url: str, dataset: str, storage_options: dict | None = None, create: bool = True):
        """`create=False`: a store to read from; a dataset that does not exist raises FileNotFoundError
        (nothing is created)."""
        self.fs, root = fsspec.core.url_to_fs(runs_url, **(storage_options or {}))
        self.local = isinstance(self.fs, LocalFileSystem)
        if self.local:
            root = os.path.abspath(root)
        self.protocol = self.fs.protocol if isinstance(self.fs.protocol, str) else self.fs.protocol[0]
        self.root = posixpath.join(root, dataset)
        self.runs_url, self.dataset = runs_url, dataset
        if not create:
            if not self.fs.isdir(self.root):
                found = ", ".join(self.datasets(runs_url, storage_options)) or "none"
                raise FileNotFoundError(f"no dataset {dataset!r} under {runs_url} (datasets there: {found})")
        else:
            with self._writing(self.root):
                self.fs.makedirs(self.root, exist_ok=True)

    # -- paths ---------------------------------------------------------------------------------
    def url(self, path: str) -> str:
        """A full URL for a path of this store (what other tools, e.g. `datasets`, are given)."""
        return path if self.local else f"{self.protocol}://{path}"

    def build_dir(self, build_id: str) -> str:
        return posixpath.join(self.root, check_name(build_id))

    def stage_dir(self, build_id: str, stage: str, fingerprint: str) -> str:
        return posixpath.join(self.root, build_id, stage, fingerprint)

    # -- small files ---------------------------------------------------------------------------
    def exists(self, path: str) -> bool:
        return self.fs.exists(path)

    def write_text(self, path: str, text: str, fence: Callable[[], None] | None = None) -> None:
        """Write via a temporary name + move, so a reader sees the old or the new file, never half.
        `fence()`, if given, runs right before the file takes its name (it raises to refuse the write)."""
        with self._writing(path) as tmp:
            if tmp:
                _write_synced(tmp, text)
                if fence:
                    fence()
                os.replace(tmp, path)
            else:  # object stores: a PUT is atomic
                if fence:
                    fence()
                with self.fs.open(path, "w") as f:
                    f.write(text)

    def create_exclusive(self, path: str, text: str) -> bool:
        """Write `path` only if it does not exist yet; True when this call created it. Atomic: a hard
        link of a complete temporary locally, a conditional PUT (`If-None-Match: *`) on object stores
        that support it (elsewhere an existence check: the caller reads back and compares)."""
        with self._writing(path) as tmp:
            if tmp:
                _write_synced(tmp, text)
                try:
                    os.link(tmp, path)
                    return True
                except FileExistsError:
                    return False
                finally:
                    os.unlink(tmp)
            try:
                with self.fs.open(path, "xb") as f:
                    f.write(text.encode())
                return True
            except FileExistsError:
                return False
            except (ValueError, NotImplementedError):  # no exclusive mode on this filesystem
                if self.fs.exists(path):
                    return False
                with self.fs.open(path, "w") as f:
                    f.write(text)
                return True

    @contextlib.contextmanager
    def _writing(self, path: str):
        """Around a write of `path`: yields a temporary name next to it (local stores; None elsewhere),
        removes that temporary if the write fails, and turns an OSError into one StoreWriteError line
        naming the path and the free space."""
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}" if self.local else None
        try:
            self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
            yield tmp
        except StoreWriteError:
            raise
        except OSError as err:
            raise StoreWriteError(self._write_failure(path, err)) from None
        finally:
            if tmp and os.path.lexists(tmp):
                with contextlib.suppress(OSError):
                    os.unlink(tmp)

    def _write_failure(self, path: str, err: OSError) -> str:
        code = err.errno or next((int(m) for m in re.findall(r"\[errno (\d+)\]", str(err), re.I)), None)
        why = os.strerror(code) if code else (err.strerror or str(err) or err.__class__.__name__)
        where = ""
        if self.local:
            probe = path
            while probe and not os.path.exists(probe):
                probe = os.path.dirname(probe)
            with contextlib.suppress(OSError):
                usage = shutil.disk_usage(probe or "/")
                where = f" ({_size(usage.free)} free of {_size(usage.total)} there)"
        return (f"cannot write {self.url(path)}: {why}{where}; free some space (or fix the cause) and run the "
                "same command again: the build resumes where it stopped")

    def clean_temporaries(self, under: str, older_than: float) -> int:
        """Remove `*.tmp-*` files below `under` last modified before `older_than` (epoch seconds):
        left by a writer that was killed mid-write. Younger ones may belong to a live writer and are
        kept. Object stores have none (their writes are atomic PUTs). Returns how many were removed."""
        if not self.local or not os.path.isdir(under):
            return 0
        removed = 0
        for dirpath, _, files in os.walk(under):
            for name in files:
                if ".tmp-" not in name:
                    continue
                p = os.path.join(dirpath, name)
                with contextlib.suppress(FileNotFoundError):
                    if os.lstat(p).st_mtime < older_than:
                        os.unlink(p)
                        removed += 1
        return removed

    def read_text(self, path: str) -> str:
        with self.fs.open(path, "r") as f:
            return f.read()

    def write_json(self, path: str, obj: Any, fence: Callable[[], None] | None = None) -> None:
        self.write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", fence)

    def read_json(self, path: str) -> Any:
        return json.loads(self.read_text(path))

    def remove(self, path: str) -> None:
        if self.fs.exists(path):
            self.fs.rm(path, recursive=True)

    # -- tables --------------------------------------------------------------------------------
    def write_table(self, path: str, table: pa.Table, fence: Callable[[], None] | None = None,
                    options: ParquetOptions | None = None) -> None:
        """Locally: to a temporary, fsynced, moved into place and the move fsynced, so the file is
        complete on the disk before the caller writes anything that trusts it (a `_done` marker).
        `fence()`, if given, runs right before the file takes its name (it raises to refuse the write).
        Row groups bounded in bytes, with a page index (`options`, else the defaults)."""
        options = options or ParquetOptions()
        with self._writing(path) as tmp:
            if tmp:
                write_parquet(table, tmp, options)
                _fsync(tmp)
                if fence:
                    fence()
                os.replace(tmp, path)
                _fsync(posixpath.dirname(path))
            else:
                buf = io.BytesIO()
                write_parquet(table, buf, options)
                if fence:
                    fence()
                with self.fs.open(path, "wb") as f:
                    f.write(buf.getvalue())

    def write_records(self, path: str, model: type[BaseModel], rows: Iterable[BaseModel],
                      fence: Callable[[], None] | None = None, options: ParquetOptions | None = None) -> int:
        table = to_table(model, rows)
        self.write_table(path, table, fence, options)
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
            return empty_table(schema)
        return pa.concat_tables(tables)

    def iter_tables(self, paths: list[str], model: type[BaseModel] | None = None,
                    columns: list[str] | None = None, filters: list | None = None) -> Iterator[pa.Table]:
        """One table per part, in order: what streams a dataset-sized output (memory = one part)."""
        for p in paths:
            yield self.read_table([p], model, columns=columns, filters=filters)

    def num_rows(self, paths: list[str]) -> int:
        """Rows of Parquet parts, from their footers (no data read)."""
        total = 0
        for p in paths:
            with self.fs.open(p, "rb") as f:
                total += pq.ParquetFile(f).metadata.num_rows
        return total

    def read_records(self, paths: list[str], model: type[BaseModel], filters: list | None = None) -> list:
        return from_table(model, self.read_table(paths, model, filters=filters))

    def write_rejects(self, path: str, rejects: list[Reject], fence: Callable[[], None] | None = None,
                      options: ParquetOptions | None = None) -> None:
        self.write_records(path, Reject, rejects, fence, options)

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
    def datasets(runs_url: str, storage_options: dict | None = None) -> list[str]:
        """Dataset names under a runs root (nothing is created)."""
        fs, root = fsspec.core.url_to_fs(runs_url, **(storage_options or {}))
        if not fs.exists(root):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False) if fs.isdir(p))

    def find_committed(self, stage: str, fingerprint: str) -> str | None:
        """Path of a committed manifest for (stage, fingerprint) in any build of this dataset (the newest)."""
        return next(self.committed_copies(stage, fingerprint), None)

    def committed_copies(self, stage: str, fingerprint: str) -> Iterator[str]:
        """Paths of the committed manifests for (stage, fingerprint), newest build first."""
        for build in reversed(self.builds()):
            m = posixpath.join(self.stage_dir(build, stage, fingerprint), "manifest.json")
            if self.fs.exists(m):
                yield m

    def file_sha256(self, path: str) -> str:
        """sha256 of a file's bytes, read in 1 MiB blocks."""
        h = hashlib.sha256()
        with self.fs.open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        return h.hexdigest()

    def set_latest(self, build_id: str) -> None:
        """Point `<dataset>/latest` at a committed build."""
        latest = posixpath.join(self.root, "latest")
        if self.local:
            with self._writing(latest) as tmp:
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
            with self._writing(link) as tmp:
                os.symlink(rel, tmp)
                os.replace(tmp, link)
        else:
            self.write_text(link + ".json", json.dumps({"path": self.url(target)}))
        return link
