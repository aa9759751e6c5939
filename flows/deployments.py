"""Deployment entrypoints (see `prefect.yaml`) and what a build shows in Prefect.

Flows: `build` (a config file, on a schedule), `stage` (re-run one stage of an existing build, reusing
the others), `publish` (a committed build to the Hub; triggered by `trajforge.build.committed`).
`announce` is called by the build flow when it ends: one table artifact per stage instance, one
markdown summary under the stable key `trajforge-<dataset>-summary` (so builds of a dataset line up
over time) and, when the build committed, the event `trajforge.build.committed` whose payload names the
dataset, the build id, the runs root and the export's row counts per config.

Invariants: artifacts and events never fail a build (a failure to report is printed, the build stands);
the event carries `trajforge.publish: "true"` only when the build was asked to publish (`publish_to`),
which is what the `publish` deployment's trigger matches; its payload's `publish_append` (the build's
`publish_append`) becomes the publish run's `append` (add the build's shards to the published ones).
"""

from __future__ import annotations

import contextvars
import os
import posixpath
import re
from pathlib import Path
from typing import Any

import yaml
from prefect import flow

from ..schemas.build import BuildRecord
from ..tasks.engine.store import RunStore

COMMITTED_EVENT = "trajforge.build.committed"
ROOT = Path(__file__).resolve().parent.parent
_publish_to: contextvars.ContextVar[str | None] = contextvars.ContextVar("trajforge_publish_to", default=None)
_publish_append: contextvars.ContextVar[bool] = contextvars.ContextVar("trajforge_publish_append", default=False)


def artifact_key(dataset: str, what: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) for `dataset`."""
    return re.sub(r"[^a-z0-9-]+", "-", f"trajforge-{dataset}-{what}".lower()).strip("-")


def _export_counts(store: RunStore, record: BuildRecord) -> dict[str, int]:
    export = record.committed("export")
    path = posixpath.join(export, "manifest.json") if export else None
    if not path or not store.exists(path):
        return {}
    return store.read_json(path).get("stats", {}).get("configs", {})


def _reasons(store: RunStore, manifest_dir: str | None) -> dict[str, int]:
    path = posixpath.join(manifest_dir, "manifest.json") if manifest_dir else None
    if not path or not store.exists(path):
        return {}
    return store.read_json(path).get("reject_reasons") or {}


def _status(record: BuildRecord, entry) -> str:
    """A stage left `running` by a build that ended (its shards failed) is shown as failed."""
    return "failed" if entry.status == "running" and record.status != "running" else entry.status


def _gate(entry) -> str:
    if entry.status == "failed":
        return "fail"
    if entry.status in ("committed", "reused"):
        return "pass (accepted: " + ", ".join(a.get("line", "?") for a in entry.gate["accepted"]) + ")" \
            if entry.gate and entry.gate.get("accepted") else "pass"
    return ""


def summary_markdown(store: RunStore, record: BuildRecord) -> str:
    """The build's summary: status, one line per stage, the export's rows, the report link if any."""
    lines = [f"# {record.dataset} · build `{record.build_id}` · {record.status}", ""]
    if record.error:
        lines += [f"**error:** `{record.error[:500]}`", ""]
    lines += ["| stage | status | rows | rejects | gate | fingerprint | reused from |", "|---|---|---|---|---|---|---|"]
    for name, e in record.stages.items():
        lines.append(f"| {name} | {_status(record, e)} | {'' if e.rows is None else e.rows} | "
                     f"{'' if e.rejects is None else e.rejects} | {_gate(e)} | `{e.fingerprint}` | {e.reused_from or ''} |")
    counts = _export_counts(store, record)
    if counts:
        lines += ["", "**export:** " + ", ".join(f"{k}: {v} rows" for k, v in counts.items())]
    if record.dataset_dir:
        lines += ["", f"**dataset:** `{record.dataset_dir}`"]
    report = posixpath.join(store.build_dir(record.build_id), "report", "index.html")
    if store.exists(report):
        url = store.url(report)
        lines += ["", f"**report:** [{url}]({'file://' + url if store.local else url})"]
    return "\n".join(lines) + "\n"


def announce(record: BuildRecord, store: RunStore) -> None:
    """Artifacts of the build (inside a flow run only) and, if it committed, the committed event."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact
    from prefect.context import FlowRunContext

    if FlowRunContext.get() is None:
        return
    for name, e in record.stages.items():
        rows = [{"field": k, "value": "" if v is None else str(v)} for k, v in (
            ("status", _status(record, e)), ("rows", e.rows), ("rejects", e.rejects), ("gate", _gate(e)),
            ("fingerprint", e.fingerprint), ("reused", e.status == "reused"), ("reused from", e.reused_from))]
        rows += [{"field": f"rejects: {r}", "value": str(n)} for r, n in sorted(_reasons(store, e.manifest).items())]
        if e.error:
            rows.append({"field": "error", "value": e.error[:1000]})
        create_table_artifact(rows, key=artifact_key(record.dataset, name),
                              description=f"{record.dataset} · build {record.build_id} · stage {name}")
    create_markdown_artifact(summary_markdown(store, record), key=artifact_key(record.dataset, "summary"),
                             description=f"{record.dataset} · build {record.build_id} · {record.status}")
    if record.status == "committed":
        emit_committed(store, record)


