"""Scheduled builds on the persistent stack, for real: PostgreSQL started with Debian's binaries, `prefect
server start` on it (bound to a non-loopback address only: the module runs in a network namespace of its
own), a `process` work pool, `prefect
deploy --all` of the repository's prefect.yaml, `prefect worker start --run-once`, a Dask scheduler and
worker started as separate processes that were given the API URL. One stack for the whole module; the
last test (`ends_module_fixture`: last in any order) takes it down and checks nothing is left.

The replay builds use the smallest config (one environment, one sample): after the first one, the
scheduled build and the stage re-run reuse its committed stages.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import psutil
import pytest
import yaml
from helpers import run_cli, small_config, venv_bin
from hosts_kit import in_new_netns

from trajforge.flows.stack import Stack, StackSettings
from trajforge.tasks.engine.store import RunStore

pytestmark = [pytest.mark.docker, pytest.mark.slow]
ROOT = Path(__file__).resolve().parent.parent
WAIT = 180  # an upper bound for things the server does on its own (scheduling, automations): not an assertion


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def stack():
    """The stack, bound to a non-loopback address only (so nothing reaches it through 127.0.0.1): the address
    of a network namespace this module creates and runs in (its CLI calls, workers and requests too), never
    the machine's own interface."""
    with in_new_netns("tft-stack", "198.51.100.40") as host:
        yield from _stack(host)


def _stack(host: str):
    home = Path(tempfile.mkdtemp(prefix="trajforge-stack-", dir="/tmp"))
    home.chmod(0o755)  # the `postgres` user (as root) must reach its cluster folder
    settings = StackSettings(home=home, bind=host, pg_port=_free_port("127.0.0.1"), prefect_port=_free_port(host),
                             dask_port=_free_port(host), prefect_workers=0, dask_workers=1, dask_threads=4)
    st = Stack(settings)
    fast = {"PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",  # the test's schedules are seconds ahead
            "PREFECT_SERVER_SERVICES_EVENT_PERSISTER_FLUSH_INTERVAL": "1"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in fast.items():
            mp.setenv(k, v)
        mp.delenv("PREFECT_API_URL", raising=False)
        try:
            st.up()
        except Exception:
            st.down(purge=True)
            raise
        mp.setenv("PREFECT_API_URL", settings.api_url)
        yield st
        st.down(purge=True)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """The smallest replay build config, as a file (deployments take a path)."""
    d = tmp_path_factory.mktemp("sched")
    cfg = small_config(d / "runs", dataset="tiny", **{"rollout.samples_per_env": 1, "rollout.episodes_per_shard": 1})
    cfg["synthesize"]["families"] = cfg["synthesize"]["families"][:1]
    path = d / "tiny.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path, cfg


def _api(st: Stack, method: str, path: str, body: dict | None = None):
    r = httpx.request(method, st.s.api_url + path, json=body, timeout=30)
    r.raise_for_status()
    return r.json() if r.content else None


def _deployment(st: Stack, name: str) -> dict:
    flow, dep = name.split("/")
    return _api(st, "GET", f"/deployments/name/{flow}/{dep}")


def _create_run(st: Stack, deployment: str, **parameters) -> str:
    dep = _deployment(st, deployment)
    return _api(st, "POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": parameters})["id"]


# Set by the `hub` fixture: every worker of the module publishes to the loopback Hub, whichever test's worker
# polls first after a committed event made the publish run (a `--run-once` worker takes every run due).
WORKER_ENV: dict[str, str] = {}


def _run_worker_once(st: Stack, **env: str) -> subprocess.CompletedProcess:
    """`prefect worker start --run-once` with the API URL and the Dask address given explicitly."""
    full = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    full.update(PREFECT_API_URL=st.s.api_url, TRAJFORGE_DASK_ADDRESS=st.s.dask_address,
                PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_HOME=str(st.home / "prefect"), **WORKER_ENV,
                **env)
    return subprocess.run([sys.executable, "-m", "prefect", "worker", "start", "--pool", st.s.pool, "--type",
                           "process", "--run-once"], cwd=ROOT, env=full, capture_output=True, text=True, timeout=600)


def _flow_run(st: Stack, run_id: str) -> dict:
    return _api(st, "GET", f"/flow_runs/{run_id}")


def _until(what: str, fn, timeout: float = WAIT):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = fn()
        if got:
            return got
        time.sleep(0.25)
    raise AssertionError(f"{what}: not within {timeout}s")


