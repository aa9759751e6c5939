"""`trajforge explain`: why each stage of a build was or was not reused.

A stage is reused when a committed manifest with the same fingerprint exists in any build of the
dataset. Otherwise we compare its fingerprint components (config section hash, code version, the
content digests of the upstream outputs it reads) with the most recent committed output of that stage
with another fingerprint (in this build or another). A gate
beyond a plain pass is shown under its stage: failures with their observed value, threshold and
first offending rows, expectations accepted on purpose (`--accept-gate`) or disabled by the config.
"""

from __future__ import annotations

from ..tasks.engine.store import RunStore
from ..tasks.pipeline import STAGE_NAMES


def _previous(store: RunStore, stage: str, exclude_fp: str, build_id: str) -> dict | None:
    """The newest committed manifest of `stage` with another fingerprint: this build's own earlier output
    first (a stage re-run inside the build), else the newest of another build."""
    found = [store.read_json(p) for p in store.committed_manifests(stage)]
    found = [m for m in found if m["fingerprint"] != exclude_fp]
    own = sorted((m for m in found if m["build_id"] == build_id), key=lambda m: m.get("created_at", ""), reverse=True)
    return (own or found or [None])[0]


def _same_fp_before(store: RunStore, stage: str, fp: str, build_id: str) -> dict | None:
    """The newest committed manifest of (stage, fp) in another build (what a forced run is compared with)."""
    for path in store.committed_manifests(stage):
        m = store.read_json(path)
        if m["fingerprint"] == fp and m["build_id"] != build_id:
            return m
    return None


def _short(content_id: str | None) -> str:
    return (content_id or "?").removeprefix("d:")[:12]


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
        out.append(_why(store, rec, name, e, build_id))
        out += gate_lines(e.gate)
    return out


def gate_lines(gate: dict | None) -> list[str]:
    """A stage's gate beyond a plain pass: failures (name, observed, threshold, rows), expectations
    accepted on purpose, disabled by the config (with the reason), changed thresholds, a re-gate."""
    gate = gate or {}
    lines = [f"    gate FAILED: {f['line']}" for f in gate.get("failures", [])]
    if gate.get("failures"):
        names = " ".join(f"--accept-gate {f['name']}" for f in gate["failures"])
        lines.append(f"    (its output stays on disk; commit it on purpose with {names})")
    lines += [f"    gate accepted on purpose: {a['line']}" for a in gate.get("accepted", [])]
    lines += [f"    gate expectation {n} disabled: {why}" for n, why in gate.get("disabled", {}).items()]
    lines += [f"    gate threshold {n} set by the config: {v}" for n, v in gate.get("overridden", {}).items()]
    if gate.get("regated"):
        lines.append("    only its gate ran again (the effective suite changed; the rows were kept)")
    return lines


def _why(store: RunStore, rec, name: str, e, build_id: str) -> str:
    """Why the stage instance was reused or ran."""
    fp, comp = e.fingerprint, e.components
    head = f"- {name} [{fp}]: "
    if (e.gate or {}).get("regated"):
        return head + (f"RE-GATED ({e.status}): the same fingerprint was committed before under another gate "
                       f"(gate {comp.get('gate', '?')}): its rows were kept, only the gate ran again")
    note = f" ({e.note})" if e.note else ""
    if e.status == "stale":
        return head + f"STALE: committed earlier in this build, but {e.note or 'a stage it reads now holds other rows'}"
    if e.status == "reused":
        return head + (f"REUSED: the same fingerprint was committed in build {e.reused_from} "
                       f"(config {comp['config'][:8]}, code {comp['code']}, upstream rows unchanged)")
    if name in rec.forced:
        return head + f"RAN ({e.status}): forced with --force {name}" + _forced_outcome(store, e, name, fp, build_id) + note
    prev = _previous(store, name, fp, build_id)
    if prev is None:
        return head + f"RAN ({e.status}): no committed output of this stage existed before"
    old = prev["components"]
    why = []
    if old["config"] != comp["config"]:
        why.append("its config section changed")
    if old["code"] != comp["code"]:
        why.append(f"its code changed ({old['code']} -> {comp['code']})")
    changed = [u for u in comp["upstream"] if old["upstream"].get(u) != comp["upstream"][u]]
    if changed:
        why.append("upstream output changed: " + ", ".join(
            f"{u} (digest {_short(old['upstream'].get(u))} -> {_short(comp['upstream'][u])})" for u in changed))
    return head + (f"RAN ({e.status}): vs build {prev['build_id']} [{prev['fingerprint']}]: "
                   + ("; ".join(why) or "fingerprint differs")) + note


def _forced_outcome(store: RunStore, e, name: str, fp: str, build_id: str) -> str:
    """After a forced run: whether it wrote the same rows as the output it replaced (then what reads it
    is reused), or other rows (then what reads it runs again)."""
    if not e.manifest or not store.exists(f"{e.manifest.rstrip('/')}/manifest.json"):
        return ""
    mine = store.read_json(f"{e.manifest.rstrip('/')}/manifest.json").get("digest")
    before = _same_fp_before(store, name, fp, build_id)
    if not mine or before is None or not before.get("digest"):
        return ""
    if before["digest"] == mine:
        return f"; it wrote the same rows as build {before['build_id']} (digest {mine[:12]}): what reads them is reused"
    return (f"; it wrote other rows than build {before['build_id']} (digest {before['digest'][:12]} -> {mine[:12]}): "
            "what reads them runs again")
