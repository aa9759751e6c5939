"""The Prefect flow `build_dataset`: executes a pipeline graph (`tasks.pipeline.PIPELINE` by default).

The flow only orchestrates: for each step of the graph (and each adaptive round the graph's loop asks
for) it asks the engine for a plan (fingerprint, reuse, pending shards), fans the pending shards out
as Prefect tasks on the Dask task runner, then commits (gate + manifest). Tasks exchange manifests
and paths, never DataFrames. `build.json` records the config, the code version and each stage
instance's fingerprint and outcome; it is written by the driver only.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import hashlib
import importlib
import json
import secrets
import threading
import time
from typing import Any, Iterator

from prefect import flow, task
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .. import __version__
from ..schemas.build import BuildRecord, StageEntry
from ..schemas.config import BuildConfig
from ..tasks.engine import Manifest, Shard, StageContext, StagePlan, commit, execute_shard, prepare
from ..tasks.engine.lease import RUNTIME_KEY as LEASE_KEY
from ..tasks.engine.lease import Lease, LeaseHeld, abandon, hold, live_leases
from ..tasks.engine.progress import read_progress
from ..tasks.engine.store import RunStore
from ..tasks.pipeline import Pipeline, instance_name, resolve_inputs
from ..tasks.redaction.secrets import real_config, redact_settings
from ..tasks.teachers.cpu_profile import throughput_line
from .runtime import cluster_limiter
from .services import EARLY, PER_STAGE, SERVICES

DEFAULT_PIPELINE = "trajforge.tasks.pipeline:PIPELINE"
console = Console(stderr=True)
if not console.is_terminal:
    console = Console(stderr=True, width=max(console.width, 160))


def load_pipeline(ref: str) -> Pipeline:
    """`module:attribute` of a Pipeline (workers import it by name, like the stages in it)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr or "PIPELINE")


def config_hash(config: BuildConfig) -> str:
    return hashlib.sha256(json.dumps(config.model_dump(mode="json"), sort_keys=True).encode()).hexdigest()[:16]


def stored_build_config(stored: dict[str, Any], source: str, real: BuildConfig | None = None,
                        how: str = "--config FILE") -> BuildConfig:
    """The config to re-run a build with: its stored `build.json` config (`source`), unless redaction hid
    values in it (then `real`, whose redacted form must equal the stored one; `runs` aside); else `real` is
    only checked. Raises ConfigError naming `how` (how to pass the real config) when it is needed or differs."""
    from ..schemas.config import ConfigError, parse_config
    from ..tasks.redaction.secrets import REDACTED

    kept = parse_config(stored, source, stored=True)
    if real is None:
        if REDACTED in json.dumps(stored):
            raise ConfigError(f"{source}: its config has redacted values (secrets); pass the build's real "
                              f"config with {how}")
        return kept

    def shown(c: BuildConfig) -> dict[str, Any]:
        return {k: v for k, v in redact_settings(c.model_dump(mode="json")).items() if k != "runs"}

    if shown(real) != shown(kept):
        raise ConfigError(f"{how}: not the config of {source} (its redacted form differs from the stored one)")
    return real


def new_build_id() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(2)


@contextlib.contextmanager
def claim_build(store: RunStore, cfg: BuildConfig, build_id: str, fresh: bool, say=console.print) -> Iterator[Lease]:
    """Hold the lease of `build_id` (LeaseHeld if a live process has it). A `fresh` id (no build of
    this config to resume) also yields to a live build of the same config that took its lease
    first: two `trajforge build` of one config started together run one build, not two."""
    with hold(store, build_id, config_hash(cfg), say=say) as lease:
        rival = None
        if fresh:
            mine = (lease.info.acquired_at, build_id)
            rival = min((o for o in live_leases(store) if o.build_id != build_id and o.config_hash == lease.info.config_hash
                         and (o.acquired_at, o.build_id) < mine), key=lambda o: o.acquired_at, default=None)
        if rival is None:
            yield lease
            return
    store.remove(store.build_dir(build_id))  # it held nothing but the lease just released
    raise LeaseHeld(f"build {rival.build_id} of the same config is already running: held by {rival.describe()}; "
                    "nothing was started (wait for it, or stop that process)")