def emit_committed(store: RunStore, record: BuildRecord) -> None:
    from prefect.events import emit_event

    repo = _publish_to.get()
    emit_event(COMMITTED_EVENT, resource={
        "prefect.resource.id": f"trajforge.build.{record.dataset}.{record.build_id}",
        "prefect.resource.name": f"{record.dataset}/{record.build_id}",
        "trajforge.dataset": record.dataset, "trajforge.publish": "true" if repo else "false"},
        payload={"dataset": record.dataset, "build_id": record.build_id,
                 "runs": store.url(posixpath.dirname(store.root)), "rows": _export_counts(store, record),
                 "dataset_dir": record.dataset_dir, "publish_to": repo,
                 "publish_append": bool(repo) and _publish_append.get()})


def _dataset_of(config: str) -> str:
    try:
        return str((yaml.safe_load(Path(config).read_text()) or {}).get("dataset", "?"))
    except Exception:
        return Path(config).stem


def _build_run_name() -> str:
    from prefect.runtime import flow_run

    return f"build {_dataset_of(flow_run.parameters.get('config', '?'))}"


@flow(name="trajforge-build", flow_run_name=_build_run_name)
def build(config: str, build_id: str | None = None, publish_to: str | None = None, dask_address: str | None = None,
          from_stage: str | None = None, only: list[str] | None = None, force: list[str] | None = None,
          publish_append: bool = False) -> dict[str, Any]:
    """Run (or resume) a build of `config` (a path relative to the working directory, like a relative
    `runs:` in it: resolved to an absolute run store before any worker sees it). Shards run on
    `dask_address`, else the config's `dask.address`, else `$TRAJFORGE_DASK_ADDRESS` (the stack's
    workers set it), else a LocalCluster. `publish_to`: a Hub repo the committed build is published to;
    `publish_append`: published with `--append` (its shards added to the published ones)."""
    from ..schemas.config import load_config
    from .launch import run_build

    cfg = load_config(Path(config))
    address = dask_address or cfg.dask.address or os.environ.get("TRAJFORGE_DASK_ADDRESS") or None
    token, append_token = _publish_to.set(publish_to), _publish_append.set(publish_append)
    try:
        return run_build(cfg, build_id, from_stage, only, force, address)
    finally:
        _publish_to.reset(token)
        _publish_append.reset(append_token)


@flow(name="trajforge-stage", flow_run_name="{stage} of {dataset} {build_id}")
def stage(build_id: str, stage: str, dataset: str, runs: str = "./runs", force: bool = True,
          dask_address: str | None = None, config: str | None = None) -> dict[str, Any]:
    """Re-run one stage of an existing build against its committed upstream outputs, then the stages after
    it that read other rows than before (`launch.run_stage`: the same rule as `trajforge stage`); with the build's own stored config, or `config` (a YAML file on the worker: needed when the
    stored one has redacted secrets; its redacted form must equal the stored one)."""
    from ..schemas.config import load_config
    from ..tasks.pipeline import STAGE_NAMES
    from .build import stored_build_config
    from .launch import run_stage

    if stage not in STAGE_NAMES:
        raise ValueError(f"stage: unknown stage {stage!r}; valid stages: {', '.join(STAGE_NAMES)}")
    store = RunStore(runs, dataset, create=False)
    rec = store.read_build(build_id)
    if rec is None:
        raise ValueError(f"build_id: build {build_id!r} not found under {store.url(store.root)}")
    cfg = stored_build_config(rec.config, store.build_record_path(build_id), load_config(config) if config else None,
                              how="the `config` parameter").model_copy(update={"runs": runs})
    address = dask_address or cfg.dask.address or os.environ.get("TRAJFORGE_DASK_ADDRESS") or None
    return run_stage(cfg, build_id, stage, address, force=force)


