"""Bring your own MCP server (format `mcp-server`, tasks/envs/formats/mcp_server.py): the example folders in
tests/mcp_servers/ (Python on the SDK, Node.js on its standard library) import, validate and solve; broken
servers are rejected with the reason named, never a silent pass."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from trajforge.schemas.config import SandboxConfig, teacher_config
from trajforge.tasks.envs.formats import TaskFormatError, detect, find_tasks, import_task
from trajforge.tasks.envs.tools.spec import parse_call_command

EXAMPLES = Path(__file__).parent / "mcp_servers"
PYTHON, NODE = EXAMPLES / "counters-python", EXAMPLES / "counters-node"


def test_the_examples_import_as_tool_environments():
    assert find_tasks(EXAMPLES) == [NODE, PYTHON] and detect(PYTHON).name == "mcp-server"
    env = import_task(PYTHON)
    assert env.kind == "tools" and env.source == "mcp-server" and env.family == "mcp-server:counters-python"
    paths = {f.path for f in env.files}
    assert {".tools/server/server.py", ".tools/server.json", ".tools/call.py", ".tools/seed.sql"} <= paths
    assert json.loads(next(f.content for f in env.files if f.path == ".tools/server.json")) == {
        "runtime": "python", "command": ["python3", "server.py"]}
    assert env.solution == ["python3 -I .tools/call.py set_counter '{\"name\": \"alpha\", \"value\": 42}'"]
    assert parse_call_command(env.solution[0]) == ("set_counter", {"name": "alpha", "value": 42})
    assert "def test_store_schema_unchanged" in env.tests[0].content and env.tool_server is None
    assert import_task(PYTHON).env_id == env.env_id != import_task(NODE).env_id


@pytest.mark.parametrize("edit, says", [
    (lambda m: m.replace("runtime: python", "runtime: ruby"), "field `runtime` must be one of"),
    (lambda m: m.replace("command: [python3, server.py]", "command: python3 server.py"), "field `command`"),
    (lambda m: m.replace("oracle:", "oracle: []\nx:"), "field `oracle`"),
])
def test_malformed_folders_name_the_field(tmp_path, edit, says):
    folder = tmp_path / "bad"
    shutil.copytree(PYTHON, folder)
    (folder / "mcp-env.yaml").write_text(edit((folder / "mcp-env.yaml").read_text()))
    with pytest.raises(TaskFormatError, match=says):
        import_task(folder)


# ---------------------------------------------------------------------------------------------- real Docker
def validate(docker_client, env):
    from trajforge.tasks.envs.images import BuildOptions
    from trajforge.tasks.envs.validator import validate_env

    return validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", {}, 20, 30,
                        build=BuildOptions(network="imports"))


@pytest.mark.docker
@pytest.mark.parametrize("folder, name, version", [(PYTHON, "counter-board", "1.2.0"),
                                                   (NODE, "counter-board-node", "0.3.1")], ids=["python", "node"])
def test_examples_validate_and_record_the_servers_tools(docker_client, folder, name, version):
    env = import_task(folder)
    v = validate(docker_client, env)
    assert v.ok, v.reject
    assert v.checks["tools_serve"] == v.checks["noop_fails"] == v.checks["solution_passes"] == "pass"
    assert v.checks["deterministic"] == "pass"
    server = json.loads(env.tool_server)
    assert (server["name"], server["version"]) == (name, version)
    assert [t["name"] for t in server["tools"]] == ["list_counters", "set_counter"]
    assert server["tools"][1]["inputSchema"]["properties"]["value"]["type"] == "integer"
    assert env.expected_changes == [f"{env.workdir}/store.db"]
    from trajforge.tasks.envs.tools.spec import tool_view

    assert [t["name"] for t in tool_view(env)["tools"]] == ["list_counters", "set_counter"]
    assert tool_view(env)["oracle"] == [{"name": "set_counter", "arguments": {"name": "alpha", "value": 42}}]


@pytest.mark.docker
def test_an_episode_solves_through_the_brought_server(docker_client):
    from test_tool_harness import episode, passed

    from trajforge.tasks.teachers import ReplayTeacher

    env = import_task(PYTHON)
    assert validate(docker_client, env).ok
    r = episode(docker_client, env, ReplayTeacher(teacher_config({})).session(env, 0))
    assert r.status == "ok" and passed(r) and [s.exit_code for s in r.steps] == [0]
    assert r.steps[0].command == env.solution[0] and r.protected_changed == [] and r.leftover_processes == 0
    offered = [t["function"]["name"] for t in json.loads(r.tools_json)]
    assert offered == ["list_counters", "set_counter", "submit"]


BROKEN = {  # what is planted in the Python example's server, and the reject it must get
    "never_starts": ("command: [python3, server.py]", "command: [python3, missing.py]", None,
                     "tools_broken", "missing.py"),
    "crashes_on_a_call": ("    with store() as db:\n        if db.execute(",
                          "    os._exit(7)\n    with store() as db:\n        if db.execute(", "server",
                          "solution_fails", "ended without an answer"),
    "hangs_mid_session": ("    with store() as db:\n        if db.execute(",
                          "    import time\n    time.sleep(3600)\n    with store() as db:\n        if db.execute(", "server",
                          "solution_fails", "timed out"),
    "writes_outside_its_store": ("    return {name: value}",
                                 "    open(os.path.join(os.path.dirname(os.environ['TRAJFORGE_STORE']), 'notes.txt'), 'w')"
                                 ".write('x')\n    return {name: value}", "server",
                                 "tools_write_outside_store", "/home/agent/work/notes.txt"),
    "oracle_breaks_the_listed_schema": ("arguments: {name: alpha, value: 42}", "arguments: {name: alpha, value: '42'}",
                                        None, "tools_broken", "do not fit the inputSchema"),
    "noop_passes": ("== EXPECTED[\"target\"]", "!= EXPECTED[\"target\"]", "checks", "noop_passes", ""),
}


@pytest.mark.docker
@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_broken_server_is_rejected_with_the_reason_named(docker_client, tmp_path, case):
    old, new, where, reason, says = BROKEN[case]
    folder = tmp_path / case.replace("_", "-")
    shutil.copytree(PYTHON, folder)
    path = {None: folder / "mcp-env.yaml", "server": folder / "server" / "server.py",
            "checks": folder / "checks.py"}[where]
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    v = validate(docker_client, import_task(folder))
    assert v.reject is not None and v.reject.reason == reason, v.reject
    assert says in v.reject.detail, v.reject.detail

