"""The `trajforge` command line: build, stage, status, explain, verify, publish (and `envs`, `images` from envs_cli)."""

from __future__ import annotations

import json
import posixpath
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..schemas.config import BuildConfig, ConfigError, load_config
from ..tasks.engine.store import RunStore
from ..tasks.pipeline import STAGE_NAMES
from . import runtime  # noqa: F401  (sets Prefect/GX environment defaults before they are imported)
from .console import console, err_console, fail
from .envs_cli import envs_app, images_app
from .launch import rerun_build, run_build, run_stage

app = typer.Typer(add_completion=False, no_args_is_help=True, help="Build verified agent-trajectory datasets.")
app.add_typer(envs_app, name="envs")
app.add_typer(images_app, name="images")
DEFAULT_CONFIG = Path(__file__).resolve().parent.parent / "configs" / "demo.yaml"
ACCEPT_GATE = typer.Option([], "--accept-gate", help=(
    "commit although this gate expectation fails (e.g. rollout.format_error_share); recorded in build.json "
    "and the dataset card; repeatable"))


_fail = fail


def _load(config: Path) -> BuildConfig:
    from ..expectations.gate import check_gates

    try:
        cfg = load_config(config)
        check_gates(cfg.gates)
        return cfg
    except ConfigError as err:
        _fail(str(err))
    except ValueError as err:  # `gates:` naming a suite or expectation that does not exist
        _fail(f"{config}: {err}")


def _name(value: str | None, what: str = "build id") -> str | None:
    """A build id or dataset name given on the command line: a plain name, never a path."""
    from ..tasks.engine.store import check_name

    try:
        return check_name(value, what) if value is not None else None
    except ValueError as err:
        _fail(str(err))


def _open_store(runs: str, dataset: str) -> RunStore:
    """The store of an existing dataset (nothing is created for a mistyped name)."""
    try:
        return RunStore(runs, _name(dataset, "dataset name"), create=False)
    except FileNotFoundError as err:
        _fail(str(err))


def _check_stage_names(names: list[str]) -> None:
    for n in names:
        if n not in STAGE_NAMES:
            _fail(f"unknown stage {n!r}; valid stages: {', '.join(STAGE_NAMES)}")


@app.command()
def build(config: Path = typer.Argument(DEFAULT_CONFIG, help="build config (YAML)"),
          from_stage: Optional[str] = typer.Option(None, "--from", help="run from this stage on"),
          only: list[str] = typer.Option([], "--only", help="run only these stages"),
          force: list[str] = typer.Option([], "--force", help="re-run these stages even if reusable"),
          build_id: Optional[str] = typer.Option(None, "--build", help="build id (default: resume or new)"),
          dask_address: Optional[str] = typer.Option(None, "--dask-address", help="attach to a Dask scheduler"),
          accept_gate: list[str] = ACCEPT_GATE):
    """Run a dataset build; stages whose fingerprint is committed are reused."""
    _check_stage_names([n for n in [from_stage, *only, *force] if n])
    _name(build_id)
    cfg = _load(config)
    _check_gate_names(accept_gate)
    record = _guarded(lambda: run_build(cfg, build_id, from_stage, only or None, force or None, dask_address,
                                        accept=accept_gate or None))
    _print_status(cfg, record["build_id"])
    if record.get("dataset_dir"):
        store = RunStore(cfg.runs, cfg.dataset)
        export = record["stages"]["export"]["manifest"]
        counts = store.read_json(posixpath.join(export, "manifest.json"))["stats"].get("configs", {})
        console.print(f"\ndataset: {record['dataset_dir']}")
        console.print("configs: " + ", ".join(f"{k} ({v} rows{'' if v else ', not declared'})"
                                              for k, v in counts.items()))
        if store.local:
            first = next((k for k in ("sft", "trajectories", *counts) if counts.get(k)), "trajectories")
            console.print(f"latest:  {posixpath.join(store.root, 'latest', 'dataset')}  "
                          f"(datasets.load_dataset(<that path>, {first!r}))")
        _print_report_path(store, record["build_id"])


REAL_CONFIG = typer.Option(None, "--config", help=(
    "the build's config file (YAML): needed when its stored config has redacted secrets"))


