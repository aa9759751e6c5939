"""LLM synthesis of tool environments from themes (`synthesize.llm.tool_themes`), driven by a scripted
teacher (the fake OpenAI server of the terminal LLM tests): a good reply compiles into an EnvSpec of
kind `tools` whose oracle passes and whose no-op fails (on the host here, through the real validator in
Docker once), malformed replies are rejects with their reasons, and old configs keep their fingerprint."""

from __future__ import annotations

import json
import runpy
import subprocess
from pathlib import Path

import pytest
from fake_openai import FakeOpenAI
from helpers import small_config

from trajforge.schemas.config import ConfigError, SandboxConfig, SynthesizeConfig, parse_config
from trajforge.tasks.engine.contract import StageContext
from trajforge.tasks.envs.synthesis.tools import EXAMPLE, parse_tool_candidate, sql_problem
from trajforge.tasks.envs.validator import validate_env
from trajforge.tasks.propose import ProposeStage

TICKET_CODE = {
    "search_tickets": (
        "def search_tickets(db, customer=None, status=None):\n"
        "    sql, args = 'SELECT id, customer, subject, status, assignee FROM tickets WHERE 1 = 1', []\n"
        "    if customer is not None:\n        sql += ' AND customer = ?'\n        args.append(customer)\n"
        "    if status is not None:\n        sql += ' AND status = ?'\n        args.append(status)\n"
        "    return [dict(r) for r in db.execute(sql + ' ORDER BY id', args)]\n"),
    "assign_ticket": (
        "def assign_ticket(db, ticket_id, assignee):\n"
        "    ticket = one(db, ticket_id)\n"
        "    if ticket['status'] != 'open':\n        raise ToolError(f'ticket {ticket_id} is closed')\n"
        "    db.execute('UPDATE tickets SET assignee = ? WHERE id = ?', (assignee, ticket_id))\n"
        "    return {'id': ticket_id, 'assignee': assignee}\n"),
    "close_ticket": (
        "def close_ticket(db, ticket_id, resolution):\n"
        "    one(db, ticket_id)\n"
        "    db.execute(\"UPDATE tickets SET status = 'closed', resolution = ? WHERE id = ?\", (resolution, ticket_id))\n"
        "    return {'id': ticket_id, 'status': 'closed'}\n"),
}
INT_ID = {"ticket_id": {"type": "integer", "minimum": 1}}
GOOD = {
    "domain": "a customer support desk",
    "instruction": ("Ana Ruiz says her printer works again, so that ticket of hers can be closed as fixed by the "
                    "customer. Her other open ticket should go to Lee."),
    "schema_sql": ("CREATE TABLE tickets(id INTEGER PRIMARY KEY, customer TEXT NOT NULL, subject TEXT NOT NULL, "
                   "status TEXT NOT NULL CHECK (status IN ('open', 'closed')), assignee TEXT, resolution TEXT);"),
    "seed_sql": ("INSERT INTO tickets VALUES (1, 'Ana Ruiz', 'Printer jams', 'open', NULL, NULL), "
                 "(2, 'Bo Li', 'VPN drops', 'open', 'Kim', NULL), (3, 'Ana Ruiz', 'Invoice copy', 'open', NULL, NULL), "
                 "(4, 'Cy Oduya', 'Printer jams', 'closed', 'Kim', 'replaced toner');"),
    "helpers": ("def one(db, ticket_id):\n"
                "    row = db.execute('SELECT * FROM tickets WHERE id = ?', (ticket_id,)).fetchone()\n"
                "    if row is None:\n        raise ToolError(f'no ticket {ticket_id}')\n    return row\n"),
    "tools": [
        {"name": "search_tickets", "description": "Tickets, optionally of one customer and/or status.",
         "parameters": {"type": "object", "properties": {"customer": {"type": "string"},
                                                         "status": {"type": "string", "enum": ["open", "closed"]}},
                        "additionalProperties": False},
         "code": TICKET_CODE["search_tickets"]},
        {"name": "assign_ticket", "description": "Give an open ticket to a support agent.",
         "parameters": {"type": "object", "properties": {**INT_ID, "assignee": {"type": "string", "minLength": 1}},
                        "required": ["ticket_id", "assignee"], "additionalProperties": False},
         "code": TICKET_CODE["assign_ticket"]},
        {"name": "close_ticket", "description": "Close a ticket with a resolution note.",
         "parameters": {"type": "object", "properties": {**INT_ID, "resolution": {"type": "string", "minLength": 3}},
                        "required": ["ticket_id", "resolution"], "additionalProperties": False},
         "code": TICKET_CODE["close_ticket"]},
    ],
    "checks": ("def test_printer_ticket_closed():\n"
               "    got = rows('SELECT status, resolution FROM tickets WHERE id = ?', EXPECTED['closed'])[0]\n"
               "    assert got['status'] == 'closed' and got['resolution']\n\n"
               "def test_other_ticket_assigned():\n"
               "    assert rows('SELECT status, assignee FROM tickets WHERE id = ?', EXPECTED['assigned']) == "
               "[{'status': 'open', 'assignee': EXPECTED['assignee']}]\n\n"
               "def test_others_unchanged():\n"
               "    assert rows('SELECT * FROM tickets WHERE id NOT IN (1, 3) ORDER BY id') == EXPECTED['others']\n"),
    "expected": {"closed": 1, "assigned": 3, "assignee": "Lee", "others": [
        {"id": 2, "customer": "Bo Li", "subject": "VPN drops", "status": "open", "assignee": "Kim", "resolution": None},
        {"id": 4, "customer": "Cy Oduya", "subject": "Printer jams", "status": "closed", "assignee": "Kim",
         "resolution": "replaced toner"}]},
    "may_change": {"tickets": [1, 3]},
    "oracle": [{"name": "search_tickets", "arguments": {"customer": "Ana Ruiz", "status": "open"}},
               {"name": "close_ticket", "arguments": {"ticket_id": 1, "resolution": "fixed by the customer"}},
               {"name": "assign_ticket", "arguments": {"ticket_id": 3, "assignee": "Lee"}}],
    "level": 2,
    "notes": "an unknown top-level key is ignored, as in terminal replies",
}
TERMINAL_GOOD = {"instruction": "Count the lines of events.log that contain FAILED and write the number to failed.txt.",
                 "files": [{"path": "events.log", "content": "ok\nFAILED a\nFAILED b\n"}],
                 "tests": "def test_count():\n    assert (W / 'failed.txt').read_text().strip() == '2'\n",
                 "solution": ["grep -c FAILED events.log > failed.txt"], "level": 1}


