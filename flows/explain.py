"""`trajforge explain`: why each stage of a build was or was not reused.

A stage is reused when a committed manifest with the same fingerprint exists in any build of the
dataset. Otherwise we compare its fingerprint components (config section hash, code version,
upstream fingerprints) with the most recent committed output of that stage elsewhere.
"""

from __future__ import annotations

from ..tasks.engine.store import RunStore
from ..tasks.pipeline import STAGE_NAMES


def _previous(store: RunStore, stage: str, exclude_fp: str, before: str) -> dict | None:
    """The newest committed manifest of `stage` in another build, with another fingerprint."""
    for path in store.committed_manifests(stage):
        m = store.read_json(path)
        if m["build_id"] != before and m["fingerprint"] != exclude_fp:
            return m
    return None


def explain_build(store: RunStore, build_id: str) -> list[str]:
    rec = store.read_build(build_id)
    if rec is None:
        raise ValueError(f"build {build_id!r} not found under {store.url(store.root)}")
    out = [f"build {build_id} ({rec.status}), stages selected: {', '.join(rec.selected)}"
           + (f", forced: {', '.join(rec.forced)}" if rec.forced else "")]
    for name in STAGE_NAMES:
        e = rec.stages.get(name)
        if not e:
            out.append(f"- {name}: not part of this build run")
            continue
        fp, comp = e.fingerprint, e.components
        head = f"- {name} [{fp}]: "
        if e.status == "reused":
            out.append(head + f"REUSED: the same fingerprint was committed in build {e.reused_from} "
                       f"(config {comp['config'][:8]}, code {comp['code']}, upstream unchanged)")
            continue
        if name in rec.forced:
            out.append(head + f"RAN ({e.status}): forced with --force {name}")
            continue
        prev = _previous(store, name, fp, build_id)
        if prev is None:
            out.append(head + f"RAN ({e.status}): no committed output of this stage existed before")
            continue
        old = prev["components"]
        why = []
        if old["config"] != comp["config"]:
            why.append("its config section changed")
        if old["code"] != comp["code"]:
            why.append(f"its code changed ({old['code']} -> {comp['code']})")
        changed = [u for u in comp["upstream"] if old["upstream"].get(u) != comp["upstream"][u]]
        if changed:
            why.append(f"upstream output changed: {', '.join(changed)}")
        out.append(head + f"RAN ({e.status}): vs build {prev['build_id']} [{prev['fingerprint']}]: "
                   + ("; ".join(why) or "fingerprint differs"))
    return out