def run_shard(pipeline: str, stage_name: str, ctx_payload: dict, plan_dir: str, shard: dict, upstream: dict) -> dict:
    """Run one shard in a Dask worker (idempotent: a shard with a `_done` marker is skipped)."""
    stage = load_pipeline(pipeline).stage(stage_name)
    ctx = StageContext.from_payload(ctx_payload)
    ctx.limiter = cluster_limiter()
    ups = {k: Manifest.model_validate(v) for k, v in upstream.items()}
    return execute_shard(stage, ctx, plan_dir, Shard.model_validate(shard), ups)


# The Prefect task wraps a module-level function under another name, so Dask pickles the function
# by reference (a decorated function is not "the same object" as its module attribute).
shard_task = task(name="stage-shard", retries=0, task_run_name="{ctx_payload[build_id]} {stage_name} {shard[index]}")(run_shard)


class _Watchdog:
    """The shards' backstop: a shard task running longer than `dask.shard_timeout_s` is abandoned and
    fails its stage with a named cause (the other shards' finished work is kept; it is redone on
    resume). Decided here, in the driver: Prefect's task timeout would raise asynchronously inside
    the Dask worker's thread, which can land inside a held lock (it deadlocked a worker in logging's
    handler lock). Only futures submitted longer ago than the limit are asked for their state (the
    time they started running), at most every `min(limit, 15)` seconds.

    An abandoned shard cannot be stopped inside its worker (a thread), so it is fenced instead: the
    driver records it as abandoned under the build's lease token before letting go (`lease.abandon`),
    and the shard's part, rejects and marker are refused if it ever finishes (`lease.fence`; likewise
    once the lease is released or taken over). Its Dask future is cancelled too (nothing waits for it,
    and a queued one never starts)."""

    def __init__(self, limit: float | None, stage: str, names: dict[Any, str], store: RunStore | None = None,
                 plan_dir: str = "", token: str | None = None):
        self.limit, self.stage, self.names = limit, stage, names
        self.store, self.plan_dir, self.token = store, plan_dir, token
        self.next = time.monotonic() + (limit or 0)  # no shard can be late before then

    def overdue(self, pending: set) -> list:
        now = time.monotonic()
        if self.limit is None or now < self.next:
            return []
        self.next = now + min(self.limit, 15.0)
        late = []
        for fut in pending:
            try:
                state = fut.state
            except Exception:  # the API may be briefly unreachable: ask again next time
                continue
            if state.is_running() and time.time() - state.timestamp.timestamp() > self.limit:
                late.append(fut)
        return late

    def abandon(self, fut, err: Exception | None = None) -> Exception:
        """Fence the shard of `fut` (before anything else: it may finish any moment), cancel its future,
        and return the error that names it (`err`, default: the shard's time-out)."""
        err = err if err is not None else self.error(fut)
        if self.store is not None and self.token:
            with contextlib.suppress(Exception):  # (unwritable: the lease's release at the build's end fences it)
                abandon(self.store, self.plan_dir, self.names[fut], self.token, str(err))
        with contextlib.suppress(Exception):  # (a finished or lost future: nothing to cancel)
            fut.wrapped_future.cancel()
        return err

    def error(self, fut) -> TimeoutError:
        return TimeoutError(f"shard {self.names[fut]} of stage {self.stage} still running after "
                            f"dask.shard_timeout_s={self.limit:g}s: abandoned (finished shards are kept; it is "
                            "redone on resume)")


class _Arrivals:
    """Which shard futures have finished, as the Dask futures' own done-callbacks tell it. Waiting is a plain
    `threading.Event.wait`: Prefect's `wait(futures, timeout=...)` enforces its timeout by an exception
    raised asynchronously in the waiting thread (SIGALRM, or `PyThreadState_SetAsyncExc` off the main
    thread), which can land inside `threading`'s own lock handling; it failed a build with "release
    unlocked lock" (issue 30, a host dying mid-rollout)."""

    def __init__(self, futures) -> None:
        self._event = threading.Event()
        for fut in futures:
            fut.wrapped_future.add_done_callback(lambda _f: self._event.set())

    def wait(self, pending: set, timeout: float) -> tuple[set, set]:
        """(done, not done) among `pending`, waiting up to `timeout` s for one to finish if none has."""
        self._event.clear()  # a future finishing from here on sets it; one finished before is seen below
        done = {f for f in pending if f.wrapped_future.done()}
        if not done:
            self._event.wait(timeout)
            done = {f for f in pending if f.wrapped_future.done()}
        return done, pending - done


