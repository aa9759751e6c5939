"""What every task-folder format shares: the error type, the format protocol and file helpers.

A `TaskFormat` recognises its folders by a marker file, reads one into an ordinary `EnvSpec`
(which then goes through the same validator as every other environment) and may write one back.
A missing or malformed file raises TaskFormatError naming the file and the field.
"""

from __future__ import annotations

import hashlib
import re
from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from ....schemas.common import FileSpec
from ....schemas.config import safe_name
from ....schemas.environment import Blob, EnvSpec, check_workdir
from ..blobs import BlobStore

LEVELS = {"easy": 1, "medium": 2, "hard": 3}
WORKDIR_LINE = re.compile(r"^\s*WORKDIR\s+(\S+)\s*$", re.I | re.M)
MAX_FILE = 4 << 20  # a text file inlined in a spec
MAX_BLOB = 256 << 20  # a binary build-context file (carried by hash, see `blobs`)
MAX_TASK = 256 << 20  # everything in a task folder
MAX_VALUES = 100_000  # values in a task's metadata file, aliases expanded
MAX_TEXT = 4 << 20  # characters of the strings in a task's metadata file, aliases expanded
MAX_FILES = 20_000  # files and folders in a task folder


class TaskFormatError(ValueError):
    """A task folder that cannot be imported; the message names the file and the field."""

    def __init__(self, path: Path, problem: str):
        super().__init__(f"{path}: {problem}")
        self.path, self.problem = path, problem


class TaskFormat(ABC):
    """One task-folder format. `marker` is the file whose presence makes a folder one of its tasks;
    `source` is the `EnvSpec.source` of what it imports (its environments' yield is counted by it): its
    name unless the format says otherwise."""

    name: ClassVar[str]
    marker: ClassVar[str]

    @property
    def source(self) -> str:
        return self.name

    def recognises(self, folder: Path) -> bool:
        return (Path(folder) / self.marker).exists()

    @abstractmethod
    def read(self, folder: Path) -> EnvSpec:
        """The folder as an EnvSpec; raises TaskFormatError naming the file and the field."""

    def write(self, env: EnvSpec, dest: Path, base_image: str) -> Path:
        raise NotImplementedError(f"format {self.name!r} cannot export environments")


def read_file(path: Path, what: str) -> str:
    if not path.is_file():
        raise TaskFormatError(path, f"missing ({what})")
    try:
        return path.read_text()
    except UnicodeDecodeError:
        raise TaskFormatError(path, f"not UTF-8 text ({what})") from None


def check_links(folder: Path) -> None:
    """A symlink in a task folder that leads outside it is malformed (never followed)."""
    root = Path(folder).resolve()
    for p in Path(folder).rglob("*"):
        if p.is_symlink():
            target = p.resolve()
            if target != root and root not in target.parents:
                raise TaskFormatError(p, f"symlink to {target} leads outside the task folder")


def file_specs(folder: Path, exclude: set[str] = frozenset(), blobs: BlobStore | None = None,
           carried: list[Blob] | None = None) -> list[FileSpec]:
    """The text files below `folder` (the importer has checked the task folder's links: `check_links`).
    With `blobs`, a binary file (or one over MAX_FILE, up to MAX_BLOB) is put in that content-addressed
    store and appended to `carried` as a `Blob`; without, it is an error naming the file."""
    out = []
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder).as_posix()
        if not p.is_file() or rel in exclude or any(rel.startswith(e + "/") for e in exclude):
            continue
        size, mode = p.stat().st_size, 0o755 if p.stat().st_mode & 0o111 else 0o644
        if size > (MAX_BLOB if blobs is not None else MAX_FILE):
            raise TaskFormatError(p, f"file larger than {MAX_BLOB if blobs is not None else MAX_FILE} bytes")
        data = p.read_bytes()
        try:
            if size > MAX_FILE or b"\0" in data:
                raise UnicodeDecodeError("utf-8", data[:1], 0, 1, "binary")
            content = data.decode()
        except UnicodeDecodeError:
            if blobs is None or carried is None:
                raise TaskFormatError(p, "binary file: only the build context (environment/) may hold binary "
                                         "files") from None
            carried.append(Blob(path=rel, sha256=blobs.put(data), size=size, mode=mode))
            continue
        out.append(FileSpec(path=rel, content=content, mode=mode))
    return out


def workdir_of(dockerfile: str, explicit: str | None, where: Path) -> str:
    """The declared work dir (else the Dockerfile's last WORKDIR, else /app), checked: absolute,
    normalised, plain characters, not a system directory."""
    workdir = explicit or (WORKDIR_LINE.findall(dockerfile) or ["/app"])[-1]
    try:
        return check_workdir(workdir)
    except ValueError as err:
        raise TaskFormatError(where, str(err)) from None