def with_tool(name: str, **change) -> dict:
    return GOOD | {"tools": [t | change if t["name"] == name else t for t in GOOD["tools"]]}


def run_on_host(env, work: Path, oracle: bool = True) -> dict[str, bool]:
    """Per-test results of `env`'s checks after its setup (and its oracle calls), in `work` on the host."""
    work.mkdir(parents=True)
    for f in env.files:
        (work / f.path).parent.mkdir(parents=True, exist_ok=True)
        (work / f.path).write_text(f.content)
    for cmd in env.setup + (env.solution if oracle else []):
        done = subprocess.run(cmd, shell=True, cwd=work, capture_output=True, text=True)
        assert done.returncode == 0, (cmd, done.stdout, done.stderr)
    tests = work.parent / f"{work.name}-tests.py"
    tests.write_text(env.tests[0].content)
    return run_checks(tests, work)


def run_checks(tests: Path, work: Path) -> dict[str, bool]:
    """Per-test results (passed or not) of the hidden test file `tests` on the work dir `work`, on the host."""
    results = {}
    for name, fn in runpy.run_path(str(tests), init_globals={"WORK": str(work)}).items():
        if name.startswith("test_"):
            try:
                fn()
                results[name] = True
            except AssertionError:
                results[name] = False
    return results


