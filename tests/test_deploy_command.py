"""`trajforge deploy` as docs/scheduled-builds.md walks it, on the session's Prefect server: besides
`trajforge-build/<dataset>` it registers `trajforge-stage/stage` (the documented stage re-run then finds its
deployment) and `trajforge-publish/publish` with its committed-event trigger, as `prefect deploy --all` would."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest
from helpers import run_cli, venv_bin

pytestmark = pytest.mark.slow  # the session's Prefect server
ROOT = Path(__file__).resolve().parent.parent


def api(url: str, method: str, path: str, body: dict | None = None):
    r = httpx.request(method, url + path, json=body, timeout=60)
    r.raise_for_status()
    return r.json() if r.content else None


def test_deploy_registers_the_stage_and_publish_deployments_the_docs_use(prefect_api_url, tmp_path):
    url = prefect_api_url
    env = {**os.environ, "PREFECT_API_URL": url}
    clone = tmp_path / "clone"
    (clone / "configs").mkdir(parents=True)
    shutil.copyfile(ROOT / "configs" / "replay.yaml", clone / "configs" / "replay.yaml")
    pool = subprocess.run([venv_bin("prefect"), "work-pool", "create", "trajforge", "--type", "process"], env=env,
                          capture_output=True, text=True, timeout=300)
    assert pool.returncode == 0 or "already exists" in pool.stdout + pool.stderr, pool.stdout + pool.stderr
    made: list[str] = []
    try:
        for _ in range(2):  # deploying again updates, never doubles, the deployments and the publish trigger
            r = run_cli("deploy", "configs/replay.yaml", "--cron", "0 2 * * *", "--name", "replay-docs", cwd=clone,
                        prefect_api=url, timeout=300)
            assert r.returncode == 0, r.stdout + r.stderr
        deps = {f"{flow}/{name}": api(url, "GET", f"/deployments/name/{flow}/{name}") for flow, name in
                (("trajforge-build", "replay-docs"), ("trajforge-stage", "stage"), ("trajforge-publish", "publish"))}
        made = [d["id"] for d in deps.values()]
        for d in deps.values():
            assert d["work_pool_name"] == "trajforge"
            assert d["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(clone)}}]
        assert deps["trajforge-stage/stage"]["parameters"] == {"runs": "./runs", "force": True}
        assert deps["trajforge-stage/stage"]["entrypoint"] == "trajforge.flows.deployments:stage"

        # the documented stage re-run, word for word
        run = subprocess.run([venv_bin("prefect"), "deployment", "run", "trajforge-stage/stage", "-p", "build_id=b1",
                              "-p", "stage=verify", "-p", "dataset=replay"], cwd=clone, env=env, capture_output=True,
                             text=True, timeout=300)
        assert run.returncode == 0, run.stdout + run.stderr
        [flow_run] = api(url, "POST", "/flow_runs/filter",
                         {"deployments": {"id": {"any_": [deps["trajforge-stage/stage"]["id"]]}}})
        assert {k: flow_run["parameters"][k] for k in ("build_id", "stage", "dataset")} == {
            "build_id": "b1", "stage": "verify", "dataset": "replay"}
        assert flow_run["state_type"] == "SCHEDULED" and flow_run["work_pool_name"] == "trajforge"

        publish = deps["trajforge-publish/publish"]["id"]
        autos = [a for a in api(url, "POST", "/automations/filter", {})
                 if any(x.get("deployment_id") == publish for x in a["actions"])]
        assert len(autos) == 1, autos
        trigger = autos[0]["trigger"]
        assert trigger["expect"] == ["trajforge.build.committed"] and trigger["match"]["trajforge.publish"] == "true"
        assert autos[0]["actions"][0]["parameters"]["build_id"] == "{{ event.payload.build_id }}"
    finally:
        for dep_id in made:
            for fr in api(url, "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [dep_id]}}}):
                api(url, "DELETE", f"/flow_runs/{fr['id']}")
            api(url, "DELETE", f"/deployments/{dep_id}")
