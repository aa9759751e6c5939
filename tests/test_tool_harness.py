"""The harness's tools mode against a real tool server in real Docker: a small ledger `ToolTask`,
compiled to an `EnvSpec` (one image for the module), driven by scripted teachers: solving through
tools, call errors counted and returned, shell injection inert, doing nothing failing by end state,
a failing tool rolled back, fenced mode, the replay oracle, the validator's `tools_serve` check; and
the server driven by the official MCP Python SDK client (ecosystem conformance)."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import sys
import tarfile
import tempfile
import time
from typing import Any

import pytest

from trajforge.schemas.arrow import to_table
from trajforge.schemas.common import FileSpec
from trajforge.schemas.config import SandboxConfig, teacher_config
from trajforge.schemas.environment import EnvSpec
from trajforge.schemas.trajectory import FunctionCall, Message, Rollout, ToolCall
from trajforge.tasks.agent.harness import EpisodeSettings, run_episode
from trajforge.tasks.agent.mcp_relay import TOOLS_HARNESS, openai_tools, parse_arguments, parse_fenced
from trajforge.tasks.envs.tools.spec import ToolTask, call_command, compiled_fields, parse_call_command
from trajforge.tasks.teachers import ReplayTeacher
from trajforge.tasks.teachers.base import Turn

SEED = {"alice": 100, "bob": 50, "carol": 20}
INJECTION = "'; touch /tmp/pwned; ' $(touch /tmp/pwned2) `touch /tmp/pwned3` \"; touch /tmp/pwned4 #"


def _tool(name: str, description: str, properties: dict, code: str) -> dict:
    return {"name": name, "description": description, "code": code,
            "parameters": {"type": "object", "properties": properties, "required": sorted(properties),
                           "additionalProperties": False}}


LEDGER = ToolTask(
    domain="a small bank ledger",
    instruction="Alice owes Bob 30. Settle the debt in the ledger.",
    schema_sql="CREATE TABLE accounts(name TEXT PRIMARY KEY, balance INTEGER NOT NULL, note TEXT NOT NULL DEFAULT '')",
    seed_sql="".join(f"INSERT INTO accounts(name, balance) VALUES ('{n}', {b});" for n, b in SEED.items()),
    helpers="def _get(db, name):\n    row = db.execute('select * from accounts where name=?', (name,)).fetchone()\n"
            "    if row is None:\n        raise ToolError(f'no account {name!r}')\n    return dict(row)\n",
    tools=[
        _tool("get_account", "Look up an account by name.", {"name": {"type": "string"}},
              "def get_account(db, name):\n    return _get(db, name)\n"),
        _tool("transfer", "Move an amount between two accounts.",
              {"source": {"type": "string"}, "target": {"type": "string"}, "amount": {"type": "integer", "minimum": 1}},
              "def transfer(db, source, target, amount):\n    src, _ = _get(db, source), _get(db, target)\n"
              "    if src['balance'] < amount:\n        raise ToolError(f'{source} has only {src[\"balance\"]}')\n"
              "    db.execute('update accounts set balance=balance-? where name=?', (amount, source))\n"
              "    db.execute('update accounts set balance=balance+? where name=?', (amount, target))\n"
              "    return {'ok': True}\n"),
        _tool("set_note", "Set the note of an account.", {"name": {"type": "string"}, "note": {"type": "string"}},
              "def set_note(db, name, note):\n    _get(db, name)\n"
              "    db.execute('update accounts set note=? where name=?', (note, name))\n    return {'ok': True}\n"),
        _tool("close_account", "Close an account.", {"name": {"type": "string"}},
              "def close_account(db, name):\n    db.execute('delete from accounts where name=?', (name,))\n"
              "    raise RuntimeError('ledger offline')\n"),
        _tool("audit", "Run the nightly audit.", {},
              "def audit(db):\n    while True:\n        pass\n"),
        _tool("reindex", "Rebuild the ledger's index.", {},
              "def reindex(db):\n    import os\n    os._exit(3)\n"),
    ],
    checks="def test_alice():\n    assert value('select balance from accounts where name=?', 'alice') == 70\n\n"
           "def test_bob():\n    assert value('select balance from accounts where name=?', 'bob') == 80\n\n"
           "def test_carol_untouched():\n    assert value('select balance from accounts where name=?', 'carol') == 20\n",
    oracle=[{"name": "transfer", "arguments": {"source": "alice", "target": "bob", "amount": 30}}],
)


def ledger_env(**over: Any) -> EnvSpec:
    fields = {**compiled_fields(LEDGER), **over}
    env = EnvSpec(env_id="pending", family="ledger", level=1, seed=0, source="procedural:ledger", **fields)
    env.env_id = f"ledger-l1-s0-{env.content_hash()[:8]}"
    return env


class Scripted:
    """A teacher session replaying scripted turns: a list of (tool name, arguments JSON text) calls, or text."""

    def __init__(self, turns: list[list[tuple[str, str]] | str]):
        self.turns, self.offered = list(turns), []

    async def next_turn(self, messages: list[Message], tools: list[dict[str, Any]]) -> Turn:
        self.offered.append(tools)
        turn = self.turns.pop(0) if self.turns else [("submit", "{}")]
        if isinstance(turn, str):
            return Turn(Message(role="assistant", content=turn), completion_tokens=5, finish_reason="stop")
        calls = [ToolCall(id=f"c{len(messages)}_{i}", function=FunctionCall(name=n, arguments=a))
                 for i, (n, a) in enumerate(turn)]
        return Turn(Message(role="assistant", content=None, tool_calls=calls), completion_tokens=5,
                    finish_reason="tool_calls")


def call(tool: str, **args: Any) -> tuple[str, str]:
    return tool, json.dumps(args)


def store_rows(final_state: bytes) -> dict[str, tuple[int, str]]:
    """{account: (balance, note)} of the store.db in a captured work dir."""
    with tarfile.open(fileobj=io.BytesIO(final_state)) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("/store.db"))
        data = tar.extractfile(member).read()
    con = sqlite3.connect(":memory:")
    con.deserialize(data)
    return {n: (b, note) for n, b, note in con.execute("select name, balance, note from accounts")}


def passed(r) -> bool:
    t = r.in_place_tests
    return t is not None and t.error is None and bool(t.results) and all(x.passed for x in t.results)


# ---------------------------------------------------------------------------------------------- pure logic
class _FakeBox:
    """Just enough of a Sandbox for a `ToolSession`'s outcome (the output limit) and the relay."""

    cfg = SandboxConfig(output_limit_bytes=256)
    image = "fake:tools"


