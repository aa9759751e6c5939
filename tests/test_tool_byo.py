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


def test_a_yaml_alias_bomb_is_malformed_not_a_memory_error(tmp_path):
    """Ten levels of ten aliases each stand for 10^10 values in a file of about 1 KB."""
    folder = tmp_path / "bomb"
    shutil.copytree(PYTHON, folder)
    levels = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"] + [
        f"a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 11)]
    meta = folder / "mcp-env.yaml"
    meta.write_text(meta.read_text().replace("expected: {target: 42}", "\n".join(levels) + "\nexpected: {target: 42, pad: *a10}"))
    assert meta.stat().st_size < 2000
    with pytest.raises(TaskFormatError, match=r"mcp-env.yaml: holds more than 100000 values once its YAML aliases"):
        import_task(folder)


def test_a_yaml_string_bomb_is_malformed(tmp_path):
    """Few values, much text: one 300 KB string under 20 aliases is 6 MB once written out."""
    folder = tmp_path / "bomb"
    shutil.copytree(PYTHON, folder)
    meta = folder / "mcp-env.yaml"
    pad = "x" * 300_000
    meta.write_text(meta.read_text().replace("expected: {target: 42}", f'expected: {{target: 42, pad: &p "{pad}", '
                                             f'more: [{", ".join(["*p"] * 20)}]}}'))
    with pytest.raises(TaskFormatError, match=r"holds more than 4194304 characters of text once its YAML aliases"):
        import_task(folder)


# ---------------------------------------------------------------------------------------------- real Docker
def validate(docker_client, env):
    from trajforge.tasks.envs.images import BuildOptions
    from trajforge.tasks.envs.validator import validate_env

    return validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", {}, 20, 30,
                        build=BuildOptions(egress="allowlist"))


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
    "solves_the_task_when_it_starts": (  # the untouched store fails; the server's start writes the answer
        'app = MCPServer("counter-board", version="1.2.0")\n',
        'app = MCPServer("counter-board", version="1.2.0")\nwith store() as _db:\n'
        '    _db.execute("UPDATE counters SET value = 42 WHERE name = \'alpha\'")\n', "server", "noop_passes",
        "once the environment's own code has run"),
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



