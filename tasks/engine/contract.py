"""The stage contract: what a stage declares and what it may use.

A stage declares its name, the stages it reads (`requires`), its config sections, its output record
type, the modules whose code decides its output, how it splits work into shards and what one shard
does. The engine (`engine.runner`) owns everything else: fingerprints, reuse, resume (per-shard
`_done` markers), rejects, stats, the gate, the manifest. Stage code never touches Prefect or Dask;
flows never touch stage internals.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import posixpath
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar

import pyarrow as pa
from pydantic import BaseModel, Field

from ...schemas.common import Reject
from ...schemas.config import BuildConfig, ConfigError, fingerprint_view, runs_is_relative
from .codeversion import closure, modules_digest
from .parquet import ParquetOptions
from .store import RunStore

TASKS_PACKAGE = __package__.rsplit(".", 1)[0]  # "trajforge.tasks": `code_modules` are relative to it


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
    revision: int = 0  # times its infrastructure outcomes were re-run after a commit (`trajforge rerun`)
    digest: str = Field("", description=(
        "the content digest of its rows (tasks/engine/digest.py): what downstream fingerprints hash. Empty in "
        "manifests written before it existed: then computed from the parts when the manifest is read for reuse"))
    files: dict[str, str] = Field(default_factory=dict, description=(
        "sha256 of each part file's bytes as committed (path relative to `dir`): a part changed after the commit "
        "makes the output unusable (never reused, never read downstream)"))

    @property
    def content_id(self) -> str:
        """What downstream fingerprints hash: the digest of the rows it holds (`d:<digest>`), so a stage that
        read other rows (a forced or sampling re-run, a rerun of its infrastructure outcomes, an edit)
        runs again and one that read the same rows is reused. The flow hands downstream only manifests that
        have one (`runner.prepare` computes it for manifests written before digests existed); a manifest
        made by hand without one counts by its fingerprint, revision and build, as before digests."""
        if not self.digest:
            return self.fingerprint if not self.revision else f"{self.fingerprint}.r{self.revision}-{self.build_id}"
        return f"d:{self.digest}"


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
class Retryable:
    """A shard's infrastructure outcomes (never final): positions among its output `rows` and its
    `rejects`, and one line of error per outcome (the first few are kept in the shard's marker)."""

    rows: list[int] = field(default_factory=list)
    rejects: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    @property
    def count(self) -> int:
        return len(self.rows) + len(self.rejects)


# (name, capacity) -> an object whose `hold()` is an async context manager: a limit on concurrent
# requests that may span processes. The flow provides a cluster-wide one inside Dask workers; stage
# code only sees this callable (None = a limit local to the event loop).
LimiterFactory = Callable[[str, int], Any]


@dataclass
class StageContext:
    """What a stage may use. Rebuilt from (config, build_id, runtime) in each worker: keep it cheap.

    `runtime` holds what the build started for this run (e.g. the teacher server's endpoints): it
    changes how a stage runs, never what it must produce, so it is not part of any fingerprint.
    `report(**counters)` lets a running shard publish live progress (throttled)."""

    config: BuildConfig
    build_id: str
    store: RunStore
    runtime: dict[str, Any] = field(default_factory=dict)
    reporter: Any = None  # engine.progress.ProgressWriter while a shard runs
    limiter: LimiterFactory | None = None

    @classmethod
    def create(cls, config: BuildConfig, build_id: str, runtime: dict[str, Any] | None = None) -> "StageContext":
        return cls(config, build_id, RunStore(config.runs, config.dataset), dict(runtime or {}))

    def payload(self) -> dict[str, Any]:
        """What a worker rebuilds the context from. Its `runs` is always absolute: the store this (driver)
        process opened, never a path a worker would resolve against its own working directory."""
        config = self.config.model_dump(mode="json")
        if self.store.local:
            config["runs"] = posixpath.dirname(self.store.root)
        return {"config": config, "build_id": self.build_id, "runtime": self.runtime}

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "StageContext":
        """The context in a worker. Refuses a relative run store (ConfigError naming `runs`): it would
        mean another folder here than in the driver, and the shard's output would land beside the build."""
        config = BuildConfig.model_validate(payload["config"])
        if runs_is_relative(config.runs):
            raise ConfigError(f"runs: the run store {config.runs!r} is a relative path, which a worker would "
                              f"resolve against its own working directory ({os.getcwd()}), not the driver's; the "
                              "driver must hand workers an absolute path or URL (BuildConfig.with_absolute_runs)")
        return cls.create(config, payload["build_id"], payload.get("runtime"))

    def report(self, force: bool = False, **counters: Any) -> None:
        if self.reporter is not None:
            self.reporter.write(counters, force)


class Stage(ABC):
    """One pipeline stage. Subclasses set the class attributes and implement plan/run_shard."""

    name: ClassVar[str]
    requires: ClassVar[tuple[str, ...]] = ()
    services: ClassVar[tuple[str, ...]] = ()  # what the flow starts for it: "teacher", "sandboxes" (flows/services.py)
    config_sections: ClassVar[tuple[str, ...]] = ()
    output: ClassVar[type[BaseModel]]
    # Modules whose code decides the output that the stage's import closure cannot see (e.g. one
    # reached only by a name in a string): names relative to `trajforge.tasks`; a package name covers
    # all its modules. Everything the stage's module imports counts already (`code_module_names`).
    code_modules: ClassVar[tuple[str, ...]] = ()

    def config_section(self, config: BuildConfig) -> dict[str, Any]:
        """What of the config decides this stage's output (operational fields are left out)."""
        return {s: fingerprint_view(getattr(config, s)) for s in self.config_sections}

    def code_version(self) -> str:
        """Digest of the normalised syntax trees of `code_module_names`: a changed expression in any
        of them invalidates the stage's outputs (and so everything downstream); a comment, a
        docstring or a change in an operational module (`codeversion.OPERATIONAL`) does not."""
        return modules_digest(self.code_module_names())

    def code_module_names(self) -> list[str]:
        """The stage's module, its `code_modules` and everything they import inside the package,
        transitively (`codeversion.closure`), minus the operational modules. Sorted."""
        roots = [type(self).__module__]
        for rel in self.code_modules:
            mod = importlib.import_module(f"{TASKS_PACKAGE}.{rel}")
            roots.append(mod.__name__)
            if hasattr(mod, "__path__"):
                roots += [f"{mod.__name__}.{m.name}"
                          for m in sorted(pkgutil.iter_modules(mod.__path__), key=lambda m: m.name)]
        return closure(roots)

    def part_path(self, shard: Shard, fingerprint: str) -> str:
        return f"{shard.name}.parquet"

    def parquet_options(self, ctx: StageContext) -> ParquetOptions:
        """How the engine lays out this stage's part and rejects files (row groups, page index,
        chunking); never what rows they hold. Default: `ParquetOptions()`."""
        return ParquetOptions()

    @abstractmethod
    def plan(self, ctx: StageContext, upstream: dict[str, Manifest]) -> list[Shard]:
        """Deterministic split of the work; the same inputs give the same shards."""

    @abstractmethod
    def run_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest]) -> ShardResult:
        """Do one shard's work and return its rows; must not write to the store itself."""

    def retryable(self, rows: pa.Table, rejects: list[Reject]) -> Retryable:
        """The infrastructure outcomes among a shard's output rows and rejects (default: none).
        Invariant: they are never final. The engine records their number in the shard's marker,
        re-runs them whenever the stage runs again before it is committed (resume), counts them
        against `gate.max_infra_share`, and `trajforge rerun` re-runs those of a committed stage."""
        return Retryable()

    def retry_shard(self, ctx: StageContext, shard: Shard, upstream: dict[str, Manifest], rows: pa.Table,
                    rejects: list[Reject]) -> ShardResult | None:
        """Re-run only the retryable `rows` / `rejects` of a finished shard; return one replacement row
        per given row, in the same order (plus new rejects). The engine keeps every other row as it
        was. None (the default): the whole shard runs again."""
        return None

    def retry_stats(self, old: dict[str, Any], new: dict[str, Any], rows: pa.Table) -> dict[str, Any]:
        """A shard's stats after `retry_shard`: `old` (the whole shard before), `new` (the re-run
        rows only), `rows` (the merged output). Default: counters summed (cost spent, both runs)."""
        return sum_counters([old, new])

    def finalize(self, ctx: StageContext, out_dir: str, manifest_stats: dict[str, Any],
                 upstream: dict[str, Manifest]) -> None:
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


def upstream_parts(upstream: dict[str, Manifest], stage: str) -> list[str]:
    """The Parquet parts of every instance of `stage` upstream (`verify`, and `verify.r1`... of
    adaptive rounds), in instance-name order."""
    return [p for name in sorted(upstream) if name.split(".")[0] == stage for p in upstream[name].parts]


class GateFailed(RuntimeError):
    """A stage output failed its expectation suite; nothing was committed. `report`: the gate's
    report (failures with name, observed value, threshold, offending rows), when one ran."""

    def __init__(self, message: str, report: dict[str, Any] | None = None):
        super().__init__(message)
        self.report = report or {}