class _FakeSession:
    """A `ToolSession` answering every call with one scripted outcome (what reached the sandbox: `calls`)."""

    def __init__(self, box: _FakeBox, outcome: str = "ok", text: str = "fine"):
        from trajforge.tasks.envs.tools.client import ToolSession

        self.sb, self.calls, self.real = box, [], ToolSession(box)
        self.outcome, self.text = outcome, text

    async def start(self):
        return self

    async def close(self):
        pass

    async def list_tools(self, timeout_s=60):
        return [t.mcp() for t in LEDGER.tools]

    async def call(self, name, arguments, timeout_s):
        self.calls.append((name, arguments))
        return self.real._outcome(self.outcome, self.text, 0.1)


def test_outcomes_are_cut_and_made_encodable():
    """The model sees at most the sandbox's output limit (head and tail), and a lone surrogate a tool
    echoed back (/tmp/rev18/attack3.py: arguments `{"text": "\\ud800"}`, pure ASCII) becomes U+FFFD."""
    from trajforge.tasks.envs.tools.client import EXIT_CODES, ToolSession

    out = ToolSession(_FakeBox())._outcome("ok", "x" * 1000, 0.1)
    assert out.truncated and "bytes cut" in out.text and len(out.text.encode()) < 400 and out.output_bytes == 1000
    out = ToolSession(_FakeBox())._outcome("tool_error", "error: no book \ud800", 0.1)
    assert (out.outcome, out.exit_code, out.text) == ("tool_error", 1, "error: no book \ufffd")
    out.text.encode()
    assert EXIT_CODES == {"ok": 0, "tool_error": 1, "call_error": 2, "server_error": 3}