@app.command()
def stage(name: str = typer.Argument(..., help=f"one of: {', '.join(STAGE_NAMES)}"),
          build_id: str = typer.Option(..., "--build", help="the build to re-run the stage in"),
          runs: str = typer.Option("./runs", help="runs root"),
          dataset: Optional[str] = typer.Option(None, help="dataset (default: the only one under runs)"),
          dask_address: Optional[str] = typer.Option(None, "--dask-address"),
          accept_gate: list[str] = ACCEPT_GATE, config: Optional[Path] = REAL_CONFIG):
    """Re-run one stage of an existing build against its committed upstream outputs; the stages after it
    are reused when their inputs hold the same rows as before, and run again otherwise."""
    _check_stage_names([name])
    _check_gate_names(accept_gate)
    cfg = _build_config(runs, dataset, build_id, config)
    record = _guarded(lambda: run_stage(cfg, build_id, name, dask_address, accept=accept_gate or None))
    _print_status(cfg, record["build_id"])


@app.command()
def rerun(name: str = typer.Argument(..., help=f"one of: {', '.join(STAGE_NAMES)}"),
          build_id: Optional[str] = typer.Option(None, "--build", help=(
              "the build whose config is used (default: latest); the rerun goes into a new build")),
          runs: str = typer.Option("./runs", help="runs root"),
          dataset: Optional[str] = typer.Option(None, help="dataset (default: the only one under runs)"),
          dask_address: Optional[str] = typer.Option(None, "--dask-address"),
          accept_gate: list[str] = ACCEPT_GATE, config: Optional[Path] = REAL_CONFIG):
    """Re-run only the infrastructure outcomes (teacher_error / infra_error episodes) of a committed
    stage (and of its adaptive rounds) in a NEW build (`--build` names the build whose config is
    used); every other row is kept, the stages after it run again. No committed build is modified."""
    _check_stage_names([name])
    _check_gate_names(accept_gate)
    cfg = _build_config(runs, dataset, build_id, config)
    record = _guarded(lambda: rerun_build(cfg, name, dask_address, accept_gate or None))
    _print_status(cfg, record["build_id"])


def _check_gate_names(names: list[str]) -> None:
    """Each --accept-gate name is an expectation of some suite (full `suite.name` or the name alone)."""
    from ..expectations.gate import effective_suite, suite_names

    known = {"max_infra_share"} | {f"{s}.max_infra_share" for s in STAGE_NAMES}
    for s in suite_names():
        suite = effective_suite(s)
        in_suite = [e["name"] for k in ("expectations", "stats_expectations") for e in suite[k]] + list(suite["disabled"])
        known |= {n for e in in_suite for n in (e, f"{s}.{e}")}
    for n in names:
        if n not in known:
            _fail(f"--accept-gate {n!r}: no such gate expectation (see docs/gates.md, or a failed "
                  "gate's message, for the names)")


def _guarded(fn):
    from ..tasks.engine import GateFailed
    from ..tasks.sandbox import DockerUnavailable

    try:
        return fn()
    except (DockerUnavailable, GateFailed, ConfigError, KeyError, ValueError) as err:
        _fail(str(err).strip("'\""), 1)
    except (RuntimeError, OSError) as err:  # a held lease, failed shards, a full disk (StoreWriteError)
        _fail(str(err), 1)


def _find_dataset(runs: str, dataset: str | None) -> str:
    if dataset:
        return dataset
    import fsspec

    fs, root = fsspec.core.url_to_fs(runs)
    names = [posixpath.basename(p.rstrip("/")) for p in fs.ls(root, detail=False)] if fs.exists(root) else []
    if len(names) != 1:
        _fail(f"pass --dataset (datasets under {runs}: {', '.join(names) or 'none'})")
    return names[0]


def _committed_build(runs: str, dataset: str | None, build_id: str | None) -> tuple[RunStore, str]:
    """The dataset's store and `build_id`, or its latest committed build (fails, naming the folder, if none)."""
    _name(build_id)
    store = _open_store(runs, _find_dataset(runs, dataset))
    build_id = build_id or store.latest()
    if not build_id:
        _fail(f"no committed build under {store.url(store.root)}")
    return store, build_id