class _Build:
    """One run of the build flow: the record, the committed manifests (by instance name), services."""

    lease: Lease | None = None  # the build's lease, held by this process (checked at each stage)

    def __init__(self, pipeline_ref: str, cfg: BuildConfig, build_id: str, selected: list[str], force: set[str],
                 retry: set[str] = frozenset(), accept: list[str] = ()):
        self.pipeline_ref, self.pipeline = pipeline_ref, load_pipeline(pipeline_ref)
        self.cfg, self.selected, self.force, self.retry = cfg, selected, force, retry
        # failures named here are committed on purpose (runtime: not part of any fingerprint)
        self.ctx = StageContext.create(cfg, build_id, {"accept_gates": list(accept)} if accept else None)
        self.manifests: dict[str, Manifest] = {}
        self.services, self.started = contextlib.ExitStack(), set()
        self.early: dict[str, Any] = {}  # EARLY services begun before their stage: name -> handle (None: nothing to begin)
        self.record = self.ctx.store.read_build(build_id) or BuildRecord(
            build_id=build_id, dataset=cfg.dataset, created_at=dt.datetime.now(dt.timezone.utc).isoformat())
        self.record = self.record.model_copy(update=dict(
            config=redact_settings(cfg.model_dump(mode="json")), config_hash=config_hash(cfg), trajforge_version=__version__,
            status="running", selected=selected, forced=sorted(force), accept_gates=list(accept)))
        self.save()

    def save(self) -> None:
        self.ctx.store.write_build(self.record)

    def run(self, instance: str, upstream: dict[str, Manifest]) -> Manifest:
        """Reuse or run one stage instance (`verify`, or `verify.r2` in adaptive round 2)."""
        stage, ctx, record = self.pipeline.stage(instance), self.ctx, self.record
        run_it = stage.name in self.selected
        plan = prepare(stage, ctx, upstream, force=run_it and stage.name in self.force, plan_shards=run_it,
                       retry=stage.name in self.retry)
        entry = dict(fingerprint=plan.fingerprint, components=plan.components, note=plan.note)
        if plan.note:
            console.print(f"[yellow]![/] {instance}: {plan.note}", soft_wrap=True)
        if plan.reused is not None:
            self.manifests[instance] = plan.reused
            record.stages[instance] = StageEntry(**entry, status="reused", reused_from=plan.reused.build_id,
                                                 manifest=plan.reused.dir, rows=plan.reused.rows,
                                                 rejects=plan.reused.rejects, gate=_gate_entry(plan.reused.gate))
            console.print(f"[green]✓[/] {instance:<10} reused   fingerprint {plan.fingerprint} "
                          f"(committed in build {plan.reused.build_id}, {plan.reused.rows} rows)")
            self.save()
            self._drop_early(stage)
            return plan.reused
        if not run_it:
            raise RuntimeError(
                f"stage {instance!r} is not selected and has no committed output with fingerprint "
                f"{plan.fingerprint} (its config, code or upstream changed); run it, e.g. --from {stage.name}")
        if self.lease is not None:  # stage start: another driver may have taken the build over
            self.lease.check()
            removed = ctx.store.clean_temporaries(ctx.store.build_dir(ctx.build_id), self.lease.info.acquired_at)
            if removed:
                console.print(f"  removed {removed} temporary file(s) left by a killed run of build {ctx.build_id}")
        record.stages[instance] = StageEntry(**entry, status="running")
        self.save()
        console.print(f"[cyan]▶[/] {instance:<10} running  fingerprint {plan.fingerprint} "
                      f"({len(plan.pending)}/{len(plan.shards)} shards to run"
                      + (": its gate changed, only the gate runs again)" if plan.regate else ")"))
        with contextlib.ExitStack() as around:  # services of this stage only (`PER_STAGE`: reap before and after)
            for name in stage.services_for(self.cfg) if plan.pending else ():
                if name in PER_STAGE:
                    ctx.runtime.update(around.enter_context(SERVICES[name](self.cfg, ctx, console)))
                elif name not in self.started:
                    early = self.early.pop(name, None)
                    service = SERVICES[name](self.cfg, ctx, console, **({"early": early} if early is not None else {}))
                    ctx.runtime.update(self.services.enter_context(service))
                    self.started.add(name)
            if plan.pending:
                self._launch_early(stage.name)
            else:
                self._drop_early(stage)
            self._run_shards(stage.name, plan, upstream)
        if self.lease is not None:
            self.lease.check()
        try:
            manifest = commit(stage, ctx, plan, upstream)
        except Exception as err:
            report = getattr(err, "report", None)
            record.stages[instance] = StageEntry(**entry, status="failed", error=str(err)[:4000],
                                                 gate=_gate_entry(report, failed=True) if report else None)
            raise
        self.manifests[instance] = manifest
        record.stages[instance] = StageEntry(**entry, status="committed", manifest=manifest.dir, rows=manifest.rows,
                                             rejects=manifest.rejects, gate=_gate_entry(manifest.gate))
        self.save()
        console.print(f"[green]✓[/] {instance:<10} committed {manifest.rows} rows, {manifest.rejects} rejects "
                      f"{manifest.reject_reasons or ''}")
        if tps := throughput_line(manifest.stats):  # (the demo's output says what speed the teacher got)
            console.print(f"  {tps}")
        for a in manifest.gate.get("accepted", []):
            console.print(f"  [yellow]![/] gate accepted on purpose: {a['line']}", soft_wrap=True)
        return manifest

    def run_step(self, name: str, round_: int = 0) -> Manifest:
        step = self.pipeline.step(name)
        return self.run(instance_name(name, round_), resolve_inputs(step, self.manifests, round_))

    def _launch_early(self, stage_name: str) -> None:
        """Begin the slow start of every `EARLY` service a selected later stage that reads `stage_name`'s rows
        declares (`Pipeline.downstream`: inputs only, never an adaptive round's): this stage runs shards whose rows
        that stage reads, so it will run too (the teacher starts while the environments are made). A handle that
        goes unused (that stage reused after all: `_drop_early`), or the build stopping first, stops it."""
        for later in self.pipeline.downstream(stage_name):
            if later not in self.selected or later in self.manifests:
                continue
            for name in self.pipeline.stage(later).services_for(self.cfg):
                if name in EARLY and name not in self.started and name not in self.early:
                    try:
                        handle = EARLY[name](self.cfg, self.ctx, console)
                    except Exception as err:
                        raise RuntimeError(f"the {name} service, started early for stage {later}, could not start: "
                                           f"{err.__class__.__name__}: {err}") from err
                    self.early[name] = handle
                    if handle is not None:
                        self.services.callback(handle.stop)

    def _drop_early(self, stage: Any) -> None:
        """`stage` declares services begun early but will not enter them (reused, nothing pending): stop them now,
        not at the build's end (an adaptive round that needs one later starts it as usual)."""
        for name in stage.services_for(self.cfg):
            handle = self.early.pop(name, None)
            if handle is not None:
                handle.stop()
                console.print(f"  {name:<10} begun early but not needed ({stage.name} has nothing to run): stopped")

    def _early_failure(self, stage_name: str) -> str | None:
        """Why a service begun early died before its stage came, or None."""
        for name, handle in self.early.items():
            why = handle.failed() if handle is not None else None
            if why:
                return f"the {name} service, started early while stage {stage_name} ran, failed: {why}"
        return None

    def _run_shards(self, stage_name: str, plan: StagePlan, upstream: dict[str, Manifest]) -> None:
        """Submit the pending shards; show shard progress and the stage's live counters (summed over
        the `_progress/*.json` files the shards write) until all are done."""
        if not plan.pending:
            return
        stage, ctx = self.pipeline.stage(stage_name), self.ctx
        ups = {k: v.model_dump(mode="json") for k, v in upstream.items()}
        payload = ctx.payload()
        token = self.lease.info.token if self.lease is not None and self.lease.info is not None else None
        if token:  # each shard commits only under this run's lease (engine.lease.fence)
            payload = {**payload, "runtime": {**payload["runtime"], LEASE_KEY: token}}
        futures = {shard_task.submit(self.pipeline_ref, stage_name, payload, plan.dir, s.model_dump(mode="json"),
                                     ups): s.name for s in plan.pending}
        watchdog = _Watchdog(self.cfg.dask.shard_timeout_s, stage_name, futures, ctx.store, plan.dir, token)
        errors: list[BaseException] = []
        t0 = time.monotonic()
        with Progress(TextColumn(f"  {stage_name}"), BarColumn(), MofNCompleteColumn(), TextColumn("shards"),
                      TimeElapsedColumn(), TextColumn("{task.fields[live]}"), console=console,
                      transient=False) as bar:
            t = bar.add_task(stage_name, total=len(plan.shards), completed=len(plan.shards) - len(plan.pending),
                             live="")
            pending, arrivals = set(futures), _Arrivals(futures)
            while pending:
                done, not_done = arrivals.wait(pending, timeout=1.0)
                for fut in done:
                    try:
                        fut.result()
                    except Exception as err:  # keep finishing the other shards: their work is kept on disk
                        errors.append(err)
                    # Let Dask forget the finished shard: a future the client still holds is recomputed
                    # when the worker keeping its result dies (prefect#15442), i.e. a committed shard run again.
                    with contextlib.suppress(Exception):
                        fut.wrapped_future.release()
                    bar.update(t, advance=1)
                pending = set(not_done)
                why = self._early_failure(stage_name)
                if why:  # the build fails now, naming it: the shards still running are fenced and cancelled first
                    for fut in pending:
                        watchdog.abandon(fut, RuntimeError(why))
                    raise RuntimeError(why)
                for fut in watchdog.overdue(pending):  # abandoned (fenced, cancelled): the stage fails, naming it
                    errors.append(watchdog.abandon(fut))
                    pending.discard(fut)
                    bar.update(t, advance=1)
                bar.update(t, live=stage.progress_text(read_progress(ctx.store, plan.dir), time.monotonic() - t0))
        if errors:
            raise RuntimeError(f"stage {stage_name}: {len(errors)} shard(s) failed; first: "
                               f"{errors[0].__class__.__name__}: {errors[0]}") from errors[0]