def scripted(req: dict, n: int) -> dict:
    """The teacher: per prompt (tool or terminal theme, variant), a prepared reply."""
    prompt = req["messages"][-1]["content"]
    tool = "SQLite" in req["messages"][0]["content"]
    if tool and "Variant 0." in prompt:
        text = "Here is the environment:\n```json\n" + json.dumps(GOOD) + "\n```"
    elif tool:
        text = json.dumps(GOOD | {"oracle": GOOD["oracle"] + [{"name": "refund_ticket", "arguments": {}}]})
    elif "Variant 0." in prompt:
        text = json.dumps(TERMINAL_GOOD)
    else:
        text = "A good task would be counting words."
    return {"role": "assistant", "content": text}


def test_mixed_themes_propose_terminal_and_tool_envs(tmp_path):
    with FakeOpenAI("ok", scripted) as srv:
        cfg = parse_config(small_config(tmp_path / "runs", **{
            "synthesize": {"llm": {"themes": ["log triage"], "tool_themes": ["support desk"]}},
            "teacher": {"backend": "openai", "endpoints": [srv.url], "model": "fake", "tool_calling": False}}))
        ctx = StageContext.create(cfg, "b1")
        stage = ProposeStage()
        [shard] = stage.plan(ctx, {})
        assert [(it["kind"], it["index"]) for it in shard.payload["items"]] == [
            ("llm", 0), ("llm", 1), ("llm_tools", 0), ("llm_tools", 1)]
        result = stage.run_shard(ctx, shard, {})
        prompts = [b["messages"][-1]["content"] for b in srv.bodies]
    tool_prompt = next(p for p in prompts if "Theme: support desk" in p)
    assert '"find_books"' in tool_prompt and "no tool names" in tool_prompt and "datetime" in tool_prompt
    by_kind = {e.kind: e for e in result.rows}
    assert set(by_kind) == {"terminal", "tools"}
    env = by_kind["tools"]
    assert (env.source, env.family, env.level, env.seed) == ("llm:support desk", "llm-support-desk", 2, 0)
    assert env.env_id.startswith("llm-support-desk-0-") and json.loads(env.knobs_json)["theme"] == "support desk"
    assert sorted((r.key, r.reason) for r in result.rejects) == [
        ("llm:log-triage:1", "llm_no_json"), ("llm:support-desk:tools:1", "llm_schema")]
    unknown = next(r for r in result.rejects if r.reason == "llm_schema")
    assert "oracle calls unknown tools ['refund_ticket']" in unknown.detail
    assert run_on_host(env, tmp_path / "solved") == dict.fromkeys(
        ["test_printer_ticket_closed", "test_other_ticket_assigned", "test_others_unchanged",
         "test_store_schema_unchanged", "test_other_seed_rows_unchanged"], True)
    noop = run_on_host(env, tmp_path / "untouched", oracle=False)
    assert not all(noop.values()) and noop["test_others_unchanged"]


def test_prompt_example_is_a_correct_tool_task(tmp_path):
    env, reject = parse_tool_candidate(json.dumps(EXAMPLE), "library", 0)
    assert reject is None and env.kind == "tools"
    assert all(run_on_host(env, tmp_path / "solved").values())
    assert run_on_host(env, tmp_path / "untouched", oracle=False) == {
        "test_member_has_the_book": False, "test_other_copies_unchanged": True, "test_store_schema_unchanged": True,
        "test_other_seed_rows_unchanged": True}


UNSAFE_TOOL = "def close_ticket(db, ticket_id, resolution):\n    {}\n    return {{}}\n"


