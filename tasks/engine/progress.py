"""Live progress of running shards (operational: no stage fingerprints this module).

Each shard writes `<stage dir>/_progress/<shard>.json` at most every `every_s` seconds; the flow's
driver sums these files. It works the same on a laptop, a cluster and S3.
"""

from __future__ import annotations

import contextlib
import posixpath
import time
from typing import Any

from .contract import sum_counters
from .store import RunStore


class ProgressWriter:
    def __init__(self, store: RunStore, path: str, every_s: float = 1.5):
        self.store, self.path, self.every_s, self.last = store, path, every_s, 0.0

    def write(self, counters: dict[str, Any], force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last >= self.every_s:
            self.last = now
            try:
                self.store.write_json(self.path, counters)
            except Exception:  # progress is best effort: never fail a shard over it
                pass


def progress_path(plan_dir: str, shard_name: str) -> str:
    return posixpath.join(plan_dir, "_progress", f"{shard_name}.json")


def read_progress(store: RunStore, plan_dir: str) -> dict[str, Any]:
    """The live counters of all shards of a stage, summed (a file being replaced is skipped)."""
    counters = []
    with contextlib.suppress(Exception):
        for p in store.fs.glob(posixpath.join(plan_dir, "_progress", "*.json")):
            with contextlib.suppress(Exception):
                counters.append(store.read_json(p))
    return sum_counters(counters)