def folder_env_id(kind: str, folder: Path, spec_parts: list[str]) -> str:
    """`<kind>-<folder name>-<64 bits of the content hash>`: anyone can name a folder, so the hash must be
    too long to search for a collision with another folder's id (32 bits took minutes)."""
    digest = hashlib.sha256("\n".join(spec_parts).encode()).hexdigest()[:16]
    return f"{kind}-{safe_name(folder.name)}-{digest}"


def parse_meta(path: Path, loads, error: type[Exception], kind: str):
    try:
        return loads(read_file(path, "task metadata"))
    except error as err:
        raise TaskFormatError(path, f"not valid {kind}: {err}") from None


def yaml_mapping(path: Path) -> dict:
    """A task format's YAML metadata file, which must hold a mapping (TaskFormatError naming the file)."""
    import yaml

    meta = parse_meta(path, yaml.safe_load, yaml.YAMLError, "YAML")
    if not isinstance(meta, dict):
        raise TaskFormatError(path, "expected a mapping at the top level")
    _bounded(meta, path)
    return meta


def _bounded(value, path: Path, most: int = MAX_VALUES) -> None:
    """TaskFormatError when `value` holds more than `most` values counted as written out: YAML aliases
    share one object, so a small file can stand for billions of values (everything that serializes the
    metadata, JSON for one, writes each of them)."""
    seen, text, stack = 0, 0, [value]
    while stack:
        item = stack.pop()
        seen += 1
        text += len(item) if isinstance(item, str) else 0
        if seen > most:
            raise TaskFormatError(path, f"holds more than {most} values once its YAML aliases are expanded")
        if text > MAX_TEXT:
            raise TaskFormatError(path, f"holds more than {MAX_TEXT} characters of text once its YAML aliases are "
                                        "expanded")
        if isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)


def instruction_text(value, path: Path) -> str:
    """The task instruction: a non-empty string (TaskFormatError naming the file and the field)."""
    if not isinstance(value, str) or not value.strip():
        raise TaskFormatError(path, "field `instruction` is missing or empty")
    return value


def number(value, path: Path, field: str, most: float) -> float | None:
    """A task's own timeout in seconds: positive and at most `most` (TaskFormatError naming the field)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise TaskFormatError(path, f"{field} must be a positive number, got {value!r}")
    if value > most:
        raise TaskFormatError(path, f"{field} is {value:g} s, over the {most:g} s a task may set for itself")
    return float(value)


def check_size(folder: Path) -> None:
    """A task folder holds at most MAX_TASK bytes and MAX_FILES entries, before anything is read: every
    entry counts its path's bytes, and a symlink the size of what it points at (the import reads a link
    inside the folder as a file: three links to one file are four files' bytes). A larger one is
    malformed, naming its largest file."""
    total, count, largest = 0, 0, (0, Path(folder))
    for p in Path(folder).rglob("*"):
        count += 1
        if count > MAX_FILES:
            raise TaskFormatError(Path(folder), f"the task folder holds more than {MAX_FILES} files and folders")
        size = len(p.relative_to(folder).as_posix().encode())
        if p.is_file():  # follows a link (links leading outside are refused by check_links)
            size += p.stat().st_size
        total += size
        largest = max(largest, (size, p))
    if total > MAX_TASK:
        raise TaskFormatError(Path(folder), f"the task folder holds {total / (1 << 20):.1f} MiB, over the "
                                            f"{MAX_TASK >> 20} MiB a task may hold (largest: "
                                            f"{largest[1].relative_to(folder)}, {largest[0] / (1 << 20):.1f} MiB)")


def folder_digest(root: Path) -> str:
    """Content hash of everything under `root` (a changed task re-runs what depends on it); a symlink
    counts by its target's name, never by what it points at."""
    h = hashlib.sha256()

    def field(kind: bytes, data: bytes) -> None:  # length-prefixed: no two folders give one byte stream
        h.update(kind + len(data).to_bytes(8, "big") + data)

    for p in sorted(Path(root).rglob("*")):
        if p.is_symlink():
            field(b"L", p.relative_to(root).as_posix().encode())
            field(b"T", str(p.readlink()).encode())
        elif p.is_file():
            field(b"F", p.relative_to(root).as_posix().encode())
            try:
                field(b"D", p.read_bytes())
            except OSError as err:  # unreadable: the import rejects the folder; the digest still exists
                field(b"E", err.__class__.__name__.encode())
    return h.hexdigest()[:16]
