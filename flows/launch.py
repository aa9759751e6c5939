"""Starting a build from a library call: the CLI's `build`, `stage` and `rerun`, the deployments and
the tests all go through `run_build`.

Invariant: the build's lease is taken before anything of the build is started or reaped (the `sandboxes`
service reaps inside the flow, flows/services.py), so a build another live process holds raises LeaseHeld
and touches nothing (the process's Prefect API server may already be booting: it holds nothing of any build); a relative `runs` is resolved here, against the
current directory, before anything reaches a worker.
"""

from __future__ import annotations

from ..schemas.config import BuildConfig
from ..tasks.engine.store import RunStore
from . import runtime
from .console import err_console


def _pick_build(store: RunStore, cfg: BuildConfig, requested: str | None) -> tuple[str, str]:
    """(id, how): an explicit id; else resume the newest unfinished build of the same config; else a new id."""
    from .build import config_hash, new_build_id

    if requested:
        return requested, "explicit"
    want = config_hash(cfg)
    for b in reversed(store.builds()):
        rec = store.read_build(b)
        if rec is not None and rec.status != "committed" and rec.config_hash == want:
            return b, "resume"
        break  # only the newest build is a resume candidate
    return new_build_id(), "fresh"


def run_build(cfg: BuildConfig, build_id: str | None = None, from_stage: str | None = None,
              only: list[str] | None = None, force: list[str] | None = None, dask_address: str | None = None,
              retry: list[str] | None = None, accept: list[str] | None = None) -> dict:
    """Library entry point used by the CLI and the tests. Takes the build's lease first: a build
    another live process holds raises LeaseHeld before anything is started or reaped. `accept`: gate
    expectations (`rollout.format_error_share`, or the name in its suite) committed although they fail.
    A relative `runs` is resolved here, against the current directory, before anything reaches a worker."""
    runtime.launch_prefect_api()  # it boots in its own process while this one imports Prefect and claims the build
    from .build import claim_build

    cfg = cfg.with_absolute_runs()
    store = RunStore(cfg.runs, cfg.dataset)
    build_id, how = _pick_build(store, cfg, build_id)
    with claim_build(store, cfg, build_id, fresh=how == "fresh", say=err_console.print):
        if how == "resume":
            err_console.print(f"resuming unfinished build {build_id}")
        return _run_claimed(store, cfg, build_id, from_stage, only, force, dask_address, retry, accept)


def _run_claimed(store: RunStore, cfg: BuildConfig, build_id: str, from_stage: str | None, only: list[str] | None,
                 force: list[str] | None, dask_address: str | None, retry: list[str] | None,
                 accept: list[str] | None = None) -> dict:
    from .build import build_dataset

    address = dask_address or cfg.dask.address
    # the build's own cluster starts now, its workers importing the stage code while the API server boots
    early = None if address else runtime.EarlyCluster(cfg.dask.n_workers, cfg.dask.threads_per_worker,
                                                      cfg.dask.processes)
    try:
        runtime.warm_gate()  # the driver's imports are done: Great Expectations loads while it waits below
        runtime.ensure_prefect_api()  # leftover sandboxes are reaped by the stages' `sandboxes` service (services.py)
        runner = runtime.task_runner(address, cfg.dask.n_workers, cfg.dask.threads_per_worker, cfg.dask.processes,
                                     early)
        err_console.print(f"build {build_id} of dataset {cfg.dataset!r} in {store.url(store.build_dir(build_id))}"
                          + (f" on Dask scheduler {address}" if address else " on a local Dask cluster"))
        from ..tasks.redaction.secrets import shown_config  # Prefect stores flow-run parameters: env values redacted

        return build_dataset.with_options(task_runner=runner)(
            shown_config(cfg.model_dump(mode="json")), build_id, from_stage, only, force, retry=retry, accept=accept)
    finally:
        if early is not None:
            early.close()


def run_stage(cfg: BuildConfig, build_id: str, stage: str, dask_address: str | None = None, force: bool = True,
              accept: list[str] | None = None) -> dict:
    """`trajforge stage NAME --build ID` and the `trajforge-stage` deployment: re-run `stage` of a build (forced
    unless `force` is False) against its committed upstream outputs, then bring every stage after it up to date
    by the one reuse rule: a stage whose inputs hold the same rows as before is reused, any other runs again.
    So the build's record never shows a stage that read other rows than the ones before it now holds."""
    return run_build(cfg, build_id, stage, None, [stage] if force else None, dask_address, accept=accept)


def rerun_build(cfg: BuildConfig, stage: str, dask_address: str | None = None,
                accept: list[str] | None = None) -> dict:
    """`trajforge rerun`: always into a new build id. Reopening a committed output in the build that
    committed it would change that build in place (its manifest removed, its rows rewritten, what
    `latest` and its dataset link point at); in a new build the output is copied first."""
    from .build import new_build_id

    new = new_build_id()
    err_console.print(f"rerun of {stage}: into new build {new} (committed builds are left as they are)")
    return run_build(cfg, new, stage, None, None, dask_address, retry=[stage], accept=accept)
