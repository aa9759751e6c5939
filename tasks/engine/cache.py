"""The host's trajforge cache: `$TRAJFORGE_CACHE`, else `~/.cache/trajforge`. Everything trajforge keeps between
processes on a host lives under it (the embedded model, wheels, fetched repositories, import journals, code facts);
nothing in it is needed for correctness: an empty cache is a fresh machine, only slower."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """The cache folder, resolved at call time (tests and CI point it elsewhere per process)."""
    return Path(os.environ.get("TRAJFORGE_CACHE", "~/.cache/trajforge")).expanduser()