def test_parse_fenced_and_schema_conversion():
    assert parse_fenced('ok\n```json\n{"tool": "get_account", "arguments": {"name": "a"}}\n```') == ("get_account", {"name": "a"})
    assert parse_fenced('```\n{"tool": "audit"}\n```') == ("audit", {})
    # the Hermes format small instruct models were trained on (SmolLM2): `name`, a list, the first call counts
    assert parse_fenced('<tool_call>[{"name": "get_account", "arguments": {"name": "b"}}, {"name": "x"}]'
                        '</tool_call>') == ("get_account", {"name": "b"})
    assert parse_fenced('<tool_call>\n{"name": "audit", "arguments": {}}\n</tool_call>') == ("audit", {})
    assert parse_fenced("<tool_call>[]</tool_call>").startswith("the ```json block must be")
    assert "not valid JSON" in parse_fenced("```json\n{oops\n```")
    assert "must be an object" in parse_fenced('```json\n["get_account"]\n```')
    assert parse_fenced("SUBMIT") is None
    listed = [{"name": "t", "description": "d", "inputSchema": {"type": "object", "properties": {}}}]
    assert openai_tools(listed) == [{"type": "function", "function": {
        "name": "t", "description": "d", "parameters": {"type": "object", "properties": {}}}}]


def test_replay_answers_tool_envs_with_the_oracle_calls():
    env = ledger_env()
    want = ("transfer", {"amount": 30, "source": "alice", "target": "bob"})
    tools = ReplayTeacher(teacher_config({})).session(env, 0)
    first, last = (asyncio.run(tools.next_turn([], [{"type": "function"}])).message.tool_calls[0] for _ in range(2))
    assert (first.function.name, json.loads(first.function.arguments)) == want and last.function.name == "submit"
    fenced = ReplayTeacher(teacher_config({})).session(env, 0)
    first, last = (asyncio.run(fenced.next_turn([], [])).message.content for _ in range(2))
    assert parse_fenced(first) == want and last == "SUBMIT"


def test_a_surrogate_escaped_in_arguments_never_breaks_encoding():
    """/tmp/rev18/attack3.py: arguments `{"text": "\\ud800"}` (pure ASCII) are refused before any call."""
    raw = '{"text": "\\ud800"}'
    assert "lone surrogate" in parse_arguments(raw) and "lone surrogate" in parse_arguments('{"\\udfff": 1}')
    assert parse_arguments('{"a": ["x", {"b": "\\ud83d\\ude00"}]}') == {"a": ["x", {"b": "\U0001F600"}]}  # a pair is fine
    assert "lone surrogate" in parse_fenced('```json\n{"tool": "t", "arguments": {"q": "\\ud800"}}\n```')


class _FakeEpisode:
    """What `ToolMode` needs of the harness's `_Episode`, over a `_FakeBox`."""

    def __init__(self, box: _FakeBox, tool_calling: bool = True):
        from trajforge.tasks.agent.harness import EpisodeSettings, _Episode, _State

        self.sb, self.st = box, _State([], deadline=1e18)
        self.s = EpisodeSettings(max_turns=4, command_timeout_s=5, episode_timeout_s=60, tool_calling=tool_calling)
        self.started = asyncio.get_running_loop().create_future()
        self.started.set_result(None)
        self.garbled = lambda msg: _Episode.garbled(self, msg)
        self.handle_tool_calls = lambda turn, msg, answer: _Episode.handle_tool_calls(self, turn, msg, answer)


def test_declared_tools_are_offered_without_waiting_for_the_container():
    """The validator admits a tool environment only if its server lists exactly `.tools/tools.json`, so
    the first turn needs no container: offered at once, even while the start has not finished. Without
    a declaration the server is asked (after the start)."""
    from trajforge.tasks.agent.mcp_relay import ToolMode, declared_tools, openai_tools

    declared = declared_tools(compiled_fields(LEDGER)["files"])
    assert declared == [t.mcp() for t in LEDGER.tools]
    assert declared_tools([FileSpec(path=".tools/tools.json", content="{not json")]) is None

    async def go(declared):
        ep = _FakeEpisode(_FakeBox())
        ep.sb.image = "fake:never-listed"
        ep.started = asyncio.get_running_loop().create_future()  # a container start that never ends
        return await asyncio.wait_for(ToolMode(ep, declared).offered(), timeout=2)

    offered = asyncio.run(go(declared))
    assert [t["function"]["name"] for t in offered] == [t.name for t in LEDGER.tools] + ["submit"]
    assert offered[:-1] == openai_tools(declared)
    with pytest.raises(asyncio.TimeoutError):  # undeclared: it waits for the container's server
        asyncio.run(go(None))


