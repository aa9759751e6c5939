"""The engine that runs any stage: plan -> shards -> gate -> manifest.

fingerprint = sha256(stage config section, stage code version, upstream fingerprints).
Same fingerprint + a committed manifest anywhere in the dataset => the stage is reused.
Invariants: a shard's Parquet part is written before its `_done` marker; the manifest is written
last and only when the gate passed; a forced re-run starts from nothing in this build only.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import posixpath
import socket
import time
from dataclasses import dataclass
from typing import Any

from ...schemas.common import Reject
from .codeversion import modules_digest
from .contract import GateFailed, Manifest, Shard, Stage, StageContext
from .progress import ProgressWriter, progress_path


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint_components(stage: Stage, ctx: StageContext, upstream_fps: dict[str, str]) -> dict[str, Any]:
    extra = ctx.config.gate.extra.get(stage.name, [])
    components = {
        "config": _sha([stage.config_section(ctx.config), extra]),
        "code": stage.code_version(),
        "upstream": dict(sorted(upstream_fps.items())),
    }
    if ctx.config.plugins:  # a plugin may change any stage (a backend, a family, a format): all count
        components["plugins"] = modules_digest(list(ctx.config.plugins))
    return components


def fingerprint(components: dict[str, Any]) -> str:
    return _sha(components)[:16]


@dataclass
class StagePlan:
    """Everything the flow needs to run or reuse a stage."""

    stage: str
    fingerprint: str
    components: dict[str, Any]
    dir: str
    reused: Manifest | None
    shards: list[Shard]
    pending: list[Shard]


def prepare(stage: Stage, ctx: StageContext, upstream: dict[str, Manifest], force: bool = False,
            plan_shards: bool = True) -> StagePlan:
    """Fingerprint the stage, reuse a committed output if any, else list the shards still to run
    (only when `plan_shards`: a stage that is merely resolved is never planned)."""
    missing = set(stage.requires) - set(upstream)
    if missing:
        raise RuntimeError(f"stage {stage.name!r} needs the committed output of {sorted(missing)}")
    # every manifest the flow hands over counts (e.g. all verify rounds for an adaptive calibrate)
    components = fingerprint_components(stage, ctx, {n: m.fingerprint for n, m in upstream.items()})
    fp = fingerprint(components)
    out_dir = ctx.store.stage_dir(ctx.build_id, stage.name, fp)
    if not force:
        found = ctx.store.find_committed(stage.name, fp)
        if found:
            m = Manifest.model_validate(ctx.store.read_json(found))
            return StagePlan(stage.name, fp, components, m.dir, m, [], [])
    if not plan_shards:
        return StagePlan(stage.name, fp, components, out_dir, None, [], [])
    if force:
        ctx.store.remove(out_dir)  # a forced re-run starts from nothing, in this build only
    shards = stage.plan(ctx, upstream)
    pending = [s for s in shards if not ctx.store.exists(posixpath.join(out_dir, "_done", s.name))]
    return StagePlan(stage.name, fp, components, out_dir, None, shards, pending)


def execute_shard(stage: Stage, ctx: StageContext, plan_dir: str, shard: Shard,
                  upstream: dict[str, Manifest]) -> dict[str, Any]:
    """Run one shard and persist it: Parquet, then rejects, then the `_done` marker (last).

    Idempotent: a shard whose marker exists is skipped; a shard that crashed before its marker is
    simply redone, overwriting the same part file (rows keep deterministic ids: no duplicates)."""
    marker = posixpath.join(plan_dir, "_done", shard.name)
    if ctx.store.exists(marker):
        return ctx.store.read_json(marker)
    t0, started = time.monotonic(), time.time()
    ctx.reporter = ProgressWriter(ctx.store, progress_path(plan_dir, shard.name))
    result = stage.run_shard(ctx, shard, upstream)
    part = stage.part_path(shard, posixpath.basename(plan_dir))
    n = ctx.store.write_records(posixpath.join(plan_dir, part), stage.output, result.rows)
    if result.rejects:
        ctx.store.write_rejects(posixpath.join(plan_dir, "_rejects", f"{shard.name}.parquet"), result.rejects)
    info = {"shard": shard.name, "part": part, "rows": n, "rejects": len(result.rejects),
            "stats": result.stats, "seconds": round(time.monotonic() - t0, 3),
            "started_at": round(started, 3), "finished_at": round(time.time(), 3),
            "worker": f"{socket.gethostname()}:{os.getpid()}"}
    ctx.store.write_json(marker, info)
    return info



def commit(stage: Stage, ctx: StageContext, plan: StagePlan, upstream: dict[str, "Manifest"] | None = None) -> Manifest:
    """Check every shard is done, merge rejects and stats, run the gate, write the manifest last."""
    from ...expectations.gate import run_gate  # GE import is heavy: only where a gate runs

    store = ctx.store
    infos = []
    for s in plan.shards:
        marker = posixpath.join(plan.dir, "_done", s.name)
        if not store.exists(marker):
            raise RuntimeError(f"stage {stage.name}: shard {s.name} has no completion marker")
        infos.append(store.read_json(marker))
    parts = [posixpath.join(plan.dir, i["part"]) for i in infos]
    reject_parts = [posixpath.join(plan.dir, "_rejects", f"{i['shard']}.parquet") for i in infos if i["rejects"]]
    rejects = store.read_table(reject_parts, Reject)
    store.write_table(posixpath.join(plan.dir, "rejects.parquet"), rejects)
    reasons: dict[str, int] = {}
    for r in rejects.column("reason").to_pylist():
        reasons[r] = reasons.get(r, 0) + 1
    stats = stage.summarize(ctx, [i["stats"] for i in infos])
    stats.update(rows=sum(i["rows"] for i in infos), rejects=rejects.num_rows, reject_reasons=reasons,
                 shard_seconds=round(sum(i["seconds"] for i in infos), 3))
    store.write_json(posixpath.join(plan.dir, "stats.json"), stats)

    table = store.read_table(parts, stage.output)
    report = run_gate(stage.name, table, stats, ctx.config.gate.extra.get(stage.name, []))
    store.write_json(posixpath.join(plan.dir, "gate.json"), report)
    if not report["success"]:
        failed = "; ".join(f"{f['expectation']}({f['kwargs']}) unexpected={f['unexpected']}" for f in report["failures"])
        raise GateFailed(f"gate of stage {stage.name!r} failed, nothing committed "
                         f"(report: {store.url(posixpath.join(plan.dir, 'gate.json'))}): {failed}")
    stage.finalize(ctx, plan.dir, stats, upstream or {})
    store.write_json(posixpath.join(plan.dir, "stats.json"), stats)  # finalize may add to them
    manifest = Manifest(stage=stage.name, fingerprint=plan.fingerprint, build_id=ctx.build_id, dir=plan.dir,
                        parts=parts, rows=stats["rows"], rejects=rejects.num_rows, reject_reasons=reasons,
                        stats=stats, components=plan.components,
                        gate={"success": True, "evaluated": report["evaluated"]},
                        created_at=dt.datetime.now(dt.timezone.utc).isoformat())
    store.write_json(posixpath.join(plan.dir, "manifest.json"), manifest.model_dump(mode="json"))
    return manifest


def read_output(ctx: StageContext, stage: Stage, manifest: Manifest) -> list:
    return ctx.store.read_records(manifest.parts, stage.output)
