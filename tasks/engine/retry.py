"""Infrastructure outcomes are never final: what the engine does with a stage's retryable rows.

A stage says which of a shard's rows and rejects are infrastructure outcomes (`Stage.retryable`,
e.g. rollout's `teacher_error` / `infra_error` episodes) and how to re-run just those
(`Stage.retry_shard`). The engine then:

- counts them in the shard's `_done` marker (`retryable`, with the first errors in `retry_errors`);
- on every later run of the stage before its commit (a resume), treats a shard whose marker counts
  any as pending, re-runs those rows only and keeps every other row as it was;
- fails the gate when their share of the stage's output exceeds `gate.max_infra_share`;
- reopens a committed output for `trajforge rerun` (or when its share exceeds the current
  `gate.max_infra_share`): the output is copied into this build, re-run there, and committed again
  with `revision + 1`, which changes what downstream fingerprints hash.
"""

from __future__ import annotations

import posixpath
from typing import Any

import pyarrow as pa

from ...schemas.arrow import to_table
from ...schemas.common import Reject
from .contract import Manifest, Shard, ShardResult, Stage, StageContext
from .store import RunStore

REVISION_FILE = "_revision.json"  # in a reopened stage folder: the revision its next commit gets
FIRST_ERRORS = 3  # errors kept per shard marker and named by a failed gate


def marker_path(plan_dir: str, shard: Shard) -> str:
    return posixpath.join(plan_dir, "_done", shard.name)


def needs_run(store: RunStore, plan_dir: str, shard: Shard) -> bool:
    """A shard runs when it has no marker, or its marker counts retryable outcomes."""
    marker = marker_path(plan_dir, shard)
    return not store.exists(marker) or bool(store.read_json(marker).get("retryable"))


def rerun_retryable(stage: Stage, ctx: StageContext, plan_dir: str, shard: Shard, upstream: dict[str, Manifest],
                    info: dict[str, Any]) -> tuple[ShardResult, int]:
    """The shard's output with its retryable rows re-run (every other row kept as it was, in place)
    and how many outcomes were re-run. The retryable rows are found in the part itself, not taken
    from the marker: a crash after the part was rewritten re-runs nothing twice."""
    store = ctx.store
    old = store.read_table([posixpath.join(plan_dir, info["part"])], stage.output)
    reject_file = posixpath.join(plan_dir, "_rejects", f"{shard.name}.parquet")
    old_rejects = store.read_records([reject_file], Reject) if info.get("rejects") and store.exists(reject_file) else []
    found = stage.retryable(old, old_rejects)
    if not found.count:
        return ShardResult(old, old_rejects, info.get("stats", {})), 0
    again = stage.retry_shard(ctx, shard, upstream, old.take(pa.array(found.rows, pa.int64())),
                              [old_rejects[i] for i in found.rejects])
    if again is None:  # the stage re-runs whole shards
        return stage.run_shard(ctx, shard, upstream), found.count
    new = to_table(stage.output, again.rows)
    both = pa.concat_tables([old, new])
    if new.num_rows == len(found.rows):  # each replacement takes its row's place
        at = dict(zip(found.rows, range(old.num_rows, both.num_rows)))
        order = [at.get(i, i) for i in range(old.num_rows)]
    else:  # kept rows first, then the new ones
        dropped = set(found.rows)
        order = [i for i in range(old.num_rows) if i not in dropped] + list(range(old.num_rows, both.num_rows))
    merged = both.take(pa.array(order, pa.int64()))
    skip = set(found.rejects)
    rejects = [r for i, r in enumerate(old_rejects) if i not in skip] + list(again.rejects)
    return ShardResult(merged, rejects, stage.retry_stats(info.get("stats", {}), again.stats, merged)), found.count


def reopen(store: RunStore, committed: Manifest, out_dir: str, bump: bool = True) -> None:
    """Make a committed output this build's pending stage again, to re-run its retryable rows (`bump`:
    its next commit is a new revision) or only its gate (the rows stay what they were: same revision):
    copy it into `out_dir` (unless it is there already), note the revision its next commit gets, and
    remove the manifest of the copy (last). Another build's folder is never modified."""
    store.write_json(posixpath.join(out_dir, REVISION_FILE), {"revision": committed.revision + int(bump),
                                                              "of": committed.dir})
    if committed.dir.rstrip("/") != out_dir.rstrip("/"):
        src = committed.dir.rstrip("/")
        for path in store.fs.find(src):
            rel = posixpath.relpath(path, src)
            if rel in ("manifest.json", REVISION_FILE) or ".tmp-" in rel:
                continue
            store.fs.makedirs(posixpath.dirname(posixpath.join(out_dir, rel)), exist_ok=True)
            store.fs.copy(path, posixpath.join(out_dir, rel))
    store.remove(posixpath.join(out_dir, "manifest.json"))


def revision(store: RunStore, plan_dir: str) -> int:
    """The revision a commit of `plan_dir` gets (0 unless the folder was reopened)."""
    path = posixpath.join(plan_dir, REVISION_FILE)
    return int(store.read_json(path)["revision"]) if store.exists(path) else 0


def infra_failure(stage: str, infos: list[dict[str, Any]], units: int, limit: float) -> dict[str, Any] | None:
    """A gate failure when the retryable outcomes of the shards (`infos`: their markers) exceed
    `limit` of the stage's `units` (rows + rejects); None when within it."""
    n = sum(i.get("retryable", 0) for i in infos)
    share = n / units if units else 0.0
    if share <= limit:
        return None
    errors = [e for i in infos for e in i.get("retry_errors", [])][:FIRST_ERRORS]
    message = (f"infrastructure failures in {n} of {units} outputs ({share:.1%}) exceed gate.max_infra_share "
               f"{limit:.1%}; they are re-run when the stage runs again; first errors: "
               + " | ".join(errors or ["(none recorded)"]))
    return {"expectation": "max_infra_share", "kwargs": {"max": limit}, "unexpected": [round(share, 6)],
            "errors": errors, "message": message}
