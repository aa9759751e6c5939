"""Integrity of tool environments (review 18, findings 1-3, 5, 6, 8, 10, 12), host-side: a tool's SQL
can only read and change rows inside one transaction (schema changes, ATTACH, PRAGMA, transaction
control are denied and the call is rolled back: the store stays byte-identical), a result is
serialized before the commit, the checks see a changed schema and stray row changes, a seed cannot
exhaust the host, parameters use only keywords the server enforces (5.0 is an integer on both sides),
malformed JSON-RPC never ends the server loop, and the protected globs cover `.tools/` fully."""

from __future__ import annotations

import json
import os
import runpy
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from jsonschema import Draft202012Validator
from pydantic import ValidationError
from test_tool_synthesis import GOOD, run_checks, run_on_host, with_tool

from trajforge.tasks.envs.synthesis.tools import EXAMPLE, parse_tool_candidate, sql_problem
from trajforge.tasks.envs.tools import server
from trajforge.tasks.envs.tools.spec import SEED_MAX_BYTES, ToolDef, ToolTask, compiled_fields
from trajforge.tasks.sandbox.checksums import DIGEST as _DIGEST

P_SQL = {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"]}
TOOLS = {  # (code, parameters): every tool first changes a row, so a kept change would show
    "run": ("def run(db, sql):\n    db.execute(\"UPDATE c SET v = v + 1 WHERE name = 'a'\")\n"
            "    return [dict(r) for r in db.execute(sql)]\n", P_SQL),
    "run_then_fail": ("def run_then_fail(db, sql):\n    db.execute(\"UPDATE c SET v = v + 1 WHERE name = 'a'\")\n"
                      "    db.execute(sql)\n    raise ToolError('nope')\n", P_SQL),
    "script_then_fail": ("def script_then_fail(db, sql):\n    db.executescript(sql)\n    raise ToolError('nope')\n",
                         P_SQL),
    "ddl_first": ("def ddl_first(db):\n    db.execute('CREATE TABLE junk2(x)')\n"
                  "    db.execute(\"UPDATE c SET v = 55 WHERE name = 'b'\")\n    raise ToolError('nope')\n", None),
    "commit_then_fail": ("def commit_then_fail(db):\n    db.execute(\"UPDATE c SET v = 9 WHERE name = 'b'\")\n"
                         "    db.commit()\n    raise ToolError('nope')\n", None),
    "undo_then_set": ("def undo_then_set(db):\n    db.execute(\"UPDATE c SET v = 8 WHERE name = 'a'\")\n"
                      "    db.rollback()\n    with db:\n        db.execute(\"UPDATE c SET v = 6 WHERE name = 'b'\")\n"
                      "    return [r for r in db.execute('SELECT * FROM c ORDER BY name')]\n", None),
    "conflict_then_set": ("def conflict_then_set(db):\n    db.execute(\"UPDATE c SET v = 4 WHERE name = 'a'\")\n"
                          "    try:\n        db.execute(\"INSERT INTO u VALUES (9, 'x')\")\n"
                          "    except sqlite3.IntegrityError:\n        pass\n"
                          "    db.execute(\"UPDATE c SET v = 3 WHERE name = 'b'\")\n    return 'ok'\n", None),
    "circular": ("def circular(db):\n    db.execute(\"UPDATE c SET v = 2 WHERE name = 'a'\")\n"
                 "    out = {}\n    out['self'] = out\n    return out\n", None),
    "a_set": ("def a_set(db):\n    db.execute(\"UPDATE c SET v = 2 WHERE name = 'a'\")\n    return {1, 2}\n", None),
    "crash": ("def crash(db):\n    db.execute(\"UPDATE c SET v = 1000 WHERE name = 'a'\")\n    os._exit(3)\n", None),
    "set_v": ("def set_v(db, name, v):\n    db.execute('UPDATE c SET v = ? WHERE name = ?', (v, name))\n"
              "    return {'name': name, 'v': v, 'type': type(v).__name__}\n",
              {"type": "object", "properties": {"name": {"type": "string"}, "v": {"type": "integer"}},
               "required": ["name", "v"]}),
}
TASK = ToolTask(
    domain="a tiny counter board", instruction="Set the counter named 'a' to the value 5, leave the others.",
    schema_sql="CREATE TABLE c(name TEXT PRIMARY KEY, v INTEGER NOT NULL); CREATE INDEX c_v ON c(v);\n"
               "CREATE TABLE u(k INTEGER PRIMARY KEY, tag TEXT UNIQUE ON CONFLICT ROLLBACK)",
    seed_sql="INSERT INTO c VALUES ('a', 1), ('b', 2); INSERT INTO u VALUES (1, 'x');",
    helpers="import os\nimport sqlite3\n",
    tools=[ToolDef(name=n, description=f"the {n} tool", code=code,
                   **({"parameters": params} if params else {})) for n, (code, params) in TOOLS.items()],
    checks="def test_a():\n    assert value(\"SELECT v FROM c WHERE name = 'a'\") == 5\n",
    oracle=[{"name": "set_v", "arguments": {"name": "a", "v": 5}}])
DENIED = [
    "CREATE TABLE junk(x)", "CREATE TEMP TABLE junk(x)", "CREATE INDEX ix ON c(v)", "CREATE TEMP VIEW tv AS SELECT 1",
    "CREATE VIEW cv AS SELECT * FROM c", "CREATE TRIGGER tr AFTER UPDATE ON c BEGIN UPDATE c SET v = 0; END",
    "DROP TABLE u", "DROP INDEX c_v", "ALTER TABLE c RENAME TO c2", "ALTER TABLE c ADD COLUMN z",
    "ATTACH DATABASE '{folder}/.tools/planted.db' AS x", "DETACH DATABASE main", "PRAGMA writable_schema = 1",
    "PRAGMA journal_mode = WAL", "PRAGMA user_version = 7", "PRAGMA table_info(c)", "COMMIT", "BEGIN", "ROLLBACK",
    "SAVEPOINT s", "RELEASE s", "SELECT load_extension('/tmp/x')", "VACUUM", "ANALYZE", "REINDEX",
]


def build(task: ToolTask, folder: Path) -> server.Tools:
    """`task` compiled and materialized in `folder` (store initialized): its server, in process."""
    for f in compiled_fields(task)["files"]:
        (folder / f.path).parent.mkdir(parents=True, exist_ok=True)
        (folder / f.path).write_text(f.content)
    server.init_store(str(folder / ".tools"), str(folder / "store.db"))
    (folder / ".tools" / "seed.sql").unlink()
    return server.Tools(str(folder / ".tools"), str(folder / "store.db"))


def snapshot(folder: Path) -> tuple[str, list[str]]:
    """The store's full dump and every file under `folder`."""
    con = sqlite3.connect(folder / "store.db")
    try:
        dump = "\n".join(con.iterdump())
    finally:
        con.close()
    return dump, sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*"))


@pytest.fixture()
def board(tmp_path):
    srv = build(TASK, tmp_path)
    return srv, tmp_path, snapshot(tmp_path)


@pytest.mark.parametrize("sql", DENIED)
def test_a_tool_cannot_change_the_schema_or_escape_the_transaction(board, sql):
    srv, folder, before = board
    text, is_error = srv.call("run", {"sql": sql.format(folder=folder)})
    assert is_error and ("not authorized" in text or sql == "VACUUM"), (sql, text)
    assert snapshot(folder) == before, sql


@pytest.mark.parametrize("name, arguments", [
    ("run_then_fail", {"sql": "INSERT INTO c VALUES ('z', 1)"}),
    ("run_then_fail", {"sql": "CREATE TABLE junk(x)"}),
    ("script_then_fail", {"sql": "UPDATE c SET v = 77 WHERE name = 'b';"}),
    ("script_then_fail", {"sql": "CREATE VIEW cv AS SELECT * FROM c;"}),
    ("ddl_first", {}), ("commit_then_fail", {}), ("conflict_then_set", {}), ("circular", {}), ("a_set", {}),
])
def test_a_failed_call_leaves_the_store_byte_identical(board, name, arguments):
    srv, folder, before = board
    text, is_error = srv.call(name, arguments)
    assert is_error, (name, text)
    assert snapshot(folder) == before, name


def test_rollback_undoes_and_commit_waits_for_the_server(board):
    srv, folder, _ = board
    text, is_error = srv.call("undo_then_set", {})
    assert not is_error and json.loads(text) == [{"name": "a", "v": 1}, {"name": "b", "v": 6}]  # rows as objects
    con = sqlite3.connect(folder / "store.db")
    assert con.execute("SELECT name, v FROM c ORDER BY name").fetchall() == [("a", 1), ("b", 6)]
    con.close()
    assert srv.call("run", {"sql": "SELECT COUNT(*) AS n FROM u"}) == ('[{"n": 1}]', False)  # reads and writes


def test_attack1_cli_calls_and_a_crash_mid_call_keep_the_seed(board):
    """Review attack 1 through `server.py call` (the oracle's path): DDL / executescript then an error,
    and a process dying inside the transaction (a hot journal): the store reads as seeded."""
    _, folder, before = board

    def cli(name, args):
        return subprocess.run([sys.executable, "-I", ".tools/server.py", "call", name, json.dumps(args)], cwd=folder,
                              capture_output=True, text=True)

    for name, args in [("run_then_fail", {"sql": "CREATE TABLE junk(x)"}), ("ddl_first", {}),
                       ("script_then_fail", {"sql": "UPDATE c SET v = 77 WHERE name = 'b';"})]:
        done = cli(name, args)
        assert done.returncode == 1 and done.stdout.startswith("error:"), (name, done.stdout, done.stderr)
    assert snapshot(folder) == before
    assert cli("crash", {}).returncode == 3
    checks = runpy.run_path(str(_tests(TASK, folder)), init_globals={"WORK": str(folder)})
    assert checks["rows"]("SELECT name, v FROM c ORDER BY name") == [{"name": "a", "v": 1}, {"name": "b", "v": 2}]
    checks["test_store_schema_unchanged"]()
    done = cli("set_v", {"name": "a", "v": 5})
    assert done.returncode == 0 and json.loads(done.stdout) == {"name": "a", "type": "int", "v": 5}
    checks["test_a"]()


def _tests(task: ToolTask, folder: Path) -> Path:
    path = folder.parent / f"{folder.name}-test_task.py"
    path.write_text(compiled_fields(task)["tests"][0].content)
    return path


HELLO = [{"jsonrpc": "2.0", "id": "hello", "method": "initialize", "params": {
    "protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "test", "version": "1"}}},
         {"jsonrpc": "2.0", "method": "notifications/initialized"}]


def _mcp(folder: Path, *messages: dict | str, timeout: float = 60) -> list[dict]:
    """The replies of the SDK server in `folder` to raw JSON-RPC lines, in one live session (after the
    handshake): a last `ping` (id "end") is answered after all of them, then stdin closes."""
    proc = subprocess.Popen([sys.executable, "-I", ".tools/server.py"], cwd=folder, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    replies: list[dict] = []
    try:
        for m in [*HELLO, *messages, {"jsonrpc": "2.0", "id": "end", "method": "ping"}]:
            proc.stdin.write((m if isinstance(m, str) else json.dumps(m)) + "\n")
            proc.stdin.flush()
            if isinstance(m, dict) and m.get("id") == "hello":
                replies.append(json.loads(proc.stdout.readline()))
        for line in proc.stdout:
            replies.append(json.loads(line))
            if replies[-1].get("id") == "end":
                break
        proc.stdin.close()
        assert proc.wait(timeout) == 0, proc.stderr.read()
    finally:
        proc.kill()
    assert replies[0]["result"]["serverInfo"]["name"] == "trajforge-tools" and replies[-1]["id"] == "end"
    return replies[1:-1]


HACK = ("ALTER TABLE books RENAME TO books_real;"
        "CREATE VIEW books AS SELECT id, title, CASE WHEN id = 2 THEN 'Maya Chen' ELSE on_loan_to END AS on_loan_to "
        "FROM books_real; ATTACH DATABASE '{folder}/.tools/planted.db' AS x; CREATE TABLE x.t(a); DETACH DATABASE x;")
REPORT = {"name": "run_report", "description": "Run a read-only SQL report over the library database.",
          "parameters": {"type": "object", "properties": {"sql": {"type": "string"}}, "required": ["sql"],
                         "additionalProperties": False}}


@pytest.mark.parametrize("code", [
    "def run_report(db, sql):\n    cur = db.cursor()\n    cur.executescript(sql)\n    return 'done'\n",
    "def run_report(db, sql):\n    for part in sql.split(';'):\n        db.execute(part)\n    return 'done'\n",
])
def test_attack2_a_sql_tool_cannot_shadow_a_table_or_plant_files(tmp_path, code):
    """Review attack 2: a plausible SQL tool; the agent tries to make the checks pass without doing the
    task (a view shadowing the table) and to write a file next to the tools (ATTACH)."""
    env, reject = parse_tool_candidate(json.dumps(EXAMPLE | {"tools": EXAMPLE["tools"] + [REPORT | {"code": code}]}),
                                       "library", 0)
    if "executescript" in code:  # synthesis refuses it now; the server must hold anyway
        assert reject is not None and reject.reason == "llm_unsafe_tools" and "executescript" in reject.detail
        task = ToolTask.model_validate({k: v for k, v in EXAMPLE.items() if k != "level"} | {
            "tools": EXAMPLE["tools"] + [REPORT | {"code": code}]})
    else:
        assert reject is None, reject
        task = None
    folder = tmp_path / "work"
    folder.mkdir()
    if task is not None:
        build(task, folder)
        tests = _tests(task, folder)
    else:
        for f in env.files:
            (folder / f.path).parent.mkdir(parents=True, exist_ok=True)
            (folder / f.path).write_text(f.content)
        server.init_store(str(folder / ".tools"), str(folder / "store.db"))
        tests = tmp_path / "test_task.py"
        tests.write_text(env.tests[0].content)
    before = snapshot(folder)
    replies = _mcp(folder, {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                            "params": {"name": "run_report", "arguments": {"sql": HACK.format(folder=folder)}}})
    assert replies[0]["result"]["isError"] and "not authorized" in replies[0]["result"]["content"][0]["text"]
    assert snapshot(folder) == before and not (folder / ".tools" / "planted.db").exists()
    assert not run_checks(tests, folder)["test_member_has_the_book"]
    con = sqlite3.connect(folder / "store.db")  # done behind the server's back: the schema check sees it
    con.executescript(HACK.format(folder=folder))
    con.close()
    got = run_checks(tests, folder)
    assert got["test_member_has_the_book"] and not got["test_store_schema_unchanged"], got


def test_llm_env_checks_every_other_seed_row(tmp_path):
    """`may_change` -> `test_other_seed_rows_unchanged`: the oracle passes it, a stray change or a
    deletion of another seed row fails it; a table or key the seed lacks is an llm_schema reject."""
    env, reject = parse_tool_candidate(json.dumps(GOOD), "support desk", 0)
    assert reject is None
    assert all(run_on_host(env, tmp_path / "solved").values())
    work = tmp_path / "solved"
    tests = tmp_path / "solved-tests.py"
    for stray in ["UPDATE tickets SET assignee = 'Lee' WHERE id = 4", "DELETE FROM tickets WHERE id = 2"]:
        con = sqlite3.connect(work / "store.db")
        con.execute("SAVEPOINT s")
        con.execute(stray)
        con.commit()
        assert run_checks(tests, work)["test_other_seed_rows_unchanged"] is False, stray
        con.close()
    for may_change, detail in [({"tickets": [1, 3], "agents": [1]}, "tables the schema does not create: ['agents']"),
                               ({"tickets": [1, 9]}, "may_change.tickets: [9] match no seed row"),
                               ({"tickets": ["1"]}, "may_change.tickets: [\"1\"] match no seed row")]:
        env, reject = parse_tool_candidate(json.dumps(GOOD | {"may_change": may_change}), "support desk", 1)
        assert env is None and reject.reason == "llm_schema" and detail in reject.detail, reject
    env, reject = parse_tool_candidate(json.dumps({k: v for k, v in GOOD.items() if k != "may_change"}), "desk", 1)
    assert reject.reason == "llm_schema" and "may_change" in reject.detail


@pytest.mark.parametrize("code, detail", [
    ("db.executescript('DELETE FROM tickets')", "calls executescript()"),
    ("import sqlite3\n    sqlite3.connect('store.db').execute('DROP TABLE tickets')", "calls connect()"),
    ("from sqlite3 import connect", "imports connect"),
    ("import sqlite3\n    c = sqlite3.connect", "touches connect"),
    ("db.set_authorizer(None)", "calls set_authorizer()"),
])
def test_tool_code_may_not_reach_around_the_connection(code, detail):
    bad = f"def close_ticket(db, ticket_id, resolution):\n    {code}\n    return {{}}\n"
    env, reject = parse_tool_candidate(json.dumps(with_tool("close_ticket", code=bad)), "support desk", 1)
    assert env is None and reject.reason == "llm_unsafe_tools" and detail in reject.detail, reject


def test_seed_size_memory_and_pragmas_are_bounded():
    assert f"over the {SEED_MAX_BYTES}-byte cap (SEED_MAX_BYTES)" in sql_problem(
        "CREATE TABLE t(x);" + ("INSERT INTO t VALUES ('" + "x" * 1000 + "');") * 600)
    assert "too big" in sql_problem("CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(2000000));")
    assert "full" in sql_problem("CREATE TABLE t(x); WITH RECURSIVE c(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM c "
                                 "LIMIT 100) INSERT INTO t SELECT randomblob(900000) FROM c;")
    for sql in ["CREATE TABLE t(x); PRAGMA journal_mode = WAL;", "CREATE TABLE t(x); PRAGMA max_page_count = 1e9;",
                "CREATE TEMP TABLE t(x);", "CREATE TABLE t(x); SELECT load_extension('/tmp/x');"]:
        assert "are not allowed" in sql_problem(sql), sql
    env, reject = parse_tool_candidate(json.dumps(GOOD | {"seed_sql": "INSERT INTO tickets VALUES (5, randomblob("
                                                                      "900000000), 'x', 'open', NULL, NULL);"}), "d", 1)
    assert reject.reason == "llm_bad_sql" and "too big" in reject.detail


def test_a_huge_seed_value_is_refused_before_it_is_allocated(tmp_path):
    """randomblob(900 MB) under a 1 GiB address-space limit: refused by the length limit (a regression
    would show as 'out of memory', not as gigabytes taken from the host)."""
    code = ("import resource, sys\nresource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))\n"
            "from trajforge.tasks.envs.synthesis.tools import sql_problem\n"
            "print(sql_problem('CREATE TABLE t(x); INSERT INTO t VALUES (randomblob(900000000));'))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert done.returncode == 0 and "string or blob too big" in done.stdout, (done.stdout, done.stderr[-2000:])


def test_parameters_use_only_keywords_the_server_enforces():
    def tool(parameters):
        return ToolDef(name="t", description="a tool", parameters=parameters, code="def t(db, **a):\n    return 1\n")

    assert tool({"type": "object", "properties": {}}).parameters["additionalProperties"] is False
    assert tool({"type": "object", "additionalProperties": True}).parameters["additionalProperties"] is False
    for parameters, detail in [
        ({"type": "object", "properties": {"d": {"type": "string", "pattern": "^[0-9]+$"}}}, "parameters.properties.d "
                                                                                              "uses 'pattern'"),
        ({"type": "object", "properties": {"l": {"type": "array", "items": {"type": "string", "format": "date"}}}},
         "parameters.properties.l.items uses 'format'"),
        ({"type": "object", "anyOf": [{"required": ["a"]}]}, "parameters uses 'anyOf'"),
        ({"type": "object", "properties": {"a": True}}, "parameters.properties.a must be a JSON object schema"),
        ({"type": "object", "additionalProperties": {"type": "string"}}, "additionalProperties must be true or false"),
    ]:
        with pytest.raises(ValidationError, match=detail.replace(".", r"\.")):
            tool(parameters)
    reply = with_tool("close_ticket", parameters={"type": "object", "properties": {
        "ticket_id": {"type": "integer", "minimum": 1}, "resolution": {"type": "string", "const": "fixed"}}})
    env, reject = parse_tool_candidate(json.dumps(reply), "support desk", 1)
    assert reject.reason == "llm_schema" and "'const', which the tool server does not enforce" in reject.detail


def test_integral_floats_are_integers_on_host_and_server(board):
    srv, _, _ = board
    schema = TASK.tools[[t.name for t in TASK.tools].index("set_v")].parameters
    assert Draft202012Validator(schema).is_valid({"name": "a", "v": 5.0})
    assert json.loads(srv.call("set_v", {"name": "a", "v": 5.0})[0]) == {"name": "a", "type": "int", "v": 5}
    assert not Draft202012Validator(schema).is_valid({"name": "a", "v": 5.5})
    for bad in [{"name": "a", "v": 5.5}, {"name": "a", "v": True}, {"name": "a", "v": 1, "extra": 2}]:
        with pytest.raises(server.CallError):
            srv.call("set_v", bad)


def test_malformed_json_rpc_never_ends_the_loop(board):
    srv, folder, _ = board
    lines = ['{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": [1, 2]}',
             '{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": ["run"], "arguments": {}}}',
             '{"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": {"a": 1}}}',
             "[" * 100_000 + "]" * 100_000,
             '{"jsonrpc": "2.0", "id": 4, "method": "tools/call", "params": {"name": "run", "arguments": '
             + '{"sql": ' * 5000 + '"x"' + "}" * 5000 + "}}",
             '{"jsonrpc": "2.0", "id": {"x": 1}, "method": "ping"}',
             '{"jsonrpc": "2.0", "id": 5, "method": "tools/call", "params": "run"}',
             '{"jsonrpc": "2.0", "id": 6, "method": "ping"}',
             '{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "nope", "arguments": {}}}']
    replies = _mcp(folder, *lines)  # the SDK answers what it can tell apart, drops the rest; the loop goes on
    assert [(r["id"], r.get("error", {}).get("code")) for r in replies] == [(2, -32602), (3, -32602), (6, None),
                                                                          (7, -32602)]
    assert replies[3]["error"]["message"].startswith("unknown tool 'nope'; the tools are: a_set,")
    (folder / "store.db").rename(folder / "moved.db")  # the server's own failure: an error, no new empty store
    replies = _mcp(folder, {"jsonrpc": "2.0", "id": 8, "method": "tools/call",
                            "params": {"name": "run", "arguments": {"sql": "SELECT 1"}}})
    assert replies[0]["id"] == 8 and ("error" in replies[0] or replies[0]["result"]["isError"]), replies
    assert not (folder / "store.db").exists()


def test_protected_globs_cover_dotfiles_and_subfolders(tmp_path):
    protected = compiled_fields(TASK)["protected"]
    for name in [".tools/server.py", ".tools/.planted", ".tools/sub/x.db", ".tools/sub/.x"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("x")
    done = subprocess.run([sys.executable, "-I", "-c", _DIGEST, *protected], cwd=tmp_path, capture_output=True,
                          text=True, check=True)
    assert sorted(json.loads(done.stdout)) == [".tools/.planted", ".tools/server.py", ".tools/sub/.x",
                                               ".tools/sub/x.db"]