def _mark_stale(b: _Build) -> None:
    """Entries this run left as an earlier run of the build committed them, that read rows no stage of the
    build holds any more (a stage before them re-ran alone, `--only`, and wrote other rows), become `stale`:
    a build's record never shows outputs made from other inputs than its own. In pipeline order, so a
    stage reading a stale one is stale too. Manifests written before content digests existed are left as
    they are (nothing to compare)."""
    store, record = b.ctx.store, b.record
    held: dict[str, str] = {}  # instance -> content id of what the record holds
    stale: set[str] = set()
    order = sorted(record.stages, key=lambda n: (b.pipeline.names.index(n.split(".")[0]), n))
    for name in order:
        e = record.stages[name]
        if name in b.manifests:
            held[name] = b.manifests[name].content_id
            continue
        if e.status not in ("reused", "committed") or not e.manifest:
            continue
        path = f"{e.manifest.rstrip('/')}/manifest.json"
        m = Manifest.model_validate(store.read_json(path)) if store.exists(path) else None
        if m is None or not m.digest:
            continue
        ups = (m.components.get("upstream") or {}).values()
        known = set(held.values())
        gone = [u for u in ups if u.startswith("d:") and u not in known]
        # an upstream instance of this stage's that is stale, or whose content the record no longer holds
        if gone or any(s.split(".")[0] in _reads(b, name) for s in stale):
            stale.add(name)
            what = "a stage it reads now holds other rows" if gone else "a stage it reads is stale"
            record.stages[name] = e.model_copy(update=dict(
                status="stale", note=f"{what} (re-run alone in this build); run it again, e.g. --from {name.split('.')[0]}"))
            continue
        held[name] = m.content_id