@pytest.mark.parametrize("reply, reason, detail", [
    ("I would build a ticket desk with three tools.", "llm_no_json", "no JSON object"),
    ('{"domain": "desk", "tools": [}', "llm_bad_json", ""),
    ("```json\n" + json.dumps(GOOD)[:900], "llm_bad_json", "never closes (reply cut off? raise synthesize.llm.max_tokens)"),
    (json.dumps({k: v for k, v in GOOD.items() if k not in ("schema_sql", "checks")}), "llm_schema", "schema_sql"),
    (json.dumps({k: v for k, v in GOOD.items() if k not in ("schema_sql", "checks")}), "llm_schema", "checks"),
    (json.dumps(GOOD | {"oracle": [{"name": "reopen_ticket", "arguments": {}}]}), "llm_schema",
     "oracle calls unknown tools ['reopen_ticket']"),
    (json.dumps(GOOD | {"oracle": [{"name": "assign_ticket", "arguments": {"ticket_id": "3", "assignee": "Lee"}}]}),
     "llm_schema", "oracle.0.arguments do not fit the parameters of assign_ticket: '3' is not of type 'integer'"),
    (json.dumps(with_tool("close_ticket", parameters={"type": "object", "properties": {"ticket_id": {"type": "int"}}})),
     "llm_schema", "tools.2.parameters"),
    (json.dumps(with_tool("close_ticket", parameters={"type": "array"})), "llm_schema", "type 'object'"),
    (json.dumps(with_tool("close_ticket", code="def shut(db, ticket_id):\n    return 1\n")), "llm_schema",
     "must define `def close_ticket"),
    (json.dumps(GOOD | {"checks": "def test_x(:\n    pass\n"}), "llm_schema", "checks: Value error, does not parse"),
    (json.dumps(GOOD | {"level": 5}), "llm_schema", "level"),
    (json.dumps(GOOD | {"seed_sql": "INSERT INTO tickets VALUES (1, 'only two');"}), "llm_bad_sql", "OperationalError"),
    (json.dumps(GOOD | {"seed_sql": "INSERT INTO tickets VALUES (1, 'A', 'x', 'pending', NULL, NULL);"}),
     "llm_bad_sql", "CHECK constraint"),
    (json.dumps(GOOD | {"schema_sql": "CREATE TABLE tickets(id INTEGER PRIMARY KEY,"}), "llm_bad_sql", "syntax error"),
    (json.dumps(GOOD | {"seed_sql": "ATTACH DATABASE '/tmp/h3-attached.db' AS a; CREATE TABLE a.t(x);"}),
     "llm_bad_sql", "are not allowed"),
    (json.dumps(GOOD | {"seed_sql": "VACUUM INTO '/tmp/h3-vacuumed.db';"}), "llm_bad_sql", "are not allowed"),
    (json.dumps(GOOD | {"seed_sql": "CREATE TABLE n(x); WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 "
                                    "FROM c) INSERT INTO n SELECT x FROM c;"}), "llm_bad_sql", "too long"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("import os; os.system('id')"))),
     "llm_unsafe_tools", "tools.close_ticket: line 2: imports 'os'"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("import subprocess"))),
     "llm_unsafe_tools", "imports 'subprocess'"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("exec('x = 1')"))), "llm_unsafe_tools",
     "calls exec()"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("eval('1')"))), "llm_unsafe_tools", "calls eval()"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("open('/etc/passwd').read()"))),
     "llm_unsafe_tools", "calls open()"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("f = open"))), "llm_unsafe_tools", "uses open"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("().__class__.__bases__"))), "llm_unsafe_tools",
     "touches __bases__"),
    (json.dumps(with_tool("close_ticket", code=UNSAFE_TOOL.format("db.enable_load_extension(True)"))),
     "llm_unsafe_tools", "calls enable_load_extension()"),
    (json.dumps(GOOD | {"helpers": "import socket\n"}), "llm_unsafe_tools", "helpers: line 1: imports 'socket'"),
    (json.dumps(GOOD | {"checks": "import subprocess\ndef test_x():\n    subprocess.run(['true'])\n"}),
     "llm_unsafe_tests", "imports 'subprocess'"),
    (json.dumps(GOOD | {"checks": "def test_x():\n    os.system('python3 tools.py')\n"}), "llm_unsafe_tests",
     "calls system()"),
    (json.dumps(GOOD | {"instruction": "Call close_ticket on ticket 1, then assign_ticket 3 to Lee."}),
     "llm_instruction_names_tools", "['assign_ticket', 'close_ticket']"),
])
def test_malformed_replies_are_rejected_with_their_reason(reply, reason, detail):
    env, reject = parse_tool_candidate(reply, "support desk", 1)
    assert env is None and reject is not None
    assert (reject.key, reject.reason) == ("llm:support-desk:tools:1", reason) and detail in reject.detail, reject