def test_unknown_tools_and_bad_arguments_are_answered_on_the_host():
    from trajforge.tasks.agent.mcp_relay import ToolMode
    from trajforge.tasks.envs.tools import client

    box = _FakeBox()
    client._LISTED[box.image] = [t.mcp() for t in LEDGER.tools]
    session = _FakeSession(box)

    async def go(tool_calling: bool, turns: list) -> _FakeEpisode:
        ep = _FakeEpisode(box, tool_calling)
        mode = ToolMode(ep)
        mode.session = session
        await mode.offered()
        for turn in turns:
            if isinstance(turn, str):
                await mode.handle_text(1, Message(role="assistant", content=turn))
            else:
                await mode.handle_tool_calls(1, Message(role="assistant", tool_calls=[
                    ToolCall(id=f"c{i}", function=FunctionCall(name=n, arguments=a)) for i, (n, a) in enumerate(turn)]))
        return ep

    ep = asyncio.run(go(True, [[call("nope"), ("get_account", "[1]"), ("get_account", '{"name": "\\ud800"}'),
                                 call("get_account", name="bob")]]))
    assert session.calls == [("get_account", {"name": "bob"})]  # only the valid call reached the sandbox
    texts = [m.content for m in ep.st.messages]
    assert texts[0].startswith("call error: unknown tool 'nope'; the tools are: audit, close_account")
    assert texts[1:3] == ["call error: arguments are not a JSON object (arguments must be a JSON object)",
                          "call error: arguments are not a JSON object (the arguments hold invalid Unicode (a lone "
                          "surrogate))"] and texts[3] == "fine"
    assert ep.st.call_errors == 3 and ep.st.format_errors == 0  # the valid call last: the run of errors ended
    assert [s.command for s in ep.st.steps] == [call_command("get_account", {"name": "bob"})]
    ep = asyncio.run(go(False, ['```json\n{"tool": "bash", "arguments": {"command": "ls"}}\n```']))
    assert len(session.calls) == 1 and ep.st.call_errors == 1 and ep.st.steps == []
    assert ep.st.messages[0].content.startswith("Result of bash:\ncall error: unknown tool 'bash'")


def test_one_protocol_client_shared_by_harness_and_validator():
    """The constants live in one place (the server, a standalone file, must agree: the SDK's folder in
    the tools layer, the command), and the environments package never imports the agent package (the
    validator uses the client directly)."""
    import ast
    from pathlib import Path

    from trajforge.tasks.envs.tools import client, layer, spec

    assert f'SDK_DIR = "{layer.SDK_DIR}"' in spec.SERVER_SOURCE.read_text()
    assert call_command("t", {}).startswith(client.SERVER_COMMAND + " call ")
    envs = Path(spec.__file__).parents[1]
    for path in envs.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert "agent" not in (node.module or "").split("."), f"{path}: imports {node.module}"


def test_stages_declare_the_tool_modules_they_run():
    from trajforge.tasks.rollout import RolloutStage
    from trajforge.tasks.synthesize import SynthesizeStage

    assert "trajforge.tasks.envs.tools.client" in SynthesizeStage().code_module_names()  # tools_serve
    assert {"trajforge.tasks.envs.tools.spec", "trajforge.tasks.envs.tools.client"} <= set(
        RolloutStage().code_module_names())  # the replay teacher, recorded trajectories, the relay