def _reads(b: _Build, instance: str) -> set[str]:
    """The stage names the step of `instance` reads."""
    step = b.pipeline.step(instance.split(".")[0])
    return {sel.rstrip("*@").split(".")[0] for sel in (*step.inputs, *(step.round_inputs or ()))}


def _gate_entry(gate: dict[str, Any], failed: bool = False) -> dict[str, Any] | None:
    """What build.json keeps of a gate (a manifest's `gate`, or a failed gate's report): only what
    departs from a plain pass, None when nothing does."""
    from ..expectations.gate import brief

    out: dict[str, Any] = {}
    if failed:
        out["failures"] = [brief(f) for f in gate.get("failures", [])]
    accepted = [a if "line" in a else brief(a) for a in gate.get("accepted", [])]
    if accepted:
        out["accepted"] = accepted
    for key in ("overridden", "regated"):  # (defaults that are off stay in gate.json: not a departure)
        if gate.get(key):
            out[key] = gate[key]
    return out or None


def run_build_flow(config: dict, build_id: str, from_stage: str | None = None, only: list[str] | None = None,
                   force: list[str] | None = None, pipeline: str = DEFAULT_PIPELINE,
                   retry: list[str] | None = None, accept: list[str] | None = None) -> dict[str, Any]:
    """Run (or reuse) each selected step of the pipeline in order, with the rounds of its loop when
    the deciding stage asks for them; return the build record (as JSON). `retry`: stages whose
    committed outputs have their infrastructure outcomes re-run (`trajforge rerun`). `accept`: gate
    expectations whose failure is committed on purpose (`--accept-gate`), recorded in build.json.
    Holds the build's lease throughout (re-entrant: the CLI took it already); raises LeaseHeld when
    another live process holds it, before anything is written. `config` may be the redacted one the CLI
    shows Prefect (`shown_config`): the real one is taken back (`real_config`). A relative `runs` is made
    absolute here (against the current directory), before any shard payload is built from it."""
    config = real_config(config)
    cfg = BuildConfig.model_validate(config).with_absolute_runs()
    config = {**config, "runs": cfg.runs}
    with hold(RunStore(cfg.runs, cfg.dataset), build_id, config_hash(cfg), say=console.print) as lease:
        return _run_build(config, build_id, from_stage, only, force, pipeline, retry, lease, accept)