def test_tool_code_may_use_allowed_modules():
    code = ("import re\nfrom datetime import date\n\ndef close_ticket(db, ticket_id, resolution):\n"
            "    if not re.compile(r'\\w').search(resolution):\n        raise ToolError('empty note')\n"
            "    return {'on': date(2024, 1, 2).isoformat()}\n")
    env, reject = parse_tool_candidate(json.dumps(with_tool("close_ticket", code=code)), "support desk", 0)
    assert reject is None and "import re" in next(f.content for f in env.files if f.path == ".tools/tools.py")


def test_seed_sql_cannot_write_host_files(tmp_path):
    for sql in [f"ATTACH DATABASE '{tmp_path / 'a.db'}' AS a; CREATE TABLE a.t(x);",
                f"CREATE TABLE t(x); VACUUM INTO '{tmp_path / 'b.db'}';"]:
        assert "are not allowed" in sql_problem(sql)
    assert list(tmp_path.iterdir()) == []


def test_config_themes_tool_themes_and_old_fingerprint(tmp_path):
    def config(llm: dict) -> dict:
        return small_config(tmp_path, **{"synthesize": {"llm": llm}, "teacher": {
            "backend": "openai", "endpoints": ["http://127.0.0.1:9"], "model": "m"}})

    old = parse_config(config({"themes": ["log triage"], "candidates_per_theme": 3}))
    assert ProposeStage().config_section(old)["llm"] == {  # exactly what configs before tool_themes hashed
        "themes": ["log triage"], "candidates_per_theme": 3, "max_tokens": 2048, "temperature": 0.8}
    mixed = parse_config(config({"themes": ["log triage"], "tool_themes": ["support desk", "hotel"]}))
    assert ProposeStage().config_section(mixed)["llm"]["tool_themes"] == ["support desk", "hotel"]
    assert len(ProposeStage().plan(StageContext.create(mixed, "b"), {})[0].payload["items"]) == 6
    only_tools = parse_config(config({"tool_themes": ["hotel"]}))
    assert only_tools.synthesize.llm.themes == []
    with pytest.raises(ConfigError, match=r"synthesize\.llm.*`themes`.*`tool_themes`"):
        parse_config(config({"themes": [], "candidates_per_theme": 1}))


@pytest.mark.docker
def test_good_reply_passes_the_real_validator(docker_client):
    env, reject = parse_tool_candidate(json.dumps(GOOD), "support desk", 0)
    assert reject is None
    aliases = SynthesizeConfig(families=[{"name": "log_report"}]).image_aliases
    v = validate_env(docker_client, env, SandboxConfig(), "trajforge/base:latest", aliases, 60, 60)
    assert v.ok, v.reject
    assert {c: v.checks.get(c) for c in ("noop_fails", "solution_passes", "deterministic")} == dict.fromkeys(
        ("noop_fails", "solution_passes", "deterministic"), "pass")
    assert {c: r for c, r in v.checks.items() if r != "pass"} == {"instance_specific": "skip"}  # not procedural
