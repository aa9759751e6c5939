"""The stack's bookkeeping and the deployment files, without a server: pid files that name a process by
pid and start time, `up` starting only what is missing, `down` stopping whole process trees, the
addresses workers are given, prefect.yaml / the automation template / compose.yaml as their tools read
them, and the build summary. The real stack runs in tests/test_deployments.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import psutil
import pytest
import yaml
from typer.testing import CliRunner

from trajforge.flows.stack import Stack, StackError, StackSettings, host_address, load_settings

ROOT = Path(__file__).resolve().parent.parent


def _fake_parts(stack: Stack, started: list[str]):
    """Two process parts (a process with a child) whose health is 'its processes are alive'."""
    def part(name):
        def start():
            stack._spawn(name, ["sh", "-c", "sleep 300 & exec sleep 301"], dict(os.environ))
            started.append(name)
        return (name, lambda: bool(stack._procs(name)), start, True)
    return [part("postgres"), part("dask-scheduler")]


def _until(get, done, what: str, limit: float = 30):
    """`get()` once `done` of it holds; fails naming `what` after `limit` seconds (a bound, not a timing)."""
    deadline = time.monotonic() + limit
    while not done(value := get()):
        assert time.monotonic() < deadline, f"{what}: not reached in {limit:g}s"
        time.sleep(0.05)
    return value


def test_up_starts_only_what_is_missing_and_down_stops_whole_trees(tmp_path, monkeypatch):
    st = Stack(StackSettings(home=tmp_path / "stack"), say=lambda m: None)
    started: list[str] = []
    monkeypatch.setattr(st, "_parts", lambda: _fake_parts(st, started))
    try:
        assert st.up() == ["postgres", "dask-scheduler"]
        first = _until(lambda: {p.pid for p in st.processes()}, lambda v: len(v) >= 4, "two parts with a child each")
        assert st.up() == [] and {p.pid for p in st.processes()} == first  # a no-op
        st._stop("postgres")  # a part that died is started again, the other is left alone
        assert st.up() == ["postgres"]
        procs = _until(st.processes, lambda v: len(v) >= 4, "the new shell's child")
    finally:
        stopped = st.down()
    assert stopped == 4
    assert not [p for p in procs if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not list((tmp_path / "stack" / "run").glob("*.pid"))
    assert (tmp_path / "stack" / "logs" / "postgres.log").exists()
    assert json.loads((tmp_path / "stack" / "stack.json").read_text())["prefect_port"] == 4200


def test_a_pid_file_naming_another_process_is_not_ours(tmp_path):
    st = Stack(StackSettings(home=tmp_path), say=lambda m: None)
    st.run_dir.mkdir(parents=True)
    me = psutil.Process()
    st._pidfile("dask-workers").write_text(json.dumps([{"pid": me.pid, "created": me.create_time() - 100, "argv": []}]))
    assert st._procs("dask-workers") == []  # a reused pid: never signalled
    assert st.down() == 0 and me.is_running()


def test_a_port_taken_by_something_else_is_named(tmp_path, monkeypatch):
    st = Stack(StackSettings(home=tmp_path), say=lambda m: None)
    monkeypatch.setattr(st, "_parts", lambda: [("prefect-server", lambda: True, lambda: None, True)])
    with pytest.raises(StackError, match="prefect-server: something else already answers on its port"):
        st.up()


def test_addresses_given_to_workers(tmp_path):
    s = StackSettings(home=tmp_path, bind="0.0.0.0", prefect_port=4300, dask_port=8800)
    assert s.host == host_address() and s.api_url == f"http://{host_address()}:4300/api"
    assert s.local_api == "http://127.0.0.1:4300/api" and s.dask_address == f"tcp://{host_address()}:8800"
    s = StackSettings(home=tmp_path, bind="0.0.0.0", advertise="build-01.example")
    assert s.api_url == "http://build-01.example:4200/api"
    (tmp_path / "stack.json").write_text(s.model_dump_json(exclude={"home"}))
    again = load_settings(tmp_path, dask_workers=3)
    assert again.advertise == "build-01.example" and again.dask_workers == 3 and again.home == tmp_path


def test_part_environment_drops_the_callers_api_url(tmp_path, monkeypatch):
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:1/api")
    st = Stack(StackSettings(home=tmp_path, bind="0.0.0.0", advertise="10.9.8.7"))
    assert "PREFECT_API_URL" not in st._env()
    assert st._env(PREFECT_API_URL=st.s.api_url)["PREFECT_API_URL"] == "http://10.9.8.7:4200/api"


def test_prefect_yaml_declares_the_deployments():
    from prefect.cli.deploy._schedules import _schedule_config_to_deployment_schedule
    from prefect.cli.deploy._triggers import _initialize_deployment_triggers
    from prefect.flows import load_flow_from_entrypoint

    project = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deps = {d["name"]: d for d in project["deployments"]}
    assert set(deps) == {"demo", "replay", "stage", "publish"}
    for name in ("demo", "replay"):
        assert deps[name]["concurrency_limit"] == {"limit": 1, "collision_strategy": "CANCEL_NEW"}
        for sched in deps[name]["schedules"]:
            _schedule_config_to_deployment_schedule(sched)  # what `prefect deploy` does with it
    nightly = deps["demo"]["schedules"][0]
    assert (nightly["slug"], nightly["cron"], nightly["timezone"]) == ("nightly", "0 2 * * *", "UTC")
    [trigger] = _initialize_deployment_triggers("publish", [dict(t) for t in deps["publish"]["triggers"]])
    assert trigger.expect == {"trajforge.build.committed"}
    assert set(trigger.parameters) == {"build_id", "dataset", "runs", "repo_id", "append"}
    flows = {d["entrypoint"]: load_flow_from_entrypoint(d["entrypoint"]) for d in deps.values()}
    assert {f.name for f in flows.values()} == {"trajforge-build", "trajforge-stage", "trajforge-publish"}
    assert {"build_id", "stage", "force"} <= set(flows["trajforge.flows.deployments:stage"].parameters.properties)
    assert {"build_id", "repo_id"} <= set(flows["trajforge.flows.deployments:publish"].parameters.properties)


def test_failure_webhook_template_is_a_valid_automation():
    from prefect.events.schemas.automations import AutomationCore

    from trajforge.flows.deployments import FAILURE_TEMPLATE

    block = uuid.uuid4()
    auto = AutomationCore.model_validate(yaml.safe_load(
        FAILURE_TEMPLATE.read_text().replace("{{ webhook_block_id }}", str(block))))
    assert auto.actions[0].type == "call-webhook" and auto.actions[0].block_document_id == block
    assert auto.trigger.expect == {"prefect.flow-run.Failed", "prefect.flow-run.Crashed"}


def test_failure_webhook_template_is_package_data():
    """A non-editable install has only the package-data files: `deploy --failure-webhook` needs its template."""
    import tomllib
    from fnmatch import fnmatch

    from trajforge.flows.deployments import FAILURE_TEMPLATE

    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert setuptools["package-dir"]["trajforge"] == "."
    rel = FAILURE_TEMPLATE.resolve().relative_to(ROOT)
    package = ".".join(["trajforge", *rel.parent.parts])  # data folders are listed as packages of their own
    assert package in setuptools["packages"], package
    assert any(fnmatch(rel.name, g) for g in setuptools["package-data"][package]), rel


def test_compose_file_is_valid():
    exe = shutil.which("docker-compose")
    if not exe and not shutil.which("docker"):
        pytest.skip("neither docker-compose nor docker is on PATH (`make setup` installs them)")
    cmd = [exe] if exe else ["docker", "compose"]
    r = subprocess.run([*cmd, "-f", str(ROOT / "deploy" / "compose.yaml"), "config"], capture_output=True, text=True)
    if r.returncode and not exe and "is not a docker command" in r.stderr:
        pytest.skip("neither docker-compose nor the compose plugin is installed (`make setup` installs it)")
    assert r.returncode == 0, r.stderr
    services = yaml.safe_load(r.stdout)["services"]
    assert set(services) == {"postgres", "prefect-server", "prefect-worker", "dask-scheduler", "dask-worker"}
    assert "/var/run/docker.sock:/var/run/docker.sock" in " ".join(map(str, services["dask-worker"]["volumes"]))


def test_summary_links_the_report_when_it_exists(tmp_path):
    from trajforge.flows.deployments import artifact_key, summary_markdown
    from trajforge.schemas.build import BuildRecord, StageEntry
    from trajforge.tasks.engine.store import RunStore

    store = RunStore(str(tmp_path), "my_data.v2")
    rec = BuildRecord(build_id="b1", dataset="my_data.v2", created_at="now", status="committed", stages={
        "export": StageEntry(fingerprint="f00", components={}, status="reused", rows=3, rejects=0, reused_from="b0")})
    md = summary_markdown(store, rec)
    assert "| export | reused | 3 | 0 | pass | `f00` | b0 |" in md and "report" not in md
    report = Path(store.build_dir("b1")) / "report" / "index.html"
    report.parent.mkdir(parents=True)
    report.write_text("<html></html>")
    assert f"(file://{report})" in summary_markdown(store, rec)
    assert artifact_key("my_data.v2", "summary") == "trajforge-my-data-v2-summary"


def test_status_without_postgresql_says_not_installed(tmp_path, monkeypatch):
    import trajforge.flows.stack as stack_module

    monkeypatch.setattr(stack_module, "PG_BIN", tmp_path / "no-postgres")
    st = Stack(StackSettings(home=tmp_path / "stack", prefect_port=1, dask_port=2), say=lambda m: None)
    pg = next(p for p in st.status() if p.name == "postgres")
    assert not pg.healthy and "not installed" in pg.detail
    with pytest.raises(StackError, match="postgres: not installed"):
        st._start_postgres()


def _cli(*args: str):
    """The CLI in-process (what a subprocess would add here is only interpreter start-up)."""
    from trajforge.flows.cli import app

    return CliRunner().invoke(app, list(args), env={"COLUMNS": "250", "PREFECT_API_URL": None})


def test_cli_stack_status_of_a_stopped_stack(tmp_path):
    home = tmp_path / "stopped"
    home.mkdir()
    (home / "stack.json").write_text(StackSettings(home=home, prefect_port=1, dask_port=2, pg_port=3).model_dump_json(
        exclude={"home"}))  # a stack that was up once (ports nothing listens on)
    r = _cli("stack", "status", "--home", str(home))
    assert r.exit_code == 1
    assert "prefect-server" in r.stdout and "dask-workers" in r.stdout


class _ForeignApi:
    """Another stack's Prefect API on a loopback port: answers GET /api/health with 200."""

    def __init__(self, port: int = 0):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Health(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 (http.server's name)
                self.send_response(200 if self.path == "/api/health" else 404)
                self.end_headers()
                self.wfile.write(b"true")

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Health)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_status_never_counts_another_stacks_part(tmp_path):
    """A port answered by something this home did not start (another stack on the same ports) is named as
    such and is not healthy; nor is the work pool, which only this stack's server can vouch for."""
    api = _ForeignApi()
    try:
        st = Stack(StackSettings(home=tmp_path / "mine", prefect_port=api.port, dask_port=1, pg_port=2),
                   say=lambda m: None)
        assert st._api_healthy()  # the foreign server does answer
        parts = {p.name: p for p in st.status()}
    finally:
        api.close()
    server = parts["prefect-server"]
    assert not server.healthy and not server.running and "another stack's" in server.detail, server
    assert not parts["work-pool"].healthy and "this stack's Prefect server is not running" in parts["work-pool"].detail


def test_cli_stack_status_of_an_empty_home_fails_even_with_a_stack_on_the_default_ports(tmp_path):
    """`stack status --home EMPTY` exits 1 naming the home, while something answers on the default API
    port (a loopback stand-in for another stack, unless one is up there already)."""
    try:
        api = _ForeignApi(StackSettings().prefect_port)
    except OSError:  # the port is taken: something (another stack) already answers there
        api = None
    try:
        empty = tmp_path / "empty"
        r = _cli("stack", "status", "--home", str(empty))
    finally:
        if api is not None:
            api.close()
    assert r.exit_code == 1, r.output
    assert f"no stack at {empty}" in " ".join(r.stderr.split()) and "stack up --home" in r.stderr, r.stderr
    assert "prefect-server" not in r.stdout  # nothing of the other stack is reported as this one's


def test_cli_deploy_needs_an_api_url(tmp_path):
    r = _cli("deploy", str(ROOT / "configs" / "replay.yaml"), "--cron", "0 2 * * *")
    assert r.exit_code != 0 and "PREFECT_API_URL is not set" in r.output