@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.usefixtures("prefect_api")
def test_a_build_mixes_the_brought_servers_with_terminal_environments(tmp_path):
    """One build (Prefect + Dask + Docker): the Python and the Node server come in through `synthesize.imports`
    beside a procedural terminal family and a procedural tool family; each is validated with its tools
    recorded, rolled out, verified and exported, and the tool rows offer the server's own tools. A near copy
    whose server never starts is rejected by name and does not knock out the good server it nearly
    duplicates; a plain copy of that one is a near duplicate of it."""
    import datasets
    from helpers import small_config

    from trajforge.flows.launch import run_build
    from trajforge.schemas.common import Reject
    from trajforge.schemas.config import parse_config
    from trajforge.schemas.environment import EnvSpec
    from trajforge.tasks.engine.store import RunStore
    from trajforge.tasks.envs.families import get_family

    servers = tmp_path / "servers"  # the two examples, a copy of one and a near copy whose server never starts:
    shutil.copytree(EXAMPLES, servers)  # one near-duplicate group, in order missing < python < python2
    shutil.copytree(PYTHON, servers / "counters-missing")
    shutil.copytree(PYTHON, servers / "counters-python2")
    meta = servers / "counters-missing" / "mcp-env.yaml"
    meta.write_text(meta.read_text().replace("command: [python3, server.py]", "command: [python3, missing.py]"))
    brought = {import_task(servers / "counters-python").env_id: "counter-board",
               import_task(servers / "counters-node").env_id: "counter-board-node"}
    broken = import_task(servers / "counters-missing").env_id
    copy = import_task(servers / "counters-python2").env_id
    terminal = get_family("log_report").generate(1, 0).env_id
    cfg = small_config(tmp_path / "runs", dataset="mixed", **{
        "synthesize": {"families": [{"name": "log_report", "levels": [1], "seeds": [0]},
                                    {"name": "bookings", "levels": [1], "seeds": [0]}],
                       "imports": [str(servers)]},
        "rollout.samples_per_env": 2, "rollout.episodes_per_shard": 4, "rollout.concurrency": 4})
    rec = run_build(parse_config(cfg))
    assert rec["status"] == "committed" and all(st["status"] == "committed" for st in rec["stages"].values())
    store = RunStore(cfg["runs"], "mixed")
    synth = store.read_json(f"{rec['stages']['synthesize']['manifest']}/manifest.json")
    kept = {e.env_id: e for e in store.read_records(synth["parts"], EnvSpec)}
    assert set(brought) | {terminal} <= set(kept) and len(kept) == 4, sorted(e.family for e in kept.values())
    rejects = store.read_records([f"{rec['stages']['synthesize']['manifest']}/rejects.parquet"], Reject)
    # the broken first of the group does not knock out the good one: the next is checked and kept, the rest
    # of the group are near duplicates of it
    python = next(iter(brought))
    assert sorted((r.key, r.reason, r.detail) for r in rejects if r.reason != "tools_broken") == [
        (copy, "near_duplicate", f"nearly the same as {python}")], rejects
    assert [(r.key, r.reason) for r in rejects if r.reason == "tools_broken"] == [(broken, "tools_broken")]
    assert "missing.py" in next(r.detail for r in rejects if r.key == broken)
    kinds = {e.env_id: e.kind for e in kept.values()}
    assert kinds[terminal] == "terminal" and sorted(kinds.values()) == ["terminal", "tools", "tools", "tools"]
    for env_id, name in brought.items():  # the validator recorded each server's tools and version
        server = json.loads(kept[env_id].tool_server)
        assert server["name"] == name and [t["name"] for t in server["tools"]] == ["list_counters", "set_counter"]
    traj = datasets.load_dataset(str(tmp_path / "runs" / "mixed" / "latest" / "dataset"), "trajectories")["train"]
    rows = {}
    for r in traj:
        rows.setdefault(r["env_id"], []).append(r)
    assert set(rows) == set(kept) and all(len(v) == 2 for v in rows.values())
    assert all(r["passed"] for v in rows.values() for r in v), [(r["env_id"], r["passed"]) for r in traj]
    for env_id in brought:  # the replayed oracle went through the brought server's own tool, and it answered
        for r in rows[env_id]:
            assert r["kind"] == "tools" and r["source"] == "mcp-server"
            assert [t["function"]["name"] for t in r["tools"]] == ["list_counters", "set_counter", "submit"]
            answer = [m["content"] for m in r["messages"] if m["role"] == "tool" and m["name"] == "set_counter"]
            assert [json.loads(a) for a in answer] == [{"alpha": 42}], answer
    assert all(r["kind"] == "terminal" and [t["function"]["name"] for t in r["tools"]] == ["bash", "submit"]
               for r in rows[terminal])


# a server (no SDK: JSON-RPC by hand) that writes `noise` characters to stderr before answering the tool call
NOISY = r'''
import json, sys
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("method") == "initialize":
        print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"protocolVersion": "2025-06-18",
              "capabilities": {"tools": {}}, "serverInfo": {"name": "noisy", "version": "1"}}}), flush=True)
    elif msg.get("method") == "tools/call":
        for i in range(NOISE // 1000):
            sys.stderr.write(f"log line {i:06d} " + "x" * 984 + "\n")
        sys.stderr.write("the end of the log\n")
        sys.stderr.flush()
        if ANSWER:
            print(json.dumps({"jsonrpc": "2.0", "id": msg["id"], "result": {"content": [
                  {"type": "text", "text": "answered"}]}}), flush=True)
        sys.exit(0)
'''


@pytest.mark.parametrize("answer", [True, False])
def test_call_py_drains_the_servers_stderr_while_it_waits(tmp_path, answer):
    """`.tools/call.py` (the solution's one-shot client) reads the server's stderr while it waits for the answer:
    a server that writes 1 MB of logs (over a pipe's 64 KB) during a call is answered, not deadlocked into a
    timeout; one that ends without an answer is reported with the tail of its stderr (bounded)."""
    import subprocess
    import sys

    from trajforge.tasks.envs.tools import call

    tools = tmp_path / ".tools"
    (tools / "server").mkdir(parents=True)
    shutil.copyfile(call.__file__, tools / "call.py")
    (tools / "server" / "server.py").write_text(f"NOISE = {1_000_000}\nANSWER = {answer}\n" + NOISY)
    (tools / "server.json").write_text(json.dumps({"runtime": "python", "command": [sys.executable, "server.py"]}))
    res = subprocess.run([sys.executable, "-I", str(tools / "call.py"), "set_counter", "{}"], capture_output=True,
                         text=True, timeout=60)
    if answer:
        assert (res.returncode, res.stdout) == (0, "answered\n"), res
    else:
        assert res.returncode == 3 and "ended without an answer" in res.stdout and "the end of the log" in res.stdout
        assert len(res.stdout) < 1000, len(res.stdout)