def _run_build(config: dict, build_id: str, from_stage: str | None, only: list[str] | None,
               force: list[str] | None, pipeline: str, retry: list[str] | None, lease: Lease,
               accept: list[str] | None = None) -> dict[str, Any]:
    from ..expectations.gate import check_gates

    cfg = BuildConfig.model_validate(config)
    check_gates(cfg.gates)  # before anything runs: a typo'd suite or expectation name is an error
    graph = load_pipeline(pipeline)
    selected = graph.select(from_stage, only)
    wanted = graph.names[:max(graph.names.index(n) for n in selected) + 1]
    b = _Build(pipeline, cfg, build_id, selected, set(force or []), set(retry or []), list(accept or []))
    b.lease = lease
    loop = graph.loop
    error: BaseException | None = None
    try:
        for name in wanted:
            last = b.run_step(name)
            if loop is None or name != loop.after:
                continue
            for rnd in range(1, loop.max_rounds(cfg) + 1):
                plan = loop.next_round(last)
                if plan is None:
                    break
                console.print(f"[cyan]↻[/] round {rnd}: {loop.describe(plan)}")
                for body in loop.body:
                    last = b.run_step(body, rnd)
        _mark_stale(b)
        complete = all(b.record.committed(n) for n in graph.names)
        b.record.status = "committed" if complete else "partial"
        final = graph.names[-1]
        if complete and final in b.manifests:  # (an `--only verify` re-run of a committed build keeps its export)
            b.record.dataset_dir = b.ctx.store.url(b.manifests[final].dir)
            b.ctx.store.link_dataset(build_id, b.manifests[final].dir)
            b.ctx.store.set_latest(build_id)
        if complete:  # <build>/report/index.html, before _finish's Prefect summary links it; never fails the build
            from .report import write_report_safely

            b.save()  # (the report reads build.json)
            write_report_safely(b.ctx.store, build_id, lambda s: console.print(f"[yellow]![/] {s}", soft_wrap=True))
    except BaseException as err:
        error = err
        b.record.status = "failed"
        b.record.error = f"{err.__class__.__name__}: {err}"[:4000]
        raise
    finally:
        _finish(b, error)
    return b.record.model_dump(mode="json", exclude_none=True)


def _finish(b: _Build, error: BaseException | None) -> None:
    """Stop the services the build started (e.g. the vLLM server) and save the record, whatever
    happened. A failure here never hides the error the build ended with (a full disk also refuses
    `build.json`): it is printed, and the first error is what propagates."""
    def save() -> None:
        b.record.finished_at = dt.datetime.now(dt.timezone.utc).isoformat()
        b.save()

    def announce() -> None:  # stage artifacts, the summary, the committed event (flows/deployments.py)
        from prefect.context import FlowRunContext

        from .deployments import announce as to_prefect

        if FlowRunContext.get() is None:  # not inside a flow run: nothing to attach artifacts to
            return
        try:  # never fails the build: the record on disk is what counts
            to_prefect(b.record, b.ctx.store)
        except Exception as err:
            console.print(f"[yellow]![/] could not report the build to Prefect ({err.__class__.__name__}: {err})")

    late = []
    for what, step in (("stop the build's services", b.services.close), ("save build.json", save),
                       ("report the build to Prefect", announce)):
        try:
            step()
        except Exception as err:
            late.append((what, err))
    if late and error is None:
        raise late[0][1]
    for what, err in late:
        console.print(f"[yellow]![/] could not {what} either ({err.__class__.__name__}: {str(err).split(';')[0]})",
                      soft_wrap=True)


# Like the shard task: the flow wraps a module-level function kept under its own name, so Prefect's
# context (which carries the flow) pickles it by reference instead of by value with its globals.
build_dataset = flow(name="build_dataset", flow_run_name="{config[dataset]} {build_id}")(run_build_flow)
