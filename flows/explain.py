"""`trajforge explain`: why each stage of a build was or was not reused.

A stage is reused when a committed manifest with the same fingerprint exists in any build of the
dataset. Otherwise we compare its fingerprint components (config section hash, code version,
upstream fingerprints) with the most recent committed output of that stage elsewhere. A gate
beyond a plain pass is shown under its stage: failures with their observed value, threshold and
first offending rows, expectations accepted on purpose (`--accept-gate`) or disabled by the config.
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
    if e.status == "reused":
        return head + (f"REUSED: the same fingerprint was committed in build {e.reused_from} "
                       f"(config {comp['config'][:8]}, code {comp['code']}, upstream unchanged)")
    if name in rec.forced:
        return head + f"RAN ({e.status}): forced with --force {name}"
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
        why.append(f"upstream output changed: {', '.join(changed)}")
    return head + (f"RAN ({e.status}): vs build {prev['build_id']} [{prev['fingerprint']}]: "
                   + ("; ".join(why) or "fingerprint differs"))