def _build_config(runs: str, dataset: str | None, build_id: str | None, real: Path | None = None) -> BuildConfig:
    """The build's stored config; the real one (`--config FILE`) when redaction hid values in it."""
    from .build import stored_build_config

    _name(build_id)
    store = _open_store(runs, _find_dataset(runs, dataset))
    build_id = build_id or store.latest() or (store.builds() or [None])[-1]
    if not build_id:
        _fail(f"no builds under {store.url(store.root)}")
    rec = store.read_build(build_id)
    if rec is None:
        _fail(f"build {build_id!r} not found under {store.url(store.root)} (builds: {', '.join(store.builds())})")
    try:
        cfg = stored_build_config(rec.config, store.build_record_path(build_id),
                                  load_config(real) if real else None)
    except ConfigError as err:
        _fail(str(err))
    return cfg.model_copy(update={"runs": runs})


def _print_status(cfg: BuildConfig, build_id: str) -> None:
    store = RunStore(cfg.runs, cfg.dataset)
    rec = store.read_build(build_id)
    manifests = {}
    t = Table(title=f"{cfg.dataset} · build {build_id} · {rec.status if rec else '?'}")
    for col in ("stage", "status", "rows out", "rejects", "gate", "fingerprint", "reused from", "top reject reasons"):
        t.add_column(col)
    for name in STAGE_NAMES:
        e = rec.stages.get(name) if rec else None
        if not e:
            t.add_row(name, "-", "", "", "", "", "", "")
            continue
        gate, reasons = "", ""
        if e.manifest and store.exists(posixpath.join(e.manifest, "manifest.json")):
            m = manifests[name] = store.read_json(posixpath.join(e.manifest, "manifest.json"))
            gate = "pass" if m["gate"]["success"] else "fail"
            reasons = ", ".join(f"{k}={v}" for k, v in sorted(m["reject_reasons"].items(), key=lambda kv: -kv[1])[:3])
        elif e.status == "failed":
            gate = "fail" if "gate" in (e.error or "") else ""
        t.add_row(name, e.status, "" if e.rows is None else str(e.rows), "" if e.rejects is None else str(e.rejects),
                  gate, e.fingerprint, (e.reused_from or "") if e.status == "reused" else "", reasons)
    console.print(t)
    yields = manifests.get("synthesize", {}).get("stats", {}).get("yield", {})
    if yields:
        _print_yield(yields)
    fleet, rollout = cfg.sandbox.fleet, manifests.get("rollout", {}).get("stats", {})
    if fleet.max_in_flight or fleet.creations_per_s or rollout.get("fleet_wait_alive_s") or rollout.get(
            "fleet_wait_create_s"):  # the limits shared by all workers (sandbox.fleet), and what they cost
        console.print(f"fleet limits (sandbox.fleet): max_in_flight={fleet.max_in_flight}, creations_per_s="
                      f"{fleet.creations_per_s} (burst {fleet.burst}); rollout created "
                      f"{rollout.get('fleet_creations', 0)} sandboxes and waited {rollout.get('fleet_wait_create_s', 0):.1f} s "
                      f"for creations, {rollout.get('fleet_wait_alive_s', 0):.1f} s for a sandbox slot (summed over episodes)")
    audit = manifests.get("synthesize", {}).get("stats", {}).get("audit", {})
    if audit.get("envs") or audit.get("skip"):  # the test audit's cost (synthesize.audit)
        n, secs = audit.get("envs", 0), audit.get("seconds", 0.0)
        console.print(f"test audit: {n} environments audited, {audit.get('test_runs', 0)} test runs, {secs:.1f} s "
                      f"({secs / n if n else 0:.1f} s per environment), {audit.get('weak', 0)} weak, "
                      f"{audit.get('skip', 0)} skipped (no reference solution)")
    by_oracle = manifests.get("synthesize", {}).get("stats", {}).get("kept_by_oracle", {})
    if by_oracle:  # `source|present` / `source|absent`: kept with and without a reference solution
        console.print("kept by reference solution: " + ", ".join(
            f"{k.split('|')[0]} {'with' if k.endswith('|present') else 'without'} oracle={v}"
            for k, v in sorted(by_oracle.items())))


