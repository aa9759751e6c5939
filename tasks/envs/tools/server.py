"""The tool server of a `tools` environment: an MCP server over stdio, on the official MCP Python SDK.

This file is copied into every tool environment's image as `.tools/server.py` and runs there, in the
sandbox, as the agent user (never on the host). Next to it: `tools.json` (the tools: name,
description, `inputSchema`), `tools.py` (one Python function per tool, `def name(db, **arguments)`,
returning JSON-able data or raising `ToolError`) and `seed.sql` (the store's schema and rows). The
state is the SQLite file `store.db` in the work dir, created at image build by `server.py init`.

The protocol is the SDK's (`mcp.server.lowlevel.Server` over `mcp.server.stdio.stdio_server`; the SDK
is installed in the image's tools layer, `SDK_DIR`, see tasks/envs/tools/layer.py): the tools are
listed as `tools.json` declares them (explicit schemas, so the server enforces exactly what the model
is shown), and a call's result is its JSON text plus, for an object, `structuredContent`. The store
logic below is the standard library only, so `init` and `call` (the reference solution's commands)
need no SDK. One server process serves a whole episode (the harness's session, client.py).

Invariants:
- the state lives in `store.db`, never in the server process: a restarted server sees the same store;
- one `tools/call` is one SQLite transaction (`BEGIN IMMEDIATE`, opened per call on a fresh
  connection): committed when the tool returns and its result serializes, rolled back when it raises,
  so a failed call leaves no partial state; calls run one at a time, on the event loop;
- while a tool runs, an authorizer allows only reads and row changes (SELECT, INSERT, UPDATE, DELETE,
  functions but `load_extension`): no schema change (CREATE / DROP / ALTER of tables, indexes,
  triggers, views, temp ones too), no ATTACH / DETACH, no PRAGMA, no BEGIN / COMMIT / SAVEPOINT, and
  no row change once the transaction is gone (an `OR ROLLBACK` conflict): the store keeps its seed
  schema, so end-state checks read the real tables; a denied statement is a tool error;
- the tool's `db.commit()` does nothing (the server commits) and `db.rollback()` undoes the call's
  changes so far; a result must be JSON (`sqlite3.Row` becomes an object), else it is a tool error;
- a call naming no tool, or arguments that break the tool's `inputSchema`, is a JSON-RPC error
  -32602 (the model's mistake: counted like a format error); an integral number (5.0) is an integer,
  as in JSON Schema, and reaches the tool as an int; an error raised by the tool itself is a result
  with `isError: true` (a domain answer such as "no such booking");
- stdout carries protocol messages only (the tools' prints, stdout and stderr, are captured and dropped).

Usage: `server.py` (MCP stdio session, until EOF) · `server.py init` (build the store) ·
`server.py call NAME 'JSON'` (one call, result text on stdout, exit 1 on a tool error: the
reference solution's commands).
"""

import contextlib
import importlib.util
import io
import json
import os
import sqlite3
import sys
import urllib.parse

sys.dont_write_bytecode = True  # no __pycache__ next to the tools: the folder is protected
HERE = os.path.dirname(os.path.abspath(__file__))
STORE = os.path.join(os.path.dirname(HERE), "store.db")
SDK_DIR = "/opt/trajforge/mcp"  # the tools layer's SDK (tasks/envs/tools/layer.py)
TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict,
         "null": type(None)}


class ToolError(Exception):
    """Raised by a tool: its message goes back to the model as the result, with `isError: true`."""


class CallError(Exception):
    """The call itself is wrong (unknown tool, bad arguments): JSON-RPC error -32602."""


