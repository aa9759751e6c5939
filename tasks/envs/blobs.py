"""Content-addressed blobs: the bytes of binary files of imported tasks, kept by sha256, never in a spec.

A spec names a binary build-context file by `Blob(path, sha256, size, mode)`; its bytes live at
`<root>/<sha[:2]>/<sha>` of a blob store (any fsspec URL). The root is `TRAJFORGE_BLOB_STORE`, else
`~/.cache/trajforge/blobs` (set the variable to a shared URL, e.g. `s3://…/blobs`, when builds run on
several hosts). Invariants: a blob is written once, atomically (temporary name, then rename), and
read back only if its bytes hash to its name; the same bytes are stored once whoever imports them.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
import uuid
from pathlib import Path

import fsspec

ENV_VAR = "TRAJFORGE_BLOB_STORE"


class BlobMissing(LookupError):
    """A blob a spec names is not in the store (or its bytes do not match its hash)."""


def default_root() -> str:
    return os.environ.get(ENV_VAR) or str(Path.home() / ".cache" / "trajforge" / "blobs")


class BlobStore:
    def __init__(self, root: str | None = None):
        self.url = root or default_root()
        self.fs, self.root = fsspec.core.url_to_fs(self.url)

    def path(self, sha: str) -> str:
        return posixpath.join(self.root, sha[:2], sha)

    def has(self, sha: str) -> bool:
        return self.fs.exists(self.path(sha))

    def put(self, data: bytes) -> str:
        """Store `data`; returns its sha256 (a no-op when present)."""
        sha = hashlib.sha256(data).hexdigest()
        dest = self.path(sha)
        if not self.fs.exists(dest):
            self.fs.makedirs(posixpath.dirname(dest), exist_ok=True)
            tmp = f"{dest}.tmp-{uuid.uuid4().hex[:8]}"
            with self.fs.open(tmp, "wb") as f:
                f.write(data)
            self.fs.mv(tmp, dest)
        return sha

    def get(self, sha: str) -> bytes:
        try:
            with self.fs.open(self.path(sha), "rb") as f:
                data = f.read()
        except FileNotFoundError:
            raise BlobMissing(f"blob {sha[:16]}… is not in the blob store {self.url} (import the task again, or "
                              f"point {ENV_VAR} at the store it was imported into)") from None
        if hashlib.sha256(data).hexdigest() != sha:
            raise BlobMissing(f"blob {sha[:16]}… in {self.url} does not match its hash (corrupt: delete it and "
                              "import the task again)")
        return data