def _print_yield(yields: dict[str, int]) -> None:
    """Environments admitted per source, and why the others were not (`source|outcome` counters)."""
    by_source: dict[str, dict[str, int]] = {}
    for key, n in yields.items():
        source, _, outcome = key.partition("|")
        by_source.setdefault(source, {})[outcome] = n
    t = Table(title="environment yield per source")
    for col in ("source", "candidates", "kept", "yield", "rejected by reason"):
        t.add_column(col)
    for source, outcomes in sorted(by_source.items()):
        total, kept = sum(outcomes.values()), outcomes.get("kept", 0)
        why = ", ".join(f"{k}={v}" for k, v in sorted(outcomes.items(), key=lambda kv: -kv[1]) if k != "kept")
        t.add_row(source, str(total), str(kept), f"{kept / total:.0%}" if total else "-", why)
    console.print(t)


@app.command()
def status(build_id: Optional[str] = typer.Argument(None, help="build id (default: latest)"),
           runs: str = typer.Option("./runs"), dataset: Optional[str] = typer.Option(None)):
    """A table per stage: rows, rejects, gate result, fingerprint, reused or not."""
    cfg = _build_config(runs, dataset, build_id)
    store = RunStore(cfg.runs, cfg.dataset)
    _print_status(cfg, build_id or store.latest() or store.builds()[-1])


@app.command()
def publish(repo_id: str = typer.Argument(..., help="Hub dataset repo, e.g. my-org/agent-trajectories"),
            build_id: Optional[str] = typer.Option(None, "--build", help="build id (default: latest)"),
            runs: str = typer.Option("./runs"), dataset: Optional[str] = typer.Option(None),
            private: bool = typer.Option(False, help="create the repo private"),
            tag: bool = typer.Option(True, help="tag the commit with the build id"),
            token: Optional[str] = typer.Option(None, help="Hub token (default: $HF_TOKEN or the login)"),
            endpoint: Optional[str] = typer.Option(None, help="Hub URL (default: $HF_ENDPOINT or huggingface.co)"),
            append: bool = typer.Option(False, "--append", help="add this build's shards to the last published "
                                        "build's instead of replacing them (every config's schema must be the "
                                        "published one)"),
            environments: str = typer.Option("none", "--environments", help=(
                "also publish environments as a Harbor task tree under tasks/ (same commit): `rl` = the rl "
                "config's, `kept` = every kept one, `none`"))):
    """Upload a committed build's dataset (card + declared configs) to the Hugging Face Hub in one
    commit on main, tagged with the build id; re-publishing a published build does nothing."""
    from .publish import PublishError
    from .publish import publish as do_publish

    store, build_id = _committed_build(runs, dataset, build_id)
    try:
        rec = do_publish(store, build_id, repo_id, private=private, token=token, tag=tag, endpoint=endpoint,
                         append=append, say=lambda line: console.print(f"  {line}"), environments=environments)
    except PublishError as err:
        _fail(str(err), 1)
    except Exception as err:  # the Hub: auth, network, quota
        _fail(f"publishing {build_id} to {repo_id} failed: {err.__class__.__name__}: {err}", 1)
    if rec["status"] == "unchanged":
        return
    console.print(f"[green]✓[/] published build {build_id} to {repo_id} ({', '.join(rec['configs'])})"
                  + (f", tag {rec['tag']}" if rec["tag"] else "") + (f": {rec['url']}" if rec["url"] else ""))


EXPORT_FORMATS = {"atif": "one ATIF JSON document per trajectory (the Agent Trajectory Interchange Format, v1.8)"}