def schema_errors(value, schema, where="arguments"):
    """Violations of the JSON Schema subset tool schemas use: type, enum, properties, required,
    additionalProperties: false, items, minimum/maximum, minLength/maxLength."""
    errs = []
    want = schema.get("type")
    if want:
        kinds = want if isinstance(want, list) else [want]
        if not any(is_type(value, k) for k in kinds):
            return [f"{where} must be {' or '.join(kinds)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        errs.append(f"{where} must be one of {schema['enum']}, got {value!r}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errs.append(f"{where} must be >= {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errs.append(f"{where} must be <= {schema['maximum']}")
    if isinstance(value, str):
        if len(value) < schema.get("minLength", 0):
            errs.append(f"{where} must have at least {schema['minLength']} characters")
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            errs.append(f"{where} must have at most {schema['maxLength']} characters")
    if isinstance(value, dict):
        props = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errs.append(f"{where}.{name} is required")
        for name, v in value.items():
            if name in props:
                errs += schema_errors(v, props[name], f"{where}.{name}")
            elif schema.get("additionalProperties") is False:
                errs.append(f"{where}.{name} is not a parameter of this tool")
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, v in enumerate(value):
            errs += schema_errors(v, schema["items"], f"{where}[{i}]")
    return errs


def is_type(value, kind):
    """JSON Schema's type test: booleans are not numbers, an integral float (5.0) is an integer."""
    if kind in ("integer", "number") and isinstance(value, bool):
        return False
    if kind == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, TYPES.get(kind, object))


def as_declared(value, schema):
    """`value` (valid for `schema`) with integral floats where only an integer fits turned into ints."""
    kinds = schema.get("type") if isinstance(schema.get("type"), list) else [schema.get("type")]
    if isinstance(value, float) and "integer" in kinds and "number" not in kinds:
        return int(value)
    if isinstance(value, dict):
        props = schema.get("properties", {})
        return {k: as_declared(v, props[k]) if k in props else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [as_declared(v, schema["items"]) for v in value]
    return value


# What a tool's SQL may do (sqlite3 authorizer action codes): read, and change rows; all else is denied.
ALLOWED = {sqlite3.SQLITE_READ, sqlite3.SQLITE_SELECT, sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE,
           sqlite3.SQLITE_DELETE, sqlite3.SQLITE_RECURSIVE, sqlite3.SQLITE_FUNCTION}
ROW_CHANGES = {sqlite3.SQLITE_INSERT, sqlite3.SQLITE_UPDATE, sqlite3.SQLITE_DELETE}


class ToolConnection(sqlite3.Connection):
    """The `db` a tool gets: the call is one transaction the server opens and ends, so `commit()`
    does nothing and `rollback()` undoes the call's changes so far (and opens the transaction again);
    `with db:` likewise (rolls back on an exception)."""

    guard = None

    def commit(self):
        pass

    def __exit__(self, exc_type, exc, tb):
        if exc_type is not None:
            self.rollback()
        return False

    def rollback(self):
        self.set_authorizer(None)
        try:
            if self.in_transaction:
                self.execute("ROLLBACK")
            self.execute("BEGIN IMMEDIATE")
        finally:
            self.set_authorizer(self.guard)


def open_for_call(store):
    """A connection to `store` inside `BEGIN IMMEDIATE`, with the tool authorizer installed. Statements
    are not cached, so each one is authorized when it runs (a row change after the transaction was
    lost to an `OR ROLLBACK` conflict would otherwise commit on its own)."""
    uri = "file:" + urllib.parse.quote(os.path.abspath(store)) + "?mode=rw"  # a missing store is an error
    db = sqlite3.connect(uri, uri=True, isolation_level=None, cached_statements=0, factory=ToolConnection)
    db.row_factory = sqlite3.Row

    def guard(action, arg1, arg2, _db_name, _source):
        if action not in ALLOWED or action in ROW_CHANGES and not db.in_transaction:
            return sqlite3.SQLITE_DENY
        if action == sqlite3.SQLITE_FUNCTION and str(arg2).lower() == "load_extension":
            return sqlite3.SQLITE_DENY
        return sqlite3.SQLITE_OK

    db.execute("BEGIN IMMEDIATE")
    db.guard = guard
    db.set_authorizer(guard)
    return db


def as_json(value):
    """`json.dumps` default of tool results: a row is an object; anything else is an error."""
    if isinstance(value, sqlite3.Row):
        return dict(value)
    raise TypeError(f"a {type(value).__name__} is not JSON")


class Tools:
    """The environment's tools over its store (standard library only)."""

    def __init__(self, folder=HERE, store=STORE):
        with open(os.path.join(folder, "tools.json")) as f:
            self.tools = json.load(f)
        self.by_name = {t["name"]: t for t in self.tools}
        spec = importlib.util.spec_from_file_location("trajforge_tools", os.path.join(folder, "tools.py"))
        self.module = importlib.util.module_from_spec(spec)
        self.module.ToolError = ToolError
        spec.loader.exec_module(self.module)
        self.store = store

    def call(self, name, arguments):
        """(result text, is_error); raises CallError for an unknown tool or bad arguments."""
        tool = self.by_name.get(name) if isinstance(name, str) else None
        fn = getattr(self.module, name, None) if tool else None
        if tool is None or not callable(fn):
            raise CallError(f"unknown tool {name!r}; the tools are: {', '.join(sorted(self.by_name))}")
        if arguments is None:
            arguments = {}
        schema = tool.get("inputSchema") or {"type": "object"}
        errs = schema_errors(arguments, schema)
        if errs:
            raise CallError(f"invalid arguments for {name}: " + "; ".join(errs))
        arguments = as_declared(arguments, schema)
        db = open_for_call(self.store)
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                out = fn(db, **arguments)
            text = json.dumps(out, default=as_json, sort_keys=True, allow_nan=False)
            if not db.in_transaction:
                raise RuntimeError("its transaction was rolled back by SQLite")
        except ToolError as err:
            return f"error: {err}", True
        except Exception as err:  # a bug in the tool: the model sees a tool error, the state is unchanged
            return f"error: the tool failed ({err.__class__.__name__}: {err})", True
        else:
            db.set_authorizer(None)
            db.execute("COMMIT")
            return text, False
        finally:
            db.set_authorizer(None)
            if db.in_transaction:
                db.execute("ROLLBACK")
            db.close()



def serve(tools):
    """The MCP stdio session (the SDK's low-level server) until the client closes stdin."""
    sys.path.insert(0, SDK_DIR)
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server
    from mcp.shared.exceptions import MCPError

    listed = [types.Tool.model_validate(t) for t in tools.tools]

    async def list_tools(ctx, params):
        return types.ListToolsResult(tools=listed)

    async def call_tool(ctx, params):
        try:
            text, is_error = tools.call(params.name, params.arguments)
        except CallError as err:
            raise MCPError(types.INVALID_PARAMS, str(err)) from None
        data = None if is_error else json.loads(text)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=is_error,
                                    structured_content=data if isinstance(data, dict) else None)

    app = Server("trajforge-tools", version="1", on_list_tools=list_tools, on_call_tool=call_tool)

    async def run():
        async with stdio_server() as (read, write):
            await app.run(read, write, app.create_initialization_options())

    anyio.run(run)


def init_store(folder=HERE, store=STORE):
    if os.path.exists(store):
        os.remove(store)
    db = sqlite3.connect(store)
    db.execute("PRAGMA synchronous = OFF")  # build time: no fsync per seeded row (the file is closed after)
    with open(os.path.join(folder, "seed.sql")) as f:
        db.executescript(f.read())
    db.commit()
    db.close()


def main(argv):
    if argv[:1] == ["init"]:
        init_store()
        return 0
    if argv[:1] == ["call"] and len(argv) == 3:
        try:
            arguments = json.loads(argv[2])
            text, is_error = Tools().call(argv[1], arguments)
        except (CallError, ValueError, RecursionError) as err:
            print(f"call error: {err}")
            return 2
        print(text)
        return 1 if is_error else 0
    if argv:
        print("usage: server.py [init | call NAME JSON]", file=sys.stderr)
        return 2
    serve(Tools())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