def test_stack_is_healthy_and_up_again_is_a_noop(stack):
    assert all(p.healthy for p in stack.status()), stack.status()
    # the processes the stack started and recorded (their children come and go with the work other tests gave
    # it: PostgreSQL's per-connection backends, flow-run processes)
    recorded = lambda: {part.name: part.pids for part in stack.status()}  # noqa: E731
    pids = recorded()
    r = run_cli("stack", "up", "--home", str(stack.home), cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert "nothing started" in r.stdout
    assert recorded() == pids and all(pids[part] for part in ("postgres", "prefect-server", "dask-workers"))
    # the Dask worker was given the API's non-loopback address, and the API is not on loopback at all
    info = stack.dask_info()
    assert info["workers"] == 1 and set(info["api_urls"].values()) == {stack.s.api_url}
    assert not stack.s.api_url.startswith("http://127.")
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"http://127.0.0.1:{stack.s.prefect_port}/api/health", timeout=5)


@pytest.fixture(scope="module")
def project(stack):
    """`prefect deploy --all` of the repository's prefect.yaml (the deployments and the publish trigger the
    other tests use: each test that needs them asks for this, so it passes when run alone); the demo's
    nightly schedule is paused (no scheduled demo build may start during the tests)."""
    env = {**os.environ, "PREFECT_API_URL": stack.s.api_url}
    r = subprocess.run([sys.executable, "-m", "prefect", "--no-prompt", "deploy", "--all"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    demo = _deployment(stack, "trajforge-build/demo")
    nightly = next(s for s in demo["schedules"] if s["slug"] == "nightly")
    _api(stack, "PATCH", f"/deployments/{demo['id']}/schedules/{nightly['id']}", {"active": False})
    return nightly


def test_deploy_all_registers_the_project(stack, project):
    env = {**os.environ, "PREFECT_API_URL": stack.s.api_url}
    demo = _deployment(stack, "trajforge-build/demo")
    nightly = project
    assert nightly["schedule"]["cron"] == "0 2 * * *" and nightly["schedule"]["timezone"] == "UTC"
    assert demo["global_concurrency_limit"]["limit"] == 1
    assert demo["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
    assert demo["pull_steps"][0]["prefect.deployments.steps.set_working_directory"]["directory"] == str(ROOT)
    for name in ("trajforge-build/replay", "trajforge-stage/stage", "trajforge-publish/publish"):
        assert _deployment(stack, name)["work_pool_name"] == "trajforge"
    # the no-YAML helper: same shape of deployment
    r = subprocess.run([venv_bin("trajforge"), "deploy", "configs/replay.yaml", "--cron", "30 3 * * 1", "--timezone",
                        "Europe/Paris", "--name", "replay-weekly", "--publish-to", "org/replay"], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    weekly = _deployment(stack, "trajforge-build/replay-weekly")
    assert weekly["parameters"] == {"config": "configs/replay.yaml", "publish_to": "org/replay"}
    assert [(s["schedule"]["cron"], s["schedule"]["timezone"]) for s in weekly["schedules"]] == [("30 3 * * 1", "Europe/Paris")]
    assert weekly["global_concurrency_limit"]["limit"] == 1
    assert weekly["concurrency_options"]["collision_strategy"] == "CANCEL_NEW"
    assert weekly["entrypoint"] == "trajforge.flows.deployments:build" and weekly["work_pool_name"] == "trajforge"
    _api(stack, "DELETE", f"/deployments/{weekly['id']}")
    autos = _api(stack, "POST", "/automations/filter", {})
    publish = _deployment(stack, "trajforge-publish/publish")
    trig = [a for a in autos if any(x.get("deployment_id") == publish["id"] for x in a["actions"])]
    assert trig and trig[0]["trigger"]["expect"] == ["trajforge.build.committed"]


@pytest.fixture(scope="module")
def hub(stack, tmp_path_factory):
    """The loopback Hub (in the stack's namespace), given to every worker the module starts from now on."""
    from hub_server import HubServer

    server = HubServer(tmp_path_factory.mktemp("hub")).start()
    # the loopback Hub speaks LFS: with hf_xet installed the client would upload through Xet unless told not to
    WORKER_ENV.update(HF_ENDPOINT=server.endpoint, HF_TOKEN="hf_test", HF_HUB_DISABLE_XET="1")
    yield server
    WORKER_ENV.clear()
    server.stop()


@pytest.fixture(scope="module")
def shipped(stack, tmp_path_factory):
    """configs/replay.yaml as shipped (`runs: ./runs`, a relative path), deployed with `trajforge deploy` from a
    folder of its own as docs/scheduled-builds.md says, and a run of it under way: a `worker --run-once` in the
    background that has claimed the run (so no other test's worker takes it, and it takes no other run). The
    biggest build of the module runs beside the others (`first_build` starts it); the test joins it.
    Yields (the clone folder, `deploy`'s result, the run id, the worker's future)."""
    from concurrent.futures import ThreadPoolExecutor

    work = tmp_path_factory.mktemp("shipped") / "clone"
    (work / "configs").mkdir(parents=True)
    shutil.copyfile(ROOT / "configs" / "replay.yaml", work / "configs" / "replay.yaml")
    assert yaml.safe_load((work / "configs" / "replay.yaml").read_text())["runs"] == "./runs"  # unchanged
    env = {**os.environ, "PREFECT_API_URL": stack.s.api_url}
    deployed = subprocess.run([venv_bin("trajforge"), "deploy", "configs/replay.yaml", "--cron", "0 2 * * *",
                               "--name", "replay-shipped"], cwd=work, env=env, capture_output=True, text=True,
                              timeout=300)
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr
    dep = _deployment(stack, "trajforge-build/replay-shipped")
    pool = ThreadPoolExecutor(1)
    try:
        for s in dep["schedules"]:  # no 02:00 fire during the tests
            _api(stack, "PATCH", f"/deployments/{dep['id']}/schedules/{s['id']}", {"active": False})
        run_id = _create_run(stack, "trajforge-build/replay-shipped")
        worker = pool.submit(_run_worker_once, stack)
        _until("the shipped run claimed by its worker",
               lambda: worker.done() or _flow_run(stack, run_id)["state_type"] != "SCHEDULED")
        yield work, deployed, run_id, worker
    finally:
        pool.shutdown(wait=True)  # the build ends before the fixture does
        with contextlib.suppress(httpx.HTTPError):  # the last test may have taken the stack down already
            _api(stack, "DELETE", f"/deployments/{dep['id']}")


@pytest.fixture(scope="module")
def first_build(stack, project, shipped, tiny, hub):
    """A `trajforge-build/replay` run of the tiny config, asked to publish, run by `worker --run-once` (while the
    shipped config's run, started first, goes on beside it). The publish run its committed event makes is run by
    the next worker any test starts (each publishes to `hub`)."""
    path, cfg = tiny
    run_id = _create_run(stack, "trajforge-build/replay", config=str(path), publish_to="trajforge-test/tiny")
    r = _run_worker_once(stack)
    run = _flow_run(stack, run_id)
    assert run["state_type"] == "COMPLETED", r.stdout[-4000:] + r.stderr[-4000:]
    store = RunStore(cfg["runs"], "tiny")
    build_id = store.latest()
    # the committed event has made its publish run before any test goes on (one that re-deploys the project
    # re-creates the publish trigger: an event evaluated after that would find none)
    _until("the publish run of the committed event", lambda: _publish_runs(stack, build_id))
    return run, store, build_id


def _publish_runs(st: Stack, build_id: str) -> list[dict]:
    publish = _deployment(st, "trajforge-publish/publish")
    runs = _api(st, "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [publish["id"]]}}})
    return [r for r in runs if r["parameters"].get("build_id") == build_id]


def test_build_deployment_commits_with_artifacts_and_event(stack, first_build):
    run, store, build_id = first_build
    rec = store.read_build(build_id)
    assert rec.status == "committed" and run["name"] == "build tiny"
    # the build's flow and task runs carry the dataset, build id and stage; the shards ran in the stack's
    # Dask worker, which reported them to the API through the non-loopback address it was given
    subflows = _api(stack, "POST", "/flow_runs/filter", {"flow_runs": {"parent_flow_run_id": {"any_": [run["id"]]}}})
    child = _api(stack, "POST", "/flow_runs/filter",
                 {"flow_runs": {"name": {"any_": [f"tiny {build_id}"]}}})
    assert child, subflows
    # this build's artifacts (other tests of the module build the same dataset: "latest" may be theirs)
    ours = [run["id"], *(c["id"] for c in child)]
    arts = {a["key"]: a for a in sorted(_api(stack, "POST", "/artifacts/filter",
                                             {"artifacts": {"flow_run_id": {"any_": ours}}}), key=lambda a: a["created"])
            if a.get("key")}
    summary = arts["trajforge-tiny-summary"]
    assert summary["type"] == "markdown" and build_id in summary["data"] and "| export | committed |" in summary["data"]
    for stage in rec.stages:
        table = json.loads(arts[f"trajforge-tiny-{stage}"]["data"])
        fields = {row["field"]: row["value"] for row in table}
        assert fields["status"] == "committed" and fields["fingerprint"] == rec.stages[stage].fingerprint
    shards = _api(stack, "POST", "/task_runs/filter", {"task_runs": {"name": {"like_": f"{build_id} rollout"}}})
    assert shards and {t["state_type"] for t in shards} == {"COMPLETED"}
    dask_pids = {c.pid for p in stack._procs("dask-workers") for c in [p, *p.children(recursive=True)]}
    rollout_dir = rec.stages["rollout"].manifest
    markers = [json.loads(store.fs.cat(p)) for p in store.fs.glob(f"{rollout_dir}/_done/*")]
    assert markers and all(int(m["worker"].rsplit(":", 1)[1]) in dask_pids for m in markers)
    events = _api(stack, "POST", "/events/filter", {"filter": {"event": {"name": ["trajforge.build.committed"]}}})
    ev = next(e for e in events["events"] if e["payload"]["build_id"] == build_id)
    assert ev["payload"]["dataset"] == "tiny" and ev["payload"]["rows"].get("trajectories") == 1
    assert ev["resource"]["trajforge.publish"] == "true"


def test_committed_event_triggers_publish(stack, first_build, hub):
    run, store, build_id = first_build
    [prun] = _until("the publish run the committed event triggers", lambda: _publish_runs(stack, build_id))
    assert prun["parameters"] == {"build_id": build_id, "dataset": "tiny", "runs": store.url(os.path.dirname(store.root)),
                                  "repo_id": "trajforge-test/tiny", "append": False}  # a build not published --append
    # another test's worker (each publishes to `hub`) may have taken it already; if not, a worker of its own
    log = ""
    if _flow_run(stack, prun["id"])["state_type"] == "SCHEDULED":
        r = _run_worker_once(stack)
        log = r.stdout[-4000:] + r.stderr[-4000:]
    final = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}
    state = _until("the publish run ends", lambda: (s := _flow_run(stack, prun["id"])["state_type"]) in final and s)
    assert state == "COMPLETED", log
    files = hub.files("trajforge-test/tiny", revision=build_id)
    assert "README.md" in files and any(p.endswith(".parquet") for p in files)


# A sitecustomize put on the worker's PYTHONPATH (its flow-run processes inherit it): a flow-run process waits,
# holding the deployment's slot, until the test creates $TRAJFORGE_TEST_HOLD (bounded), so the other fires
# are refused while the first one runs whatever the machine's speed.
HOLD_HOOK = """import os, pathlib, time
if os.environ.get("PREFECT__FLOW_RUN_ID") and os.environ.get("TRAJFORGE_TEST_HOLD"):
    _end = time.monotonic() + 300
    while not pathlib.Path(os.environ["TRAJFORGE_TEST_HOLD"]).exists() and time.monotonic() < _end:
        time.sleep(0.2)
"""


def test_interval_schedule_runs_a_build_and_a_second_fire_is_cancelled(stack, first_build, tiny, tmp_path):
    """An interval schedule (every 5 s, anchored seconds ahead) makes the scheduler create runs that one
    worker poll picks up together (both due before it polls): one builds (reusing the committed stages), held
    until a second fire has been refused; every other fire finds the deployment's one slot taken and is
    cancelled (CANCEL_NEW), none runs beside it."""
    from concurrent.futures import ThreadPoolExecutor

    path, _ = tiny
    _, store, _ = first_build
    builds_before = set(store.builds())
    dep = _deployment(stack, "trajforge-build/replay")
    anchor = dt.datetime.now(dt.timezone.utc) + dt.timedelta(seconds=6)
    [sched] = _api(stack, "POST", f"/deployments/{dep['id']}/schedules", [{
        "schedule": {"interval": 5, "anchor_date": anchor.isoformat(), "timezone": "UTC"}, "active": True,
        "max_scheduled_runs": 2, "parameters": {"config": str(path)}, "slug": "test-interval"}])

    def runs():
        got = _api(stack, "POST", "/flow_runs/filter", {"deployments": {"id": {"any_": [dep["id"]]}}})
        return [r for r in got if r["auto_scheduled"]]

    fires = _until("two scheduled runs", lambda: len(got := runs()) >= 2 and got)
    second = sorted(dt.datetime.fromisoformat(x["expected_start_time"]) for x in fires)[1]
    _until("both fires are due", lambda: dt.datetime.now(dt.timezone.utc) >= second, 60)
    hook, gate = tmp_path / "hook", tmp_path / "release"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text(HOLD_HOOK)
    pythonpath = os.pathsep.join(filter(None, [str(hook), os.environ.get("PYTHONPATH")]))
    with ThreadPoolExecutor(1) as pool:
        worker = pool.submit(_run_worker_once, stack, PYTHONPATH=pythonpath, TRAJFORGE_TEST_HOLD=str(gate))
        try:
            _until("a fire cancelled while the first holds the slot",
                   lambda: worker.done() or "CANCELLED" in [x["state_type"] for x in runs()])
        finally:
            gate.touch()
        r = worker.result()
    _api(stack, "DELETE", f"/deployments/{dep['id']}/schedules/{sched['id']}")  # no more fires
    states = [x["state_type"] for x in runs()]
    for x in runs():  # fires after the worker's poll: not the test's business
        if x["state_type"] == "SCHEDULED":
            _api(stack, "DELETE", f"/flow_runs/{x['id']}")
    log = r.stdout[-3000:] + r.stderr[-3000:]
    assert states.count("COMPLETED") == 1 and states.count("CANCELLED") >= 1, (states, log)
    assert not {"RUNNING", "PENDING", "FAILED", "CRASHED"} & set(states), (states, log)
    [new] = set(store.builds()) - builds_before  # one build, made by the scheduler's run
    assert store.read_build(new).status == "committed"
    assert all(x["parameters"]["config"] == str(path) for x in runs())


@pytest.mark.late_in_module  # it commits the module's shared build again (statuses, artifacts, a committed event)
def test_stage_deployment_reruns_one_stage_and_reuses_the_others(stack, first_build):
    run, store, build_id = first_build
    run_id = _create_run(stack, "trajforge-stage/stage", build_id=build_id, stage="verify", dataset="tiny",
                         runs=store.url(os.path.dirname(store.root)))
    r = _run_worker_once(stack)
    assert _flow_run(stack, run_id)["state_type"] == "COMPLETED", r.stdout[-4000:] + r.stderr[-4000:]
    rec = store.read_build(build_id)
    assert rec.stages["verify"].status == "committed"
    assert {rec.stages[s].status for s in ("propose", "synthesize", "rollout")} == {"reused"}


def test_a_shipped_config_runs_unchanged_as_a_deployment(stack, shipped):
    """configs/replay.yaml as shipped (`runs: ./runs`, a relative path), deployed with `trajforge deploy` from a
    folder of its own as docs/scheduled-builds.md says (the `shipped` fixture): the build commits on the stack's
    Dask workers (which run in the stack's state folder), in the run store of the folder `deploy` ran from, and
    nothing is written under the workers' folder."""
    work, deployed, run_id, worker = shipped
    assert f"runs:  {work / 'runs'}  " in deployed.stdout  # resolved against the folder `deploy` ran from
    r = worker.result()
    assert _flow_run(stack, run_id)["state_type"] == "COMPLETED", r.stdout[-4000:] + r.stderr[-4000:]
    store = RunStore(str(work / "runs"), "replay", create=False)
    assert store.read_build(store.latest()).status == "committed"
    assert not (stack.home / "runs").exists()


def test_failure_webhook_automation_calls_the_receiver(stack, project):
    from trajforge.flows.deployments import install_failure_webhook

    got: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *a):
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        install_failure_webhook(f"http://127.0.0.1:{srv.server_address[1]}/hook", api_url=stack.s.api_url)
        run_id = _create_run(stack, "trajforge-build/replay", config="does/not/exist.yaml")
        _run_worker_once(stack)
        assert _flow_run(stack, run_id)["state_type"] == "FAILED"
        _until("the webhook call", lambda: got)
    finally:
        srv.shutdown()
    assert got[0]["flow"] == "trajforge-build" and got[0]["state"] == "Failed"
    assert got[0]["flow_run_id"] == run_id and "does/not/exist.yaml" in got[0]["message"]


@pytest.mark.ends_module_fixture
def test_stack_down_leaves_no_process(stack):
    procs = stack.processes()
    assert len(procs) >= 4
    stack.down()
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not any(p.running for p in stack.status())