@app.command("export")
def export_trajectories(build_id: Optional[str] = typer.Argument(None, help="build id (default: latest committed)"),
                        fmt: str = typer.Option("atif", "--format", help="; ".join(f"{k}: {v}" for k, v in
                                                                                   EXPORT_FORMATS.items())),
                        out: Path = typer.Option(..., "--out", help="folder the documents are written into"),
                        config: str = typer.Option("trajectories", "--config",
                                                   help="the exported config to convert: trajectories or sft"),
                        runs: str = typer.Option("./runs"), dataset: Optional[str] = typer.Option(None)):
    """Write a committed build's exported trajectories in an interchange format, for viewers that read it
    (`atif`: `<out>/<rollout_id>.json`, each validated with the `atif` package's models)."""
    from rich.progress import Progress

    from ..schemas.export import SFTRow, TrajectoryRow
    from ..tasks.dataset.atif import atif_documents
    from .publish import PublishError, dataset_folder

    if fmt not in EXPORT_FORMATS:
        _fail(f"--format {fmt!r}: known formats: {', '.join(EXPORT_FORMATS)}")
    models = {"trajectories": TrajectoryRow, "sft": SFTRow}
    if config not in models:
        _fail(f"--config {config!r}: trajectories or sft (the configs that hold trajectories)")
    store, build_id = _committed_build(runs, dataset, build_id)
    try:
        folder = dataset_folder(store, build_id)
    except PublishError as err:
        _fail(str(err), 1)
    parts = sorted(store.fs.glob(posixpath.join(folder, config, "*.parquet")))
    if not parts:
        _fail(f"build {build_id} exported no {config!r} rows ({store.url(folder)})", 1)
    out.mkdir(parents=True, exist_ok=True)
    n = 0
    with Progress(console=err_console, transient=True) as bar:
        task = bar.add_task(f"{config} -> {fmt}", total=store.num_rows(parts))
        for table in store.iter_tables(parts, models[config]):
            try:
                for rollout_id, doc in atif_documents(table.to_pylist()):
                    tmp = out / f".{rollout_id}.json.tmp"
                    tmp.write_text(json.dumps(doc, ensure_ascii=False, indent=1))
                    tmp.replace(out / f"{rollout_id}.json")
                    n += 1
                    bar.advance(task)
            except ValueError as err:  # a row the format cannot hold, named
                _fail(f"build {build_id}, {config}: {err}", 1)
    console.print(f"[green]✓[/] {n} {fmt} document(s) of build {build_id} ({config}) in {out}")


@app.command()
def explain(build_id: Optional[str] = typer.Argument(None), runs: str = typer.Option("./runs"),
            dataset: Optional[str] = typer.Option(None)):
    """Why each stage of a build was or was not reused."""
    from .explain import explain_build

    cfg = _build_config(runs, dataset, build_id)
    store = RunStore(cfg.runs, cfg.dataset)
    for line in explain_build(store, build_id or store.latest() or store.builds()[-1]):
        console.print(line, markup=False, highlight=False)  # fingerprints in [brackets] are not markup


@app.command()
def verify(trajectories: Path = typer.Option(..., "--trajectories", help="JSONL or Parquet of recorded trajectories"),
           envs: list[str] = typer.Option([], "--envs", help="task folder(s) or an `envs import --out` JSONL"),
           out: Path = typer.Option(Path("verified"), "--out", help="folder for verdicts.parquet and rejects.parquet"),
           config: Optional[Path] = typer.Option(None, help="sandbox / verifier settings from this build config")):
    """Re-verify trajectories you already have: replay their commands (no teacher), run the hidden tests,
    detect hacks, compute quality signals."""
    from ..schemas.common import Reject
    from ..schemas.verdict import Verdict
    from ..tasks.engine.store import RunStore
    from ..tasks.sandbox import DockerUnavailable
    from .reverify import reverify

    cfg = _load(config) if config else None
    try:
        verdicts, rejects, stats = reverify(str(trajectories), envs, cfg)
    except (ValueError, DockerUnavailable) as err:  # bad input; no engine, or no base image
        _fail(str(err), 1)
    store = RunStore(str(out.parent.resolve()), out.name)
    store.write_records(posixpath.join(store.root, "verdicts.parquet"), Verdict, verdicts)
    store.write_records(posixpath.join(store.root, "rejects.parquet"), Reject, rejects)
    store.write_json(posixpath.join(store.root, "stats.json"), stats)
    t = Table(title=f"re-verification of {trajectories}")
    for col in ("trajectories", "verified", "passed", "hack flags", "rejects"):
        t.add_column(col)
    t.add_row(str(stats.get("trajectories", 0)), str(stats.get("verified", 0)), str(stats.get("passed", 0)),
              ", ".join(f"{k}={v}" for k, v in stats.get("hacks", {}).items()) or "-",
              ", ".join(f"{k}={v}" for k, v in stats["rejects"].items()) or "-")
    console.print(t)
    for r in rejects[:20]:
        console.print(f"[red]✗[/] {r.key}: {r.reason}: {r.detail[:200]}")
    console.print(f"verdicts: {out / 'verdicts.parquet'}  rejects: {out / 'rejects.parquet'}")