def _tool_messages() -> list[dict[str, Any]]:
    calls = [("get_account", {"name": "alice"}), ("bash", {"command": "ls"}), ("Bad-Name", {}),
             ("transfer", {"source": "alice", "target": "bob", "amount": 30})]
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    for i, (name, args) in enumerate(calls):
        msgs += [{"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]},
                 {"role": "tool", "tool_call_id": f"c{i}", "content": "x"}]
    return msgs + [{"role": "assistant", "content": None, "tool_calls": [
        {"id": "s", "type": "function", "function": {"name": "submit", "arguments": "{}"}}]}]


def test_recorded_tool_trajectories_replay_into_the_same_tool_calls(tmp_path):
    """A recorded tool episode (OpenAI messages) replays as the same tool calls in a tools environment
    (a `bash` call stays a bash call, refused there as before); a terminal one keeps its bash calls only."""
    from trajforge.tasks.teachers.recorded import commands_from_messages

    env, msgs = ledger_env(), _tool_messages()
    assert commands_from_messages(msgs) == ["ls"]
    assert commands_from_messages(msgs, tools=True) == [
        call_command("get_account", {"name": "alice"}), "ls",
        call_command("transfer", {"amount": 30, "source": "alice", "target": "bob"})]
    path = tmp_path / "rec.jsonl"
    path.write_text(json.dumps({"env_id": env.env_id, "messages": msgs}) + "\n")
    teacher = ReplayTeacher(teacher_config({"backend": "replay", "replay": {"source": str(path)}}))

    def replayed(e: EnvSpec) -> list[tuple[str, dict]]:
        session, out = teacher.session(e, 0), []
        while not out or out[-1][0] != "submit":
            c = asyncio.run(session.next_turn([], [{"type": "function"}])).message.tool_calls[0]
            out.append((c.function.name, json.loads(c.function.arguments)))
        return out

    assert replayed(env) == [("get_account", {"name": "alice"}), ("bash", {"command": "ls"}),
                             ("transfer", {"amount": 30, "source": "alice", "target": "bob"}), ("submit", {})]
    assert replayed(env.model_copy(update={"kind": "terminal"})) == [("bash", {"command": "ls"}), ("submit", {})]


def test_shell_detectors_skip_tool_episodes():
    """Domain data in a tool call's arguments ("/tests/x", "reward.txt") is not a forged reward, and
    neither is the same text in a shell command (flags judge effects, not words): a change to the
    verifier's files is, and the changed file's command is its evidence."""
    from trajforge.schemas.common import ChangeSet
    from trajforge.schemas.trajectory import Step
    from trajforge.tasks.agent.harness import HARNESS
    from trajforge.tasks.judge.hacks import detect, review_outliers
    from trajforge.tasks.judge.quality import assess

    def rollout(harness: str, command: str, rid: str = "r") -> Rollout:
        return Rollout(rollout_id=rid, env_id="e", teacher="t", harness=harness, sample=0, messages=[], status="ok",
                       steps=[Step(turn=1, command=command, exit_code=0, duration_s=0.1)])

    args = {"title": "/tests/x and reward.txt", "note": "export PATH=/x; cat .bashrc"}
    tool = rollout(TOOLS_HARNESS, call_command("add_book", args))
    assert detect(tool) == [] and assess(tool).labels == []
    assert review_outliers([rollout(TOOLS_HARNESS, call_command("add_book", args), f"r{i}") for i in range(3)]) == {}
    shell = rollout(HARNESS, "echo 1 > /tests/x; echo 1 > reward.txt; export PATH=/x")
    assert detect(shell) == [] and assess(shell).labels == ["act"]
    shell.changes = ChangeSet(added=["/tests/x"], total=1)
    flags = detect(shell)
    assert [f.kind for f in flags] == ["forge_reward"] and flags[0].command == shell.steps[0].command


def test_report_counts_tool_call_errors_per_kind():
    from trajforge.flows.report.episodes import kinds

    envs = {"a": {"kind": "tools"}, "b": {"kind": None}}
    rows = [{"env": "a", "tool_call_errors": 2}, {"env": "a", "tool_call_errors": 1}, {"env": "b", "tool_call_errors": None}]
    assert kinds(envs, rows) == {"terminal": {"environments": 1, "rollouts": 1, "tool_call_errors": 0},
                                 "tools": {"environments": 1, "rollouts": 2, "tool_call_errors": 3}}


async def sdk_conformance(command: str, args: list[str], cwd: str | None = None) -> None:
    """List and call the ledger's tools with the official MCP Python SDK client (mcp 1.x and 2.x field names)."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import stdio_client

    def is_error(result: Any) -> bool:
        return bool(getattr(result, "is_error", None) or getattr(result, "isError", False))

    params = StdioServerParameters(command=command, args=args, cwd=cwd)
    # the server's stderr goes to a real file: `stdio_client`'s default is the `sys.stderr` of the moment the SDK
    # was imported, which under pytest's capture (the SDK now loads lazily, inside the test) has no file descriptor
    with tempfile.TemporaryFile("w+") as errlog:
        async with stdio_client(params, errlog=errlog) as (read, write), ClientSession(read, write) as s:
            await _conformance(s, is_error)


async def _conformance(s: Any, is_error: Any) -> None:
    """The ledger's conformance checks on one initialized-to-be client session."""
    init = await s.initialize()
    assert (getattr(init, "server_info", None) or init.serverInfo).name == "trajforge-tools"
    listed = (await s.list_tools()).tools
    assert [t.name for t in listed] == [t.name for t in LEDGER.tools]
    assert (getattr(listed[1], "input_schema", None) or listed[1].inputSchema) == LEDGER.tools[1].parameters
    ok = await s.call_tool("transfer", {"source": "alice", "target": "bob", "amount": 30})
    assert not is_error(ok) and json.loads(ok.content[0].text) == {"ok": True}
    domain = await s.call_tool("get_account", {"name": "zed"})
    assert is_error(domain) and domain.content[0].text == "error: no account 'zed'"
    with pytest.raises(Exception) as err:
        await s.call_tool("transfer", {"source": "alice", "target": "bob", "amount": "30"})
    assert err.value.error.code == -32602 and "amount must be integer" in err.value.error.message


def test_the_official_mcp_client_lists_and_calls_the_tools(tmp_path):
    """Conformance with the ecosystem's client, on the host against the compiled files."""
    import subprocess

    for f in compiled_fields(LEDGER)["files"]:
        (tmp_path / f.path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / f.path).write_text(f.content)
    subprocess.run([sys.executable, "-I", ".tools/server.py", "init"], cwd=tmp_path, check=True)
    asyncio.run(sdk_conformance(sys.executable, ["-I", ".tools/server.py"], str(tmp_path)))
    con = sqlite3.connect(tmp_path / "store.db")
    assert dict(con.execute("select name, balance from accounts")) == {"alice": 70, "bob": 80, "carol": 20}


# ---------------------------------------------------------------------------------------------- real Docker
@pytest.fixture(scope="module")
def ledger(docker_client):
    from trajforge.tasks.envs.images import ensure_image

    env = ledger_env()
    env.image, _ = ensure_image(docker_client, "trajforge/base:latest", env)
    return env


def episode(docker_client, env, teacher, **over):
    from trajforge.tasks.judge.verifier import VERIFIER_CAPS
    from trajforge.tasks.sandbox import Sandbox

    s = EpisodeSettings(**{"max_turns": 8, "command_timeout_s": 20, "episode_timeout_s": 120,
                           "venue": "in_place", **over})
    return asyncio.run(run_episode(
        env, teacher, lambda: Sandbox(docker_client, env.image, SandboxConfig(), workdir=env.workdir,
                                      cap_add=VERIFIER_CAPS, labels={"trajforge.test": "tool_harness"}),
        s, "scripted", 0))


@pytest.mark.docker
def test_solving_through_tools(docker_client, ledger):
    t = Scripted([[call("get_account", name="alice")],
                  [call("transfer", source="alice", target="bob", amount=30)], [call("submit")]])
    r = episode(docker_client, ledger, t)
    assert r.status == "ok" and r.harness == TOOLS_HARNESS and r.tool_call_errors == 0 and passed(r)
    offered = json.loads(r.tools_json)
    assert offered == t.offered[0] and [x["function"]["name"] for x in offered] == [x.name for x in LEDGER.tools] + ["submit"]
    system = r.messages[0].content
    assert "submit" in system and "bash" not in system and ledger.workdir not in system
    assert [m.role for m in r.messages] == ["system", "user"] + ["assistant", "tool"] * 3
    assert json.loads(r.messages[3].content) == {"balance": 100, "name": "alice", "note": ""}
    assert r.messages[3].tool_call_id == r.messages[2].tool_calls[0].id and r.messages[3].name == "get_account"
    assert [(s.command, s.exit_code) for s in r.steps] == [
        (call_command("get_account", {"name": "alice"}), 0),
        (call_command("transfer", {"amount": 30, "source": "alice", "target": "bob"}), 0)]
    assert all(s.duration_s > 0 and s.output_bytes > 0 for s in r.steps)
    assert store_rows(r.final_state)["bob"] == (80, "") and r.protected_changed == []
    # the recorded episode replays through the same server into the same steps (tasks/teachers/recorded.py)
    from trajforge.tasks.teachers.recorded import commands_from_messages

    recorded = commands_from_messages([m.model_dump() for m in r.messages], tools=True)
    again = episode(docker_client, ledger, ReplayTeacher(teacher_config({}), {}, {ledger.env_id: [recorded]}).session(
        ledger, 0))
    assert [(s.command, s.exit_code) for s in again.steps] == [(s.command, s.exit_code) for s in r.steps] and passed(again)


@pytest.mark.docker
def test_call_errors_are_returned_counted_and_change_nothing(docker_client, ledger):
    t = Scripted([[call("nope"), call("bash", command="sqlite3 store.db 'update accounts set balance=0'"),
                   call("transfer", source="alice", target="bob", amount="30"),
                   ("transfer", "{broken"), ("set_note", '{"name": "carol", "note": "\\ud800"}'),
                   ("set_note", '{"name": "carol", "\\udc00": 1}'),
                   call("transfer", source="carol", target="bob", amount=30)], [call("submit")]])
    r = episode(docker_client, ledger, t)
    tool_msgs = [m.content for m in r.messages if m.role == "tool"]
    assert tool_msgs[0].startswith("call error: unknown tool 'nope'") and "transfer" in tool_msgs[0]
    assert tool_msgs[1].startswith("call error: unknown tool 'bash'")
    assert "amount must be integer" in tool_msgs[2]
    assert tool_msgs[3].startswith("call error: arguments are not a JSON object")
    assert all("lone surrogate" in m for m in tool_msgs[4:6])  # an ASCII escape in a value or a key: nothing run
    assert tool_msgs[6] == "error: carol has only 20"  # a domain answer: not a call error
    # unknown tools and unusable arguments are answered on the host: only the two server-checked calls ran
    assert [s.exit_code for s in r.steps] == [2, 1] and r.tool_call_errors == 6
    assert r.status == "ok" and not passed(r)
    assert {n: b for n, (b, _) in store_rows(r.final_state).items()} == SEED
    assert to_table(Rollout, [r]).num_rows == 1  # every stored text encodes


@pytest.mark.docker
def test_consecutive_call_errors_end_the_episode_as_format_error(docker_client, ledger):
    r = episode(docker_client, ledger, Scripted([[call("bash", command="ls")]] * 3 + [[call("submit")]]))
    assert r.status == "format_error" and "3 consecutive turns without a valid tool call" in r.error
    assert r.tool_call_errors == 3 and len(r.usage) == 3 and r.steps == []  # no exec for an unknown tool


@pytest.mark.docker
def test_shell_injection_in_arguments_is_stored_verbatim(docker_client, ledger):
    t = Scripted([[call("set_note", name="carol", note=INJECTION), call("get_account", name=INJECTION)],
                  [call("submit")]])
    r = episode(docker_client, ledger, t)
    assert store_rows(r.final_state)["carol"] == (20, INJECTION)
    assert parse_call_command(r.steps[0].command) == ("set_note", {"name": "carol", "note": INJECTION})
    assert r.messages[-3].content == f"error: no account {INJECTION!r}"
    paths = r.changes.added + r.changes.modified
    assert not [p for p in paths if "pwned" in p] and paths == [f"{ledger.workdir}/store.db"]


@pytest.mark.docker
def test_submitting_at_once_fails_by_end_state(docker_client, ledger):
    r = episode(docker_client, ledger, Scripted([[call("submit")]]))
    assert r.status == "ok" and r.steps == [] and not passed(r)
    assert sum(not x.passed for x in r.in_place_tests.results) == 2  # alice and bob, carol is untouched


@pytest.mark.docker
def test_a_failing_tool_is_a_tool_error_and_leaves_the_state_unchanged(docker_client, ledger):
    r = episode(docker_client, ledger, Scripted([[call("close_account", name="alice")], [call("submit")]]))
    assert r.messages[3].content == "error: the tool failed (RuntimeError: ledger offline)"
    assert [s.exit_code for s in r.steps] == [1] and r.tool_call_errors == 0 and r.status == "ok"
    assert {n: b for n, (b, _) in store_rows(r.final_state).items()} == SEED and r.leftover_processes == 0


@pytest.mark.docker
def test_a_crashing_server_ends_the_episode_as_the_environments_fault(docker_client, ledger):
    """The server exits mid-session (a tool calls os._exit): never the model's failure, never a pass:
    the episode raises SandboxError naming the reason (the stage retries it, an infrastructure status)."""
    from trajforge.tasks.sandbox import SandboxError

    with pytest.raises(SandboxError, match=r"tool server: the tool server ended during 'reindex'"):
        episode(docker_client, ledger, Scripted([[call("transfer", source="alice", target="bob", amount=30)],
                                                 [call("reindex")], [call("submit")]]))


@pytest.mark.docker
def test_a_hanging_tool_is_killed_at_the_command_timeout(docker_client, ledger):
    """A call with no answer within the command timeout: the server is killed (every agent process),
    the episode ends as the environment's fault with the reason named."""
    from trajforge.tasks.sandbox import SandboxError

    t0 = time.monotonic()
    with pytest.raises(SandboxError, match=r"the tool 'audit' did not answer within 2s and was stopped"):
        episode(docker_client, ledger, Scripted([[call("audit")], [call("submit")]]), command_timeout_s=2)
    assert time.monotonic() - t0 < 30


@pytest.mark.docker
def test_fenced_mode_describes_the_tools_and_relays_json_blocks(docker_client, ledger):
    block = json.dumps({"tool": "transfer", "arguments": {"source": "alice", "target": "bob", "amount": 30}})
    t = Scripted([f"I will settle it.\n```json\n{block}\n```", "thinking, no block", "SUBMIT"])
    r = episode(docker_client, ledger, t, tool_calling=False)
    assert r.status == "ok" and passed(r) and r.tools_json == "[]" and t.offered == [[], [], []]
    assert '"tool": NAME' in r.messages[0].content and "- transfer: Move an amount" in r.messages[0].content
    assert r.messages[3].content == 'Result of transfer:\n{"ok": true}'
    assert r.messages[5].content.startswith("format error: no tool call found")
    assert [s.exit_code for s in r.steps] == [0] and r.tool_call_errors == 0


@pytest.mark.docker
@pytest.mark.parametrize("tool_calling", [True, False])
def test_replay_of_the_oracle_solves(docker_client, ledger, tool_calling):
    r = episode(docker_client, ledger, ReplayTeacher(teacher_config({})).session(ledger, 0), tool_calling=tool_calling)
    assert r.status == "ok" and passed(r) and [s.exit_code for s in r.steps] == [0]


@pytest.mark.docker
def test_validator_checks_that_the_tools_serve(docker_client, ledger):
    from trajforge.schemas.common import FileSpec
    from trajforge.tasks.envs.validator import validate_env

    v = validate_env(docker_client, ledger, SandboxConfig(), "trajforge/base:latest", {}, 30, 30)
    assert v.ok, v.reject
    assert v.checks["tools_serve"] == "pass" and v.checks["solution_passes"] == "pass"
    files = [f if f.path != ".tools/tools.py" else FileSpec(path=f.path, content="def transfer(db:\n")
             for f in ledger.files]
    broken = ledger_env(files=files)
    v = validate_env(docker_client, broken, SandboxConfig(), "trajforge/base:latest", {}, 30, 30)
    assert v.reject.reason == "tools_broken" and "SyntaxError" in v.reject.detail
    assert v.checks["noop_fails"] == "pass" and "solution_passes" not in v.checks


@pytest.mark.docker
def test_the_official_mcp_client_speaks_to_the_server_in_the_sandbox(docker_client, ledger):
    """The same conformance through the `docker` CLI's `exec -i` into a sandbox, as the agent user; a
    session of the harness's own then sees the state that session left (the state is the store, not a
    server process), and the server's prints never reach the protocol."""
    from trajforge.tasks.envs.tools.client import ToolSession
    from trajforge.tasks.sandbox import Sandbox

    with Sandbox(docker_client, ledger.image, SandboxConfig(), workdir=ledger.workdir,
                 labels={"trajforge.test": "tool_harness"}) as sb:
        asyncio.run(sdk_conformance("docker", ["exec", "-i", "-u", "1000:1000", "-w", ledger.workdir, sb.name,
                                               "python3", "-I", ".tools/server.py"]))

        async def again():
            import anyio

            session = ToolSession(sb)
            try:
                outs = [await session.call("get_account", {"name": n}, 20) for n in ("bob", "bob")]
                # an open session holds no token of anyio's shared thread limiter (many episodes at once)
                assert anyio.to_thread.current_default_thread_limiter().borrowed_tokens == 0
                return outs
            finally:
                await session.close()

        outs = asyncio.run(again())
        assert all(o.outcome == "ok" and json.loads(o.text)["balance"] == 80 for o in outs)
        assert sb.kill_agent_processes() == 0  # the closed session left no server running