@flow(name="trajforge-publish", flow_run_name="publish {dataset} {build_id} to {repo_id}")
def publish(build_id: str, repo_id: str, dataset: str, runs: str = "./runs", private: bool = False,
            endpoint: str | None = None, tag: bool = True, append: bool = False,
            environments: str = "none") -> dict[str, Any]:
    """Publish a committed build to the Hub repo `repo_id` (`endpoint` or `$HF_ENDPOINT`: another Hub);
    `append`: add its shards to the last published build's (`trajforge publish --append`);
    `environments` (`none`, `rl`, `kept`): also its environments as a Harbor task tree (`trajforge publish
    --environments`)."""
    from prefect.artifacts import create_markdown_artifact

    from .publish import publish as do_publish

    store = RunStore(runs, dataset, create=False)
    endpoint = endpoint or os.environ.get("HF_ENDPOINT")
    api = None
    if endpoint:
        from huggingface_hub import HfApi

        api = HfApi(endpoint=endpoint, token=os.environ.get("HF_TOKEN"))
    rec = do_publish(store, build_id, repo_id, private=private, tag=tag, api=api, append=append,
                     environments=environments)
    create_markdown_artifact(f"published build `{build_id}` of {dataset} to `{repo_id}` "
                             f"({', '.join(rec['configs'])}){': ' + rec['url'] if rec.get('url') else ''}\n",
                             key=artifact_key(dataset, "published"))
    return rec


# ---- `trajforge deploy` and the failure webhook (what `prefect deploy` / `prefect automation create` do) ----

def deploy_build(config: Path, crons: list[str], *, timezone: str = "UTC", name: str | None = None,
                 publish_to: str | None = None, pool: str = "trajforge", working_dir: Path | None = None,
                 api_url: str | None = None, publish_append: bool = False) -> str:
    """Create or update the deployment `trajforge-build/<name>` (default: the config's dataset) that
    builds `config` on each cron schedule; one run at a time (a fire while one runs is cancelled).
    The worker runs it in `working_dir` (default: the current directory), where `config` is read.
    `api_url`: the server (default: Prefect's setting); `publish_append`: builds are published with
    `--append`. Also creates or updates the project's `COMPANIONS` (`trajforge-stage/stage`,
    `trajforge-publish/publish` with its trigger), as `prefect deploy --all` would, in the same
    `working_dir` and pool. Returns the build deployment's id."""
    import anyio

    with _api(api_url):
        return anyio.run(_deploy_build, config, crons, timezone, name, publish_to, pool, working_dir, publish_append)


async def _deploy_build(config, crons, timezone, name, publish_to, pool, working_dir, publish_append=False) -> str:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import DeploymentScheduleCreate
    from prefect.client.schemas.objects import ConcurrencyOptions
    from prefect.client.schemas.schedules import CronSchedule
    from prefect.utilities.callables import parameter_schema

    from ..schemas.config import load_config

    workdir = Path(working_dir or Path.cwd()).resolve()
    cfg_path = Path(config)
    rel = cfg_path.resolve().relative_to(workdir) if cfg_path.resolve().is_relative_to(workdir) else cfg_path.resolve()
    dataset = load_config(cfg_path.resolve()).dataset  # a bad config fails here, not at 02:00
    schedules = [DeploymentScheduleCreate(schedule=CronSchedule(cron=c, timezone=timezone), slug=f"cron-{i}")
                 for i, c in enumerate(crons)]
    async with get_client() as client:
        await _deploy_companions(client, workdir, pool)
        flow_id = await client.create_flow_from_name(build.name)
        dep_id = await client.create_deployment(
            flow_id=flow_id, name=name or dataset, work_pool_name=pool, entrypoint="trajforge.flows.deployments:build",
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(workdir)}}],
            parameters={"config": str(rel), "publish_to": publish_to,
                        **({"publish_append": True} if publish_append else {})},
            parameter_openapi_schema=parameter_schema(build).model_dump_for_openapi(), schedules=schedules,
            concurrency_limit=1, concurrency_options=ConcurrencyOptions(collision_strategy="CANCEL_NEW"),
            tags=["trajforge", dataset])
    return str(dep_id)