@app.command()
def doctor(config: Path = typer.Argument(DEFAULT_CONFIG, help="the build config whose needs are checked")):
    """Check this machine for a build of CONFIG: Docker engine, storage cap, CPU features, free disk,
    base image, teacher. Exits non-zero when a check fails."""
    from .doctor import run_checks

    checks = run_checks(_load(config))
    t = Table(title=f"trajforge doctor · {config}")
    for col in ("check", "status", "found", "fix"):
        t.add_column(col, overflow="fold")
    style = {"ok": "[green]ok[/]", "warn": "[yellow]warn[/]", "fail": "[red]fail[/]"}
    for c in checks:
        t.add_row(c.name, style[c.status], c.detail, c.fix)
    console.print(t)
    failed = [c.name for c in checks if c.status == "fail"]
    if failed:
        _fail(f"{len(failed)} check(s) failed: {', '.join(failed)}", 1)


def _print_report_path(store: RunStore, build_id: str) -> None:
    from .report import report_path

    path = report_path(store, build_id)
    if store.exists(path):
        console.print(f"report:  {store.url(path)}", soft_wrap=True, markup=False, highlight=False)


@app.command()
def report(build_id: Optional[str] = typer.Argument(None, help="build id (default: latest)"),
           open_page: bool = typer.Option(False, "--open", help="open the page in a web browser"),
           compare: Optional[tuple[str, str]] = typer.Option(
               None, "--compare", help="two builds A B of the dataset: B's report compared with A "
                                       "(written to <B>/report/compare-<A>.html)"),
           runs: str = typer.Option("./runs"), dataset: Optional[str] = typer.Option(None)):
    """Write a build's HTML report (<build>/report/index.html: plots, stage table, yield, difficulty,
    episodes, trust, quality, comparison with the previous committed build, a trajectory browser)."""
    from .report import write_report

    old, new = compare if compare and all(compare) else (None, None)
    if old is not None and build_id is not None and build_id != new:
        _fail(f"--compare {old} {new} writes the report of {new}; drop the BUILD_ID argument ({build_id})")
    for b in (build_id, old, new):
        _name(b)
    store = _open_store(runs, _find_dataset(runs, dataset))
    build_id = new or build_id or store.latest() or (store.builds() or [None])[-1]
    if not build_id:
        _fail(f"no builds under {store.url(store.root)}")
    for b in (build_id, old):
        if b is not None and store.read_build(b) is None:
            _fail(f"build {b!r} not found under {store.url(store.root)} (builds: {', '.join(store.builds())})")
    try:
        path = write_report(store, build_id, old)
    except (OSError, ValueError) as err:
        _fail(f"cannot write the report of build {build_id}: {err}", 1)
    console.print(f"report:  {path}", soft_wrap=True, markup=False, highlight=False)
    if open_page:
        import webbrowser

        webbrowser.open(Path(path).resolve().as_uri() if store.local else path)


# ---- the persistent stack and deployments (flows/stack.py, flows/deployments.py) ----
stack_app = typer.Typer(add_completion=False, no_args_is_help=True,
                        help="The persistent stack: PostgreSQL, Prefect server + UI, worker, Dask.")
app.add_typer(stack_app, name="stack")
STACK_HOME = typer.Option(None, "--home", help="state folder (default: $TRAJFORGE_STACK_DIR or "
                                                "~/.local/share/trajforge/stack)")


@stack_app.command("up")
def stack_up(home: Optional[Path] = STACK_HOME,
             bind: Optional[str] = typer.Option(None, help="listen address of the API and the Dask scheduler "
                                                          "(0.0.0.0: reachable from other hosts)"),
             advertise: Optional[str] = typer.Option(None, help="address workers are given (default: this host's)"),
             prefect_port: Optional[int] = typer.Option(None), dask_port: Optional[int] = typer.Option(None),
             pg_port: Optional[int] = typer.Option(None),
             workers: Optional[int] = typer.Option(None, help="Prefect process workers"),
             dask_workers: Optional[int] = typer.Option(None, help="Dask worker processes")):
    """Start whatever part of the stack is not running (a no-op when all are healthy)."""
    from .stack import Stack, StackError, load_settings

    s = load_settings(home, bind=bind, advertise=advertise, prefect_port=prefect_port, dask_port=dask_port,
                      pg_port=pg_port, prefect_workers=workers, dask_workers=dask_workers)
    try:
        started = Stack(s, say=err_console.print).up()
    except StackError as err:
        _fail(str(err), 1)
    console.print(("started: " + ", ".join(started)) if started else "stack already up: nothing started")
    console.print(f"Prefect UI  {s.ui_url}\nexport PREFECT_API_URL={s.api_url}\n"
                  f"builds on the stack's Dask workers: trajforge build CONFIG --dask-address {s.dask_address} "
                  "(or dask.address in the config; deployments use it by themselves)",
                  soft_wrap=True, markup=False, highlight=False)


