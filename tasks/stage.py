"""The stage contract and the engine that runs any stage: plan -> shards -> gate -> manifest.

A stage declares its name, the stages it reads (`requires`), its config section, its output record
type, how it splits work into shards and what one shard does. The engine owns everything else:
fingerprints, reuse, resume (per-shard `_done` markers), rejects, stats, the gate, the manifest.
Stage code never touches Prefect or Dask; flows never touch stage internals.

fingerprint = sha256(stage config section, stage code version, upstream fingerprints).
Same fingerprint + a committed manifest anywhere in the dataset => the stage is reused.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import inspect
import json
import os
import posixpath
import socket
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pyarrow as pa
from pydantic import BaseModel

from ..schemas.common import Reject
from ..schemas.config import BuildConfig, fingerprint_view
from .store import RunStore


class Manifest(BaseModel):
    """A committed stage output. Written last; its presence is what "committed" means."""

    stage: str
    fingerprint: str
    build_id: str
    dir: str
    parts: list[str]
    rows: int
    rejects: int
    reject_reasons: dict[str, int]
    stats: dict[str, Any]
    components: dict[str, Any]
    gate: dict[str, Any]
    created_at: str


class Shard(BaseModel):
    """A unit of resumable work. `payload` is small JSON (ids, not data)."""

    index: int
    payload: dict[str, Any] = {}

    @property
    def name(self) -> str:
        return f"part-{self.index:05d}"


@dataclass
class ShardResult:
    rows: list[BaseModel] | pa.Table  # records, or a table with the output record's columns
    rejects: list[Reject] = field(default_factory=list)
    stats: dict[str, Any] = field(default_factory=dict)


@dataclass
class StageContext:
    """What a stage may use. Rebuilt from (config, build_id, runtime) in each worker: keep it cheap.

    `runtime` holds what the build started for this run (e.g. the teacher server's endpoints): it
    changes how a stage runs, never what it must produce, so it is not part of any fingerprint.
    `report(**counters)` lets a running shard publish live progress (throttled; see `Progress`)."""

    config: BuildConfig
    build_id: str
    store: RunStore
    runtime: dict[str, Any] = field(default_factory=dict)
    reporter: "ProgressWriter | None" = None

    @classmethod
    def create(cls, config: BuildConfig, build_id: str, runtime: dict[str, Any] | None = None) -> "StageContext":
        return cls(config, build_id, RunStore(config.runs, config.dataset), dict(runtime or {}))

    def payload(self) -> dict[str, Any]:
        return {"config": self.config.model_dump(mode="json"), "build_id": self.build_id, "runtime": self.runtime}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "StageContext":
        return cls.create(BuildConfig.model_validate(payload["config"]), payload["build_id"],
                          payload.get("runtime"))

    def report(self, force: bool = False, **counters: Any) -> None:
        if self.reporter is not None:
            self.reporter.write(counters, force)


class ProgressWriter:
    """Writes `<stage dir>/_progress/<shard>.json` at most every `every_s` seconds (unless forced).
    The flow's driver polls these files: it works the same on a laptop, a cluster and S3."""

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


class Stage(ABC):
    """One pipeline stage. Subclasses set the class attributes and implement plan/run_shard."""

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    services: ClassVar[tuple[str, ...]] = ()  # long-lived services the flow starts first (e.g. "teacher")
    config_sections: ClassVar[tuple[str, ...]] = ()
    output: ClassVar[type[BaseModel]]

    def config_section(self, config: BuildConfig) -> dict[str, Any]:
        """What of the config decides this stage's output (operational fields are left out)."""
        return {s: fingerprint_view(getattr(config, s)) for s in self.config_sections}

    # Modules (besides the stage's own) whose code decides the output, e.g. the agent harness for
    # `rollout`: names relative to `trajforge.tasks`; a package name covers all its modules.
    code_modules: ClassVar[tuple[str, ...]] = ()

    def code_version(self) -> str:
        """Hash of the stage's module source and its `code_modules`: editing any of them
        invalidates the stage's outputs (and so everything downstream)."""
        import importlib
        import pkgutil

        mods = [inspect.getmodule(type(self))]
        for name in self.code_modules:
            mod = importlib.import_module(f"{__package__}.{name}")
            mods.append(mod)
            if hasattr(mod, "__path__"):
                mods += [importlib.import_module(f"{mod.__name__}.{m.name}")
                         for m in sorted(pkgutil.iter_modules(mod.__path__), key=lambda m: m.name)]
        h = hashlib.sha256()
        for m in mods:
            h.update(inspect.getsource(m).encode())
        return h.hexdigest()[:12]

    def part_path(self, shard: Shard, fingerprint: str) -> str:
        return f"{shard.name}.parquet"

    @abstractmethod
    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        """Deterministic split of the work; the same inputs give the same shards."""

    @abstractmethod
    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        """Do one shard's work and return its rows; must not write to the store itself."""

    def finalize(self, ctx: StageContext, out_dir: str, manifest_stats: dict[str, Any],
                 upstream: dict[str, "Manifest"]) -> None:
        """Hook run after the gate passed and before the manifest is written (e.g. a dataset card).
        It may add to `manifest_stats` and may raise GateFailed: then nothing is committed."""

    def services_for(self, config: BuildConfig) -> tuple[str, ...]:
        """The services this stage needs with this config (default: the class's `services`)."""
        return self.services

    def progress_text(self, totals: dict[str, Any], elapsed_s: float) -> str:
        """One line for the live display from the summed `ctx.report` counters of all shards."""
        return ""

    def summarize(self, ctx: StageContext, shard_stats: list[dict[str, Any]]) -> dict[str, Any]:
        """Merge per-shard stats (numbers are summed by default)."""
        return sum_counters(shard_stats)


def sum_counters(items: list[dict[str, Any]]) -> dict[str, Any]:
    """Sum numbers key by key, and one level of nested {name: number} dicts; other values are dropped."""
    out: dict[str, Any] = {}
    for s in items:
        for k, v in s.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                out[k] = out.get(k, 0) + v
            elif isinstance(v, dict):
                d = out.setdefault(k, {})
                for kk, vv in v.items():
                    if isinstance(vv, (int, float)) and not isinstance(vv, bool):
                        d[kk] = d.get(kk, 0) + vv
    return out


# --------------------------------------------------------------------------------------------
# engine
# --------------------------------------------------------------------------------------------

def _sha(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()


def fingerprint_components(stage: Stage, ctx: StageContext, upstream_fps: dict[str, str]) -> dict[str, Any]:
    extra = ctx.config.gate.extra.get(stage.name, [])
    return {
        "config": _sha([stage.config_section(ctx.config), extra]),
        "code": stage.code_version(),
        "upstream": dict(sorted(upstream_fps.items())),
    }


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
    ctx.reporter = ProgressWriter(ctx.store, posixpath.join(plan_dir, "_progress", f"{shard.name}.json"))
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


class GateFailed(RuntimeError):
    """A stage output failed its expectation suite; nothing was committed."""


def commit(stage: Stage, ctx: StageContext, plan: StagePlan, upstream: dict[str, "Manifest"] | None = None) -> Manifest:
    """Check every shard is done, merge rejects and stats, run the gate, write the manifest last."""
    from ..expectations.gate import run_gate  # GE import is heavy: only where a gate runs

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