PROJECT_FILE = ROOT / "prefect.yaml"
COMPANIONS = {"stage": stage, "publish": publish}
"""The project's deployments (by name in `prefect.yaml`) that every scheduled build needs beside it: a stage
re-run and the publish its committed event triggers. `trajforge deploy` registers them from `prefect.yaml`, so
the two ways to deploy give the same deployments."""


def companion_specs(project: Path = PROJECT_FILE) -> list[dict[str, Any]]:
    """The `COMPANIONS` entries of the project file `project`; one missing is an error naming it."""
    entries = {d.get("name"): d for d in (yaml.safe_load(project.read_text()) or {}).get("deployments") or []}
    missing = [n for n in COMPANIONS if n not in entries]
    if missing:
        raise ValueError(f"{project}: deployments: no entry named {', '.join(missing)} (trajforge deploy registers "
                         "them beside the build)")
    return [entries[n] for n in COMPANIONS]


async def _deploy_companions(client, workdir: Path, pool: str) -> list[str]:
    """Create or update each `COMPANIONS` deployment as `prefect.yaml` defines it (entrypoint, parameters, tags,
    triggers), run by `pool`'s workers in `workdir`; its triggers replace the ones it had. Returns their ids."""
    from prefect.events import DeploymentTriggerTypes
    from prefect.utilities.callables import parameter_schema
    from pydantic import TypeAdapter

    ids = []
    for spec in companion_specs():
        fn = COMPANIONS[spec["name"]]
        if spec.get("entrypoint") != f"trajforge.flows.deployments:{fn.fn.__name__}":
            raise ValueError(f"{PROJECT_FILE}: deployments: {spec['name']}: entrypoint {spec.get('entrypoint')!r} is "
                             f"not trajforge.flows.deployments:{fn.fn.__name__}")
        flow_id = await client.create_flow_from_name(fn.name)
        dep_id = await client.create_deployment(
            flow_id=flow_id, name=spec["name"], work_pool_name=pool, entrypoint=spec["entrypoint"],
            pull_steps=[{"prefect.deployments.steps.set_working_directory": {"directory": str(workdir)}}],
            parameters=dict(spec.get("parameters") or {}), description=spec.get("description"),
            parameter_openapi_schema=parameter_schema(fn).model_dump_for_openapi(), tags=list(spec.get("tags") or []))
        await client.delete_resource_owned_automations(f"prefect.deployment.{dep_id}")
        for i, trigger in enumerate(spec.get("triggers") or [], start=1):
            t = TypeAdapter(DeploymentTriggerTypes).validate_python({"name": f"{spec['name']}__automation_{i}",
                                                                     **trigger})
            t.set_deployment_id(dep_id)
            await client.create_automation(t.as_automation())
        ids.append(str(dep_id))
    return ids


FAILURE_TEMPLATE = ROOT / "deploy" / "automations" / "build-failed-webhook.yaml"
WEBHOOK_BLOCK = "trajforge-build-failed"


def install_failure_webhook(url: str, template: Path = FAILURE_TEMPLATE, api_url: str | None = None) -> str:
    """A Webhook block `trajforge-build-failed` posting to `url` and the automation of `template`
    calling it when a build flow run fails or crashes (both replaced if present), on the server at
    `api_url` (default: Prefect's setting). Returns the automation id."""
    import anyio

    with _api(api_url):
        return anyio.run(_install_failure_webhook, url, template)


def _api(url: str | None):
    import contextlib

    from prefect.settings import PREFECT_API_URL, temporary_settings

    return temporary_settings(updates={PREFECT_API_URL: url}) if url else contextlib.nullcontext()


async def _install_failure_webhook(url: str, template: Path) -> str:
    from prefect.blocks.webhook import Webhook
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import AutomationCore

    block_id = await Webhook(url=url, method="POST").asave(WEBHOOK_BLOCK, overwrite=True)
    spec = yaml.safe_load(template.read_text().replace("{{ webhook_block_id }}", str(block_id)))
    automation = AutomationCore.model_validate(spec)
    async with get_client() as client:
        for old in await client.read_automations_by_name(automation.name):
            await client.delete_automation(old.id)
        return str(await client.create_automation(automation))