@stack_app.command("down")
def stack_down(home: Optional[Path] = STACK_HOME,
               purge: bool = typer.Option(False, help="also delete the state folder (database, logs)")):
    """Stop every part of the stack and everything they started."""
    from .stack import Stack, load_settings

    n = Stack(load_settings(home), say=err_console.print).down(purge=purge)
    console.print(f"stack down: {n} process(es) stopped" + (", state removed" if purge else ""))


@stack_app.command("status")
def stack_status(home: Optional[Path] = STACK_HOME):
    """Each part of the stack at HOME: running, healthy, pids, URL (exit 1 unless every part is healthy;
    a home without a stack fails, whatever else answers on its ports)."""
    from .stack import Stack, load_settings

    stack = Stack(load_settings(home))
    if not stack.has_state:
        _fail(f"no stack at {stack.home}: it holds no stack.json (status reports only the stack of this home, "
              f"never another one on the same ports; start one with `trajforge stack up --home {stack.home}`)", 1)
    st = stack.status()
    t = Table(title="trajforge stack")
    for col in ("part", "running", "healthy", "pids", "url", "detail"):
        t.add_column(col, overflow="fold")
    for p in st:
        t.add_row(p.name, "yes" if p.running else "no", "[green]ok[/]" if p.healthy else "[red]no[/]",
                  " ".join(map(str, p.pids)), p.url, p.detail)
    console.print(t)
    if not all(p.healthy for p in st):
        raise typer.Exit(1)


@app.command()
def deploy(config: Path = typer.Argument(..., help="build config (YAML)"),
           cron: list[str] = typer.Option(..., "--cron", help='e.g. "0 2 * * *" (repeatable)'),
           timezone: str = typer.Option("UTC", help="the crons' timezone"),
           name: Optional[str] = typer.Option(None, help="deployment name (default: the dataset)"),
           publish_to: Optional[str] = typer.Option(None, "--publish-to", help="Hub repo a committed build is published to"),
           publish_append: bool = typer.Option(False, "--publish-append",
                                               help="publish with --append: add each build's shards to the published ones"),
           pool: str = typer.Option("trajforge", help="work pool"),
           failure_webhook: Optional[str] = typer.Option(None, "--failure-webhook",
                                                         help="URL POSTed when a build fails (deploy/automations/)")):
    """Schedule builds of CONFIG on the Prefect server at $PREFECT_API_URL (no YAML to edit): the
    deployment trajforge-build/<dataset>, one run at a time; run from the folder workers should use."""
    import os

    from .deployments import deploy_build, install_failure_webhook

    if not os.environ.get("PREFECT_API_URL"):
        _fail("PREFECT_API_URL is not set: start the stack (`trajforge stack up`) and export the URL it prints")
    cfg = _load(config)
    try:
        if publish_append and not publish_to:
            _fail("--publish-append needs --publish-to")
        dep = deploy_build(config, cron, timezone=timezone, name=name, publish_to=publish_to, pool=pool,
                           publish_append=publish_append)
        hook = install_failure_webhook(failure_webhook) if failure_webhook else None
    except Exception as err:  # the server: unreachable, a bad cron
        _fail(f"deploy failed: {err.__class__.__name__}: {err}", 1)
    console.print(f"[green]✓[/] deployment {dep} of {config}: {', '.join(cron)} ({timezone})"
                  + (f", published to {publish_to}" if publish_to else "")
                  + (" (appended)" if publish_append else "")
                  + (f", failure webhook automation {hook}" if hook else ""))
    console.print(f"runs:  {cfg.with_absolute_runs().runs}  (a relative `runs:` resolves against this folder, "
                  "where the worker runs the build)", soft_wrap=True, markup=False, highlight=False)


def main() -> None:  # pragma: no cover
    app()


if __name__ == "__main__":
    sys.exit(main())
