"""The engine that runs any stage: plan -> shards -> gate -> manifest.

fingerprint = sha256(stage config section, stage code version, upstream content digests): what decides
the rows. An upstream output counts by what it holds (its manifest's `digest`, engine.digest), never by
its own fingerprint: a forced or sampling re-run that wrote other rows re-runs every stage that reads
them, one that wrote the same rows lets them be reused. A committed output whose part files are not the
bytes it committed (`manifest.files`) is never reused: the stage runs again. The gate has its own hash (components["gate"]: the effective suites, see `gate_suites`),
recorded in the manifest and not part of the fingerprint: a changed threshold keeps the folder, the
shards and every downstream fingerprint, and only re-runs the commit ("re-gate").
Same fingerprint + a committed manifest anywhere in the dataset + the same gate hash => the stage is
reused; another gate hash => the output is re-gated in this build (copied when it was another's).
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

from ...schemas.arrow import arrow_schema, to_table
from ...schemas.common import Reject
from .codeversion import modules_digest
from .contract import GateFailed, Manifest, Shard, Stage, StageContext
from .digest import modified_parts, parts_digest, table_digest
from .lease import RUNTIME_KEY, fence
from .progress import ProgressWriter, progress_path
from .retry import FIRST_ERRORS, infra_failure, marker_path, needs_run, reopen, rerun_retryable, revision


def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def gate_suites(stage: Stage, config) -> dict[str, dict[str, Any]]:
    """The effective suites the commit of `stage` runs (its own, and its configs' as `export.sft`):
    versioned defaults, facts from `config`, `gates.<suite>` overrides, `gate.extra`."""
    from ...expectations.figures import GateFacts
    from ...expectations.gate import effective_suite, suite_names

    facts = GateFacts.of(config)
    return {n: effective_suite(n, config.gates.get(n), config.gate.extra.get(n, []), facts)
            for n in suite_names() if n == stage.name or n.startswith(stage.name + ".")}


def gate_hash(suites: dict[str, dict[str, Any]]) -> str:
    return _sha(suites)[:16]


def fingerprint_components(stage: Stage, ctx: StageContext, upstream_fps: dict[str, str]) -> dict[str, Any]:
    components = {
        # `[section, []]`: the form fingerprints had when `gate.extra` was hashed here (reuse is kept)
        "config": _sha([stage.config_section(ctx.config), []]),
        "code": stage.code_version(),
        "upstream": dict(sorted(upstream_fps.items())),
    }
    if ctx.config.plugins:  # a plugin may change any stage (a backend, a family, a format): all count
        components["plugins"] = modules_digest(list(ctx.config.plugins))
    components["gate"] = gate_hash(gate_suites(stage, ctx.config))
    return components


def fingerprint(components: dict[str, Any]) -> str:
    """What decides the rows (the gate hash is left out: see the module docstring)."""
    return _sha({k: v for k, v in components.items() if k != "gate"})[:16]


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
    regate: bool = False  # a committed output whose gate hash changed: only its commit runs again
    note: str | None = None  # why a committed output with this fingerprint was not reused (changed after commit)


def prepare(stage: Stage, ctx: StageContext, upstream: dict[str, Manifest], force: bool = False,
            plan_shards: bool = True, retry: bool = False) -> StagePlan:
    """Fingerprint the stage, reuse a committed output if any, else list the shards still to run
    (only when `plan_shards`: a stage that is merely resolved is never planned): those with no
    marker and those whose marker counts infrastructure outcomes (re-run, never final).

    `retry` (`trajforge rerun`): a committed output holding infrastructure outcomes is reopened in
    this build and only those are re-run; so is one whose share exceeds the current
    `gate.max_infra_share` (the threshold is not fingerprinted: it changes no row). A committed output
    whose gate hash differs from the current one (a threshold changed) is reopened with no shard
    pending: only its gate runs again, and its revision (what downstream hashes) stays."""
    missing = set(stage.requires) - set(upstream)
    if missing:
        raise RuntimeError(f"stage {stage.name!r} needs the committed output of {sorted(missing)}")
    # every manifest the flow hands over counts (e.g. all verify rounds for an adaptive calibrate)
    components = fingerprint_components(stage, ctx, {n: m.content_id for n, m in upstream.items()})
    fp = fingerprint(components)
    out_dir = ctx.store.stage_dir(ctx.build_id, stage.name, fp)
    regate, note = False, None
    if not force:
        m, note = intact_committed(ctx, stage, fp)
        if note and m is None and not plan_shards:
            raise RuntimeError(f"stage {stage.name!r}: {note}; run it again (e.g. --from {stage.name})")
        if note and m is None and ctx.store.exists(posixpath.join(out_dir, "manifest.json")):
            ctx.store.remove(out_dir)  # this build's own changed copy: redone from nothing, like --force
        if m is not None:
            too_many = m.stats.get("infra_share", 0.0) > ctx.config.gate.max_infra_share
            rerun_infra = bool(m.stats.get("infra", 0)) and (retry or too_many)
            stale_gate = m.gate.get("suite") != components["gate"]
            if not plan_shards or not (rerun_infra or stale_gate):
                return StagePlan(stage.name, fp, components, m.dir, m, [], [], note=note)
            reopen(ctx.store, m, out_dir, bump=rerun_infra)
            regate = not rerun_infra
    if not plan_shards:
        return StagePlan(stage.name, fp, components, out_dir, None, [], [], note=note)
    if force:
        ctx.store.remove(out_dir)  # a forced re-run starts from nothing, in this build only
    shards = stage.plan(ctx, upstream)
    # a re-gate only commits again: the rows stay what they were (their revision, what downstream hashes, too)
    pending = [] if regate else [s for s in shards if needs_run(ctx.store, out_dir, s)]
    return StagePlan(stage.name, fp, components, out_dir, None, shards, pending, regate=regate and not pending,
                     note=note)


def intact_committed(ctx: StageContext, stage: Stage, fp: str) -> tuple[Manifest | None, str | None]:
    """The newest committed output of (stage, fp) whose parts are the bytes it committed, with its content
    digest (computed from the parts for a manifest written before digests existed), and a note naming each
    newer copy passed over because a part changed after its commit (None when none was)."""
    notes = []
    for path in ctx.store.committed_copies(stage.name, fp):
        m = Manifest.model_validate(ctx.store.read_json(path))
        changed = modified_parts(ctx.store, m)
        if changed:
            notes.append(f"the committed output in build {m.build_id} was changed after its commit "
                         f"({', '.join(changed[:3])}{', …' if len(changed) > 3 else ''}): not reused")
            continue
        if not m.digest:
            m.digest = parts_digest(ctx.store, m.dir, ((posixpath.relpath(p, m.dir), None) for p in m.parts), stage.output)
        return m, "; ".join(notes) or None
    return None, "; ".join(notes) or None


def execute_shard(stage: Stage, ctx: StageContext, plan_dir: str, shard: Shard,
                  upstream: dict[str, Manifest]) -> dict[str, Any]:
    """Run one shard and persist it: Parquet, then rejects, then the `_done` marker (last).

    Idempotent: a shard whose marker exists is skipped, unless the marker counts infrastructure
    outcomes: then only those are re-run (`Stage.retry_shard`) and every other row is written back
    as it was. A shard that crashed before its marker is simply redone, overwriting the same part
    file (rows keep deterministic ids: no duplicates). The marker records `retryable` (how many
    infrastructure outcomes the part holds), `retry_errors` (the first few) and `retried` (how many
    were re-run so far).

    Fenced: under a build lease (`ctx.runtime[lease.RUNTIME_KEY]`, set by the flow), each of the three
    writes first checks that the lease is still that token's and the driver did not abandon the shard
    (`lease.fence`): a late shard of a run that was given up on commits nothing (ShardFenced)."""
    marker = marker_path(plan_dir, shard)
    token = ctx.runtime.get(RUNTIME_KEY)
    check = (lambda: fence(ctx.store, ctx.build_id, token, plan_dir, shard.name)) if token else None
    prior = ctx.store.read_json(marker) if ctx.store.exists(marker) else None
    if prior is not None and not prior.get("retryable"):
        return prior
    if check:
        check()  # (a task re-sent after its driver gave up on it: nothing to do)
    t0, started = time.monotonic(), time.time()
    ctx.reporter = ProgressWriter(ctx.store, progress_path(plan_dir, shard.name))
    if prior is None:
        result, retried = stage.run_shard(ctx, shard, upstream), 0
    else:
        result, retried = rerun_retryable(stage, ctx, plan_dir, shard, upstream, prior)
    part = stage.part_path(shard, posixpath.basename(plan_dir))
    table = to_table(stage.output, result.rows)
    digest = table_digest(table, stage.output)  # what downstream reuse is keyed on (engine.digest)
    left = stage.retryable(table, result.rejects)
    layout = stage.parquet_options(ctx)
    ctx.store.write_table(posixpath.join(plan_dir, part), table, fence=check, options=layout)
    reject_file = posixpath.join(plan_dir, "_rejects", f"{shard.name}.parquet")
    if result.rejects:
        ctx.store.write_rejects(reject_file, result.rejects, fence=check, options=layout)
    elif prior is not None and prior.get("rejects"):
        if check:
            check()
        ctx.store.remove(reject_file)  # the re-run left none: no stale file beside the part
    info = {"shard": shard.name, "part": part, "rows": table.num_rows, "rejects": len(result.rejects),
            "stats": result.stats, "digest": digest, "seconds": round(time.monotonic() - t0 + (prior or {}).get("seconds", 0), 3),
            "started_at": round(started, 3), "finished_at": round(time.time(), 3),
            "worker": f"{socket.gethostname()}:{os.getpid()}",
            "retryable": left.count, "retry_errors": [e[:300] for e in left.errors[:FIRST_ERRORS]],
            "retried": (prior or {}).get("retried", 0) + retried}
    ctx.store.write_json(marker, info, fence=check)  # the commit point of the shard
    return info



def commit(stage: Stage, ctx: StageContext, plan: StagePlan, upstream: dict[str, "Manifest"] | None = None) -> Manifest:
    """Check every shard is done, merge rejects and stats, run the gate, write the manifest last."""
    store = ctx.store
    infos = []
    for s in plan.shards:
        marker = posixpath.join(plan.dir, "_done", s.name)
        if not store.exists(marker):
            raise RuntimeError(f"stage {stage.name}: shard {s.name} has no completion marker")
        infos.append(store.read_json(marker))
    parts = [posixpath.join(plan.dir, i["part"]) for i in infos]
    digest = parts_digest(store, plan.dir, ((i["part"], i.get("digest")) for i in infos), stage.output)
    reject_parts = [posixpath.join(plan.dir, "_rejects", f"{i['shard']}.parquet") for i in infos if i["rejects"]]
    rejects = store.read_table(reject_parts, Reject)
    store.write_table(posixpath.join(plan.dir, "rejects.parquet"), rejects)
    reasons: dict[str, int] = {}
    for r in rejects.column("reason").to_pylist():
        reasons[r] = reasons.get(r, 0) + 1
    stats = stage.summarize(ctx, [i["stats"] for i in infos])
    stats.update(rows=sum(i["rows"] for i in infos), rejects=rejects.num_rows, reject_reasons=reasons,
                 shard_seconds=round(sum(i["seconds"] for i in infos), 3))
    infra = sum(i.get("retryable", 0) for i in infos)  # infrastructure outcomes: never final
    units = stats["rows"] + stats["rejects"]
    stats.update(infra=infra, infra_share=round(infra / units, 6) if units else 0.0,
                 retried=sum(i.get("retried", 0) for i in infos))
    store.write_json(posixpath.join(plan.dir, "stats.json"), stats)

    # only the columns the suite names: never messages or final states (memory bounded by scalars)
    suites = gate_suites(stage, ctx.config)
    table = store.read_table(parts, stage.output, columns=gate_columns(stage.name, arrow_schema(stage.output),
                                                                       suites[stage.name]))
    too_many = infra_failure(stage.name, infos, units, ctx.config.gate.max_infra_share)
    report = check_gate(ctx, stage.name, suites[stage.name], table, stats, plan.dir,
                        posixpath.join(plan.dir, "gate.json"), rejects=rejects,
                        failures=[{"name": f"{stage.name}.max_infra_share", **too_many}] if too_many else [],
                        regated=plan.regate)
    stats["gate_accepted"] = report["accepted"]  # finalize adds those of its own gates (export configs)
    stage.finalize(ctx, plan.dir, stats, upstream or {})
    accepted = stats.pop("gate_accepted")
    store.write_json(posixpath.join(plan.dir, "stats.json"), stats)  # finalize may add to them
    manifest = Manifest(stage=stage.name, fingerprint=plan.fingerprint, build_id=ctx.build_id, dir=plan.dir,
                        parts=parts, rows=stats["rows"], rejects=rejects.num_rows, reject_reasons=reasons,
                        stats=stats, components={**plan.components, "gate": gate_hash(suites)},
                        gate={"success": True, "evaluated": report["evaluated"], "suite": gate_hash(suites),
                              "accepted": [brief_failure(f) for f in accepted], "disabled": report["disabled"],
                              "overridden": report["overridden"], "regated": plan.regate},
                        created_at=dt.datetime.now(dt.timezone.utc).isoformat(),
                        revision=revision(store, plan.dir), digest=digest,
                        files={i["part"]: store.file_sha256(p) for i, p in zip(infos, parts)})
    store.write_json(posixpath.join(plan.dir, "manifest.json"), manifest.model_dump(mode="json"))
    return manifest


def brief_failure(failure: dict[str, Any]) -> dict[str, Any]:
    """A gate failure as build.json, a manifest and the dataset card keep it (no GX internals)."""
    from ...expectations.gate import brief

    return brief(failure)


def gate_columns(suite_name: str, schema: Any, suite: dict[str, Any]) -> list[str]:
    """The scalar columns of `schema` that `suite` reads: all a gate is given (never messages)."""
    from ...expectations.gate import gate_columns as columns

    return columns(suite_name, schema, suite=suite)


def check_gate(ctx: StageContext, suite_name: str, suite: dict[str, Any], table: Any, stats: dict[str, Any],
               out_dir: str, gate_file: str, rejects: Any = None, failures: list[dict[str, Any]] = (),
               regated: bool | None = None) -> dict[str, Any]:
    """The one gate path: run `suite` on `table` (and `stats`), put `failures` found outside it first,
    move the failures named by `--accept-gate` to `accepted`, write the report to `gate_file`, and
    raise GateFailed (naming `out_dir`, where the output stays) unless it passed. Returns the report."""
    from ...expectations.gate import accept_failures, run_gate  # GX: only where a gate runs

    report = run_gate(suite_name, table, stats, suite=suite, rejects=rejects)
    if failures:
        report.update(success=False, failures=[*failures, *report["failures"]])
    report = accept_failures(report, ctx.runtime.get("accept_gates", []))
    if regated is not None:
        report["regated"] = regated
    ctx.store.write_json(gate_file, report)
    if not report["success"]:
        raise GateFailed(gate_failure_message(suite_name, ctx.store.url(out_dir), ctx.store.url(gate_file), report),
                         report)
    return report


def gate_failure_message(stage: str, out_dir: str, gate_file: str, report: dict[str, Any]) -> str:
    """What the CLI prints for a failed gate: each failure on its line (name, observed value,
    threshold, the first offending rows), where the output stays, how to commit it on purpose."""
    from ...expectations.gate import describe_failure

    names = [f.get("name") or f["expectation"] for f in report["failures"]]
    lines = [f"gate of stage {stage!r} failed, nothing committed (report: {gate_file}):"]
    lines += [f"  ✗ {describe_failure(f)}" for f in report["failures"]]
    lines.append(f"  the output stays in {out_dir} for inspection; to commit it on purpose re-run with "
                 + " ".join(f"--accept-gate {n}" for n in names)
                 + ", or change a threshold in the config (`gates.<suite>.<name>`; docs/gates.md)")
    return "\n".join(lines)


def read_output(ctx: StageContext, stage: Stage, manifest: Manifest, filters: list | None = None) -> list:
    """A committed output as records: the whole table unless `filters` (pyarrow DNF) narrow it."""
    return ctx.store.read_records(manifest.parts, stage.output, filters=filters)
